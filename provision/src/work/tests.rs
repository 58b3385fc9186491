use super::*;
use crate::fixtures::{ClassBuilder, DRIVER, PvBuilder, PvcBuilder, config};
use crate::{
    ANN_BETA_STORAGE_PROVISIONER, ANN_PROVISIONING_CONSISTENCY, ANN_STORAGE_PROVISIONER,
    PROVISIONING_FINALIZER,
};

fn ours() -> PvcBuilder {
    PvcBuilder::new().annotation(ANN_STORAGE_PROVISIONER, DRIVER)
}

fn work<'c>(
    pvc: &PersistentVolumeClaim,
    class: Option<&'c StorageClass>,
    in_flight: bool,
) -> ClaimWork<&'c StorageClass> {
    claim_work(pvc, class, &config(), false, |_| in_flight)
}

#[test]
fn an_annotated_claim_with_its_class_is_provisioned_with_that_class() {
    let class = ClassBuilder::new().build();
    assert_eq!(
        work(&ours().build(), Some(&class), false),
        ClaimWork::Provision(&class)
    );
}

#[test]
fn a_missing_class_is_refused_with_the_api_servers_text() {
    let pvc = ours().build();
    let ClaimWork::Refuse(error) = work(&pvc, None, false) else {
        panic!("not refused");
    };
    assert_eq!(
        error.to_string(),
        format!(
            "storageclass.storage.k8s.io {:?} not found",
            claim_class_name(&pvc)
        )
    );
}

#[test]
fn another_provisioners_claim_is_left_alone_even_with_our_finalizer() {
    let class = ClassBuilder::new().build();
    let pvc = PvcBuilder::new()
        .annotation(ANN_STORAGE_PROVISIONER, "other.csi.example.com")
        .finalizer(PROVISIONING_FINALIZER)
        .deleting()
        .build();
    assert_eq!(work(&pvc, Some(&class), false), ClaimWork::Nothing(None));
}

#[test]
fn the_beta_annotation_makes_the_claim_ours_when_the_ga_one_is_absent() {
    let class = ClassBuilder::new().build();
    let pvc = PvcBuilder::new()
        .annotation(ANN_BETA_STORAGE_PROVISIONER, DRIVER)
        .finalizer(PROVISIONING_FINALIZER)
        .deleting()
        .build();
    assert_eq!(work(&pvc, Some(&class), false), ClaimWork::ReleaseFinalizer);
}

#[test]
fn a_deleted_claim_keeps_its_finalizer_while_its_operation_is_in_flight() {
    let class = ClassBuilder::new().build();
    let pvc = ours()
        .annotation(ANN_PROVISIONING_CONSISTENCY, "enable")
        .finalizer(PROVISIONING_FINALIZER)
        .deleting()
        .build();
    assert_eq!(work(&pvc, Some(&class), true), ClaimWork::Nothing(None));
    assert_eq!(work(&pvc, Some(&class), false), ClaimWork::ReleaseFinalizer);
}

#[test]
fn in_flight_is_asked_under_the_claims_volume_name() {
    let class = ClassBuilder::new().build();
    let pvc = ours().finalizer(PROVISIONING_FINALIZER).deleting().build();
    let mut asked = None;
    let _ = claim_work(&pvc, Some(&class), &config(), true, |name| {
        asked = Some(name.to_owned());
        true
    });
    let uid = pvc.metadata.uid.clone().unwrap_or_default();
    assert_eq!(asked, Some(format!("pvc-{uid}")));
}

#[test]
fn a_claim_being_deleted_gets_no_new_volume() {
    let class = ClassBuilder::new().build();
    let pvc = ours().deleting().build();
    assert_eq!(work(&pvc, Some(&class), false), ClaimWork::Nothing(None));
}

#[test]
fn a_bound_claim_has_nothing_to_do_and_says_why() {
    let class = ClassBuilder::new().build();
    let pvc = ours().volume_name("pv-1").build();
    assert!(matches!(
        work(&pvc, Some(&class), false),
        ClaimWork::Nothing(Some(SkipReason::AlreadyBound { .. }))
    ));
}

fn drain<'c>(
    pvc: &PersistentVolumeClaim,
    class: Option<&'c StorageClass>,
    in_flight: bool,
) -> ClaimWork<&'c StorageClass> {
    drain_claim_work(pvc, class, &config(), |_| in_flight)
}

#[test]
fn a_drain_starts_nothing_for_a_claim_without_an_operation() {
    let class = ClassBuilder::new().build();
    let enabled = ours().annotation(ANN_PROVISIONING_CONSISTENCY, "enable");
    assert_eq!(
        drain(&ours().build(), Some(&class), false),
        ClaimWork::Nothing(Some(SkipReason::Draining))
    );
    assert_eq!(
        drain(&enabled.build(), Some(&class), false),
        ClaimWork::Nothing(Some(SkipReason::Draining)),
        "no finalizer either"
    );
}

#[test]
fn a_drain_finishes_a_recorded_operation_of_a_live_claim() {
    let class = ClassBuilder::new().build();
    let pvc = ours()
        .annotation(ANN_PROVISIONING_CONSISTENCY, "enable")
        .finalizer(PROVISIONING_FINALIZER)
        .build();
    assert_eq!(
        drain(&pvc, Some(&class), true),
        ClaimWork::Provision(&class)
    );
    assert!(matches!(drain(&pvc, None, true), ClaimWork::Refuse(_)));
}

#[test]
fn a_drain_removes_the_finalizer_once_nothing_is_in_flight_whatever_the_claim() {
    let class = ClassBuilder::new().build();
    for pvc in [
        ours().finalizer(PROVISIONING_FINALIZER).build(),
        ours()
            .annotation(ANN_PROVISIONING_CONSISTENCY, "enable")
            .finalizer(PROVISIONING_FINALIZER)
            .build(),
        ours().finalizer(PROVISIONING_FINALIZER).deleting().build(),
        ours()
            .finalizer(PROVISIONING_FINALIZER)
            .volume_name("pv-1")
            .build(),
    ] {
        assert_eq!(
            drain(&pvc, Some(&class), false),
            ClaimWork::ReleaseFinalizer,
            "{pvc:?}"
        );
    }
}

#[test]
fn a_drain_leaves_a_deleted_claims_operation_to_the_reaper() {
    let class = ClassBuilder::new().build();
    let pvc = ours().finalizer(PROVISIONING_FINALIZER).deleting().build();
    assert_eq!(drain(&pvc, Some(&class), true), ClaimWork::Nothing(None));
}

#[test]
fn a_drain_leaves_other_provisioners_claims_alone() {
    let class = ClassBuilder::new().build();
    let pvc = PvcBuilder::new()
        .annotation(ANN_STORAGE_PROVISIONER, "other.csi.example.com")
        .finalizer(PROVISIONING_FINALIZER)
        .build();
    assert_eq!(drain(&pvc, Some(&class), false), ClaimWork::Nothing(None));
    assert!(!holds_up_drain(&pvc, DRIVER));
}

#[test]
fn only_our_claims_with_our_finalizer_hold_up_a_drain() {
    assert!(holds_up_drain(
        &ours().finalizer(PROVISIONING_FINALIZER).build(),
        DRIVER
    ));
    assert!(!holds_up_drain(&ours().build(), DRIVER));
    assert!(!holds_up_drain(
        &ours().finalizer("other/finalizer").build(),
        DRIVER
    ));
}

#[test]
fn only_our_pvs_that_need_a_finalizer_change_or_a_deletion_have_work() {
    let released = PvBuilder::new()
        .provisioned_by(DRIVER)
        .phase("Released")
        .build();
    assert!(volume_has_work(&released, DRIVER));
    assert!(!volume_has_work(&released, "other.csi.example.com"));
    let bound = PvBuilder::new().provisioned_by(DRIVER).build();
    assert!(!volume_has_work(&bound, DRIVER));
    let retained = PvBuilder::new()
        .provisioned_by(DRIVER)
        .phase("Released")
        .policy("Retain")
        .no_finalizer()
        .build();
    assert!(!volume_has_work(&retained, DRIVER));
}
