//! The simulated cluster: the API server, the drivers, the sidecar processes (each with its
//! real `Context`, reconcilers, journal and caches), the outside actors (binder, scheduler,
//! users, admins) and the seeded scheduler that picks one step at a time.
//!
//! A step is one of: let one waiting call through (an API request or a driver call of an
//! actor in flight), start a reconcile of a claim or a PV, a reap of one idle operation or a
//! snapshot sweep on one process, relist one cache of one process, advance the virtual clock,
//! run the binder or the scheduler, an outside edit, a crash or a restart. After each step the
//! tasks run until nothing moves, then the invariants are checked.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::future::{BoxFuture, Shared};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Client;
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::watcher;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::apiserver::{ApiServer, ProcessService, text};
use super::driver::{Driver, Faults, INVALID_PARAMETER, ProcessDriver};
use super::findings::{Hole, classify};
use super::gate::{ACTOR, Gate, ProcId};
use super::invariants::{self, Violation};
use super::rng::Rng;
use super::trace::Trace;
use crate::controller::cluster_views::topology_cache::TopologyView;
use crate::controller::deletion::volumes::VolumeReconciler;
use crate::controller::provisioning::claims::ClaimReconciler;
use crate::controller::runtime::cache::{self, CachedClaim, CachedVolume};
use crate::controller::runtime::events::EventRecorder;
use crate::controller::shared::context::{
    Context, FencedDriver, NodeDeployment, Settings, Stores, TopologyFlags,
};
use crate::controller::{provisioning::orphans, source_protection::snapshot_sweeper};
use crate::fence::LeaseFence;
use crate::journal::{Journal, JournalScope};
use crate::kube_client::RateLimitLayer;
use crate::provision::fixtures::{caps, config};
use crate::provision::{DriverCapabilities, ProvisionerConfig, SingleNode};

pub const NAMESPACE: &str = "apps";
pub const JOURNAL_NAMESPACE: &str = "csi";
pub const JOURNAL_BASE: &str = "journal";
pub const HOSTPATH: &str = "hostpath.csi.k8s.io";
/// A driver an in-tree plugin is migrated to (CSIMigration), for the in-tree PV.
pub const AZURE_FILE: &str = "file.csi.azure.com";
pub const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
pub const STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
pub const NODE_KEY: &str = "topology.sim/node";
const CLASS: &str = "standard";
const SNAPSHOT: &str = "snap";

/// What a run enables: the deployment, the faults and the outside edits.
#[derive(Clone, Debug)]
pub struct Profile {
    pub name: &'static str,
    /// Node mode on these nodes; central mode when empty.
    pub nodes: &'static [&'static str],
    pub driver: &'static str,
    pub faults: Faults,
    /// Weights (per step) of the faults and edits.
    pub crash: u32,
    pub moves: u32,
    pub claim_deletes: u32,
    pub claim_creates: u32,
    pub class_recreates: u32,
    pub snapshot_deletes: u32,
    /// Claims at the start.
    pub claims: usize,
    /// The claims restore from one snapshot.
    pub restores: bool,
    /// The class starts refusing (`sim/invalid`) and an admin fixes it later.
    pub bad_class: bool,
    /// An in-tree Azure File PV whose source cannot be translated sits in the cluster.
    pub in_tree_pv: bool,
    /// The class names a provisioner secret (read before each CreateVolume and replay).
    pub secrets: bool,
    /// Per-mille chance that a call is slow (waits 3 to 32 steps before it may go through).
    pub slow_calls: u32,
    /// The weight of a reap step (the reaper's scan taking one idle operation).
    pub reaps: u32,
    /// `--provisioning-consistency` by default: claims carry the consistency finalizer.
    pub consistency: bool,
    /// Central mode with leader election: the weight of a leader pause (a second replica
    /// takes over after the lease expires; the paused one resumes deposed, then exits).
    pub pause: u32,
    pub steps: usize,
}

impl Profile {
    fn node_mode(&self) -> bool {
        !self.nodes.is_empty()
    }
}

/// A violated invariant, with the seed's trace.
#[derive(Debug)]
pub struct Failure {
    pub seed: u64,
    pub profile: &'static str,
    pub kind: invariants::Kind,
    /// Which known hole it shows.
    pub hole: Hole,
    pub violation: String,
    pub trace: String,
    pub step: usize,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "{}", self.trace)?;
        writeln!(
            f,
            "seed {} (profile {}) violated {:?} (hole {:?}) at step {}: {}",
            self.seed, self.profile, self.kind, self.hole, self.step, self.violation
        )?;
        write!(
            f,
            "replay: hack/simulate.sh --profile {} --seed {}",
            self.profile, self.seed
        )
    }
}

struct StoreWriters {
    claims: Writer<CachedClaim>,
    volumes: Writer<CachedVolume>,
    classes: Writer<StorageClass>,
}

/// One incarnation of a sidecar process.
struct Process {
    name: String,
    /// The node in node mode, else "central".
    slot: String,
    alive: bool,
    ctx: Option<Arc<Context>>,
    claims: Option<Arc<ClaimReconciler>>,
    volumes: Option<Arc<VolumeReconciler>>,
    writers: Option<StoreWriters>,
    claims_listed: Option<Shared<BoxFuture<'static, bool>>>,
    /// Actors in flight, by what they do.
    tasks: BTreeMap<String, JoinHandle<()>>,
    /// With leader election: where the leader's renewals go (its `LeaseFence` reads them).
    lease: Option<watch::Sender<Option<Instant>>>,
    /// Paused (SIGSTOP) since then: nothing of it runs, its lease is not renewed.
    paused_at: Option<Instant>,
    /// Resumed after another replica took over: it no longer renews and exits soon.
    deposed: bool,
    /// Stopped gracefully (not a crash).
    stopped: bool,
    /// The records durable when it started (its journal recovered them).
    loaded: BTreeSet<String>,
}

/// The leader election's timing: a renewal proves leadership for the renew deadline; another
/// replica takes over a lease not renewed for the lease duration.
const RENEW_DEADLINE: Duration = Duration::from_secs(10);
const LEASE_DURATION: Duration = Duration::from_secs(15);

pub struct World {
    pub seed: u64,
    pub profile: Profile,
    rng: Rng,
    pub server: ApiServer,
    pub gate: Gate,
    pub trace: Trace,
    /// By slot ("central" or the node).
    pub drivers: BTreeMap<String, Arc<Driver>>,
    procs: Vec<Process>,
    incarnations: BTreeMap<String, usize>,
    next_claim: usize,
    /// The step from which each waiting call may be let through: a slow call (a loaded API
    /// server, a busy driver) waits some steps, which widens the windows between calls.
    ready_at: BTreeMap<u64, usize>,
    step: usize,
}

/// The kinds of steps, in the order of their weights.
#[derive(Clone, Copy, Debug)]
enum StepKind {
    Release,
    ReconcileClaim,
    ReconcileVolume,
    Reap,
    Sweep,
    Sync,
    TickSmall,
    TickLarge,
    Binder,
    Scheduler,
    Move,
    DeleteClaim,
    CreateClaim,
    RecreateClass,
    DeleteSnapshot,
    Crash,
    Restart,
    Pause,
    Resume,
    Exit,
}

impl World {
    pub async fn new(seed: u64, profile: Profile) -> World {
        let mut rng = Rng::new(seed);
        let server = ApiServer::default();
        let mut drivers = BTreeMap::new();
        let slots: Vec<String> = if profile.node_mode() {
            profile.nodes.iter().map(|n| (*n).to_owned()).collect()
        } else {
            vec!["central".to_owned()]
        };
        for slot in &slots {
            let (node, segment) = if profile.node_mode() {
                (
                    Some(slot.clone()),
                    BTreeMap::from([(NODE_KEY.to_owned(), slot.clone())]),
                )
            } else {
                (None, BTreeMap::new())
            };
            let driver = Driver::new(node, segment, profile.faults, rng.fork());
            drivers.insert(slot.clone(), Arc::new(driver));
        }
        let mut world = World {
            seed,
            profile,
            rng,
            server,
            gate: Gate::default(),
            trace: Trace::default(),
            drivers,
            procs: Vec::new(),
            incarnations: BTreeMap::new(),
            next_claim: 0,
            ready_at: BTreeMap::new(),
            step: 0,
        };
        world.seed_objects();
        for slot in slots {
            world.start_process(&slot).await;
        }
        world
    }

    fn driver_name(&self) -> &'static str {
        self.profile.driver
    }

    fn seed_objects(&mut self) {
        let params = if self.profile.bad_class {
            json!({"type": "fast", INVALID_PARAMETER: "true"})
        } else {
            json!({"type": "fast"})
        };
        self.create_class(params);
        if self.profile.secrets {
            self.server
                .create(
                    "secrets",
                    json!({
                        "apiVersion": "v1", "kind": "Secret",
                        "metadata": {"name": "creds", "namespace": NAMESPACE},
                        "data": {"password": "czNjcmV0"},
                    }),
                )
                .expect("secret");
        }
        if self.profile.restores {
            let snapshot = self
                .server
                .create(
                    "volumesnapshots",
                    json!({
                        "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
                        "metadata": {"name": SNAPSHOT, "namespace": NAMESPACE},
                        "spec": {"source": {"persistentVolumeClaimName": "origin"}},
                        "status": {"boundVolumeSnapshotContentName": "content-1", "readyToUse": true, "restoreSize": "1Gi"},
                    }),
                )
                .expect("snapshot");
            self.server
                .create(
                    "volumesnapshotcontents",
                    json!({
                        "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
                        "metadata": {"name": "content-1"},
                        "spec": {
                            "driver": self.driver_name(), "deletionPolicy": "Delete",
                            "source": {"snapshotHandle": "snap-handle-1"},
                            "sourceVolumeMode": "Filesystem",
                            "volumeSnapshotRef": {"name": SNAPSHOT, "namespace": NAMESPACE, "uid": snapshot["metadata"]["uid"]},
                        },
                        "status": {"snapshotHandle": "snap-handle-1", "readyToUse": true, "restoreSize": 1_073_741_824_i64},
                    }),
                )
                .expect("content");
            for driver in self.drivers.values() {
                driver.lock().snapshots.insert("snap-handle-1".to_owned());
            }
        }
        if self.profile.in_tree_pv {
            self.server
                .create(
                    "persistentvolumes",
                    json!({
                        "apiVersion": "v1", "kind": "PersistentVolume",
                        "metadata": {"name": "legacy-share", "annotations": {"pv.kubernetes.io/provisioned-by": "kubernetes.io/azure-file"}},
                        "spec": {
                            "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"],
                            "azureFile": {"shareName": "share", "secretName": "azure-secret"},
                            "persistentVolumeReclaimPolicy": "Retain",
                            "storageClassName": "legacy",
                        },
                        "status": {"phase": "Available"},
                    }),
                )
                .expect("in-tree PV");
        }
        for _ in 0..self.profile.claims {
            self.create_claim();
        }
    }

    fn create_class(&mut self, mut parameters: Value) {
        if self.profile.secrets {
            parameters["csi.storage.k8s.io/provisioner-secret-name"] = json!("creds");
            parameters["csi.storage.k8s.io/provisioner-secret-namespace"] = json!(NAMESPACE);
        }
        let mode = if self.profile.node_mode() {
            "WaitForFirstConsumer"
        } else {
            "Immediate"
        };
        self.server
            .create(
                "storageclasses",
                json!({
                    "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                    "metadata": {"name": CLASS},
                    "provisioner": self.driver_name(),
                    "parameters": parameters,
                    "reclaimPolicy": "Delete",
                    "volumeBindingMode": mode,
                }),
            )
            .expect("class");
    }

    fn create_claim(&mut self) -> String {
        self.next_claim += 1;
        let name = format!("c{}", self.next_claim);
        let mut claim = json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": NAMESPACE, "annotations": {STORAGE_PROVISIONER: self.driver_name()}},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
                "storageClassName": CLASS,
                "volumeMode": "Filesystem",
            },
            "status": {"phase": "Pending"},
        });
        if self.profile.restores {
            let source = json!({"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": SNAPSHOT});
            claim["spec"]["dataSource"] = source.clone();
            claim["spec"]["dataSourceRef"] = source;
        }
        self.server
            .create("persistentvolumeclaims", claim)
            .expect("claim");
        name
    }

    fn slots(&self) -> Vec<String> {
        self.drivers.keys().cloned().collect()
    }

    /// Starts a new process on `slot`, built from the API server's state only.
    async fn start_process(&mut self, slot: &str) {
        let id: ProcId = self.procs.len();
        let incarnation = self.incarnations.entry(slot.to_owned()).or_insert(0);
        *incarnation += 1;
        let name = format!("{slot}#{incarnation}");
        self.trace.name(id, &name);
        let service = ProcessService {
            server: self.server.clone(),
            gate: self.gate.clone(),
            proc: id,
            trace: self.trace.clone(),
        };
        let client = Client::new(service, "default");
        let driver = Arc::new(ProcessDriver {
            driver: Arc::clone(&self.drivers[slot]),
            gate: self.gate.clone(),
            proc: id,
            trace: self.trace.clone(),
            server: self.server.clone(),
        });
        let node = self.profile.node_mode().then(|| NodeDeployment {
            name: slot.to_owned(),
            segment: BTreeMap::from([(NODE_KEY.to_owned(), slot.to_owned())]),
            immediate_binding: false,
            base_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(2),
        });
        let driver_name = self.driver_name();
        let identity = match &node {
            Some(node) => format!("1700000000000-42-{driver_name}-{}", node.name),
            None => format!("1700000000000-42-{driver_name}"),
        };
        let scope = JournalScope::new(JOURNAL_BASE, node.as_ref().map(|n| n.name.as_str()));
        let settings = Settings {
            config: ProvisionerConfig {
                driver_name: driver_name.to_owned(),
                identity,
                ..config()
            },
            caps: DriverCapabilities {
                topology: node.is_some(),
                ..caps()
            },
            retry_interval_start: Duration::from_secs(1),
            retry_interval_max: Duration::from_secs(300),
            worker_threads: 4,
            max_concurrent_per_class: 0,
            adaptive_call_rate: false,
            audit_volumes_interval: Duration::ZERO,
            audit_delete_after: None,
            cloning_protection_threads: 1,
            snapshot_orphan_sweep_interval: Duration::from_secs(300),
            event_component: "csi-provisioner".to_owned(),
            hostname: name.clone(),
            consistency_by_default: self.profile.consistency,
            journal_namespace: JOURNAL_NAMESPACE.to_owned(),
            journal_scope: scope.clone(),
            journal_timeout: Duration::from_secs(10),
            draining: false,
            topology: TopologyFlags {
                strict: false,
                immediate: true,
            },
            node: node.clone(),
            capacity: None,
        };
        self.trace
            .note(&format!("{name} starts: loads its journal"));
        let loaded: BTreeSet<String> = invariants::durable_records(self)
            .into_iter()
            .map(|record| record.volume_name)
            .collect();
        let journal = Journal::load(
            client.clone(),
            RateLimitLayer::unlimited(),
            JOURNAL_NAMESPACE,
            &scope,
            driver_name,
            settings.journal_timeout,
        )
        .await
        .expect("the journal loads");
        let events = EventRecorder::new(
            client.clone(),
            settings.event_component.clone(),
            name.clone(),
            RateLimitLayer::unlimited(),
        );
        let (claims, claims_writer) = reflector::store();
        let (volumes, volumes_writer) = reflector::store();
        let (classes, classes_writer) = reflector::store();
        let topology = node.as_ref().map(|node| {
            TopologyView::Node(SingleNode {
                name: node.name.clone(),
                segment: node.segment.clone(),
            })
        });
        let stores = Stores {
            claims_listed: cache::listed(&claims),
            claims,
            volumes,
            classes,
            topology,
            grants: None,
            attachments: None,
        };
        let (lease, fence) = if self.profile.pause > 0 {
            let (renewals, renewed) = watch::channel(Some(Instant::now()));
            (Some(renewals), LeaseFence::new(renewed, RENEW_DEADLINE))
        } else {
            (None, LeaseFence::open())
        };
        let fenced = FencedDriver { csi: driver, fence };
        let ctx = Arc::new(Context::new(
            client,
            fenced,
            stores,
            events,
            Arc::new(crate::metrics::Metrics::new()),
            journal,
            settings,
        ));
        let mut writers = StoreWriters {
            claims: claims_writer,
            volumes: volumes_writer,
            classes: classes_writer,
        };
        relist(&self.server, "persistentvolumeclaims", &mut writers.claims);
        relist(&self.server, "persistentvolumes", &mut writers.volumes);
        relist(&self.server, "storageclasses", &mut writers.classes);
        let claims_listed = ctx.claims_listed.clone();
        self.procs.push(Process {
            name,
            slot: slot.to_owned(),
            alive: true,
            claims: Some(Arc::new(ClaimReconciler::new(Arc::clone(&ctx)))),
            volumes: Some(Arc::new(VolumeReconciler::new(Arc::clone(&ctx)))),
            ctx: Some(ctx),
            writers: Some(writers),
            claims_listed: Some(claims_listed),
            tasks: BTreeMap::new(),
            lease,
            paused_at: None,
            deposed: false,
            stopped: false,
            loaded,
        });
        self.settle().await;
    }

    /// Runs the tasks until nothing moves (every actor waits at the gate or on a timer).
    pub async fn settle(&self) {
        let mut last = (self.gate.activity(), self.trace.len());
        let mut quiet = 0;
        for _ in 0..20_000 {
            tokio::task::yield_now().await;
            let now = (self.gate.activity(), self.trace.len());
            if now == last {
                quiet += 1;
                if quiet >= 12 {
                    return;
                }
            } else {
                quiet = 0;
                last = now;
            }
        }
    }

    fn alive(&self) -> Vec<ProcId> {
        (0..self.procs.len())
            .filter(|p| self.procs[*p].alive)
            .collect()
    }

    /// The process named `name` (`<slot>#<incarnation>`).
    pub fn proc_id(&self, name: &str) -> Option<ProcId> {
        self.procs.iter().position(|p| p.name == name)
    }

    /// Whether a live, unpaused process of `slot` ("central" or the node) has settled the
    /// operation of `name` in memory while its shard still holds it (a removal not yet
    /// written): it reads nothing any more.
    pub fn settled_in_memory(&self, slot: &str, name: &str) -> bool {
        self.procs.iter().any(|process| {
            process.alive
                && process.paused_at.is_none()
                && !process.deposed
                && process.slot == slot
                && process
                    .ctx
                    .as_ref()
                    .is_some_and(|ctx| !ctx.journal.registry().contains(name))
        })
    }

    /// Whether the process crashed (its memory lost, not a graceful stop).
    pub fn crashed(&self, proc: ProcId) -> bool {
        self.gate.is_dead(proc) && !self.procs[proc].stopped
    }

    /// Whether the process recovered the record of `name` when it started.
    pub fn recovered(&self, proc: ProcId, name: &str) -> bool {
        self.procs[proc].loaded.contains(name)
    }

    /// Whether a leader was ever deposed in this run.
    pub fn deposed_any(&self) -> bool {
        self.procs.iter().any(|p| p.deposed)
    }

    /// Alive and not paused: its tasks run.
    fn active(&self) -> Vec<ProcId> {
        (0..self.procs.len())
            .filter(|p| self.procs[*p].alive && self.procs[*p].paused_at.is_none())
            .collect()
    }

    /// The calls waiting whose process runs.
    fn releasable(&self) -> Vec<super::gate::Waiting> {
        self.gate
            .waiting()
            .into_iter()
            .filter(|call| self.procs[call.proc].paused_at.is_none())
            .filter(|call| {
                self.ready_at
                    .get(&call.id)
                    .is_none_or(|at| *at <= self.step)
            })
            .collect()
    }

    /// Draws the latency of each call that arrived at the gate since the last step.
    fn time_new_calls(&mut self) {
        let waiting = self.gate.waiting();
        for call in &waiting {
            if self.ready_at.contains_key(&call.id) {
                continue;
            }
            let delay = if self.rng.chance(self.profile.slow_calls) {
                3 + self.rng.below(30)
            } else {
                0
            };
            self.ready_at.insert(call.id, self.step + delay);
        }
        let ids: BTreeSet<u64> = waiting.iter().map(|call| call.id).collect();
        self.ready_at.retain(|id, _| ids.contains(id));
    }

    /// Every running leader renews its lease (it does every 2 s).
    fn renew_leases(&self) {
        for process in &self.procs {
            if process.alive
                && process.paused_at.is_none()
                && !process.deposed
                && let Some(lease) = &process.lease
            {
                lease.send_replace(Some(Instant::now()));
            }
        }
    }

    /// Slots whose process is gone (or paused past the lease duration): a new one may start.
    fn vacant_slots(&self) -> Vec<String> {
        let now = Instant::now();
        self.slots()
            .into_iter()
            .filter(|slot| {
                !self.procs.iter().any(|p| {
                    p.alive
                        && &p.slot == slot
                        && !p.deposed
                        && p.paused_at.is_none_or(|at| now < at + LEASE_DURATION)
                })
            })
            .collect()
    }

    /// Starts an actor on `proc` unless the same one is in flight there.
    fn spawn(
        &mut self,
        proc: ProcId,
        label: String,
        work: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> bool {
        let process = &mut self.procs[proc];
        process.tasks.retain(|_, task| !task.is_finished());
        if process.tasks.contains_key(&label) {
            return false;
        }
        let actor = format!("{} {label}", process.name);
        self.trace.note(&format!("{actor} starts"));
        let task = tokio::spawn(ACTOR.scope(actor, work));
        process.tasks.insert(label, task);
        true
    }

    /// Runs the run: `steps` seeded steps with faults, then quiescence. The first violated
    /// invariant ends it.
    /// Returns the trace.
    pub async fn run(mut self) -> Result<String, Failure> {
        for _ in 0..self.profile.steps {
            self.step += 1;
            self.one_step().await;
            self.settle().await;
            self.check(false)?;
        }
        self.quiesce().await?;
        Ok(self.trace.render())
    }

    fn fail(&self, violation: Violation) -> Failure {
        let hole = classify(self, &violation);
        self.trace.note(&format!(
            "VIOLATION {:?} ({hole:?}): {}",
            violation.kind, violation.message
        ));
        Failure {
            seed: self.seed,
            profile: self.profile.name,
            kind: violation.kind,
            hole,
            violation: violation.message,
            trace: self.trace.render(),
            step: self.step,
        }
    }

    /// The first violated invariant fails the run, except a documented limit: a record
    /// recovered after a restart whose replay the driver refuses with a final error stays,
    /// by design (docs/journal.md, rule 3b and "Limits": an admin removes it).
    fn check(&self, quiescent: bool) -> Result<(), Failure> {
        for violation in invariants::check(self, quiescent) {
            if classify(self, &violation) == Hole::RecoveredFinalError {
                self.trace.note(&format!(
                    "accepted (docs/journal.md rule 3b, Limits): {}",
                    violation.message
                ));
                continue;
            }
            return Err(self.fail(violation));
        }
        Ok(())
    }

    fn weights(&self) -> Vec<(StepKind, u32)> {
        let p = &self.profile;
        let waiting = !self.releasable().is_empty();
        let dead_slot = !self.vacant_slots().is_empty();
        let pausable = self.pausable().is_some();
        let paused = self.procs.iter().any(|p| p.alive && p.paused_at.is_some());
        let deposed = self
            .procs
            .iter()
            .any(|p| p.alive && p.deposed && p.paused_at.is_none());
        vec![
            (StepKind::Release, if waiting { 40 } else { 0 }),
            (StepKind::ReconcileClaim, 14),
            (StepKind::ReconcileVolume, 6),
            (StepKind::Reap, p.reaps),
            (StepKind::Sweep, if p.restores { 3 } else { 0 }),
            (StepKind::Sync, 10),
            (StepKind::TickSmall, 8),
            (StepKind::TickLarge, 2),
            (StepKind::Binder, 5),
            (StepKind::Scheduler, if p.node_mode() { 4 } else { 0 }),
            (StepKind::Move, p.moves),
            (StepKind::DeleteClaim, p.claim_deletes),
            (StepKind::CreateClaim, p.claim_creates),
            (StepKind::RecreateClass, p.class_recreates),
            (StepKind::DeleteSnapshot, p.snapshot_deletes),
            (StepKind::Crash, p.crash),
            (StepKind::Restart, if dead_slot { 6 } else { 0 }),
            (StepKind::Pause, if pausable { p.pause } else { 0 }),
            (
                StepKind::Resume,
                if paused && dead_slot {
                    0
                } else if paused {
                    4
                } else {
                    0
                },
            ),
            (StepKind::Exit, if deposed { 3 } else { 0 }),
        ]
    }

    async fn one_step(&mut self) {
        self.renew_leases();
        self.time_new_calls();
        let weights = self.weights();
        let pick = self
            .rng
            .weighted(&weights.iter().map(|(_, w)| *w).collect::<Vec<_>>());
        let kind = weights[pick].0;
        match kind {
            StepKind::Release => {
                let waiting = self.releasable();
                let call = &waiting[self.rng.below(waiting.len())];
                self.trace.step(
                    self.step,
                    &format!("let through {}: {}", call.actor, call.what),
                );
                self.gate.release(call.id);
            }
            StepKind::ReconcileClaim => {
                if let Some(proc) = self.pick_proc() {
                    self.start_claim_reconcile(proc, None);
                }
            }
            StepKind::ReconcileVolume => {
                if let Some(proc) = self.pick_proc() {
                    self.start_volume_reconcile(proc, None);
                }
            }
            StepKind::Reap => {
                if let Some(proc) = self.pick_proc() {
                    self.start_reap(proc, None);
                }
            }
            StepKind::Sweep => {
                if let Some(proc) = self.pick_proc() {
                    self.start_sweep(proc);
                }
            }
            StepKind::Sync => {
                if let Some(proc) = self.pick_proc() {
                    let kind = self.rng.below(3);
                    self.sync(proc, kind);
                }
            }
            StepKind::TickSmall => {
                let millis = 20 + self.rng.below(1000) as u64;
                self.tick(Duration::from_millis(millis)).await;
            }
            StepKind::TickLarge => {
                let secs = 5 + self.rng.below(30) as u64;
                self.tick(Duration::from_secs(secs)).await;
            }
            StepKind::Binder => {
                self.trace
                    .step(self.step, "binder (kube-controller-manager) runs");
                self.binder();
            }
            StepKind::Scheduler => {
                self.trace.step(self.step, "scheduler runs");
                self.schedule_claims();
            }
            StepKind::Move => self.move_claim(),
            StepKind::DeleteClaim => self.delete_claim(),
            StepKind::CreateClaim => {
                let name = self.create_claim();
                self.trace
                    .step(self.step, &format!("user creates claim {NAMESPACE}/{name}"));
            }
            StepKind::RecreateClass => self.recreate_class(None),
            StepKind::DeleteSnapshot => {
                self.trace.step(
                    self.step,
                    &format!("user deletes snapshot {NAMESPACE}/{SNAPSHOT}"),
                );
                self.server.delete("volumesnapshots", NAMESPACE, SNAPSHOT);
            }
            StepKind::Crash => {
                if let Some(proc) = self.pick_proc() {
                    self.crash(proc);
                }
            }
            StepKind::Pause => {
                if let Some(proc) = self.pausable() {
                    self.trace.step(
                        self.step,
                        &format!("leader {} pauses", self.procs[proc].name),
                    );
                    self.procs[proc].paused_at = Some(Instant::now());
                }
            }
            StepKind::Resume => {
                let paused = self
                    .alive()
                    .into_iter()
                    .find(|p| self.procs[*p].paused_at.is_some());
                if let Some(proc) = paused {
                    let slot = self.procs[proc].slot.clone();
                    let replaced =
                        self.procs.iter().enumerate().any(|(other, p)| {
                            other != proc && p.alive && p.slot == slot && !p.deposed
                        });
                    let what = if replaced {
                        "resumes, deposed: another replica leads (its fence is closed)"
                    } else {
                        "resumes, still the leader"
                    };
                    self.trace
                        .step(self.step, &format!("{} {what}", self.procs[proc].name));
                    self.procs[proc].paused_at = None;
                    self.procs[proc].deposed = replaced;
                }
            }
            StepKind::Exit => {
                if let Some(proc) = self.alive().into_iter().find(|p| self.procs[*p].deposed) {
                    self.trace.note(&format!(
                        "{} finds its lease lost and exits",
                        self.procs[proc].name
                    ));
                    self.crash(proc);
                }
            }
            StepKind::Restart => {
                let dead = self.vacant_slots();
                let slot = dead[self.rng.below(dead.len())].clone();
                self.trace.step(self.step, &format!("restart on {slot}"));
                self.start_process(&slot).await;
            }
        }
    }

    fn pick_proc(&mut self) -> Option<ProcId> {
        let active = self.active();
        (!active.is_empty()).then(|| active[self.rng.below(active.len())])
    }

    /// A leader that may pause now: running, not deposed, with no driver call waiting at the
    /// gate (its fence was checked before the gate: a pause there is the window the fence
    /// admits, see src/fence.rs).
    fn pausable(&self) -> Option<ProcId> {
        if self.profile.pause == 0 || self.procs.iter().any(|p| p.alive && p.paused_at.is_some()) {
            return None;
        }
        let waiting = self.gate.waiting();
        self.active().into_iter().find(|proc| {
            !self.procs[*proc].deposed
                && !waiting.iter().any(|call| {
                    call.proc == *proc
                        && (call.what.starts_with("CreateVolume")
                            || call.what.starts_with("DeleteVolume"))
                })
        })
    }

    fn ctx(&self, proc: ProcId) -> Arc<Context> {
        Arc::clone(self.procs[proc].ctx.as_ref().expect("alive"))
    }

    /// A claim reconcile of `name` (or of a cached claim drawn at random).
    fn start_claim_reconcile(&mut self, proc: ProcId, name: Option<String>) {
        let ctx = self.ctx(proc);
        let mut cached = ctx.claims.state();
        cached.sort_by_key(|c| (c.metadata.namespace.clone(), c.metadata.name.clone()));
        let chosen = match name {
            Some(name) => cached
                .into_iter()
                .find(|c| c.metadata.name.as_deref() == Some(&name)),
            None if cached.is_empty() => None,
            None => {
                let index = self.rng.below(cached.len());
                Some(cached.swap_remove(index))
            }
        };
        let Some(claim) = chosen else { return };
        let label = format!(
            "claim {}/{}",
            claim.metadata.namespace.clone().unwrap_or_default(),
            claim.metadata.name.clone().unwrap_or_default()
        );
        let reconciler = Arc::clone(self.procs[proc].claims.as_ref().expect("alive"));
        let step = self.step;
        self.trace.step(
            step,
            &format!("{} reconciles {label}", self.procs[proc].name),
        );
        self.spawn(proc, label, async move {
            let _ = ClaimReconciler::reconcile(claim, reconciler).await;
        });
    }

    fn start_volume_reconcile(&mut self, proc: ProcId, name: Option<String>) {
        let ctx = self.ctx(proc);
        let mut cached = ctx.volumes.state();
        cached.sort_by_key(|v| v.metadata.name.clone());
        let chosen = match name {
            Some(name) => cached
                .into_iter()
                .find(|v| v.metadata.name.as_deref() == Some(&name)),
            None if cached.is_empty() => None,
            None => {
                let index = self.rng.below(cached.len());
                Some(cached.swap_remove(index))
            }
        };
        let Some(volume) = chosen else { return };
        let label = format!("pv {}", volume.metadata.name.clone().unwrap_or_default());
        let reconciler = Arc::clone(self.procs[proc].volumes.as_ref().expect("alive"));
        self.trace.step(
            self.step,
            &format!("{} reconciles {label}", self.procs[proc].name),
        );
        self.spawn(proc, label, async move {
            let _ = VolumeReconciler::reconcile(volume, reconciler).await;
        });
    }

    /// Reaps one idle operation (as the reaper's scan would find it).
    fn start_reap(&mut self, proc: ProcId, name: Option<String>) {
        let ctx = self.ctx(proc);
        let mut idle = ctx.journal.registry().idle();
        idle.sort_by(|a, b| a.volume_name.cmp(&b.volume_name));
        let chosen = match name {
            Some(name) => idle.into_iter().find(|op| op.volume_name == name),
            None if idle.is_empty() => None,
            None => {
                let index = self.rng.below(idle.len());
                Some(idle.swap_remove(index))
            }
        };
        let Some(operation) = chosen else { return };
        let label = format!("reap {}", operation.volume_name);
        self.trace.step(
            self.step,
            &format!(
                "{} reaper takes {}",
                self.procs[proc].name, operation.volume_name
            ),
        );
        let trace = self.trace.clone();
        self.spawn(proc, label, async move {
            let outcome = match orphans::reap_idle(&ctx, &operation).await {
                Ok(orphans::Reaped::Done) => "done: record dropped".to_owned(),
                Ok(orphans::Reaped::NotAnOrphan) => "not an orphan".to_owned(),
                Err(error) => format!("failed: {error}"),
            };
            trace.note(&format!("reap {} → {outcome}", operation.volume_name));
        });
    }

    fn start_sweep(&mut self, proc: ProcId) {
        let ctx = self.ctx(proc);
        let listed = self.procs[proc].claims_listed.clone().expect("alive");
        self.trace.step(
            self.step,
            &format!("{} sweeps snapshots", self.procs[proc].name),
        );
        self.spawn(proc, "sweep".to_owned(), async move {
            let _ = snapshot_sweeper::sweep(&ctx, &listed).await;
        });
    }

    fn sync(&mut self, proc: ProcId, kind: usize) {
        let name = self.procs[proc].name.clone();
        let writers = self.procs[proc].writers.as_mut().expect("alive");
        let resource = [
            "persistentvolumeclaims",
            "persistentvolumes",
            "storageclasses",
        ][kind];
        self.trace
            .step(self.step, &format!("{name} relists {resource}"));
        match kind {
            0 => relist(&self.server, resource, &mut writers.claims),
            1 => relist(&self.server, resource, &mut writers.volumes),
            _ => relist(&self.server, resource, &mut writers.classes),
        }
    }

    /// Quiescence: the caches catch up with the API server.
    fn sync_all(&mut self, proc: ProcId) {
        for kind in 0..3 {
            self.sync(proc, kind);
        }
    }

    async fn tick(&mut self, by: Duration) {
        self.trace.step(self.step, &format!("time advances {by:?}"));
        // In small slices: a timer that fires may arm the next.
        let slice = Duration::from_millis(25);
        let mut left = by;
        while !left.is_zero() {
            let d = left.min(slice.max(left / 20));
            tokio::time::advance(d).await;
            self.renew_leases();
            self.settle().await;
            left -= d;
        }
    }

    /// The PV controller: binds a claim to the PV whose claimRef names it; a PV whose claim is
    /// gone is Released. The snapshot controller: a VolumeSnapshot gone takes its content and
    /// the backend snapshot with it.
    fn binder(&mut self) {
        let claims = self.server.list("persistentvolumeclaims");
        for pv in self.server.list("persistentvolumes") {
            let claim_ref = &pv["spec"]["claimRef"];
            if claim_ref.is_null() {
                continue;
            }
            let uid = text(&claim_ref["uid"]);
            let claim = claims.iter().find(|c| {
                text(&c["metadata"]["namespace"]) == text(&claim_ref["namespace"])
                    && text(&c["metadata"]["name"]) == text(&claim_ref["name"])
                    && (uid.is_empty() || text(&c["metadata"]["uid"]) == uid)
            });
            let phase = text(&pv["status"]["phase"]).to_owned();
            match claim {
                Some(claim)
                    if phase != "Released" && pv["metadata"]["deletionTimestamp"].is_null() =>
                {
                    let bound_elsewhere = text(&claim["spec"]["volumeName"]);
                    let pv_name = text(&pv["metadata"]["name"]);
                    if !bound_elsewhere.is_empty() && bound_elsewhere != pv_name {
                        continue;
                    }
                    if phase != "Bound" {
                        let mut pv = pv.clone();
                        pv["status"]["phase"] = json!("Bound");
                        self.server.put("persistentvolumes", pv);
                        self.trace.note(&format!("binder: PV {pv_name} Bound"));
                    }
                    if text(&claim["status"]["phase"]) != "Bound" {
                        let mut claim = claim.clone();
                        claim["spec"]["volumeName"] = json!(pv_name);
                        claim["status"]["phase"] = json!("Bound");
                        self.trace.note(&format!(
                            "binder: claim {} Bound to {pv_name}",
                            text(&claim["metadata"]["name"])
                        ));
                        self.server.put("persistentvolumeclaims", claim);
                    }
                }
                Some(_) => {}
                None if phase != "Released" && uid.is_empty() => {}
                None if phase != "Released" => {
                    let mut pv = pv.clone();
                    pv["status"]["phase"] = json!("Released");
                    self.trace.note(&format!(
                        "binder: PV {} Released",
                        text(&pv["metadata"]["name"])
                    ));
                    self.server.put("persistentvolumes", pv);
                }
                None => {}
            }
        }
        let snapshots = self.server.list("volumesnapshots");
        for content in self.server.list("volumesnapshotcontents") {
            let reference = &content["spec"]["volumeSnapshotRef"];
            let gone = !snapshots
                .iter()
                .any(|s| s["metadata"]["uid"] == reference["uid"]);
            if gone {
                let handle = text(&content["status"]["snapshotHandle"]).to_owned();
                self.trace.note(&format!(
                    "snapshot controller: content {} and snapshot {handle} deleted",
                    text(&content["metadata"]["name"])
                ));
                self.server.delete(
                    "volumesnapshotcontents",
                    "",
                    text(&content["metadata"]["name"]),
                );
                for driver in self.drivers.values() {
                    driver.lock().snapshots.remove(&handle);
                }
            }
        }
    }

    /// Node mode: the scheduler picks a node for each claim waiting for one.
    fn schedule_claims(&mut self) {
        let nodes = self.profile.nodes;
        for claim in self.server.list("persistentvolumeclaims") {
            let annotations = &claim["metadata"]["annotations"];
            if !annotations[SELECTED_NODE].is_null()
                || !claim["metadata"]["deletionTimestamp"].is_null()
                || !text(&claim["spec"]["volumeName"]).is_empty()
            {
                continue;
            }
            let node = nodes[self.rng.below(nodes.len())];
            let mut claim = claim.clone();
            claim["metadata"]["annotations"][SELECTED_NODE] = json!(node);
            self.trace.note(&format!(
                "scheduler: claim {} → node {node}",
                text(&claim["metadata"]["name"])
            ));
            self.server.put("persistentvolumeclaims", claim);
        }
    }

    /// Node mode: the pod of a claim not bound yet moves to another node (or its node is
    /// removed: the pod is deleted and waits for the scheduler).
    fn move_claim(&mut self) {
        let candidates: Vec<Value> = self
            .server
            .list("persistentvolumeclaims")
            .into_iter()
            .filter(|c| {
                text(&c["spec"]["volumeName"]).is_empty()
                    && c["metadata"]["deletionTimestamp"].is_null()
            })
            .collect();
        if candidates.is_empty() || !self.profile.node_mode() {
            return;
        }
        let mut claim = candidates[self.rng.below(candidates.len())].clone();
        let name = text(&claim["metadata"]["name"]).to_owned();
        let current = text(&claim["metadata"]["annotations"][SELECTED_NODE]).to_owned();
        let others: Vec<&str> = self
            .profile
            .nodes
            .iter()
            .copied()
            .filter(|n| *n != current)
            .collect();
        if self.rng.chance(200) {
            claim["metadata"]["annotations"]
                .as_object_mut()
                .expect("annotations")
                .remove(SELECTED_NODE);
            self.trace.step(
                self.step,
                &format!("pod of claim {name} deleted: selected node {current:?} removed"),
            );
        } else {
            let node = others[self.rng.below(others.len())];
            claim["metadata"]["annotations"][SELECTED_NODE] = json!(node);
            self.trace.step(
                self.step,
                &format!("pod of claim {name} moved: selected node {current:?} → {node}"),
            );
        }
        self.server.put("persistentvolumeclaims", claim);
    }

    fn delete_claim(&mut self) {
        let claims: Vec<Value> = self
            .server
            .list("persistentvolumeclaims")
            .into_iter()
            .filter(|c| c["metadata"]["deletionTimestamp"].is_null())
            .collect();
        if claims.is_empty() {
            return;
        }
        let claim = &claims[self.rng.below(claims.len())];
        let name = text(&claim["metadata"]["name"]).to_owned();
        self.trace
            .step(self.step, &format!("user deletes claim {NAMESPACE}/{name}"));
        self.server
            .delete("persistentvolumeclaims", NAMESPACE, &name);
    }

    /// An admin deletes the class and creates it again with other parameters (`valid`:
    /// forced to valid ones).
    fn recreate_class(&mut self, valid: Option<bool>) {
        let old = self.server.get("storageclasses", "", CLASS);
        let was_invalid = old
            .as_ref()
            .is_some_and(|c| text(&c["parameters"][INVALID_PARAMETER]) == "true");
        let invalid = match valid {
            Some(valid) => !valid,
            None => !was_invalid && self.profile.bad_class && self.rng.chance(300),
        };
        let kind = ["fast", "slow", "gold"][self.rng.below(3)];
        let params = if invalid {
            json!({"type": kind, INVALID_PARAMETER: "true"})
        } else {
            json!({"type": kind})
        };
        self.trace.step(
            self.step,
            &format!("admin re-creates class {CLASS} with {params}"),
        );
        self.server.delete("storageclasses", "", CLASS);
        self.create_class(params);
    }

    /// The process dies: its in-flight work is dropped, its memory gone, and nothing it
    /// sent after this moment reaches anyone.
    fn crash(&mut self, proc: ProcId) {
        self.trace
            .step(self.step, &format!("{} crashes", self.procs[proc].name));
        self.gate.kill(proc);
        let process = &mut self.procs[proc];
        for (_, task) in std::mem::take(&mut process.tasks) {
            task.abort();
        }
        process.alive = false;
        process.claims = None;
        process.volumes = None;
        process.writers = None;
        process.claims_listed = None;
        process.ctx = None;
    }

    /// A graceful stop: the actors finish, the journal writes what it holds back, then the
    /// process is gone.
    async fn stop_gracefully(&mut self, proc: ProcId) {
        self.trace.step(
            self.step,
            &format!("{} stops gracefully", self.procs[proc].name),
        );
        self.drain_calls().await;
        let process = &mut self.procs[proc];
        process.tasks.clear();
        process.stopped = true;
        process.alive = false;
        process.claims = None;
        process.volumes = None;
        process.writers = None;
        process.claims_listed = None;
        process.ctx = None;
        // The writers see their queues close and write what they held back.
        self.tick(Duration::from_secs(1)).await;
        self.gate.kill(proc);
    }

    /// Faults stop, every process is up, the class is valid, and every actor runs until
    /// nothing changes; then the quiescence invariants are checked.
    async fn quiesce(&mut self) -> Result<(), Failure> {
        self.step += 1;
        self.trace.step(self.step, "faults stop; quiescence");
        for driver in self.drivers.values() {
            driver.lock().faulty = false;
        }
        let invalid = self
            .server
            .get("storageclasses", "", CLASS)
            .is_none_or(|c| text(&c["parameters"][INVALID_PARAMETER]) == "true");
        if invalid {
            self.recreate_class(Some(true));
        }
        for proc in self.alive() {
            if self.procs[proc].paused_at.is_some() || self.procs[proc].deposed {
                self.trace.note(&format!(
                    "{} exits (its lease is lost)",
                    self.procs[proc].name
                ));
                self.crash(proc);
            }
        }
        if self.profile.pause > 0 {
            // The shard watch is not modeled: a record the deposed leader wrote after the new
            // one loaded would only be adopted at the new leader's next conflicting write. A
            // graceful restart (the journal's held changes are written first) reloads every
            // shard, as the watch would have adopted them.
            self.drain_calls().await;
            for proc in self.alive() {
                self.stop_gracefully(proc).await;
            }
        }
        for slot in self.slots() {
            if !self.procs.iter().any(|p| p.alive && p.slot == slot) {
                self.start_process(&slot).await;
            }
        }
        let mut stable = 0;
        let mut last = None;
        for _round in 0..60 {
            self.step += 1;
            self.trace.step(self.step, "quiescence round");
            self.drain_calls().await;
            if self.profile.node_mode() {
                self.schedule_claims();
            }
            self.binder();
            for proc in self.alive() {
                self.sync_all(proc);
            }
            for proc in self.alive() {
                let ctx = self.ctx(proc);
                let mut claims: Vec<String> = ctx
                    .claims
                    .state()
                    .iter()
                    .filter_map(|c| c.metadata.name.clone())
                    .collect();
                claims.sort();
                for claim in claims {
                    self.start_claim_reconcile(proc, Some(claim));
                }
                self.drain_calls().await;
                self.sync_all(proc);
                let mut volumes: Vec<String> = ctx
                    .volumes
                    .state()
                    .iter()
                    .filter_map(|v| v.metadata.name.clone())
                    .collect();
                volumes.sort();
                for volume in volumes {
                    self.start_volume_reconcile(proc, Some(volume));
                }
                self.drain_calls().await;
                self.sync_all(proc);
                let mut idle: Vec<String> = ctx
                    .journal
                    .registry()
                    .idle()
                    .into_iter()
                    .map(|op| op.volume_name)
                    .collect();
                idle.sort();
                for name in idle {
                    self.start_reap(proc, Some(name));
                }
                self.drain_calls().await;
                if self.profile.restores {
                    self.start_sweep(proc);
                    self.drain_calls().await;
                }
            }
            self.tick(Duration::from_secs(45)).await;
            self.check(false)?;
            let fingerprint = self.fingerprint();
            if last.as_ref() == Some(&fingerprint) {
                stable += 1;
                // Unchanged for longer than the slowest retry (an infeasible claim waits
                // --retry-interval-max, 300 s).
                if stable >= 8 {
                    break;
                }
            } else {
                stable = 0;
                last = Some(fingerprint);
            }
        }
        self.check(true)
    }

    /// Lets every waiting call through, in order, until none waits.
    async fn drain_calls(&mut self) {
        for _ in 0..10_000 {
            self.settle().await;
            let waiting = self.gate.waiting();
            let Some(call) = waiting.first() else { return };
            self.gate.release(call.id);
        }
    }

    /// What quiescence must leave unchanged: the objects (without resourceVersions), the
    /// backend volumes and the operations each process holds.
    fn fingerprint(&self) -> String {
        let mut out = String::new();
        for ((resource, namespace, name), object) in &self.server.lock().objects {
            if resource == "events" {
                continue;
            }
            let mut object = object.clone();
            object["metadata"]["resourceVersion"] = Value::Null;
            out.push_str(&format!("{resource}/{namespace}/{name}={object}\n"));
        }
        for (slot, driver) in &self.drivers {
            let volumes: BTreeSet<String> = driver.lock().volumes.keys().cloned().collect();
            out.push_str(&format!("{slot}: {volumes:?}\n"));
        }
        for proc in self.alive() {
            out.push_str(&format!(
                "{}: {}\n",
                self.procs[proc].name,
                self.ctx(proc).journal.registry().len()
            ));
        }
        out
    }
}

/// Replaces a cache's content with what the API server holds now (a relist).
fn relist<K>(server: &ApiServer, resource: &str, writer: &mut Writer<K>)
where
    K: kube::runtime::reflector::Lookup + Clone + DeserializeOwned + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    writer.apply_watcher_event(&watcher::Event::Init);
    for object in server.list(resource) {
        if let Ok(object) = serde_json::from_value::<K>(object) {
            writer.apply_watcher_event(&watcher::Event::InitApply(object));
        }
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
}
