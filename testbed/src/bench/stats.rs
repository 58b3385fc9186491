//! The benchmark's results and what is computed from them (pure): the metrics and their
//! targets, medians over rounds, ratios ours ÷ upstream, and the verdict on each target.

use std::collections::BTreeMap;
use std::fmt;

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
    Target::RatioAtMost(0.5),
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
    Target::RatioAtMost(0.5),
);
pub const B_PRE_PVS: Metric = metric(
    "b_pre_time_to_pvs",
    "b",
    "all PVs created, QPS 500, claims pre-annotated (no binder wait)",
    "s",
    Target::RatioAtMost(0.5),
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
    Target::RatioAtMost(0.5),
);
pub const C_CPU: Metric = metric(
    "c_cpu",
    "c",
    "CPU while deleting, default QPS",
    "s",
    Target::None,
);
pub const D_PEAK_RSS: Metric = metric(
    "d_peak_rss",
    "d",
    "peak RSS, objects present at start",
    "MiB",
    Target::RatioAtMost(0.25),
);
pub const D_STEADY_RSS: Metric = metric(
    "d_steady_rss",
    "d",
    "steady RSS, objects present",
    "MiB",
    Target::RatioAtMost(0.25),
);
pub const D_CPU: Metric = metric("d_cpu", "d", "CPU from start to steady", "s", Target::None);
pub const D_SETTLE: Metric = metric(
    "d_settle",
    "d",
    "start-up until idle, objects present",
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

/// Every metric in report order.
pub const METRICS: [Metric; 61] = [
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
    C_GONE,
    C_GONE_FAST,
    C_CPU,
    D_PEAK_RSS,
    D_STEADY_RSS,
    D_CPU,
    D_SETTLE,
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
    let mut rows: Vec<Row> = METRICS
        .iter()
        .filter(|m| !DERIVED.iter().any(|(d, _, _)| d.id == m.id))
        .filter_map(|m| {
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
            sample(B_BOUND.id, Some(Impl::Ours), 2.0),
            sample(B_BOUND.id, Some(Impl::Ours), 4.0),
            sample(B_BOUND.id, Some(Impl::Ours), 100.0),
            sample(B_BOUND.id, Some(Impl::Upstream), 10.0),
            sample(F_LEASE.id, Some(Impl::Ours), 3.0),
            sample(F_LEASE.id, Some(Impl::Upstream), 17.0),
        ];
        let rows = summarize(&samples);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].metric.id, B_BOUND.id);
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
        let mut ids: Vec<_> = METRICS.iter().map(|m| m.id).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), METRICS.len());
    }
}
