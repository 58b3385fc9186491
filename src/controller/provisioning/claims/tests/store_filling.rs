//! A claim reconciled while the PV store still fills (the sidecar's first lists at start-up):
//! whether its PV exists is read from the API server, never taken from the store's silence.

use super::*;

fn our_pv() -> PersistentVolume {
    let mut pv = PvBuilder::new().handle("vol-1").claim_uid(PVC_UID).build();
    pv.metadata.name = Some(claim_volume());
    pv
}

#[tokio::test(start_paused = true)]
async fn a_claim_whose_pv_has_not_arrived_yet_is_read_and_not_provisioned_again() {
    let scenario = cluster()
        .volumes_unlisted()
        .start([get(claim_volume_path()).answer(200, our_pv())])
        .await;
    assert_eq!(reconcile(&scenario, claim().build()).await, Next::Wait);
    assert!(!in_flight(&scenario));
    // No CreateVolume, no record, no event: the claim waits for its binding.
    assert!(scenario.finish().await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_claim_without_a_pv_is_provisioned_after_the_read_says_so() {
    let scenario = cluster()
        .volumes_unlisted()
        .start([
            get(claim_volume_path()).refuse(404, "NotFound"),
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

#[tokio::test(start_paused = true)]
async fn once_the_pv_store_has_listed_its_silence_is_taken_without_a_read() {
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
    assert_eq!(scenario.finish().await, [provisioning(), succeeded()]);
}
