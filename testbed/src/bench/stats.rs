//! The benchmark's results and what is computed from them (pure): the metrics and their
//! targets, medians over rounds, ratios ours ÷ upstream, and the verdict on each target.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::LazyLock;

/// Which sidecar a run measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Impl {
    Ours,
    Upstream,
}

impl Impl {
    pub const BOTH: [Impl; 2] = [Impl::Ours, Impl::Upstream];

    pub fn name(self) -> &'static str {
        match self {
            Impl::Ours => "ours",
            Impl::Upstream => "upstream",
        }
    }
}

impl fmt::Display for Impl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a target says about a metric.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Target {
    /// Median ours ÷ median upstream must be at most this.
    RatioAtMost(f64),
    /// Our median must be below this (in the metric's unit).
    OursBelow(f64),
    /// Reported for context only.
    None,
}

/// One measured quantity. `id` is stable (CSV column, `--only` mapping is by `scenario`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Metric {
    pub id: &'static str,
    pub scenario: &'static str,
    pub label: &'static str,
    pub unit: &'static str,
    pub target: Target,
}

const fn metric(
    id: &'static str,
    scenario: &'static str,
    label: &'static str,
    unit: &'static str,
    target: Target,
) -> Metric {
    Metric {
        id,
        scenario,
        label,
        unit,
        target,
    }
}

pub const A_BOUND: Metric = metric(
    "a_time_to_bound",
    "a",
    "all claims Bound, default QPS",
    "s",
    Target::RatioAtMost(1.0),
);
pub const A_RATE: Metric = metric(
    "a_rate",
    "a",
    "claims Bound per second, default QPS",
    "1/s",
    Target::None,
);
pub const A_PEAK_RSS: Metric = metric(
    "a_peak_rss",
    "a",
    "peak RSS while provisioning, default QPS",
    "MiB",
    Target::None,
);
pub const A_CPU: Metric = metric(
    "a_cpu",
    "a",
    "CPU while provisioning, default QPS",
    "s",
    Target::None,
);
pub const B_BOUND: Metric = metric(
    "b_time_to_bound",
    "b",
    "all claims Bound, QPS 500 / burst 1000",
    "s",
    Target::None,
);
pub const B_RATE: Metric = metric(
    "b_rate",
    "b",
    "claims Bound per second, QPS 500",
    "1/s",
    Target::None,
);
pub const A_PVS: Metric = metric(
    "a_time_to_pvs",
    "a",
    "all PVs created (the sidecar's part of a), default QPS",
    "s",
    Target::None,
);
pub const B_PVS: Metric = metric(
    "b_time_to_pvs",
    "b",
    "all PVs created (the sidecar's part of b), QPS 500",
    "s",
    Target::None,
);
pub const B_PRE_PVS: Metric = metric(
    "b_pre_time_to_pvs",
    "b",
    "all PVs created, QPS 500, claims pre-annotated (no binder wait)",
    "s",
    Target::None,
);
pub const B_PRE_RATE: Metric = metric(
    "b_pre_rate",
    "b",
    "PVs created per second, QPS 500, claims pre-annotated",
    "1/s",
    Target::None,
);
pub const B_PEAK_RSS: Metric = metric(
    "b_peak_rss",
    "b",
    "peak RSS while provisioning, QPS 500",
    "MiB",
    Target::None,
);
pub const B_CPU: Metric = metric(
    "b_cpu",
    "b",
    "CPU while provisioning, QPS 500",
    "s",
    Target::None,
);
pub const C_CPU_FAST: Metric = metric(
    "c_cpu_fast",
    "c",
    "CPU while deleting, QPS 500",
    "s",
    Target::None,
);
/// Issue 20's CPU target: the whole lifecycle of (b) and (c), provisioning plus deletion.
pub const BC_CPU: Metric = metric(
    "bc_cpu",
    "b",
    "CPU for the provisions plus deletions of (b) and (c), QPS 500",
    "s",
    Target::RatioAtMost(0.5),
);
/// API server CPU over the provisions of (b) (claims created until the API server is quiet),
/// per claim: every client's requests, the binder's and the benchmark's included, which are
/// the same for both sidecars.
pub const B_APISERVER_CPU: Metric = metric(
    "b_apiserver_cpu_per_provision",
    "b",
    "API server CPU per provision (all its clients), QPS 500",
    "ms",
    Target::RatioAtMost(1.0),
);
/// The same over the deletions of (c).
pub const C_APISERVER_CPU: Metric = metric(
    "c_apiserver_cpu_per_deletion",
    "c",
    "API server CPU per deletion (all its clients), QPS 500",
    "ms",
    Target::RatioAtMost(1.0),
);
pub const C_GONE: Metric = metric(
    "c_time_to_gone",
    "c",
    "all deleted (PVs gone, driver empty), default QPS",
    "s",
    Target::RatioAtMost(0.5),
);
pub const C_GONE_FAST: Metric = metric(
    "c_time_to_gone_fast",
    "c",
    "all deleted (PVs gone, driver empty), QPS 500",
    "s",
    Target::None,
);
pub const C_CPU: Metric = metric(
    "c_cpu",
    "c",
    "CPU while deleting, default QPS",
    "s",
    Target::None,
);
pub const E_WRITES: Metric = metric(
    "e_writes_per_volume",
    "e",
    "sidecar writes per volume (create + delete), default QPS",
    "req",
    Target::RatioAtMost(1.0),
);
pub const E_WRITES_PROVISION: Metric = metric(
    "e_writes_provision",
    "e",
    "sidecar writes per provisioned volume",
    "req",
    Target::None,
);
pub const E_WRITES_DELETE: Metric = metric(
    "e_writes_delete",
    "e",
    "sidecar writes per deleted volume",
    "req",
    Target::None,
);
pub const E_WRITES_FAST: Metric = metric(
    "e_writes_per_volume_fast",
    "e",
    "sidecar writes per volume (create + delete), QPS 500",
    "req",
    Target::RatioAtMost(1.0),
);
pub const E_GETS: Metric = metric(
    "e_gets_per_volume",
    "e",
    "single-object GETs per volume (create + delete), all clients",
    "req",
    Target::None,
);
pub const E_ALL: Metric = metric(
    "e_all_per_volume",
    "e",
    "all API requests per volume (create + delete), all clients",
    "req",
    Target::None,
);
pub const F_LEASE: Metric = metric(
    "f_lease_handover",
    "f",
    "SIGTERM of the leader → Lease held by the other replica",
    "s",
    Target::OursBelow(2.0),
);
pub const F_PROBE: Metric = metric(
    "f_probe_bound",
    "f",
    "SIGTERM of the leader → claim created then is Bound",
    "s",
    Target::None,
);
pub const F_EXIT: Metric = metric(
    "f_leader_exit",
    "f",
    "SIGTERM of the leader → its process exited",
    "s",
    Target::None,
);
pub const F_LEASE_GATE: Metric = metric(
    "f_lease_handover_gate",
    "f",
    "Lease handover, both with ReleaseLeaderElectionOnExit=true",
    "s",
    Target::OursBelow(2.0),
);
pub const F_PROBE_GATE: Metric = metric(
    "f_probe_bound_gate",
    "f",
    "claim Bound after SIGTERM, both with ReleaseLeaderElectionOnExit=true",
    "s",
    Target::None,
);
pub const F_EXIT_GATE: Metric = metric(
    "f_leader_exit_gate",
    "f",
    "old leader exited, both with ReleaseLeaderElectionOnExit=true",
    "s",
    Target::None,
);
pub const G_RATE: Metric = metric(
    "g_raw_pv_create_rate",
    "g",
    "raw PV creates per second, trivial client",
    "1/s",
    Target::None,
);

pub const H_BOUND: Metric = metric(
    "h_time_to_bound",
    "h",
    "WaitForFirstConsumer: pods created → all claims Bound, QPS 500",
    "s",
    Target::RatioAtMost(1.0),
);
/// Where (h)'s time goes, per claim: until the sidecar may act (the scheduler's selected node
/// and the PV controller's provisioner annotation), the sidecar's own part (→ PV created), and
/// the binder's (→ Bound).
pub const H_ACTIONABLE: Metric = metric(
    "h_time_to_actionable",
    "h",
    "WaitForFirstConsumer: pods created → last claim actionable (node selected, provisioner named)",
    "s",
    Target::None,
);
pub const H_SIDECAR_MEDIAN: Metric = metric(
    "h_sidecar_median",
    "h",
    "WaitForFirstConsumer: claim actionable → its PV created, median over claims",
    "s",
    Target::None,
);
pub const H_SIDECAR_P90: Metric = metric(
    "h_sidecar_p90",
    "h",
    "WaitForFirstConsumer: claim actionable → its PV created, 90th percentile",
    "s",
    Target::None,
);
pub const H_BINDER_MEDIAN: Metric = metric(
    "h_binder_median",
    "h",
    "WaitForFirstConsumer: PV created → claim Bound, median over claims",
    "s",
    Target::None,
);
pub const H_SCHEDULED: Metric = metric(
    "h_time_to_scheduled",
    "h",
    "WaitForFirstConsumer: pods created → all pods bound to Nodes, QPS 500",
    "s",
    Target::None,
);
pub const H_CPU: Metric = metric(
    "h_cpu",
    "h",
    "CPU while provisioning, WaitForFirstConsumer, QPS 500",
    "s",
    Target::RatioAtMost(0.5),
);
pub const H_PEAK_RSS: Metric = metric(
    "h_peak_rss",
    "h",
    "peak RSS, WaitForFirstConsumer, QPS 500",
    "MiB",
    Target::None,
);

pub const I_RESTORE_BOUND: Metric = metric(
    "i_restore_time_to_bound",
    "i",
    "data sources: restores from one snapshot created → all Bound, QPS 500",
    "s",
    Target::RatioAtMost(1.0),
);
pub const I_CLONE_BOUND: Metric = metric(
    "i_clone_time_to_bound",
    "i",
    "data sources: clones of one claim created → all Bound, QPS 500",
    "s",
    Target::RatioAtMost(1.0),
);
pub const I_RESTORE_WRITES: Metric = metric(
    "i_restore_writes_per_volume",
    "i",
    "data sources: sidecar API writes per restored volume",
    "",
    Target::RatioAtMost(1.0),
);
pub const I_CLONE_WRITES: Metric = metric(
    "i_clone_writes_per_volume",
    "i",
    "data sources: sidecar API writes per cloned volume",
    "",
    Target::RatioAtMost(1.0),
);
pub const I_RESTORE_CPU: Metric = metric(
    "i_restore_cpu",
    "i",
    "data sources: CPU while restoring",
    "s",
    Target::None,
);
pub const I_CLONE_CPU: Metric = metric(
    "i_clone_cpu",
    "i",
    "data sources: CPU while cloning",
    "s",
    Target::None,
);
pub const I_PEAK_RSS: Metric = metric(
    "i_peak_rss",
    "i",
    "peak RSS, data sources (restores, then clones)",
    "MiB",
    Target::None,
);

pub const J_STEADY_RSS: Metric = metric(
    "j_steady_rss",
    "j",
    "node mode: steady RSS, all sidecars together, objects present",
    "MiB",
    Target::RatioAtMost(0.25),
);
pub const J_BURST_RSS: Metric = metric(
    "j_burst_rss",
    "j",
    "node mode: peak RSS while provisioning, all sidecars together",
    "MiB",
    Target::RatioAtMost(0.25),
);
pub const J_PEAK_RSS: Metric = metric(
    "j_peak_rss",
    "j",
    "node mode: peak RSS from start-up on, all sidecars together",
    "MiB",
    Target::RatioAtMost(0.25),
);
pub const J_STEADY_CPU: Metric = metric(
    "j_steady_cpu",
    "j",
    "node mode: CPU over the steady window, all sidecars together",
    "s",
    Target::RatioAtMost(0.5),
);
pub const J_BURST_CPU: Metric = metric(
    "j_burst_cpu",
    "j",
    "node mode: CPU while provisioning, all sidecars together",
    "s",
    Target::RatioAtMost(0.5),
);
pub const J_START_CPU: Metric = metric(
    "j_start_cpu",
    "j",
    "node mode: CPU from start until idle, all sidecars together",
    "s",
    Target::None,
);
pub const J_BOUND: Metric = metric(
    "j_time_to_bound",
    "j",
    "node mode: pods created → all claims Bound",
    "s",
    Target::RatioAtMost(1.0),
);
pub const J_SCHEDULED: Metric = metric(
    "j_time_to_scheduled",
    "j",
    "node mode: pods created → all pods bound to Nodes",
    "s",
    Target::None,
);
pub const J_REFRESH_MEDIAN: Metric = metric(
    "j_capacity_refresh_median",
    "j",
    "node mode: PV created → its Node's capacity object shows it, median",
    "s",
    Target::None,
);
pub const J_REFRESH_MAX: Metric = metric(
    "j_capacity_refresh_max",
    "j",
    "node mode: PV created → its Node's capacity object shows it, slowest",
    "s",
    Target::None,
);
pub const J_REFRESH_MISSING: Metric = metric(
    "j_capacity_refresh_missing",
    "j",
    "node mode: PVs their capacity object did not show within 120 s",
    "",
    Target::None,
);
pub const J_REFRESH_FIRST: Metric = metric(
    "j_capacity_refresh_first",
    "j",
    "node mode: capacity object after each Node's first PV (warm-up), median",
    "s",
    Target::None,
);

pub const CHAOS_LEAKS: Metric = metric(
    "chaos_leaked_volumes",
    "chaos",
    "volumes leaked: held by the driver, no PV points at them",
    "",
    Target::OursBelow(0.5),
);
pub const CHAOS_UNBOUND: Metric = metric(
    "chaos_unbound_claims",
    "chaos",
    "claims never deleted but not Bound after the chaos",
    "",
    Target::None,
);

/// One of (d)'s measurements, taken at every size of its cluster: [`scale_metric`] names it
/// per size. Its target applies at [`D_TARGET_PAIRS`] only.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScaleBase {
    pub id: &'static str,
    pub label: &'static str,
    pub unit: &'static str,
    pub target: Target,
}

pub const D_STEADY_RSS: ScaleBase = ScaleBase {
    id: "d_steady_rss",
    label: "steady RSS",
    unit: "MiB",
    target: Target::RatioAtMost(0.20),
};
pub const D_PEAK_RSS: ScaleBase = ScaleBase {
    id: "d_peak_rss",
    label: "peak RSS",
    unit: "MiB",
    target: Target::RatioAtMost(0.25),
};
pub const D_CPU: ScaleBase = ScaleBase {
    id: "d_startup_cpu",
    label: "start-up CPU (start until idle)",
    unit: "s",
    target: Target::RatioAtMost(0.50),
};
/// The new claim named to come last in the API server's stream of claims (key order): it is
/// provisioned only once every existing claim has arrived.
pub const D_FIRST: ScaleBase = ScaleBase {
    id: "d_first_provision",
    label: "start → PV of the first new claim",
    unit: "s",
    target: Target::RatioAtMost(0.30),
};
/// A second new claim, named to come first in that stream: provisioned as soon as it arrives
/// by a sidecar that does not wait for the whole list.
pub const D_FIRST_EARLY: ScaleBase = ScaleBase {
    id: "d_first_provision_early",
    label: "start → PV of a new claim the claim stream brings first",
    unit: "s",
    target: Target::None,
};
pub const D_SETTLE: ScaleBase = ScaleBase {
    id: "d_settle",
    label: "start-up until idle",
    unit: "s",
    target: Target::None,
};
/// Why the first provision takes as long as it does: the API server's CPU over the same
/// start-up (it encodes every object the sidecar's watches receive).
pub const D_APISERVER_CPU: ScaleBase = ScaleBase {
    id: "d_apiserver_cpu",
    label: "API server CPU during the sidecar's start-up (start until idle)",
    unit: "s",
    target: Target::None,
};
/// The benchmark client's time to write the pairs added at this size (no sidecar runs).
pub const D_SETUP: ScaleBase = ScaleBase {
    id: "d_setup_secs",
    label: "setup: writing the pairs added at this size",
    unit: "s",
    target: Target::None,
};
/// The controller manager's API writes while the pairs were written and settled: 0 when its
/// binder found nothing to change.
pub const D_SETUP_KCM: ScaleBase = ScaleBase {
    id: "d_setup_kcm_writes",
    label: "setup: controller manager writes meanwhile",
    unit: "req",
    target: Target::None,
};
const D_BASES: [ScaleBase; 9] = [
    D_STEADY_RSS,
    D_PEAK_RSS,
    D_CPU,
    D_FIRST,
    D_FIRST_EARLY,
    D_SETTLE,
    D_APISERVER_CPU,
    D_SETUP,
    D_SETUP_KCM,
];

/// (d)'s sizes, in claim + PV pairs: the cluster grows through them.
pub const D_QUICK: [usize; 2] = [1_000, 5_000];
pub const D_FULL: [usize; 3] = [10_000, 50_000, 100_000];
/// The size (d)'s targets are set for.
pub const D_TARGET_PAIRS: usize = 100_000;

/// Derived: steady RSS growth between (d)'s smallest and largest size.
pub const D_RSS_GROWTH: Metric = metric(
    "d_rss_per_1k_pairs",
    "d",
    "steady RSS growth per 1,000 claim + PV pairs (smallest → largest size)",
    "MiB",
    Target::None,
);

/// `100k` for 100,000: the suffix of a per-size metric id.
fn size_tag(pairs: usize) -> String {
    if pairs.is_multiple_of(1_000) {
        format!("{}k", pairs / 1_000)
    } else {
        pairs.to_string()
    }
}

/// `100,000`.
pub fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Ids and labels of the per-size metrics, made once: [`Metric`] borrows them for the
/// program's lifetime.
static SCALE_TEXT: LazyLock<Vec<(ScaleBase, usize, String, String)>> = LazyLock::new(|| {
    D_QUICK
        .iter()
        .chain(&D_FULL)
        .flat_map(|&pairs| {
            D_BASES.iter().map(move |base| {
                let n = thousands(pairs);
                (
                    *base,
                    pairs,
                    format!("{}_{}", base.id, size_tag(pairs)),
                    format!("{}, {n} claims + {n} PVs", base.label),
                )
            })
        })
        .collect()
});

static SCALE_METRICS: LazyLock<Vec<Metric>> = LazyLock::new(|| {
    let text: &'static [(ScaleBase, usize, String, String)] = &SCALE_TEXT;
    text.iter()
        .map(|(base, pairs, id, label)| Metric {
            id,
            scenario: "d",
            label,
            unit: base.unit,
            target: if *pairs == D_TARGET_PAIRS {
                base.target
            } else {
                Target::None
            },
        })
        .collect()
});

/// `base` measured with `pairs` claim + PV pairs present, e.g. `d_steady_rss_100k`. A size
/// outside [`D_QUICK`] and [`D_FULL`] gets the base id, without target.
pub fn scale_metric(base: ScaleBase, pairs: usize) -> Metric {
    SCALE_TEXT
        .iter()
        .position(|(b, p, _, _)| *b == base && *p == pairs)
        .map_or(
            metric(base.id, "d", base.label, base.unit, Target::None),
            |i| SCALE_METRICS[i],
        )
}

/// Slope of `(pairs, MiB)` between the smallest and the largest size, per 1,000 pairs.
pub fn rss_per_thousand(points: &[(usize, f64)]) -> Option<f64> {
    let first = points.iter().min_by_key(|(pairs, _)| *pairs)?;
    let last = points.iter().max_by_key(|(pairs, _)| *pairs)?;
    let span = last.0.checked_sub(first.0).filter(|&d| d > 0)? as f64 / 1_000.0;
    Some((last.1 - first.1) / span)
}

/// Every metric in report order: (d)'s per-size ones and their growth row before (e).
fn all_metrics() -> Vec<Metric> {
    let at = METRICS
        .iter()
        .position(|m| m.scenario == "e")
        .unwrap_or(METRICS.len());
    let mut all = METRICS[..at].to_vec();
    all.extend(SCALE_METRICS.iter().copied());
    all.push(D_RSS_GROWTH);
    all.extend_from_slice(&METRICS[at..]);
    all
}

/// Every metric in report order, (d)'s aside (see [`all_metrics`]).
const METRICS: [Metric; 65] = [
    A_BOUND,
    A_PVS,
    A_RATE,
    A_PEAK_RSS,
    A_CPU,
    B_BOUND,
    B_PVS,
    B_RATE,
    B_PRE_PVS,
    B_PRE_RATE,
    B_PEAK_RSS,
    B_CPU,
    BC_CPU,
    C_GONE,
    C_GONE_FAST,
    C_CPU,
    C_CPU_FAST,
    B_APISERVER_CPU,
    C_APISERVER_CPU,
    E_WRITES,
    E_WRITES_PROVISION,
    E_WRITES_DELETE,
    E_WRITES_FAST,
    E_GETS,
    E_ALL,
    F_LEASE,
    F_PROBE,
    F_EXIT,
    F_LEASE_GATE,
    F_PROBE_GATE,
    F_EXIT_GATE,
    G_RATE,
    H_BOUND,
    H_SCHEDULED,
    H_ACTIONABLE,
    H_SIDECAR_MEDIAN,
    H_SIDECAR_P90,
    H_BINDER_MEDIAN,
    H_CPU,
    H_PEAK_RSS,
    I_RESTORE_BOUND,
    I_CLONE_BOUND,
    I_RESTORE_WRITES,
    I_CLONE_WRITES,
    I_RESTORE_CPU,
    I_CLONE_CPU,
    I_PEAK_RSS,
    J_STEADY_RSS,
    J_BURST_RSS,
    J_PEAK_RSS,
    J_STEADY_CPU,
    J_BURST_CPU,
    J_START_CPU,
    J_BOUND,
    J_SCHEDULED,
    J_REFRESH_MEDIAN,
    J_REFRESH_MAX,
    J_REFRESH_MISSING,
    J_REFRESH_FIRST,
    B_OF_G,
    B_OF_G_UPSTREAM,
    B_BOUND_OF_G,
    B_BOUND_OF_G_UPSTREAM,
    CHAOS_LEAKS,
    CHAOS_UNBOUND,
];

/// Derived: ours' own provisioning rate (pre-annotated claims, QPS 500) as a share of the raw
/// create rate (target ≥ 0.7).
pub const B_OF_G: Metric = metric(
    "b_share_of_g",
    "b",
    "ours' PVs created per second (pre-annotated) ÷ raw PV create rate",
    "",
    Target::None,
);
/// Derived, for context: upstream's share of the raw rate.
pub const B_OF_G_UPSTREAM: Metric = metric(
    "b_share_of_g_upstream",
    "b",
    "upstream's PVs created per second (pre-annotated) ÷ raw PV create rate",
    "",
    Target::None,
);
/// Derived, for context: claims Bound per second in (b) as a share of the raw rate.
pub const B_BOUND_OF_G: Metric = metric(
    "b_bound_share_of_g",
    "b",
    "ours' claims Bound per second ÷ raw PV create rate",
    "",
    Target::None,
);
pub const B_BOUND_OF_G_UPSTREAM: Metric = metric(
    "b_bound_share_of_g_upstream",
    "b",
    "upstream's claims Bound per second ÷ raw PV create rate",
    "",
    Target::None,
);

/// Rows computed from others: (row, rate it divides by (g), whose rate).
const DERIVED: [(Metric, Metric, Impl); 4] = [
    (B_OF_G, B_PRE_RATE, Impl::Ours),
    (B_OF_G_UPSTREAM, B_PRE_RATE, Impl::Upstream),
    (B_BOUND_OF_G, B_RATE, Impl::Ours),
    (B_BOUND_OF_G_UPSTREAM, B_RATE, Impl::Upstream),
];

/// The share of (g) that ours must reach in (b).
pub const B_OF_G_TARGET: f64 = 0.7;

/// One value of one metric from one run. `imp` is `None` for (g), which measures no sidecar.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub metric: &'static str,
    pub imp: Option<Impl>,
    pub round: u32,
    pub value: f64,
}

/// Median of the values (mean of the middle two for an even count); `None` when empty.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    })
}

/// `ours ÷ upstream`, when both exist and the divisor is not zero.
pub fn ratio(ours: Option<f64>, upstream: Option<f64>) -> Option<f64> {
    match (ours, upstream) {
        (Some(o), Some(u)) if u != 0.0 => Some(o / u),
        _ => None,
    }
}

/// Whether a target is met, given the medians.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Met,
    Missed,
    NoTarget,
    NotMeasured,
}

/// One row of the summary table.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub metric: Metric,
    pub ours: Option<f64>,
    pub upstream: Option<f64>,
    /// `(g)` and derived rows have one value that belongs to no sidecar.
    pub neutral: Option<f64>,
    pub ratio: Option<f64>,
    pub runs: usize,
    pub verdict: Verdict,
}

/// Medians per metric and sidecar, ratios and verdicts, in report order; metrics without any
/// sample are left out.
pub fn summarize(samples: &[Sample]) -> Vec<Row> {
    let mut by_metric: BTreeMap<(&str, Option<Impl>), Vec<f64>> = BTreeMap::new();
    for s in samples {
        by_metric
            .entry((s.metric, s.imp))
            .or_default()
            .push(s.value);
    }
    let med = |id: &str, imp: Option<Impl>| by_metric.get(&(id, imp)).and_then(|v| median(v));
    let mut rows: Vec<Row> = all_metrics()
        .iter()
        .filter(|m| !DERIVED.iter().any(|(d, _, _)| d.id == m.id))
        .filter_map(|m| {
            if m.id == D_RSS_GROWTH.id {
                return growth_row(&med);
            }
            let ours = med(m.id, Some(Impl::Ours));
            let upstream = med(m.id, Some(Impl::Upstream));
            let neutral = med(m.id, None);
            let runs = samples.iter().filter(|s| s.metric == m.id).count();
            if runs == 0 {
                return None;
            }
            let ratio = ratio(ours, upstream);
            Some(Row {
                metric: *m,
                ours,
                upstream,
                neutral,
                ratio,
                runs,
                verdict: verdict(m.target, ours, ratio),
            })
        })
        .collect();
    let g = med(G_RATE.id, None);
    for (derived, source, imp) in DERIVED {
        if let (Some(rate), Some(g)) = (med(source.id, Some(imp)), g)
            && g > 0.0
        {
            let share = rate / g;
            let verdict = if derived.id != B_OF_G.id {
                Verdict::NoTarget
            } else if share >= B_OF_G_TARGET {
                Verdict::Met
            } else {
                Verdict::Missed
            };
            rows.push(Row {
                metric: derived,
                ours: None,
                upstream: None,
                neutral: Some(share),
                ratio: None,
                runs: 0,
                verdict,
            });
        }
    }
    rows
}

/// [`D_RSS_GROWTH`] from the steady RSS medians at each size, per sidecar.
fn growth_row(med: &dyn Fn(&str, Option<Impl>) -> Option<f64>) -> Option<Row> {
    let growth = |imp: Impl| {
        let points: Vec<(usize, f64)> = D_QUICK
            .iter()
            .chain(&D_FULL)
            .filter_map(|&pairs| {
                Some((pairs, med(scale_metric(D_STEADY_RSS, pairs).id, Some(imp))?))
            })
            .collect();
        rss_per_thousand(&points)
    };
    let (ours, upstream) = (growth(Impl::Ours), growth(Impl::Upstream));
    if ours.is_none() && upstream.is_none() {
        return None;
    }
    Some(Row {
        metric: D_RSS_GROWTH,
        ours,
        upstream,
        neutral: None,
        ratio: ratio(ours, upstream),
        runs: 0,
        verdict: Verdict::NoTarget,
    })
}

fn verdict(target: Target, ours: Option<f64>, ratio: Option<f64>) -> Verdict {
    match target {
        Target::None => Verdict::NoTarget,
        Target::RatioAtMost(limit) => match ratio {
            Some(r) if r <= limit => Verdict::Met,
            Some(_) => Verdict::Missed,
            None => Verdict::NotMeasured,
        },
        Target::OursBelow(limit) => match ours {
            Some(v) if v < limit => Verdict::Met,
            Some(_) => Verdict::Missed,
            None => Verdict::NotMeasured,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[f64::NAN, 5.0]), Some(5.0));
    }

    #[test]
    fn ratio_needs_both_and_a_non_zero_divisor() {
        assert_eq!(ratio(Some(1.0), Some(4.0)), Some(0.25));
        assert_eq!(ratio(Some(1.0), Some(0.0)), None);
        assert_eq!(ratio(None, Some(1.0)), None);
    }

    fn sample(metric: &'static str, imp: Option<Impl>, value: f64) -> Sample {
        Sample {
            metric,
            imp,
            round: 1,
            value,
        }
    }

    #[test]
    fn summary_takes_medians_and_judges_targets() {
        let samples = vec![
            sample(BC_CPU.id, Some(Impl::Ours), 2.0),
            sample(BC_CPU.id, Some(Impl::Ours), 4.0),
            sample(BC_CPU.id, Some(Impl::Ours), 100.0),
            sample(BC_CPU.id, Some(Impl::Upstream), 10.0),
            sample(F_LEASE.id, Some(Impl::Ours), 3.0),
            sample(F_LEASE.id, Some(Impl::Upstream), 17.0),
        ];
        let rows = summarize(&samples);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].metric.id, BC_CPU.id);
        assert_eq!(rows[0].ours, Some(4.0));
        assert_eq!(rows[0].ratio, Some(0.4));
        assert_eq!(rows[0].verdict, Verdict::Met);
        // An absolute target: upstream's value does not matter.
        assert_eq!(rows[1].verdict, Verdict::Missed);
    }

    #[test]
    fn share_of_the_raw_rate_is_derived_from_b_and_g() {
        let samples = vec![
            sample(B_PRE_RATE.id, Some(Impl::Ours), 80.0),
            sample(B_PRE_RATE.id, Some(Impl::Upstream), 20.0),
            sample(G_RATE.id, None, 100.0),
        ];
        let rows = summarize(&samples);
        let ours = rows.iter().find(|r| r.metric.id == B_OF_G.id).expect("row");
        assert_eq!(ours.neutral, Some(0.8));
        assert_eq!(ours.verdict, Verdict::Met);
        let upstream = rows
            .iter()
            .find(|r| r.metric.id == B_OF_G_UPSTREAM.id)
            .expect("row");
        assert_eq!(upstream.neutral, Some(0.2));
        assert_eq!(upstream.verdict, Verdict::NoTarget);
    }

    #[test]
    fn metric_ids_are_unique() {
        let all = all_metrics();
        let mut ids: Vec<_> = all.iter().map(|m| m.id).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), all.len());
    }

    #[test]
    fn scale_metrics_are_named_per_size_with_targets_at_100k_only() {
        let m = scale_metric(D_STEADY_RSS, 100_000);
        assert_eq!(m.id, "d_steady_rss_100k");
        assert_eq!(m.label, "steady RSS, 100,000 claims + 100,000 PVs");
        assert_eq!(m.target, Target::RatioAtMost(0.20));
        let small = scale_metric(D_FIRST, 1_000);
        assert_eq!(small.id, "d_first_provision_1k");
        assert_eq!(small.target, Target::None);
        assert_eq!(scale_metric(D_CPU, 7).id, "d_startup_cpu");
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(thousands(999), "999");
    }

    #[test]
    fn growth_is_the_slope_between_smallest_and_largest_size() {
        let points = [(50_000, 70.0), (100_000, 120.0), (10_000, 30.0)];
        assert_eq!(rss_per_thousand(&points), Some(1.0));
        assert_eq!(rss_per_thousand(&[(10_000, 30.0)]), None);
        assert_eq!(rss_per_thousand(&[]), None);
        let samples: Vec<Sample> = [(10_000, 30.0), (100_000, 210.0)]
            .into_iter()
            .flat_map(|(pairs, mib)| {
                let id = scale_metric(D_STEADY_RSS, pairs).id;
                [
                    sample(id, Some(Impl::Ours), mib / 2.0),
                    sample(id, Some(Impl::Upstream), mib),
                ]
            })
            .collect();
        let rows = summarize(&samples);
        let growth = rows
            .iter()
            .find(|r| r.metric.id == D_RSS_GROWTH.id)
            .expect("growth row");
        assert_eq!(growth.ours, Some(1.0));
        assert_eq!(growth.upstream, Some(2.0));
        assert_eq!(growth.ratio, Some(0.5));
    }
}
