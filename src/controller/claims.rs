//! The claim reconciler: turns a claim that names our driver into a backend volume and a
//! pre-bound PV. Decisions come from `crate::provision` (what work a claim needs:
//! [`claim_work`]); this module only fetches what they need, calls the driver and the API
//! server, and maps every failure to one event and one metric in
//! [`ClaimReconciler::report_failure`].

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::{self, Either};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use thiserror::Error;
use tracing::{debug, error, info, warn};

use super::actions::{
    ClaimFinalizerError, SecretReadError, claim_key, create_volume, delete_volume, read_secret,
    set_claim_finalizer,
};
use super::cache::CachedClaim;
use super::context::Context;
use super::events::EventType;
use crate::csi;
use crate::csi_client::CallError;
use crate::journal::{JournalError, Operation, Phase};
use crate::provision::{
    ClaimWork, CreateResponseError, DecisionError, ExistingPv, ProvisionError, ProvisionPlan,
    build_create_volume_request, build_persistent_volume, claim_class_name, claim_work,
    existing_pv, needs_finalizer, plan_provision,
};

/// Why one provisioning attempt failed. Each variant says what exists on the backend:
/// variants before `Driver` are raised before CreateVolume.
#[derive(Debug, Error)]
pub enum ClaimError {
    #[error(transparent)]
    Decision(#[from] DecisionError),
    #[error(transparent)]
    Plan(#[from] ProvisionError),
    #[error(transparent)]
    Secret(#[from] SecretReadError),
    #[error(transparent)]
    ClaimFinalizer(#[from] ClaimFinalizerError),
    #[error("failed to record the operation in the journal: {0}")]
    Journal(#[from] JournalError),
    #[error("{0}")]
    Driver(CallError),
    #[error("Volume provisioning failed with infeasible error. Retries will be delayed. {0}")]
    Infeasible(CallError),
    #[error(transparent)]
    Volume(CreateResponseError),
    #[error("{error}. Cleanup of volume {volume} failed, volume is orphaned: {cleanup}")]
    CleanupFailed {
        error: CreateResponseError,
        volume: String,
        cleanup: CallError,
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
    ) -> impl Future<Output = Result<Action, std::convert::Infallible>> + Send + 'static {
        match triage(&cached, &ctx) {
            Some((pvc, work)) => Either::Right(Box::pin(Self::act(pvc, ctx, work))),
            None => Either::Left(future::ready(Ok(Action::await_change()))),
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
    ) -> Result<Action, std::convert::Infallible> {
        let uid = pvc.uid().unwrap_or_default();
        let started = Instant::now();
        match provision_claim(&pvc, &ctx, work).await {
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
                    Outcome::RetryIn(delay) => Action::requeue(delay),
                    Outcome::Provisioned { .. } | Outcome::Nothing => Action::await_change(),
                })
            }
            Err(error) => Ok(Self::report_failure(&pvc, &ctx, error)),
        }
    }

    /// The single mapping of claim failures to events, metrics and retry timing.
    fn report_failure(pvc: &PersistentVolumeClaim, ctx: &Context, error: ClaimError) -> Action {
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
                return Action::await_change();
            }
            ClaimError::Decision(_) | ClaimError::ClaimFinalizer(_) => {}
            _ => ctx.events.publish(
                &reference,
                EventType::Warning,
                PROVISIONING_FAILED,
                &message,
            ),
        }
        let delay = ctx.claim_backoff().failure(pvc.uid().unwrap_or_default());
        warn!(claim = %claim_key(pvc), error = %message, retry_in = ?delay, "provisioning failed");
        Action::requeue(delay)
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
}

/// The claim and its work, or `None` (and its failure count forgotten) if it has none now.
fn triage(cached: &CachedClaim, ctx: &Context) -> Option<(PersistentVolumeClaim, Work)> {
    let pvc = cached
        .to_claim()
        .inspect_err(|error| error!(%error, "not reconciling"))
        .ok()?;
    let class = ctx.classes.get(&ObjectRef::new(claim_class_name(&pvc)));
    let registry = ctx.journal.registry();
    let work = match claim_work(
        &pvc,
        class,
        &ctx.config,
        ctx.consistency_by_default,
        |volume| registry.contains(volume),
    ) {
        ClaimWork::ReleaseFinalizer => Work::ReleaseFinalizer,
        ClaimWork::Provision(class) => Work::Provision(class),
        ClaimWork::Refuse(error) => Work::Refuse(error),
        ClaimWork::Nothing(reason) => {
            if let Some(reason) = reason {
                debug!(claim = %claim_key(&pvc), %reason, "not provisioning");
            }
            debug!(claim = %claim_key(&pvc), "nothing to do");
            ctx.claim_backoff().forget(&pvc.uid().unwrap_or_default());
            return None;
        }
    };
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
        Work::Provision(class) => class,
    };
    let uid = pvc.uid().unwrap_or_default();
    let class_uid = class.uid().unwrap_or_default();
    if let Some(left) = ctx.infeasible().remaining(&uid, &class_uid, Instant::now()) {
        return Ok(Outcome::RetryIn(left));
    }
    let plan = plan_provision(pvc, &class, &ctx.config, &ctx.caps)?;
    if ctx
        .volumes
        .get(&ObjectRef::new(&plan.volume_name))
        .is_some()
    {
        return Ok(Outcome::Nothing);
    }
    // No quorum read here: the cache may lag, but a stale claim cannot cost a volume. The
    // name is fixed by the claim UID (CreateVolume is idempotent per name), the operation is
    // journaled before the call (a claim found gone later gets its volume deleted), and a PV
    // create that meets another PV of that name deletes the new volume. See docs/design.md.
    if needs_finalizer(pvc, ctx.consistency_by_default) {
        set_claim_finalizer(&ctx.client, pvc, true).await?;
    }

    let secrets = read_secret(&ctx.client, plan.secrets.provisioner.as_ref()).await?;
    let planned = build_create_volume_request(&plan, secrets.clone(), None);
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
    ctx.events.publish(
        &pvc.object_ref(&()),
        EventType::Normal,
        PROVISIONING,
        &format!(
            "External provisioner is provisioning volume for claim \"{}\"",
            claim_key(pvc)
        ),
    );

    let response = match create_volume(ctx, &plan.class_name, request.clone()).await {
        Ok(response) => response,
        Err(error) => {
            ctx.journal.settle_failure(
                &plan.volume_name,
                Phase::Provisioning,
                error.may_have_created(),
                &error.to_string(),
            );
            if error.is_infeasible() {
                ctx.infeasible().insert(&uid, &class_uid, Instant::now());
                return Err(ClaimError::Infeasible(error));
            }
            return Err(ClaimError::Driver(error));
        }
    };

    let pv = match build_persistent_volume(&plan, &response) {
        Ok(pv) => pv,
        Err(error) => return Err(clean_up_unusable(ctx, &plan, &request, error).await),
    };
    save_volume(ctx, &plan, pv, &request).await?;
    ctx.journal.complete(&plan.volume_name);
    ctx.events.publish(
        &pvc.object_ref(&()),
        EventType::Normal,
        PROVISIONING_SUCCEEDED,
        &format!("Successfully provisioned volume {}", plan.volume_name),
    );
    Ok(Outcome::Provisioned {
        volume: plan.volume_name,
    })
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
    match delete_volume(ctx, &plan.class_name, &volume_id, request.secrets.clone()).await {
        Ok(()) => {
            ctx.journal.complete(&plan.volume_name);
            ClaimError::Volume(error)
        }
        Err(cleanup) => ClaimError::CleanupFailed {
            error,
            volume: plan.volume_name.clone(),
            cleanup,
        },
    }
}

/// Creates the PV. AlreadyExists is success only when the existing PV holds this very volume;
/// otherwise the volume just created is nobody's and is deleted (upstream #1469 leaks it).
async fn save_volume(
    ctx: &Context,
    plan: &ProvisionPlan,
    pv: PersistentVolume,
    request: &csi::CreateVolumeRequest,
) -> Result<(), ClaimError> {
    let api: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let handle = pv
        .spec
        .as_ref()
        .and_then(|spec| spec.csi.as_ref())
        .map(|csi| csi.volume_handle.clone())
        .unwrap_or_default();
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
            let verdict = existing_pv(&existing, &pv);
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
        let holder = spec.and_then(|spec| spec.claim_ref.as_ref()).map_or_else(
            || "no claim".to_owned(),
            |claim| {
                format!(
                    "claim {}/{}",
                    claim.namespace.as_deref().unwrap_or_default(),
                    claim.name.as_deref().unwrap_or_default()
                )
            },
        );
        return ClaimError::VolumeInUse {
            name,
            volume: created,
            holder,
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
    }
}

/// The `source` label of the provisioning metrics: the claim's data source kind, or "".
fn data_source_kind(pvc: &PersistentVolumeClaim) -> &str {
    pvc.spec
        .as_ref()
        .and_then(|spec| spec.data_source.as_ref())
        .map_or("", |source| source.kind.as_str())
}
