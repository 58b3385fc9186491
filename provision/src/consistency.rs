//! The provisioning-consistency finalizer on claims (the semantics of upstream PR #1179):
//! annotation `volume.kubernetes.io/provisioning-consistency: enable` puts a finalizer on the
//! claim before CreateVolume and takes it off once the claim is bound; on a claim being
//! deleted it comes off once no operation of the claim is in flight. `disable` takes it off
//! at once (the journal still deletes whatever the driver created). Claims without the
//! annotation follow `--provisioning-consistency-default`.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;

/// Claim annotation choosing the behaviour per claim.
pub const ANN_PROVISIONING_CONSISTENCY: &str = "volume.kubernetes.io/provisioning-consistency";
/// The finalizer that keeps a claim until its provisioning is settled.
pub const PROVISIONING_FINALIZER: &str =
    "external-provisioner.volume.kubernetes.io/provisioning-protection";

/// Whether the claim wants the finalizer: its annotation, else the admin's default.
pub fn consistency_enabled(pvc: &PersistentVolumeClaim, default_enabled: bool) -> bool {
    match pvc
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANN_PROVISIONING_CONSISTENCY))
        .map(String::as_str)
    {
        Some("enable") => true,
        Some("disable") => false,
        _ => default_enabled,
    }
}

pub fn has_provisioning_finalizer(pvc: &PersistentVolumeClaim) -> bool {
    pvc.metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|f| f == PROVISIONING_FINALIZER))
}

/// Whether a claim carrying the finalizer may let it go now. `in_flight` says whether an
/// operation of this claim is still recorded in the journal.
pub fn may_release_finalizer(
    pvc: &PersistentVolumeClaim,
    in_flight: bool,
    default_enabled: bool,
) -> bool {
    let bound = pvc
        .spec
        .as_ref()
        .and_then(|spec| spec.volume_name.as_deref())
        .is_some_and(|v| !v.is_empty());
    let deleting = pvc.metadata.deletion_timestamp.is_some();
    bound || !consistency_enabled(pvc, default_enabled) || (deleting && !in_flight)
}

/// Whether the finalizer must be added before CreateVolume. Never while `draining`: the
/// provisioner taking over (upstream) does not know the finalizer and would never remove it.
pub fn needs_finalizer(pvc: &PersistentVolumeClaim, default_enabled: bool, draining: bool) -> bool {
    !draining
        && consistency_enabled(pvc, default_enabled)
        && !has_provisioning_finalizer(pvc)
        && pvc.metadata.deletion_timestamp.is_none()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    fn claim(
        annotation: Option<&str>,
        finalizer: bool,
        bound: bool,
        deleting: bool,
    ) -> PersistentVolumeClaim {
        let mut pvc = PersistentVolumeClaim::default();
        if let Some(value) = annotation {
            pvc.metadata.annotations =
                Some([(ANN_PROVISIONING_CONSISTENCY.to_string(), value.to_string())].into());
        }
        if finalizer {
            pvc.metadata.finalizers = Some(vec![PROVISIONING_FINALIZER.to_string()]);
        }
        if deleting {
            pvc.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        }
        let mut spec = k8s_openapi::api::core::v1::PersistentVolumeClaimSpec::default();
        if bound {
            spec.volume_name = Some("pvc-1".into());
        }
        pvc.spec = Some(spec);
        pvc
    }

    #[test]
    fn the_annotation_wins_over_the_default() {
        assert!(consistency_enabled(
            &claim(Some("enable"), false, false, false),
            false
        ));
        assert!(!consistency_enabled(
            &claim(Some("disable"), false, false, false),
            true
        ));
        assert!(consistency_enabled(&claim(None, false, false, false), true));
        assert!(!consistency_enabled(
            &claim(Some("garbage"), false, false, false),
            false
        ));
    }

    #[test]
    fn the_finalizer_is_added_only_to_live_claims_that_want_it() {
        assert!(needs_finalizer(
            &claim(Some("enable"), false, false, false),
            false,
            false
        ));
        assert!(
            !needs_finalizer(&claim(Some("enable"), false, false, false), true, true),
            "draining"
        );
        assert!(
            !needs_finalizer(&claim(Some("enable"), true, false, false), false, false),
            "already there"
        );
        assert!(
            !needs_finalizer(&claim(Some("enable"), false, false, true), false, false),
            "being deleted"
        );
        assert!(
            !needs_finalizer(&claim(None, false, false, false), false, false),
            "default off"
        );
    }

    #[test]
    fn the_finalizer_is_released_when_bound_or_disabled_or_nothing_is_in_flight() {
        assert!(
            may_release_finalizer(&claim(Some("enable"), true, true, false), true, false),
            "bound"
        );
        assert!(
            may_release_finalizer(&claim(Some("disable"), true, false, true), true, false),
            "disable"
        );
        assert!(
            may_release_finalizer(&claim(Some("enable"), true, false, true), false, false),
            "deleted, settled"
        );
        assert!(
            !may_release_finalizer(&claim(Some("enable"), true, false, true), true, false),
            "orphan pending"
        );
        assert!(
            !may_release_finalizer(&claim(Some("enable"), true, false, false), false, false),
            "still provisioning"
        );
    }
}
