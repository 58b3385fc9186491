//! The volume reconciler: keeps the PV finalizer in line with the reclaim policy and deletes
//! the backend volume, then the PV, once a PV of ours is Released with policy Delete.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::measured::Next;
use either::Either as DeleteResponse;
use futures::future::{self, Either};
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::{Api, DeleteParams, Preconditions};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use thiserror::Error;
use tracing::{error, info, warn};

use super::actions::{SecretReadError, delete_volume, read_secret};
use super::cache::CachedVolume;
use super::context::Context;
use super::events::EventType;
use super::finalizers::{add_finalizer, remove_finalizer};
use crate::csi_client::{CallError, migrated_calls};
use crate::provision::storage_capacity::RefreshCause;
use crate::provision::{
    AttachmentError, DeletionError, DeletionSecrets, FinalizerAction, PV_FINALIZER, SecretError,
    check_detached, deletion_secret_from_class, deletion_target, has_deletable_source, is_migrated,
    may_delete_pv_first, should_delete, volume_finalizer_action, volume_has_work, volume_on_node,
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
/// How long a deletion waits for the VolumeAttachment watch's first list (at start-up the
/// volume watch may list first) before it is retried with backoff.
const ATTACHMENTS_LIST_WAIT: Duration = Duration::from_secs(10);

pub struct VolumeReconciler;

impl VolumeReconciler {
    /// Entry point for the controller; failures are reported and retried here.
    ///
    /// As for claims (see `ClaimReconciler::reconcile`), a volume whose work is gone by the
    /// time it runs is answered at once, without allocating the full reconcile.
    pub fn reconcile(
        cached: Arc<CachedVolume>,
        ctx: Arc<Context>,
    ) -> impl Future<Output = Result<Next, std::convert::Infallible>> + Send + 'static {
        match triage(&cached, &ctx) {
            Some(pv) => Either::Right(Box::pin(Self::act(pv, ctx))),
            None => Either::Left(future::ready(Ok(Next::Wait))),
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
    ) -> Result<Next, std::convert::Infallible> {
        let name = pv.name_any();
        let started = Instant::now();
        let migrated = is_migrated(&pv, &ctx.config.driver_name);
        match migrated_calls(migrated, reconcile_volume(&pv, &ctx)).await {
            Ok(deleted) => {
                ctx.volume_backoff().forget(&name);
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
                if matches!(
                    error,
                    VolumeError::Target(_)
                        | VolumeError::Untranslatable(_)
                        | VolumeError::SecretReference { .. }
                        | VolumeError::SecretData(_)
                        | VolumeError::Attached(_)
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
                let delay = ctx.volume_backoff().failure(name.clone());
                warn!(volume = name, error = %message, retry_in = ?delay, "volume deletion failed");
                Ok(Next::RetryIn(delay))
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
    let name = pv.name_any();
    let version = pv.resource_version();
    if version.is_some() && ctx.untranslatable().get(&name) == version.as_ref() {
        return None;
    }
    // Node mode: another node's PV is left alone, silently (its own sidecar deletes it).
    let on_this_node = ctx
        .node_scope()
        .is_none_or(|node| volume_on_node(&pv, &ctx.config.driver_name, &node));
    if on_this_node && volume_has_work(&pv, &ctx.config.driver_name) {
        Some(pv)
    } else {
        ctx.volume_backoff().forget(&name);
        ctx.untranslatable().remove(&name);
        None
    }
}

/// Returns whether the backend volume and the PV were deleted by this call. Called only for
/// a PV that [`volume_has_work`].
async fn reconcile_volume(cached: &PersistentVolume, ctx: &Context) -> Result<bool, VolumeError> {
    let api: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let driver = ctx.config.driver_name.as_str();
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
        check_translatable(pv, cached, ctx)?;
    }
    if !should_delete(pv) || !has_deletable_source(pv, driver) {
        return Ok(false);
    }
    // A PV this sidecar cannot delete the volume of (no volume handle, a driver without
    // CREATE_DELETE_VOLUME) is reported before anything irrevocable happens to it.
    deletion_target(pv, &ctx.caps, driver)?;
    let Some(stored) = commit_deletion(&api, pv).await? else {
        return Ok(false);
    };
    let target = deletion_target(&stored, &ctx.caps, driver)?;
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

/// A migrated PV whose handle cannot be translated is not deleted. The failure is remembered
/// for this version of the PV, so it is not retried until the PV changes.
fn check_translatable(
    stored: &PersistentVolume,
    cached: &PersistentVolume,
    ctx: &Context,
) -> Result<(), VolumeError> {
    match deletion_target(stored, &ctx.caps, &ctx.config.driver_name) {
        Err(error @ DeletionError::Migration(_)) => {
            let version = cached.resource_version().unwrap_or_default();
            ctx.untranslatable().insert(cached.name_any(), version);
            Err(VolumeError::Untranslatable(error))
        }
        _ => Ok(()),
    }
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
        &ctx.caps,
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
            match deletion_secret_from_class(pv, class.as_deref(), &ctx.config.driver_name) {
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
mod tests {
    use k8s_openapi::api::storage::v1::VolumeAttachment;
    use serde_json::json;
    use tonic::Status;

    use super::*;
    use crate::controller::fixtures::{
        Cluster, RETRY_START, SECRETS, Scenario, Step, bounded, cached, delete, delete_volume, get,
        patch, secret_read,
    };
    use crate::provision::fixtures::{DRIVER, PvBuilder};
    use crate::provision::{
        ANN_DELETION_SECRET_NAME, ANN_DELETION_SECRET_NAMESPACE, ANN_MIGRATED_TO,
    };

    const PV_PATH: &str = "/api/v1/persistentvolumes/pv-1";
    const PV_UID: &str = "pv-uid-1";

    /// PV `pv-1` of ours, released by its claim, policy Delete, with our finalizer and its
    /// deletion secret recorded.
    fn released() -> PvBuilder {
        PvBuilder::new()
            .uid(PV_UID)
            .resource_version("5")
            .provisioned_by(DRIVER)
            .annotation(ANN_DELETION_SECRET_NAME, "creds")
            .annotation(ANN_DELETION_SECRET_NAMESPACE, "apps")
            .phase("Released")
    }

    /// The PV delete that both checks the cached PV and makes the deletion irrevocable.
    fn pv_deleted_first() -> Step {
        delete(PV_PATH)
            .body(json!({ "preconditions": { "uid": PV_UID, "resourceVersion": "5" } }))
            .answer(200, released().deleting().build())
    }

    /// Our finalizer, the first of the PV's, comes off.
    fn finalizer_removed(pv: PvBuilder) -> Step {
        patch(PV_PATH)
            .body(json!([
                { "op": "test", "path": "/metadata/uid", "value": PV_UID },
                { "op": "test", "path": "/metadata/finalizers/0", "value": PV_FINALIZER },
                { "op": "remove", "path": "/metadata/finalizers/0" },
            ]))
            .answer(200, pv.no_finalizer().build())
    }

    async fn reconcile(scenario: &Scenario, pv: PersistentVolume) -> Next {
        let Ok(action) = bounded(VolumeReconciler::reconcile(
            Arc::new(cached(&pv)),
            scenario.ctx(),
        ))
        .await;
        action
    }

    #[tokio::test(start_paused = true)]
    async fn deleted() {
        let scenario = Cluster::new()
            .start([
                pv_deleted_first(),
                secret_read(),
                delete_volume("vol-1", SECRETS, Ok(())),
                finalizer_removed(released().deleting()),
            ])
            .await;
        assert_eq!(reconcile(&scenario, released().build()).await, Next::Wait);
        assert_eq!(scenario.finish().await, Vec::<String>::new());
    }

    #[tokio::test(start_paused = true)]
    async fn a_pv_without_our_finalizer_is_read_first_and_deleted_after_its_volume() {
        let unprotected = || released().no_finalizer();
        let scenario = Cluster::new()
            .start([
                get(PV_PATH).answer(200, unprotected().build()),
                secret_read(),
                delete_volume("vol-1", SECRETS, Ok(())),
                delete(PV_PATH)
                    .body(json!({ "preconditions": { "uid": PV_UID } }))
                    .answer(
                        200,
                        json!({ "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success" }),
                    ),
            ])
            .await;
        assert_eq!(
            reconcile(&scenario, unprotected().build()).await,
            Next::Wait
        );
        assert_eq!(scenario.finish().await, Vec::<String>::new());
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_delete_volume_keeps_the_pv() {
        let scenario = Cluster::new()
            .start([
                pv_deleted_first(),
                secret_read(),
                delete_volume("vol-1", SECRETS, Err(Status::internal("backend down"))),
            ])
            .await;
        assert_eq!(
            reconcile(&scenario, released().build()).await,
            Next::RetryIn(RETRY_START)
        );
        assert_eq!(
            scenario.finish().await,
            [
                "PersistentVolume/pv-1 Warning VolumeFailedDelete: rpc error: code = Internal desc = backend down"
            ]
        );
    }

    fn attachment(pv: &str, node: &str) -> VolumeAttachment {
        serde_json::from_value(json!({
            "metadata": { "name": format!("csi-{pv}-{node}") },
            "spec": {
                "attacher": DRIVER,
                "nodeName": node,
                "source": { "persistentVolumeName": pv },
            },
        }))
        .expect("a VolumeAttachment")
    }

    /// The PV is deleted first (our finalizer holds it), then no DeleteVolume while a
    /// VolumeAttachment names it: upstream's event, and a retry.
    #[tokio::test(start_paused = true)]
    async fn an_attached_volume_is_not_deleted() {
        let scenario = Cluster::new()
            .attaching([attachment("pv-2", "node-2"), attachment("pv-1", "node-1")])
            .start([pv_deleted_first(), secret_read()])
            .await;
        assert_eq!(
            reconcile(&scenario, released().build()).await,
            Next::RetryIn(RETRY_START)
        );
        assert_eq!(
            scenario.finish().await,
            [
                "PersistentVolume/pv-1 Warning VolumeFailedDelete: persistentvolume pv-1 is still attached to node node-1"
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn attachments_of_other_volumes_do_not_hold_the_deletion() {
        let scenario = Cluster::new()
            .attaching([attachment("pv-10", "node-1")])
            .start([
                pv_deleted_first(),
                secret_read(),
                delete_volume("vol-1", SECRETS, Ok(())),
                finalizer_removed(released().deleting()),
            ])
            .await;
        assert_eq!(reconcile(&scenario, released().build()).await, Next::Wait);
        assert_eq!(scenario.finish().await, Vec::<String>::new());
    }

    #[tokio::test(start_paused = true)]
    async fn a_retained_pv_only_loses_the_finalizer() {
        let retained = || released().policy("Retain");
        let scenario = Cluster::new().start([finalizer_removed(retained())]).await;
        assert_eq!(reconcile(&scenario, retained().build()).await, Next::Wait);
        assert_eq!(scenario.finish().await, Vec::<String>::new());
    }

    // ------------------------------------------------------------------ node deployment

    const NODE_KEY: &str = "example.com/node";

    fn node_b() -> Cluster {
        Cluster::new().node_mode("node-b", &[(NODE_KEY, "node-b")])
    }

    #[tokio::test(start_paused = true)]
    async fn a_pv_of_another_node_gets_no_request() {
        let scenario = node_b().start([]).await;
        let theirs = released().on(NODE_KEY, "node-a").build();
        assert!(!VolumeReconciler::has_work(
            &cached(&theirs),
            &scenario.ctx()
        ));
        assert_eq!(reconcile(&scenario, theirs).await, Next::Wait);
        assert_eq!(scenario.finish().await, Vec::<String>::new());
    }

    #[tokio::test(start_paused = true)]
    async fn a_pv_of_this_node_is_deleted() {
        let mine = || released().on(NODE_KEY, "node-b");
        let scenario = node_b()
            .start([
                delete(PV_PATH)
                    .body(json!({ "preconditions": { "uid": PV_UID, "resourceVersion": "5" } }))
                    .answer(200, mine().deleting().build()),
                secret_read(),
                delete_volume("vol-1", SECRETS, Ok(())),
                finalizer_removed(mine().deleting()),
            ])
            .await;
        assert_eq!(reconcile(&scenario, mine().build()).await, Next::Wait);
        assert_eq!(scenario.finish().await, Vec::<String>::new());
    }

    #[tokio::test(start_paused = true)]
    async fn a_pv_without_affinity_is_deleted_only_by_the_node_that_created_it() {
        let with_identity = |node: &str| {
            let mut pv = released().build();
            if let Some(csi) = pv.spec.as_mut().and_then(|spec| spec.csi.as_mut()) {
                csi.volume_attributes = Some(
                    [(
                        crate::provision::PROVISIONER_IDENTITY_KEY.to_owned(),
                        format!("1700000000000-42-{DRIVER}-{node}"),
                    )]
                    .into(),
                );
            }
            pv
        };
        let scenario = node_b().start([]).await;
        let ctx = scenario.ctx();
        assert!(!VolumeReconciler::has_work(
            &cached(&with_identity("node-a")),
            &ctx
        ));
        assert!(!VolumeReconciler::has_work(
            &cached(&released().build()),
            &ctx
        ));
        assert!(VolumeReconciler::has_work(
            &cached(&with_identity("node-b")),
            &ctx
        ));
        drop(ctx);
        assert_eq!(scenario.finish().await, Vec::<String>::new());
    }

    const GCE: &str = "pd.csi.storage.gke.io";

    /// A GCE PD PV provisioned in-tree (or by a migrated claim), with zone label `zones`.
    fn in_tree(zones: &str) -> PvBuilder {
        PvBuilder::new()
            .uid(PV_UID)
            .resource_version("5")
            .provisioned_by("kubernetes.io/gce-pd")
            .no_csi()
            .map(|pv| {
                pv.metadata.labels =
                    Some([("topology.kubernetes.io/zone".to_owned(), zones.to_owned())].into());
                if let Some(spec) = pv.spec.as_mut() {
                    spec.gce_persistent_disk = Some(Default::default());
                    if let Some(source) = spec.gce_persistent_disk.as_mut() {
                        "disk-1".clone_into(&mut source.pd_name);
                    }
                }
            })
    }

    #[tokio::test(start_paused = true)]
    async fn a_migrated_pv_is_deleted_with_the_handle_translated_from_the_whole_pv() {
        let released = || in_tree("us-central1-a").phase("Released");
        let scenario = Cluster::new()
            .driver(GCE)
            .start([
                get(PV_PATH).answer(200, released().build()),
                delete(PV_PATH)
                    .body(json!({ "preconditions": { "uid": PV_UID, "resourceVersion": "5" } }))
                    .answer(200, released().deleting().build()),
                delete_volume(
                    "projects/UNSPECIFIED/zones/us-central1-a/disks/disk-1",
                    &[],
                    Ok(()),
                ),
                finalizer_removed(released().deleting()),
            ])
            .await;
        // The cache keeps no labels: the zone comes from the PV as stored.
        let mut cached_copy = released().build();
        cached_copy.metadata.labels = None;
        assert_eq!(reconcile(&scenario, cached_copy).await, Next::Wait);
        assert_eq!(scenario.finish().await, Vec::<String>::new());
    }

    const UNTRANSLATABLE: &str = "PersistentVolume/pv-1 Warning VolumeFailedDelete: failed to get region from zones: zone in unexpected format, expected: {locale}-{region}-{zone}, got: not; the PV is left alone until it changes";

    /// Our finalizer is the only trace of the volume once the PV is deleted: an
    /// untranslatable PV gets it (as upstream), and only its deletion is skipped.
    #[tokio::test(start_paused = true)]
    async fn a_migrated_pv_that_cannot_be_translated_gets_our_finalizer_and_no_retry() {
        let bound = || in_tree("not__zones").no_finalizer();
        let scenario = Cluster::new()
            .driver(GCE)
            .start([
                get(PV_PATH).answer(200, bound().build()),
                patch(PV_PATH)
                    .body(json!({ "metadata": { "finalizers": [PV_FINALIZER], "resourceVersion": "5" } }))
                    .answer(200, in_tree("not__zones").resource_version("6").build()),
            ])
            .await;
        assert_eq!(reconcile(&scenario, bound().build()).await, Next::Wait);
        // The same version is not looked at again, not even at a resync.
        let ctx = scenario.ctx();
        assert!(!VolumeReconciler::has_work(&cached(&bound().build()), &ctx));
        assert!(VolumeReconciler::has_work(
            &cached(&bound().resource_version("6").build()),
            &ctx
        ));
        drop(ctx);
        assert_eq!(scenario.finish().await, vec![UNTRANSLATABLE]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_released_untranslatable_pv_keeps_our_finalizer_and_its_volume() {
        let released = || in_tree("not__zones").phase("Released");
        let scenario = Cluster::new()
            .driver(GCE)
            .start([get(PV_PATH).answer(200, released().build())])
            .await;
        assert_eq!(reconcile(&scenario, released().build()).await, Next::Wait);
        assert_eq!(scenario.finish().await, vec![UNTRANSLATABLE]);
    }

    #[tokio::test(start_paused = true)]
    async fn an_in_tree_pv_this_driver_cannot_name_only_loses_our_finalizer() {
        // migrated-to names us, but the source is another plugin's: never deleted by us.
        let ebs = || {
            PvBuilder::new()
                .uid(PV_UID)
                .resource_version("5")
                .annotation(ANN_MIGRATED_TO, GCE)
                .no_csi()
                .phase("Released")
                .map(|pv| {
                    if let Some(spec) = pv.spec.as_mut() {
                        spec.aws_elastic_block_store = Some(Default::default());
                    }
                })
        };
        let scenario = Cluster::new()
            .driver(GCE)
            .start([finalizer_removed(ebs())])
            .await;
        assert_eq!(reconcile(&scenario, ebs().build()).await, Next::Wait);
        let ctx = scenario.ctx();
        assert!(!VolumeReconciler::has_work(
            &cached(&ebs().no_finalizer().build()),
            &ctx
        ));
        drop(ctx);
        assert_eq!(scenario.finish().await, Vec::<String>::new());
    }
}
