//! The claim reconciler: turns a claim that names our driver into a backend volume and a
//! pre-bound PV. Decisions come from `crate::provision` (what work a claim needs:
//! [`claim_work`]); this module only fetches what they need, calls the driver and the API
//! server, and maps every failure to one event and one metric in
//! [`ClaimReconciler::report_failure`].

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::measured::Next;
use futures::future::{self, Either};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{StorageClass, VolumeAttributesClass};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use thiserror::Error;
use tracing::{debug, error, info, warn};

use super::actions::{
    ClaimFinalizerError, SecretReadError, claim_key, create_volume, delete_volume, read_secret,
    set_claim_finalizer,
};
use super::cache::CachedClaim;
use super::context::{Context, NodeDeployment};
use super::events::EventType;
use super::ownership;
use super::sources::{self, SourceError};
use crate::csi;
use crate::csi_client::{CallError, ErrorClass, migrated_calls};
use crate::journal::{JournalError, Operation, Phase};
use crate::kube_client::go_error_text;
use crate::provision::storage_capacity::RefreshCause;
use crate::provision::{
    AttributesClassError, ClaimWork, CreateResponseError, DecisionError, DriverClass, ExistingPv,
    Holding, MigrationError, NodeVerdict, ProvisionError, ProvisionPlan, RescheduleCause,
    TopologyError, TopologyInputs, accessibility_requirements, build_create_volume_request,
    build_persistent_volume, claim_class_name, claim_work, class_for_driver, drain_claim_work,
    existing_pv, has_operation_in_flight, ignored_attributes_class, migrated_plugin,
    mutable_parameters, names_may_collide, needs_finalizer, node_claim_work, node_verdict,
    plan_provision, pv_holds_volume, pv_is_for_claim, recorded_class_moved, reschedule_patch,
    selected_node, topology_missing,
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
    #[error("{0}")]
    Driver(CallError),
    /// The attempt failed on the selected node, which was given back to the scheduler: the
    /// text is the failure's, as upstream's event.
    #[error("{error}")]
    Rescheduled {
        node: String,
        error: Box<ClaimError>,
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

/// The claim reconciler of one sidecar process.
pub struct ClaimReconciler;

impl ClaimReconciler {
    /// Entry point for the controller: never returns an error, because failures are reported
    /// (event + metric) and retried with the per-claim backoff here, in one place.
    ///
    /// The controller only queues claims that [`Self::has_work`], but a claim's work may be
    /// gone by the time it runs: decided again here, without IO, and only a claim with work
    /// allocates the provisioning future (16 KiB in a debug build).
    pub fn reconcile(
        cached: Arc<CachedClaim>,
        ctx: Arc<Context>,
    ) -> impl Future<Output = Result<Next, std::convert::Infallible>> + Send + 'static {
        match triage(&cached, &ctx) {
            Some((pvc, work)) => Either::Right(Box::pin(Self::act(pvc, ctx, work))),
            None => Either::Left(future::ready(Ok(Next::Wait))),
        }
    }

    /// Whether a reconcile of this claim would have anything to do now. Nearly every cached
    /// claim has none; keeping them out of the controller's queue keeps that queue, whose
    /// memory is never given back, as small as the work.
    pub fn has_work(cached: &CachedClaim, ctx: &Context) -> bool {
        triage(cached, ctx).is_some()
    }

    async fn act(
        pvc: PersistentVolumeClaim,
        ctx: Arc<Context>,
        work: Work,
    ) -> Result<Next, std::convert::Infallible> {
        let uid = pvc.uid().unwrap_or_default();
        let started = Instant::now();
        let migrated = matches!(&work, Work::Provision(class)
            if migrated_plugin(class, &ctx.config.driver_name).is_some());
        match migrated_calls(migrated, provision_claim(&pvc, &ctx, work)).await {
            Ok(outcome) => {
                ctx.claim_backoff().forget(&uid);
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
            Err(error) => Ok(Self::report_failure(&pvc, &ctx, error)),
        }
    }

    /// The single mapping of claim failures to events, metrics and retry timing.
    fn report_failure(pvc: &PersistentVolumeClaim, ctx: &Context, error: ClaimError) -> Next {
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
            ctx.claim_backoff().forget(&pvc.uid().unwrap_or_default());
            info!(claim = %claim_key(pvc), node, error = %message, "selected node given back to the scheduler");
            return Next::Wait;
        }
        let delay = ctx.claim_backoff().failure(pvc.uid().unwrap_or_default());
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

/// The claim and its work, or `None` (and its failure count forgotten) if it has none now.
fn triage(cached: &CachedClaim, ctx: &Context) -> Option<(PersistentVolumeClaim, Work)> {
    let pvc = cached
        .to_claim()
        .inspect_err(|error| error!(%error, "not reconciling"))
        .ok()?;
    let class = ctx.classes.get(&ObjectRef::new(claim_class_name(&pvc)));
    let registry = ctx.journal.registry();
    let in_flight = |volume: &str| registry.contains(volume);
    let mut work = if ctx.draining {
        drain_claim_work(&pvc, class, &ctx.config, in_flight)
    } else {
        claim_work(
            &pvc,
            class,
            &ctx.config,
            ctx.consistency_by_default,
            in_flight,
        )
    };
    if let Some(node) = ctx.node_scope() {
        let in_flight = has_operation_in_flight(&pvc, &ctx.config, in_flight);
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
            ctx.claim_backoff().forget(&uid);
            ctx.races().forget(&uid);
            return None;
        }
    };
    // Node mode: a race this node was in is over once the claim has other work.
    ctx.races().forget(&uid);
    Some((pvc, work))
}

async fn provision_claim(
    pvc: &PersistentVolumeClaim,
    ctx: &Context,
    work: Work,
) -> Result<Outcome, ClaimError> {
    let class = match work {
        Work::ReleaseFinalizer => {
            set_claim_finalizer(&ctx.client, pvc, false).await?;
            return Ok(Outcome::Nothing);
        }
        Work::Refuse(error) => return Err(error.into()),
        Work::BecomeOwner(class) => {
            let class = class_for_driver(class, &ctx.config.driver_name)
                .map_err(ClaimError::ClassTranslation)?
                .class;
            return Ok(ownership::compete(pvc, &class, ctx)
                .await
                .map_or(Outcome::Nothing, Outcome::RetryIn));
        }
        Work::Provision(class) => class,
    };
    let uid = pvc.uid().unwrap_or_default();
    let class_uid = class.uid().unwrap_or_default();
    if let Some(left) = ctx.infeasible().remaining(&uid, &class_uid, now()) {
        return Ok(Outcome::RetryIn(left));
    }
    let grants = sources::reference_grants(ctx, pvc).await?;
    // A claim of an in-tree class migrated to our driver is provisioned with the class as the
    // driver reads it (parameters, allowedTopologies), and its PV translated back.
    let class = class_for_driver(class, &ctx.config.driver_name);
    let plan = match &class {
        Ok(driver_class) => {
            plan_provision(pvc, &driver_class.class, &ctx.config, &ctx.caps, &grants)
                .map_err(Into::into)
        }
        Err(error) => Err(ClaimError::ClassTranslation(error.clone())),
    };
    if let Ok(plan) = &plan
        && ctx
            .volumes
            .get(&ObjectRef::new(&plan.volume_name))
            .is_some()
        && pv_of_the_name_is_ours(ctx, pvc, &plan.volume_name).await?
    {
        return Ok(Outcome::Nothing);
    }
    // Every attempt says so before anything about the claim is checked, as upstream's: a claim
    // refused for its parameters, its source or a populator's kind shows it too.
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
    let content_source = data_source(ctx, pvc, &class, &plan).await?;
    let requirements = match topology_requirements(ctx, pvc, &class, &plan).await {
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
    if needs_finalizer(pvc, ctx.consistency_by_default, ctx.draining) {
        set_claim_finalizer(&ctx.client, pvc, true).await?;
    }

    let secrets = read_secret(&ctx.client, plan.secrets.provisioner.as_ref()).await?;
    let mutable = attributes_class_parameters(ctx, &plan).await?;
    let planned = build_create_volume_request(
        &plan,
        secrets.clone(),
        requirements,
        content_source,
        mutable,
    );
    let (_busy, recorded) = ctx.journal.record(operation(pvc, &plan, &planned)).await?;
    // A retry sends what was recorded first, with that record's secret: the driver may hold a
    // volume made from it, and a changed request would only be answered ALREADY_EXISTS.
    let secrets = if recorded.provisioner_secret == plan.secrets.provisioner {
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

    let response = match create_volume(ctx, &plan.class_name, request.clone()).await {
        Ok(response) => response,
        Err(error) => {
            ctx.refresh_capacity(|| RefreshCause::ProvisionFailed {
                class: plan.class_name.clone(),
            });
            let kept = ctx.journal.settle_failure(
                &plan.volume_name,
                Phase::Provisioning,
                error.may_have_created(),
                &error.to_string(),
            );
            if error.is_infeasible() {
                ctx.infeasible().insert(&uid, &class_uid, now());
                return Err(ClaimError::Infeasible(error));
            }
            if error.class() == ErrorClass::Reschedule {
                let cause = RescheduleCause::DriverExhausted {
                    operation_kept: kept,
                };
                return Err(reschedule(ctx, pvc, cause, ClaimError::Driver(error)).await);
            }
            return Err(ClaimError::Driver(error));
        }
    };

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
    let pv = match migration {
        None => pv,
        Some(plugin) => match plugin.to_in_tree(pv) {
            Ok(in_tree) => in_tree,
            Err(error) => {
                return Err(clean_up_untranslatable(ctx, &plan, &request, &handle, error).await);
            }
        },
    };
    // The volume takes space from here on, whether or not its PV is saved at this attempt.
    ctx.refresh_capacity(|| RefreshCause::Provisioned {
        class: plan.class_name.clone(),
        affinity: pv.spec.as_ref().and_then(|spec| spec.node_affinity.clone()),
    });
    save_volume(ctx, &plan, pv, &handle, &request).await?;
    ctx.journal.complete(&plan.volume_name);
    if let Some(source) = &plan.source {
        sources::release_snapshot(ctx, source).await;
    }
    ctx.events.publish(
        &pvc.object_ref(&()),
        EventType::Normal,
        PROVISIONING_SUCCEEDED,
        &format!("Successfully provisioned volume {}", plan.volume_name),
    );
    if let Some(class) = ignored_attributes_class(pvc, &ctx.config) {
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
        strict: ctx.topology_flags.strict,
        immediate: ctx.topology_flags.immediate,
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
    let this_node = ctx.node.as_ref().map(|node| node.name.as_str());
    let node = match node_verdict(pvc, ctx.caps.topology, this_node, cause) {
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

/// Whether the PV named like the claim's volume, which the cache holds, is this claim's. With
/// names cut from part of the UID it may be another claim's: then this claim gets no volume
/// and is told why, on every attempt. `false` if the PV has gone meanwhile (provision).
async fn pv_of_the_name_is_ours(
    ctx: &Context,
    pvc: &PersistentVolumeClaim,
    name: &str,
) -> Result<bool, ClaimError> {
    if !names_may_collide(ctx.config.volume_name_uuid_length) {
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
            if pv_is_for_claim(&pv, &ctx.config.driver_name, &pvc.uid().unwrap_or_default()) =>
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
    let node = ctx.node.as_ref().map(NodeDeployment::scope);
    let holding = existing.as_ref().map_or(Holding::DoesNotHold, |pv| {
        pv_holds_volume(pv, &ctx.config.driver_name, handle, node.as_ref())
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
    match api.create(&PostParams::default(), &pv).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => {
            let existing = api
                .get(&name)
                .await
                .map_err(|source| ClaimError::PvCreate {
                    name: name.clone(),
                    source,
                })?;
            let node = ctx.node.as_ref().map(NodeDeployment::scope);
            let verdict = existing_pv(&existing, &pv, node.as_ref());
            if verdict == ExistingPv::Ours {
                return Ok(());
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
mod tests {
    use k8s_openapi::api::core::v1::GCEPersistentDiskVolumeSource;
    use serde_json::{Value, json};
    use tonic::Status;

    use super::*;
    use crate::controller::fixtures::{
        CLAIM_PATH, Cluster, CreateVolumeCall, GIB, RETRY_MAX, RETRY_START, SECRETS, Scenario,
        Step, bounded, cached, claim_volume, claim_volume_path, create_volume, created,
        delete_volume, get, journal_created, journal_path, journal_replaced, patch, post, put,
        recorded_operation, secret_read, shard, shard_path, strings,
    };
    use crate::journal::OperationRecord;
    use crate::provision::fixtures::{ClassBuilder, DRIVER, PVC_UID, PvBuilder, PvcBuilder};
    use crate::provision::{
        ANN_MIGRATED_TO, ANN_PROVISIONING_CONSISTENCY, ANN_SELECTED_NODE, ANN_STORAGE_PROVISIONER,
        CLONE_PROTECTION_FINALIZER, PROVISIONING_FINALIZER, SNAPSHOT_PROTECTION_FINALIZER,
    };

    const CLAIM_EVENT: &str = "PersistentVolumeClaim/data";

    /// Our claim `apps/data` of class `standard`, 1Gi, waiting for a volume.
    fn claim() -> PvcBuilder {
        PvcBuilder::new()
            .annotation(ANN_STORAGE_PROVISIONER, DRIVER)
            .resource_version("7")
    }

    /// The caches know class `standard`, with a driver parameter and a provisioner secret.
    fn cluster() -> Cluster {
        Cluster::new().class(
            ClassBuilder::new()
                .parameter("type", "fast")
                .parameter("csi.storage.k8s.io/provisioner-secret-name", "creds")
                .parameter("csi.storage.k8s.io/provisioner-secret-namespace", "apps")
                .build(),
        )
    }

    /// The journal record of the claim's operation, as first written.
    fn record_written() -> Step {
        journal_created(json!([our_record()]))
    }

    fn our_record() -> Value {
        json!({
            "volumeName": claim_volume(),
            "claim": "apps/data",
            "claimUid": PVC_UID,
            "storageClass": "standard",
            "phase": "Provisioning",
            "attempts": 0,
        })
    }

    /// The class's parameter without the secret keys; the Secret's data as secrets.
    fn expected_create() -> CreateVolumeCall {
        CreateVolumeCall {
            name: claim_volume(),
            required_bytes: GIB,
            parameters: strings(&[("type", "fast")]),
            secrets: strings(SECRETS),
            accessibility: None,
            content_source: None,
            mutable_parameters: HashMap::new(),
        }
    }

    fn pv_created() -> Step {
        post("/api/v1/persistentvolumes")
            .body(json!({
                "metadata": { "name": claim_volume() },
                "spec": {
                    "capacity": { "storage": "1Gi" },
                    "csi": { "driver": DRIVER, "volumeHandle": "vol-1" },
                    "claimRef": { "namespace": "apps", "name": "data", "uid": PVC_UID },
                    "storageClassName": "standard",
                },
            }))
            .echo(201)
    }

    fn record_removed() -> Step {
        journal_replaced(json!([]))
    }

    fn provisioning() -> String {
        format!(
            "{CLAIM_EVENT} Normal Provisioning: External provisioner is provisioning volume for claim \"apps/data\""
        )
    }

    fn succeeded() -> String {
        format!(
            "{CLAIM_EVENT} Normal ProvisioningSucceeded: Successfully provisioned volume {}",
            claim_volume()
        )
    }

    fn failed(message: &str) -> String {
        format!("{CLAIM_EVENT} Warning ProvisioningFailed: {message}")
    }

    async fn reconcile(scenario: &Scenario, pvc: PersistentVolumeClaim) -> Next {
        let Ok(action) = bounded(ClaimReconciler::reconcile(
            Arc::new(cached(&pvc)),
            scenario.ctx(),
        ))
        .await;
        action
    }

    fn in_flight(scenario: &Scenario) -> bool {
        scenario.ctx().journal.registry().contains(&claim_volume())
    }

    #[tokio::test(start_paused = true)]
    async fn provisioned() {
        let scenario = cluster()
            .start([
                secret_read(),
                record_written(),
                create_volume(expected_create(), created("vol-1", GIB)),
                pv_created(),
                record_removed(),
            ])
            .await;
        assert_eq!(reconcile(&scenario, claim().build()).await, Next::Wait);
        assert!(!in_flight(&scenario));
        assert_eq!(scenario.finish().await, [provisioning(), succeeded()]);
    }

    const GCE: &str = "pd.csi.storage.gke.io";

    /// A claim of in-tree class `standard` (`kubernetes.io/gce-pd`), as kube-controller-manager
    /// annotates it for the driver `pd.csi.storage.gke.io`.
    fn migrated() -> (Cluster, PersistentVolumeClaim) {
        let class = ClassBuilder::new()
            .provisioner("kubernetes.io/gce-pd")
            .parameter("fstype", "ext4")
            .parameter("type", "pd-ssd")
            .build();
        let pvc = PvcBuilder::new()
            .annotation(ANN_STORAGE_PROVISIONER, GCE)
            .annotation(ANN_MIGRATED_TO, GCE)
            .resource_version("7")
            .build();
        (Cluster::new().driver(GCE).class(class), pvc)
    }

    fn migrated_create() -> CreateVolumeCall {
        CreateVolumeCall {
            parameters: strings(&[("type", "pd-ssd")]),
            secrets: HashMap::new(),
            ..expected_create()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_migrated_claim_is_provisioned_with_the_translated_class_and_an_in_tree_pv() {
        let (cluster, pvc) = migrated();
        let handle = format!("projects/p/zones/us-central1-a/disks/{}", claim_volume());
        let scenario = cluster
            .start([
                record_written(),
                create_volume(migrated_create(), created(&handle, GIB)),
                post("/api/v1/persistentvolumes")
                    .body(json!({
                        "metadata": {
                            "name": claim_volume(),
                            "annotations": { "pv.kubernetes.io/provisioned-by": "kubernetes.io/gce-pd" },
                        },
                        "spec": {
                            "gcePersistentDisk": { "pdName": claim_volume(), "fsType": "ext4" },
                            "claimRef": { "namespace": "apps", "name": "data", "uid": PVC_UID },
                        },
                    }))
                    .echo(201),
                record_removed(),
            ])
            .await;
        assert_eq!(reconcile(&scenario, pvc).await, Next::Wait);
        assert_eq!(scenario.finish().await, [provisioning(), succeeded()]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_migrated_volume_whose_pv_cannot_be_translated_is_deleted_under_its_record() {
        let (cluster, pvc) = migrated();
        let scenario = cluster
            .start([
                record_written(),
                create_volume(migrated_create(), created("vol-1", GIB)),
                get(claim_volume_path()).refuse(404, "NotFound"),
                delete_volume("vol-1", &[], Err(Status::unavailable("driver restarting"))),
            ])
            .await;
        assert_eq!(
            reconcile(&scenario, pvc.clone()).await,
            Next::RetryIn(RETRY_START)
        );
        // The failed deletion keeps the record: the volume is not forgotten.
        assert!(in_flight(&scenario));
        let mut events = scenario.finish().await;
        assert_eq!(events.remove(0), provisioning());
        assert!(
            events[0].contains("deleting the volume failed, it is retried"),
            "{events:?}"
        );

        // A PV of the name holding another volume (an in-tree source cannot hold this handle).
        let (cluster, pvc) = migrated();
        let other = PvBuilder::new()
            .name(&claim_volume())
            .no_csi()
            .map(|pv| {
                if let Some(spec) = pv.spec.as_mut() {
                    spec.gce_persistent_disk = Some(GCEPersistentDiskVolumeSource {
                        pd_name: "vol-1".to_owned(),
                        ..Default::default()
                    });
                }
            })
            .build();
        let scenario = cluster
            .start([
                record_written(),
                create_volume(migrated_create(), created("vol-1", GIB)),
                get(claim_volume_path()).answer(200, other),
                delete_volume("vol-1", &[], Ok(())),
                record_removed(),
            ])
            .await;
        assert_eq!(reconcile(&scenario, pvc).await, Next::RetryIn(RETRY_START));
        assert!(!in_flight(&scenario));
        assert_eq!(
            scenario.finish().await,
            [
                provisioning(),
                failed(&format!(
                    "failed to translate the CSI PV of volume {} to in-tree: failed to get id components.Got: 1, wanted 6 components or more. ; the volume was deleted",
                    claim_volume()
                ))
            ]
        );
    }

    /// The untranslatable volume is deleted only if no PV of its name references it: one that
    /// does (an earlier attempt's, or a colliding claim's) keeps it and ends the operation.
    #[tokio::test(start_paused = true)]
    async fn an_untranslatable_volume_that_a_pv_references_is_not_deleted() {
        let (cluster, pvc) = migrated();
        let holder = PvBuilder::new()
            .name(&claim_volume())
            .csi_driver(GCE)
            .handle("vol-1")
            .build();
        let scenario = cluster
            .start([
                record_written(),
                create_volume(migrated_create(), created("vol-1", GIB)),
                get(claim_volume_path()).answer(200, holder),
                record_removed(),
            ])
            .await;
        assert_eq!(reconcile(&scenario, pvc).await, Next::RetryIn(RETRY_START));
        assert!(!in_flight(&scenario));
        let events = scenario.finish().await;
        assert_eq!(events.len(), 2, "{events:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_migrated_class_that_cannot_be_translated_is_reported_before_anything_is_sent() {
        let (cluster, pvc) = migrated();
        let class = ClassBuilder::new()
            .provisioner("kubernetes.io/gce-pd")
            .parameter("zone", "z")
            .build();
        let mut class = class;
        class.allowed_topologies = Some(vec![Default::default()]);
        let scenario = cluster.class(class).start([]).await;
        assert_eq!(reconcile(&scenario, pvc).await, Next::RetryIn(RETRY_START));
        assert_eq!(
            scenario.finish().await,
            [
                provisioning(),
                failed(
                    "failed to translate storage class: cannot simultaneously set allowed topologies and zone/zones parameters"
                )
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_drain_sends_nothing_for_a_claim_it_has_not_recorded() {
        let pvc = claim()
            .annotation(ANN_PROVISIONING_CONSISTENCY, "enable")
            .build();
        let scenario = cluster().draining().start([]).await;
        assert!(!ClaimReconciler::has_work(&cached(&pvc), &scenario.ctx()));
        assert_eq!(reconcile(&scenario, pvc).await, Next::Wait);
        assert_eq!(scenario.finish().await, Vec::<String>::new());
    }

    #[tokio::test(start_paused = true)]
    async fn a_drain_takes_our_finalizer_off_a_claim_with_nothing_in_flight() {
        let pvc = claim()
            .annotation(ANN_PROVISIONING_CONSISTENCY, "enable")
            .finalizer(PROVISIONING_FINALIZER)
            .build();
        let mut released = pvc.clone();
        released.metadata.finalizers = None;
        let scenario = cluster()
            .draining()
            .start([patch(CLAIM_PATH)
                .body(json!([
                    { "op": "test", "path": "/metadata/uid", "value": PVC_UID },
                    { "op": "test", "path": "/metadata/finalizers/0", "value": PROVISIONING_FINALIZER },
                    { "op": "remove", "path": "/metadata/finalizers/0" },
                ]))
                .answer(200, released)])
            .await;
        assert_eq!(reconcile(&scenario, pvc).await, Next::Wait);
        assert_eq!(scenario.finish().await, Vec::<String>::new());
    }

    #[tokio::test(start_paused = true)]
    async fn a_drain_finishes_a_recorded_operation_without_adding_our_finalizer() {
        let pvc = claim()
            .annotation(ANN_PROVISIONING_CONSISTENCY, "enable")
            .build();
        let scenario = cluster()
            .draining()
            .journaled(recorded_operation())
            .start([
                secret_read(),
                create_volume(expected_create(), created("vol-1", GIB)),
                pv_created(),
                record_removed(),
            ])
            .await;
        assert_eq!(reconcile(&scenario, pvc).await, Next::Wait);
        assert!(!in_flight(&scenario));
        assert_eq!(scenario.finish().await, [provisioning(), succeeded()]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_consistency_finalizer_is_added_before_anything_else() {
        let pvc = claim()
            .annotation(ANN_PROVISIONING_CONSISTENCY, "enable")
            .build();
        let mut stored = pvc.clone();
        stored.metadata.finalizers = Some(vec![PROVISIONING_FINALIZER.to_owned()]);
        let scenario = cluster()
            .start([
                patch(CLAIM_PATH)
                    .body(json!({
                        "metadata": { "finalizers": [PROVISIONING_FINALIZER], "resourceVersion": "7" }
                    }))
                    .answer(200, stored),
                secret_read(),
                record_written(),
                create_volume(expected_create(), created("vol-1", GIB)),
                pv_created(),
                record_removed(),
            ])
            .await;
        assert_eq!(reconcile(&scenario, pvc).await, Next::Wait);
        assert_eq!(scenario.finish().await, [provisioning(), succeeded()]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_final_error_after_a_lost_answer_keeps_the_record() {
        let timeout = "rpc error: code = DeadlineExceeded desc = still creating";
        let internal = "rpc error: code = Internal desc = backend hiccup";
        let mut noted = our_record();
        noted["attempts"] = json!(2);
        noted["lastError"] = json!(internal);
        let scenario = cluster()
            .start([
                secret_read(),
                record_written(),
                create_volume(
                    expected_create(),
                    Err(Status::deadline_exceeded("still creating")),
                ),
                secret_read(),
                create_volume(expected_create(), Err(Status::internal("backend hiccup"))),
                // Both failures noted, written when the journal is dropped; no removal.
                journal_replaced(json!([noted])),
            ])
            .await;
        assert_eq!(
            reconcile(&scenario, claim().build()).await,
            Next::RetryIn(RETRY_START)
        );
        assert_eq!(
            reconcile(&scenario, claim().build()).await,
            Next::RetryIn(RETRY_START * 2)
        );
        assert!(
            in_flight(&scenario),
            "the first attempt may have created the volume"
        );
        assert_eq!(
            scenario.finish().await,
            [
                provisioning(),
                failed(timeout),
                provisioning(),
                failed(internal)
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_whose_volume_name_is_another_claims_operation_sends_nothing() {
        let theirs = Operation {
            volume_name: claim_volume(),
            claim_namespace: "apps".to_owned(),
            claim_name: "other".to_owned(),
            claim_uid: "uid-of-another-claim".to_owned(),
            class_name: "standard".to_owned(),
            request: csi::CreateVolumeRequest::default(),
            provisioner_secret: None,
            attributes_class: None,
        };
        let scenario = cluster().journaled(theirs).start([secret_read()]).await;
        assert_eq!(
            reconcile(&scenario, claim().build()).await,
            Next::RetryIn(RETRY_START)
        );
        let taken = format!(
            "failed to record the operation in the journal: volume name {} is already taken by an operation of claim apps/other (uid uid-of-another-claim); no volume is created for this claim",
            claim_volume()
        );
        assert_eq!(scenario.finish().await, [provisioning(), failed(&taken)]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_replica_that_cannot_prove_it_leads_sends_no_create_volume() {
        let scenario = cluster()
            .fenced()
            .start([secret_read(), record_written(), record_removed()])
            .await;
        assert_eq!(
            reconcile(&scenario, claim().build()).await,
            Next::RetryIn(RETRY_START)
        );
        assert!(!in_flight(&scenario), "nothing was sent");
        assert_eq!(
            scenario.finish().await,
            [
                provisioning(),
                failed(
                    "rpc error: code = Unavailable desc = not sent: this replica's leadership is not proven (last Lease renewal: none while leading); another replica may lead"
                )
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_final_error_drops_the_record_and_retries_slowly() {
        let scenario = cluster()
            .start([
                secret_read(),
                record_written(),
                create_volume(
                    expected_create(),
                    Err(Status::invalid_argument("type fast is unknown")),
                ),
                // Written once nothing more urgent came for 5 seconds.
                record_removed(),
                // The slow retry, once --retry-interval-max has passed.
                secret_read(),
                journal_replaced(json!([our_record()])),
                create_volume(expected_create(), created("vol-1", GIB)),
                pv_created(),
                record_removed(),
            ])
            .await;
        assert_eq!(
            reconcile(&scenario, claim().build()).await,
            Next::RetryIn(RETRY_START)
        );
        assert!(!in_flight(&scenario), "the driver created nothing");
        assert_eq!(
            reconcile(&scenario, claim().build()).await,
            Next::RetryIn(RETRY_MAX),
            "an infeasible claim waits, whatever its backoff"
        );
        // Virtual time: the clock is paused, so this lets every timer due meanwhile fire, in
        // order (the journal's lazy flush among them), and returns at once.
        tokio::time::sleep(RETRY_MAX).await;
        assert_eq!(reconcile(&scenario, claim().build()).await, Next::Wait);
        let infeasible = failed(
            "Volume provisioning failed with infeasible error. Retries will be delayed. rpc error: code = InvalidArgument desc = type fast is unknown",
        );
        assert_eq!(
            scenario.finish().await,
            [provisioning(), infeasible, provisioning(), succeeded()]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn in_progress_keeps_the_record_and_the_retry_repeats_the_request() {
        let timeout = "rpc error: code = DeadlineExceeded desc = still creating";
        let scenario = cluster()
            .start([
                secret_read(),
                record_written(),
                create_volume(
                    expected_create(),
                    Err(Status::deadline_exceeded("still creating")),
                ),
                // The retry replays the recorded operation: nothing to write before it. The
                // failure note rides along with the record's removal.
                secret_read(),
                create_volume(expected_create(), created("vol-1", GIB)),
                pv_created(),
                record_removed(),
            ])
            .await;
        assert_eq!(
            reconcile(&scenario, claim().build()).await,
            Next::RetryIn(RETRY_START)
        );
        assert!(
            in_flight(&scenario),
            "the driver may still create the volume"
        );
        assert_eq!(reconcile(&scenario, claim().build()).await, Next::Wait);
        assert_eq!(
            scenario.finish().await,
            [provisioning(), failed(timeout), provisioning(), succeeded()]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_pv_name_taken_by_another_volume_deletes_the_new_claim_volume() {
        let mut theirs = PvBuilder::new()
            .handle("vol-other")
            .claim_uid("uid-of-another-claim")
            .build();
        theirs.metadata.name = Some(claim_volume());
        let scenario = cluster()
            .start([
                secret_read(),
                record_written(),
                create_volume(expected_create(), created("vol-new", GIB)),
                post("/api/v1/persistentvolumes").refuse(409, "AlreadyExists"),
                get(claim_volume_path()).answer(200, theirs),
                delete_volume("vol-new", SECRETS, Ok(())),
                record_removed(),
            ])
            .await;
        assert_eq!(
            reconcile(&scenario, claim().build()).await,
            Next::RetryIn(RETRY_START)
        );
        assert!(!in_flight(&scenario));
        let taken = failed(&format!(
            "PersistentVolume {} already exists for another volume (\"vol-other\"); the new volume \"vol-new\" was deleted",
            claim_volume()
        ));
        assert_eq!(scenario.finish().await, [provisioning(), taken]);
    }

    /// Claim `apps/other`'s PV of the claim's volume name: the names collide.
    fn pv_of_another_claim(handle: &str) -> PersistentVolume {
        let mut theirs = PvBuilder::new()
            .handle(handle)
            .claim_uid("uid-of-another-claim")
            .build();
        theirs.metadata.name = Some(claim_volume());
        if let Some(claim) = theirs
            .spec
            .as_mut()
            .and_then(|spec| spec.claim_ref.as_mut())
        {
            claim.name = Some("other".to_owned());
        }
        theirs
    }

    #[tokio::test(start_paused = true)]
    async fn a_pv_create_meeting_another_claims_pv_of_the_same_volume_deletes_nothing() {
        let scenario = cluster()
            .start([
                secret_read(),
                record_written(),
                create_volume(expected_create(), created("vol-1", GIB)),
                post("/api/v1/persistentvolumes").refuse(409, "AlreadyExists"),
                get(claim_volume_path()).answer(200, pv_of_another_claim("vol-1")),
                record_removed(),
            ])
            .await;
        assert_eq!(
            reconcile(&scenario, claim().build()).await,
            Next::RetryIn(RETRY_START)
        );
        assert!(!in_flight(&scenario));
        let in_use = failed(&format!(
            "PersistentVolume {} already exists and holds the volume \"vol-1\" the driver returned for this claim (bound to claim apps/other); the volume is in use and is not deleted, and this claim gets no volume: its volume name collides with another's (raise --volume-name-uuid-length)",
            claim_volume()
        ));
        assert_eq!(scenario.finish().await, [provisioning(), in_use]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_whose_short_volume_name_is_another_claims_pv_is_told_on_every_attempt() {
        let name = "pvc-0b2c9f8e";
        let mut theirs = pv_of_another_claim("vol-1");
        theirs.metadata.name = Some(name.to_owned());
        let scenario = cluster()
            .uuid_length(8)
            .volume(theirs.clone())
            .start([
                get(format!("/api/v1/persistentvolumes/{name}")).answer(200, &theirs),
                get(format!("/api/v1/persistentvolumes/{name}")).answer(200, &theirs),
            ])
            .await;
        for delay in [RETRY_START, RETRY_START * 2] {
            assert_eq!(
                reconcile(&scenario, claim().build()).await,
                Next::RetryIn(delay)
            );
        }
        let collision = failed(&format!(
            "PersistentVolume {name} already exists for claim apps/other; this claim gets no volume: its volume name collides with another claim's (raise --volume-name-uuid-length)"
        ));
        assert_eq!(scenario.finish().await, [collision.clone(), collision]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_whose_short_volume_name_is_its_own_pv_waits_for_the_binding() {
        let name = "pvc-0b2c9f8e";
        let mut ours = PvBuilder::new().handle("vol-1").build();
        ours.metadata.name = Some(name.to_owned());
        let scenario = cluster()
            .uuid_length(8)
            .volume(ours.clone())
            .start([get(format!("/api/v1/persistentvolumes/{name}")).answer(200, &ours)])
            .await;
        assert_eq!(reconcile(&scenario, claim().build()).await, Next::Wait);
        assert!(scenario.finish().await.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_pv_that_already_holds_the_volume_is_success() {
        let mut ours = PvBuilder::new().handle("vol-1").build();
        ours.metadata.name = Some(claim_volume());
        let scenario = cluster()
            .start([
                secret_read(),
                record_written(),
                create_volume(expected_create(), created("vol-1", GIB)),
                post("/api/v1/persistentvolumes").refuse(409, "AlreadyExists"),
                get(claim_volume_path()).answer(200, ours),
                record_removed(),
            ])
            .await;
        assert_eq!(reconcile(&scenario, claim().build()).await, Next::Wait);
        assert_eq!(scenario.finish().await, [provisioning(), succeeded()]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_journal_write_sends_no_create_claim_volume() {
        let scenario = cluster()
            .journal_timeout(Duration::from_millis(50))
            .start([
                secret_read(),
                post(journal_path()).refuse(500, "InternalError"),
                // The shard writer keeps the record and tries again after the reconcile gave
                // up: re-read, write.
                get(shard_path()).refuse(404, "NotFound"),
                record_written(),
            ])
            .await;
        assert_eq!(
            reconcile(&scenario, claim().build()).await,
            Next::RetryIn(RETRY_START)
        );
        assert!(!in_flight(&scenario));
        assert_eq!(
            scenario.finish().await,
            [
                provisioning(),
                failed(
                    "failed to record the operation in the journal: the journal did not store the operation within 50ms; CreateVolume is not sent until it does"
                )
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_journal_write_conflict_rereads_the_shard_before_create_claim_volume() {
        let previous_leaders = OperationRecord {
            volume_name: "pvc-other".to_owned(),
            claim: "apps/other".to_owned(),
            claim_uid: "uid-other".to_owned(),
            ..OperationRecord::default()
        };
        let scenario = cluster()
            .start([
                secret_read(),
                post(journal_path()).refuse(409, "AlreadyExists"),
                get(shard_path()).answer(200, shard(vec![previous_leaders])),
                put(shard_path())
                    .body(json!({ "spec": { "operations": [our_record(), { "volumeName": "pvc-other" }] } }))
                    .echo(200),
                create_volume(expected_create(), created("vol-1", GIB)),
                pv_created(),
                journal_replaced(json!([{ "volumeName": "pvc-other" }])),
            ])
            .await;
        assert_eq!(reconcile(&scenario, claim().build()).await, Next::Wait);
        assert_eq!(scenario.finish().await, [provisioning(), succeeded()]);
    }

    // ---------------------------------------------------------------------------- topology

    /// Nodes n1 (zone z1) and n2 (zone z2), both with our driver's CSINode keyed on `zone`.
    fn zoned() -> Cluster {
        let node =
            |name: &str, zone: &str| json!({"metadata": {"name": name, "labels": {"zone": zone}}});
        let csinode = |name: &str| {
            json!({"metadata": {"name": name}, "spec": {"drivers": [
                {"name": DRIVER, "nodeID": name, "topologyKeys": ["zone"]}
            ]}})
        };
        cluster().topology(
            vec![node("n1", "z1"), node("n2", "z2")],
            vec![csinode("n1"), csinode("n2")],
        )
    }

    fn on_node(node: &str) -> PvcBuilder {
        claim().annotation(ANN_SELECTED_NODE, node)
    }

    fn zones(zones: &[&str]) -> Vec<csi::Topology> {
        zones
            .iter()
            .map(|zone| csi::Topology {
                segments: strings(&[("zone", zone)]),
            })
            .collect()
    }

    /// What a claim on n1 asks for: every zone, n1's first.
    fn create_on_n1() -> CreateVolumeCall {
        CreateVolumeCall {
            accessibility: Some(csi::TopologyRequirement {
                requisite: zones(&["z1", "z2"]),
                preferred: zones(&["z1", "z2"]),
            }),
            ..expected_create()
        }
    }

    /// The volume created in zone z1.
    fn created_in_z1() -> Result<csi::CreateVolumeResponse, Status> {
        let mut response = created("vol-1", GIB)?;
        if let Some(volume) = response.volume.as_mut() {
            volume.accessible_topology = zones(&["z1"]);
        }
        Ok(response)
    }

    /// The removal of `node` from the claim's selected-node annotation.
    fn node_given_back(node: &str) -> Step {
        let path = "/metadata/annotations/volume.kubernetes.io~1selected-node";
        patch(CLAIM_PATH)
            .body(json!([
                {"op": "test", "path": "/metadata/uid", "value": PVC_UID},
                {"op": "test", "path": path, "value": node},
                {"op": "remove", "path": path},
            ]))
            .answer(200, claim().build())
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_on_a_node_asks_for_that_nodes_topology_first() {
        let scenario = zoned()
            .start([
                secret_read(),
                record_written(),
                create_volume(create_on_n1(), created_in_z1()),
                pv_created(),
                record_removed(),
            ])
            .await;
        assert_eq!(
            reconcile(&scenario, on_node("n1").build()).await,
            Next::Wait
        );
        assert_eq!(scenario.finish().await, [provisioning(), succeeded()]);
    }

    #[tokio::test(start_paused = true)]
    async fn resource_exhausted_on_a_node_gives_the_node_back_to_the_scheduler() {
        let scenario = zoned()
            .start([
                secret_read(),
                record_written(),
                create_volume(
                    create_on_n1(),
                    Err(Status::resource_exhausted("zone z1 is full")),
                ),
                node_given_back("n1"),
                record_removed(),
            ])
            .await;
        assert_eq!(
            reconcile(&scenario, on_node("n1").build()).await,
            Next::Wait,
            "the claim waits for the scheduler's next node"
        );
        assert!(!in_flight(&scenario), "the driver created nothing");
        assert_eq!(
            scenario.finish().await,
            [
                provisioning(),
                failed("rpc error: code = ResourceExhausted desc = zone z1 is full")
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_node_whose_volume_may_exist_is_kept_after_resource_exhausted() {
        let scenario = zoned()
            .start([
                secret_read(),
                record_written(),
                create_volume(
                    create_on_n1(),
                    Err(Status::deadline_exceeded("still creating")),
                ),
                secret_read(),
                create_volume(
                    create_on_n1(),
                    Err(Status::resource_exhausted("zone z1 is full")),
                ),
                secret_read(),
                create_volume(create_on_n1(), created_in_z1()),
                pv_created(),
                record_removed(),
            ])
            .await;
        let pvc = on_node("n1").build();
        assert_eq!(
            reconcile(&scenario, pvc.clone()).await,
            Next::RetryIn(RETRY_START)
        );
        assert_eq!(
            reconcile(&scenario, pvc.clone()).await,
            Next::RetryIn(RETRY_START * 2),
            "no node given back: the first attempt may have created the volume there"
        );
        assert_eq!(reconcile(&scenario, pvc).await, Next::Wait);
        let kept = "rpc error: code = ResourceExhausted desc = zone z1 is full; an earlier attempt may have created the volume for node \"n1\", so the claim keeps that node and the same request is retried until the driver says what became of it";
        assert_eq!(
            scenario.finish().await,
            [
                provisioning(),
                failed("rpc error: code = DeadlineExceeded desc = still creating"),
                provisioning(),
                failed(kept),
                provisioning(),
                succeeded()
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_selected_node_without_csinode_is_given_back_before_anything_is_sent() {
        let scenario = zoned().start([node_given_back("n3")]).await;
        assert_eq!(
            reconcile(&scenario, on_node("n3").build()).await,
            Next::Wait
        );
        let events = scenario.finish().await;
        assert_eq!(events.len(), 2, "{events:?}");
        assert_eq!(events[0], provisioning());
        assert!(
            events[1].starts_with(&failed("")) && events[1].contains("n3"),
            "{events:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn watches_that_never_list_are_an_event_not_a_hang() {
        let scenario = cluster().topology_unlisted().start([]).await;
        assert_eq!(
            reconcile(&scenario, on_node("n1").build()).await,
            Next::RetryIn(RETRY_START)
        );
        assert_eq!(
            scenario.finish().await,
            [
                provisioning(),
                failed(
                    "the Node and CSINode watches have not listed yet, so the claim's topology is unknown (does the sidecar's RBAC grant list and watch on nodes and csinodes?)"
                )
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_recorded_operation_is_replayed_even_when_its_node_is_gone() {
        let mut recorded = recorded_operation();
        recorded.request.accessibility_requirements = create_on_n1().accessibility;
        // The claim now names a node the cluster does not know: the recorded request is sent.
        let scenario = zoned()
            .journaled(recorded)
            .start([
                secret_read(),
                create_volume(create_on_n1(), created_in_z1()),
                pv_created(),
                record_removed(),
            ])
            .await;
        assert_eq!(
            reconcile(&scenario, on_node("gone").build()).await,
            Next::Wait
        );
        assert_eq!(scenario.finish().await, [provisioning(), succeeded()]);
    }

    // ------------------------------------------------------------------ data sources

    const SOURCE_UID: &str = "5c1c8b4e-0000-4000-8000-00000000000a";
    const SOURCE_PATH: &str = "/api/v1/namespaces/apps/persistentvolumeclaims/src";
    const SNAPSHOT_PATH: &str =
        "/apis/snapshot.storage.k8s.io/v1/namespaces/apps/volumesnapshots/snap";

    /// The bound claim `apps/src` a clone reads, with its volume `vol-src`.
    fn source_claim() -> PersistentVolumeClaim {
        let mut source = PvcBuilder::new()
            .uid(SOURCE_UID)
            .volume_name("pv-src")
            .phase("Bound")
            .build();
        source.metadata.name = Some("src".into());
        source
    }

    fn source_pv() -> PersistentVolume {
        let mut pv = PvBuilder::new()
            .name("pv-src")
            .handle("vol-src")
            .claim_uid(SOURCE_UID)
            .build();
        if let Some(claim) = pv.spec.as_mut().and_then(|s| s.claim_ref.as_mut()) {
            claim.name = Some("src".into());
        }
        pv
    }

    fn from_volume(id: &str) -> Option<csi::VolumeContentSource> {
        Some(csi::VolumeContentSource {
            r#type: Some(csi::volume_content_source::Type::Volume(
                csi::volume_content_source::VolumeSource {
                    volume_id: id.into(),
                },
            )),
        })
    }

    fn from_snapshot(id: &str) -> Option<csi::VolumeContentSource> {
        Some(csi::VolumeContentSource {
            r#type: Some(csi::volume_content_source::Type::Snapshot(
                csi::volume_content_source::SnapshotSource {
                    snapshot_id: id.into(),
                },
            )),
        })
    }

    /// The volume created with the content it was asked for.
    fn created_from(
        content: Option<csi::VolumeContentSource>,
    ) -> Result<csi::CreateVolumeResponse, Status> {
        let mut response = created("vol-1", GIB)?;
        if let Some(volume) = response.volume.as_mut() {
            volume.content_source = content;
        }
        Ok(response)
    }

    /// CreateVolume from the source's volume `vol-src`, answered with the clone.
    fn cloned() -> Step {
        create_volume(
            CreateVolumeCall {
                content_source: from_volume("vol-src"),
                ..expected_create()
            },
            created_from(from_volume("vol-src")),
        )
    }

    fn clone_claim() -> PvcBuilder {
        claim().data_source(None, "PersistentVolumeClaim", "src")
    }

    #[tokio::test(start_paused = true)]
    async fn a_clone_protects_its_source_then_creates_from_the_source_volume() {
        let scenario = cluster()
            .start([
                get(SOURCE_PATH).answer(200, source_claim()),
                get("/api/v1/persistentvolumes/pv-src").answer(200, source_pv()),
                get(SOURCE_PATH).answer(200, source_claim()),
                patch(SOURCE_PATH)
                    .body(json!({"metadata": {"finalizers": [CLONE_PROTECTION_FINALIZER]}}))
                    .echo(200),
                secret_read(),
                record_written(),
                cloned(),
                pv_created(),
                record_removed(),
            ])
            .await;
        assert_eq!(
            reconcile(&scenario, clone_claim().build()).await,
            Next::Wait
        );
        assert_eq!(scenario.finish().await, [provisioning(), succeeded()]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_clone_whose_source_is_not_bound_sends_nothing_and_protects_nothing() {
        let mut pending = source_claim();
        pending.status = None;
        let scenario = cluster()
            .start([get(SOURCE_PATH).answer(200, pending)])
            .await;
        assert_eq!(
            reconcile(&scenario, clone_claim().build()).await,
            Next::RetryIn(RETRY_START)
        );
        assert!(!in_flight(&scenario));
        assert_eq!(
            scenario.finish().await,
            [
                provisioning(),
                failed(
                    "error getting handle for DataSource Type PersistentVolumeClaim by Name src: the PVC DataSource src must have a status of Bound.  Got { [] map[] [] map[] map[] <nil> <nil>}"
                )
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_volume_that_ignored_its_source_is_deleted_and_the_claim_retried() {
        let scenario = cluster()
            .start([
                get(SOURCE_PATH).answer(200, source_claim()),
                get("/api/v1/persistentvolumes/pv-src").answer(200, source_pv()),
                get(SOURCE_PATH).answer(200, source_claim()),
                patch(SOURCE_PATH).echo(200),
                secret_read(),
                record_written(),
                create_volume(
                    CreateVolumeCall {
                        content_source: from_volume("vol-src"),
                        ..expected_create()
                    },
                    created_from(None),
                ),
                get(claim_volume_path()).refuse(404, "NotFound"),
                delete_volume("vol-1", SECRETS, Ok(())),
                record_removed(),
            ])
            .await;
        assert_eq!(
            reconcile(&scenario, clone_claim().build()).await,
            Next::RetryIn(RETRY_START)
        );
        assert!(!in_flight(&scenario));
        assert_eq!(
            scenario.finish().await,
            [provisioning(), failed("volume content source missing")]
        );
    }

    const GOLD_PATH: &str = "/apis/storage.k8s.io/v1/volumeattributesclasses/gold";

    fn gold_read(driver: &str) -> Step {
        get(GOLD_PATH).answer(
            200,
            json!({
                "apiVersion": "storage.k8s.io/v1",
                "kind": "VolumeAttributesClass",
                "metadata": { "name": "gold" },
                "driverName": driver,
                "parameters": { "iops": "3000" },
            }),
        )
    }

    fn tuned_create() -> CreateVolumeCall {
        CreateVolumeCall {
            mutable_parameters: strings(&[("iops", "3000")]),
            ..expected_create()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_claims_attributes_class_is_read_after_the_secret_and_sent_as_mutable_parameters() {
        let tuned_pv = post("/api/v1/persistentvolumes")
            .body(json!({ "spec": { "volumeAttributesClassName": "gold" } }))
            .echo(201);
        let scenario = cluster()
            .start([
                secret_read(),
                gold_read(DRIVER),
                record_written(),
                create_volume(tuned_create(), created("vol-1", GIB)),
                tuned_pv,
                record_removed(),
            ])
            .await;
        assert_eq!(
            reconcile(&scenario, claim().attributes_class("gold").build()).await,
            Next::Wait
        );
        assert_eq!(scenario.finish().await, [provisioning(), succeeded()]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_class_that_cannot_be_read_is_the_api_text_and_nothing_is_sent() {
        let scenario = cluster()
            .start([secret_read(), get(GOLD_PATH).refuse(404, "NotFound")])
            .await;
        assert_eq!(
            reconcile(&scenario, claim().attributes_class("gold").build()).await,
            Next::RetryIn(RETRY_START)
        );
        assert!(!in_flight(&scenario));
        assert_eq!(
            scenario.finish().await,
            [provisioning(), failed("scripted NotFound")]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn another_drivers_class_is_refused_before_anything_is_recorded() {
        let scenario = cluster()
            .start([secret_read(), gold_read("other.csi.k8s.io")])
            .await;
        assert_eq!(
            reconcile(&scenario, claim().attributes_class("gold").build()).await,
            Next::RetryIn(RETRY_START)
        );
        assert!(!in_flight(&scenario));
        assert_eq!(
            scenario.finish().await,
            [
                provisioning(),
                failed(&format!(
                    "VAC gold referenced in PVC is for driver other.csi.k8s.io which does not match driver name {DRIVER}"
                ))
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_recorded_operation_replays_its_mutable_parameters_without_reading_the_class() {
        let mut recorded = recorded_operation();
        recorded.request.mutable_parameters = strings(&[("iops", "3000")]);
        recorded.attributes_class = Some("gold".to_owned());
        // The class may be gone or changed by now: it is not read, the recorded request is sent.
        let scenario = cluster()
            .journaled(recorded)
            .start([
                secret_read(),
                create_volume(tuned_create(), created("vol-1", GIB)),
                pv_created(),
                record_removed(),
            ])
            .await;
        assert_eq!(
            reconcile(&scenario, claim().attributes_class("gold").build()).await,
            Next::Wait
        );
        assert_eq!(scenario.finish().await, [provisioning(), succeeded()]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_pv_names_the_recorded_class_when_the_claim_has_moved_on() {
        let mut recorded = recorded_operation();
        recorded.request.mutable_parameters = strings(&[("iops", "3000")]);
        recorded.attributes_class = Some("gold".to_owned());
        let gold_pv = post("/api/v1/persistentvolumes")
            .body(json!({ "spec": { "volumeAttributesClassName": "gold" } }))
            .echo(201);
        let scenario = cluster()
            .journaled(recorded)
            .start([
                secret_read(),
                create_volume(tuned_create(), created("vol-1", GIB)),
                gold_pv,
                record_removed(),
            ])
            .await;
        assert_eq!(
            reconcile(&scenario, claim().attributes_class("silver").build()).await,
            Next::Wait
        );
        let moved = format!(
            "{CLAIM_EVENT} Warning VolumeAttributesClassRecorded: {}",
            recorded_class_moved(Some("silver"), Some("gold"), &claim_volume()).unwrap_or_default()
        );
        assert_eq!(
            scenario.finish().await,
            [provisioning(), moved, succeeded()]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn with_the_gate_off_the_class_is_ignored_and_the_claim_told() {
        let scenario = cluster()
            .without_attributes_classes()
            .start([
                secret_read(),
                record_written(),
                create_volume(expected_create(), created("vol-1", GIB)),
                pv_created(),
                record_removed(),
            ])
            .await;
        assert_eq!(
            reconcile(&scenario, claim().attributes_class("gold").build()).await,
            Next::Wait
        );
        let ignored = format!(
            "{CLAIM_EVENT} Warning VolumeAttributesClassIgnored: the claim names VolumeAttributesClass \"gold\" but the provisioner's VolumeAttributesClass feature gate is off, so PersistentVolume {} has no class and kube-controller-manager will not bind the claim to it",
            claim_volume()
        );
        assert_eq!(
            scenario.finish().await,
            [provisioning(), succeeded(), ignored]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_recorded_clone_is_replayed_without_reading_its_source_again() {
        let mut recorded = recorded_operation();
        recorded.request.volume_content_source = from_volume("vol-src");
        // The source may be gone by now: nothing of it is read, the recorded request is sent.
        let scenario = cluster()
            .journaled(recorded)
            .start([secret_read(), cloned(), pv_created(), record_removed()])
            .await;
        assert_eq!(
            reconcile(&scenario, clone_claim().build()).await,
            Next::Wait
        );
        assert_eq!(scenario.finish().await, [provisioning(), succeeded()]);
    }

    fn snapshot(finalizers: &[&str]) -> Value {
        json!({
            "apiVersion": "snapshot.storage.k8s.io/v1",
            "kind": "VolumeSnapshot",
            "metadata": {"name": "snap", "namespace": "apps", "uid": "snap-uid",
                         "resourceVersion": "3", "finalizers": finalizers},
            "spec": {"source": {"persistentVolumeClaimName": "src"}},
            "status": {"boundVolumeSnapshotContentName": "content-1", "readyToUse": true,
                       "restoreSize": "1Gi"}
        })
    }

    fn content() -> Value {
        json!({
            "apiVersion": "snapshot.storage.k8s.io/v1",
            "kind": "VolumeSnapshotContent",
            "metadata": {"name": "content-1"},
            "spec": {"driver": DRIVER, "deletionPolicy": "Delete",
                     "source": {"volumeHandle": "vol-src"},
                     "volumeSnapshotRef": {"name": "snap", "namespace": "apps", "uid": "snap-uid"}},
            "status": {"snapshotHandle": "snap-handle", "readyToUse": true}
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_restore_protects_the_snapshot_until_its_pv_is_saved() {
        let scenario = cluster()
            .start([
                get(SNAPSHOT_PATH).answer(200, snapshot(&[])),
                get("/apis/snapshot.storage.k8s.io/v1/volumesnapshotcontents/content-1")
                    .answer(200, content()),
                get(SNAPSHOT_PATH).answer(200, snapshot(&[])),
                patch(SNAPSHOT_PATH)
                    .body(json!({"metadata": {"finalizers": [SNAPSHOT_PROTECTION_FINALIZER]}}))
                    .echo(200),
                secret_read(),
                record_written(),
                create_volume(
                    CreateVolumeCall {
                        content_source: from_snapshot("snap-handle"),
                        ..expected_create()
                    },
                    created_from(from_snapshot("snap-handle")),
                ),
                pv_created(),
                get(SNAPSHOT_PATH).answer(200, snapshot(&[SNAPSHOT_PROTECTION_FINALIZER])),
                patch(SNAPSHOT_PATH).echo(200),
                record_removed(),
            ])
            .await;
        let restore =
            claim().data_source(Some("snapshot.storage.k8s.io"), "VolumeSnapshot", "snap");
        assert_eq!(reconcile(&scenario, restore.build()).await, Next::Wait);
        assert_eq!(scenario.finish().await, [provisioning(), succeeded()]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_cluster_without_the_snapshot_crd_is_told_so() {
        let scenario = cluster()
            .start([get(SNAPSHOT_PATH).refuse(404, "NotFound")])
            .await;
        let restore =
            claim().data_source(Some("snapshot.storage.k8s.io"), "VolumeSnapshot", "snap");
        assert_eq!(
            reconcile(&scenario, restore.build()).await,
            Next::RetryIn(RETRY_START)
        );
        let events = scenario.finish().await;
        assert_eq!(events.len(), 2, "{events:?}");
        assert_eq!(events[0], provisioning());
        assert!(
            events[1].starts_with(&failed("error getting handle for DataSource Type VolumeSnapshot by Name snap: error getting snapshot snap from api server: ")),
            "{events:?}"
        );
    }

    // ------------------------------------------------------------------ cross-namespace sources

    const OTHER_SNAPSHOT_PATH: &str =
        "/apis/snapshot.storage.k8s.io/v1/namespaces/other/volumesnapshots/snap";

    /// A restore of `apps/data` from the VolumeSnapshot `other/snap`.
    fn cross_namespace_restore() -> PvcBuilder {
        claim().data_source_ref(
            Some("snapshot.storage.k8s.io"),
            "VolumeSnapshot",
            "snap",
            Some("other"),
        )
    }

    /// A ReferenceGrant in `other` for the VolumeSnapshots, to the claims of `from`.
    fn snapshot_grant(from: &str) -> Value {
        json!({
            "metadata": {"name": "snapshots", "namespace": "other", "uid": "g-1"},
            "spec": {
                "from": [{"group": "", "kind": "PersistentVolumeClaim", "namespace": from}],
                "to": [{"group": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot"}],
            },
        })
    }

    fn in_other(mut object: Value) -> Value {
        object["metadata"]["namespace"] = json!("other");
        object
    }

    #[tokio::test(start_paused = true)]
    async fn a_cross_namespace_restore_without_a_grant_sends_nothing() {
        let scenario = cluster()
            .cross_namespace(vec![snapshot_grant("elsewhere")])
            .start([])
            .await;
        assert_eq!(
            reconcile(&scenario, cross_namespace_restore().build()).await,
            Next::RetryIn(RETRY_START)
        );
        assert!(!in_flight(&scenario));
        assert_eq!(
            scenario.finish().await,
            [
                provisioning(),
                failed(
                    "accessing other/snap of VolumeSnapshot dataSource from apps/data isn't allowed"
                )
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_granted_cross_namespace_restore_reads_and_releases_the_snapshot_there() {
        let mut content = content();
        content["spec"]["volumeSnapshotRef"]["namespace"] = json!("other");
        let scenario = cluster()
            .cross_namespace(vec![snapshot_grant("apps")])
            .start([
                get(OTHER_SNAPSHOT_PATH).answer(200, in_other(snapshot(&[]))),
                get("/apis/snapshot.storage.k8s.io/v1/volumesnapshotcontents/content-1")
                    .answer(200, content),
                get(OTHER_SNAPSHOT_PATH).answer(200, in_other(snapshot(&[]))),
                patch(OTHER_SNAPSHOT_PATH)
                    .body(json!({"metadata": {"finalizers": [SNAPSHOT_PROTECTION_FINALIZER]}}))
                    .echo(200),
                secret_read(),
                record_written(),
                create_volume(
                    CreateVolumeCall {
                        content_source: from_snapshot("snap-handle"),
                        ..expected_create()
                    },
                    created_from(from_snapshot("snap-handle")),
                ),
                pv_created(),
                // Upstream leaves the finalizer on a snapshot of another namespace (A4).
                get(OTHER_SNAPSHOT_PATH)
                    .answer(200, in_other(snapshot(&[SNAPSHOT_PROTECTION_FINALIZER]))),
                patch(OTHER_SNAPSHOT_PATH).echo(200),
                record_removed(),
            ])
            .await;
        assert_eq!(
            reconcile(&scenario, cross_namespace_restore().build()).await,
            Next::Wait
        );
        assert_eq!(scenario.finish().await, [provisioning(), succeeded()]);
    }

    #[tokio::test(start_paused = true)]
    async fn without_the_grant_watch_only_cross_namespace_claims_wait_and_are_told_why() {
        let scenario = cluster()
            .cross_namespace_unlisted()
            .start([
                secret_read(),
                record_written(),
                create_volume(expected_create(), created("vol-1", GIB)),
                pv_created(),
                record_removed(),
            ])
            .await;
        assert_eq!(
            reconcile(&scenario, cross_namespace_restore().build()).await,
            Next::RetryIn(RETRY_START)
        );
        assert_eq!(reconcile(&scenario, claim().build()).await, Next::Wait);
        assert_eq!(
            scenario.finish().await,
            [
                failed(
                    "the ReferenceGrant watch has not listed yet, so whether this claim may use its data source in namespace other is unknown: the ReferenceGrant CRD (gateway.networking.k8s.io/v1beta1) may not be installed, or the sidecar's RBAC may lack list and watch on referencegrants"
                ),
                provisioning(),
                succeeded()
            ]
        );
    }

    // ------------------------------------------------------------------ node deployment

    const NODE: &str = "node-b";
    const NODE_KEY: &str = "example.com/node";

    /// `--node-deployment` on node-b, whose driver's segment is `example.com/node=node-b`;
    /// class `standard` as above, and class `now` with Immediate binding.
    fn node_b() -> Cluster {
        cluster()
            .class(
                ClassBuilder::new()
                    .name("now")
                    .binding_mode("Immediate")
                    .parameter("type", "fast")
                    .build(),
            )
            .node_mode(NODE, &[(NODE_KEY, NODE)])
            .claim(immediate_claim().build())
    }

    fn node_b_segment() -> Vec<csi::Topology> {
        vec![csi::Topology {
            segments: strings(&[(NODE_KEY, NODE)]),
        }]
    }

    /// An Immediate claim (class `now`) no node owns yet.
    fn immediate_claim() -> PvcBuilder {
        claim().class("now")
    }

    fn capacity_asked(available: i64) -> Step {
        let pvc = immediate_claim().build();
        let class = ClassBuilder::new()
            .name("now")
            .binding_mode("Immediate")
            .build();
        let caps = crate::provision::DriverCapabilities {
            topology: true,
            ..crate::provision::fixtures::caps()
        };
        let plan = crate::provision::plan_provision(
            &pvc,
            &class,
            &crate::provision::fixtures::config(),
            &caps,
            &[],
        )
        .expect("a plan");
        Step::GetCapacity {
            expected: csi::GetCapacityRequest {
                volume_capabilities: plan.volume_capabilities,
                parameters: strings(&[("type", "fast")]),
                accessible_topology: node_b_segment().pop(),
            },
            answer: Ok(csi::GetCapacityResponse {
                available_capacity: available,
                ..Default::default()
            }),
        }
    }

    fn node_selected(status: u16) -> Step {
        let call = patch(CLAIM_PATH).body(json!({"metadata": {
            "resourceVersion": "7",
            "annotations": {"volume.kubernetes.io/selected-node": NODE},
        }}));
        if status == 200 {
            call.answer(
                200,
                immediate_claim()
                    .annotation(ANN_SELECTED_NODE, NODE)
                    .build(),
            )
        } else {
            call.refuse(status, "Conflict")
        }
    }

    /// The wait of a retry, within `range`.
    fn waits(next: &Next, range: std::ops::RangeInclusive<Duration>) -> Duration {
        let Next::RetryIn(wait) = *next else {
            panic!("{next:?} is not a retry")
        };
        assert!(range.contains(&wait), "{wait:?} not in {range:?}");
        wait
    }

    /// Just past `wait` (its decimal form may have lost a fraction of a nanosecond).
    async fn sleep_past(wait: Duration) {
        tokio::time::advance(wait + Duration::from_millis(1)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_selected_to_another_node_gets_no_request() {
        let scenario = node_b().start([]).await;
        assert_eq!(
            reconcile(&scenario, on_node("node-a").build()).await,
            Next::Wait
        );
        assert!(!ClaimReconciler::has_work(
            &cached(&on_node("node-a").build()),
            &scenario.ctx()
        ));
        assert!(scenario.finish().await.is_empty(), "no event either");
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_selected_to_this_node_is_created_on_its_segment() {
        let create = CreateVolumeCall {
            accessibility: Some(csi::TopologyRequirement {
                requisite: node_b_segment(),
                preferred: node_b_segment(),
            }),
            ..expected_create()
        };
        let mut answer = created("vol-1", GIB);
        if let Ok(Some(volume)) = answer.as_mut().map(|r| r.volume.as_mut()) {
            volume.accessible_topology = node_b_segment();
        }
        let scenario = node_b()
            .start([
                secret_read(),
                record_written(),
                create_volume(create, answer),
                pv_created(),
                record_removed(),
            ])
            .await;
        assert_eq!(
            reconcile(&scenario, on_node(NODE).build()).await,
            Next::Wait
        );
        assert_eq!(scenario.finish().await, [provisioning(), succeeded()]);
    }

    #[tokio::test(start_paused = true)]
    async fn an_immediate_claim_is_taken_after_the_delay_and_a_capacity_check() {
        let scenario = node_b()
            .start([capacity_asked(GIB), node_selected(200)])
            .await;
        let first = reconcile(&scenario, immediate_claim().build()).await;
        let wait = waits(&first, Duration::ZERO..=Duration::from_secs(1));
        // Woken early (an update of the claim): the rest of the wait, nothing sent.
        let early = reconcile(&scenario, immediate_claim().build()).await;
        waits(&early, Duration::ZERO..=wait);
        sleep_past(wait).await;
        assert_eq!(
            reconcile(&scenario, immediate_claim().build()).await,
            Next::Wait
        );
        assert!(scenario.finish().await.is_empty(), "no event for a race");
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_write_or_no_room_waits_longer_and_another_nodes_name_ends_the_race() {
        let scenario = node_b()
            .start([
                capacity_asked(GIB - 1),
                capacity_asked(GIB),
                node_selected(409),
            ])
            .await;
        let wait = waits(
            &reconcile(&scenario, immediate_claim().build()).await,
            Duration::ZERO..=Duration::from_secs(1),
        );
        sleep_past(wait).await;
        // No room here: the second wait is (1, 2] s.
        let wait = waits(
            &reconcile(&scenario, immediate_claim().build()).await,
            Duration::from_millis(1001)..=Duration::from_secs(2),
        );
        sleep_past(wait).await;
        // Room, but another node wrote first: capped at 2 s, less up to 1 s of jitter.
        let wait = waits(
            &reconcile(&scenario, immediate_claim().build()).await,
            Duration::from_millis(1001)..=Duration::from_secs(2),
        );
        assert_eq!(scenario.ctx().races().attempts(PVC_UID), Some(3));
        sleep_past(wait).await;
        // The winner's name is in the cache now: nothing is sent and the race is over.
        let taken = immediate_claim()
            .annotation(ANN_SELECTED_NODE, "node-a")
            .build();
        assert_eq!(reconcile(&scenario, taken).await, Next::Wait);
        assert_eq!(scenario.ctx().races().attempts(PVC_UID), None);
        assert!(scenario.finish().await.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_driver_without_topology_is_asked_for_capacity_without_a_segment() {
        let pvc = immediate_claim().build();
        let Step::GetCapacity {
            mut expected,
            answer,
        } = capacity_asked(GIB)
        else {
            unreachable!()
        };
        expected.accessible_topology = None;
        let scenario = cluster()
            .class(
                ClassBuilder::new()
                    .name("now")
                    .binding_mode("Immediate")
                    .parameter("type", "fast")
                    .build(),
            )
            .node_mode(NODE, &[])
            .claim(pvc.clone())
            .start([Step::GetCapacity { expected, answer }, node_selected(200)])
            .await;
        let wait = waits(
            &reconcile(&scenario, pvc.clone()).await,
            Duration::ZERO..=Duration::from_secs(1),
        );
        sleep_past(wait).await;
        assert_eq!(reconcile(&scenario, pvc).await, Next::Wait);
        assert!(scenario.finish().await.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn allowed_topologies_without_this_node_leave_the_claim_to_others() {
        let mut class = ClassBuilder::new()
            .name("elsewhere")
            .binding_mode("Immediate")
            .build();
        class.allowed_topologies = Some(vec![k8s_openapi::api::core::v1::TopologySelectorTerm {
            match_label_expressions: Some(vec![
                k8s_openapi::api::core::v1::TopologySelectorLabelRequirement {
                    key: NODE_KEY.into(),
                    values: vec!["node-a".into()],
                },
            ]),
        }]);
        let pvc = claim().class("elsewhere").build();
        let scenario = node_b().class(class).claim(pvc.clone()).start([]).await;
        // Decided before the first delay, as upstream: no wait, no call.
        assert_eq!(reconcile(&scenario, pvc).await, Next::Wait);
        assert!(scenario.finish().await.is_empty());
    }
}
