use super::*;
use crate::fixtures::{ClassBuilder, DRIVER, PvcBuilder};

fn ours() -> PvcBuilder {
    PvcBuilder::new().annotation(ANN_STORAGE_PROVISIONER, DRIVER)
}

#[test]
fn immediate_claim_annotated_for_this_driver_is_provisioned() {
    let class = ClassBuilder::new().build();
    assert_eq!(
        should_provision(&ours().build(), Some(&class), DRIVER),
        ProvisionDecision::Provision
    );
}

#[test]
fn beta_provisioner_annotation_is_honoured_when_ga_is_absent() {
    let pvc = PvcBuilder::new()
        .annotation(ANN_BETA_STORAGE_PROVISIONER, DRIVER)
        .build();
    let class = ClassBuilder::new().build();
    assert_eq!(
        should_provision(&pvc, Some(&class), DRIVER),
        ProvisionDecision::Provision
    );
}

#[test]
fn ga_provisioner_annotation_wins_over_beta() {
    let pvc = PvcBuilder::new()
        .annotation(ANN_STORAGE_PROVISIONER, "other.example.com")
        .annotation(ANN_BETA_STORAGE_PROVISIONER, DRIVER)
        .build();
    let class = ClassBuilder::new().build();
    assert_eq!(
        should_provision(&pvc, Some(&class), DRIVER),
        ProvisionDecision::Skip(SkipReason::OtherProvisioner {
            provisioner: "other.example.com".into()
        })
    );
}

#[test]
fn claim_with_volume_name_is_skipped_even_without_class() {
    let pvc = ours().volume_name("pv-1").build();
    assert_eq!(
        should_provision(&pvc, None, DRIVER),
        ProvisionDecision::Skip(SkipReason::AlreadyBound {
            volume_name: "pv-1".into()
        })
    );
}

#[test]
fn claim_without_provisioner_annotation_is_skipped() {
    let class = ClassBuilder::new().build();
    assert_eq!(
        should_provision(&PvcBuilder::new().build(), Some(&class), DRIVER),
        ProvisionDecision::Skip(SkipReason::NoProvisionerAnnotation)
    );
}

const GCE: &str = "pd.csi.storage.gke.io";

fn in_tree_class() -> StorageClass {
    ClassBuilder::new()
        .provisioner("kubernetes.io/gce-pd")
        .build()
}

#[test]
fn a_claim_of_an_in_tree_class_migrated_to_this_driver_is_provisioned() {
    // kube-controller-manager writes the CSI name and migrated-to.
    let written_by_kcm = PvcBuilder::new()
        .annotation(ANN_STORAGE_PROVISIONER, GCE)
        .annotation(ANN_MIGRATED_TO, GCE)
        .build();
    // An older controller-manager wrote the in-tree name; migrated-to says it is ours.
    let in_tree_name = PvcBuilder::new()
        .annotation(ANN_STORAGE_PROVISIONER, "kubernetes.io/gce-pd")
        .annotation(ANN_MIGRATED_TO, GCE)
        .build();
    for pvc in [written_by_kcm, in_tree_name] {
        assert_eq!(
            should_provision(&pvc, Some(&in_tree_class()), GCE),
            ProvisionDecision::Provision
        );
    }
    assert_eq!(
        migrated_plugin(&in_tree_class(), GCE),
        Some(InTreePlugin::GcePd)
    );
    assert_eq!(
        migrated_plugin(&ClassBuilder::new().provisioner(GCE).build(), GCE),
        None
    );
}

#[test]
fn a_migrated_class_is_translated_and_its_pv_names_the_in_tree_provisioner() {
    let translated = class_for_driver(Arc::new(in_tree_class()), GCE).expect("translated");
    assert_eq!(translated.plugin, Some(InTreePlugin::GcePd));
    assert_eq!(
        translated.provisioned_by.as_deref(),
        Some("kubernetes.io/gce-pd")
    );
    assert_eq!(translated.class.provisioner, GCE);
    let csi = Arc::new(ClassBuilder::new().provisioner(GCE).build());
    assert_eq!(
        class_for_driver(Arc::clone(&csi), GCE),
        Ok(DriverClass {
            class: csi,
            plugin: None,
            provisioned_by: None
        })
    );
    let mut refused = in_tree_class();
    refused
        .parameters
        .get_or_insert_with(Default::default)
        .insert("zone".to_owned(), "z".to_owned());
    refused.allowed_topologies = Some(vec![Default::default()]);
    assert_eq!(
        class_for_driver(Arc::new(refused), GCE),
        Err(MigrationError::ZonesWithAllowedTopologies)
    );
}

#[test]
fn in_tree_claims_and_classes_of_other_drivers_are_left_alone() {
    // The in-tree name without migrated-to: not migrated (yet), the in-tree plugin's.
    let not_migrated = PvcBuilder::new()
        .annotation(ANN_STORAGE_PROVISIONER, "kubernetes.io/gce-pd")
        .build();
    assert!(matches!(
        should_provision(&not_migrated, Some(&in_tree_class()), GCE),
        ProvisionDecision::Skip(SkipReason::OtherProvisioner { .. })
    ));
    // Migrated to another driver.
    let to_ebs = PvcBuilder::new()
        .annotation(ANN_STORAGE_PROVISIONER, "kubernetes.io/aws-ebs")
        .annotation(ANN_MIGRATED_TO, "ebs.csi.aws.com")
        .build();
    assert!(matches!(
        should_provision(&to_ebs, Some(&in_tree_class()), GCE),
        ProvisionDecision::Skip(SkipReason::OtherProvisioner { .. })
    ));
    // Our annotation, but the class is another migrated plugin's.
    let ours = PvcBuilder::new()
        .annotation(ANN_STORAGE_PROVISIONER, GCE)
        .build();
    let ebs_class = ClassBuilder::new()
        .provisioner("kubernetes.io/aws-ebs")
        .build();
    assert!(matches!(
        should_provision(&ours, Some(&ebs_class), GCE),
        ProvisionDecision::Skip(SkipReason::ClassOfOtherProvisioner { .. })
    ));
    // A driver that is no migration target accepts no in-tree class.
    let hostpath = PvcBuilder::new()
        .annotation(ANN_STORAGE_PROVISIONER, "kubernetes.io/gce-pd")
        .annotation(ANN_MIGRATED_TO, DRIVER)
        .build();
    assert!(matches!(
        should_provision(&hostpath, Some(&in_tree_class()), DRIVER),
        ProvisionDecision::Skip(SkipReason::OtherProvisioner { .. })
    ));
}

#[test]
fn missing_class_is_an_error_with_the_api_servers_text() {
    let pvc = ours().class("fast").build();
    let decision = should_provision(&pvc, None, DRIVER);
    let ProvisionDecision::Error(error) = decision else {
        panic!("expected an error, got {decision:?}");
    };
    assert_eq!(
        error.to_string(),
        "storageclass.storage.k8s.io \"fast\" not found"
    );
}

#[test]
fn wait_for_first_consumer_without_selected_node_is_skipped() {
    let class = ClassBuilder::new()
        .binding_mode(WAIT_FOR_FIRST_CONSUMER)
        .build();
    assert_eq!(
        should_provision(&ours().build(), Some(&class), DRIVER),
        ProvisionDecision::Skip(SkipReason::WaitingForFirstConsumer)
    );
    let empty_node = ours().annotation(ANN_SELECTED_NODE, "").build();
    assert_eq!(
        should_provision(&empty_node, Some(&class), DRIVER),
        ProvisionDecision::Skip(SkipReason::WaitingForFirstConsumer)
    );
}

#[test]
fn wait_for_first_consumer_with_selected_node_is_provisioned() {
    let class = ClassBuilder::new()
        .binding_mode(WAIT_FOR_FIRST_CONSUMER)
        .build();
    let pvc = ours().annotation(ANN_SELECTED_NODE, "node-1").build();
    assert_eq!(
        should_provision(&pvc, Some(&class), DRIVER),
        ProvisionDecision::Provision
    );
    let alpha_only = ours().annotation(ANN_ALPHA_SELECTED_NODE, "node-1").build();
    assert_eq!(
        should_provision(&alpha_only, Some(&class), DRIVER),
        ProvisionDecision::Provision
    );
}

#[test]
fn class_of_another_provisioner_is_skipped() {
    let class = ClassBuilder::new().provisioner("other.example.com").build();
    assert_eq!(
        should_provision(&ours().build(), Some(&class), DRIVER),
        ProvisionDecision::Skip(SkipReason::ClassOfOtherProvisioner {
            class: "standard".into(),
            provisioner: "other.example.com".into()
        })
    );
}

#[test]
fn claim_class_prefers_the_beta_annotation() {
    let pvc = PvcBuilder::new()
        .class("spec-class")
        .annotation(ANN_BETA_STORAGE_CLASS, "annotated")
        .build();
    assert_eq!(claim_class_name(&pvc), "annotated");
    assert_eq!(claim_class_name(&PvcBuilder::new().class("c").build()), "c");
    assert_eq!(claim_class_name(&PvcBuilder::new().no_class().build()), "");
}

#[test]
fn selected_node_falls_back_to_the_alpha_annotation_only_when_the_ga_key_is_absent() {
    let alpha = PvcBuilder::new()
        .annotation(ANN_ALPHA_SELECTED_NODE, "old")
        .build();
    assert_eq!(selected_node(&alpha), Some("old"));
    let empty_ga = PvcBuilder::new()
        .annotation(ANN_SELECTED_NODE, "")
        .annotation(ANN_ALPHA_SELECTED_NODE, "old")
        .build();
    assert_eq!(selected_node(&empty_ga), None);
    let ga = PvcBuilder::new().annotation(ANN_SELECTED_NODE, "n").build();
    assert_eq!(selected_node(&ga), Some("n"));
    assert_eq!(selected_node(&PvcBuilder::new().build()), None);
}
