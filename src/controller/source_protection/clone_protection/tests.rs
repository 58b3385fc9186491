use super::*;
use crate::controller::testing::fixtures::{
    Cluster, RETRY_START, Scenario, Step, bounded, cached, claim_volume, every_node_journal, get,
    journal_path, patch, recorded_operation,
};
use crate::csi;
use crate::csi::volume_content_source::{Type, VolumeSource};
use crate::provision::fixtures::{PvBuilder, PvcBuilder};
use serde_json::json;

const SOURCE_PATH: &str = "/api/v1/namespaces/apps/persistentvolumeclaims/src";

/// Claim `apps/src` being deleted, with the clone finalizer, bound to PV `pv-src`.
fn source() -> PersistentVolumeClaim {
    PvcBuilder::new()
        .name("src")
        .uid("src-uid")
        .volume_name("pv-src")
        .phase("Bound")
        .finalizer("kubernetes.io/pvc-protection")
        .finalizer(CLONE_PROTECTION_FINALIZER)
        .deleting()
        .build()
}

fn source_pv() -> k8s_openapi::api::core::v1::PersistentVolume {
    PvBuilder::new().name("pv-src").handle("vol-src").build()
}

fn clone(phase: &str) -> PersistentVolumeClaim {
    PvcBuilder::new()
        .phase(phase)
        .data_source(None, "PersistentVolumeClaim", "src")
        .build()
}

fn finalizer_removed() -> Step {
    patch(SOURCE_PATH)
        .body(json!([
            {"op": "test", "path": "/metadata/uid", "value": "src-uid"},
            {"op": "test", "path": "/metadata/finalizers/1", "value": CLONE_PROTECTION_FINALIZER},
            {"op": "remove", "path": "/metadata/finalizers/1"},
        ]))
        .answer(200, PvcBuilder::new().name("src").build())
}

async fn reconcile(scenario: &Scenario) -> Next {
    let this = Arc::new(CloneProtection::new(scenario.ctx()));
    let Ok(action) = bounded(CloneProtection::reconcile(
        Arc::new(cached(&source())),
        this,
    ))
    .await;
    action
}

#[tokio::test(start_paused = true)]
async fn the_finalizer_stays_while_a_pending_clone_exists() {
    let scenario = Cluster::new()
        .claim(source())
        .claim(clone("Pending"))
        .volume(source_pv())
        .start([])
        .await;
    assert!(CloneProtection::has_work(&cached(&source())));
    assert_eq!(reconcile(&scenario).await, Next::RetryIn(RETRY_START));
    assert_eq!(scenario.finish().await, Vec::<String>::new(), "no events");
}

/// An operation cloning the source's volume.
fn cloning() -> crate::journal::Operation {
    crate::journal::Operation {
        request: csi::CreateVolumeRequest {
            volume_content_source: Some(csi::VolumeContentSource {
                r#type: Some(Type::Volume(VolumeSource {
                    volume_id: "vol-src".into(),
                })),
            }),
            ..recorded_operation().request
        },
        ..recorded_operation()
    }
}

#[tokio::test(start_paused = true)]
async fn the_finalizer_stays_while_the_journal_clones_the_volume() {
    // The clone's claim is gone: only the journal knows it still reads the source.
    let scenario = Cluster::new()
        .claim(source())
        .volume(source_pv())
        .journaled(cloning())
        .start([])
        .await;
    assert!(scenario.ctx().journal.registry().contains(&claim_volume()));
    assert_eq!(reconcile(&scenario).await, Next::RetryIn(RETRY_START));
    scenario.finish().await;
}

#[tokio::test(start_paused = true)]
async fn the_finalizer_comes_off_once_nothing_reads_the_source() {
    let scenario = Cluster::new()
        .claim(source())
        .claim(clone("Bound"))
        .volume(source_pv())
        .journaled(recorded_operation())
        .start([finalizer_removed()])
        .await;
    assert_eq!(reconcile(&scenario).await, Next::Wait);
    scenario.finish().await;
}

#[tokio::test(start_paused = true)]
async fn a_claim_not_being_deleted_is_not_queued() {
    let alive = PvcBuilder::new()
        .name("src")
        .finalizer(CLONE_PROTECTION_FINALIZER)
        .build();
    let scenario = Cluster::new().start([]).await;
    assert!(!CloneProtection::has_work(&cached(&alive)));
    scenario.finish().await;
}

fn node_b() -> Cluster {
    Cluster::new()
        .node_mode("node-b", &[])
        .claim(source())
        .volume(source_pv())
}

#[tokio::test(start_paused = true)]
async fn in_node_mode_another_nodes_clone_keeps_the_finalizer() {
    // Node b's journal is empty; node a's still clones the source (its reaper replays it).
    let scenario = node_b().start([every_node_journal(&[cloning()])]).await;
    assert_eq!(reconcile(&scenario).await, Next::RetryIn(RETRY_START));
    scenario.finish().await;
}

#[tokio::test(start_paused = true)]
async fn in_node_mode_an_unread_journal_keeps_the_finalizer() {
    let scenario = node_b()
        .start([get(journal_path()).refuse(500, "InternalError")])
        .await;
    assert_eq!(reconcile(&scenario).await, Next::RetryIn(RETRY_START));
    scenario.finish().await;
}

#[tokio::test(start_paused = true)]
async fn in_node_mode_the_finalizer_comes_off_once_no_node_clones_the_source() {
    let scenario = node_b()
        .start([
            every_node_journal(&[recorded_operation()]),
            finalizer_removed(),
        ])
        .await;
    assert_eq!(reconcile(&scenario).await, Next::Wait);
    scenario.finish().await;
}
