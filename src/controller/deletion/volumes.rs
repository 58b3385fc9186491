//! The volume reconciler: keeps the PV finalizer in line with the reclaim policy and deletes
//! the backend volume, then the PV, once a PV of ours is Released with policy Delete.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use either::Either as DeleteResponse;
use futures::future::{self, Either};
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::{Api, DeleteParams, Preconditions};
use kube::runtime::controller::Controller;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use thiserror::Error;
use tracing::{error, info, warn};

use crate::controller::runtime::backoff::Backoff;
use crate::controller::runtime::cache::{CachedAttachment, CachedVolume};
use crate::controller::runtime::events::EventType;
use crate::controller::runtime::finalizers::{add_finalizer, remove_finalizer};
use crate::controller::runtime::measured::{Measured, Next};
use crate::controller::runtime::runner::{
    RESYNC_PERIOD, lock, log_result, never_fails, resync_with_work, until_drained_if_never_ready,
    with_work,
};
use crate::controller::shared::actions::{SecretReadError, delete_volume, read_secret};
use crate::controller::shared::context::Context;
use crate::csi_client::{CallError, migrated_calls};
use crate::metrics::VOLUMES_QUEUE;
use crate::provision::storage_capacity::RefreshCause;
use crate::provision::{
    AttachmentError, DeletionError, DeletionSecrets, FinalizerAction, PV_FINALIZER, SecretError,
    announce_detach_wait, check_detached, deletion_secret_from_class, deletion_target,
    has_deletable_source, is_migrated, may_delete_pv_first, should_delete, volume_finalizer_action,
    volume_has_work, volume_on_node,
};

#[derive(Debug, Error)]
pub enum VolumeError {
    #[error(transparent)]
    Target(#[from] DeletionError),
    /// A migrated PV whose in-tree source cannot be translated: it gets no finalizer and is
    /// not deleted; it is looked at again when it changes.
    #[error("{0}; the PV is left alone until it changes")]
    Untranslatable(DeletionError),
    #[error("failed to get secretreference for volume {volume}: {source}")]
    SecretReference {
        volume: String,
        source: DeletionError,
    },
    #[error(transparent)]
    SecretData(#[from] SecretError),
    #[error(transparent)]
    Attached(#[from] AttachmentError),
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
/// Ours (upstream #1574): the deletion waits for a VolumeAttachment to go; a Normal event, once
/// per wait, where upstream sends a `VolumeFailedDelete` Warning on every retry.
const WAITING_FOR_DETACH: &str = "WaitingForDetach";
/// How long a deletion waits for the VolumeAttachment watch's first list (at start-up the
/// volume watch may list first) before it is retried with backoff.
const ATTACHMENTS_LIST_WAIT: Duration = Duration::from_secs(10);

/// The volume controller: kube-runtime's controller over the PVs with work, from the PV
/// watch, a periodic resync and, for a driver that attaches volumes, the PVs whose last
/// VolumeAttachment went.
pub(in crate::controller) struct VolumeController<V, A> {
    reconciler: Arc<VolumeReconciler>,
    changed: V,
    /// The VolumeAttachment watch's events, for a driver with PUBLISH_UNPUBLISH_VOLUME.
    detached: Option<A>,
    queue: Measured,
}

impl<V, A> VolumeController<V, A>
where
    V: Stream<Item = Result<CachedVolume, watcher::Error>> + Send + 'static,
    A: Stream<Item = Result<CachedAttachment, watcher::Error>> + Send + 'static,
{
    /// `changed`: the PV watch's events.
    pub(in crate::controller) fn new(ctx: &Arc<Context>, changed: V, detached: Option<A>) -> Self {
        VolumeController {
            reconciler: Arc::new(VolumeReconciler::new(Arc::clone(ctx))),
            changed,
            detached,
            queue: Measured::new(ctx.metrics.queue(VOLUMES_QUEUE)),
        }
    }

    /// Runs until `drained`, letting the reconciles in flight finish.
    pub(in crate::controller) async fn run<D>(self, drained: impl Fn() -> D)
    where
        D: Future<Output = ()> + Send + Sync + 'static,
    {
        let VolumeController {
            reconciler,
            changed,
            detached,
            queue,
        } = self;
        let store = reconciler.ctx.volumes.clone();
        // Awaited in this task, beside the controller that waits on the same store's readiness
        // (kube-runtime's `DelayedInit` keeps one waker): a wake-up of either polls both.
        let listed = reconciler.ctx.volumes_listed.clone();
        let has_work = |reconciler: &Arc<VolumeReconciler>| {
            let reconciler = Arc::clone(reconciler);
            move |pv: &CachedVolume| reconciler.has_work(pv)
        };
        let mut controller = Controller::for_stream(
            queue.objects(with_work(changed, has_work(&reconciler))),
            store.clone(),
        );
        if let Some(detached) = detached {
            // Unlike upstream, a PV waiting for its attachment to go is retried as soon as it
            // has gone, not at the next backoff step (up to --retry-interval-max later).
            controller = controller.watches_stream(detached, volume_detached(&reconciler, &queue));
        }
        let results = controller
            .reconcile_on(queue.refs(resync_with_work(
                store.clone(),
                has_work(&reconciler),
                RESYNC_PERIOD,
            )))
            .graceful_shutdown_on(drained())
            .run(
                queue.reconcile(VolumeReconciler::reconcile),
                never_fails,
                reconciler,
            );
        let controller = queue.results(results).for_each(log_result);
        until_drained_if_never_ready(controller, listed, drained()).await;
    }
}

/// The mapper of VolumeAttachment events: the attachment's PV, if it has work.
fn volume_detached(
    reconciler: &Arc<VolumeReconciler>,
    queue: &Measured,
) -> impl Fn(CachedAttachment) -> Option<ObjectRef<CachedVolume>> + Send + Sync + 'static {
    let (reconciler, queue) = (Arc::clone(reconciler), queue.clone());
    move |attachment| {
        let pv = ObjectRef::new(attachment.attachment().persistent_volume_name?);
        let due = reconciler
            .ctx
            .volumes
            .get(&pv)
            .is_some_and(|cached| reconciler.has_work(&cached))
            .then_some(pv);
        queue.mapped(due).next()
    }
}

/// The volume reconciler of one sidecar process, and the per-PV state its reconciles keep
/// (none of it is read by another controller).
pub struct VolumeReconciler {
    ctx: Arc<Context>,
    /// Each failing PV's retry delay, by PV name.
    backoff: Mutex<Backoff<String>>,
    /// Migrated PVs whose in-tree source could not be translated, by name, with the
    /// resourceVersion that failed: left alone until they change (never retried in a loop).
    untranslatable: Mutex<HashMap<String, String>>,
    /// PVs whose deletion waits for a VolumeAttachment to go, by name, with the attachment the
    /// wait was announced for (one `WaitingForDetach` event per wait, not per retry).
    detach_waits: Mutex<HashMap<String, String>>,
}

impl VolumeReconciler {
    pub fn new(ctx: Arc<Context>) -> Self {
        let settings = &ctx.settings;
        VolumeReconciler {
            backoff: Mutex::new(Backoff::new(
                settings.retry_interval_start,
                settings.retry_interval_max,
            )),
            untranslatable: Mutex::new(HashMap::new()),
            detach_waits: Mutex::new(HashMap::new()),
            ctx,
        }
    }

    /// Entry point for the controller; failures are reported and retried here.
    ///
    /// As for claims (see `ClaimReconciler::reconcile`), a volume whose work is gone by the
    /// time it runs is answered at once, without allocating the full reconcile.
    pub fn reconcile(
        cached: Arc<CachedVolume>,
        this: Arc<Self>,
    ) -> impl Future<Output = Result<Next, std::convert::Infallible>> + Send + 'static {
        match this.triage(&cached) {
            Some(pv) => Either::Right(Box::pin(this.act(pv))),
            None => Either::Left(future::ready(Ok(Next::Wait))),
        }
    }

    /// Whether a reconcile of this PV would have anything to do now; see
    /// `ClaimReconciler::has_work`.
    pub fn has_work(&self, cached: &CachedVolume) -> bool {
        self.triage(cached).is_some()
    }

    async fn act(self: Arc<Self>, pv: PersistentVolume) -> Result<Next, std::convert::Infallible> {
        let ctx = &self.ctx;
        let name = pv.name_any();
        let started = Instant::now();
        let migrated = is_migrated(&pv, &ctx.settings.config.driver_name);
        match migrated_calls(migrated, self.reconcile_volume(&pv)).await {
            Ok(deleted) => {
                self.backoff().forget(&name);
                self.detach_waits().remove(&name);
                if deleted {
                    ctx.metrics
                        .delete_succeeded(&volume_class(&pv), started.elapsed());
                    info!(volume = name, "deleted");
                }
                Ok(Next::Wait)
            }
            Err(error) => {
                // An untranslatable PV that is not due for deletion was only refused our
                // finalizer: no deletion failed.
                if should_delete(&pv) || !matches!(error, VolumeError::Untranslatable(_)) {
                    ctx.metrics.delete_failed(&volume_class(&pv));
                }
                let message = error.to_string();
                if let VolumeError::Attached(AttachmentError::StillAttached {
                    attachment,
                    node,
                    ..
                }) = &error
                {
                    self.announce_detach_wait(&pv, attachment, node);
                } else {
                    self.detach_waits().remove(&name);
                }
                if matches!(
                    error,
                    VolumeError::Target(_)
                        | VolumeError::Untranslatable(_)
                        | VolumeError::SecretReference { .. }
                        | VolumeError::SecretData(_)
                        | VolumeError::Attached(AttachmentError::NotListed)
                        | VolumeError::Driver(_)
                ) {
                    ctx.events.publish(
                        &pv.object_ref(&()),
                        EventType::Warning,
                        VOLUME_FAILED_DELETE,
                        &message,
                    );
                }
                if matches!(error, VolumeError::Untranslatable(_)) {
                    warn!(volume = name, error = %message, "migrated volume left alone");
                    return Ok(Next::Wait);
                }
                let delay = self.backoff().failure(name.clone());
                warn!(volume = name, error = %message, retry_in = ?delay, "volume deletion failed");
                Ok(Next::RetryIn(delay))
            }
        }
    }
}

impl VolumeReconciler {
    /// The PV if it has work now; `None` (and its failure count forgotten) if not.
    fn triage(&self, cached: &CachedVolume) -> Option<PersistentVolume> {
        let ctx = &self.ctx;
        let pv = cached
            .to_volume()
            .inspect_err(|error| error!(%error, "not reconciling"))
            .ok()?;
        let name = pv.name_any();
        let version = pv.resource_version();
        if version.is_some() && self.untranslatable().get(&name) == version.as_ref() {
            return None;
        }
        // Node mode: another node's PV is left alone, silently (its own sidecar deletes it).
        let on_this_node = ctx
            .node_scope()
            .is_none_or(|node| volume_on_node(&pv, &ctx.settings.config.driver_name, &node));
        if on_this_node && volume_has_work(&pv, &ctx.settings.config.driver_name) {
            Some(pv)
        } else {
            self.backoff().forget(&name);
            self.untranslatable().remove(&name);
            self.detach_waits().remove(&name);
            None
        }
    }

    /// Returns whether the backend volume and the PV were deleted by this call. Called only for
    /// a PV that [`volume_has_work`].
    async fn reconcile_volume(&self, cached: &PersistentVolume) -> Result<bool, VolumeError> {
        let ctx = &*self.ctx;
        let api: Api<PersistentVolume> = Api::all(ctx.client.clone());
        let driver = ctx.settings.config.driver_name.as_str();
        let whole;
        let pv = if is_migrated(cached, driver) {
            match read_migrated(&api, cached).await? {
                Some(read) => {
                    whole = read;
                    &whole
                }
                None => return Ok(false),
            }
        } else {
            cached
        };
        match volume_finalizer_action(pv, driver) {
            FinalizerAction::Add => add_finalizer(&api, pv, PV_FINALIZER).await,
            FinalizerAction::Remove => remove_finalizer(&api, pv, PV_FINALIZER).await,
            FinalizerAction::None => Ok(()),
        }
        .map_err(|source| finalizer_error(pv, source))?;
        // Only after the finalizer: an untranslatable PV keeps it, the only trace of its volume
        // once the PV is deleted, as upstream.
        if is_migrated(cached, driver) {
            self.check_translatable(pv, cached)?;
        }
        if !should_delete(pv) || !has_deletable_source(pv, driver) {
            return Ok(false);
        }
        // A PV this sidecar cannot delete the volume of (no volume handle, a driver without
        // CREATE_DELETE_VOLUME) is reported before anything irrevocable happens to it.
        deletion_target(pv, &ctx.settings.caps, driver)?;
        let Some(stored) = commit_deletion(&api, pv).await? else {
            return Ok(false);
        };
        let target = deletion_target(&stored, &ctx.settings.caps, driver)?;
        let secrets = deletion_secrets(ctx, &stored, &target.secrets).await?;
        // Last, as upstream: the PV stays Terminating, held by our finalizer, until no
        // VolumeAttachment names it.
        check_attachments(ctx, &stored.name_any()).await?;
        delete_volume(ctx, &volume_class(&stored), &target.volume_handle, secrets)
            .await
            .map_err(VolumeError::Driver)?;
        ctx.refresh_capacity(|| RefreshCause::Deleted {
            affinity: stored
                .spec
                .as_ref()
                .and_then(|spec| spec.node_affinity.clone()),
        });
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

    /// A migrated PV whose handle cannot be translated is not deleted. The failure is remembered
    /// for this version of the PV, so it is not retried until the PV changes.
    fn check_translatable(
        &self,
        stored: &PersistentVolume,
        cached: &PersistentVolume,
    ) -> Result<(), VolumeError> {
        let ctx = &self.ctx;
        match deletion_target(stored, &ctx.settings.caps, &ctx.settings.config.driver_name) {
            Err(error @ DeletionError::Migration(_)) => {
                let version = cached.resource_version().unwrap_or_default();
                self.untranslatable().insert(cached.name_any(), version);
                Err(VolumeError::Untranslatable(error))
            }
            _ => Ok(()),
        }
    }

    /// One Normal event when the PV starts waiting for `attachment` to go, none on the retries
    /// of that wait.
    fn announce_detach_wait(&self, pv: &PersistentVolume, attachment: &str, node: &str) {
        let name = pv.name_any();
        let mut waits = self.detach_waits();
        if !announce_detach_wait(waits.get(&name).map(String::as_str), attachment) {
            return;
        }
        waits.insert(name, attachment.to_owned());
        drop(waits);
        self.ctx.events.publish(
            &pv.object_ref(&()),
            EventType::Normal,
            WAITING_FOR_DETACH,
            &format!(
                "waiting for VolumeAttachment {attachment} to be deleted: the volume is still \
                 attached to node {node}; it is deleted once detached"
            ),
        );
    }

    fn backoff(&self) -> MutexGuard<'_, Backoff<String>> {
        lock(&self.backoff)
    }

    fn untranslatable(&self) -> MutexGuard<'_, HashMap<String, String>> {
        lock(&self.untranslatable)
    }

    fn detach_waits(&self) -> MutexGuard<'_, HashMap<String, String>> {
        lock(&self.detach_waits)
    }
}

/// A migrated PV as stored (its handle is translated from fields the cache does not keep:
/// labels, claimRef), `None` if it is gone or replaced. One read per migrated PV with work;
/// such PVs are few.
async fn read_migrated(
    api: &Api<PersistentVolume>,
    cached: &PersistentVolume,
) -> Result<Option<PersistentVolume>, VolumeError> {
    let name = cached.name_any();
    let stored = api
        .get_opt(&name)
        .await
        .map_err(|source| VolumeError::Api {
            action: "read",
            name: name.clone(),
            source,
        })?;
    Ok(stored.filter(|stored| stored.uid() == cached.uid()))
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

/// Refuses DeleteVolume while a cached VolumeAttachment names the PV (see
/// `provision::check_detached`).
async fn check_attachments(ctx: &Context, pv_name: &str) -> Result<(), AttachmentError> {
    let attachments = match &ctx.attachments {
        Some(attachments) => attachments.listed(ATTACHMENTS_LIST_WAIT).await,
        None => None,
    };
    check_detached(
        pv_name,
        &ctx.settings.caps,
        attachments
            .as_ref()
            .map(|listed| listed.iter().map(|cached| cached.attachment())),
    )
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
            match deletion_secret_from_class(pv, class.as_deref(), &ctx.settings.config.driver_name)
            {
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

#[cfg(test)]
mod tests;
