//! What a reconcile has to do for a cached claim or PV, decided without IO. The controllers
//! queue only objects with work (nearly every cached object has none, and a queue's memory is
//! never given back), and the reconcilers act on exactly this answer.

use std::ops::Deref;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;

use super::claim::{
    ClaimWork, DecisionError, ProvisionDecision, SkipReason, claim_class_name, claim_is_for_driver,
    should_provision,
};
use super::consistency::{has_provisioning_finalizer, may_release_finalizer};
use super::deletion::{
    FinalizerAction, has_deletable_source, is_provisioner_for_volume, should_delete,
    volume_finalizer_action,
};
use super::settings::ProvisionerConfig;
use super::volume_name::volume_name;

/// The work of a claim, from the claim, the class it names (`None` if that class does not
/// exist), this sidecar's settings and whether an operation is in flight under a volume name
/// (asked only for a claim that carries our finalizer).
///
/// Only the claim's own provisioner may release the consistency finalizer: every sidecar sees
/// every claim, and another driver's sidecar has none of this claim's operations in flight.
/// A claim being deleted gets no new volume; its operation in flight, if any, is the orphan
/// reaper's.
pub fn claim_work<C: Deref<Target = StorageClass>>(
    pvc: &PersistentVolumeClaim,
    class: Option<C>,
    config: &ProvisionerConfig,
    consistency_by_default: bool,
    in_flight: impl FnOnce(&str) -> bool,
) -> ClaimWork<C> {
    let ours = claim_is_for_driver(pvc, &config.driver_name);
    if ours && has_provisioning_finalizer(pvc) {
        let in_flight = has_operation_in_flight(pvc, config, in_flight);
        if may_release_finalizer(pvc, in_flight, consistency_by_default) {
            return ClaimWork::ReleaseFinalizer;
        }
    }
    if pvc.metadata.deletion_timestamp.is_some() {
        return ClaimWork::Nothing(None);
    }
    provision_work(pvc, class, config)
}

/// The work of a claim while the sidecar drains (`--drain`): it hands over to a provisioner
/// that keeps no journal and does not know our claim finalizer (upstream), so it finishes what
/// is recorded and starts nothing. A claim with no operation in flight gets no CreateVolume
/// and no finalizer, and loses our finalizer if it carries one; a claim with one gets its
/// volume (the executor adds no finalizer in a drain, see [`super::needs_finalizer`]). A claim
/// being deleted is left to the orphan reaper, which releases its finalizer after the
/// orphan's DeleteVolume, as in service.
pub fn drain_claim_work<C: Deref<Target = StorageClass>>(
    pvc: &PersistentVolumeClaim,
    class: Option<C>,
    config: &ProvisionerConfig,
    in_flight: impl FnOnce(&str) -> bool,
) -> ClaimWork<C> {
    if !claim_is_for_driver(pvc, &config.driver_name) {
        return ClaimWork::Nothing(None);
    }
    if !has_operation_in_flight(pvc, config, in_flight) {
        return if has_provisioning_finalizer(pvc) {
            ClaimWork::ReleaseFinalizer
        } else {
            ClaimWork::Nothing(Some(SkipReason::Draining))
        };
    }
    if pvc.metadata.deletion_timestamp.is_some() {
        return ClaimWork::Nothing(None);
    }
    provision_work(pvc, class, config)
}

/// Whether an operation is in flight under the claim's volume name (none if the claim has no
/// valid name: nothing can have been recorded for it).
pub fn has_operation_in_flight(
    pvc: &PersistentVolumeClaim,
    config: &ProvisionerConfig,
    in_flight: impl FnOnce(&str) -> bool,
) -> bool {
    let uid = pvc.metadata.uid.as_deref().unwrap_or_default();
    volume_name(
        &config.volume_name_prefix,
        config.volume_name_uuid_length,
        uid,
    )
    .is_ok_and(|name| in_flight(&name))
}

/// Whether this claim keeps a drain from completing: it is ours and carries our finalizer,
/// which the provisioner taking over would never remove.
pub fn holds_up_drain(pvc: &PersistentVolumeClaim, driver_name: &str) -> bool {
    claim_is_for_driver(pvc, driver_name) && has_provisioning_finalizer(pvc)
}

/// Provision, skip or refuse a live claim, from [`should_provision`].
fn provision_work<C: Deref<Target = StorageClass>>(
    pvc: &PersistentVolumeClaim,
    class: Option<C>,
    config: &ProvisionerConfig,
) -> ClaimWork<C> {
    match should_provision(pvc, class.as_deref(), &config.driver_name) {
        ProvisionDecision::Skip(reason) => ClaimWork::Nothing(Some(reason)),
        ProvisionDecision::Error(error) => ClaimWork::Refuse(error),
        ProvisionDecision::Provision => match class {
            Some(class) => ClaimWork::Provision(class),
            None => ClaimWork::Refuse(DecisionError::StorageClassNotFound(
                claim_class_name(pvc).to_owned(),
            )),
        },
    }
}

/// Whether a PV needs a reconcile: a PV of ours whose finalizer is out of line with its
/// reclaim policy, or that is due for deletion.
///
/// A PV without a [`has_deletable_source`] has work only to lose our finalizer: it is never
/// deleted by us, so it cannot fail and retry forever.
pub fn volume_has_work(pv: &PersistentVolume, driver_name: &str) -> bool {
    is_provisioner_for_volume(pv, driver_name)
        && (volume_finalizer_action(pv, driver_name) != FinalizerAction::None
            || (should_delete(pv) && has_deletable_source(pv, driver_name)))
}

#[cfg(test)]
mod tests {
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
}
