//! `--drain`: a claim is finished or released, never started.

use super::*;

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
