//! The volume reconciler: keeps the PV finalizer in line with the reclaim policy and deletes
//! the backend volume, then the PV, once a PV of ours is Released with policy Delete.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use either::Either as DeleteResponse;
use futures::future::{self, Either};
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::{Api, DeleteParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use thiserror::Error;
use tracing::{error, info, warn};

use super::actions::{SecretReadError, delete_volume, read_secret};
use super::cache::CachedVolume;
use super::context::Context;
use super::events::EventType;
use super::finalizers::{add_finalizer, remove_finalizer};
use crate::csi_client::CallError;
use crate::provision::{
    DeletionError, DeletionSecrets, FinalizerAction, PV_FINALIZER, SecretError,
    deletion_secret_from_class, deletion_target, may_delete_pv_first, pv_finalizer_action,
    should_delete, volume_has_work,
};

#[derive(Debug, Error)]
pub enum VolumeError {
    #[error(transparent)]
    Target(#[from] DeletionError),
    #[error("failed to get secretreference for volume {volume}: {source}")]
    SecretReference {
        volume: String,
        source: DeletionError,
    },
    #[error(transparent)]
    SecretData(#[from] SecretError),
    #[error("{0}")]
    Driver(CallError),
    #[error("failed to {action} PersistentVolume {name}: {source}")]
    Api {
        action: &'static str,
        name: String,
        source: kube::Error,
    },
}

const VOLUME_FAILED_DELETE: &str = "VolumeFailedDelete";

pub struct VolumeReconciler;

impl VolumeReconciler {
    /// Entry point for the controller; failures are reported and retried here.
    ///
    /// As for claims (see `ClaimReconciler::reconcile`), a volume whose work is gone by the
    /// time it runs is answered at once, without allocating the full reconcile.
    pub fn reconcile(
        cached: Arc<CachedVolume>,
        ctx: Arc<Context>,
    ) -> impl Future<Output = Result<Action, std::convert::Infallible>> + Send + 'static {
        match triage(&cached, &ctx) {
            Some(pv) => Either::Right(Box::pin(Self::act(pv, ctx))),
            None => Either::Left(future::ready(Ok(Action::await_change()))),
        }
    }

    /// Whether a reconcile of this PV would have anything to do now; see
    /// `ClaimReconciler::has_work`.
    pub fn has_work(cached: &CachedVolume, ctx: &Context) -> bool {
        triage(cached, ctx).is_some()
    }

    async fn act(
        pv: PersistentVolume,
        ctx: Arc<Context>,
    ) -> Result<Action, std::convert::Infallible> {
        let name = pv.name_any();
        let started = Instant::now();
        match reconcile_volume(&pv, &ctx).await {
            Ok(deleted) => {
                ctx.volume_backoff().forget(&name);
                if deleted {
                    ctx.metrics
                        .delete_succeeded(&volume_class(&pv), started.elapsed());
                    info!(volume = name, "deleted");
                }
                Ok(Action::await_change())
            }
            Err(error) => {
                ctx.metrics.delete_failed(&volume_class(&pv));
                let message = error.to_string();
                if matches!(
                    error,
                    VolumeError::Target(_)
                        | VolumeError::SecretReference { .. }
                        | VolumeError::SecretData(_)
                        | VolumeError::Driver(_)
                ) {
                    ctx.events.publish(
                        &pv.object_ref(&()),
                        EventType::Warning,
                        VOLUME_FAILED_DELETE,
                        &message,
                    );
                }
                let delay = ctx.volume_backoff().failure(name.clone());
                warn!(volume = name, error = %message, retry_in = ?delay, "volume deletion failed");
                Ok(Action::requeue(delay))
            }
        }
    }
}

/// The PV if it has work now; `None` (and its failure count forgotten) if not.
fn triage(cached: &CachedVolume, ctx: &Context) -> Option<PersistentVolume> {
    let pv = cached
        .to_volume()
        .inspect_err(|error| error!(%error, "not reconciling"))
        .ok()?;
    if volume_has_work(&pv, &ctx.config.driver_name) {
        Some(pv)
    } else {
        ctx.volume_backoff().forget(&pv.name_any());
        None
    }
}

/// Returns whether the backend volume and the PV were deleted by this call. Called only for
/// a PV that [`volume_has_work`].
async fn reconcile_volume(pv: &PersistentVolume, ctx: &Context) -> Result<bool, VolumeError> {
    let api: Api<PersistentVolume> = Api::all(ctx.client.clone());
    match pv_finalizer_action(pv) {
        FinalizerAction::Add => add_finalizer(&api, pv, PV_FINALIZER).await,
        FinalizerAction::Remove => remove_finalizer(&api, pv, PV_FINALIZER).await,
        FinalizerAction::None => Ok(()),
    }
    .map_err(|source| finalizer_error(pv, source))?;
    if !should_delete(pv) {
        return Ok(false);
    }
    // A PV this sidecar cannot delete the volume of (not CSI, no volume handle, a driver
    // without CREATE_DELETE_VOLUME) is reported before anything irrevocable happens to it.
    deletion_target(pv, &ctx.caps)?;
    let Some(stored) = commit_deletion(&api, pv).await? else {
        return Ok(false);
    };
    let target = deletion_target(&stored, &ctx.caps)?;
    let secrets = deletion_secrets(ctx, &stored, &target.secrets).await?;
    delete_volume(ctx, &volume_class(&stored), &target.volume_handle, secrets)
        .await
        .map_err(VolumeError::Driver)?;
    let name = pv.name_any();
    let terminating = if stored.metadata.deletion_timestamp.is_some() {
        stored
    } else {
        let uid_precondition = DeleteParams {
            preconditions: Some(Preconditions {
                uid: stored.uid(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&name, &uid_precondition).await {
            Ok(DeleteResponse::Left(terminating)) => terminating,
            Ok(DeleteResponse::Right(_)) => return Ok(true),
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => {
                return Ok(true);
            }
            Err(source) => {
                return Err(VolumeError::Api {
                    action: "delete",
                    name,
                    source,
                });
            }
        }
    };
    remove_finalizer(&api, &terminating, PV_FINALIZER)
        .await
        .map_err(|source| finalizer_error(&terminating, source))?;
    Ok(true)
}

/// Checks the cached decision to delete against the API server before DeleteVolume, and
/// returns the PV as stored, or `None` when it no longer stands (a newer version of the PV
/// gets its own reconcile).
///
/// A PV that [`may_delete_pv_first`] is deleted with the cached UID and resourceVersion as
/// preconditions: the request that makes the deletion irrevocable is also the quorum check,
/// so a deletion costs two requests (this one and the finalizer's removal), as upstream's,
/// which checks nothing. Any other PV is read from the API server instead.
async fn commit_deletion(
    api: &Api<PersistentVolume>,
    pv: &PersistentVolume,
) -> Result<Option<PersistentVolume>, VolumeError> {
    let name = pv.name_any();
    if may_delete_pv_first(pv) {
        let unchanged = DeleteParams {
            preconditions: Some(Preconditions {
                uid: pv.uid(),
                resource_version: pv.resource_version(),
            }),
            ..DeleteParams::default()
        };
        return match api.delete(&name, &unchanged).await {
            Ok(DeleteResponse::Left(terminating)) => Ok(Some(terminating)),
            // Gone at once: our finalizer was not on it after all. The cached PV is the
            // version that was deleted; its volume is still to be deleted.
            Ok(DeleteResponse::Right(_)) => Ok(Some(pv.clone())),
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(None),
            Err(source) => Err(VolumeError::Api {
                action: "delete",
                name,
                source,
            }),
        };
    }
    let fresh = api
        .get_opt(&name)
        .await
        .map_err(|source| VolumeError::Api {
            action: "read",
            name,
            source,
        })?;
    Ok(fresh.filter(|fresh| fresh.uid() == pv.uid() && should_delete(fresh)))
}

/// DeleteVolume's secrets. A Secret that cannot be read is logged and skipped, as upstream
/// does: refusing would keep the volume forever when the Secret is gone.
async fn deletion_secrets(
    ctx: &Context,
    pv: &PersistentVolume,
    decision: &DeletionSecrets,
) -> Result<HashMap<String, String>, VolumeError> {
    let reference = match decision {
        DeletionSecrets::None => return Ok(HashMap::new()),
        DeletionSecrets::Fetch(reference) => reference.clone(),
        DeletionSecrets::FromStorageClass { class_name } => {
            let class = ctx.classes.get(&ObjectRef::new(class_name));
            match deletion_secret_from_class(pv, class.as_deref()) {
                Ok(Some(reference)) => reference,
                Ok(None) => return Ok(HashMap::new()),
                Err(source) => {
                    return Err(VolumeError::SecretReference {
                        volume: pv.name_any(),
                        source,
                    });
                }
            }
        }
    };
    match read_secret(&ctx.client, Some(&reference)).await {
        Ok(secrets) => Ok(secrets),
        Err(SecretReadError::Data(error)) => Err(error.into()),
        Err(SecretReadError::Get { source, .. }) => {
            warn!(volume = pv.name_any(), error = %source, "deleting without secrets: the deletion secret is unreadable");
            Ok(HashMap::new())
        }
    }
}

fn finalizer_error(pv: &PersistentVolume, source: kube::Error) -> VolumeError {
    VolumeError::Api {
        action: "update finalizers of",
        name: pv.name_any(),
        source,
    }
}

fn volume_class(pv: &PersistentVolume) -> String {
    pv.spec
        .as_ref()
        .and_then(|spec| spec.storage_class_name.clone())
        .unwrap_or_default()
}
