use super::*;
use crate::api::{VolumeSnapshotContentStatus, VolumeSnapshotStatus};
use crate::controller::testing::fixtures::{
    Cluster, Scenario, Step, bounded, every_node_journal, get, journal_path, patch,
    recorded_operation,
};
use crate::csi;
use crate::csi::volume_content_source::{SnapshotSource, Type};
use crate::provision::fixtures::{DRIVER, PvcBuilder};
use futures::future;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::json;

const LIST: &str = "/apis/snapshot.storage.k8s.io/v1/volumesnapshots";
const CONTENTS: &str = "/apis/snapshot.storage.k8s.io/v1/volumesnapshotcontents";

fn snapshot(name: &str) -> VolumeSnapshot {
    VolumeSnapshot {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("apps".into()),
            uid: Some(format!("{name}-uid")),
            finalizers: Some(vec![SNAPSHOT_PROTECTION_FINALIZER.to_owned()]),
            ..ObjectMeta::default()
        },
        status: Some(VolumeSnapshotStatus {
            bound_volume_snapshot_content_name: Some(format!("{name}-content")),
            ready_to_use: Some(true),
            ..VolumeSnapshotStatus::default()
        }),
        ..VolumeSnapshot::default()
    }
}

fn listed(snapshots: &[VolumeSnapshot]) -> Step {
    get(LIST).answer(
        200,
        json!({
            "apiVersion": "snapshot.storage.k8s.io/v1",
            "kind": "VolumeSnapshotList",
            "metadata": {},
            "items": snapshots,
        }),
    )
}

fn content(name: &str, driver: &str, handle: &str) -> VolumeSnapshotContent {
    VolumeSnapshotContent {
        metadata: ObjectMeta {
            name: Some(format!("{name}-content")),
            ..ObjectMeta::default()
        },
        spec: crate::api::VolumeSnapshotContentSpec {
            driver: driver.into(),
            ..Default::default()
        },
        status: Some(VolumeSnapshotContentStatus {
            snapshot_handle: Some(handle.into()),
            ..VolumeSnapshotContentStatus::default()
        }),
    }
}

fn contents_listed(contents: &[VolumeSnapshotContent]) -> Step {
    get(CONTENTS).answer(
        200,
        json!({
            "apiVersion": "snapshot.storage.k8s.io/v1",
            "kind": "VolumeSnapshotContentList",
            "metadata": {},
            "items": contents,
        }),
    )
}

/// The contents of the snapshots `names`, of our driver, with handles `<name>-handle`.
fn ours(names: &[&str]) -> Step {
    let contents: Vec<_> = names
        .iter()
        .map(|name| content(name, DRIVER, &format!("{name}-handle")))
        .collect();
    contents_listed(&contents)
}

fn released(name: &str) -> Step {
    patch(format!(
        "/apis/snapshot.storage.k8s.io/v1/namespaces/apps/volumesnapshots/{name}"
    ))
    .body(json!([
        {"op": "test", "path": "/metadata/uid", "value": format!("{name}-uid")},
        {"op": "test", "path": "/metadata/finalizers/0", "value": SNAPSHOT_PROTECTION_FINALIZER},
        {"op": "remove", "path": "/metadata/finalizers/0"},
    ]))
    .answer(200, VolumeSnapshot::default())
}

fn restoring(name: &str, phase: &str) -> PersistentVolumeClaim {
    PvcBuilder::new()
        .name(&format!("restore-{name}"))
        .phase(phase)
        .data_source(Some("snapshot.storage.k8s.io"), "VolumeSnapshot", name)
        .build()
}

fn claims_listed(listed: bool) -> Shared<BoxFuture<'static, bool>> {
    future::ready(listed).boxed().shared()
}

async fn sweep_once(scenario: &Scenario, listed: bool) -> Result<Swept, SweepError> {
    bounded(sweep(&scenario.ctx(), &claims_listed(listed))).await
}

#[tokio::test(start_paused = true)]
async fn a_snapshot_a_pending_claim_restores_is_kept_and_an_orphan_released() {
    let scenario = Cluster::new()
        .claim(restoring("wanted", "Pending"))
        .claim(restoring("done", "Bound"))
        .start([
            listed(&[snapshot("wanted"), snapshot("done")]),
            ours(&["wanted", "done"]),
            released("done"),
        ])
        .await;
    let swept = sweep_once(&scenario, true).await.expect("swept");
    assert_eq!(
        swept,
        Swept {
            released: 1,
            kept: 1
        }
    );
    scenario.finish().await;
}

/// A recorded operation restoring from the snapshot with this handle.
fn restore_from(handle: &str) -> crate::journal::Operation {
    crate::journal::Operation {
        request: csi::CreateVolumeRequest {
            volume_content_source: Some(csi::VolumeContentSource {
                r#type: Some(Type::Snapshot(SnapshotSource {
                    snapshot_id: handle.into(),
                })),
            }),
            ..recorded_operation().request
        },
        ..recorded_operation()
    }
}

#[tokio::test(start_paused = true)]
async fn a_snapshot_the_journal_restores_from_is_kept() {
    let restore = restore_from("snap-handle-1");
    // Its claim is gone: only the journal knows the restore still reads the snapshot.
    let scenario = Cluster::new()
        .journaled(restore)
        .start([
            listed(&[snapshot("in-use"), snapshot("other")]),
            contents_listed(&[
                content("in-use", DRIVER, "snap-handle-1"),
                content("other", DRIVER, "snap-handle-2"),
            ]),
            released("other"),
        ])
        .await;
    let swept = sweep_once(&scenario, true).await.expect("swept");
    assert_eq!(
        swept,
        Swept {
            released: 1,
            kept: 1
        }
    );
    scenario.finish().await;
}

#[tokio::test(start_paused = true)]
async fn in_node_mode_another_nodes_restore_keeps_its_snapshot_and_an_unread_journal_all() {
    let restore = restore_from("in-use-handle");
    let scenario = Cluster::new()
        .node_mode("node-b", &[])
        .start([
            listed(&[snapshot("in-use"), snapshot("other")]),
            every_node_journal(&[restore]),
            ours(&["in-use", "other"]),
            released("other"),
            listed(&[snapshot("orphan")]),
            get(journal_path()).refuse(500, "InternalError"),
        ])
        .await;
    let swept = sweep_once(&scenario, true).await.expect("swept");
    assert_eq!(
        swept,
        Swept {
            released: 1,
            kept: 1
        }
    );
    let error = sweep_once(&scenario, true).await.expect_err("no sweep");
    assert!(matches!(error, SweepError::Journal(_)), "{error}");
    scenario.finish().await;
}

/// `--snapshot-orphan-sweep-interval`: after the preflight (the API group is served, the
/// role may list) a sweep at once, then one `interval` after each; run for `window`.
async fn sweeps_within(interval: Duration, window: Duration, sweeps: usize) {
    let served = get("/apis/snapshot.storage.k8s.io/v1").answer(
        200,
        json!({
            "kind": "APIResourceList", "apiVersion": "v1",
            "groupVersion": "snapshot.storage.k8s.io/v1",
            "resources": [{
                "name": "volumesnapshots", "singularName": "volumesnapshot",
                "namespaced": true, "kind": "VolumeSnapshot", "verbs": ["list"],
            }],
        }),
    );
    let preflight = listed(&[]);
    let steps = [served, preflight]
        .into_iter()
        .chain(std::iter::repeat_with(|| listed(&[])).take(sweeps));
    let scenario = Cluster::new().start(steps).await;
    bounded(run(
        &scenario.ctx(),
        interval,
        claims_listed(true),
        tokio::time::sleep(window),
    ))
    .await;
    scenario.finish().await;
}

#[tokio::test(start_paused = true)]
async fn sweeps_come_one_interval_apart() {
    let window = Duration::from_secs(75);
    sweeps_within(Duration::from_secs(30), window, 3).await;
    sweeps_within(Duration::from_secs(60), window, 2).await;
    sweeps_within(Duration::from_secs(300), window, 1).await;
}

#[tokio::test(start_paused = true)]
async fn nothing_is_removed_when_the_claims_are_not_known() {
    let scenario = Cluster::new().start([listed(&[snapshot("orphan")])]).await;
    let error = sweep_once(&scenario, false).await.expect_err("no sweep");
    assert!(matches!(error, SweepError::ClaimsNotListed), "{error}");
    scenario.finish().await;
}

#[tokio::test(start_paused = true)]
async fn a_removal_that_meets_a_changed_list_waits_for_the_next_sweep() {
    let scenario = Cluster::new()
        .start([
            listed(&[snapshot("orphan")]),
            ours(&["orphan"]),
            patch("/apis/snapshot.storage.k8s.io/v1/namespaces/apps/volumesnapshots/orphan")
                .refuse(422, "Invalid"),
        ])
        .await;
    let swept = sweep_once(&scenario, true).await.expect("swept");
    assert_eq!(swept, Swept::default());
    scenario.finish().await;
}

#[tokio::test(start_paused = true)]
async fn another_drivers_snapshot_is_left_alone_and_an_unlisted_content_keeps_all() {
    let scenario = Cluster::new()
        .start([
            listed(&[snapshot("foreign")]),
            contents_listed(&[content("foreign", "other.example.com", "h")]),
            listed(&[snapshot("orphan")]),
            get(CONTENTS).refuse(500, "InternalError"),
        ])
        .await;
    assert_eq!(
        sweep_once(&scenario, true).await.expect("swept"),
        Swept::default()
    );
    let swept = sweep_once(&scenario, true).await.expect("swept");
    assert_eq!(
        swept,
        Swept {
            released: 0,
            kept: 1
        }
    );
    scenario.finish().await;
}
