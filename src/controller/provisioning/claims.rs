//! The claim reconciler: turns a claim that names our driver into a backend volume and a
//! pre-bound PV. Decisions come from `crate::provision` (what work a claim needs:
//! [`claim_work`]); this module only fetches what they need, calls the driver and the API
//! server, and maps every failure to one event and one metric in
//! [`ClaimReconciler::report_failure`].

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::ops::ControlFlow;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::future::{self, BoxFuture, Either, Shared};
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{StorageClass, VolumeAttributesClass};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::core::Request;
use kube::runtime::controller::Controller;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use thiserror::Error;
use tracing::{debug, error, info, warn};

use super::ownership::{self, Races};
use super::sources::{self, SourceError};
use crate::controller::runtime::backoff::{Backoff, InfeasibleSet};
use crate::controller::runtime::cache::{CachedClaim, has_listed};
use crate::controller::runtime::events::EventType;
use crate::controller::runtime::measured::{Measured, Next};
use crate::controller::runtime::runner::{
    RESYNC_PERIOD, lock, log_result, never_fails, resync_with_work, until_drained_if_never_ready,
    with_work,
};
use crate::controller::shared::actions::{
    ClaimFinalizerError, SecretReadError, claim_key, create_volume, delete_volume, read_secret,
    set_claim_finalizer,
};
use crate::controller::shared::context::{Context, NodeDeployment};
use crate::csi;
use crate::csi_client::{CallError, ErrorClass, migrated_calls};
use crate::journal::{Busy, JournalError, Operation, Phase};
use crate::kube_client::go_error_text;
use crate::kube_client::protobuf;
use crate::metrics::CLAIMS_QUEUE;
use crate::provision::storage_capacity::RefreshCause;
use crate::provision::{
    AttributesClassError, ClaimWork, CreateResponseError, DecisionError, DriverClass, ExistingPv,
    Holding, InTreePlugin, MigrationError, NodeVerdict, ProvisionError, ProvisionPlan,
    RescheduleCause, TopologyError, TopologyInputs, accessibility_requirements,
    build_create_volume_request, build_persistent_volume, claim_class_name, claim_work,
    class_for_driver, copy_claim_labels, drain_claim_work, existing_pv, has_operation_in_flight,
    ignored_attributes_class, migrated_plugin, mutable_parameters, names_may_collide,
    namespace_metadata_parameters, needs_finalizer, node_claim_work, node_verdict, plan_provision,
    pv_holds_volume, pv_is_for_claim, recorded_class_moved, reschedule_patch, selected_node,
    topology_missing,
};

/// Why one provisioning attempt failed. Each variant says what exists on the backend:
/// variants before `Driver` are raised before CreateVolume.
#[derive(Debug, Error)]
pub enum ClaimError {
    #[error(transparent)]
    Decision(#[from] DecisionError),
    #[error(transparent)]
    Plan(#[from] ProvisionError),
    /// Upstream's text.
    #[error("failed to translate storage class: {0}")]
    ClassTranslation(MigrationError),
    /// The volume was created but its PV cannot be given the in-tree source; the volume was
    /// deleted again (upstream's quirk A17 keeps it and retries forever).
    #[error(
        "failed to translate the CSI PV of volume {volume} to in-tree: {error}; the volume was deleted"
    )]
    BackTranslation {
        volume: String,
        error: MigrationError,
    },
    #[error(
        "failed to translate the CSI PV of volume {volume} to in-tree: {error}; deleting the volume failed, it is retried: {cleanup}"
    )]
    BackTranslationCleanup {
        volume: String,
        error: MigrationError,
        cleanup: CleanupError,
    },
    #[error(transparent)]
    Topology(#[from] TopologyError),
    #[error(
        "the Node and CSINode watches have not listed yet, so the claim's topology is unknown (does the sidecar's RBAC grant list and watch on nodes and csinodes?)"
    )]
    TopologyNotListed,
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error(transparent)]
    Secret(#[from] SecretReadError),
    /// The claim's VolumeAttributesClass could not be read (it may not exist yet); upstream's
    /// text is the API error alone.
    #[error("{0}")]
    AttributesClassRead(String),
    #[error(transparent)]
    AttributesClass(#[from] AttributesClassError),
    /// `--copy-claim-labels`: the claim is read for its labels (the cache keeps none).
    #[error("failed to read the claim for its labels (--copy-claim-labels): {0}")]
    ClaimLabelsRead(String),
    /// `--extra-create-metadata-namespace-*`: nothing is sent without the parameters.
    #[error(
        "failed to read namespace {namespace:?} for its labels and annotations (--extra-create-metadata-namespace-labels, --extra-create-metadata-namespace-annotations): {error}"
    )]
    NamespaceRead { namespace: String, error: String },
    #[error(transparent)]
    ClaimFinalizer(#[from] ClaimFinalizerError),
    #[error("failed to read PersistentVolume {name}: {source}")]
    PvRead { name: String, source: kube::Error },
    #[error(
        "PersistentVolume {name} already exists for {holder}; this claim gets no volume: its volume name collides with another claim's (raise --volume-name-uuid-length)"
    )]
    NameCollision { name: String, holder: String },
    #[error("failed to record the operation in the journal: {0}")]
    Journal(#[from] JournalError),
    /// Node mode: another node's journal holds an operation for the volume name; that node
    /// sees it through or, once the claim has left it, deletes what it made.
    #[error(
        "node {node} still holds an operation for volume {volume} (the claim was on that node before); it is retried once that node has finished or cleaned it up (if that node is gone for good, see \"When a node is gone for good\" in docs/journal.md)"
    )]
    HeldByNode { volume: String, node: String },
    #[error("{0}")]
    Driver(CallError),
    /// The attempt failed on the selected node, which was given back to the scheduler: the
    /// text is the failure's, as upstream's event.
    #[error("{error}")]
    Rescheduled {
        node: String,
        error: Box<ClaimError>,
    },
    /// A final error whose removal from the journal was not stored (the writer stopped: the
    /// process is exiting): nothing rests on it; a restart replays the recorded request.
    #[error("{error}; {journal}")]
    Unsettled {
        error: CallError,
        journal: JournalError,
    },
    #[error(
        "{error}; an earlier attempt may have created the volume for node {node:?}, so the claim keeps that node and the same request is retried until the driver says what became of it"
    )]
    NodeKept { node: String, error: CallError },
    #[error("Volume provisioning failed with infeasible error. Retries will be delayed. {0}")]
    Infeasible(CallError),
    #[error(transparent)]
    Volume(CreateResponseError),
    #[error("{error}. Cleanup of volume {volume} failed, volume is orphaned: {cleanup}")]
    CleanupFailed {
        error: CreateResponseError,
        volume: String,
        cleanup: CleanupError,
    },
    #[error("failed to create PersistentVolume {name}: {source}")]
    PvCreate { name: String, source: kube::Error },
    #[error(
        "PersistentVolume {name} of this claim is being deleted, and the volume it had may be deleted with it; the operation is kept and retried"
    )]
    PvBeingDeleted { name: String },
    #[error(
        "PersistentVolume {name} already exists for another volume ({existing:?}); the new volume {created:?} was deleted"
    )]
    PvTaken {
        name: String,
        existing: String,
        created: String,
    },
    #[error(
        "PersistentVolume {name} already exists and holds the volume {volume:?} the driver returned for this claim (bound to {holder}); the volume is in use and is not deleted, and this claim gets no volume: its volume name collides with another's (raise --volume-name-uuid-length)"
    )]
    VolumeInUse {
        name: String,
        volume: String,
        holder: String,
    },
}

const PROVISIONING: &str = "Provisioning";
const PROVISIONING_FAILED: &str = "ProvisioningFailed";
const PROVISIONING_SUCCEEDED: &str = "ProvisioningSucceeded";
/// How long a claim waits for the Node and CSINode watches' first list.
const TOPOLOGY_LIST_WAIT: Duration = Duration::from_secs(10);
/// Ours: a topology-aware volume came back without topology (`provision::topology_missing`).
const NO_ACCESSIBLE_TOPOLOGY: &str = "NoAccessibleTopology";
/// Ours: the claim names a VolumeAttributesClass the gate makes us ignore, so its PV will not
/// bind (A7, `provision::ignored_attributes_class`).
const ATTRIBUTES_CLASS_IGNORED: &str = "VolumeAttributesClassIgnored";
/// Ours: the PV names the class the recorded CreateVolume's parameters came from, which the
/// claim no longer names (`provision::recorded_class_moved`).
const ATTRIBUTES_CLASS_RECORDED: &str = "VolumeAttributesClassRecorded";

/// The resync of claims under `--drain`: a claim whose operation the reaper finished (its PV
/// already existed) may see no change of its own, and its finalizer must still come off.
const DRAIN_RESYNC_PERIOD: Duration = Duration::from_secs(5);

/// The claim controller: kube-runtime's controller over the claims with work, from the claim
/// watch, the claims of a StorageClass that changed, and a periodic resync.
pub(in crate::controller) struct ClaimController<C, S> {
    reconciler: Arc<ClaimReconciler>,
    changed: C,
    classes: S,
    /// Whether the claim store has listed (see `cache::listed`).
    listed: Shared<BoxFuture<'static, bool>>,
    queue: Measured,
}

impl<C, S> ClaimController<C, S>
where
    C: Stream<Item = Result<CachedClaim, watcher::Error>> + Send + 'static,
    S: Stream<Item = Result<StorageClass, watcher::Error>> + Send + 'static,
{
    /// `changed`: the claim watch's events; `classes`: the StorageClass watch's.
    pub(in crate::controller) fn new(
        ctx: &Arc<Context>,
        changed: C,
        classes: S,
        listed: Shared<BoxFuture<'static, bool>>,
    ) -> Self {
        ClaimController {
            reconciler: Arc::new(ClaimReconciler::new(Arc::clone(ctx))),
            changed,
            classes,
            listed,
            queue: Measured::new(ctx.metrics.queue(CLAIMS_QUEUE)),
        }
    }

    /// Runs until `drained`, letting the reconciles in flight finish.
    pub(in crate::controller) async fn run<D>(self, drained: impl Fn() -> D)
    where
        D: Future<Output = ()> + Send + Sync + 'static,
    {
        let ClaimController {
            reconciler,
            changed,
            classes,
            listed,
            queue,
        } = self;
        let store = reconciler.ctx.claims.clone();
        let resync = if reconciler.ctx.settings.draining {
            DRAIN_RESYNC_PERIOD
        } else {
            RESYNC_PERIOD
        };
        let has_work = |reconciler: &Arc<ClaimReconciler>| {
            let reconciler = Arc::clone(reconciler);
            move |claim: &CachedClaim| reconciler.has_work(claim)
        };
        let results = Controller::for_stream(
            queue.objects(with_work(changed, has_work(&reconciler))),
            store.clone(),
        )
        .watches_stream(classes, claims_of_class(&reconciler, &queue))
        .reconcile_on(queue.refs(resync_with_work(store, has_work(&reconciler), resync)))
        .graceful_shutdown_on(drained())
        .run(
            queue.reconcile(ClaimReconciler::reconcile),
            never_fails,
            reconciler,
        );
        let controller = queue.results(results).for_each(log_result);
        until_drained_if_never_ready(controller, listed, drained()).await;
    }
}

/// The mapper of StorageClass events: the cached claims of the class that have work.
fn claims_of_class(
    reconciler: &Arc<ClaimReconciler>,
    queue: &Measured,
) -> impl Fn(StorageClass) -> Vec<ObjectRef<CachedClaim>> + Send + Sync + 'static {
    let (reconciler, queue) = (Arc::clone(reconciler), queue.clone());
    move |class: StorageClass| {
        let name = class.metadata.name.unwrap_or_default();
        let due = reconciler
            .ctx
            .claims
            .state()
            .into_iter()
            // Nearly every claim has no work: deciding that first parses each cached claim
            // once, and only the few with work a second time for their class.
            .filter(|claim| {
                reconciler.has_work(claim)
                    && claim
                        .to_claim()
                        .is_ok_and(|pvc| claim_class_name(&pvc) == name)
            })
            .map(|claim| ObjectRef::from_obj(claim.as_ref()));
        queue.mapped(due).collect::<Vec<_>>()
    }
}

/// The claim reconciler of one sidecar process, and the per-claim state its reconciles keep
/// (none of it is read by another controller).
pub struct ClaimReconciler {
    ctx: Arc<Context>,
    /// Each failing claim's retry delay, by claim UID.
    backoff: Mutex<Backoff<String>>,
    /// Claims whose CreateVolume was infeasible in their class, retried slowly.
    infeasible: Mutex<InfeasibleSet>,
    /// Node mode: this node's wait before each try to own an Immediate claim (`ownership`).
    races: Mutex<Races>,
}

impl ClaimReconciler {
    pub fn new(ctx: Arc<Context>) -> Self {
        let settings = &ctx.settings;
        ClaimReconciler {
            backoff: Mutex::new(Backoff::new(
                settings.retry_interval_start,
                settings.retry_interval_max,
            )),
            infeasible: Mutex::new(InfeasibleSet::new(settings.retry_interval_max)),
            races: Mutex::new(Races::default()),
            ctx,
        }
    }

    /// Entry point for the controller: never returns an error, because failures are reported
    /// (event + metric) and retried with the per-claim backoff here, in one place.
    ///
    /// The controller only queues claims that [`Self::has_work`], but a claim's work may be
    /// gone by the time it runs: decided again here, without IO, and only a claim with work
    /// allocates the provisioning future (16 KiB in a debug build).
    pub fn reconcile(
        cached: Arc<CachedClaim>,
        this: Arc<Self>,
    ) -> impl Future<Output = Result<Next, std::convert::Infallible>> + Send + 'static {
        match this.triage(&cached) {
            Some((pvc, work)) => Either::Right(Box::pin(this.act(pvc, work))),
            None => Either::Left(future::ready(Ok(Next::Wait))),
        }
    }

    /// Whether a reconcile of this claim would have anything to do now. Nearly every cached
    /// claim has none; keeping them out of the controller's queue keeps that queue, whose
    /// memory is never given back, as small as the work.
    pub fn has_work(&self, cached: &CachedClaim) -> bool {
        self.triage(cached).is_some()
    }

    async fn act(
        self: Arc<Self>,
        pvc: PersistentVolumeClaim,
        work: Work,
    ) -> Result<Next, std::convert::Infallible> {
        let ctx = &self.ctx;
        let uid = pvc.uid().unwrap_or_default();
        let started = Instant::now();
        let migrated = matches!(&work, Work::Provision(class)
            if migrated_plugin(class, &ctx.settings.config.driver_name).is_some());
        match migrated_calls(migrated, self.provision_claim(&pvc, work)).await {
            Ok(outcome) => {
                self.backoff().forget(&uid);
                if let Outcome::Provisioned { volume } = &outcome {
                    ctx.metrics.provision_succeeded(
                        claim_class_name(&pvc),
                        data_source_kind(&pvc),
                        started.elapsed(),
                    );
                    info!(claim = %claim_key(&pvc), volume, "provisioned");
                }
                Ok(match outcome {
                    Outcome::RetryIn(delay) => Next::RetryIn(delay),
                    Outcome::Provisioned { .. } | Outcome::Nothing => Next::Wait,
                })
            }
            Err(error) => Ok(self.report_failure(&pvc, error)),
        }
    }

    /// The single mapping of claim failures to events, metrics and retry timing.
    fn report_failure(&self, pvc: &PersistentVolumeClaim, error: ClaimError) -> Next {
        let ctx = &self.ctx;
        let class = claim_class_name(pvc);
        ctx.metrics.provision_failed(class, data_source_kind(pvc));
        let message = error.to_string();
        let reference = pvc.object_ref(&());
        match &error {
            ClaimError::Plan(plan) if plan.is_ignored() => {
                ctx.events.publish(
                    &reference,
                    EventType::Normal,
                    PROVISIONING,
                    "Assuming an external populator will provision the volume",
                );
                debug!(claim = %claim_key(pvc), %message, "left to an external populator");
                return Next::Wait;
            }
            ClaimError::Decision(_) | ClaimError::ClaimFinalizer(_) => {}
            _ => ctx.events.publish(
                &reference,
                EventType::Warning,
                PROVISIONING_FAILED,
                &message,
            ),
        }
        if let ClaimError::Rescheduled { node, .. } = &error {
            // The claim waits for the scheduler now: its next selected node is a change.
            self.backoff().forget(&pvc.uid().unwrap_or_default());
            info!(claim = %claim_key(pvc), node, error = %message, "selected node given back to the scheduler");
            return Next::Wait;
        }
        let delay = self.backoff().failure(pvc.uid().unwrap_or_default());
        warn!(claim = %claim_key(pvc), error = %message, retry_in = ?delay, "provisioning failed");
        Next::RetryIn(delay)
    }
}

enum Outcome {
    /// Nothing to do for this claim now.
    Nothing,
    Provisioned {
        volume: String,
    },
    RetryIn(Duration),
}

/// What a reconcile of a claim has to do, decided from the caches alone.
enum Work {
    ReleaseFinalizer,
    Provision(Arc<StorageClass>),
    Refuse(DecisionError),
    /// Node mode: compete for an Immediate claim no node owns yet (`ownership`).
    BecomeOwner(Arc<StorageClass>),
}

/// What the plan stage leaves for the next: the plan, and the class as the driver reads it.
struct Planned {
    plan: ProvisionPlan,
    /// The UID of the class the claim names, which an infeasible CreateVolume is held against.
    class_uid: String,
    class: Arc<StorageClass>,
    /// A migrated claim's in-tree plugin, whose source its PV is given.
    migration: Option<InTreePlugin>,
    /// The claim's labels as read live, with `--copy-claim-labels` only.
    claim_labels: Option<BTreeMap<String, String>>,
}

/// What the create stage leaves for the last: CreateVolume's request (as sent) and answer.
struct Created {
    request: csi::CreateVolumeRequest,
    response: csi::CreateVolumeResponse,
}

impl ClaimReconciler {
    /// The claim and its work, or `None` (and its failure count forgotten) if it has none now.
    fn triage(&self, cached: &CachedClaim) -> Option<(PersistentVolumeClaim, Work)> {
        let ctx = &self.ctx;
        let settings = &ctx.settings;
        let pvc = cached
            .to_claim()
            .inspect_err(|error| error!(%error, "not reconciling"))
            .ok()?;
        let class = ctx.classes.get(&ObjectRef::new(claim_class_name(&pvc)));
        let registry = ctx.journal.registry();
        let in_flight = |volume: &str| registry.contains(volume);
        let mut work = if settings.draining {
            drain_claim_work(&pvc, class, &settings.config, in_flight)
        } else {
            claim_work(
                &pvc,
                class,
                &settings.config,
                settings.consistency_by_default,
                in_flight,
            )
        };
        if let Some(node) = ctx.node_scope() {
            let in_flight = has_operation_in_flight(&pvc, &settings.config, in_flight);
            work = node_claim_work(work, &pvc, &node, in_flight);
        }
        let uid = pvc.uid().unwrap_or_default();
        let work = match work {
            ClaimWork::ReleaseFinalizer => Work::ReleaseFinalizer,
            ClaimWork::Provision(class) => Work::Provision(class),
            ClaimWork::Refuse(error) => Work::Refuse(error),
            ClaimWork::BecomeOwner(class) => return Some((pvc, Work::BecomeOwner(class))),
            ClaimWork::Nothing(reason) => {
                if let Some(reason) = reason {
                    debug!(claim = %claim_key(&pvc), %reason, "not provisioning");
                }
                debug!(claim = %claim_key(&pvc), "nothing to do");
                self.backoff().forget(&uid);
                self.races().forget(&uid);
                return None;
            }
        };
        // Node mode: a race this node was in is over once the claim has other work.
        self.races().forget(&uid);
        Some((pvc, work))
    }

    /// The claim's work; a provisioning goes through four stages: plan (decide the volume),
    /// prepare the request (and record it in the journal), create the volume, persist its PV.
    async fn provision_claim(
        &self,
        pvc: &PersistentVolumeClaim,
        work: Work,
    ) -> Result<Outcome, ClaimError> {
        let ctx = &*self.ctx;
        let class = match work {
            Work::ReleaseFinalizer => {
                set_claim_finalizer(&ctx.client, pvc, false).await?;
                return Ok(Outcome::Nothing);
            }
            Work::Refuse(error) => return Err(error.into()),
            Work::BecomeOwner(class) => {
                let class = class_for_driver(class, &ctx.settings.config.driver_name)
                    .map_err(ClaimError::ClassTranslation)?
                    .class;
                return Ok(ownership::compete(pvc, &class, ctx, &self.races)
                    .await
                    .map_or(Outcome::Nothing, Outcome::RetryIn));
            }
            Work::Provision(class) => class,
        };
        let mut planned = match self.plan(pvc, class).await? {
            ControlFlow::Continue(planned) => planned,
            ControlFlow::Break(outcome) => return Ok(outcome),
        };
        // The operation stays busy until its PV is saved or its volume deleted: the reaper
        // leaves a busy operation alone (it must not replay or delete beside this call).
        let (_busy, request) = prepare(ctx, pvc, &mut planned).await?;
        let created = self.create(pvc, &planned, request).await?;
        persist(ctx, pvc, planned, created).await
    }

    /// Plans the claim's volume, unless the claim waits out an infeasible CreateVolume or its
    /// PV already exists; announces the provisioning, then fails if the plan did.
    async fn plan(
        &self,
        pvc: &PersistentVolumeClaim,
        class: Arc<StorageClass>,
    ) -> Result<ControlFlow<Outcome, Planned>, ClaimError> {
        let ctx = &*self.ctx;
        let settings = &ctx.settings;
        let uid = pvc.uid().unwrap_or_default();
        let class_uid = class.uid().unwrap_or_default();
        if let Some(left) = self.infeasible().remaining(&uid, &class_uid, now()) {
            return Ok(ControlFlow::Break(Outcome::RetryIn(left)));
        }
        let grants = sources::reference_grants(ctx, pvc).await?;
        // A claim of an in-tree class migrated to our driver is provisioned with the class as
        // the driver reads it (parameters, allowedTopologies), and its PV translated back.
        let class = class_for_driver(class, &settings.config.driver_name);
        let plan = match &class {
            Ok(driver_class) => plan_provision(
                pvc,
                &driver_class.class,
                &settings.config,
                &settings.caps,
                &grants,
            )
            .map_err(Into::into),
            Err(error) => Err(ClaimError::ClassTranslation(error.clone())),
        };
        // Read once: the two steps below must agree on whether the PV store is whole.
        let volumes_listed = has_listed(&ctx.volumes_listed);
        if let Ok(plan) = &plan
            && pv_of_the_name_exists(ctx, volumes_listed, &plan.volume_name)
            && pv_of_the_name_is_ours(ctx, volumes_listed, pvc, &plan.volume_name).await?
        {
            return Ok(ControlFlow::Break(Outcome::Nothing));
        }
        // Every attempt says so before anything about the claim is checked, as upstream's: a
        // claim refused for its parameters, its source or a populator's kind shows it too.
        ctx.events.publish(
            &pvc.object_ref(&()),
            EventType::Normal,
            PROVISIONING,
            &format!(
                "External provisioner is provisioning volume for claim \"{}\"",
                claim_key(pvc)
            ),
        );
        let mut plan = plan?;
        let DriverClass {
            class,
            plugin: migration,
            provisioned_by,
        } = class.map_err(ClaimError::ClassTranslation)?;
        if let Some(provisioned_by) = provisioned_by {
            plan.provisioned_by = provisioned_by;
        }
        let claim_labels = claim_labels(ctx, pvc).await?;
        Ok(ControlFlow::Continue(Planned {
            plan,
            class_uid,
            class,
            migration,
            claim_labels,
        }))
    }

    /// CreateVolume with the recorded request. A failure settles the journal record (kept
    /// while the volume may exist); an infeasible one slows the claim's retries, and one the
    /// driver cannot satisfy on the selected node may give the node back to the scheduler.
    async fn create(
        &self,
        pvc: &PersistentVolumeClaim,
        planned: &Planned,
        request: csi::CreateVolumeRequest,
    ) -> Result<Created, ClaimError> {
        let ctx = &*self.ctx;
        let plan = &planned.plan;
        let error = match create_volume(ctx, &plan.class_name, request.clone()).await {
            Ok(response) => return Ok(Created { request, response }),
            // This replica no longer leads: the journal is the new leader's, which may have
            // taken the operation in and sent it; settling it here would write it away.
            Err(error @ CallError::Fenced(_)) => return Err(ClaimError::Driver(error)),
            Err(error) => error,
        };
        ctx.refresh_capacity(|| RefreshCause::ProvisionFailed {
            class: plan.class_name.clone(),
        });
        let settled = ctx
            .journal
            .settle_failure(
                &plan.volume_name,
                Phase::Provisioning,
                error.may_have_created(),
                &error.to_string(),
            )
            .await;
        // Nothing that rests on the operation being over (the node given back, a new request
        // for the name) may happen before its removal is stored.
        let kept = match settled {
            Ok(kept) => kept,
            Err(journal) => return Err(ClaimError::Unsettled { error, journal }),
        };
        if error.is_infeasible() {
            let uid = pvc.uid().unwrap_or_default();
            self.infeasible().insert(&uid, &planned.class_uid, now());
            return Err(ClaimError::Infeasible(error));
        }
        if error.class() == ErrorClass::Reschedule {
            let cause = RescheduleCause::DriverExhausted {
                operation_kept: kept,
            };
            return Err(reschedule(ctx, pvc, cause, ClaimError::Driver(error)).await);
        }
        Err(ClaimError::Driver(error))
    }

    fn backoff(&self) -> MutexGuard<'_, Backoff<String>> {
        lock(&self.backoff)
    }

    fn infeasible(&self) -> MutexGuard<'_, InfeasibleSet> {
        lock(&self.infeasible)
    }

    fn races(&self) -> MutexGuard<'_, Races> {
        lock(&self.races)
    }
}

/// The CreateVolume request of a planned claim: its source protected, its topology, the
/// claim's consistency finalizer, its secrets and mutable parameters, recorded in the journal
/// before it may be sent. A claim already recorded gets the recorded request. The operation
/// is marked busy in the journal until the returned mark is dropped.
async fn prepare<'a>(
    ctx: &'a Context,
    pvc: &PersistentVolumeClaim,
    planned: &mut Planned,
) -> Result<(Busy<'a>, csi::CreateVolumeRequest), ClaimError> {
    let settings = &ctx.settings;
    let plan = &mut planned.plan;
    if !ctx.journal.registry().contains(&plan.volume_name)
        && let Some(node) = ctx.journal.other_node_holding(&plan.volume_name).await?
    {
        return Err(ClaimError::HeldByNode {
            volume: plan.volume_name.clone(),
            node,
        });
    }
    let content_source = data_source(ctx, pvc, &planned.class, plan).await?;
    let requirements = match topology_requirements(ctx, pvc, &planned.class, plan).await {
        Ok(requirements) => requirements,
        Err(ClaimError::Topology(error)) if error.reschedules() => {
            let cause = RescheduleCause::NodeWithoutCsiNode;
            return Err(reschedule(ctx, pvc, cause, error.into()).await);
        }
        Err(error) => return Err(error),
    };
    // No quorum read here: the cache may lag, but a stale claim cannot cost a volume. The
    // name is fixed by the claim UID (CreateVolume is idempotent per name), the operation is
    // journaled before the call (a claim found gone later gets its volume deleted), and a PV
    // create that meets another PV of that name deletes the new volume unless a PV uses it.
    // See docs/design.md and docs/journal.md.
    if needs_finalizer(pvc, settings.consistency_by_default, settings.draining) {
        set_claim_finalizer(&ctx.client, pvc, true).await?;
    }

    // A claim whose operation is recorded sends the recorded request with the recorded
    // secret (below); the class's Secret now (gone, or another since the class was re-created)
    // must not keep it from finishing, as no other read of the class's inputs does.
    let recorded_before = ctx.journal.registry().contains(&plan.volume_name);
    let secrets = if recorded_before {
        HashMap::new()
    } else {
        read_secret(&ctx.client, plan.secrets.provisioner.as_ref()).await?
    };
    let mutable = attributes_class_parameters(ctx, plan).await?;
    let namespace_parameters = namespace_parameters(ctx, pvc, plan).await?;
    plan.parameters.extend(namespace_parameters);
    let planned_request =
        build_create_volume_request(plan, secrets.clone(), requirements, content_source, mutable);
    let (busy, recorded) = ctx
        .journal
        .record(operation(pvc, plan, &planned_request))
        .await?;
    // The source's protection, put back if a release took it off since: required for a new
    // operation; best effort for one recorded before (rule 12: its source may be gone by now,
    // which must not keep it from finishing).
    if let Some(source) = &plan.source {
        let new_operation = planned_request.volume_content_source.is_some();
        match sources::reprotect_after_record(ctx, source).await {
            Err(error) if new_operation => return Err(error.into()),
            Err(error) => {
                debug!(claim = %claim_key(pvc), %error, "the recorded restore's source could not be protected again")
            }
            Ok(()) => {}
        }
    }
    // A retry sends what was recorded first, with that record's secret: the driver may hold a
    // volume made from it, and a changed request would only be answered ALREADY_EXISTS.
    let secrets = if !recorded_before && recorded.provisioner_secret == plan.secrets.provisioner {
        secrets
    } else {
        read_secret(&ctx.client, recorded.provisioner_secret.as_ref()).await?
    };
    let request = csi::CreateVolumeRequest {
        secrets,
        ..recorded.request
    };
    // The PV names the class the recorded mutable parameters come from, not one the claim
    // named since: the volume has that class's attributes.
    if let Some(message) = recorded_class_moved(
        plan.attributes_class.as_deref(),
        recorded.attributes_class.as_deref(),
        &plan.volume_name,
    ) {
        let claim = pvc.object_ref(&());
        ctx.events.publish(
            &claim,
            EventType::Warning,
            ATTRIBUTES_CLASS_RECORDED,
            &message,
        );
    }
    plan.attributes_class = recorded.attributes_class;
    // The PV's deletion secret is the one the volume was created with: DeleteVolume needs the
    // credentials of the request the driver acted on, not those of a class re-created since.
    plan.secrets.provisioner = recorded.provisioner_secret;
    Ok((busy, request))
}

/// Saves the created volume in its PV (in-tree for a migrated claim) and ends the operation.
/// A volume that cannot back a PV is deleted again.
async fn persist(
    ctx: &Context,
    pvc: &PersistentVolumeClaim,
    planned: Planned,
    created: Created,
) -> Result<Outcome, ClaimError> {
    let Planned {
        plan,
        migration,
        claim_labels,
        ..
    } = planned;
    let Created { request, response } = created;
    if let Some(volume) = response.volume.as_ref()
        && topology_missing(&request, volume)
    {
        ctx.events.publish(
            &pvc.object_ref(&()),
            EventType::Warning,
            NO_ACCESSIBLE_TOPOLOGY,
            &format!(
                "the driver reported no accessible topology for volume {} although it was asked for one; its PV gets no node affinity, so pods on any node may be given it",
                plan.volume_name
            ),
        );
    }
    let pv = match build_persistent_volume(&plan, &response) {
        Ok(pv) => pv,
        Err(error) => return Err(clean_up_unusable(ctx, &plan, &request, error).await),
    };
    let handle = response
        .volume
        .as_ref()
        .map(|volume| volume.volume_id.clone())
        .unwrap_or_default();
    let mut pv = match migration {
        None => pv,
        Some(plugin) => match plugin.to_in_tree(pv) {
            Ok(in_tree) => in_tree,
            Err(error) => {
                return Err(clean_up_untranslatable(ctx, &plan, &request, &handle, error).await);
            }
        },
    };
    // Last, so that a label the sidecar set (a migrated PV's zone) is never the claim's.
    copy_claim_labels(
        &mut pv,
        claim_labels.as_ref(),
        &ctx.settings.config.metadata,
    );
    // The volume takes space from here on, whether or not its PV is saved at this attempt.
    ctx.refresh_capacity(|| RefreshCause::Provisioned {
        class: plan.class_name.clone(),
        affinity: pv.spec.as_ref().and_then(|spec| spec.node_affinity.clone()),
    });
    save_volume(ctx, &plan, pv, &handle, &request).await?;
    ctx.journal.complete(&plan.volume_name);
    if let Some(source) = &plan.source {
        sources::release_snapshot(ctx, source, &pvc.uid().unwrap_or_default()).await;
    }
    ctx.events.publish(
        &pvc.object_ref(&()),
        EventType::Normal,
        PROVISIONING_SUCCEEDED,
        &format!("Successfully provisioned volume {}", plan.volume_name),
    );
    if let Some(class) = ignored_attributes_class(pvc, &ctx.settings.config) {
        ctx.events.publish(
            &pvc.object_ref(&()),
            EventType::Warning,
            ATTRIBUTES_CLASS_IGNORED,
            &format!(
                "the claim names VolumeAttributesClass {class:?} but the provisioner's VolumeAttributesClass feature gate is off, so PersistentVolume {} has no class and kube-controller-manager will not bind the claim to it",
                plan.volume_name
            ),
        );
    }
    Ok(Outcome::Provisioned {
        volume: plan.volume_name,
    })
}

/// The content source of a new CreateVolume, with the source protected by its finalizer;
/// `None` without a data source. As for topology, a claim whose operation is already recorded
/// gets `None`: the recorded request is replayed (docs/journal.md, rule 12), so the source may
/// be gone or changed since without stopping the operation from finishing.
async fn data_source(
    ctx: &Context,
    pvc: &PersistentVolumeClaim,
    class: &StorageClass,
    plan: &ProvisionPlan,
) -> Result<Option<csi::VolumeContentSource>, ClaimError> {
    let Some(source) = plan.source.as_ref() else {
        return Ok(None);
    };
    if ctx.journal.registry().contains(&plan.volume_name) {
        return Ok(None);
    }
    let content_source = sources::content_source(ctx, pvc, class, source).await?;
    sources::protect(ctx, source).await?;
    Ok(Some(content_source))
}

/// The `mutable_parameters` of a new CreateVolume: the parameters of the VolumeAttributesClass
/// the claim names, read live at every attempt as upstream (a class created after the claim is
/// found at the next retry). A claim whose operation is already recorded gets none: the
/// recorded request, with the mutable parameters it was recorded with, is what is sent
/// (docs/journal.md, rule 2).
async fn attributes_class_parameters(
    ctx: &Context,
    plan: &ProvisionPlan,
) -> Result<HashMap<String, String>, ClaimError> {
    let Some(name) = plan.attributes_class.as_deref() else {
        return Ok(HashMap::new());
    };
    if ctx.journal.registry().contains(&plan.volume_name) {
        return Ok(HashMap::new());
    }
    let class = Api::<VolumeAttributesClass>::all(ctx.client.clone())
        .get(name)
        .await
        .map_err(|error| ClaimError::AttributesClassRead(go_error_text(&error)))?;
    Ok(mutable_parameters(name, &class, &plan.driver_name)?)
}

/// The CreateVolume parameters from the claim's Namespace (`--extra-create-metadata-namespace-*`),
/// read live as upstream PR #1531 does. A claim whose operation is already recorded gets none:
/// the recorded request, with the parameters it was recorded with, is what is sent
/// (docs/journal.md, rules 2 and 18), so a namespace relabelled since changes nothing. A failed
/// read fails the attempt before anything is recorded or sent.
async fn namespace_parameters(
    ctx: &Context,
    pvc: &PersistentVolumeClaim,
    plan: &ProvisionPlan,
) -> Result<HashMap<String, String>, ClaimError> {
    let lists = &ctx.settings.config.metadata;
    if !lists.needs_namespace() || ctx.journal.registry().contains(&plan.volume_name) {
        return Ok(HashMap::new());
    }
    let name = pvc.namespace().unwrap_or_default();
    let namespace = Api::<Namespace>::all(ctx.client.clone())
        .get(&name)
        .await
        .map_err(|error| ClaimError::NamespaceRead {
            namespace: name,
            error: go_error_text(&error),
        })?;
    Ok(namespace_metadata_parameters(&namespace, lists))
}

/// The claim's labels for its PV (`--copy-claim-labels`), `None` without the flag. The claim
/// cache keeps no labels (docs/design.md, "Memory"), so the claim is read live: one GET per
/// attempt, only with the flag, before anything is recorded or sent. A claim replaced under
/// the same name (another UID) is not this claim: the attempt fails and the cache catches up.
async fn claim_labels(
    ctx: &Context,
    pvc: &PersistentVolumeClaim,
) -> Result<Option<BTreeMap<String, String>>, ClaimError> {
    if !ctx.settings.config.metadata.needs_claim_labels() {
        return Ok(None);
    }
    let claims = Api::<PersistentVolumeClaim>::namespaced(
        ctx.client.clone(),
        &pvc.namespace().unwrap_or_default(),
    );
    let live = claims
        .get(&pvc.name_any())
        .await
        .map_err(|error| ClaimError::ClaimLabelsRead(go_error_text(&error)))?;
    if live.uid() != pvc.uid() {
        return Err(ClaimError::ClaimLabelsRead(format!(
            "the claim was replaced (UID {:?}, expected {:?})",
            live.uid().unwrap_or_default(),
            pvc.uid().unwrap_or_default()
        )));
    }
    Ok(Some(live.metadata.labels.unwrap_or_default()))
}

/// The accessibility requirements of a new CreateVolume, `None` without topology. A claim
/// whose operation is already recorded gets `None` too: the recorded request is what is sent
/// (docs/journal.md, rule 2), so the Node or CSINode it was computed from may be gone since.
async fn topology_requirements(
    ctx: &Context,
    pvc: &PersistentVolumeClaim,
    class: &StorageClass,
    plan: &ProvisionPlan,
) -> Result<Option<csi::TopologyRequirement>, ClaimError> {
    let Some(cluster) = ctx.topology.as_ref() else {
        return Ok(None);
    };
    if ctx.journal.registry().contains(&plan.volume_name) {
        return Ok(None);
    }
    // A store still listing would look like a cluster without the selected node's CSINode.
    // Bounded, so that watches that can never list (RBAC of an older release) are an event
    // on the claim, not a reconcile that hangs.
    let listed = tokio::time::timeout(TOPOLOGY_LIST_WAIT, cluster.wait_until_ready()).await;
    if !listed.unwrap_or(false) {
        return Err(ClaimError::TopologyNotListed);
    }
    let name = pvc.name_any();
    let inputs = TopologyInputs {
        claim_name: &name,
        selected_node: selected_node(pvc),
        allowed_topologies: class.allowed_topologies.as_deref().unwrap_or_default(),
        strict: ctx.settings.topology.strict,
        immediate: ctx.settings.topology.immediate,
    };
    Ok(accessibility_requirements(&inputs, cluster)?)
}

/// Gives the claim's selected node back to the scheduler, keeps it, or leaves it, as
/// `provision::node_verdict` says for `cause`; returns the error to report. A failed removal
/// (the claim changed meanwhile) leaves the ordinary failure, retried with backoff, as
/// upstream.
async fn reschedule(
    ctx: &Context,
    pvc: &PersistentVolumeClaim,
    cause: RescheduleCause,
    error: ClaimError,
) -> ClaimError {
    let this_node = ctx.settings.node.as_ref().map(|node| node.name.as_str());
    let node = match node_verdict(pvc, ctx.settings.caps.topology, this_node, cause) {
        NodeVerdict::Unchanged => return error,
        NodeVerdict::Keep(node) => {
            let ClaimError::Driver(error) = error else {
                return error;
            };
            return ClaimError::NodeKept {
                node: node.to_owned(),
                error,
            };
        }
        NodeVerdict::GiveBack(node) => node,
    };
    let api: Api<PersistentVolumeClaim> =
        Api::namespaced(ctx.client.clone(), &pvc.namespace().unwrap_or_default());
    let patch = Patch::<()>::Json(reschedule_patch(pvc, node));
    match api
        .patch(&pvc.name_any(), &PatchParams::default(), &patch)
        .await
    {
        Ok(_) => ClaimError::Rescheduled {
            node: node.to_owned(),
            error: Box::new(error),
        },
        Err(failure) => {
            warn!(claim = %claim_key(pvc), node, error = %failure, "Volume rescheduling failed");
            error
        }
    }
}

/// Whether a PV named `name` may exist: the PV store says so once it has listed; before (a
/// claim provisioned while the lists still arrive) only a read can tell, so it may.
fn pv_of_the_name_exists(ctx: &Context, volumes_listed: bool, name: &str) -> bool {
    !volumes_listed || ctx.volumes.get(&ObjectRef::new(name)).is_some()
}

/// Whether the PV named like the claim's volume (which may exist, see
/// [`pv_of_the_name_exists`]) is this claim's. With names cut from part of the UID it may be
/// another claim's: then this claim gets no volume and is told why, on every attempt. `false`
/// if there is no such PV (provision).
async fn pv_of_the_name_is_ours(
    ctx: &Context,
    volumes_listed: bool,
    pvc: &PersistentVolumeClaim,
    name: &str,
) -> Result<bool, ClaimError> {
    // Only a PV the listed store holds is known to exist without a read.
    if volumes_listed && !names_may_collide(ctx.settings.config.volume_name_uuid_length) {
        return Ok(true);
    }
    let api: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let existing = api
        .get_opt(name)
        .await
        .map_err(|source| ClaimError::PvRead {
            name: name.to_owned(),
            source,
        })?;
    match existing {
        None => Ok(false),
        Some(pv)
            if pv_is_for_claim(
                &pv,
                &ctx.settings.config.driver_name,
                &pvc.uid().unwrap_or_default(),
            ) =>
        {
            Ok(true)
        }
        Some(pv) => Err(ClaimError::NameCollision {
            name: name.to_owned(),
            holder: pv_holder(&pv),
        }),
    }
}

/// A volume that cannot back a PV (too small) is deleted again, as upstream does; a response
/// without a volume id leaves the operation in flight so the next attempt learns the id.
async fn clean_up_unusable(
    ctx: &Context,
    plan: &ProvisionPlan,
    request: &csi::CreateVolumeRequest,
    error: CreateResponseError,
) -> ClaimError {
    let Some(volume_id) = error.volume_to_delete().map(str::to_owned) else {
        return ClaimError::Volume(error);
    };
    match delete_unused(ctx, plan, request, &volume_id).await {
        Ok(()) => ClaimError::Volume(error),
        Err(cleanup) => ClaimError::CleanupFailed {
            error,
            volume: plan.volume_name.clone(),
            cleanup,
        },
    }
}

/// A migrated claim's volume whose PV cannot be translated to the in-tree source is deleted
/// again, under its journal record: the record goes only once DeleteVolume has succeeded, so
/// a failed or interrupted deletion is repeated by the next attempt (which replays the
/// recorded CreateVolume and fails the same way) or, if the claim is gone, by the reaper.
async fn clean_up_untranslatable(
    ctx: &Context,
    plan: &ProvisionPlan,
    request: &csi::CreateVolumeRequest,
    handle: &str,
    error: MigrationError,
) -> ClaimError {
    let volume = plan.volume_name.clone();
    match delete_unused(ctx, plan, request, handle).await {
        Ok(()) => ClaimError::BackTranslation { volume, error },
        Err(cleanup) => ClaimError::BackTranslationCleanup {
            volume,
            error,
            cleanup,
        },
    }
}

/// Why a volume just created and not saved in a PV was not deleted again; the operation
/// stays in flight, so the next attempt (or the reaper) tries again.
#[derive(Debug, Error)]
pub enum CleanupError {
    #[error("{0}")]
    Driver(CallError),
    #[error("failed to read PersistentVolume {name}: {source}")]
    PvRead { name: String, source: kube::Error },
    #[error(
        "whether PersistentVolume {pv} references the volume cannot be told ({error}); it is not deleted"
    )]
    HolderUnknown { pv: String, error: MigrationError },
}

/// Deletes the volume `handle` that an attempt created but cannot save, unless the PV named
/// like the claim's volume (a quorum read: an earlier attempt, or a claim of a colliding
/// name, may have saved it) references it. Either way the operation is over; a PV that
/// cannot be told about keeps it in flight.
async fn delete_unused(
    ctx: &Context,
    plan: &ProvisionPlan,
    request: &csi::CreateVolumeRequest,
    handle: &str,
) -> Result<(), CleanupError> {
    let api: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let name = &plan.volume_name;
    let existing = api
        .get_opt(name)
        .await
        .map_err(|source| CleanupError::PvRead {
            name: name.clone(),
            source,
        })?;
    let node = ctx.settings.node.as_ref().map(NodeDeployment::scope);
    let holding = existing.as_ref().map_or(Holding::DoesNotHold, |pv| {
        pv_holds_volume(pv, &ctx.settings.config.driver_name, handle, node.as_ref())
    });
    match holding {
        Holding::DoesNotHold => {
            delete_volume(ctx, &plan.class_name, handle, request.secrets.clone())
                .await
                .map_err(CleanupError::Driver)?;
        }
        Holding::Holds => {
            info!(
                volume = name,
                handle, "not deleted: its PersistentVolume references it"
            );
        }
        Holding::Unknown(error) => {
            return Err(CleanupError::HolderUnknown {
                pv: name.clone(),
                error,
            });
        }
    }
    ctx.journal.complete(name);
    Ok(())
}

/// Creates the PV. AlreadyExists is success only when the existing PV holds this very volume;
/// otherwise the volume just created (`handle`) is nobody's and is deleted (upstream #1469
/// leaks it).
async fn save_volume(
    ctx: &Context,
    plan: &ProvisionPlan,
    pv: PersistentVolume,
    handle: &str,
    request: &csi::CreateVolumeRequest,
) -> Result<(), ClaimError> {
    let api: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let handle = handle.to_owned();
    let name = plan.volume_name.clone();
    // The stored PV is not needed: its answer is not read (`write_unread`).
    let created = match serde_json::to_vec(&pv) {
        Ok(body) => Request::new(api.resource_url())
            .create(&PostParams::default(), body)
            .map_err(kube::Error::BuildRequest),
        Err(error) => Err(kube::Error::SerdeError(error)),
    };
    let created = match created {
        Ok(request) => protobuf::write_unread(&ctx.client, request).await,
        Err(error) => Err(error),
    };
    match created {
        Ok(()) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => {
            let existing = api
                .get(&name)
                .await
                .map_err(|source| ClaimError::PvCreate {
                    name: name.clone(),
                    source,
                })?;
            let node = ctx.settings.node.as_ref().map(NodeDeployment::scope);
            let verdict = existing_pv(&existing, &pv, node.as_ref());
            match verdict {
                ExistingPv::Ours => return Ok(()),
                // The operation stays: once the PV is gone, its claim (gone too by then) hands
                // it to the reaper, which replays and deletes the volume.
                ExistingPv::BeingDeleted => {
                    return Err(ClaimError::PvBeingDeleted { name: name.clone() });
                }
                ExistingPv::HoldsTheVolume | ExistingPv::Other => {}
            }
            let error = pv_conflict(&existing, name.clone(), handle.clone(), verdict);
            if verdict == ExistingPv::Other {
                delete_volume(ctx, &plan.class_name, &handle, request.secrets.clone())
                    .await
                    .map_err(ClaimError::Driver)?;
            }
            // A PV holds the volume, or it is deleted: either way the operation is over.
            ctx.journal.complete(&name);
            Err(error)
        }
        Err(source) => Err(ClaimError::PvCreate { name, source }),
    }
}

/// The error for a PV name taken by `existing`, whose verdict is not `Ours`.
fn pv_conflict(
    existing: &PersistentVolume,
    name: String,
    created: String,
    verdict: ExistingPv,
) -> ClaimError {
    let spec = existing.spec.as_ref();
    if verdict == ExistingPv::HoldsTheVolume {
        return ClaimError::VolumeInUse {
            name,
            volume: created,
            holder: pv_holder(existing),
        };
    }
    ClaimError::PvTaken {
        name,
        existing: spec
            .and_then(|spec| spec.csi.as_ref())
            .map(|csi| csi.volume_handle.clone())
            .unwrap_or_default(),
        created,
    }
}

/// The claim a PV is bound or pre-bound to, for messages: `claim <namespace>/<name>`.
fn pv_holder(pv: &PersistentVolume) -> String {
    pv.spec
        .as_ref()
        .and_then(|spec| spec.claim_ref.as_ref())
        .map_or_else(
            || "no claim".to_owned(),
            |claim| {
                format!(
                    "claim {}/{}",
                    claim.namespace.as_deref().unwrap_or_default(),
                    claim.name.as_deref().unwrap_or_default()
                )
            },
        )
}

fn operation(
    pvc: &PersistentVolumeClaim,
    plan: &ProvisionPlan,
    request: &csi::CreateVolumeRequest,
) -> Operation {
    Operation {
        volume_name: plan.volume_name.clone(),
        claim_namespace: pvc.namespace().unwrap_or_default(),
        claim_name: pvc.name_any(),
        claim_uid: pvc.uid().unwrap_or_default(),
        class_name: plan.class_name.clone(),
        request: csi::CreateVolumeRequest {
            secrets: HashMap::new(),
            ..request.clone()
        },
        provisioner_secret: plan.secrets.provisioner.clone(),
        attributes_class: plan.attributes_class.clone(),
        known_volume_id: None,
    }
}

/// Now, by tokio's clock: the same instant as `Instant::now()`, but the unit tests pause and
/// advance it to check the slow retry of infeasible claims.
fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// The `source` label of the provisioning metrics: the claim's data source kind, or "".
fn data_source_kind(pvc: &PersistentVolumeClaim) -> &str {
    pvc.spec
        .as_ref()
        .and_then(|spec| spec.data_source.as_ref())
        .map_or("", |source| source.kind.as_str())
}

#[cfg(test)]
mod tests;
