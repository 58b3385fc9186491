//! A claim provisioned: the journal record around CreateVolume, the consistency finalizer,
//! final and in-progress errors, the lease fence, journal writes that fail.

use super::*;

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

/// The reaper replays only idle operations: while CreateVolume is in flight and until the PV
/// is saved, the claim's operation must be busy, or a claim deleted meanwhile would have its
/// volume deleted and its record dropped beside this call (which may create it again).
#[tokio::test(start_paused = true)]
async fn the_operation_is_busy_while_its_create_volume_is_in_flight() {
    let (create, held) = held_create_volume(expected_create(), created("vol-1", GIB));
    let scenario = cluster()
        .start([
            secret_read(),
            record_written(),
            create,
            pv_created(),
            record_removed(),
        ])
        .await;
    let ctx = scenario.ctx();
    let check = async {
        held.sent().await;
        let registry = ctx.journal.registry();
        assert!(
            registry.contains(&claim_volume()),
            "recorded before the call"
        );
        assert!(
            registry.idle().is_empty(),
            "an operation in flight was left to the reaper"
        );
        held.release();
    };
    let (next, ()) = tokio::join!(reconcile(&scenario, claim().build()), check);
    assert_eq!(next, Next::Wait);
    assert!(!in_flight(&scenario));
    drop(ctx);
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
        known_volume_id: None,
    };
    let scenario = cluster().journaled(theirs).start([]).await;
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
        .start([secret_read(), record_written()])
        .await;
    assert_eq!(
        reconcile(&scenario, claim().build()).await,
        Next::RetryIn(RETRY_START)
    );
    // Nothing was sent from here, but the record is not removed either: a new leader may
    // have taken it in and sent it (found by the simulation, issue #31).
    assert!(in_flight(&scenario), "the record is the leader's to settle");
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

/// A class re-created naming a Secret that does not exist must not block a claim whose
/// operation is recorded: the retry sends the recorded request with the recorded secret and
/// reads nothing the class names now (the code before read the class's Secret first, and every
/// attempt failed on it although the recorded request would succeed).
#[tokio::test(start_paused = true)]
async fn a_recorded_operation_is_replayed_with_its_secret_whatever_the_class_names_now() {
    let recreated = ClassBuilder::new()
        .parameter("type", "gold")
        .parameter("csi.storage.k8s.io/provisioner-secret-name", "missing")
        .parameter("csi.storage.k8s.io/provisioner-secret-namespace", "apps")
        .build();
    let scenario = Cluster::new()
        .class(recreated)
        .journaled(recorded_operation())
        .start([
            secret_read(),
            create_volume(expected_create(), created("vol-1", GIB)),
            pv_created(),
            record_removed(),
        ])
        .await;
    assert_eq!(reconcile(&scenario, claim().build()).await, Next::Wait);
    assert!(!in_flight(&scenario));
    assert_eq!(scenario.finish().await, [provisioning(), succeeded()]);
}
