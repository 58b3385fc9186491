//! The real Kubernetes snapshot machinery (snapshot-controller and csi-snapshotter of
//! external-snapshotter, support::snapshots) around a claim our sidecar provisioned, on the real
//! control plane with the Kubernetes e2e mock driver (it serves CREATE_DELETE_SNAPSHOT).

use csi_test_support as support;

use support::cluster::{Cluster, wait_bound};
use support::mock_driver::{MockDriver, MockDriverOptions};
use support::peers::Sidecar;
use support::snapshots::Snapshotter;

#[tokio::test]
async fn a_volume_snapshot_of_a_provisioned_claim_becomes_ready_and_goes_with_its_content() {
    // The scheduler binary's control plane, whichever test starts it (tests/scheduler/main.rs).
    support::control_plane_with_scheduler();
    let cluster = Cluster::new("snap").await;
    let driver = MockDriver::start(MockDriverOptions::default()).await;
    let mut sidecar = Sidecar::start(&driver, &[]);
    let snapshotter = Snapshotter::start(&driver);
    let class = cluster.class("mock", &driver, "Delete", &[]).await;
    cluster.claim("data", &class).await;
    let pvc = wait_bound(&cluster.claims, "data").await;
    let volume_name = pvc
        .spec
        .and_then(|spec| spec.volume_name)
        .expect("a bound claim names its PV");
    let volume_handle = cluster
        .pv(&volume_name)
        .await
        .spec
        .and_then(|spec| spec.csi)
        .map(|csi| csi.volume_handle)
        .expect("a CSI PV");

    let snapshot_class = cluster.snapshot_class("snap", &driver).await;
    let (snapshot, content) = cluster
        .take_snapshot("data-snap", "data", &snapshot_class, &snapshotter)
        .await;

    let content_name = content.metadata.name.clone().unwrap_or_default();
    assert_eq!(content.spec.driver, driver.name());
    assert_eq!(
        content.spec.source.volume_handle.as_deref(),
        Some(volume_handle.as_str()),
        "the content snapshots the claim's volume"
    );
    assert_eq!(
        content.spec.volume_snapshot_ref.uid, snapshot.metadata.uid,
        "the content is bound to our snapshot"
    );
    let content_status = content.status.clone().unwrap_or_default();
    let snapshot_handle = content_status.snapshot_handle.unwrap_or_default();
    assert!(!snapshot_handle.is_empty(), "{content:?}");
    // csi-snapshotter repeats the (idempotent) call when a status update of the content lost a
    // race, so there may be more than one; each is for the claim's volume and answered with the
    // one snapshot.
    let creates = driver.calls("CreateSnapshot");
    assert!(!creates.is_empty(), "{}", driver.log());
    for create in &creates {
        assert_eq!(
            create["request"]["source_volume_id"].as_str(),
            Some(volume_handle.as_str()),
            "{create}"
        );
        assert_eq!(
            create["response"]["snapshot"]["snapshot_id"].as_str(),
            Some(snapshot_handle.as_str()),
            "the handle is the driver's snapshot id: {create}"
        );
    }

    cluster.delete_snapshot("data-snap").await;
    cluster.wait_snapshot_gone("data-snap", &content_name).await;
    let deletes = driver.calls("DeleteSnapshot");
    assert!(!deletes.is_empty(), "{}", driver.log());
    for delete in &deletes {
        assert_eq!(
            delete["request"]["snapshot_id"].as_str(),
            Some(snapshot_handle.as_str()),
            "{delete}"
        );
        assert_eq!(delete["code"].as_str(), Some("OK"), "{delete}");
    }
    snapshotter
        .check_running()
        .unwrap_or_else(|stopped| panic!("{stopped}"));
    sidecar.assert_running();
}
