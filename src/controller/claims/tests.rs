use k8s_openapi::api::core::v1::GCEPersistentDiskVolumeSource;
use serde_json::{Value, json};
use tonic::Status;

use super::*;
use crate::controller::fixtures::{
    CLAIM_PATH, Cluster, CreateVolumeCall, GIB, RETRY_MAX, RETRY_START, SECRETS, Scenario, Step,
    bounded, cached, claim_volume, claim_volume_path, create_volume, created, delete_volume, get,
    journal_created, journal_path, journal_replaced, patch, post, put, recorded_operation,
    secret_read, shard, shard_path, strings,
};
use crate::journal::OperationRecord;
use crate::provision::fixtures::{ClassBuilder, DRIVER, PVC_UID, PvBuilder, PvcBuilder};
use crate::provision::{
    ANN_MIGRATED_TO, ANN_PROVISIONING_CONSISTENCY, ANN_SELECTED_NODE, ANN_STORAGE_PROVISIONER,
    CLONE_PROTECTION_FINALIZER, PROVISIONING_FINALIZER, SNAPSHOT_PROTECTION_FINALIZER,
};

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

#[tokio::test(start_paused = true)]
async fn provisioned() {
    let scenario = cluster()
        .start([
            secret_read(),
            record_written(),
            create_volume(expected_create(), created("vol-1", GIB)),
            pv_created(),
            record_removed(),
        ])
        .await;
    assert_eq!(reconcile(&scenario, claim().build()).await, Next::Wait);
    assert!(!in_flight(&scenario));
    assert_eq!(scenario.finish().await, [provisioning(), succeeded()]);
}

const GCE: &str = "pd.csi.storage.gke.io";

/// A claim of in-tree class `standard` (`kubernetes.io/gce-pd`), as kube-controller-manager
/// annotates it for the driver `pd.csi.storage.gke.io`.
fn migrated() -> (Cluster, PersistentVolumeClaim) {
    let class = ClassBuilder::new()
        .provisioner("kubernetes.io/gce-pd")
        .parameter("fstype", "ext4")
        .parameter("type", "pd-ssd")
        .build();
    let pvc = PvcBuilder::new()
        .annotation(ANN_STORAGE_PROVISIONER, GCE)
        .annotation(ANN_MIGRATED_TO, GCE)
        .resource_version("7")
        .build();
    (Cluster::new().driver(GCE).class(class), pvc)
}

fn migrated_create() -> CreateVolumeCall {
    CreateVolumeCall {
        parameters: strings(&[("type", "pd-ssd")]),
        secrets: HashMap::new(),
        ..expected_create()
    }
}

#[tokio::test(start_paused = true)]
async fn a_migrated_claim_is_provisioned_with_the_translated_class_and_an_in_tree_pv() {
    let (cluster, pvc) = migrated();
    let handle = format!("projects/p/zones/us-central1-a/disks/{}", claim_volume());
    let scenario = cluster
        .start([
            record_written(),
            create_volume(migrated_create(), created(&handle, GIB)),
            post("/api/v1/persistentvolumes")
                .body(json!({
                    "metadata": {
                        "name": claim_volume(),
                        "annotations": { "pv.kubernetes.io/provisioned-by": "kubernetes.io/gce-pd" },
                    },
                    "spec": {
                        "gcePersistentDisk": { "pdName": claim_volume(), "fsType": "ext4" },
                        "claimRef": { "namespace": "apps", "name": "data", "uid": PVC_UID },
                    },
                }))
                .echo(201),
            record_removed(),
        ])
        .await;
    assert_eq!(reconcile(&scenario, pvc).await, Next::Wait);
    assert_eq!(scenario.finish().await, [provisioning(), succeeded()]);
}

#[tokio::test(start_paused = true)]
async fn a_migrated_volume_whose_pv_cannot_be_translated_is_deleted_under_its_record() {
    let (cluster, pvc) = migrated();
    let scenario = cluster
        .start([
            record_written(),
            create_volume(migrated_create(), created("vol-1", GIB)),
            get(claim_volume_path()).refuse(404, "NotFound"),
            delete_volume("vol-1", &[], Err(Status::unavailable("driver restarting"))),
        ])
        .await;
    assert_eq!(
        reconcile(&scenario, pvc.clone()).await,
        Next::RetryIn(RETRY_START)
    );
    // The failed deletion keeps the record: the volume is not forgotten.
    assert!(in_flight(&scenario));
    let mut events = scenario.finish().await;
    assert_eq!(events.remove(0), provisioning());
    assert!(
        events[0].contains("deleting the volume failed, it is retried"),
        "{events:?}"
    );

    // A PV of the name holding another volume (an in-tree source cannot hold this handle).
    let (cluster, pvc) = migrated();
    let other = PvBuilder::new()
        .name(&claim_volume())
        .no_csi()
        .map(|pv| {
            if let Some(spec) = pv.spec.as_mut() {
                spec.gce_persistent_disk = Some(GCEPersistentDiskVolumeSource {
                    pd_name: "vol-1".to_owned(),
                    ..Default::default()
                });
            }
        })
        .build();
    let scenario = cluster
        .start([
            record_written(),
            create_volume(migrated_create(), created("vol-1", GIB)),
            get(claim_volume_path()).answer(200, other),
            delete_volume("vol-1", &[], Ok(())),
            record_removed(),
        ])
        .await;
    assert_eq!(reconcile(&scenario, pvc).await, Next::RetryIn(RETRY_START));
    assert!(!in_flight(&scenario));
    assert_eq!(
        scenario.finish().await,
        [
            provisioning(),
            failed(&format!(
                "failed to translate the CSI PV of volume {} to in-tree: failed to get id components.Got: 1, wanted 6 components or more. ; the volume was deleted",
                claim_volume()
            ))
        ]
    );
}

/// The untranslatable volume is deleted only if no PV of its name references it: one that
/// does (an earlier attempt's, or a colliding claim's) keeps it and ends the operation.
#[tokio::test(start_paused = true)]
async fn an_untranslatable_volume_that_a_pv_references_is_not_deleted() {
    let (cluster, pvc) = migrated();
    let holder = PvBuilder::new()
        .name(&claim_volume())
        .csi_driver(GCE)
        .handle("vol-1")
        .build();
    let scenario = cluster
        .start([
            record_written(),
            create_volume(migrated_create(), created("vol-1", GIB)),
            get(claim_volume_path()).answer(200, holder),
            record_removed(),
        ])
        .await;
    assert_eq!(reconcile(&scenario, pvc).await, Next::RetryIn(RETRY_START));
    assert!(!in_flight(&scenario));
    let events = scenario.finish().await;
    assert_eq!(events.len(), 2, "{events:?}");
}

#[tokio::test(start_paused = true)]
async fn a_migrated_class_that_cannot_be_translated_is_reported_before_anything_is_sent() {
    let (cluster, pvc) = migrated();
    let class = ClassBuilder::new()
        .provisioner("kubernetes.io/gce-pd")
        .parameter("zone", "z")
        .build();
    let mut class = class;
    class.allowed_topologies = Some(vec![Default::default()]);
    let scenario = cluster.class(class).start([]).await;
    assert_eq!(reconcile(&scenario, pvc).await, Next::RetryIn(RETRY_START));
    assert_eq!(
        scenario.finish().await,
        [
            provisioning(),
            failed(
                "failed to translate storage class: cannot simultaneously set allowed topologies and zone/zones parameters"
            )
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_drain_sends_nothing_for_a_claim_it_has_not_recorded() {
    let pvc = claim()
        .annotation(ANN_PROVISIONING_CONSISTENCY, "enable")
        .build();
    let scenario = cluster().draining().start([]).await;
    assert!(!scenario.claims().has_work(&cached(&pvc)));
    assert_eq!(reconcile(&scenario, pvc).await, Next::Wait);
    assert_eq!(scenario.finish().await, Vec::<String>::new());
}

#[tokio::test(start_paused = true)]
async fn a_drain_takes_our_finalizer_off_a_claim_with_nothing_in_flight() {
    let pvc = claim()
        .annotation(ANN_PROVISIONING_CONSISTENCY, "enable")
        .finalizer(PROVISIONING_FINALIZER)
        .build();
    let mut released = pvc.clone();
    released.metadata.finalizers = None;
    let scenario = cluster()
        .draining()
        .start([patch(CLAIM_PATH)
            .body(json!([
                { "op": "test", "path": "/metadata/uid", "value": PVC_UID },
                { "op": "test", "path": "/metadata/finalizers/0", "value": PROVISIONING_FINALIZER },
                { "op": "remove", "path": "/metadata/finalizers/0" },
            ]))
            .answer(200, released)])
        .await;
    assert_eq!(reconcile(&scenario, pvc).await, Next::Wait);
    assert_eq!(scenario.finish().await, Vec::<String>::new());
}

#[tokio::test(start_paused = true)]
async fn a_drain_finishes_a_recorded_operation_without_adding_our_finalizer() {
    let pvc = claim()
        .annotation(ANN_PROVISIONING_CONSISTENCY, "enable")
        .build();
    let scenario = cluster()
        .draining()
        .journaled(recorded_operation())
        .start([
            secret_read(),
            create_volume(expected_create(), created("vol-1", GIB)),
            pv_created(),
            record_removed(),
        ])
        .await;
    assert_eq!(reconcile(&scenario, pvc).await, Next::Wait);
    assert!(!in_flight(&scenario));
    assert_eq!(scenario.finish().await, [provisioning(), succeeded()]);
}

#[tokio::test(start_paused = true)]
async fn the_consistency_finalizer_is_added_before_anything_else() {
    let pvc = claim()
        .annotation(ANN_PROVISIONING_CONSISTENCY, "enable")
        .build();
    let mut stored = pvc.clone();
    stored.metadata.finalizers = Some(vec![PROVISIONING_FINALIZER.to_owned()]);
    let scenario = cluster()
        .start([
            patch(CLAIM_PATH)
                .body(json!({
                    "metadata": { "finalizers": [PROVISIONING_FINALIZER], "resourceVersion": "7" }
                }))
                .answer(200, stored),
            secret_read(),
            record_written(),
            create_volume(expected_create(), created("vol-1", GIB)),
            pv_created(),
            record_removed(),
        ])
        .await;
    assert_eq!(reconcile(&scenario, pvc).await, Next::Wait);
    assert_eq!(scenario.finish().await, [provisioning(), succeeded()]);
}

#[tokio::test(start_paused = true)]
async fn a_final_error_after_a_lost_answer_keeps_the_record() {
    let timeout = "rpc error: code = DeadlineExceeded desc = still creating";
    let internal = "rpc error: code = Internal desc = backend hiccup";
    let mut noted = our_record();
    noted["attempts"] = json!(2);
    noted["lastError"] = json!(internal);
    let scenario = cluster()
        .start([
            secret_read(),
            record_written(),
            create_volume(
                expected_create(),
                Err(Status::deadline_exceeded("still creating")),
            ),
            secret_read(),
            create_volume(expected_create(), Err(Status::internal("backend hiccup"))),
            // Both failures noted, written when the journal is dropped; no removal.
            journal_replaced(json!([noted])),
        ])
        .await;
    assert_eq!(
        reconcile(&scenario, claim().build()).await,
        Next::RetryIn(RETRY_START)
    );
    assert_eq!(
        reconcile(&scenario, claim().build()).await,
        Next::RetryIn(RETRY_START * 2)
    );
    assert!(
        in_flight(&scenario),
        "the first attempt may have created the volume"
    );
    assert_eq!(
        scenario.finish().await,
        [
            provisioning(),
            failed(timeout),
            provisioning(),
            failed(internal)
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_claim_whose_volume_name_is_another_claims_operation_sends_nothing() {
    let theirs = Operation {
        volume_name: claim_volume(),
        claim_namespace: "apps".to_owned(),
        claim_name: "other".to_owned(),
        claim_uid: "uid-of-another-claim".to_owned(),
        class_name: "standard".to_owned(),
        request: csi::CreateVolumeRequest::default(),
        provisioner_secret: None,
        attributes_class: None,
    };
    let scenario = cluster().journaled(theirs).start([secret_read()]).await;
    assert_eq!(
        reconcile(&scenario, claim().build()).await,
        Next::RetryIn(RETRY_START)
    );
    let taken = format!(
        "failed to record the operation in the journal: volume name {} is already taken by an operation of claim apps/other (uid uid-of-another-claim); no volume is created for this claim",
        claim_volume()
    );
    assert_eq!(scenario.finish().await, [provisioning(), failed(&taken)]);
}

#[tokio::test(start_paused = true)]
async fn a_replica_that_cannot_prove_it_leads_sends_no_create_volume() {
    let scenario = cluster()
        .fenced()
        .start([secret_read(), record_written(), record_removed()])
        .await;
    assert_eq!(
        reconcile(&scenario, claim().build()).await,
        Next::RetryIn(RETRY_START)
    );
    assert!(!in_flight(&scenario), "nothing was sent");
    assert_eq!(
        scenario.finish().await,
        [
            provisioning(),
            failed(
                "rpc error: code = Unavailable desc = not sent: this replica's leadership is not proven (last Lease renewal: none while leading); another replica may lead"
            )
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_final_error_drops_the_record_and_retries_slowly() {
    let scenario = cluster()
        .start([
            secret_read(),
            record_written(),
            create_volume(
                expected_create(),
                Err(Status::invalid_argument("type fast is unknown")),
            ),
            // Written once nothing more urgent came for 5 seconds.
            record_removed(),
            // The slow retry, once --retry-interval-max has passed.
            secret_read(),
            journal_replaced(json!([our_record()])),
            create_volume(expected_create(), created("vol-1", GIB)),
            pv_created(),
            record_removed(),
        ])
        .await;
    assert_eq!(
        reconcile(&scenario, claim().build()).await,
        Next::RetryIn(RETRY_START)
    );
    assert!(!in_flight(&scenario), "the driver created nothing");
    assert_eq!(
        reconcile(&scenario, claim().build()).await,
        Next::RetryIn(RETRY_MAX),
        "an infeasible claim waits, whatever its backoff"
    );
    // Virtual time: the clock is paused, so this lets every timer due meanwhile fire, in
    // order (the journal's lazy flush among them), and returns at once.
    tokio::time::sleep(RETRY_MAX).await;
    assert_eq!(reconcile(&scenario, claim().build()).await, Next::Wait);
    let infeasible = failed(
        "Volume provisioning failed with infeasible error. Retries will be delayed. rpc error: code = InvalidArgument desc = type fast is unknown",
    );
    assert_eq!(
        scenario.finish().await,
        [provisioning(), infeasible, provisioning(), succeeded()]
    );
}

#[tokio::test(start_paused = true)]
async fn in_progress_keeps_the_record_and_the_retry_repeats_the_request() {
    let timeout = "rpc error: code = DeadlineExceeded desc = still creating";
    let scenario = cluster()
        .start([
            secret_read(),
            record_written(),
            create_volume(
                expected_create(),
                Err(Status::deadline_exceeded("still creating")),
            ),
            // The retry replays the recorded operation: nothing to write before it. The
            // failure note rides along with the record's removal.
            secret_read(),
            create_volume(expected_create(), created("vol-1", GIB)),
            pv_created(),
            record_removed(),
        ])
        .await;
    assert_eq!(
        reconcile(&scenario, claim().build()).await,
        Next::RetryIn(RETRY_START)
    );
    assert!(
        in_flight(&scenario),
        "the driver may still create the volume"
    );
    assert_eq!(reconcile(&scenario, claim().build()).await, Next::Wait);
    assert_eq!(
        scenario.finish().await,
        [provisioning(), failed(timeout), provisioning(), succeeded()]
    );
}

#[tokio::test(start_paused = true)]
async fn a_pv_name_taken_by_another_volume_deletes_the_new_claim_volume() {
    let mut theirs = PvBuilder::new()
        .handle("vol-other")
        .claim_uid("uid-of-another-claim")
        .build();
    theirs.metadata.name = Some(claim_volume());
    let scenario = cluster()
        .start([
            secret_read(),
            record_written(),
            create_volume(expected_create(), created("vol-new", GIB)),
            post("/api/v1/persistentvolumes").refuse(409, "AlreadyExists"),
            get(claim_volume_path()).answer(200, theirs),
            delete_volume("vol-new", SECRETS, Ok(())),
            record_removed(),
        ])
        .await;
    assert_eq!(
        reconcile(&scenario, claim().build()).await,
        Next::RetryIn(RETRY_START)
    );
    assert!(!in_flight(&scenario));
    let taken = failed(&format!(
        "PersistentVolume {} already exists for another volume (\"vol-other\"); the new volume \"vol-new\" was deleted",
        claim_volume()
    ));
    assert_eq!(scenario.finish().await, [provisioning(), taken]);
}

/// Claim `apps/other`'s PV of the claim's volume name: the names collide.
fn pv_of_another_claim(handle: &str) -> PersistentVolume {
    let mut theirs = PvBuilder::new()
        .handle(handle)
        .claim_uid("uid-of-another-claim")
        .build();
    theirs.metadata.name = Some(claim_volume());
    if let Some(claim) = theirs
        .spec
        .as_mut()
        .and_then(|spec| spec.claim_ref.as_mut())
    {
        claim.name = Some("other".to_owned());
    }
    theirs
}

#[tokio::test(start_paused = true)]
async fn a_pv_create_meeting_another_claims_pv_of_the_same_volume_deletes_nothing() {
    let scenario = cluster()
        .start([
            secret_read(),
            record_written(),
            create_volume(expected_create(), created("vol-1", GIB)),
            post("/api/v1/persistentvolumes").refuse(409, "AlreadyExists"),
            get(claim_volume_path()).answer(200, pv_of_another_claim("vol-1")),
            record_removed(),
        ])
        .await;
    assert_eq!(
        reconcile(&scenario, claim().build()).await,
        Next::RetryIn(RETRY_START)
    );
    assert!(!in_flight(&scenario));
    let in_use = failed(&format!(
        "PersistentVolume {} already exists and holds the volume \"vol-1\" the driver returned for this claim (bound to claim apps/other); the volume is in use and is not deleted, and this claim gets no volume: its volume name collides with another's (raise --volume-name-uuid-length)",
        claim_volume()
    ));
    assert_eq!(scenario.finish().await, [provisioning(), in_use]);
}

#[tokio::test(start_paused = true)]
async fn a_claim_whose_short_volume_name_is_another_claims_pv_is_told_on_every_attempt() {
    let name = "pvc-0b2c9f8e";
    let mut theirs = pv_of_another_claim("vol-1");
    theirs.metadata.name = Some(name.to_owned());
    let scenario = cluster()
        .uuid_length(8)
        .volume(theirs.clone())
        .start([
            get(format!("/api/v1/persistentvolumes/{name}")).answer(200, &theirs),
            get(format!("/api/v1/persistentvolumes/{name}")).answer(200, &theirs),
        ])
        .await;
    for delay in [RETRY_START, RETRY_START * 2] {
        assert_eq!(
            reconcile(&scenario, claim().build()).await,
            Next::RetryIn(delay)
        );
    }
    let collision = failed(&format!(
        "PersistentVolume {name} already exists for claim apps/other; this claim gets no volume: its volume name collides with another claim's (raise --volume-name-uuid-length)"
    ));
    assert_eq!(scenario.finish().await, [collision.clone(), collision]);
}

#[tokio::test(start_paused = true)]
async fn a_claim_whose_short_volume_name_is_its_own_pv_waits_for_the_binding() {
    let name = "pvc-0b2c9f8e";
    let mut ours = PvBuilder::new().handle("vol-1").build();
    ours.metadata.name = Some(name.to_owned());
    let scenario = cluster()
        .uuid_length(8)
        .volume(ours.clone())
        .start([get(format!("/api/v1/persistentvolumes/{name}")).answer(200, &ours)])
        .await;
    assert_eq!(reconcile(&scenario, claim().build()).await, Next::Wait);
    assert!(scenario.finish().await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_pv_that_already_holds_the_volume_is_success() {
    let mut ours = PvBuilder::new().handle("vol-1").build();
    ours.metadata.name = Some(claim_volume());
    let scenario = cluster()
        .start([
            secret_read(),
            record_written(),
            create_volume(expected_create(), created("vol-1", GIB)),
            post("/api/v1/persistentvolumes").refuse(409, "AlreadyExists"),
            get(claim_volume_path()).answer(200, ours),
            record_removed(),
        ])
        .await;
    assert_eq!(reconcile(&scenario, claim().build()).await, Next::Wait);
    assert_eq!(scenario.finish().await, [provisioning(), succeeded()]);
}

#[tokio::test(start_paused = true)]
async fn a_failed_journal_write_sends_no_create_claim_volume() {
    let scenario = cluster()
        .journal_timeout(Duration::from_millis(50))
        .start([
            secret_read(),
            post(journal_path()).refuse(500, "InternalError"),
            // The shard writer keeps the record and tries again after the reconcile gave
            // up: re-read, write.
            get(shard_path()).refuse(404, "NotFound"),
            record_written(),
        ])
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
                "failed to record the operation in the journal: the journal did not store the operation within 50ms; CreateVolume is not sent until it does"
            )
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_journal_write_conflict_rereads_the_shard_before_create_claim_volume() {
    let previous_leaders = OperationRecord {
        volume_name: "pvc-other".to_owned(),
        claim: "apps/other".to_owned(),
        claim_uid: "uid-other".to_owned(),
        ..OperationRecord::default()
    };
    let scenario = cluster()
        .start([
            secret_read(),
            post(journal_path()).refuse(409, "AlreadyExists"),
            get(shard_path()).answer(200, shard(vec![previous_leaders])),
            put(shard_path())
                .body(json!({ "spec": { "operations": [our_record(), { "volumeName": "pvc-other" }] } }))
                .echo(200),
            create_volume(expected_create(), created("vol-1", GIB)),
            pv_created(),
            journal_replaced(json!([{ "volumeName": "pvc-other" }])),
        ])
        .await;
    assert_eq!(reconcile(&scenario, claim().build()).await, Next::Wait);
    assert_eq!(scenario.finish().await, [provisioning(), succeeded()]);
}

// ---------------------------------------------------------------------------- topology

/// Nodes n1 (zone z1) and n2 (zone z2), both with our driver's CSINode keyed on `zone`.
fn zoned() -> Cluster {
    let node =
        |name: &str, zone: &str| json!({"metadata": {"name": name, "labels": {"zone": zone}}});
    let csinode = |name: &str| {
        json!({"metadata": {"name": name}, "spec": {"drivers": [
            {"name": DRIVER, "nodeID": name, "topologyKeys": ["zone"]}
        ]}})
    };
    cluster().topology(
        vec![node("n1", "z1"), node("n2", "z2")],
        vec![csinode("n1"), csinode("n2")],
    )
}

fn on_node(node: &str) -> PvcBuilder {
    claim().annotation(ANN_SELECTED_NODE, node)
}

fn zones(zones: &[&str]) -> Vec<csi::Topology> {
    zones
        .iter()
        .map(|zone| csi::Topology {
            segments: strings(&[("zone", zone)]),
        })
        .collect()
}

/// What a claim on n1 asks for: every zone, n1's first.
fn create_on_n1() -> CreateVolumeCall {
    CreateVolumeCall {
        accessibility: Some(csi::TopologyRequirement {
            requisite: zones(&["z1", "z2"]),
            preferred: zones(&["z1", "z2"]),
        }),
        ..expected_create()
    }
}

/// The volume created in zone z1.
fn created_in_z1() -> Result<csi::CreateVolumeResponse, Status> {
    let mut response = created("vol-1", GIB)?;
    if let Some(volume) = response.volume.as_mut() {
        volume.accessible_topology = zones(&["z1"]);
    }
    Ok(response)
}

/// The removal of `node` from the claim's selected-node annotation.
fn node_given_back(node: &str) -> Step {
    let path = "/metadata/annotations/volume.kubernetes.io~1selected-node";
    patch(CLAIM_PATH)
        .body(json!([
            {"op": "test", "path": "/metadata/uid", "value": PVC_UID},
            {"op": "test", "path": path, "value": node},
            {"op": "remove", "path": path},
        ]))
        .answer(200, claim().build())
}

#[tokio::test(start_paused = true)]
async fn a_claim_on_a_node_asks_for_that_nodes_topology_first() {
    let scenario = zoned()
        .start([
            secret_read(),
            record_written(),
            create_volume(create_on_n1(), created_in_z1()),
            pv_created(),
            record_removed(),
        ])
        .await;
    assert_eq!(
        reconcile(&scenario, on_node("n1").build()).await,
        Next::Wait
    );
    assert_eq!(scenario.finish().await, [provisioning(), succeeded()]);
}

#[tokio::test(start_paused = true)]
async fn resource_exhausted_on_a_node_gives_the_node_back_to_the_scheduler() {
    let scenario = zoned()
        .start([
            secret_read(),
            record_written(),
            create_volume(
                create_on_n1(),
                Err(Status::resource_exhausted("zone z1 is full")),
            ),
            node_given_back("n1"),
            record_removed(),
        ])
        .await;
    assert_eq!(
        reconcile(&scenario, on_node("n1").build()).await,
        Next::Wait,
        "the claim waits for the scheduler's next node"
    );
    assert!(!in_flight(&scenario), "the driver created nothing");
    assert_eq!(
        scenario.finish().await,
        [
            provisioning(),
            failed("rpc error: code = ResourceExhausted desc = zone z1 is full")
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_node_whose_volume_may_exist_is_kept_after_resource_exhausted() {
    let scenario = zoned()
        .start([
            secret_read(),
            record_written(),
            create_volume(
                create_on_n1(),
                Err(Status::deadline_exceeded("still creating")),
            ),
            secret_read(),
            create_volume(
                create_on_n1(),
                Err(Status::resource_exhausted("zone z1 is full")),
            ),
            secret_read(),
            create_volume(create_on_n1(), created_in_z1()),
            pv_created(),
            record_removed(),
        ])
        .await;
    let pvc = on_node("n1").build();
    assert_eq!(
        reconcile(&scenario, pvc.clone()).await,
        Next::RetryIn(RETRY_START)
    );
    assert_eq!(
        reconcile(&scenario, pvc.clone()).await,
        Next::RetryIn(RETRY_START * 2),
        "no node given back: the first attempt may have created the volume there"
    );
    assert_eq!(reconcile(&scenario, pvc).await, Next::Wait);
    let kept = "rpc error: code = ResourceExhausted desc = zone z1 is full; an earlier attempt may have created the volume for node \"n1\", so the claim keeps that node and the same request is retried until the driver says what became of it";
    assert_eq!(
        scenario.finish().await,
        [
            provisioning(),
            failed("rpc error: code = DeadlineExceeded desc = still creating"),
            provisioning(),
            failed(kept),
            provisioning(),
            succeeded()
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_selected_node_without_csinode_is_given_back_before_anything_is_sent() {
    let scenario = zoned().start([node_given_back("n3")]).await;
    assert_eq!(
        reconcile(&scenario, on_node("n3").build()).await,
        Next::Wait
    );
    let events = scenario.finish().await;
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[0], provisioning());
    assert!(
        events[1].starts_with(&failed("")) && events[1].contains("n3"),
        "{events:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn watches_that_never_list_are_an_event_not_a_hang() {
    let scenario = cluster().topology_unlisted().start([]).await;
    assert_eq!(
        reconcile(&scenario, on_node("n1").build()).await,
        Next::RetryIn(RETRY_START)
    );
    assert_eq!(
        scenario.finish().await,
        [
            provisioning(),
            failed(
                "the Node and CSINode watches have not listed yet, so the claim's topology is unknown (does the sidecar's RBAC grant list and watch on nodes and csinodes?)"
            )
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_recorded_operation_is_replayed_even_when_its_node_is_gone() {
    let mut recorded = recorded_operation();
    recorded.request.accessibility_requirements = create_on_n1().accessibility;
    // The claim now names a node the cluster does not know: the recorded request is sent.
    let scenario = zoned()
        .journaled(recorded)
        .start([
            secret_read(),
            create_volume(create_on_n1(), created_in_z1()),
            pv_created(),
            record_removed(),
        ])
        .await;
    assert_eq!(
        reconcile(&scenario, on_node("gone").build()).await,
        Next::Wait
    );
    assert_eq!(scenario.finish().await, [provisioning(), succeeded()]);
}

// ------------------------------------------------------------------ data sources

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
            create_volume(
                CreateVolumeCall {
                    content_source: from_snapshot("snap-handle"),
                    ..expected_create()
                },
                created_from(from_snapshot("snap-handle")),
            ),
            pv_created(),
            get(SNAPSHOT_PATH).answer(200, snapshot(&[SNAPSHOT_PROTECTION_FINALIZER])),
            patch(SNAPSHOT_PATH).echo(200),
            record_removed(),
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

// ------------------------------------------------------------------ cross-namespace sources

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
            get("/apis/snapshot.storage.k8s.io/v1/volumesnapshotcontents/content-1")
                .answer(200, content),
            get(OTHER_SNAPSHOT_PATH).answer(200, in_other(snapshot(&[]))),
            patch(OTHER_SNAPSHOT_PATH)
                .body(json!({"metadata": {"finalizers": [SNAPSHOT_PROTECTION_FINALIZER]}}))
                .echo(200),
            secret_read(),
            record_written(),
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

// ------------------------------------------------------------------ node deployment

const NODE: &str = "node-b";
const NODE_KEY: &str = "example.com/node";

/// `--node-deployment` on node-b, whose driver's segment is `example.com/node=node-b`;
/// class `standard` as above, and class `now` with Immediate binding.
fn node_b() -> Cluster {
    cluster()
        .class(
            ClassBuilder::new()
                .name("now")
                .binding_mode("Immediate")
                .parameter("type", "fast")
                .build(),
        )
        .node_mode(NODE, &[(NODE_KEY, NODE)])
        .claim(immediate_claim().build())
}

fn node_b_segment() -> Vec<csi::Topology> {
    vec![csi::Topology {
        segments: strings(&[(NODE_KEY, NODE)]),
    }]
}

/// An Immediate claim (class `now`) no node owns yet.
fn immediate_claim() -> PvcBuilder {
    claim().class("now")
}

fn capacity_asked(available: i64) -> Step {
    let pvc = immediate_claim().build();
    let class = ClassBuilder::new()
        .name("now")
        .binding_mode("Immediate")
        .build();
    let caps = crate::provision::DriverCapabilities {
        topology: true,
        ..crate::provision::fixtures::caps()
    };
    let plan = crate::provision::plan_provision(
        &pvc,
        &class,
        &crate::provision::fixtures::config(),
        &caps,
        &[],
    )
    .expect("a plan");
    Step::GetCapacity {
        expected: csi::GetCapacityRequest {
            volume_capabilities: plan.volume_capabilities,
            parameters: strings(&[("type", "fast")]),
            accessible_topology: node_b_segment().pop(),
        },
        answer: Ok(csi::GetCapacityResponse {
            available_capacity: available,
            ..Default::default()
        }),
    }
}

fn node_selected(status: u16) -> Step {
    let call = patch(CLAIM_PATH).body(json!({"metadata": {
        "resourceVersion": "7",
        "annotations": {"volume.kubernetes.io/selected-node": NODE},
    }}));
    if status == 200 {
        call.answer(
            200,
            immediate_claim()
                .annotation(ANN_SELECTED_NODE, NODE)
                .build(),
        )
    } else {
        call.refuse(status, "Conflict")
    }
}

/// The wait of a retry, within `range`.
fn waits(next: &Next, range: std::ops::RangeInclusive<Duration>) -> Duration {
    let Next::RetryIn(wait) = *next else {
        panic!("{next:?} is not a retry")
    };
    assert!(range.contains(&wait), "{wait:?} not in {range:?}");
    wait
}

/// Just past `wait` (its decimal form may have lost a fraction of a nanosecond).
async fn sleep_past(wait: Duration) {
    tokio::time::advance(wait + Duration::from_millis(1)).await;
}

#[tokio::test(start_paused = true)]
async fn a_claim_selected_to_another_node_gets_no_request() {
    let scenario = node_b().start([]).await;
    assert_eq!(
        reconcile(&scenario, on_node("node-a").build()).await,
        Next::Wait
    );
    assert!(
        !scenario
            .claims()
            .has_work(&cached(&on_node("node-a").build()))
    );
    assert!(scenario.finish().await.is_empty(), "no event either");
}

#[tokio::test(start_paused = true)]
async fn a_claim_selected_to_this_node_is_created_on_its_segment() {
    let create = CreateVolumeCall {
        accessibility: Some(csi::TopologyRequirement {
            requisite: node_b_segment(),
            preferred: node_b_segment(),
        }),
        ..expected_create()
    };
    let mut answer = created("vol-1", GIB);
    if let Ok(Some(volume)) = answer.as_mut().map(|r| r.volume.as_mut()) {
        volume.accessible_topology = node_b_segment();
    }
    let scenario = node_b()
        .start([
            secret_read(),
            record_written(),
            create_volume(create, answer),
            pv_created(),
            record_removed(),
        ])
        .await;
    assert_eq!(
        reconcile(&scenario, on_node(NODE).build()).await,
        Next::Wait
    );
    assert_eq!(scenario.finish().await, [provisioning(), succeeded()]);
}

#[tokio::test(start_paused = true)]
async fn an_immediate_claim_is_taken_after_the_delay_and_a_capacity_check() {
    let scenario = node_b()
        .start([capacity_asked(GIB), node_selected(200)])
        .await;
    let first = reconcile(&scenario, immediate_claim().build()).await;
    let wait = waits(&first, Duration::ZERO..=Duration::from_secs(1));
    // Woken early (an update of the claim): the rest of the wait, nothing sent.
    let early = reconcile(&scenario, immediate_claim().build()).await;
    waits(&early, Duration::ZERO..=wait);
    sleep_past(wait).await;
    assert_eq!(
        reconcile(&scenario, immediate_claim().build()).await,
        Next::Wait
    );
    assert!(scenario.finish().await.is_empty(), "no event for a race");
}

#[tokio::test(start_paused = true)]
async fn a_lost_write_or_no_room_waits_longer_and_another_nodes_name_ends_the_race() {
    let scenario = node_b()
        .start([
            capacity_asked(GIB - 1),
            capacity_asked(GIB),
            node_selected(409),
        ])
        .await;
    let wait = waits(
        &reconcile(&scenario, immediate_claim().build()).await,
        Duration::ZERO..=Duration::from_secs(1),
    );
    sleep_past(wait).await;
    // No room here: the second wait is (1, 2] s.
    let wait = waits(
        &reconcile(&scenario, immediate_claim().build()).await,
        Duration::from_millis(1001)..=Duration::from_secs(2),
    );
    sleep_past(wait).await;
    // Room, but another node wrote first: capped at 2 s, less up to 1 s of jitter.
    let wait = waits(
        &reconcile(&scenario, immediate_claim().build()).await,
        Duration::from_millis(1001)..=Duration::from_secs(2),
    );
    assert_eq!(scenario.claims().races().attempts(PVC_UID), Some(3));
    sleep_past(wait).await;
    // The winner's name is in the cache now: nothing is sent and the race is over.
    let taken = immediate_claim()
        .annotation(ANN_SELECTED_NODE, "node-a")
        .build();
    assert_eq!(reconcile(&scenario, taken).await, Next::Wait);
    assert_eq!(scenario.claims().races().attempts(PVC_UID), None);
    assert!(scenario.finish().await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_driver_without_topology_is_asked_for_capacity_without_a_segment() {
    let pvc = immediate_claim().build();
    let Step::GetCapacity {
        mut expected,
        answer,
    } = capacity_asked(GIB)
    else {
        unreachable!()
    };
    expected.accessible_topology = None;
    let scenario = cluster()
        .class(
            ClassBuilder::new()
                .name("now")
                .binding_mode("Immediate")
                .parameter("type", "fast")
                .build(),
        )
        .node_mode(NODE, &[])
        .claim(pvc.clone())
        .start([Step::GetCapacity { expected, answer }, node_selected(200)])
        .await;
    let wait = waits(
        &reconcile(&scenario, pvc.clone()).await,
        Duration::ZERO..=Duration::from_secs(1),
    );
    sleep_past(wait).await;
    assert_eq!(reconcile(&scenario, pvc).await, Next::Wait);
    assert!(scenario.finish().await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn allowed_topologies_without_this_node_leave_the_claim_to_others() {
    let mut class = ClassBuilder::new()
        .name("elsewhere")
        .binding_mode("Immediate")
        .build();
    class.allowed_topologies = Some(vec![k8s_openapi::api::core::v1::TopologySelectorTerm {
        match_label_expressions: Some(vec![
            k8s_openapi::api::core::v1::TopologySelectorLabelRequirement {
                key: NODE_KEY.into(),
                values: vec!["node-a".into()],
            },
        ]),
    }]);
    let pvc = claim().class("elsewhere").build();
    let scenario = node_b().class(class).claim(pvc.clone()).start([]).await;
    // Decided before the first delay, as upstream: no wait, no call.
    assert_eq!(reconcile(&scenario, pvc).await, Next::Wait);
    assert!(scenario.finish().await.is_empty());
}
