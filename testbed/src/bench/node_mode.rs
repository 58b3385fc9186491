//! (j): node mode. One sidecar per Node (`--node-deployment`, env `NODE_NAME`), each beside its
//! own reference driver instance whose only segment is its Node, all of them publishing
//! CSIStorageCapacity (`--enable-capacity`, env `NAMESPACE`), on a cluster that already holds
//! many bound claims and PVs which every sidecar watches. kube-scheduler places pods whose
//! claims are of a WaitForFirstConsumer class on Nodes that have capacity (the CSIDriver says
//! `storageCapacity: true`), the chosen Node's sidecar provisions, and its capacity object
//! shrinks. Measured for the sidecars together: resident memory and CPU at steady state and
//! while the claims are provisioned, the time until all are Bound, and how soon a Node's
//! capacity object follows each provision.
//!
//! Ours and upstream's get the same flags and environment; the run fails if either refuses them.
//! Figures of wrong behaviour are worth nothing, so every run ends with a check that each PV's
//! node affinity admits its pod's Node and that each Node's driver holds exactly the volumes of
//! the pods placed there.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use csi_testbed::nodes::create_schedulable_node;
use csi_testbed::{ControlPlane, StartOptions};
use k8s_openapi::api::core::v1::{
    Namespace, Node, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, PersistentVolume,
    VolumeNodeAffinity,
};
use k8s_openapi::api::storage::v1::{
    CSIDriver, CSIDriverSpec, CSINode, CSIStorageCapacity, StorageClass,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::Api;
use kube::runtime::watcher;
use kube::{Client, ResourceExt};

use super::api::{
    self, Binding, ClaimWatch, Cluster, DRIVER_NAME, NAMESPACE, WARMUP_NAMESPACE, lock,
};
use super::proc::{CpuWindow, Proc};
use super::report::{Curve, Results};
use super::scenarios::{
    Driver, Extra, IDLE_CPU_SHARE, IDLE_WINDOW, QUIET, fill_bound_pairs, prepare_cluster,
    request_rows, rss_points, spawn_sidecar, thin, wait_for,
};
use super::stats::{self, Impl, median};
use super::wffc::{
    PodWatch, affinity_terms, check_placement, create_claims, create_pods, csi_node, pod,
};
use super::{Bench, BenchError};

/// The drivers' topology key: its value is the Node's name (on the Node's labels, in each
/// driver's segment, in the capacity objects' selectors and the PVs' node affinity).
const NODE_KEY: &str = "topology.reference.csi.example.com/node";
const NODE_LOCAL_CLASS: &str = "csi-bench-node-local";
/// Where the sidecars publish their capacity objects (env `NAMESPACE`).
const CAPACITY_NAMESPACE: &str = "bench-capacity";
/// Each Node's driver: room for far more volumes than a run places on one Node.
const DRIVER_CAPACITY: &str = "1Ti";
/// What the driver gives a 1 GiB claim.
const VOLUME_BYTES: u64 = 1 << 30;
/// The flags of node mode, identical for both sidecars. The poll interval is long so that every
/// capacity update a run sees comes from a provision; no owner for the capacity objects (there
/// is no Pod to own them); leader election is off by default in both.
const NODE_MODE_FLAGS: [&str; 4] = [
    "--node-deployment",
    "--enable-capacity",
    "--capacity-poll-interval=10m",
    "--capacity-ownerref-level=-1",
];
/// After the last claim is Bound, how long every Node's capacity object may take to show all of
/// its Node's volumes.
const REFRESH_LIMIT: Duration = Duration::from_secs(120);

/// (j)'s counts.
#[derive(Clone, Copy, Debug)]
pub struct Counts {
    /// Nodes, and so drivers and sidecars.
    pub nodes: usize,
    /// Pods (one WaitForFirstConsumer claim each) created at once.
    pub pods: usize,
    /// Bound claims and PVs present before the sidecars start.
    pub objects: usize,
    /// The steady-state window.
    pub steady: Duration,
}

fn node_name(i: usize) -> String {
    format!("node-{:02}", i + 1)
}

/// (j): one run of `imp`.
pub async fn node_mode(
    b: &Bench,
    imp: Impl,
    round: u32,
    results: &mut Results,
) -> Result<(), BenchError> {
    let Counts {
        nodes: node_count,
        pods: n,
        objects,
        steady,
    } = b.sizes.node_mode;
    let tag = format!("(j) {imp} round {round}");
    let say = |m: String| b.say(format!("{tag}: {m}"));
    say("starting a control plane with kube-scheduler".into());
    let cp = ControlPlane::start_with(StartOptions {
        apiserver_flags: &[],
        scheduler: true,
        node: None,
    })
    .await
    .map_err(|e| BenchError::Step {
        step: "starting the control plane with kube-scheduler".into(),
        detail: e.to_string(),
    })?;
    let cluster = prepare_cluster(b, &cp).await?;
    let nodes: Vec<String> = (0..node_count).map(node_name).collect();
    create_node_topology(&cluster, &nodes).await?;
    fill_bound_pairs(b, &tag, &cluster, 0..objects, Binding::ByBinder, |i, pv| {
        pv_on_node(pv, &nodes[i % nodes.len()]);
    })
    .await?;
    let capacities = CapacityWatch::start(&cluster.client).await?;
    let volumes = NodeVolumeWatch::start(&cluster.client).await?;

    let name = format!("j-{imp}-r{round}");
    say(format!(
        "starting {node_count} drivers and {node_count} sidecars in node mode"
    ));
    let mut fleet = Fleet::start(b, imp, &cp, &name, &nodes).await?;
    let started = fleet.started;
    let limit = Duration::from_secs(300 + 10 * node_count as u64);
    wait_for(b, &tag, &mut fleet.procs(), limit, || {
        let k = capacities.nodes_published();
        Ok((
            k >= node_count,
            format!("{k}/{node_count} Nodes have a capacity object"),
        ))
    })
    .await?;
    let settled = fleet.settle(b, &tag, limit).await?;
    let start_cpu = fleet.cpu(b.ticks);
    say(format!(
        "every Node published its capacity; the sidecars idle after {settled:.1}s, CPU {start_cpu:.2}s"
    ));

    // Warm-up: one pod per Node, so every sidecar has provisioned once before the steady state.
    let warm_refresh = warm_up(b, &tag, &cluster, &mut fleet, &capacities, &volumes).await?;
    say(format!(
        "warm-up: one volume per Node; capacity objects followed after {} (median)",
        fmt_secs(median(&finite(&warm_refresh)))
    ));
    cluster.wait_quiet(QUIET, limit, say).await?;
    fleet.settle(b, &tag, limit).await?;

    // Steady state.
    say(format!("steady state: measuring for {}s", steady.as_secs()));
    let window_start = Instant::now();
    let cpu_before = fleet.cpu(b.ticks);
    tokio::time::sleep(steady).await;
    fleet.check_alive()?;
    let steady_cpu = fleet.cpu(b.ticks) - cpu_before;
    let steady_rss = median(
        &fleet
            .total_rss(started)
            .into_iter()
            .filter(|(t, _)| *t >= secs_since(started, window_start))
            .map(|(_, v)| v)
            .collect::<Vec<_>>(),
    )
    .unwrap_or(f64::NAN);
    say(format!(
        "steady: total RSS {steady_rss:.0} MiB, CPU {steady_cpu:.2}s over {}s",
        steady.as_secs()
    ));

    // The burst: `n` claims wait for their pods, then the pods are created at once.
    let claim_names = api::numbered("claim", n);
    let pod_names = api::numbered("pod", n);
    let claims = ClaimWatch::start(&cluster.client, NAMESPACE).await?;
    let pods = PodWatch::start(&cluster.client, NAMESPACE).await?;
    let bound_before = claims.bound_count();
    say(format!("creating {n} claims (they wait for a consumer)"));
    create_claims(&cluster, NAMESPACE, &claim_names, NODE_LOCAL_CLASS).await?;
    cluster.wait_quiet(QUIET, limit, say).await?;
    let before = cluster.snapshot().await?;
    let cpu_before = fleet.cpu(b.ticks);
    say(format!("creating {n} pods over {node_count} Nodes"));
    let t0 = Instant::now();
    create_pods(&cluster, NAMESPACE, &pod_names, &claim_names).await?;
    let burst_limit = Duration::from_secs_f64(180.0 + n as f64 * 0.5);
    wait_for(b, &tag, &mut fleet.procs(), burst_limit, || {
        let (k, s) = (
            claims.bound_count().saturating_sub(bound_before),
            pods.scheduled(),
        );
        Ok((
            k >= n && s >= n,
            format!("{k}/{n} claims Bound, {s}/{n} pods scheduled"),
        ))
    })
    .await?;
    let bound_at = claims.bound_after(t0);
    let bound_at = &bound_at[bound_at.len().saturating_sub(n)..];
    let to_bound = bound_at.last().copied().unwrap_or(f64::NAN);
    let to_scheduled = pods.scheduled_after(t0).last().copied().unwrap_or(f64::NAN);
    cluster.wait_quiet(QUIET, burst_limit, say).await?;
    let after = cluster.snapshot().await?;
    let burst_cpu = fleet.cpu(b.ticks) - cpu_before;
    let burst_end = Instant::now();
    let refresh = await_refresh(b, &tag, &mut fleet, &capacities, &volumes, t0).await?;
    let series = fleet.total_rss(started);
    let (from, to) = (secs_since(started, t0), secs_since(started, burst_end));
    let burst_rss = peak(series.iter().filter(|(t, _)| (from..=to).contains(t)));
    let peak_rss = peak(series.iter());
    let driver_volumes = fleet.driver_volumes()?;
    fleet.stop().await;

    let placements = pods.placements();
    check_placement(&cluster, &placements, NODE_KEY)
        .await
        .and_then(|()| check_drivers(&nodes, &placements, &driver_volumes))
        .map_err(|detail| BenchError::Step {
            step: format!("{tag}: where the volumes are"),
            detail,
        })?;

    let spread = Spread::of(&refresh);
    let imp_ = Some(imp);
    let mut record = |metric, value: Option<f64>| {
        if let Some(v) = value {
            results.sample(metric, imp_, round, v);
        }
    };
    record(stats::J_STEADY_RSS, Some(steady_rss));
    record(stats::J_BURST_RSS, Some(burst_rss));
    record(stats::J_PEAK_RSS, Some(peak_rss));
    record(stats::J_STEADY_CPU, Some(steady_cpu));
    record(stats::J_BURST_CPU, Some(burst_cpu));
    record(stats::J_START_CPU, Some(start_cpu));
    record(stats::J_BOUND, Some(to_bound));
    record(stats::J_SCHEDULED, Some(to_scheduled));
    record(stats::J_REFRESH_MEDIAN, spread.median);
    record(stats::J_REFRESH_MAX, spread.max);
    record(stats::J_REFRESH_MISSING, Some(spread.missing as f64));
    record(stats::J_REFRESH_FIRST, median(&finite(&warm_refresh)));
    results.requests.extend(request_rows(
        &after.since(&before),
        "j",
        imp,
        round,
        "provision",
        n,
    ));
    let mut points = vec![(0.0, 0.0)];
    points.extend(
        bound_at
            .iter()
            .enumerate()
            .map(|(i, t)| (*t, (i + 1) as f64)),
    );
    results.curves.push(Curve {
        name: "j_bound",
        imp,
        round,
        points: thin(points),
    });
    results.curves.push(Curve {
        name: "j_rss",
        imp,
        round,
        points: thin(series),
    });
    say(format!(
        "done: all claims Bound {to_bound:.1}s, pods scheduled \
         {to_scheduled:.1}s, CPU {burst_cpu:.2}s, total RSS peak {burst_rss:.0} MiB while \
         provisioning ({peak_rss:.0} MiB over the run); capacity followed a PV after {} \
         (median), {} at most, {} never",
        fmt_secs(spread.median),
        fmt_secs(spread.max),
        spread.missing
    ));
    Ok(())
}

/// The node-local WaitForFirstConsumer class, the CSIDriver that tells the scheduler to use
/// capacity objects, the capacity namespace, and one schedulable Node with its CSINode per name.
async fn create_node_topology(cluster: &Cluster, nodes: &[String]) -> Result<(), BenchError> {
    let meta = |name: &str| ObjectMeta {
        name: Some(name.to_owned()),
        ..ObjectMeta::default()
    };
    let client = &cluster.client;
    let class = StorageClass {
        metadata: meta(NODE_LOCAL_CLASS),
        provisioner: DRIVER_NAME.into(),
        reclaim_policy: Some("Delete".into()),
        volume_binding_mode: Some("WaitForFirstConsumer".into()),
        ..StorageClass::default()
    };
    cluster
        .create(&Api::<StorageClass>::all(client.clone()), &class)
        .await?;
    let driver = CSIDriver {
        metadata: meta(DRIVER_NAME),
        spec: CSIDriverSpec {
            attach_required: Some(false),
            storage_capacity: Some(true),
            ..CSIDriverSpec::default()
        },
    };
    cluster
        .create(&Api::<CSIDriver>::all(client.clone()), &driver)
        .await?;
    let namespace = Namespace {
        metadata: meta(CAPACITY_NAMESPACE),
        ..Namespace::default()
    };
    cluster
        .create(&Api::<Namespace>::all(client.clone()), &namespace)
        .await?;
    let node_api: Api<Node> = Api::all(client.clone());
    let csi_nodes: Api<CSINode> = Api::all(client.clone());
    for node in nodes {
        create_schedulable_node(&node_api, node, &[(NODE_KEY, node)])
            .await
            .map_err(|e| BenchError::Step {
                step: format!("creating Node {node}"),
                detail: e.to_string(),
            })?;
        cluster
            .create(&csi_nodes, &csi_node(node, NODE_KEY))
            .await?;
    }
    Ok(())
}

/// What a node-local driver's sidecar puts on the PVs it provisions: affinity to its Node.
fn pv_on_node(pv: &mut PersistentVolume, node: &str) {
    if let Some(spec) = pv.spec.as_mut() {
        spec.node_affinity = Some(VolumeNodeAffinity {
            required: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_expressions: Some(vec![NodeSelectorRequirement {
                        key: NODE_KEY.to_owned(),
                        operator: "In".to_owned(),
                        values: Some(vec![node.to_owned()]),
                    }]),
                    match_fields: None,
                }],
            }),
        });
    }
}

/// The Node a PV's affinity names under [`NODE_KEY`].
fn node_of(pv: &PersistentVolume) -> Option<String> {
    affinity_terms(pv)
        .into_iter()
        .flatten()
        .find(|r| r.key == NODE_KEY && r.operator == "In")
        .and_then(|r| r.values.and_then(|v| v.into_iter().next()))
}

/// One claim and one pod per Node, the pod pinned to it; returns, per Node, how long after its
/// PV appeared the Node's capacity object showed the volume.
async fn warm_up(
    b: &Bench,
    tag: &str,
    cluster: &Cluster,
    fleet: &mut Fleet,
    capacities: &CapacityWatch,
    volumes: &NodeVolumeWatch,
) -> Result<Vec<Option<f64>>, BenchError> {
    let claims = ClaimWatch::start(&cluster.client, WARMUP_NAMESPACE).await?;
    let pods = PodWatch::start(&cluster.client, WARMUP_NAMESPACE).await?;
    let names: Vec<String> = fleet.nodes.iter().map(|n| format!("warm-{n}")).collect();
    let t0 = Instant::now();
    create_claims(cluster, WARMUP_NAMESPACE, &names, NODE_LOCAL_CLASS).await?;
    let pod_api = Api::namespaced(cluster.client.clone(), WARMUP_NAMESPACE);
    for (name, node) in names.iter().zip(&fleet.nodes) {
        let mut pinned = pod(name, name);
        if let Some(spec) = pinned.spec.as_mut() {
            spec.node_selector = Some(BTreeMap::from([(
                "kubernetes.io/hostname".to_owned(),
                node.clone(),
            )]));
        }
        cluster.create(&pod_api, &pinned).await?;
    }
    let k = names.len();
    wait_for(b, tag, &mut fleet.procs(), Duration::from_secs(180), || {
        Ok((
            claims.bound_count() >= k && pods.scheduled() >= k,
            format!(
                "warm-up: {}/{k} claims Bound, {}/{k} pods scheduled",
                claims.bound_count(),
                pods.scheduled()
            ),
        ))
    })
    .await?;
    await_refresh(b, tag, fleet, capacities, volumes, t0).await
}

/// Waits until every Node's capacity object shows all of the Node's volumes (or
/// [`REFRESH_LIMIT`] passes: those not shown by then count as missing); returns the refresh
/// delay of each PV that appeared after `t0`.
async fn await_refresh(
    b: &Bench,
    tag: &str,
    fleet: &mut Fleet,
    capacities: &CapacityWatch,
    volumes: &NodeVolumeWatch,
    t0: Instant,
) -> Result<Vec<Option<f64>>, BenchError> {
    let created = volumes.appeared_since(t0);
    let began = Instant::now();
    let mut last_report = Instant::now();
    loop {
        let delays = refresh_delays(&created, &capacities.values_since(t0), VOLUME_BYTES);
        let missing = delays.iter().filter(|d| d.is_none()).count();
        if missing == 0 || began.elapsed() > REFRESH_LIMIT {
            if missing > 0 {
                b.say(format!(
                    "{tag}: {missing} of {} PVs not shown by their Node's capacity object \
                     {}s after the last one",
                    created.len(),
                    REFRESH_LIMIT.as_secs()
                ));
            }
            return Ok(delays);
        }
        fleet.check_alive()?;
        if last_report.elapsed() >= Duration::from_secs(5) {
            b.say(format!(
                "{tag}: {missing} of {} PVs not yet shown by their Node's capacity object ({:.0}s)",
                created.len(),
                began.elapsed().as_secs_f64()
            ));
            last_report = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Pure: for each PV created at `t` on node `x` (seconds since some origin), how long until
/// `x`'s capacity object showed it: the first value after the origin that is at most the node's
/// value at the origin minus one `volume` for this PV and each earlier PV of the node, taken
/// at the later of its time and `t` (a sidecar may refresh before it has saved the PV: that
/// counts as 0). `None` when no such value was seen, or the node has no value at or before the
/// origin (0.0) to start from. `updates` are per node and in time order; the result is in the
/// order of `created`.
///
/// By the time a PV is created its volume exists in the driver, and so do the volumes of the
/// node's earlier PVs: a capacity read after that shows them all. A value read before the
/// volumes existed shows too much capacity and is skipped.
pub fn refresh_delays(
    created: &[(f64, String)],
    updates: &BTreeMap<String, Vec<(f64, u64)>>,
    volume: u64,
) -> Vec<Option<f64>> {
    let mut order: Vec<usize> = (0..created.len()).collect();
    order.sort_by(|&a, &b| created[a].0.total_cmp(&created[b].0));
    let mut seen: HashMap<&str, u64> = HashMap::new();
    let mut delays = vec![None; created.len()];
    for i in order {
        let (t, node) = (&created[i].0, created[i].1.as_str());
        let k = seen.entry(node).or_default();
        *k += 1;
        let Some(series) = updates.get(node) else {
            continue;
        };
        let Some(start) = series
            .iter()
            .rev()
            .find(|(u, _)| *u <= 0.0)
            .map(|(_, v)| *v)
        else {
            continue;
        };
        let want = start.saturating_sub(*k * volume);
        delays[i] = series
            .iter()
            .find(|(u, v)| *u > 0.0 && *v <= want)
            .map(|(u, _)| (u - t).max(0.0));
    }
    delays
}

/// Median and maximum of refresh delays, a missing one counting as longer than any.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spread {
    /// `None` when more than half are missing (or there are none).
    pub median: Option<f64>,
    /// `None` when any is missing.
    pub max: Option<f64>,
    pub missing: usize,
}

impl Spread {
    pub fn of(delays: &[Option<f64>]) -> Spread {
        let missing = delays.iter().filter(|d| d.is_none()).count();
        let mut all: Vec<f64> = delays.iter().map(|d| d.unwrap_or(f64::INFINITY)).collect();
        all.sort_by(f64::total_cmp);
        let finite = |v: f64| v.is_finite().then_some(v);
        let median = match all.len() {
            0 => None,
            len if len % 2 == 1 => finite(all[len / 2]),
            len => finite((all[len / 2 - 1] + all[len / 2]) / 2.0),
        };
        Spread {
            median,
            max: all.last().copied().and_then(finite),
            missing,
        }
    }
}

fn finite(delays: &[Option<f64>]) -> Vec<f64> {
    delays.iter().flatten().copied().collect()
}

fn fmt_secs(v: Option<f64>) -> String {
    v.map_or_else(|| "–".to_owned(), |v| format!("{v:.2}s"))
}

fn peak<'a>(points: impl Iterator<Item = &'a (f64, f64)>) -> f64 {
    points.map(|(_, v)| *v).fold(f64::NAN, f64::max)
}

/// Seconds from `origin` to `t` (negative before it).
fn secs_since(origin: Instant, t: Instant) -> f64 {
    match t.checked_duration_since(origin) {
        Some(d) => d.as_secs_f64(),
        None => -origin.duration_since(t).as_secs_f64(),
    }
}

/// Pure: the sum of several processes' sampled values over time. At every moment any process
/// was sampled, each process counts with its latest sample at or before then (0 before its
/// first). Each series is in time order.
pub fn summed(series: &[Vec<(f64, f64)>]) -> Vec<(f64, f64)> {
    let mut times: Vec<f64> = series.iter().flatten().map(|(t, _)| *t).collect();
    times.sort_by(f64::total_cmp);
    times.dedup();
    let mut next = vec![0_usize; series.len()];
    times
        .into_iter()
        .map(|t| {
            let total = series
                .iter()
                .zip(next.iter_mut())
                .map(|(s, i)| {
                    while *i < s.len() && s[*i].0 <= t {
                        *i += 1;
                    }
                    if *i == 0 { 0.0 } else { s[*i - 1].1 }
                })
                .sum();
            (t, total)
        })
        .collect()
}

/// Pure: bytes of a Kubernetes quantity as the sidecars write a capacity (`1Ti`, `1023Gi`,
/// `1099511627776`, also decimal suffixes and exponents); `None` for anything else.
pub fn parse_quantity(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let factor = match suffix {
        "" => 1.0,
        "Ki" => 2f64.powi(10),
        "Mi" => 2f64.powi(20),
        "Gi" => 2f64.powi(30),
        "Ti" => 2f64.powi(40),
        "Pi" => 2f64.powi(50),
        "Ei" => 2f64.powi(60),
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        exponent => {
            let digits = exponent
                .strip_prefix('e')
                .or_else(|| exponent.strip_prefix('E'))?;
            10f64.powi(digits.parse().ok()?)
        }
    };
    let bytes = (number * factor).round();
    (bytes.is_finite() && bytes >= 0.0 && bytes < u64::MAX as f64).then_some(bytes as u64)
}

/// The drivers and sidecars of a run, one pair per Node.
struct Fleet {
    nodes: Vec<String>,
    drivers: Vec<Driver>,
    sidecars: Vec<Proc>,
    started: Instant,
}

impl Fleet {
    async fn start(
        b: &Bench,
        imp: Impl,
        cp: &ControlPlane,
        name: &str,
        nodes: &[String],
    ) -> Result<Fleet, BenchError> {
        let mut drivers = Vec::new();
        for node in nodes {
            let flags = [
                format!("--node-id={node}"),
                format!("--topology={NODE_KEY}={node}"),
                format!("--capacity={DRIVER_CAPACITY}"),
            ];
            drivers.push(Driver::start_with(b, &format!("{name}-{node}"), &flags).await?);
        }
        let flags: Vec<String> = NODE_MODE_FLAGS.iter().map(|f| (*f).to_owned()).collect();
        let started = Instant::now();
        let mut sidecars = Vec::new();
        for (node, driver) in nodes.iter().zip(&drivers) {
            let env = [
                ("NODE_NAME", node.as_str()),
                ("NAMESPACE", CAPACITY_NAMESPACE),
            ];
            let extra = Extra {
                flags: &flags,
                env: &env,
                hostname: None,
            };
            sidecars.push(spawn_sidecar(
                b,
                imp,
                driver,
                cp,
                &extra,
                &format!("{name}-{node}"),
            )?);
        }
        Ok(Fleet {
            nodes: nodes.to_vec(),
            drivers,
            sidecars,
            started,
        })
    }

    /// Every process, for [`wait_for`] to check.
    fn procs(&mut self) -> Vec<&mut Proc> {
        self.sidecars
            .iter_mut()
            .chain(self.drivers.iter_mut().map(|d| &mut d.proc))
            .collect()
    }

    fn check_alive(&mut self) -> Result<(), BenchError> {
        self.procs().into_iter().try_for_each(Proc::check_alive)
    }

    /// CPU seconds of all sidecars so far.
    fn cpu(&self, ticks: f64) -> f64 {
        self.sidecars.iter().map(|s| s.now(ticks).cpu_secs).sum()
    }

    /// The sidecars' summed RSS (MiB) over time, seconds since `origin`.
    fn total_rss(&self, origin: Instant) -> Vec<(f64, f64)> {
        let series: Vec<Vec<(f64, f64)>> = self
            .sidecars
            .iter()
            .map(|s| rss_points(s, origin))
            .collect();
        summed(&series)
    }

    /// Waits until every sidecar has used less than [`IDLE_CPU_SHARE`] of a core over
    /// [`IDLE_WINDOW`] (at most `limit`); returns the seconds since they started.
    async fn settle(&mut self, b: &Bench, tag: &str, limit: Duration) -> Result<f64, BenchError> {
        let began = Instant::now();
        let mut windows: Vec<CpuWindow> = self
            .sidecars
            .iter()
            .map(|_| CpuWindow::new(IDLE_WINDOW))
            .collect();
        let mut last_report = Instant::now();
        loop {
            tokio::time::sleep(Duration::from_millis(250)).await;
            self.check_alive()?;
            let now = Instant::now();
            let busy = windows
                .iter_mut()
                .zip(&self.sidecars)
                .map(|(w, s)| w.push(now, s.now(b.ticks).cpu_secs))
                .filter(|share| *share >= IDLE_CPU_SHARE)
                .count();
            if busy == 0 {
                return Ok(self.started.elapsed().as_secs_f64());
            }
            if began.elapsed() > limit {
                b.say(format!(
                    "{tag}: {busy} sidecar(s) still busy after {}s; measuring anyway",
                    limit.as_secs()
                ));
                return Ok(self.started.elapsed().as_secs_f64());
            }
            if last_report.elapsed() >= Duration::from_secs(5) {
                b.say(format!(
                    "{tag}: {busy}/{} sidecars busy, total RSS {:.0} MiB ({:.0}s)",
                    self.sidecars.len(),
                    self.sidecars
                        .iter()
                        .map(|s| s.now(b.ticks).rss_mib())
                        .sum::<f64>(),
                    began.elapsed().as_secs_f64()
                ));
                last_report = Instant::now();
            }
        }
    }

    /// Volumes each Node's driver holds.
    fn driver_volumes(&self) -> Result<BTreeMap<String, usize>, BenchError> {
        self.nodes
            .iter()
            .zip(&self.drivers)
            .map(|(node, d)| Ok((node.clone(), d.volumes()?)))
            .collect()
    }

    async fn stop(self) {
        for sidecar in self.sidecars {
            sidecar.stop().await;
        }
        for driver in self.drivers {
            driver.stop().await;
        }
    }
}

/// Each Node's driver holds one volume for the warm-up and one per burst pod placed on it:
/// every claim was provisioned by the sidecar of its pod's Node, once.
fn check_drivers(
    nodes: &[String],
    placements: &HashMap<String, String>,
    held: &BTreeMap<String, usize>,
) -> Result<(), String> {
    let wrong: Vec<String> = nodes
        .iter()
        .filter_map(|node| {
            let want = 1 + placements.values().filter(|p| *p == node).count();
            let got = held.get(node).copied().unwrap_or(0);
            (got != want).then(|| format!("{node}: driver holds {got} volumes, expected {want}"))
        })
        .collect();
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(wrong.join("; "))
    }
}

/// Node → every capacity value seen for it, with the time it was seen.
type CapacityValues = BTreeMap<String, Vec<(Instant, u64)>>;

/// Each Node's capacity for the node-local class, with the time of every value seen.
struct CapacityWatch {
    values: Arc<Mutex<CapacityValues>>,
    task: tokio::task::JoinHandle<()>,
}

impl CapacityWatch {
    async fn start(client: &Client) -> Result<CapacityWatch, BenchError> {
        let values: Arc<Mutex<CapacityValues>> = Arc::default();
        let sink = Arc::clone(&values);
        let api: Api<CSIStorageCapacity> = Api::namespaced(client.clone(), CAPACITY_NAMESPACE);
        let task = api::watch_applied(
            api,
            watcher::Config::default(),
            "capacity objects",
            move |c: CSIStorageCapacity| {
                if c.storage_class_name != NODE_LOCAL_CLASS {
                    return;
                }
                let node = c
                    .node_topology
                    .as_ref()
                    .and_then(|s| s.match_labels.as_ref())
                    .and_then(|l| l.get(NODE_KEY).cloned());
                let bytes = c.capacity.as_ref().and_then(|q| parse_quantity(&q.0));
                match (node, bytes) {
                    (Some(node), Some(bytes)) => {
                        lock(&sink)
                            .entry(node)
                            .or_default()
                            .push((Instant::now(), bytes));
                    }
                    _ => eprintln!(
                        "[bench] capacity object {} names no Node under {NODE_KEY} or no readable \
                     capacity ({:?}); not counted",
                        c.name_any(),
                        c.capacity
                    ),
                }
            },
        )
        .await?;
        Ok(CapacityWatch { values, task })
    }

    fn nodes_published(&self) -> usize {
        lock(&self.values).len()
    }

    /// Per Node, every value with its time in seconds since `origin` (negative before it).
    fn values_since(&self, origin: Instant) -> BTreeMap<String, Vec<(f64, u64)>> {
        lock(&self.values)
            .iter()
            .map(|(node, values)| {
                let values = values
                    .iter()
                    .map(|(t, v)| (secs_since(origin, *t), *v))
                    .collect();
                (node.clone(), values)
            })
            .collect()
    }
}

impl Drop for CapacityWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// When each PV of the node-local class appeared, and on which Node.
struct NodeVolumeWatch {
    appeared: Arc<Mutex<HashMap<String, (Instant, String)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl NodeVolumeWatch {
    async fn start(client: &Client) -> Result<NodeVolumeWatch, BenchError> {
        let appeared: Arc<Mutex<HashMap<String, (Instant, String)>>> = Arc::default();
        let sink = Arc::clone(&appeared);
        let api: Api<PersistentVolume> = Api::all(client.clone());
        let task = api::watch_applied(
            api,
            watcher::Config::default(),
            "node-local PVs",
            move |pv: PersistentVolume| {
                let class = pv
                    .spec
                    .as_ref()
                    .and_then(|s| s.storage_class_name.as_deref());
                if class != Some(NODE_LOCAL_CLASS) {
                    return;
                }
                if let Some(node) = node_of(&pv) {
                    lock(&sink)
                        .entry(pv.name_any())
                        .or_insert_with(|| (Instant::now(), node));
                }
            },
        )
        .await?;
        Ok(NodeVolumeWatch { appeared, task })
    }

    /// PVs that appeared at or after `origin`: (seconds since it, Node).
    fn appeared_since(&self, origin: Instant) -> Vec<(f64, String)> {
        lock(&self.appeared)
            .values()
            .filter(|(t, _)| *t >= origin)
            .map(|(t, node)| (secs_since(origin, *t), node.clone()))
            .collect()
    }
}

impl Drop for NodeVolumeWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GI: u64 = 1 << 30;

    fn updates(per_node: &[(&str, &[(f64, u64)])]) -> BTreeMap<String, Vec<(f64, u64)>> {
        per_node
            .iter()
            .map(|(node, values)| ((*node).to_owned(), values.to_vec()))
            .collect()
    }

    #[test]
    fn quantities_as_sidecars_write_them() {
        assert_eq!(parse_quantity("1Ti"), Some(1 << 40));
        assert_eq!(parse_quantity("1023Gi"), Some(1023 * GI));
        assert_eq!(parse_quantity("1099511627776"), Some(1 << 40));
        assert_eq!(parse_quantity("1.5Gi"), Some(3 * GI / 2));
        assert_eq!(parse_quantity("2G"), Some(2_000_000_000));
        assert_eq!(parse_quantity("5e3"), Some(5000));
        assert_eq!(parse_quantity("0"), Some(0));
        assert_eq!(parse_quantity("1Xi"), None);
        assert_eq!(parse_quantity(""), None);
        assert_eq!(parse_quantity("-1Gi"), None);
    }

    #[test]
    fn a_refresh_is_the_first_update_showing_this_and_earlier_volumes() {
        let created = vec![
            (1.0, "a".to_owned()),
            (2.0, "a".to_owned()),
            (1.5, "b".to_owned()),
        ];
        let u = updates(&[
            // Before the origin: 10 GiB; at 1.2 s a value read before the second PV (9 GiB),
            // at 2.0 s a stale value (still 9), at 3.5 s both shown.
            (
                "a",
                &[(-5.0, 10 * GI), (1.2, 9 * GI), (2.0, 9 * GI), (3.5, 8 * GI)],
            ),
            ("b", &[(-1.0, 4 * GI), (1.4, 4 * GI), (1.9, 3 * GI)]),
        ]);
        let d = refresh_delays(&created, &u, GI);
        let close = |got: Option<f64>, want: f64| got.is_some_and(|g| (g - want).abs() < 1e-9);
        assert!(close(d[0], 0.2), "{d:?}");
        assert!(close(d[1], 1.5), "{d:?}");
        // The update at 1.4 s predates the PV and shows nothing yet.
        assert!(close(d[2], 0.4), "{d:?}");
    }

    #[test]
    fn a_refresh_never_seen_or_without_a_start_value_is_missing() {
        let created = vec![
            (1.0, "a".to_owned()),
            (1.0, "b".to_owned()),
            (1.0, "c".to_owned()),
        ];
        let u = updates(&[
            ("a", &[(-1.0, 10 * GI), (2.0, 10 * GI)]),
            ("b", &[(0.5, 10 * GI), (2.0, 9 * GI)]),
        ]);
        assert_eq!(refresh_delays(&created, &u, GI), vec![None, None, None]);
    }

    #[test]
    fn a_volume_shown_before_its_pv_appeared_counts_as_refreshed_at_once() {
        // The driver created the volume, the capacity object showed it, then the PV appeared
        // (upstream refreshes when CreateVolume returns, before the PV is saved).
        let created = vec![(3.0, "a".to_owned()), (3.5, "a".to_owned())];
        let u = updates(&[("a", &[(0.0, 10 * GI), (2.0, 9 * GI), (4.5, 8 * GI)])]);
        let d = refresh_delays(&created, &u, GI);
        assert_eq!(d, vec![Some(0.0), Some(1.0)]);
    }

    #[test]
    fn spread_counts_missing_delays_as_longest() {
        let s = Spread::of(&[Some(1.0), Some(3.0), None]);
        assert_eq!(
            s,
            Spread {
                median: Some(3.0),
                max: None,
                missing: 1
            }
        );
        let s = Spread::of(&[Some(4.0), Some(1.0), Some(2.0), Some(3.0)]);
        assert_eq!((s.median, s.max, s.missing), (Some(2.5), Some(4.0), 0));
        assert_eq!(Spread::of(&[None, None, Some(1.0)]).median, None);
        assert_eq!(Spread::of(&[]).median, None);
    }

    #[test]
    fn summed_series_add_the_latest_sample_of_each_process() {
        let a = vec![(0.0, 10.0), (1.0, 12.0), (2.0, 11.0)];
        let b = vec![(0.5, 5.0), (2.0, 6.0)];
        assert_eq!(
            summed(&[a, b]),
            vec![(0.0, 10.0), (0.5, 15.0), (1.0, 17.0), (2.0, 17.0)]
        );
        assert_eq!(summed(&[]), vec![]);
    }

    #[test]
    fn pre_made_volumes_carry_their_nodes_affinity() {
        let mut pv = api::volume("pv-1", Some("idle-00001"), true);
        pv_on_node(&mut pv, "node-07");
        assert_eq!(node_of(&pv).as_deref(), Some("node-07"));
        assert_eq!(node_of(&api::volume("pv-2", None, false)), None);
    }

    #[test]
    fn drivers_hold_the_warm_up_volume_and_their_pods_volumes() {
        let nodes = vec!["n1".to_owned(), "n2".to_owned()];
        let placements = HashMap::from([
            ("p1".to_owned(), "n1".to_owned()),
            ("p2".to_owned(), "n1".to_owned()),
        ]);
        let right = BTreeMap::from([("n1".to_owned(), 3), ("n2".to_owned(), 1)]);
        assert_eq!(check_drivers(&nodes, &placements, &right), Ok(()));
        let wrong = BTreeMap::from([("n1".to_owned(), 2), ("n2".to_owned(), 2)]);
        let err = check_drivers(&nodes, &placements, &wrong).expect_err("mismatch");
        assert!(err.contains("n1") && err.contains("n2"), "{err}");
    }
}
