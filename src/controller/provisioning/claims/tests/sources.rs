//! Clones and restores: the source protected, its content sent, cross-namespace grants.

use super::*;

const SOURCE_UID: &str = "5c1c8b4e-0000-4000-8000-00000000000a";
const SOURCE_PATH: &str = "/api/v1/namespaces/apps/persistentvolumeclaims/src";
const SNAPSHOT_PATH: &str = "/apis/snapshot.storage.k8s.io/v1/namespaces/apps/volumesnapshots/snap";

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
            // Recorded: still protected (a release in between would have been undone).
            get(SNAPSHOT_PATH).answer(200, snapshot(&[SNAPSHOT_PROTECTION_FINALIZER])),
            create_volume(
                CreateVolumeCall {
                    content_source: from_snapshot("snap-handle"),
                    ..expected_create()
                },
                created_from(from_snapshot("snap-handle")),
            ),
            pv_created(),
            // Released once nothing else restores it: no other Pending claim, no other
            // operation in flight restoring from its handle.
            get(SNAPSHOT_PATH).answer(200, snapshot(&[SNAPSHOT_PROTECTION_FINALIZER])),
            get(CONTENT_PATH).answer(200, content()),
            patch(SNAPSHOT_PATH).echo(200),
            record_removed(),
        ])
        .await;
    let restore = claim().data_source(Some("snapshot.storage.k8s.io"), "VolumeSnapshot", "snap");
    assert_eq!(reconcile(&scenario, restore.build()).await, Next::Wait);
    assert_eq!(scenario.finish().await, [provisioning(), succeeded()]);
}

const CONTENT_PATH: &str = "/apis/snapshot.storage.k8s.io/v1/volumesnapshotcontents/content-1";

/// While the claim list is not whole, a finished restore does not release the snapshot: a
/// claim restoring it may not have arrived yet (docs/journal.md rule 17). The sweeper, which
/// waits for the list, releases it.
#[tokio::test(start_paused = true)]
async fn a_finished_restore_leaves_the_snapshot_protected_while_the_claims_still_arrive() {
    let scenario = cluster()
        .claims_unlisted()
        .start([
            get(SNAPSHOT_PATH).answer(200, snapshot(&[SNAPSHOT_PROTECTION_FINALIZER])),
            get(CONTENT_PATH).answer(200, content()),
            get(SNAPSHOT_PATH).answer(200, snapshot(&[SNAPSHOT_PROTECTION_FINALIZER])),
            secret_read(),
            record_written(),
            get(SNAPSHOT_PATH).answer(200, snapshot(&[SNAPSHOT_PROTECTION_FINALIZER])),
            create_volume(
                CreateVolumeCall {
                    content_source: from_snapshot("snap-handle"),
                    ..expected_create()
                },
                created_from(from_snapshot("snap-handle")),
            ),
            pv_created(),
            // No read of the snapshot for its release, no PATCH.
            record_removed(),
        ])
        .await;
    let restore = claim().data_source(Some("snapshot.storage.k8s.io"), "VolumeSnapshot", "snap");
    assert_eq!(reconcile(&scenario, restore.build()).await, Next::Wait);
    assert_eq!(scenario.finish().await, [provisioning(), succeeded()]);
}

/// Issue #31, hole 4: a finished restore leaves the snapshot's finalizer on while another
/// restore of the same snapshot is in flight (docs/journal.md rule 12).
#[tokio::test(start_paused = true)]
async fn a_finished_restore_keeps_the_snapshot_protected_while_another_restores_it() {
    let other = Operation {
        volume_name: "pvc-other".to_owned(),
        claim_name: "other".to_owned(),
        claim_uid: "other-uid".to_owned(),
        request: csi::CreateVolumeRequest {
            name: "pvc-other".to_owned(),
            volume_content_source: from_snapshot("snap-handle"),
            ..recorded_operation().request
        },
        ..recorded_operation()
    };
    let scenario = cluster()
        .journaled(other)
        .start([
            get(SNAPSHOT_PATH).answer(200, snapshot(&[SNAPSHOT_PROTECTION_FINALIZER])),
            get(CONTENT_PATH).answer(200, content()),
            get(SNAPSHOT_PATH).answer(200, snapshot(&[SNAPSHOT_PROTECTION_FINALIZER])),
            secret_read(),
            journal_replaced(json!([our_record(), {"volumeName": "pvc-other"}])),
            get(SNAPSHOT_PATH).answer(200, snapshot(&[SNAPSHOT_PROTECTION_FINALIZER])),
            create_volume(
                CreateVolumeCall {
                    content_source: from_snapshot("snap-handle"),
                    ..expected_create()
                },
                created_from(from_snapshot("snap-handle")),
            ),
            pv_created(),
            get(SNAPSHOT_PATH).answer(200, snapshot(&[SNAPSHOT_PROTECTION_FINALIZER])),
            get(CONTENT_PATH).answer(200, content()),
            // No PATCH: the other restore still reads the snapshot.
            journal_replaced(json!([{"volumeName": "pvc-other"}])),
        ])
        .await;
    let restore = claim().data_source(Some("snapshot.storage.k8s.io"), "VolumeSnapshot", "snap");
    assert_eq!(reconcile(&scenario, restore.build()).await, Next::Wait);
    assert_eq!(scenario.finish().await, [provisioning(), succeeded()]);
}

#[tokio::test(start_paused = true)]
async fn a_cluster_without_the_snapshot_crd_is_told_so() {
    let scenario = cluster()
        .start([get(SNAPSHOT_PATH).refuse(404, "NotFound")])
        .await;
    let restore = claim().data_source(Some("snapshot.storage.k8s.io"), "VolumeSnapshot", "snap");
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
            get(CONTENT_PATH).answer(200, content.clone()),
            get(OTHER_SNAPSHOT_PATH).answer(200, in_other(snapshot(&[]))),
            patch(OTHER_SNAPSHOT_PATH)
                .body(json!({"metadata": {"finalizers": [SNAPSHOT_PROTECTION_FINALIZER]}}))
                .echo(200),
            secret_read(),
            record_written(),
            get(OTHER_SNAPSHOT_PATH)
                .answer(200, in_other(snapshot(&[SNAPSHOT_PROTECTION_FINALIZER]))),
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
            get(CONTENT_PATH).answer(200, content.clone()),
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
