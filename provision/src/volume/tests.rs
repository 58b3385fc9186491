use std::collections::HashMap;

use super::*;
use crate::api::{ReferenceGrantFrom, ReferenceGrantSpec, ReferenceGrantTo};
use crate::fixtures::{ClassBuilder, DRIVER, IDENTITY, PVC_UID, PvcBuilder, caps, config};
use crate::{DriverCapabilities, ProvisionerConfig, plan_provision};

fn plan_with(
    pvc: PvcBuilder,
    class: ClassBuilder,
    config: &ProvisionerConfig,
    caps: &DriverCapabilities,
) -> ProvisionPlan {
    match plan_provision(&pvc.build(), &class.build(), config, caps, &[]) {
        Ok(plan) => plan,
        Err(error) => panic!("unexpected error: {error}"),
    }
}

fn plan(pvc: PvcBuilder, class: ClassBuilder) -> ProvisionPlan {
    plan_with(pvc, class, &config(), &caps())
}

fn response(id: &str, capacity: i64) -> csi::CreateVolumeResponse {
    csi::CreateVolumeResponse {
        volume: Some(csi::Volume {
            capacity_bytes: capacity,
            volume_id: id.to_owned(),
            ..csi::Volume::default()
        }),
    }
}

fn build(plan: &ProvisionPlan, response: &csi::CreateVolumeResponse) -> PersistentVolume {
    match build_persistent_volume(plan, response) {
        Ok(pv) => pv,
        Err(error) => panic!("unexpected error: {error}"),
    }
}

fn topology(pairs: &[(&str, &str)]) -> csi::Topology {
    csi::Topology {
        segments: pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    }
}

#[test]
fn pv_is_pre_bound_finalized_and_annotated() {
    let plan = plan(
        PvcBuilder::new().storage("1Gi").resource_version("9"),
        ClassBuilder::new()
            .parameter("csi.storage.k8s.io/fstype", "ext4")
            .mount_options(&["ro", "noatime"])
            .reclaim_policy("Delete"),
    );
    let pv = build(&plan, &response("vol-1", 1 << 30));
    let meta = &pv.metadata;
    assert_eq!(meta.name, Some(format!("pvc-{PVC_UID}")));
    assert_eq!(meta.finalizers, Some(vec![PV_FINALIZER.to_owned()]));
    assert_eq!(
        meta.annotations,
        Some(BTreeMap::from([
            (ANN_PROVISIONED_BY.to_owned(), DRIVER.to_owned()),
            (ANN_DELETION_SECRET_NAME.to_owned(), String::new()),
            (ANN_DELETION_SECRET_NAMESPACE.to_owned(), String::new()),
        ]))
    );
    let spec = pv.spec.unwrap_or_default();
    let claim_ref = spec.claim_ref.unwrap_or_default();
    assert_eq!(claim_ref.uid.as_deref(), Some(PVC_UID));
    assert_eq!(claim_ref.resource_version.as_deref(), Some("9"));
    assert_eq!(claim_ref.name.as_deref(), Some("data"));
    assert_eq!(claim_ref.namespace.as_deref(), Some("apps"));
    assert_eq!(spec.storage_class_name.as_deref(), Some("standard"));
    assert_eq!(spec.access_modes, Some(vec!["ReadWriteOnce".to_owned()]));
    assert_eq!(
        spec.capacity,
        Some(BTreeMap::from([(
            "storage".to_owned(),
            Quantity("1Gi".into())
        )]))
    );
    assert_eq!(
        spec.mount_options,
        Some(vec!["ro".to_owned(), "noatime".to_owned()])
    );
    assert_eq!(
        spec.persistent_volume_reclaim_policy.as_deref(),
        Some("Delete")
    );
    assert_eq!(spec.volume_mode, None);
    assert_eq!(spec.node_affinity, None);
    assert_eq!(spec.volume_attributes_class_name, None);
    let csi = spec.csi.unwrap_or_default();
    assert_eq!(csi.driver, DRIVER);
    assert_eq!(csi.volume_handle, "vol-1");
    assert_eq!(csi.fs_type.as_deref(), Some("ext4"));
    assert_eq!(csi.read_only, None);
    assert_eq!(
        csi.volume_attributes,
        Some(BTreeMap::from([(
            PROVISIONER_IDENTITY_KEY.to_owned(),
            IDENTITY.to_owned()
        )]))
    );
    assert_eq!(csi.controller_publish_secret_ref, None);
}

#[test]
fn a_volume_asked_for_from_a_source_must_say_it_came_from_one() {
    let plan = plan(
        PvcBuilder::new().data_source(None, "PersistentVolumeClaim", "src"),
        ClassBuilder::new(),
    );
    assert_eq!(
        build_persistent_volume(&plan, &response("v", 1 << 30)),
        Err(CreateResponseError::ContentSourceMissing {
            volume_id: "v".into()
        })
    );
    assert_eq!(
        CreateResponseError::ContentSourceMissing {
            volume_id: "v".into()
        }
        .volume_to_delete(),
        Some("v")
    );
    let mut answered = response("v", 1 << 30);
    if let Some(volume) = answered.volume.as_mut() {
        volume.content_source = Some(csi::VolumeContentSource::default());
    }
    assert!(build_persistent_volume(&plan, &answered).is_ok());
}

#[test]
fn a_volume_asked_for_from_another_namespace_must_say_it_came_from_one() {
    let grant = ReferenceGrantSpec {
        from: vec![ReferenceGrantFrom {
            group: String::new(),
            kind: "PersistentVolumeClaim".into(),
            namespace: "apps".into(),
        }],
        to: vec![ReferenceGrantTo {
            group: String::new(),
            kind: "PersistentVolumeClaim".into(),
            name: None,
        }],
    };
    let config = ProvisionerConfig {
        cross_namespace_data_sources: true,
        ..config()
    };
    let pvc =
        PvcBuilder::new().data_source_ref(None, "PersistentVolumeClaim", "src", Some("other"));
    let plan = plan_provision(
        &pvc.build(),
        &ClassBuilder::new().build(),
        &config,
        &caps(),
        &[grant],
    )
    .expect("a granted clone");
    assert_eq!(
        build_persistent_volume(&plan, &response("v", 1 << 30)),
        Err(CreateResponseError::ContentSourceMissing {
            volume_id: "v".into()
        })
    );
}

#[test]
fn the_pv_names_the_claims_attributes_class() {
    let plan = plan(
        PvcBuilder::new().attributes_class("gold"),
        ClassBuilder::new(),
    );
    let pv = build(&plan, &response("v", 0));
    let spec = pv.spec.unwrap_or_default();
    assert_eq!(spec.volume_attributes_class_name.as_deref(), Some("gold"));
}

#[test]
fn zero_capacity_in_the_response_means_the_requested_size() {
    let plan = plan(PvcBuilder::new().storage("1500"), ClassBuilder::new());
    let pv = build(&plan, &response("v", 0));
    let capacity = pv.spec.and_then(|s| s.capacity).unwrap_or_default();
    assert_eq!(capacity.get("storage"), Some(&Quantity("1500".into())));
}

#[test]
fn larger_capacity_in_the_response_is_recorded() {
    let plan = plan(PvcBuilder::new().storage("1Gi"), ClassBuilder::new());
    let pv = build(&plan, &response("v", 3 << 30));
    let capacity = pv.spec.and_then(|s| s.capacity).unwrap_or_default();
    assert_eq!(capacity.get("storage"), Some(&Quantity("3Gi".into())));
}

#[test]
fn smaller_capacity_than_requested_asks_for_cleanup() {
    let plan = plan(PvcBuilder::new().storage("2Gi"), ClassBuilder::new());
    let error = build_persistent_volume(&plan, &response("vol-9", 1 << 30));
    let Err(error) = error else {
        panic!("expected an error, got {error:?}");
    };
    assert_eq!(
        error.to_string(),
        "created volume capacity 1073741824 less than requested capacity 2147483648"
    );
    assert_eq!(error.volume_to_delete(), Some("vol-9"));
}

#[test]
fn negative_capacity_in_the_response_asks_for_cleanup() {
    let plan = plan(PvcBuilder::new().storage("1"), ClassBuilder::new());
    let error = build_persistent_volume(&plan, &response("vol-9", -1));
    assert_eq!(
        error.as_ref().map_err(|e| e.to_string()).err().as_deref(),
        Some("created volume capacity -1 less than requested capacity 1")
    );
    assert_eq!(
        error
            .err()
            .as_ref()
            .and_then(CreateResponseError::volume_to_delete),
        Some("vol-9")
    );
}

#[test]
fn empty_volume_id_or_missing_volume_is_refused_without_cleanup() {
    let plan = plan(PvcBuilder::new(), ClassBuilder::new());
    let error = build_persistent_volume(&plan, &response("", 1 << 30)).err();
    assert_eq!(
        error.as_ref().map(ToString::to_string).as_deref(),
        Some("CreateVolume response has an empty volume_id")
    );
    assert_eq!(
        error
            .as_ref()
            .and_then(CreateResponseError::volume_to_delete),
        None
    );
    let missing = build_persistent_volume(&plan, &csi::CreateVolumeResponse { volume: None }).err();
    assert_eq!(
        missing.as_ref().map(ToString::to_string).as_deref(),
        Some("CreateVolume response has no volume")
    );
    assert_eq!(
        missing
            .as_ref()
            .and_then(CreateResponseError::volume_to_delete),
        None
    );
}

#[test]
fn volume_context_overlays_the_identity_attribute() {
    let plan = plan(PvcBuilder::new(), ClassBuilder::new());
    let mut response = response("v", 0);
    if let Some(volume) = response.volume.as_mut() {
        volume.volume_context = HashMap::from([
            ("share".to_owned(), "/exports/v".to_owned()),
            (
                PROVISIONER_IDENTITY_KEY.to_owned(),
                "driver-says".to_owned(),
            ),
        ]);
    }
    let pv = build(&plan, &response);
    let attributes = pv
        .spec
        .and_then(|s| s.csi)
        .and_then(|c| c.volume_attributes)
        .unwrap_or_default();
    assert_eq!(
        attributes,
        BTreeMap::from([
            (
                PROVISIONER_IDENTITY_KEY.to_owned(),
                "driver-says".to_owned()
            ),
            ("share".to_owned(), "/exports/v".to_owned()),
        ])
    );
}

#[test]
fn block_volume_has_no_fs_type_and_keeps_its_volume_mode() {
    let plan = plan(
        PvcBuilder::new().volume_mode("Block"),
        ClassBuilder::new().parameter("csi.storage.k8s.io/fstype", "ext4"),
    );
    let spec = build(&plan, &response("v", 0)).spec.unwrap_or_default();
    assert_eq!(spec.volume_mode.as_deref(), Some("Block"));
    assert_eq!(spec.csi.and_then(|c| c.fs_type), None);
}

#[test]
fn read_only_rox_volume_is_marked_read_only() {
    let mut config = config();
    config.controller_publish_readonly = true;
    let plan = plan_with(
        PvcBuilder::new().access_modes(&["ReadOnlyMany"]),
        ClassBuilder::new(),
        &config,
        &caps(),
    );
    let csi = build(&plan, &response("v", 0)).spec.and_then(|s| s.csi);
    assert_eq!(csi.and_then(|c| c.read_only), Some(true));
}

#[test]
fn secret_refs_land_in_the_csi_source_and_annotations() {
    let mut class = ClassBuilder::new();
    for stem in [
        "provisioner",
        "controller-publish",
        "node-stage",
        "node-publish",
        "controller-expand",
        "node-expand",
        "controller-modify",
    ] {
        class = class
            .parameter(&format!("csi.storage.k8s.io/{stem}-secret-name"), stem)
            .parameter(&format!("csi.storage.k8s.io/{stem}-secret-namespace"), "ns");
    }
    let plan = plan(PvcBuilder::new(), class);
    let pv = build(&plan, &response("v", 0));
    let annotations = pv.metadata.annotations.unwrap_or_default();
    let get = |key: &str| annotations.get(key).map(String::as_str);
    assert_eq!(get(ANN_DELETION_SECRET_NAME), Some("provisioner"));
    assert_eq!(get(ANN_DELETION_SECRET_NAMESPACE), Some("ns"));
    assert_eq!(
        get(ANN_CONTROLLER_MODIFY_SECRET_NAME),
        Some("controller-modify")
    );
    assert_eq!(get(ANN_CONTROLLER_MODIFY_SECRET_NAMESPACE), Some("ns"));
    let csi = pv.spec.and_then(|s| s.csi).unwrap_or_default();
    let expect = |name: &str| {
        Some(SecretReference {
            name: Some(name.to_owned()),
            namespace: Some("ns".to_owned()),
        })
    };
    assert_eq!(
        csi.controller_publish_secret_ref,
        expect("controller-publish")
    );
    assert_eq!(csi.node_stage_secret_ref, expect("node-stage"));
    assert_eq!(csi.node_publish_secret_ref, expect("node-publish"));
    assert_eq!(
        csi.controller_expand_secret_ref,
        expect("controller-expand")
    );
    assert_eq!(csi.node_expand_secret_ref, expect("node-expand"));
}

#[test]
fn node_affinity_is_one_term_per_topology_with_sorted_expressions() {
    let caps = DriverCapabilities {
        topology: true,
        ..caps()
    };
    let plan = plan_with(PvcBuilder::new(), ClassBuilder::new(), &config(), &caps);
    let mut response = response("v", 0);
    if let Some(volume) = response.volume.as_mut() {
        volume.accessible_topology = vec![
            topology(&[("zone", "a"), ("rack", "r1"), ("region", "eu")]),
            topology(&[]),
            topology(&[("zone", "b")]),
        ];
    }
    let affinity = build(&plan, &response).spec.and_then(|s| s.node_affinity);
    let requirement = |key: &str, value: &str| NodeSelectorRequirement {
        key: key.to_owned(),
        operator: "In".to_owned(),
        values: Some(vec![value.to_owned()]),
    };
    assert_eq!(
        affinity,
        Some(VolumeNodeAffinity {
            required: Some(NodeSelector {
                node_selector_terms: vec![
                    NodeSelectorTerm {
                        match_expressions: Some(vec![
                            requirement("rack", "r1"),
                            requirement("region", "eu"),
                            requirement("zone", "a"),
                        ]),
                        match_fields: None,
                    },
                    NodeSelectorTerm {
                        match_expressions: Some(vec![requirement("zone", "b")]),
                        match_fields: None,
                    },
                ]
            })
        })
    );
}

#[test]
fn no_node_affinity_without_topology_support_or_topologies() {
    let mut response = response("v", 0);
    if let Some(volume) = response.volume.as_mut() {
        volume.accessible_topology = vec![topology(&[("zone", "a")])];
    }
    let without_support = plan(PvcBuilder::new(), ClassBuilder::new());
    assert_eq!(
        build(&without_support, &response)
            .spec
            .and_then(|s| s.node_affinity),
        None
    );

    let caps = DriverCapabilities {
        topology: true,
        ..caps()
    };
    let with_support = plan_with(PvcBuilder::new(), ClassBuilder::new(), &config(), &caps);
    let empty = response_with_topologies(vec![topology(&[])]);
    assert_eq!(
        build(&with_support, &empty)
            .spec
            .and_then(|s| s.node_affinity),
        None
    );
}

#[test]
fn a_volume_asked_for_a_segment_and_given_none_is_missing_its_topology() {
    let asked = csi::CreateVolumeRequest {
        accessibility_requirements: Some(csi::TopologyRequirement {
            requisite: vec![topology(&[("zone", "a")])],
            preferred: vec![],
        }),
        ..csi::CreateVolumeRequest::default()
    };
    let volume = |topologies: Vec<csi::Topology>| csi::Volume {
        accessible_topology: topologies,
        ..csi::Volume::default()
    };
    assert!(topology_missing(&asked, &volume(vec![])));
    assert!(topology_missing(&asked, &volume(vec![topology(&[])])));
    assert!(!topology_missing(
        &asked,
        &volume(vec![topology(&[]), topology(&[("zone", "a")])])
    ));
    let not_asked = csi::CreateVolumeRequest::default();
    assert!(!topology_missing(&not_asked, &volume(vec![])));
}

fn response_with_topologies(topologies: Vec<csi::Topology>) -> csi::CreateVolumeResponse {
    let mut response = response("v", 0);
    if let Some(volume) = response.volume.as_mut() {
        volume.accessible_topology = topologies;
    }
    response
}
