//! Volume names that collide: a PV of the claim's volume name that is another's.

use super::*;

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
