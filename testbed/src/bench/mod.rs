//! `testbed bench`: our sidecar against upstream external-provisioner v6.3.0, each run on the
//! same local control plane with the same reference driver and identical flags, alternately
//! (A B A B ...). Prints a table of medians and ratios and writes docs/benchmarks.md with CSV
//! data and PNG plots. Not part of hack/test.sh: these are figures, not pass/fail tests.

mod api;
mod chaos;
mod env;
mod metrics;
mod node_mode;
mod plot;
mod proc;
mod report;
mod scenarios;
mod sources;
mod stats;
mod wffc;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::ValueEnum;
use thiserror::Error;

use report::{Results, RunRecord};
use scenarios::Lifecycle;
use stats::Impl;

#[derive(Debug, Error)]
pub enum BenchError {
    #[error("{step}: {detail}")]
    Step { step: String, detail: String },
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("building ours: {0}")]
    Build(#[from] csi_testbed::workspace::BuildError),
    #[error(transparent)]
    Script(#[from] csi_testbed::workspace::ScriptError),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Size {
    /// A few minutes: small counts, one round by default.
    Quick,
    /// The report's size: 1,000 claims, up to 100,000 claim + PV pairs for (d), three rounds by
    /// default.
    Full,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
pub enum Scenario {
    A,
    B,
    C,
    D,
    E,
    F,
    G,
    H,
    I,
    J,
    Chaos,
}

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// quick (a few minutes) or full (the report's size; long on 2 cores).
    #[arg(long, value_enum, default_value_t = Size::Full)]
    pub size: Size,
    /// Rounds per scenario (each round runs ours, then upstream) [default: 1 quick, 3 full].
    #[arg(long)]
    pub rounds: Option<u32>,
    /// Only these scenarios, e.g. `--only a,f` (c and e are measured in the runs of a and b).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub only: Vec<Scenario>,
    /// Where benchmarks.md and benchmarks/ (CSV, PNG) go, relative to the workspace root.
    #[arg(long, default_value = "docs")]
    pub out: PathBuf,
    /// Use target/release/{csi-provisioner,csi-reference-driver} as they are.
    #[arg(long)]
    pub no_build: bool,
    /// (j): this many Nodes, each with its own driver and sidecar [default: 3 quick, 20 full].
    #[arg(long)]
    pub nodes: Option<usize>,
    /// Skip the PNG plots (no Python needed).
    #[arg(long)]
    pub no_plots: bool,
    /// KEY=VALUE added to our sidecar's environment only (repeatable), for experiments such as
    /// `--ours-env MALLOC_ARENA_MAX=2`; named in the report's command line.
    #[arg(long = "ours-env", value_name = "KEY=VALUE", value_parser = parse_env)]
    pub ours_env: Vec<(String, String)>,
}

fn parse_env(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(format!("expected KEY=VALUE, got {s:?}")),
    }
}

/// Counts per size.
pub struct Sizes {
    pub claims_a: usize,
    pub claims_b: usize,
    /// (d): claim + PV pairs the cluster grows through.
    pub scale: &'static [usize],
    pub raw: usize,
    pub steady_window: Duration,
    pub chaos: usize,
    /// (h): pods, one claim each, over `wffc::NODES` Nodes.
    pub wffc_pods: usize,
    /// (i): claims restored from one snapshot, and as many cloned from one claim.
    pub sources: usize,
    /// (j): Nodes, pods, objects present, steady window.
    pub node_mode: node_mode::Counts,
}

impl Sizes {
    fn of(size: Size) -> Sizes {
        match size {
            Size::Quick => Sizes {
                claims_a: 50,
                claims_b: 200,
                scale: &stats::D_QUICK,
                raw: 500,
                steady_window: Duration::from_secs(5),
                chaos: 40,
                wffc_pods: 100,
                sources: 50,
                node_mode: node_mode::Counts {
                    nodes: 3,
                    pods: 200,
                    objects: 1_000,
                    steady: Duration::from_secs(10),
                },
            },
            Size::Full => Sizes {
                claims_a: 1_000,
                claims_b: 1_000,
                scale: &stats::D_FULL,
                raw: 2_000,
                steady_window: Duration::from_secs(20),
                chaos: 200,
                wffc_pods: 500,
                sources: 200,
                node_mode: node_mode::Counts {
                    nodes: 20,
                    pods: 500,
                    objects: 10_000,
                    steady: Duration::from_secs(60),
                },
            },
        }
    }
}

/// What every run needs.
pub struct Bench {
    pub programs: env::Programs,
    /// `--ours-env`.
    pub ours_env: Vec<(String, String)>,
    pub sizes: Sizes,
    pub logs: PathBuf,
    pub scratch: PathBuf,
    pub ticks: f64,
    started: Instant,
}

impl Bench {
    /// One progress line on stderr, stamped with the time since the benchmark started.
    pub fn say(&self, message: impl AsRef<str>) {
        let s = self.started.elapsed().as_secs();
        eprintln!(
            "[bench {:02}:{:02}:{:02}] {}",
            s / 3600,
            s / 60 % 60,
            s % 60,
            message.as_ref()
        );
    }
}

pub async fn run(args: BenchArgs) -> ExitCode {
    match run_all(args).await {
        Ok(code) => code,
        Err(error) => {
            eprintln!("testbed bench: {error}");
            ExitCode::FAILURE
        }
    }
}

fn command_line(args: &BenchArgs, rounds: u32) -> String {
    let mut cmd = format!(
        "cargo run --release -p csi-testbed -- bench --size {}",
        match args.size {
            Size::Quick => "quick",
            Size::Full => "full",
        }
    );
    if args.rounds.is_some() {
        cmd.push_str(&format!(" --rounds {rounds}"));
    }
    if !args.only.is_empty() {
        let only: Vec<String> = args
            .only
            .iter()
            .filter_map(|s| s.to_possible_value().map(|v| v.get_name().to_owned()))
            .collect();
        cmd.push_str(&format!(" --only {}", only.join(",")));
    }
    if let Some(nodes) = args.nodes {
        cmd.push_str(&format!(" --nodes {nodes}"));
    }
    for (key, value) in &args.ours_env {
        cmd.push_str(&format!(" --ours-env {key}={value}"));
    }
    cmd
}

async fn run_all(args: BenchArgs) -> Result<ExitCode, BenchError> {
    let rounds = args.rounds.unwrap_or(match args.size {
        Size::Quick => 1,
        Size::Full => 3,
    });
    let all = [
        Scenario::A,
        Scenario::B,
        Scenario::C,
        Scenario::D,
        Scenario::E,
        Scenario::F,
        Scenario::G,
        Scenario::H,
        Scenario::I,
        Scenario::J,
        Scenario::Chaos,
    ];
    let selected: BTreeSet<Scenario> = if args.only.is_empty() {
        all.into_iter().collect()
    } else {
        args.only.iter().copied().collect()
    };
    let has = |s: Scenario| selected.contains(&s);
    let no_build = args.no_build;
    let programs = tokio::task::spawn_blocking(move || env::prepare(no_build))
        .await
        .map_err(|e| BenchError::Step {
            step: "preparing the programs".into(),
            detail: e.to_string(),
        })??;
    // Builds are not part of the benchmark's time.
    let started = Instant::now();
    let root = csi_testbed::workspace::root();
    let out = root.join(&args.out);
    let data = out.join("benchmarks");
    let logs = root.join("target").join("bench-logs");
    let _ = std::fs::remove_dir_all(&logs);
    for dir in [&data, &logs] {
        std::fs::create_dir_all(dir).map_err(|source| BenchError::Io {
            what: format!("creating {}", dir.display()),
            source,
        })?;
    }
    let machine = env::describe(&programs);
    let mut sizes = Sizes::of(args.size);
    if let Some(nodes) = args.nodes {
        sizes.node_mode.nodes = nodes.max(1);
    }
    let bench = Bench {
        ours_env: args.ours_env.clone(),
        programs,
        sizes,
        logs,
        scratch: env::scratch_parent(),
        ticks: proc::clock_ticks(),
        started,
    };
    bench.say(format!(
        "{rounds} round(s); sidecar logs in {}",
        bench.logs.display()
    ));
    let mut results = Results::default();

    if has(Scenario::G) {
        for round in 1..=rounds {
            let t = Begin::now("g", None, round);
            let outcome = scenarios::raw_rate(&bench, round, &mut results).await;
            t.end(&bench, &mut results, outcome);
        }
    }
    let fast = has(Scenario::B) || has(Scenario::C) || has(Scenario::E);
    let default_qps = has(Scenario::A) || has(Scenario::C) || has(Scenario::E);
    for (selected, kinds) in [
        (fast, &[Lifecycle::Fast, Lifecycle::FastPreAnnotated][..]),
        (default_qps, &[Lifecycle::Default][..]),
    ] {
        if !selected {
            continue;
        }
        for round in 1..=rounds {
            for &kind in kinds {
                for imp in Impl::BOTH {
                    let t = Begin::now(kind.scenario(), Some(imp), round);
                    let outcome =
                        scenarios::lifecycle(&bench, imp, round, kind, &mut results).await;
                    t.end(&bench, &mut results, outcome);
                }
            }
        }
    }
    if has(Scenario::D) {
        scale(&bench, rounds, &mut results).await;
    }
    if has(Scenario::F) {
        for round in 1..=rounds {
            for (gate, scenario) in [(false, "f"), (true, "f (gate)")] {
                for imp in Impl::BOTH {
                    let t = Begin::now(scenario, Some(imp), round);
                    let outcome = scenarios::failover(&bench, imp, round, gate, &mut results).await;
                    t.end(&bench, &mut results, outcome);
                }
            }
        }
    }
    if has(Scenario::H) {
        for round in 1..=rounds {
            for imp in Impl::BOTH {
                let t = Begin::now("h", Some(imp), round);
                let outcome = wffc::wait_for_first_consumer(&bench, imp, round, &mut results).await;
                t.end(&bench, &mut results, outcome);
            }
        }
    }
    if has(Scenario::I) {
        let prepared = tokio::task::spawn_blocking(sources::prepare)
            .await
            .map_err(|e| BenchError::Step {
                step: "preparing the snapshot programs".into(),
                detail: e.to_string(),
            })
            .and_then(|built| built);
        match prepared {
            Ok(binaries) => {
                for round in 1..=rounds {
                    for imp in Impl::BOTH {
                        let t = Begin::now("i", Some(imp), round);
                        let outcome =
                            sources::data_sources(&bench, &binaries, imp, round, &mut results)
                                .await;
                        t.end(&bench, &mut results, outcome);
                    }
                }
            }
            Err(e) => {
                bench.say(format!("(i) setup failed: {e}"));
                results
                    .unavailable
                    .push(("i", format!("setup failed: {e}")));
            }
        }
    }
    if has(Scenario::J) {
        for round in 1..=rounds {
            for imp in Impl::BOTH {
                let t = Begin::now("j", Some(imp), round);
                let outcome = node_mode::node_mode(&bench, imp, round, &mut results).await;
                t.end(&bench, &mut results, outcome);
            }
        }
    }
    if has(Scenario::Chaos) {
        for round in 1..=rounds {
            for imp in Impl::BOTH {
                let t = Begin::now("chaos", Some(imp), round);
                let outcome = chaos::chaos(&bench, imp, round, &mut results).await;
                t.end(&bench, &mut results, outcome);
            }
        }
    }

    let rows = stats::summarize(&results.samples);
    println!("\n{}", report::table(&rows));
    report::write_csvs(&results, &data)?;
    let (plots, plot_error) = if args.no_plots {
        (Vec::new(), None)
    } else {
        match plot::draw(&data) {
            Ok(plots) => (plots, None),
            Err(e) => {
                bench.say(format!("plots: {e}"));
                (Vec::new(), Some(e.to_string()))
            }
        }
    };
    let md_path = out.join("benchmarks.md");
    let previous = std::fs::read_to_string(&md_path).unwrap_or_default();
    let generated = k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%d %H:%M UTC")
        .to_string();
    let command = command_line(&args, rounds);
    let method = method(&bench.sizes);
    let markdown = report::markdown(
        &results,
        &report::Context {
            command: &command,
            generated: &generated,
            total_secs: started.elapsed().as_secs_f64(),
            machine: &machine,
            method: &method,
            rounds,
            plots: &plots,
            plot_error: plot_error.as_deref(),
        },
        report::kept_notes(&previous),
    );
    report::write(&md_path, &markdown)?;
    let failed = results.runs.iter().filter(|r| r.error.is_some()).count();
    bench.say(format!(
        "wrote {} and {} ({} run(s), {failed} failed) in {:.0} min",
        md_path.display(),
        data.display(),
        results.runs.len(),
        started.elapsed().as_secs_f64() / 60.0
    ));
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// (d): one control plane, grown through the sizes; at each size every round runs before it
/// grows.
async fn scale(bench: &Bench, rounds: u32, results: &mut Results) {
    let mut cluster = match scenarios::ScaleCluster::start(bench).await {
        Ok(cluster) => cluster,
        Err(e) => return d_unavailable(bench, results, e),
    };
    for &pairs in bench.sizes.scale {
        if let Err(e) = cluster.grow(bench, pairs, results).await {
            return d_unavailable(bench, results, e);
        }
        for round in 1..=rounds {
            for imp in Impl::BOTH {
                let t = Begin::now("d", Some(imp), round);
                let outcome = scenarios::idle(bench, &cluster, imp, round, results).await;
                t.end(bench, results, outcome);
            }
        }
    }
}

fn d_unavailable(bench: &Bench, results: &mut Results, e: BenchError) {
    bench.say(format!("(d) setup failed: {e}"));
    results
        .unavailable
        .push(("d", format!("setup failed: {e}")));
}

/// Start of one run, for its [`RunRecord`].
struct Begin {
    scenario: &'static str,
    imp: Option<Impl>,
    round: u32,
    at: Instant,
    load: f64,
}

impl Begin {
    fn now(scenario: &'static str, imp: Option<Impl>, round: u32) -> Begin {
        Begin {
            scenario,
            imp,
            round,
            at: Instant::now(),
            load: env::load_average(),
        }
    }

    fn end(self, bench: &Bench, results: &mut Results, outcome: Result<(), BenchError>) {
        if let Err(e) = &outcome {
            bench.say(format!(
                "({}) {} round {} FAILED: {e}",
                self.scenario,
                self.imp.map_or("", Impl::name),
                self.round
            ));
        }
        results.runs.push(RunRecord {
            scenario: self.scenario,
            imp: self.imp,
            round: self.round,
            wall_secs: self.at.elapsed().as_secs_f64(),
            load: self.load,
            error: outcome.err().map(|e| e.to_string()),
        });
    }
}

/// The "Method" section: how each figure is obtained, with this size's counts.
fn method(s: &Sizes) -> Vec<(String, String)> {
    let items = [
        (
            "order",
            "each round runs ours, then upstream, for one scenario after the other (A B A B ...); \
             the table shows medians over the rounds"
                .to_owned(),
        ),
        (
            "control plane",
            "a fresh one (etcd, kube-apiserver, kube-controller-manager with --kube-api-qps 1000 \
             --kube-api-burst 2000, API Priority and Fairness off; docs/control-plane.md) for every \
             run of (a), (b), (f), (g), (h) and (i) (with kube-scheduler in (h), with the snapshot \
             CRDs, snapshot-controller and csi-snapshotter in (i)), so no run inherits another's objects or caches; one for \
             all runs of (d), whose objects the sidecars only read"
                .to_owned(),
        ),
        (
            "driver",
            "csi-reference-driver with fresh state per run, on tmpfs (/dev/shm) so that its fsync \
             per change costs nothing; log level warn"
                .to_owned(),
        ),
        (
            "flags",
            "both sidecars get exactly `--csi-address=<socket> --kubeconfig=<admin kubeconfig> \
             --v=0`, plus `--kube-api-qps=500 --kube-api-burst=1000` in (b), (h) and (i), and \
             `--leader-election --leader-election-namespace=default` in (f); everything else is \
             each one's default (upstream: QPS 5, burst 10, 100 workers)"
                .to_owned(),
        ),
        (
            "(a), (b)",
            format!(
                "after one warm-up claim has been provisioned and deleted, {} claims in (a) and {} \
                 in (b) are created by a client without rate limit ({} requests in flight); the \
                 time runs from the first create until a watch has seen every claim Bound; \
                 \"all PVs created\" stops when the last PV appeared (the sidecar's part: the \
                 controller manager's binder still has to bind it). In the pre-annotated variant \
                 of (b) the claims carry `volume.kubernetes.io/storage-provisioner` from the \
                 start, so the sidecar does not wait for the binder to add it: that is the \
                 sidecar's own provisioning rate, compared with (g). API server CPU per \
                 provision (per deletion, in (c)) is kube-apiserver's utime + stime from just \
                 before the claims are created until the API writes have stopped, divided by \
                 the claims: every client's requests count, the binder's and the benchmark's \
                 too, which are the same for both sidecars",
                s.claims_a,
                s.claims_b,
                api::CONCURRENCY
            ),
        ),
        (
            "(c)",
            "in the same run, every claim is deleted; the time runs until no PV of the class is \
             left and the driver's state holds no volume"
                .to_owned(),
        ),
        (
            "(d)",
            format!(
                "one control plane for all runs, grown through {sizes} claim + PV pairs; at \
                 each size every round runs before it grows. The benchmark writes the pairs \
                 as the controller manager's binder leaves them: the claim (with `volumeName` \
                 and the binder's annotations `pv.kubernetes.io/bind-completed` and \
                 `pv.kubernetes.io/bound-by-controller`), then the PV (looks provisioned: \
                 annotation, finalizer, CSI source; claimRef with the claim's uid), then both \
                 statuses Bound through the status subresource ({c} pairs in flight). The \
                 binder may see a pair between two of these writes and write the same status \
                 itself: the table gives the setup time per size and the controller \
                 manager's claim and PV writes meanwhile (the apiserver's count less the \
                 benchmark's own: 0 when the binder found nothing to change); once the API \
                 writes have stopped, the setup checks that every claim and PV is Bound. Before each sidecar starts, two \
                 new claims of the class, pre-annotated with \
                 `volume.kubernetes.io/storage-provisioner` as in (b), are created: the API \
                 server streams claims in key order, so `new-…` comes after every `claim-…` \
                 and `a-new-…` before them. \"PV of the first new claim\" (the one streamed \
                 last) and \"PV of a new claim the claim stream brings first\" run from the \
                 sidecar's spawn until a watch sees that claim's PV (with claimRef) appear. \
                 Start-up CPU is utime + stime from spawn \
                 until the sidecar has used less than 3 % of a core for 3 s (\"start-up until \
                 idle\"); peak RSS is VmHWM; steady RSS the median VmRSS over {w}s after \
                 that. Then the new claims are deleted and the run waits until the sidecar has \
                 deleted their PVs, so every run starts from the same pairs. Targets apply at \
                 {target} pairs. RSS growth is the slope of the steady RSS medians between \
                 the smallest and the largest size, per 1,000 pairs (one pair = one claim + \
                 one PV)",
                sizes = s
                    .scale
                    .iter()
                    .map(|&n| stats::thousands(n))
                    .collect::<Vec<_>>()
                    .join(" / "),
                c = 2 * api::CONCURRENCY,
                w = s.steady_window.as_secs(),
                target = stats::thousands(stats::D_TARGET_PAIRS),
            ),
        ),
        (
            "(e)",
            "`apiserver_request_total` is read before and after each phase of (a) and (b) (after \
             the last write has landed, so rate-limited event writes count too). The sidecar's \
             writes are the apiserver's POST/PUT/PATCH/DELETE on resources (Leases aside), minus \
             the controller manager's (its own `rest_client_requests_total`) and the benchmark \
             client's (one create and one delete per claim), divided by the number of volumes"
                .to_owned(),
        ),
        (
            "(f)",
            "two replicas with leader election, each in its own UTS namespace with hostname \
             replica-a or replica-b (their identities, as two pods would have); SIGTERM to the \
             Lease holder and, at the same moment, one new claim. Measured: until the other \
             replica holds the Lease, until that claim is Bound, and until the old leader exited. \
             Run twice per round: with the default flags (upstream then leaves the Lease to \
             expire: lease duration 15 s) and with `--feature-gates=ReleaseLeaderElectionOnExit=true` \
             for both (upstream's alpha gate that releases it; ours always releases)"
                .to_owned(),
        ),
        (
            "(g)",
            format!(
                "{} PV creates (after {} untimed ones) by the benchmark's client (kube-rs, no rate \
                 limit, {} in flight) on a fresh control plane: the most any sidecar could reach",
                s.raw,
                api::CONCURRENCY,
                api::CONCURRENCY
            ),
        ),
        (
            "(h)",
            format!(
                "a control plane with kube-scheduler (`--kube-api-qps 1000 --kube-api-burst 2000`, \
                 docs/control-plane.md); {nodes} Nodes \
                 (Ready, untainted, no kubelet) in {zones} zones, each with a CSINode that gives the \
                 driver's zone key; the driver serves one segment per zone; a WaitForFirstConsumer \
                 class. After a warm-up pod and claim, {n} claims are created and left Pending, then \
                 {n} pods, one claim each, with no node selector: the scheduler spreads them, \
                 selects their claims' nodes and binds each pod once its claim is Bound (pods never \
                 start). Both sidecars get `--kube-api-qps=500 --kube-api-burst=1000`, otherwise \
                 default flags (the Topology gate is on by default in both). Times run from the \
                 first pod create; CPU from then until no API write for 3 s after the last binding. \
                 Where the time goes, per claim: from the first pod create until the claim is \
                 actionable (a watch sees both the scheduler's `volume.kubernetes.io/selected-node` \
                 and the PV controller's `volume.kubernetes.io/storage-provisioner`), from then \
                 until its PV appears (the sidecar's part, median and 90th percentile), and from \
                 then until the claim is Bound (the binder's). \
                 Every run ends with a check that each PV's node affinity admits its pod's Node, \
                 and fails otherwise",
                nodes = wffc::NODES,
                zones = wffc::ZONES,
                n = s.wffc_pods
            ),
        ),
        (
            "(i)",
            format!(
                "the snapshot machinery of external-snapshotter (its CRDs, snapshot-controller, \
                 csi-snapshotter for the driver; docs/control-plane.md) runs beside the sidecar; \
                 the driver serves CLONE_VOLUME and snapshots. After the warm-up claim, one source \
                 claim is provisioned and one VolumeSnapshot of it (in a VolumeSnapshotClass of \
                 the driver, both created through the API) becomes readyToUse; nothing of that is \
                 counted. Then {n} claims with `dataSource` that VolumeSnapshot are created at \
                 once, and once they are Bound and the API writes have stopped, {n} claims with \
                 `dataSource` the source claim. Per phase: time from the first create until a \
                 watch has seen the last claim Bound; sidecar writes per volume as in (e) (the \
                 snapshot programs' writes, if any, count as the sidecar's: they have no request \
                 metrics to subtract); CPU until no API write for 3 s. Both sidecars run with their \
                 cloning protection and ours also with its snapshot sweeper (both on by default). \
                 Every run ends with a check in the driver's state that each restored volume was \
                 created from the snapshot's handle, each clone from the source claim's volume, \
                 and that there are exactly one PV and one driver volume per claim, and fails \
                 otherwise",
                n = s.sources
            ),
        ),
        (
            "(j)",
            format!(
                "node mode: a control plane with kube-scheduler; {nodes} Nodes (Ready, untainted, \
                 no kubelet), each labelled `{key}=<its name>` and with a CSINode giving that key; \
                 a CSIDriver with `storageCapacity: true`, so the scheduler places a pod only \
                 where a CSIStorageCapacity object has room; a WaitForFirstConsumer class. Before \
                 the sidecars start, {objects} PVs that look provisioned (spread over the Nodes \
                 by node affinity) and {objects} claims bound to them exist. Per Node, one \
                 reference driver (`--node-id=<node> --topology={key}=<node> --capacity=1Ti`) \
                 and one sidecar beside it with env `NODE_NAME=<node>` and \
                 `NAMESPACE=bench-capacity` and the flags `--node-deployment --enable-capacity \
                 --capacity-poll-interval=10m --capacity-ownerref-level=-1` (no leader election), \
                 otherwise default flags, the same for both. Once every Node has its capacity \
                 object and every sidecar uses less than 3 % of a core (start-up), one pod per \
                 Node, pinned to it, is provisioned (warm-up); then the steady window of {steady} \
                 s: the sidecars' summed VmRSS (sampled every 250 ms, median) and CPU (utime + \
                 stime). Then {pods} claims are created and left Pending, then {pods} pods with \
                 no node selector: provisioning time runs from the first pod create until a watch \
                 saw the last claim Bound; CPU from then until no API write for 3 s; peak RSS is \
                 the largest sampled sum in that time (and over the whole run). Capacity refresh: \
                 for each PV of the burst, from the moment a watch saw it to the first update of \
                 its Node's capacity object whose value shows it and the Node's earlier volumes \
                 (the value before the burst minus 1 GiB per volume); the poll interval is \
                 far longer than a run, so only the refresh that follows a provision can do it. \
                 Every run ends with a check that each PV's node affinity admits its pod's Node \
                 and each Node's driver holds exactly the volumes of its pods, and fails otherwise",
                nodes = s.node_mode.nodes,
                key = "topology.reference.csi.example.com/node",
                objects = s.node_mode.objects,
                steady = s.node_mode.steady.as_secs(),
                pods = s.node_mode.pods,
            ),
        ),
        (
            "chaos",
            format!(
                "{} claims created about 50 ms apart while the driver delays CreateVolume by \
                 1.5 s (sometimes 4 s, beyond both sidecars' `--timeout=3s`) and now and then \
                 answers DEADLINE_EXCEEDED after creating the volume, never answers after \
                 creating it (a lost reply: the sidecar gives up after 3 s) or answers \
                 UNAVAILABLE (testbed/src/chaos.rs); 30 % of the claims are \
                 deleted within 3 s of their creation, and the sidecar is SIGKILLed {} times and \
                 restarted within 2 s. The same seeded plan for both in a round. Then the faults \
                 stop and each gets up to {} s to clean up (done early once nothing has been \
                 leaked and every kept claim has been Bound for {} s in a row); a leaked volume \
                 is one the driver holds and no PV points at (nothing will ever delete it)",
                s.chaos,
                chaos::SIGKILLS,
                chaos::SETTLE.as_secs(),
                chaos::SETTLED_FOR.as_secs()
            ),
        ),
        (
            "caveat",
            "everything shares the machine's cores (control plane, driver, sidecar, benchmark \
             client, and whatever else runs): the load average at the start of each run is in \
             the Runs table"
                .to_owned(),
        ),
    ];
    items
        .into_iter()
        .map(|(what, how)| (what.to_owned(), how))
        .collect()
}
