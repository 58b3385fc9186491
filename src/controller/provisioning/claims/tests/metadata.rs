//! Claim and namespace metadata by allow-list: what CreateVolume carries, what the PV is
//! labelled with, and that a recorded request is replayed as it was first sent.

use super::*;
use crate::provision::{KeyAllowList, MetadataAllowLists};

const NAMESPACE_PATH: &str = "/api/v1/namespaces/apps";

fn allow(list: &str) -> KeyAllowList {
    KeyAllowList::parse(list).expect("a valid list")
}

/// `--extra-create-metadata-claim-annotations=team` and
/// `--extra-create-metadata-namespace-labels=tier`.
fn parameter_lists() -> MetadataAllowLists {
    MetadataAllowLists {
        claim_annotations: allow("team"),
        namespace_labels: allow("tier"),
        ..MetadataAllowLists::default()
    }
}

fn namespace_read(labels: Value) -> Step {
    get(NAMESPACE_PATH).answer(
        200,
        json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": { "name": "apps", "labels": labels },
        }),
    )
}

fn create_with(parameters: &[(&str, &str)]) -> CreateVolumeCall {
    CreateVolumeCall {
        parameters: strings(parameters),
        ..expected_create()
    }
}

#[tokio::test(start_paused = true)]
async fn listed_claim_annotations_and_namespace_labels_are_sent_as_parameters() {
    let scenario = cluster()
        .metadata(parameter_lists())
        .start([
            secret_read(),
            namespace_read(json!({ "tier": "gold", "other": "x" })),
            record_written(),
            create_volume(
                create_with(&[
                    ("type", "fast"),
                    ("csi.storage.k8s.io/pvc/annotations/team", "storage"),
                    ("csi.storage.k8s.io/namespace/labels/tier", "gold"),
                ]),
                created("vol-1", GIB),
            ),
            pv_created(),
            record_removed(),
        ])
        .await;
    let pvc = claim()
        .annotation("team", "storage")
        .annotation("unlisted", "y")
        .build();
    assert_eq!(reconcile(&scenario, pvc).await, Next::Wait);
    assert_eq!(scenario.finish().await, [provisioning(), succeeded()]);
}

#[tokio::test(start_paused = true)]
async fn a_namespace_that_cannot_be_read_sends_nothing() {
    let scenario = cluster()
        .metadata(parameter_lists())
        .start([secret_read(), get(NAMESPACE_PATH).refuse(403, "Forbidden")])
        .await;
    assert_eq!(
        reconcile(&scenario, claim().build()).await,
        Next::RetryIn(RETRY_START)
    );
    assert!(!in_flight(&scenario));
    assert_eq!(
        scenario.finish().await,
        [
            provisioning(),
            failed(
                "failed to read namespace \"apps\" for its labels and annotations (--extra-create-metadata-namespace-labels, --extra-create-metadata-namespace-annotations): scripted Forbidden"
            )
        ]
    );
}

/// The first attempt sent the namespace's and the claim's metadata of then; both changed
/// since. The retry reads neither the namespace nor the new annotation: it sends the recorded
/// request, the only one the driver answers for the name without ALREADY_EXISTS.
#[tokio::test(start_paused = true)]
async fn a_recorded_operation_replays_the_parameters_it_was_recorded_with() {
    let first = [
        ("type", "fast"),
        ("csi.storage.k8s.io/pvc/annotations/team", "storage"),
        ("csi.storage.k8s.io/namespace/labels/tier", "silver"),
    ];
    let mut recorded = recorded_operation();
    recorded.request.parameters = strings(&first);
    let scenario = cluster()
        .metadata(parameter_lists())
        .journaled(recorded)
        .start([
            secret_read(),
            create_volume(create_with(&first), created("vol-1", GIB)),
            pv_created(),
            record_removed(),
        ])
        .await;
    let pvc = claim().annotation("team", "renamed").build();
    assert_eq!(reconcile(&scenario, pvc).await, Next::Wait);
    assert_eq!(scenario.finish().await, [provisioning(), succeeded()]);
}

fn claim_read(uid: &str, labels: Value) -> Step {
    get(CLAIM_PATH).answer(
        200,
        json!({
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": { "name": "data", "namespace": "apps", "uid": uid, "labels": labels },
        }),
    )
}

#[tokio::test(start_paused = true)]
async fn listed_claim_labels_are_read_live_and_put_on_the_pv() {
    let labelled_pv = post("/api/v1/persistentvolumes")
        .body(json!({
            "metadata": {
                "name": claim_volume(),
                "labels": { "team": "storage", "cost.example.com/center": "42" },
            },
        }))
        .echo(201);
    let lists = MetadataAllowLists {
        claim_labels: allow("team,cost.example.com/*"),
        ..MetadataAllowLists::default()
    };
    let scenario = cluster()
        .metadata(lists)
        .start([
            claim_read(
                PVC_UID,
                json!({ "team": "storage", "cost.example.com/center": "42", "app": "db" }),
            ),
            secret_read(),
            record_written(),
            create_volume(expected_create(), created("vol-1", GIB)),
            labelled_pv,
            record_removed(),
        ])
        .await;
    assert_eq!(reconcile(&scenario, claim().build()).await, Next::Wait);
    assert_eq!(scenario.finish().await, [provisioning(), succeeded()]);
}

#[tokio::test(start_paused = true)]
async fn a_claim_replaced_under_its_name_is_not_read_for_its_labels() {
    let lists = MetadataAllowLists {
        claim_labels: allow("team"),
        ..MetadataAllowLists::default()
    };
    let scenario = cluster()
        .metadata(lists)
        .start([claim_read("another-uid", json!({ "team": "storage" }))])
        .await;
    assert_eq!(
        reconcile(&scenario, claim().build()).await,
        Next::RetryIn(RETRY_START)
    );
    assert!(!in_flight(&scenario));
    assert_eq!(
        scenario.finish().await,
        [
            provisioning(),
            failed(&format!(
                "failed to read the claim for its labels (--copy-claim-labels): the claim was replaced (UID \"another-uid\", expected \"{PVC_UID}\")"
            ))
        ]
    );
}
