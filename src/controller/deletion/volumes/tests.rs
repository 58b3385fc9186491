use k8s_openapi::api::storage::v1::VolumeAttachment;
use serde_json::json;
use tonic::Status;

use super::*;
use crate::controller::testing::fixtures::{
    Cluster, RETRY_START, SECRETS, Scenario, Step, bounded, cached, delete, delete_volume, get,
    patch, secret_read,
};
use crate::provision::fixtures::{DRIVER, PvBuilder};
use crate::provision::{ANN_DELETION_SECRET_NAME, ANN_DELETION_SECRET_NAMESPACE, ANN_MIGRATED_TO};

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
        scenario.volumes(),
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
/// VolumeAttachment names it: one Normal event naming the attachment (upstream: a Warning
/// `VolumeFailedDelete` on every retry), and a retry.
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
            "PersistentVolume/pv-1 Normal WaitingForDetach: waiting for VolumeAttachment csi-pv-1-node-1 to be deleted: the volume is still attached to node node-1; it is deleted once detached"
        ]
    );
}

/// The retries of one wait say nothing more: one `WaitingForDetach` for the wait, no Warning.
#[tokio::test(start_paused = true)]
async fn a_wait_for_detach_is_announced_once() {
    let scenario = Cluster::new()
        .attaching([attachment("pv-1", "node-1")])
        .start([
            pv_deleted_first(),
            secret_read(),
            get(PV_PATH).answer(200, released().deleting().build()),
            secret_read(),
        ])
        .await;
    assert_eq!(
        reconcile(&scenario, released().build()).await,
        Next::RetryIn(RETRY_START)
    );
    assert_eq!(
        reconcile(&scenario, released().deleting().build()).await,
        Next::RetryIn(RETRY_START * 2)
    );
    assert_eq!(
        scenario.finish().await,
        [
            "PersistentVolume/pv-1 Normal WaitingForDetach: waiting for VolumeAttachment csi-pv-1-node-1 to be deleted: the volume is still attached to node node-1; it is deleted once detached"
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
    assert!(!scenario.volumes().has_work(&cached(&theirs)));
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
    let volumes = scenario.volumes();
    assert!(!volumes.has_work(&cached(&with_identity("node-a"))));
    assert!(!volumes.has_work(&cached(&released().build())));
    assert!(volumes.has_work(&cached(&with_identity("node-b"))));
    drop(volumes);
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
                .body(
                    json!({ "metadata": { "finalizers": [PV_FINALIZER], "resourceVersion": "5" } }),
                )
                .answer(200, in_tree("not__zones").resource_version("6").build()),
        ])
        .await;
    assert_eq!(reconcile(&scenario, bound().build()).await, Next::Wait);
    // The same version is not looked at again, not even at a resync.
    let volumes = scenario.volumes();
    assert!(!volumes.has_work(&cached(&bound().build())));
    assert!(volumes.has_work(&cached(&bound().resource_version("6").build())));
    drop(volumes);
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
    let volumes = scenario.volumes();
    assert!(!volumes.has_work(&cached(&ebs().no_finalizer().build())));
    drop(volumes);
    assert_eq!(scenario.finish().await, Vec::<String>::new());
}
