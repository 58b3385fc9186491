//! VolumeAttributesClass at provisioning on a real control plane (kube-apiserver 1.36 serves
//! storage.k8s.io/v1 VolumeAttributesClass; kube-controller-manager binds a claim only to a PV
//! of the same class and then sets the claim's current class). The reference driver advertises
//! MODIFY_VOLUME with `--modify-volume` and logs every CreateVolume request.
//!
//! VolumeAttributesClasses are cluster-scoped: each test names its own after its namespace.

use csi_test_support as support;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use serde_json::json;

use support::cluster::{
    Cluster, attributes_class_claim, create_claim, events_of, pv_name, summarize, wait_event,
};
use support::eventually;
use support::peers::{Driver, Sidecar, TIMEOUT};

/// Short claim retries, so that the claim waiting for its class goes on soon after it appears.
const RETRY_MAX: &str = "--retry-interval-max=2s";

/// The parameters every class of these tests carries.
const PARAMETERS: [(&str, &str); 2] = [("iops", "3000"), ("throughput", "125")];

fn parameters() -> BTreeMap<&'static str, &'static str> {
    PARAMETERS.into_iter().collect()
}

/// Creates a 1Gi claim of `class` naming the VolumeAttributesClass `attributes_class`.
async fn claim_with(
    cluster: &Cluster,
    name: &str,
    class: &str,
    attributes_class: &str,
) -> PersistentVolumeClaim {
    create_claim(
        &cluster.claims,
        &attributes_class_claim(name, class, attributes_class),
    )
    .await
}

/// The CreateVolume requests the driver received for the volume `name`.
fn creates_of(driver: &Driver, name: &str) -> Vec<serde_json::Value> {
    driver
        .create_volume_requests()
        .into_iter()
        .filter(|request| request["name"] == name)
        .collect()
}

/// Waits until `name` has a ProvisioningFailed event with exactly `message`, seen at least
/// `count` times, and checks that nothing was sent to the driver.
async fn wait_failed(cluster: &Cluster, driver: &Driver, name: &str, message: &str, count: i32) {
    eventually(
        &format!("{count} ProvisioningFailed events {message:?} on {name}"),
        TIMEOUT,
        || async {
            let events = events_of(&cluster.client, cluster.ns(), name).await?;
            events
                .iter()
                .any(|e| {
                    e.reason.as_deref() == Some("ProvisioningFailed")
                        && e.message.as_deref() == Some(message)
                        && e.count.unwrap_or(1) >= count
                })
                .then_some(())
                .ok_or_else(|| summarize(&events))
        },
    )
    .await;
    assert!(
        driver.create_volume_requests().is_empty(),
        "CreateVolume was sent: {:?}",
        driver.create_volume_requests()
    );
}

/// A claim naming a class that does not exist yet fails at every attempt with the API's
/// NotFound text; once the class exists, the next retry provisions: CreateVolume carries the
/// class's parameters as `mutable_parameters` (its `parameters` are the StorageClass's), the PV
/// names the class, and kube-controller-manager binds the claim and records its current class.
#[tokio::test]
async fn a_class_created_after_its_claim_gives_create_volume_its_parameters() {
    let cluster = Cluster::new("vac-late").await;
    let driver = Driver::start(&["--modify-volume"]).await;
    let class = cluster
        .class("sc", &driver, "Delete", &[("type", "fast")])
        .await;
    let _sidecar = Sidecar::start(&driver, &[RETRY_MAX]);
    let gold = format!("{}-gold", cluster.ns());
    let pvc = claim_with(&cluster, "tuned", &class, &gold).await;

    let not_found = format!("volumeattributesclasses.storage.k8s.io \"{gold}\" not found");
    wait_failed(&cluster, &driver, "tuned", &not_found, 2).await;

    cluster
        .attributes_class("gold", driver.name(), &PARAMETERS)
        .await;
    let volume = pv_name(&pvc);
    let bound = eventually("the claim to be bound with its class", TIMEOUT, || async {
        let pvc = cluster
            .claims
            .get("tuned")
            .await
            .map_err(|e| e.to_string())?;
        let status = pvc.status.clone().unwrap_or_default();
        (status.phase.as_deref() == Some("Bound")
            && status.current_volume_attributes_class_name.as_deref() == Some(gold.as_str()))
        .then_some(pvc)
        .ok_or(format!(
            "phase {:?}, current class {:?}",
            status.phase, status.current_volume_attributes_class_name
        ))
    })
    .await;
    assert_eq!(
        bound.spec.and_then(|spec| spec.volume_name).as_deref(),
        Some(volume.as_str())
    );
    let pv = cluster.pv(&volume).await;
    assert_eq!(
        pv.spec
            .and_then(|spec| spec.volume_attributes_class_name)
            .as_deref(),
        Some(gold.as_str())
    );
    let creates = creates_of(&driver, &volume);
    assert!(!creates.is_empty());
    for create in &creates {
        assert_eq!(
            create["mutable_parameters"],
            json!(parameters()),
            "{create}"
        );
        assert_eq!(create["parameters"], json!({"type": "fast"}), "{create}");
    }
    wait_event(
        &cluster.client,
        cluster.ns(),
        "tuned",
        "ProvisioningSucceeded",
        |_| true,
    )
    .await;

    cluster.delete_claim("tuned").await;
    cluster.wait_pv_gone(&volume).await;
    cluster.delete_attributes_class(&gold).await;
}

/// A driver without MODIFY_VOLUME cannot take a claim's class: upstream's text, no CreateVolume.
#[tokio::test]
async fn a_driver_without_modify_volume_gets_no_claim_with_a_class() {
    let cluster = Cluster::new("vac-nomodify").await;
    let driver = Driver::start(&[]).await;
    let class = cluster.class("sc", &driver, "Delete", &[]).await;
    let gold = cluster
        .attributes_class("gold", driver.name(), &PARAMETERS)
        .await;
    let _sidecar = Sidecar::start(&driver, &[RETRY_MAX]);
    claim_with(&cluster, "tuned", &class, &gold).await;
    wait_failed(
        &cluster,
        &driver,
        "tuned",
        "CSI driver does not support VolumeAttributesClass: controller MODIFY_VOLUME capability is not reported",
        1,
    )
    .await;
    cluster.delete_claim("tuned").await;
    cluster.delete_attributes_class(&gold).await;
}

/// A class for another driver is refused with upstream's text, before CreateVolume.
#[tokio::test]
async fn a_class_of_another_driver_is_refused() {
    let cluster = Cluster::new("vac-other").await;
    let driver = Driver::start(&["--modify-volume"]).await;
    let class = cluster.class("sc", &driver, "Delete", &[]).await;
    let other = "other.csi.example.com";
    let gold = cluster.attributes_class("gold", other, &PARAMETERS).await;
    let _sidecar = Sidecar::start(&driver, &[RETRY_MAX]);
    claim_with(&cluster, "tuned", &class, &gold).await;
    let message = format!(
        "VAC {} referenced in PVC is for driver {other} which does not match driver name {}",
        gold,
        driver.name()
    );
    wait_failed(&cluster, &driver, "tuned", &message, 1).await;
    cluster.delete_claim("tuned").await;
    cluster.delete_attributes_class(&gold).await;
}

/// With the gate off the class is ignored, as upstream: no MODIFY_VOLUME needed, no class read
/// (it does not even exist), no `mutable_parameters`, a PV without the class. So
/// kube-controller-manager never binds the claim to it (A7); ours says so in an event. Deleting
/// the claim releases the PV, which is deleted with its volume.
#[tokio::test]
async fn with_the_gate_off_the_class_is_ignored_and_the_claim_is_told_why() {
    let cluster = Cluster::new("vac-off").await;
    let driver = Driver::start(&[]).await;
    let class = cluster.class("sc", &driver, "Delete", &[]).await;
    let _sidecar = Sidecar::start(
        &driver,
        &[RETRY_MAX, "--feature-gates=VolumeAttributesClass=false"],
    );
    let gold = format!("{}-gold", cluster.ns());
    let pvc = claim_with(&cluster, "tuned", &class, &gold).await;
    let volume = pv_name(&pvc);
    let message = format!(
        "the claim names VolumeAttributesClass \"{gold}\" but the provisioner's VolumeAttributesClass feature gate is off, so PersistentVolume {volume} has no class and kube-controller-manager will not bind the claim to it"
    );
    wait_event(
        &cluster.client,
        cluster.ns(),
        "tuned",
        "VolumeAttributesClassIgnored",
        |text| text == message,
    )
    .await;
    let pv = cluster.pv(&volume).await;
    assert_eq!(
        pv.spec
            .as_ref()
            .and_then(|spec| spec.volume_attributes_class_name.clone()),
        None
    );
    let creates = creates_of(&driver, &volume);
    assert!(!creates.is_empty());
    for create in &creates {
        assert_eq!(create["mutable_parameters"], json!({}), "{create}");
    }
    // kube-controller-manager looked for a PV for the claim again after ours existed (the PV
    // enqueues its claim; each look that finds none is one more ExternalProvisioning event)
    // and still left the claim Pending: it binds only a PV of the claim's class.
    let waiting = || async {
        let events = events_of(&cluster.client, cluster.ns(), "tuned").await?;
        Ok::<i32, String>(
            events
                .iter()
                .filter(|e| e.reason.as_deref() == Some("ExternalProvisioning"))
                .map(|e| e.count.unwrap_or(1))
                .sum(),
        )
    };
    let before = waiting().await.expect("listing events");
    eventually(
        "kube-controller-manager to look for the claim's PV again",
        TIMEOUT,
        || async {
            let now = waiting().await?;
            (now > before)
                .then_some(())
                .ok_or(format!("{now} ExternalProvisioning events"))
        },
    )
    .await;
    let pvc = cluster.get_claim("tuned").await.expect("the claim exists");
    assert_eq!(
        pvc.status.and_then(|status| status.phase).as_deref(),
        Some("Pending")
    );
    assert_eq!(pvc.spec.and_then(|spec| spec.volume_name), None);

    cluster.delete_claim("tuned").await;
    cluster.wait_pv_gone(&volume).await;
}
