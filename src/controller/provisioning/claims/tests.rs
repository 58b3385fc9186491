use k8s_openapi::api::core::v1::GCEPersistentDiskVolumeSource;
use serde_json::{Value, json};
use tonic::Status;

use super::*;
use crate::controller::testing::fixtures::{
    CLAIM_PATH, Cluster, CreateVolumeCall, GIB, RETRY_MAX, RETRY_START, SECRETS, Scenario, Step,
    bounded, cached, claim_volume, claim_volume_path, create_volume, created, delete_volume,
    every_node_journal, get, held_create_volume, journal_created, journal_path, journal_replaced,
    patch, post, put, recorded_operation, secret_read, shard, shard_path, strings,
};
use crate::journal::OperationRecord;
use crate::provision::fixtures::{ClassBuilder, DRIVER, PVC_UID, PvBuilder, PvcBuilder};
use crate::provision::{
    ANN_MIGRATED_TO, ANN_PROVISIONING_CONSISTENCY, ANN_SELECTED_NODE, ANN_STORAGE_PROVISIONER,
    CLONE_PROTECTION_FINALIZER, PROVISIONING_FINALIZER, SNAPSHOT_PROTECTION_FINALIZER,
};

mod attributes_class;
mod collisions;
mod drain;
mod metadata;
mod migration;
mod node_deployment;
mod provisioning;
mod sources;
mod store_filling;
mod topology;

const CLAIM_EVENT: &str = "PersistentVolumeClaim/data";

/// Our claim `apps/data` of class `standard`, 1Gi, waiting for a volume.
fn claim() -> PvcBuilder {
    PvcBuilder::new()
        .annotation(ANN_STORAGE_PROVISIONER, DRIVER)
        .resource_version("7")
}

/// The caches know class `standard`, with a driver parameter and a provisioner secret.
fn cluster() -> Cluster {
    Cluster::new().class(
        ClassBuilder::new()
            .parameter("type", "fast")
            .parameter("csi.storage.k8s.io/provisioner-secret-name", "creds")
            .parameter("csi.storage.k8s.io/provisioner-secret-namespace", "apps")
            .build(),
    )
}

/// The journal record of the claim's operation, as first written.
fn record_written() -> Step {
    journal_created(json!([our_record()]))
}

fn our_record() -> Value {
    json!({
        "volumeName": claim_volume(),
        "claim": "apps/data",
        "claimUid": PVC_UID,
        "storageClass": "standard",
        "phase": "Provisioning",
        "attempts": 0,
    })
}

/// The class's parameter without the secret keys; the Secret's data as secrets.
fn expected_create() -> CreateVolumeCall {
    CreateVolumeCall {
        name: claim_volume(),
        required_bytes: GIB,
        parameters: strings(&[("type", "fast")]),
        secrets: strings(SECRETS),
        accessibility: None,
        content_source: None,
        mutable_parameters: HashMap::new(),
    }
}

fn pv_created() -> Step {
    post("/api/v1/persistentvolumes")
        .body(json!({
            "metadata": { "name": claim_volume() },
            "spec": {
                "capacity": { "storage": "1Gi" },
                "csi": { "driver": DRIVER, "volumeHandle": "vol-1" },
                "claimRef": { "namespace": "apps", "name": "data", "uid": PVC_UID },
                "storageClassName": "standard",
            },
        }))
        .echo(201)
}

fn record_removed() -> Step {
    journal_replaced(json!([]))
}

fn provisioning() -> String {
    format!(
        "{CLAIM_EVENT} Normal Provisioning: External provisioner is provisioning volume for claim \"apps/data\""
    )
}

fn succeeded() -> String {
    format!(
        "{CLAIM_EVENT} Normal ProvisioningSucceeded: Successfully provisioned volume {}",
        claim_volume()
    )
}

fn failed(message: &str) -> String {
    format!("{CLAIM_EVENT} Warning ProvisioningFailed: {message}")
}

async fn reconcile(scenario: &Scenario, pvc: PersistentVolumeClaim) -> Next {
    let Ok(action) = bounded(ClaimReconciler::reconcile(
        Arc::new(cached(&pvc)),
        scenario.claims(),
    ))
    .await;
    action
}

fn in_flight(scenario: &Scenario) -> bool {
    scenario.ctx().journal.registry().contains(&claim_volume())
}

/// Our claim, selected to `node`.
fn on_node(node: &str) -> PvcBuilder {
    claim().annotation(ANN_SELECTED_NODE, node)
}
