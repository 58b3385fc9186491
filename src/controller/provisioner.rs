//! The claim reconciler: turns a claim that names our driver into a backend volume and a
//! pre-bound PV. Decisions come from `crate::provision`; this module only fetches what they
//! need, calls the driver and the API server, and maps every failure to one event and one
//! metric in [`ClaimReconciler::report_failure`].

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::{self, Either};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Secret};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use thiserror::Error;
use tracing::{debug, error, info, warn};

use super::Context;
use super::cache::CachedClaim;
use super::events::EventType;
use super::finalizers::{add_finalizer, remove_finalizer};
use super::inflight::InFlight;
use crate::csi;
use crate::csi_client::{CallError, ErrorClass};
use crate::journal::{JournalError, Phase};
use crate::provision::{
    ANN_BETA_STORAGE_PROVISIONER, ANN_STORAGE_PROVISIONER, Decision, DecisionError,
    PROVISIONING_FINALIZER, ProvisionError, ProvisionPlan, SecretError, SecretRef, VolumeError,
    already_exists_is_ours, build_create_volume_request, build_persistent_volume, claim_class_name,
    has_provisioning_finalizer, may_release_finalizer, needs_finalizer, plan_provision,
    secret_data, should_provision, volume_name,
};

/// Why one provisioning attempt failed. Each variant says what exists on the backend:
/// variants before `Driver` are raised before CreateVolume.
#[derive(Debug, Error)]
pub enum ClaimError {
    #[error(transparent)]
    Decision(#[from] DecisionError),
    #[error(transparent)]
    Plan(#[from] ProvisionError),
    #[error("error getting secret {name} in namespace {namespace}: {source}")]
    SecretGet {
        name: String,
        namespace: String,
        source: kube::Error,
    },
    #[error(transparent)]
    SecretData(#[from] SecretError),
    #[error("failed to read claim {0}: {1}")]
    ClaimRead(String, kube::Error),
    #[error("failed to update the finalizers of claim {0}: {1}")]
    ClaimFinalizer(String, kube::Error),
    #[error("failed to record the operation in the journal: {0}")]
    Journal(#[from] JournalError),
    #[error("{0}")]
    Driver(CallError),
    #[error("Volume provisioning failed with infeasible error. Retries will be delayed. {0}")]
    Infeasible(CallError),
    #[error(transparent)]
    Volume(VolumeError),
    #[error("{error}. Cleanup of volume {volume} failed, volume is orphaned: {cleanup}")]
    CleanupFailed {
        error: VolumeError,
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
        match provision(&pvc, &ctx, work).await {
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
            ClaimError::Decision(_)
            | ClaimError::ClaimRead(..)
            | ClaimError::ClaimFinalizer(..) => {}
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
    match next_step(&pvc, ctx) {
        Some(work) => Some((pvc, work)),
        None => {
            debug!(claim = %claim_key(&pvc), "nothing to do");
            ctx.claim_backoff().forget(&pvc.uid().unwrap_or_default());
            None
        }
    }
}

/// `None`: nothing to do for this claim now.
fn next_step(pvc: &PersistentVolumeClaim, ctx: &Context) -> Option<Work> {
    // Every sidecar sees every claim, and another driver's sidecar has none of this claim's
    // operations in flight: only the claim's own provisioner may let the finalizer go.
    let ours = [ANN_STORAGE_PROVISIONER, ANN_BETA_STORAGE_PROVISIONER]
        .into_iter()
        .find_map(|key| pvc.annotations().get(key))
        .is_some_and(|provisioner| *provisioner == ctx.config.driver_name);
    if ours && has_provisioning_finalizer(pvc) {
        let in_flight = volume_name(
            &ctx.config.volume_name_prefix,
            ctx.config.volume_name_uuid_length,
            &pvc.uid().unwrap_or_default(),
        )
        .is_ok_and(|name| ctx.journal.registry().contains(&name));
        if may_release_finalizer(pvc, in_flight, ctx.consistency_by_default) {
            return Some(Work::ReleaseFinalizer);
        }
    }
    if pvc.metadata.deletion_timestamp.is_some() {
        // A claim being deleted gets no new volume; its operation in flight, if any, is the
        // orphan reaper's.
        return None;
    }
    let class = ctx.classes.get(&ObjectRef::new(claim_class_name(pvc)));
    match should_provision(pvc, class.as_deref(), &ctx.config.driver_name) {
        Decision::Provision => {}
        Decision::Skip(reason) => {
            debug!(claim = %claim_key(pvc), %reason, "not provisioning");
            return None;
        }
        Decision::Error(error) => return Some(Work::Refuse(error)),
    }
    Some(match class {
        Some(class) => Work::Provision(class),
        None => Work::Refuse(DecisionError::StorageClassNotFound(
            claim_class_name(pvc).to_owned(),
        )),
    })
}

async fn provision(
    pvc: &PersistentVolumeClaim,
    ctx: &Context,
    work: Work,
) -> Result<Outcome, ClaimError> {
    let class = match work {
        Work::ReleaseFinalizer => {
            set_claim_finalizer(ctx, pvc, false).await?;
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
        set_claim_finalizer(ctx, pvc, true).await?;
    }

    let secrets = read_provisioner_secret(ctx, plan.secrets.provisioner.as_ref()).await?;
    let request = build_create_volume_request(&plan, secrets, None);
    let _busy = ctx.journal.record(in_flight(pvc, &plan, &request)).await?;
    ctx.events.publish(
        &pvc.object_ref(&()),
        EventType::Normal,
        PROVISIONING,
        &format!(
            "External provisioner is provisioning volume for claim \"{}\"",
            claim_key(pvc)
        ),
    );

    let response = {
        let _permit = ctx.limits.acquire(&plan.class_name).await;
        ctx.driver.create_volume(request.clone()).await
    };
    let response = match response {
        Ok(response) => response,
        Err(error) => {
            if error.class() == ErrorClass::InProgress {
                ctx.journal.note_failure(
                    &plan.volume_name,
                    Phase::Provisioning,
                    &error.to_string(),
                );
            } else {
                // A final answer: the driver created nothing under this name.
                ctx.journal.complete(&plan.volume_name);
            }
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

/// Adds or removes the provisioning-consistency finalizer.
pub(super) async fn set_claim_finalizer(
    ctx: &Context,
    pvc: &PersistentVolumeClaim,
    present: bool,
) -> Result<(), ClaimError> {
    let api: Api<PersistentVolumeClaim> =
        Api::namespaced(ctx.client.clone(), &pvc.namespace().unwrap_or_default());
    if present {
        add_finalizer(&api, pvc, PROVISIONING_FINALIZER).await
    } else {
        remove_finalizer(&api, pvc, PROVISIONING_FINALIZER).await
    }
    .map_err(|error| ClaimError::ClaimFinalizer(claim_key(pvc), error))
}

pub(super) async fn read_provisioner_secret(
    ctx: &Context,
    reference: Option<&SecretRef>,
) -> Result<HashMap<String, String>, ClaimError> {
    let Some(SecretRef { name, namespace }) = reference else {
        return Ok(HashMap::new());
    };
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), namespace);
    let secret = api
        .get(name)
        .await
        .map_err(|source| ClaimError::SecretGet {
            name: name.clone(),
            namespace: namespace.clone(),
            source,
        })?;
    Ok(secret_data(&secret)?)
}

/// A volume that cannot back a PV (too small) is deleted again, as upstream does; a response
/// without a volume id leaves the operation in flight so the next attempt learns the id.
async fn clean_up_unusable(
    ctx: &Context,
    plan: &ProvisionPlan,
    request: &csi::CreateVolumeRequest,
    error: VolumeError,
) -> ClaimError {
    let Some(volume_id) = error.volume_to_delete().map(str::to_owned) else {
        return ClaimError::Volume(error);
    };
    match delete_backend_volume(ctx, &plan.class_name, &volume_id, request.secrets.clone()).await {
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
            if already_exists_is_ours(&existing, &pv) {
                return Ok(());
            }
            let existing_handle = existing
                .spec
                .and_then(|spec| spec.csi)
                .map(|csi| csi.volume_handle)
                .unwrap_or_default();
            delete_backend_volume(ctx, &plan.class_name, &handle, request.secrets.clone())
                .await
                .map_err(ClaimError::Driver)?;
            ctx.journal.complete(&name);
            Err(ClaimError::PvTaken {
                name,
                existing: existing_handle,
                created: handle,
            })
        }
        Err(source) => Err(ClaimError::PvCreate { name, source }),
    }
}

pub(super) async fn delete_backend_volume(
    ctx: &Context,
    class: &str,
    volume_id: &str,
    secrets: HashMap<String, String>,
) -> Result<(), CallError> {
    let _permit = ctx.limits.acquire(class).await;
    ctx.driver
        .delete_volume(csi::DeleteVolumeRequest {
            volume_id: volume_id.to_owned(),
            secrets,
        })
        .await
        .map(|_| ())
}

fn in_flight(
    pvc: &PersistentVolumeClaim,
    plan: &ProvisionPlan,
    request: &csi::CreateVolumeRequest,
) -> InFlight {
    InFlight {
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

pub(super) fn claim_key(pvc: &PersistentVolumeClaim) -> String {
    format!("{}/{}", pvc.namespace().unwrap_or_default(), pvc.name_any())
}

/// The `source` label of the provisioning metrics: the claim's data source kind, or "".
fn data_source_kind(pvc: &PersistentVolumeClaim) -> &str {
    pvc.spec
        .as_ref()
        .and_then(|spec| spec.data_source.as_ref())
        .map_or("", |source| source.kind.as_str())
}
