use super::*;
use crate::fixtures::{ClassBuilder, DRIVER, PVC_UID, PvBuilder, caps};

#[test]
fn provisioned_by_annotation_decides_responsibility() {
    assert!(is_provisioner_for_volume(
        &PvBuilder::new().provisioned_by(DRIVER).build(),
        DRIVER
    ));
    assert!(!is_provisioner_for_volume(
        &PvBuilder::new().provisioned_by("other").build(),
        DRIVER
    ));
    // The annotation wins over the CSI driver of the source.
    assert!(!is_provisioner_for_volume(
        &PvBuilder::new()
            .provisioned_by("other")
            .csi_driver(DRIVER)
            .build(),
        DRIVER
    ));
}

#[test]
fn migrated_to_annotation_makes_an_in_tree_volume_ours() {
    let pv = PvBuilder::new()
        .provisioned_by("kubernetes.io/gce-pd")
        .annotation(ANN_MIGRATED_TO, DRIVER)
        .build();
    assert!(is_provisioner_for_volume(&pv, DRIVER));
    let static_in_tree = PvBuilder::new()
        .no_csi()
        .annotation(ANN_MIGRATED_TO, DRIVER)
        .build();
    assert!(is_provisioner_for_volume(&static_in_tree, DRIVER));
    assert!(!is_provisioner_for_volume(
        &PvBuilder::new().no_csi().build(),
        DRIVER
    ));
}

#[test]
fn static_csi_volume_is_ours_by_driver_name() {
    assert!(is_provisioner_for_volume(
        &PvBuilder::new().csi_driver(DRIVER).build(),
        DRIVER
    ));
    assert!(!is_provisioner_for_volume(
        &PvBuilder::new().csi_driver("x").build(),
        DRIVER
    ));
}

#[test]
fn finalizer_is_added_to_a_bound_delete_policy_volume() {
    let pv = PvBuilder::new()
        .phase("Bound")
        .policy("Delete")
        .no_finalizer()
        .build();
    assert_eq!(pv_finalizer_action(&pv), FinalizerAction::Add);
}

#[test]
fn finalizer_is_not_added_twice_nor_to_unbound_or_deleting_volumes() {
    let base = || PvBuilder::new().phase("Bound").policy("Delete");
    assert_eq!(pv_finalizer_action(&base().build()), FinalizerAction::None);
    assert_eq!(
        pv_finalizer_action(&base().no_finalizer().phase("Released").build()),
        FinalizerAction::None
    );
    assert_eq!(
        pv_finalizer_action(&base().no_finalizer().deleting().build()),
        FinalizerAction::None
    );
}

#[test]
fn finalizer_is_removed_for_retain_and_recycle() {
    for policy in ["Retain", "Recycle"] {
        let pv = PvBuilder::new().phase("Bound").policy(policy).build();
        assert_eq!(
            pv_finalizer_action(&pv),
            FinalizerAction::Remove,
            "{policy}"
        );
        let without = PvBuilder::new().policy(policy).no_finalizer().build();
        assert_eq!(
            pv_finalizer_action(&without),
            FinalizerAction::None,
            "{policy}"
        );
    }
}

#[test]
fn released_delete_policy_volume_is_deleted() {
    let pv = PvBuilder::new().phase("Released").policy("Delete").build();
    assert!(should_delete(&pv));
    assert!(should_delete(
        &PvBuilder::new()
            .phase("Released")
            .policy("Delete")
            .deleting()
            .build()
    ));
}

#[test]
fn volume_is_not_deleted_unless_released_with_delete_policy() {
    assert!(!should_delete(
        &PvBuilder::new().phase("Bound").policy("Delete").build()
    ));
    assert!(!should_delete(
        &PvBuilder::new().phase("Released").policy("Retain").build()
    ));
    assert!(!should_delete(
        &PvBuilder::new().phase("Released").no_policy().build()
    ));
}

#[test]
fn deleting_volume_without_our_finalizer_is_left_alone() {
    let pv = PvBuilder::new()
        .phase("Released")
        .policy("Delete")
        .no_finalizer()
        .deleting()
        .build();
    assert!(!should_delete(&pv));
}

#[test]
fn only_a_pv_our_finalizer_holds_is_deleted_before_its_volume() {
    let released = || PvBuilder::new().phase("Released").policy("Delete");
    assert!(may_delete_pv_first(&released().build()));
    // Nothing would keep it until DeleteVolume succeeds.
    assert!(!may_delete_pv_first(&released().no_finalizer().build()));
    // Already deleted (by us in an earlier attempt, or by a user): nothing to commit.
    assert!(!may_delete_pv_first(&released().deleting().build()));
}

#[test]
fn deletion_uses_the_recorded_secret() {
    let pv = PvBuilder::new()
        .annotation(ANN_DELETION_SECRET_NAME, "creds")
        .annotation(ANN_DELETION_SECRET_NAMESPACE, "ns")
        .build();
    assert_eq!(
        deletion_target(&pv, &caps(), DRIVER),
        Ok(DeletionTarget {
            volume_handle: "vol-1".into(),
            migrated: false,
            secrets: DeletionSecrets::Fetch(SecretRef {
                name: "creds".into(),
                namespace: "ns".into()
            })
        })
    );
}

#[test]
fn empty_or_half_empty_recorded_secret_means_no_secrets() {
    for (name, namespace) in [("", ""), ("creds", ""), ("", "ns")] {
        let pv = PvBuilder::new()
            .annotation(ANN_DELETION_SECRET_NAME, name)
            .annotation(ANN_DELETION_SECRET_NAMESPACE, namespace)
            .build();
        assert_eq!(
            deletion_secrets(&pv),
            DeletionSecrets::None,
            "{name:?}/{namespace:?}"
        );
    }
}

#[test]
fn without_recorded_secret_the_class_is_consulted() {
    let pv = PvBuilder::new().class("gold").build();
    assert_eq!(
        deletion_secrets(&pv),
        DeletionSecrets::FromStorageClass {
            class_name: "gold".into()
        }
    );
    let one_annotation = PvBuilder::new()
        .class("gold")
        .annotation(ANN_DELETION_SECRET_NAME, "x")
        .build();
    assert_eq!(
        deletion_secrets(&one_annotation),
        DeletionSecrets::FromStorageClass {
            class_name: "gold".into()
        }
    );
    let legacy = PvBuilder::new()
        .class("gold")
        .annotation(ANN_BETA_STORAGE_CLASS, "legacy")
        .build();
    assert_eq!(
        deletion_secrets(&legacy),
        DeletionSecrets::FromStorageClass {
            class_name: "legacy".into()
        }
    );
}

#[test]
fn without_recorded_secret_class_or_claim_there_are_no_secrets() {
    assert_eq!(
        deletion_secrets(&PvBuilder::new().class("").build()),
        DeletionSecrets::None
    );
    assert_eq!(
        deletion_secrets(&PvBuilder::new().class("gold").no_claim_ref().build()),
        DeletionSecrets::None
    );
}

#[test]
fn class_secret_is_resolved_with_the_claim_ref_only() {
    let pv = PvBuilder::new().class("gold").build();
    let class = ClassBuilder::new()
        .parameter(
            "csi.storage.k8s.io/provisioner-secret-name",
            "${pvc.name}-${pv.name}",
        )
        .parameter(
            "csi.storage.k8s.io/provisioner-secret-namespace",
            "${pvc.namespace}",
        )
        .build();
    assert_eq!(
        deletion_secret_from_class(&pv, Some(&class), DRIVER),
        Ok(Some(SecretRef {
            name: "data-pv-1".into(),
            namespace: "apps".into()
        }))
    );
    assert_eq!(deletion_secret_from_class(&pv, None, DRIVER), Ok(None));
    assert_eq!(
        deletion_secret_from_class(&pv, Some(&ClassBuilder::new().build()), DRIVER),
        Ok(None)
    );
}

#[test]
fn class_secret_using_claim_annotations_fails_at_deletion_time() {
    let pv = PvBuilder::new().class("gold").build();
    let class = ClassBuilder::new()
        .parameter(
            "csi.storage.k8s.io/provisioner-secret-name",
            "${pvc.annotations['k']}",
        )
        .parameter("csi.storage.k8s.io/provisioner-secret-namespace", "ns")
        .build();
    assert_eq!(
        deletion_secret_from_class(&pv, Some(&class), DRIVER).map_err(|e| e.to_string()),
        Err("failed to get secretreference for volume pv-1: error resolving value \"${pvc.annotations['k']}\": invalid tokens: [\"pvc.annotations['k']\"]".to_owned())
    );
}

#[test]
fn non_csi_volume_cannot_be_deleted() {
    assert_eq!(
        deletion_target(&PvBuilder::new().no_csi().build(), &caps(), DRIVER)
            .map_err(|e| e.to_string()),
        Err("invalid CSI PV".to_owned())
    );
}

#[test]
fn empty_volume_handle_cannot_be_deleted() {
    assert_eq!(
        deletion_target(&PvBuilder::new().handle("").build(), &caps(), DRIVER)
            .map_err(|e| e.to_string()),
        Err("PV has an empty spec.csi.volumeHandle".to_owned())
    );
}

#[test]
fn deletion_needs_controller_capabilities() {
    let caps = DriverCapabilities {
        create_delete_volume: false,
        ..caps()
    };
    assert_eq!(
        deletion_target(&PvBuilder::new().build(), &caps, DRIVER).map_err(|e| e.to_string()),
        Err("CSI driver does not support dynamic provisioning: controller CREATE_DELETE_VOLUME capability is not reported".to_owned())
    );
}

#[test]
fn existing_pv_with_same_handle_and_claim_is_ours() {
    let wanted = PvBuilder::new().build();
    assert_eq!(
        existing_pv(&PvBuilder::new().phase("Bound").build(), &wanted, None),
        ExistingPv::Ours
    );
}

#[test]
fn existing_pv_of_another_handle_or_driver_is_another_volume() {
    let wanted = PvBuilder::new().build();
    for existing in [
        PvBuilder::new().handle("vol-2").build(),
        PvBuilder::new().csi_driver("x").build(),
        PvBuilder::new().no_csi().build(),
    ] {
        assert_eq!(existing_pv(&existing, &wanted, None), ExistingPv::Other);
    }
}

#[test]
fn existing_pv_with_our_handle_but_another_claim_holds_the_volume_and_ours_being_deleted_waits() {
    let wanted = PvBuilder::new().build();
    // Found by the simulation (issue #31): a stale retry re-created the volume after the PV's
    // deletion had deleted it; taking the Terminating PV for its holder leaked the new one.
    assert_eq!(
        existing_pv(&PvBuilder::new().deleting().build(), &wanted, None),
        ExistingPv::BeingDeleted
    );
    for existing in [
        PvBuilder::new().claim_uid("other").build(),
        PvBuilder::new().no_claim_ref().build(),
        PvBuilder::new().claim_uid("other").deleting().build(),
    ] {
        assert_eq!(
            existing_pv(&existing, &wanted, None),
            ExistingPv::HoldsTheVolume
        );
    }
    let no_uid = PvBuilder::new().no_claim_ref().build();
    assert_eq!(
        existing_pv(&no_uid, &no_uid, None),
        ExistingPv::HoldsTheVolume
    );
}

#[test]
fn a_pv_holds_a_volume_by_driver_and_handle_whatever_its_name() {
    let pv = PvBuilder::new().name("static-1").handle("vol-1").build();
    assert_eq!(pv_holds_volume(&pv, DRIVER, "vol-1", None), Holding::Holds);
    assert_eq!(
        pv_holds_volume(&pv, DRIVER, "vol-2", None),
        Holding::DoesNotHold
    );
    assert_eq!(
        pv_holds_volume(&pv, "other.driver", "vol-1", None),
        Holding::DoesNotHold
    );
    assert_eq!(
        pv_holds_volume(&PvBuilder::new().no_csi().build(), DRIVER, "vol-1", None),
        Holding::DoesNotHold
    );
}

#[test]
fn in_node_mode_a_pv_of_another_node_holds_another_volume_of_the_same_handle() {
    use std::collections::BTreeMap;
    let identity = |node: &str| {
        let mut pv = PvBuilder::new().build();
        if let Some(csi) = pv.spec.as_mut().and_then(|spec| spec.csi.as_mut()) {
            csi.volume_attributes = Some(BTreeMap::from([(
                super::super::well_known::PROVISIONER_IDENTITY_KEY.to_owned(),
                format!("1-2-{DRIVER}-{node}"),
            )]));
        }
        pv
    };
    let segment = BTreeMap::new();
    let node = NodeScope {
        name: "node-b",
        segment: &segment,
        immediate_binding: true,
    };
    let (mine, theirs, unknown) = (
        identity("node-b"),
        identity("node-a"),
        PvBuilder::new().build(),
    );
    let holds =
        |pv: &PersistentVolume| pv_holds_volume(pv, DRIVER, "vol-1", Some(&node)) == Holding::Holds;
    assert!(holds(&mine));
    assert!(!holds(&theirs));
    assert!(
        holds(&unknown),
        "a PV naming no node is never taken for another's"
    );
    assert!(
        pv_holds_volume(&theirs, DRIVER, "vol-1", None) == Holding::Holds,
        "central mode"
    );
    assert_eq!(existing_pv(&mine, &mine, Some(&node)), ExistingPv::Ours);
    assert_eq!(existing_pv(&theirs, &mine, Some(&node)), ExistingPv::Other);
    assert_eq!(
        existing_pv(&theirs, &mine, None),
        ExistingPv::Ours,
        "central mode"
    );
    let mut other_claim = identity("node-b");
    if let Some(claim) = other_claim
        .spec
        .as_mut()
        .and_then(|spec| spec.claim_ref.as_mut())
    {
        claim.uid = Some("other".into());
    }
    assert_eq!(
        existing_pv(&other_claim, &mine, Some(&node)),
        ExistingPv::HoldsTheVolume
    );
    assert_eq!(existing_pv(&unknown, &mine, Some(&node)), ExistingPv::Ours);

    // Issue #31, hole 1: only this node's PV for the claim ends this node's operation; the
    // same claim's PV on another node makes it an orphan; one whose node is unknown says
    // nothing (the replay's handle decides).
    let of = |pv: &PersistentVolume, node: Option<&NodeScope<'_>>| {
        pv_of_operation(pv, DRIVER, PVC_UID, node)
    };
    assert_eq!(of(&mine, Some(&node)), PvOfOperation::Ends);
    assert_eq!(of(&theirs, Some(&node)), PvOfOperation::ServesAnotherNode);
    assert_eq!(of(&unknown, Some(&node)), PvOfOperation::Unrelated);
    assert_eq!(of(&theirs, None), PvOfOperation::Ends, "central mode");
    assert_eq!(of(&other_claim, Some(&node)), PvOfOperation::Unrelated);
    let mut going = mine.clone();
    going.metadata.deletion_timestamp = PvBuilder::new()
        .deleting()
        .build()
        .metadata
        .deletion_timestamp;
    assert_eq!(
        of(&going, Some(&node)),
        PvOfOperation::Unrelated,
        "being deleted"
    );
}

#[test]
fn only_a_pv_of_our_driver_for_the_operations_claim_ends_the_operation() {
    let pv = PvBuilder::new().build();
    assert!(pv_is_for_claim(&pv, DRIVER, PVC_UID));
    assert!(!pv_is_for_claim(&pv, DRIVER, "another-claim"));
    assert!(!pv_is_for_claim(&pv, "other.driver", PVC_UID));
    assert!(!pv_is_for_claim(
        &PvBuilder::new().no_claim_ref().build(),
        DRIVER,
        PVC_UID
    ));
}

const GCE: &str = "pd.csi.storage.gke.io";

fn gce_pv(disk: &str) -> PvBuilder {
    PvBuilder::new()
        .provisioned_by("kubernetes.io/gce-pd")
        .no_csi()
        .map(|pv| {
            if let Some(spec) = pv.spec.as_mut() {
                spec.gce_persistent_disk = Some(Default::default());
                if let Some(source) = spec.gce_persistent_disk.as_mut() {
                    disk.clone_into(&mut source.pd_name);
                }
            }
        })
}

#[test]
fn a_pv_provisioned_by_the_in_tree_plugin_migrated_to_us_is_ours_and_deletable() {
    let pv = gce_pv("d").build();
    assert!(is_provisioner_for_volume(&pv, GCE));
    assert!(has_deletable_source(&pv, GCE));
    assert_eq!(
        deletion_target(&pv, &caps(), GCE),
        Ok(DeletionTarget {
            volume_handle: "projects/UNSPECIFIED/zones/UNSPECIFIED/disks/d".to_owned(),
            migrated: true,
            secrets: deletion_secrets(&pv),
        })
    );
    // Not for a driver that is no migration target.
    assert!(!is_provisioner_for_volume(&pv, DRIVER));
    assert!(!has_deletable_source(&pv, DRIVER));
    assert_eq!(
        deletion_target(&pv, &caps(), DRIVER),
        Err(DeletionError::NotCsi)
    );
}

#[test]
fn a_pv_without_a_source_we_can_name_never_gets_our_finalizer() {
    let other_plugin = || {
        PvBuilder::new()
            .annotation(ANN_MIGRATED_TO, GCE)
            .no_csi()
            .map(|pv| {
                if let Some(spec) = pv.spec.as_mut() {
                    spec.cinder = Some(Default::default());
                }
            })
    };
    let bound = other_plugin().no_finalizer().build();
    assert!(is_provisioner_for_volume(&bound, GCE));
    assert_eq!(
        pv_finalizer_action(&bound),
        FinalizerAction::Add,
        "upstream's rule"
    );
    assert_eq!(volume_finalizer_action(&bound, GCE), FinalizerAction::None);
    assert_eq!(
        volume_finalizer_action(&other_plugin().build(), GCE),
        FinalizerAction::Remove
    );
    assert_eq!(
        volume_finalizer_action(&gce_pv("d").no_finalizer().build(), GCE),
        FinalizerAction::Add
    );
}

#[test]
fn an_in_tree_pv_holds_the_volume_it_names_and_ends_its_operation() {
    let pv = gce_pv("pvc-1").claim_uid(PVC_UID).build();
    assert_eq!(
        pv_holds_volume(&pv, GCE, "projects/p/zones/z/disks/pvc-1", None),
        Holding::Holds
    );
    assert_eq!(
        pv_holds_volume(&pv, GCE, "projects/p/zones/z/disks/pvc-2", None),
        Holding::DoesNotHold
    );
    assert!(pv_is_for_claim(&pv, GCE, PVC_UID));
    assert!(!pv_is_for_claim(&pv, DRIVER, PVC_UID));
    assert!(is_migrated(&pv, GCE));
    assert!(!is_migrated(&pv, DRIVER));
    assert!(!is_migrated(&PvBuilder::new().build(), DRIVER));
    assert_eq!(existing_pv(&pv, &pv.clone(), None), ExistingPv::Ours);
    assert_eq!(
        existing_pv(&gce_pv("other").claim_uid(PVC_UID).build(), &pv, None),
        ExistingPv::Other
    );
}
