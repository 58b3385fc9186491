//! The claim's VolumeAttributesClass: mutable parameters, and what the PV names.

use super::*;

const GOLD_PATH: &str = "/apis/storage.k8s.io/v1/volumeattributesclasses/gold";

fn gold_read(driver: &str) -> Step {
    get(GOLD_PATH).answer(
        200,
        json!({
            "apiVersion": "storage.k8s.io/v1",
            "kind": "VolumeAttributesClass",
            "metadata": { "name": "gold" },
            "driverName": driver,
            "parameters": { "iops": "3000" },
        }),
    )
}

fn tuned_create() -> CreateVolumeCall {
    CreateVolumeCall {
        mutable_parameters: strings(&[("iops", "3000")]),
        ..expected_create()
    }
}

#[tokio::test(start_paused = true)]
async fn a_claims_attributes_class_is_read_after_the_secret_and_sent_as_mutable_parameters() {
    let tuned_pv = post("/api/v1/persistentvolumes")
        .body(json!({ "spec": { "volumeAttributesClassName": "gold" } }))
        .echo(201);
    let scenario = cluster()
        .start([
            secret_read(),
            gold_read(DRIVER),
            record_written(),
            create_volume(tuned_create(), created("vol-1", GIB)),
            tuned_pv,
            record_removed(),
        ])
        .await;
    assert_eq!(
        reconcile(&scenario, claim().attributes_class("gold").build()).await,
        Next::Wait
    );
    assert_eq!(scenario.finish().await, [provisioning(), succeeded()]);
}

#[tokio::test(start_paused = true)]
async fn a_class_that_cannot_be_read_is_the_api_text_and_nothing_is_sent() {
    let scenario = cluster()
        .start([secret_read(), get(GOLD_PATH).refuse(404, "NotFound")])
        .await;
    assert_eq!(
        reconcile(&scenario, claim().attributes_class("gold").build()).await,
        Next::RetryIn(RETRY_START)
    );
    assert!(!in_flight(&scenario));
    assert_eq!(
        scenario.finish().await,
        [provisioning(), failed("scripted NotFound")]
    );
}

#[tokio::test(start_paused = true)]
async fn another_drivers_class_is_refused_before_anything_is_recorded() {
    let scenario = cluster()
        .start([secret_read(), gold_read("other.csi.k8s.io")])
        .await;
    assert_eq!(
        reconcile(&scenario, claim().attributes_class("gold").build()).await,
        Next::RetryIn(RETRY_START)
    );
    assert!(!in_flight(&scenario));
    assert_eq!(
        scenario.finish().await,
        [
            provisioning(),
            failed(&format!(
                "VAC gold referenced in PVC is for driver other.csi.k8s.io which does not match driver name {DRIVER}"
            ))
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_recorded_operation_replays_its_mutable_parameters_without_reading_the_class() {
    let mut recorded = recorded_operation();
    recorded.request.mutable_parameters = strings(&[("iops", "3000")]);
    recorded.attributes_class = Some("gold".to_owned());
    // The class may be gone or changed by now: it is not read, the recorded request is sent.
    let scenario = cluster()
        .journaled(recorded)
        .start([
            secret_read(),
            create_volume(tuned_create(), created("vol-1", GIB)),
            pv_created(),
            record_removed(),
        ])
        .await;
    assert_eq!(
        reconcile(&scenario, claim().attributes_class("gold").build()).await,
        Next::Wait
    );
    assert_eq!(scenario.finish().await, [provisioning(), succeeded()]);
}

#[tokio::test(start_paused = true)]
async fn the_pv_names_the_recorded_class_when_the_claim_has_moved_on() {
    let mut recorded = recorded_operation();
    recorded.request.mutable_parameters = strings(&[("iops", "3000")]);
    recorded.attributes_class = Some("gold".to_owned());
    let gold_pv = post("/api/v1/persistentvolumes")
        .body(json!({ "spec": { "volumeAttributesClassName": "gold" } }))
        .echo(201);
    let scenario = cluster()
        .journaled(recorded)
        .start([
            secret_read(),
            create_volume(tuned_create(), created("vol-1", GIB)),
            gold_pv,
            record_removed(),
        ])
        .await;
    assert_eq!(
        reconcile(&scenario, claim().attributes_class("silver").build()).await,
        Next::Wait
    );
    let moved = format!(
        "{CLAIM_EVENT} Warning VolumeAttributesClassRecorded: {}",
        recorded_class_moved(Some("silver"), Some("gold"), &claim_volume()).unwrap_or_default()
    );
    assert_eq!(
        scenario.finish().await,
        [provisioning(), moved, succeeded()]
    );
}

#[tokio::test(start_paused = true)]
async fn with_the_gate_off_the_class_is_ignored_and_the_claim_told() {
    let scenario = cluster()
        .without_attributes_classes()
        .start([
            secret_read(),
            record_written(),
            create_volume(expected_create(), created("vol-1", GIB)),
            pv_created(),
            record_removed(),
        ])
        .await;
    assert_eq!(
        reconcile(&scenario, claim().attributes_class("gold").build()).await,
        Next::Wait
    );
    let ignored = format!(
        "{CLAIM_EVENT} Warning VolumeAttributesClassIgnored: the claim names VolumeAttributesClass \"gold\" but the provisioner's VolumeAttributesClass feature gate is off, so PersistentVolume {} has no class and kube-controller-manager will not bind the claim to it",
        claim_volume()
    );
    assert_eq!(
        scenario.finish().await,
        [provisioning(), succeeded(), ignored]
    );
}
