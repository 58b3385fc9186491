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
mod tests;
