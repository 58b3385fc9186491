//! The VolumeAttachment check before DeleteVolume, end to end: a driver that reports
//! PUBLISH_UNPUBLISH_VOLUME (the reference driver with `--attach-required`) gets no DeleteVolume
//! for a PV while a VolumeAttachment names it; the PV stays Terminating, held by our finalizer,
//! with one Normal WaitingForDetach event for the whole wait (upstream: a VolumeFailedDelete
//! Warning on every retry; docs/flags.md), and goes with its volume once the attachment is
//! gone. Without the capability, attachments are not looked at.

use csi_test_support as support;

use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, DeleteParams, PostParams};

use support::cluster::{Cluster, events_of, pv_name, summarize, wait_bound, wait_event};
use support::peers::{Driver, Sidecar, SidecarOptions, TIMEOUT, metric_sum, parse_metrics};

const PV_FINALIZER: &str = "external-provisioner.volume.kubernetes.io/finalizer";
const NODE: &str = "node-1";
const WAITING_FOR_DETACH: &str = "WaitingForDetach";
const DELETE_FAILED_METRIC: &str = "controller_persistentvolume_delete_failed_total";
/// Many retries while the attachment exists: each one must be refused.
const FAST_RETRIES: [&str; 2] = ["--retry-interval-start=200ms", "--retry-interval-max=1s"];
/// A backoff far longer than the test: only the attachment's deletion can bring the retry.
const SLOW_RETRIES: [&str; 2] = ["--retry-interval-start=10m", "--retry-interval-max=10m"];

/// A VolumeAttachment of `pv` to [`NODE`], as the attach-detach controller would create it
/// (no status: nothing reads it).
async fn attach(cluster: &Cluster, driver: &Driver, pv: &str) -> Api<VolumeAttachment> {
    let attachments: Api<VolumeAttachment> = Api::all(cluster.client.clone());
    let attachment: VolumeAttachment = serde_json::from_value(serde_json::json!({
        "metadata": { "name": format!("csi-{pv}") },
        "spec": {
            "attacher": driver.name(),
            "nodeName": NODE,
            "source": { "persistentVolumeName": pv },
        },
    }))
    .expect("a VolumeAttachment");
    attachments
        .create(&PostParams::default(), &attachment)
        .await
        .expect("creating the VolumeAttachment");
    attachments
}

/// A bound claim whose PV is attached: the attachment is created as soon as the PV's name is
/// known (from the claim's UID), before the PV exists, so the sidecar's attachment watch has it
/// long before the claim is deleted and the PV released.
async fn attached_claim(
    cluster: &Cluster,
    driver: &Driver,
    class: &str,
    name: &str,
) -> (String, Api<VolumeAttachment>) {
    let pv = pv_name(&cluster.claim(name, class).await);
    let attachments = attach(cluster, driver, &pv).await;
    wait_bound(&cluster.claims, name).await;
    (pv, attachments)
}

/// The driver was never asked to delete anything, and still holds every volume.
fn assert_no_delete_volume(driver: &Driver, held: usize) {
    let deletes = driver.volume_requests("DeleteVolume");
    assert!(
        deletes.is_empty(),
        "DeleteVolume reached the driver while attached: {deletes:?}"
    );
    assert_eq!(driver.volume_count(), held);
}

/// The PV stays, Terminating, held by our finalizer.
async fn assert_held(cluster: &Cluster, pv: &str) {
    let stored = cluster.pv(pv).await;
    assert!(
        stored.metadata.deletion_timestamp.is_some(),
        "{pv} is not being deleted"
    );
    assert!(
        stored
            .metadata
            .finalizers
            .iter()
            .flatten()
            .any(|finalizer| finalizer == PV_FINALIZER),
        "{pv}: finalizers {:?}",
        stored.metadata.finalizers
    );
}

#[tokio::test]
async fn an_attached_volume_is_deleted_only_once_its_attachment_is_gone() {
    let cluster = Cluster::new("attached").await;
    let driver = Driver::start(&["--attach-required"]).await;
    let mut sidecar = Sidecar::start_with(
        &driver,
        SidecarOptions {
            metrics: true,
            ..SidecarOptions::args(&FAST_RETRIES)
        },
    );
    let class = cluster.class("attach", &driver, "Delete", &[]).await;
    let (pv, attachments) = attached_claim(&cluster, &driver, &class, "data").await;

    cluster.delete_claim("data").await;
    let attachment = format!("csi-{pv}");
    wait_event(
        &cluster.client,
        "default",
        &pv,
        WAITING_FOR_DETACH,
        |message| message.contains(&attachment) && message.contains(NODE),
    )
    .await;
    // Several refused retries, none of them let through, and none of them told again.
    support::eventually("three refused deletions", TIMEOUT, || async {
        assert_no_delete_volume(&driver, 1);
        let page = sidecar.metrics()?;
        let refused = metric_sum(&parse_metrics(&page), DELETE_FAILED_METRIC, &[]);
        (refused >= 3.0)
            .then_some(())
            .ok_or_else(|| format!("{refused} refused deletions"))
    })
    .await;
    assert_held(&cluster, &pv).await;
    assert_no_delete_volume(&driver, 1);
    let events = events_of(&cluster.client, "default", &pv)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let waits: Vec<_> = events
        .iter()
        .filter(|e| e.reason.as_deref() == Some(WAITING_FOR_DETACH))
        .collect();
    assert!(
        waits.len() == 1
            && waits[0].count == Some(1)
            && waits[0].type_.as_deref() == Some("Normal"),
        "one Normal WaitingForDetach for the whole wait: {}",
        summarize(&events)
    );
    assert!(
        events
            .iter()
            .all(|e| e.reason.as_deref() != Some("VolumeFailedDelete")),
        "no Warning while waiting for the detach: {}",
        summarize(&events)
    );

    attachments
        .delete(&attachment, &DeleteParams::default())
        .await
        .expect("deleting the VolumeAttachment");
    cluster.wait_pv_gone(&pv).await;
    support::eventually("the driver to delete the volume", TIMEOUT, || async {
        match driver.volume_count() {
            0 => Ok(()),
            left => Err(format!("{left} volumes left")),
        }
    })
    .await;
    sidecar.assert_running();
}

/// Upstream retries at the next backoff step only; here the attachment's deletion queues the
/// PV at once (docs/flags.md), so even a backoff of ten minutes does not keep it.
#[tokio::test]
async fn a_deleted_attachment_frees_the_volume_without_waiting_for_the_backoff() {
    let cluster = Cluster::new("detached").await;
    let driver = Driver::start(&["--attach-required"]).await;
    let mut sidecar = Sidecar::start(&driver, &SLOW_RETRIES);
    let class = cluster.class("attach", &driver, "Delete", &[]).await;
    let (pv, attachments) = attached_claim(&cluster, &driver, &class, "data").await;

    cluster.delete_claim("data").await;
    wait_event(
        &cluster.client,
        "default",
        &pv,
        WAITING_FOR_DETACH,
        |message| message.contains("is still attached to node"),
    )
    .await;
    assert_held(&cluster, &pv).await;
    assert_no_delete_volume(&driver, 1);

    attachments
        .delete(&format!("csi-{pv}"), &DeleteParams::default())
        .await
        .expect("deleting the VolumeAttachment");
    cluster.wait_pv_gone(&pv).await;
    assert_eq!(driver.volume_count(), 0);
    sidecar.assert_running();
}

#[tokio::test]
async fn without_publish_unpublish_an_attachment_does_not_hold_the_deletion() {
    let cluster = Cluster::new("not-attachable").await;
    let driver = Driver::start(&[]).await;
    let mut sidecar = Sidecar::start(&driver, &FAST_RETRIES);
    let class = cluster.class("plain", &driver, "Delete", &[]).await;
    let (pv, _attachments) = attached_claim(&cluster, &driver, &class, "data").await;

    cluster.delete_claim("data").await;
    cluster.wait_pv_gone(&pv).await;
    assert_eq!(driver.volume_count(), 0);
    let events = events_of(&cluster.client, "default", &pv)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        events
            .iter()
            .all(|e| e.reason.as_deref() != Some("VolumeFailedDelete")),
        "{}",
        summarize(&events)
    );
    sidecar.assert_running();
}
