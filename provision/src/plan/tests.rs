use super::*;
use crate::SecretRef;
use crate::api::{ReferenceGrantFrom, ReferenceGrantTo};
use crate::csi::volume_capability::{AccessMode, AccessType, MountVolume};
use crate::fixtures::{ClassBuilder, DRIVER, PVC_UID, PvcBuilder, caps, config};

fn plan(pvc: &PersistentVolumeClaim, class: &StorageClass) -> Result<ProvisionPlan, String> {
    plan_provision(pvc, class, &config(), &caps(), &[]).map_err(|e| e.to_string())
}

fn err(pvc: PvcBuilder, class: ClassBuilder) -> String {
    match plan(&pvc.build(), &class.build()) {
        Ok(plan) => panic!("expected an error, got {plan:?}"),
        Err(error) => error,
    }
}

fn ok(pvc: PvcBuilder, class: ClassBuilder) -> ProvisionPlan {
    match plan(&pvc.build(), &class.build()) {
        Ok(plan) => plan,
        Err(error) => panic!("unexpected error: {error}"),
    }
}

#[test]
fn simple_claim_becomes_a_complete_request() {
    let plan = ok(
        PvcBuilder::new().storage("1Gi"),
        ClassBuilder::new()
            .parameter("type", "fast")
            .parameter("csi.storage.k8s.io/fstype", "xfs")
            .mount_options(&["noatime"]),
    );
    let request = build_create_volume_request(&plan, HashMap::new(), None, None, HashMap::new());
    assert_eq!(request.name, format!("pvc-{PVC_UID}"));
    assert_eq!(
        request.capacity_range,
        Some(csi::CapacityRange {
            required_bytes: 1 << 30,
            limit_bytes: 0
        })
    );
    assert_eq!(
        request.volume_capabilities,
        vec![csi::VolumeCapability {
            access_mode: Some(AccessMode {
                mode: Mode::SingleNodeWriter as i32
            }),
            access_type: Some(AccessType::Mount(MountVolume {
                fs_type: "xfs".into(),
                mount_flags: vec!["noatime".into()],
                volume_mount_group: String::new(),
            })),
        }]
    );
    assert_eq!(
        request.parameters,
        HashMap::from([("type".to_owned(), "fast".to_owned())])
    );
    assert!(request.secrets.is_empty());
    assert_eq!(request.volume_content_source, None);
    assert_eq!(request.accessibility_requirements, None);
    assert!(request.mutable_parameters.is_empty());
}

#[test]
fn plan_records_what_the_pv_needs() {
    let plan = ok(
        PvcBuilder::new().resource_version("77"),
        ClassBuilder::new().reclaim_policy("Retain"),
    );
    assert_eq!(plan.driver_name, DRIVER);
    assert_eq!(plan.class_name, "standard");
    assert_eq!(plan.provisioned_by, DRIVER);
    assert_eq!(plan.reclaim_policy.as_deref(), Some("Retain"));
    assert_eq!(plan.access_modes, ["ReadWriteOnce"]);
    assert_eq!(plan.fs_type, None);
    assert_eq!(
        plan.claim_ref,
        ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("PersistentVolumeClaim".into()),
            namespace: Some("apps".into()),
            name: Some("data".into()),
            uid: Some(PVC_UID.into()),
            resource_version: Some("77".into()),
            field_path: None,
        }
    );
}

#[test]
fn provisioner_secret_is_resolved_and_its_data_sent() {
    let plan = ok(
        PvcBuilder::new(),
        ClassBuilder::new()
            .parameter(
                "csi.storage.k8s.io/provisioner-secret-name",
                "${pvc.name}-creds",
            )
            .parameter(
                "csi.storage.k8s.io/provisioner-secret-namespace",
                "${pvc.namespace}",
            ),
    );
    assert_eq!(
        plan.secrets.provisioner,
        Some(SecretRef {
            name: "data-creds".into(),
            namespace: "apps".into()
        })
    );
    assert!(plan.parameters.is_empty());
    let secrets = HashMap::from([("key".to_owned(), "value".to_owned())]);
    let request = build_create_volume_request(&plan, secrets.clone(), None, None, HashMap::new());
    assert_eq!(request.secrets, secrets);
}

#[test]
fn accessibility_requirements_are_passed_through() {
    let plan = ok(PvcBuilder::new(), ClassBuilder::new());
    let requirement = csi::TopologyRequirement {
        requisite: vec![csi::Topology {
            segments: HashMap::from([("zone".to_owned(), "a".to_owned())]),
        }],
        preferred: vec![],
    };
    let request = build_create_volume_request(
        &plan,
        HashMap::new(),
        Some(requirement.clone()),
        None,
        HashMap::new(),
    );
    assert_eq!(request.accessibility_requirements, Some(requirement));
}

#[test]
fn extra_create_metadata_adds_claim_and_volume_names() {
    let mut config = config();
    config.extra_create_metadata = true;
    let plan = plan_provision(
        &PvcBuilder::new().build(),
        &ClassBuilder::new().build(),
        &config,
        &caps(),
        &[],
    );
    let parameters = plan.map(|p| p.parameters).unwrap_or_default();
    assert_eq!(
        parameters
            .get("csi.storage.k8s.io/pvc/name")
            .map(String::as_str),
        Some("data")
    );
    assert_eq!(
        parameters
            .get("csi.storage.k8s.io/pvc/namespace")
            .map(String::as_str),
        Some("apps")
    );
    let pv_name = format!("pvc-{PVC_UID}");
    assert_eq!(parameters.get("csi.storage.k8s.io/pv/name"), Some(&pv_name));
}

#[test]
fn default_fstype_applies_and_block_claims_get_none() {
    let mut config = config();
    config.default_fstype = "ext4".into();
    let run = |pvc: PvcBuilder| {
        plan_provision(
            &pvc.build(),
            &ClassBuilder::new().build(),
            &config,
            &caps(),
            &[],
        )
        .map(|p| p.fs_type)
        .map_err(|e| e.to_string())
    };
    assert_eq!(run(PvcBuilder::new()), Ok(Some("ext4".into())));
    assert_eq!(run(PvcBuilder::new().volume_mode("Block")), Ok(None));
}

#[test]
fn read_only_only_for_a_single_rox_mode_with_the_flag() {
    let mut config = config();
    let run = |config: &ProvisionerConfig, modes: &[&str]| {
        plan_provision(
            &PvcBuilder::new().access_modes(modes).build(),
            &ClassBuilder::new().build(),
            config,
            &caps(),
            &[],
        )
        .map(|p| p.read_only)
    };
    assert_eq!(run(&config, &["ReadOnlyMany"]), Ok(false));
    config.controller_publish_readonly = true;
    assert_eq!(run(&config, &["ReadOnlyMany"]), Ok(true));
    assert_eq!(run(&config, &["ReadOnlyMany", "ReadWriteOnce"]), Ok(false));
    assert_eq!(run(&config, &["ReadWriteMany"]), Ok(false));
}

#[test]
fn deprecated_parameters_are_reported_for_a_warning() {
    let plan = ok(
        PvcBuilder::new(),
        ClassBuilder::new()
            .parameter("fstype", "ext4")
            .parameter("csiProvisionerSecretName", "s")
            .parameter("csiProvisionerSecretNamespace", "ns"),
    );
    assert_eq!(
        plan.deprecated_parameters,
        [
            "csiProvisionerSecretName",
            "csiProvisionerSecretNamespace",
            "fstype"
        ]
    );
    assert_eq!(plan.fs_type.as_deref(), Some("ext4"));
}

#[test]
fn claim_with_selector_is_refused() {
    assert_eq!(
        err(PvcBuilder::new().selector(), ClassBuilder::new()),
        "claim Selector is not supported"
    );
}

#[test]
fn driver_without_controller_service_is_refused() {
    let pvc = PvcBuilder::new().build();
    let caps = DriverCapabilities {
        controller_service: false,
        ..caps()
    };
    assert_eq!(
        plan_provision(&pvc, &ClassBuilder::new().build(), &config(), &caps, &[]).map_err(|e| e.to_string()),
        Err("CSI driver does not support dynamic provisioning: plugin CONTROLLER_SERVICE capability is not reported".to_owned())
    );
}

#[test]
fn driver_without_create_delete_volume_is_refused() {
    let pvc = PvcBuilder::new().build();
    let caps = DriverCapabilities {
        create_delete_volume: false,
        ..caps()
    };
    assert_eq!(
        plan_provision(&pvc, &ClassBuilder::new().build(), &config(), &caps, &[]).map_err(|e| e.to_string()),
        Err("CSI driver does not support dynamic provisioning: controller CREATE_DELETE_VOLUME capability is not reported".to_owned())
    );
}

#[test]
fn clone_without_clone_capability_is_refused() {
    let pvc = PvcBuilder::new()
        .data_source(None, "PersistentVolumeClaim", "source")
        .build();
    let caps = DriverCapabilities {
        clone: false,
        ..caps()
    };
    assert_eq!(
        plan_provision(&pvc, &ClassBuilder::new().build(), &config(), &caps, &[]).map_err(|e| e.to_string()),
        Err("CSI driver does not support clone operations: controller CLONE_VOLUME capability is not reported".to_owned())
    );
}

#[test]
fn snapshot_and_clone_sources_name_the_object_to_read() {
    let restore = ok(
        PvcBuilder::new().data_source(Some(SNAPSHOT_API_GROUP), "VolumeSnapshot", "snap"),
        ClassBuilder::new(),
    );
    assert_eq!(
        restore.source,
        Some(DataSource {
            kind: SourceKind::Snapshot,
            namespace: "apps".into(),
            name: "snap".into()
        })
    );
    let clone = ok(
        PvcBuilder::new().data_source(None, "PersistentVolumeClaim", "src"),
        ClassBuilder::new(),
    );
    assert_eq!(
        clone.source.map(|s| (s.kind, s.name)),
        Some((SourceKind::Clone, "src".into()))
    );
    assert_eq!(ok(PvcBuilder::new(), ClassBuilder::new()).source, None);
}

#[test]
fn a_driver_without_the_capability_refuses_the_source() {
    let mut caps = caps();
    caps.snapshot = false;
    caps.clone = false;
    let run = |pvc: PvcBuilder| {
        plan_provision(
            &pvc.build(),
            &ClassBuilder::new().build(),
            &config(),
            &caps,
            &[],
        )
        .map(|_| ())
        .map_err(|e| e.to_string())
    };
    assert_eq!(
        run(PvcBuilder::new().data_source(Some(SNAPSHOT_API_GROUP), "VolumeSnapshot", "s")),
        Err("CSI driver does not support snapshot restore: controller CREATE_DELETE_SNAPSHOT capability is not reported".into())
    );
    assert_eq!(
        run(PvcBuilder::new().data_source(None, "PersistentVolumeClaim", "src")),
        Err("CSI driver does not support clone operations: controller CLONE_VOLUME capability is not reported".into())
    );
}

#[test]
fn snapshot_with_wrong_api_group_is_refused() {
    assert_eq!(
        err(
            PvcBuilder::new().data_source(None, "VolumeSnapshot", "snap"),
            ClassBuilder::new()
        ),
        "the PVC source does not belong to the right APIGroup. Expected snapshot.storage.k8s.io, Got "
    );
}

#[test]
fn data_source_with_empty_name_is_refused() {
    assert_eq!(
        err(
            PvcBuilder::new().data_source(Some(SNAPSHOT_API_GROUP), "VolumeSnapshot", ""),
            ClassBuilder::new()
        ),
        "the PVC source not found for PVC data"
    );
}

#[test]
fn unknown_data_source_kind_is_left_to_a_populator() {
    let result = plan_provision(
        &PvcBuilder::new()
            .data_source(Some("example.com"), "Backup", "b")
            .build(),
        &ClassBuilder::new().build(),
        &config(),
        &caps(),
        &[],
    );
    let Err(error) = result else {
        panic!("expected an error, got {result:?}");
    };
    assert!(error.is_ignored());
    assert_eq!(
        error.to_string(),
        "data source (Backup) is not handled by the provisioner, assuming an external populator will provision it"
    );
}

#[test]
fn data_source_ref_is_used_when_data_source_is_absent() {
    assert_eq!(
        err(
            PvcBuilder::new().data_source_ref(Some("example.com"), "Backup", "b", None),
            ClassBuilder::new()
        ),
        "data source (Backup) is not handled by the provisioner, assuming an external populator will provision it"
    );
}

// ---- upstream's table of dataSource / dataSourceRef and the gate (§5.2)

fn gated(on: bool) -> ProvisionerConfig {
    ProvisionerConfig {
        cross_namespace_data_sources: on,
        ..config()
    }
}

/// Claims of `apps` may use the VolumeSnapshots of `other`.
fn snapshots_for_apps() -> ReferenceGrantSpec {
    ReferenceGrantSpec {
        from: vec![ReferenceGrantFrom {
            group: String::new(),
            kind: "PersistentVolumeClaim".into(),
            namespace: "apps".into(),
        }],
        to: vec![ReferenceGrantTo {
            group: SNAPSHOT_API_GROUP.into(),
            kind: "VolumeSnapshot".into(),
            name: None,
        }],
    }
}

fn source_with(
    pvc: PvcBuilder,
    gate: bool,
    grants: &[ReferenceGrantSpec],
) -> Result<Option<DataSource>, String> {
    plan_provision(
        &pvc.build(),
        &ClassBuilder::new().build(),
        &gated(gate),
        &caps(),
        grants,
    )
    .map(|plan| plan.source)
    .map_err(|e| e.to_string())
}

fn snapshot_in(namespace: &str, name: &str) -> Option<DataSource> {
    Some(DataSource {
        kind: SourceKind::Snapshot,
        namespace: namespace.into(),
        name: name.into(),
    })
}

const GATE_OFF: &str =
    "dataSourceRef namespace specified but the CrossNamespaceVolumeDataSource feature is disabled";

fn snapshot_ref(namespace: Option<&str>) -> PvcBuilder {
    PvcBuilder::new().data_source_ref(
        Some(SNAPSHOT_API_GROUP),
        "VolumeSnapshot",
        "snap",
        namespace,
    )
}

#[test]
fn data_source_wins_over_any_ref_whatever_the_gate() {
    let pvc = || {
        snapshot_ref(Some("other")).data_source(Some(SNAPSHOT_API_GROUP), "VolumeSnapshot", "local")
    };
    for gate in [false, true] {
        assert_eq!(
            source_with(pvc(), gate, &[]),
            Ok(snapshot_in("apps", "local")),
            "gate {gate}"
        );
    }
    let pvc = PvcBuilder::new().data_source(Some(SNAPSHOT_API_GROUP), "VolumeSnapshot", "s");
    assert_eq!(grant_namespace(&pvc.build(), &gated(true)), None);
}

#[test]
fn a_ref_without_namespace_is_used_in_the_claims_namespace_whatever_the_gate() {
    for gate in [false, true] {
        assert_eq!(
            source_with(snapshot_ref(None), gate, &[]),
            Ok(snapshot_in("apps", "snap"))
        );
        assert_eq!(
            source_with(snapshot_ref(Some("")), gate, &[]),
            Ok(snapshot_in("apps", "snap"))
        );
        assert_eq!(
            grant_namespace(&snapshot_ref(None).build(), &gated(gate)),
            None
        );
    }
}

#[test]
fn a_ref_to_the_claims_own_namespace_needs_no_grant_with_the_gate_on() {
    assert_eq!(
        source_with(snapshot_ref(Some("apps")), true, &[]),
        Ok(snapshot_in("apps", "snap"))
    );
    assert_eq!(
        grant_namespace(&snapshot_ref(Some("apps")).build(), &gated(true)),
        None
    );
}

#[test]
fn a_ref_to_another_namespace_needs_a_grant_there_with_the_gate_on() {
    let pvc = snapshot_ref(Some("other"));
    assert_eq!(
        grant_namespace(&pvc.clone().build(), &gated(true)),
        Some("other")
    );
    assert_eq!(
        source_with(pvc.clone(), true, &[]),
        Err(
            "accessing other/snap of VolumeSnapshot dataSource from apps/data isn't allowed".into()
        )
    );
    assert_eq!(
        source_with(pvc, true, &[snapshots_for_apps()]),
        Ok(snapshot_in("other", "snap"))
    );
}

#[test]
fn any_ref_namespace_is_refused_with_the_gate_off() {
    for namespace in ["other", "apps"] {
        let pvc = snapshot_ref(Some(namespace));
        assert_eq!(grant_namespace(&pvc.clone().build(), &gated(false)), None);
        assert_eq!(
            source_with(pvc, false, &[snapshots_for_apps()]),
            Err(GATE_OFF.into())
        );
    }
}

#[test]
fn the_grant_is_checked_before_the_name_and_the_kind() {
    let populator =
        || PvcBuilder::new().data_source_ref(Some("example.com"), "Backup", "b", Some("other"));
    assert_eq!(
        source_with(populator(), true, &[snapshots_for_apps()]),
        Err("accessing other/b of Backup dataSource from apps/data isn't allowed".into())
    );
    let mut backups = snapshots_for_apps();
    backups.to[0].group = "example.com".into();
    backups.to[0].kind = "Backup".into();
    let populated = plan_provision(
        &populator().build(),
        &ClassBuilder::new().build(),
        &gated(true),
        &caps(),
        &[backups],
    );
    assert!(populated.is_err_and(|error| error.is_ignored()));

    let unnamed = PvcBuilder::new().data_source_ref(
        Some(SNAPSHOT_API_GROUP),
        "VolumeSnapshot",
        "",
        Some("other"),
    );
    assert_eq!(
        source_with(unnamed.clone(), true, &[]),
        Err("accessing other/ of VolumeSnapshot dataSource from apps/data isn't allowed".into())
    );
    assert_eq!(
        source_with(unnamed, true, &[snapshots_for_apps()]),
        Err("the PVC source not found for PVC data".into())
    );
    let wrong_group = PvcBuilder::new().data_source_ref(
        Some("example.com"),
        "VolumeSnapshot",
        "snap",
        Some("other"),
    );
    assert_eq!(
        source_with(wrong_group, true, &[snapshots_for_apps()]),
        Err(
            "accessing other/snap of VolumeSnapshot dataSource from apps/data isn't allowed".into()
        )
    );
}

#[test]
fn a_granted_clone_reads_the_claim_in_the_other_namespace() {
    let claims_for_apps = ReferenceGrantSpec {
        to: vec![ReferenceGrantTo {
            group: String::new(),
            kind: "PersistentVolumeClaim".into(),
            name: Some("src".into()),
        }],
        ..snapshots_for_apps()
    };
    let clone =
        PvcBuilder::new().data_source_ref(None, "PersistentVolumeClaim", "src", Some("other"));
    assert_eq!(
        source_with(clone, true, &[claims_for_apps]),
        Ok(Some(DataSource {
            kind: SourceKind::Clone,
            namespace: "other".into(),
            name: "src".into(),
        }))
    );
}

#[test]
fn a_claim_naming_an_attributes_class_needs_modify_volume() {
    let pvc = PvcBuilder::new().attributes_class("gold").build();
    let class = ClassBuilder::new().build();
    let without = DriverCapabilities {
        modify_volume: false,
        ..caps()
    };
    assert_eq!(
        plan_provision(&pvc, &class, &config(), &without, &[])
            .expect_err("no MODIFY_VOLUME")
            .to_string(),
        "CSI driver does not support VolumeAttributesClass: controller MODIFY_VOLUME capability is not reported"
    );
    let plan = plan_provision(&pvc, &class, &config(), &caps(), &[]).expect("plan");
    assert_eq!(plan.attributes_class.as_deref(), Some("gold"));
    let mutable = HashMap::from([("iops".to_owned(), "3000".to_owned())]);
    let request = build_create_volume_request(&plan, HashMap::new(), None, None, mutable.clone());
    assert_eq!(request.mutable_parameters, mutable);
    assert_eq!(request.parameters, plan.parameters, "parameters unaffected");
}

#[test]
fn the_clone_check_comes_before_the_modify_volume_check() {
    let pvc = PvcBuilder::new()
        .attributes_class("gold")
        .data_source(None, "PersistentVolumeClaim", "source")
        .build();
    let caps = DriverCapabilities {
        clone: false,
        modify_volume: false,
        ..caps()
    };
    assert_eq!(
        plan_provision(&pvc, &ClassBuilder::new().build(), &config(), &caps, &[]),
        Err(ProvisionError::Capability(CapabilityError::NoClone))
    );
}

#[test]
fn with_the_gate_off_an_attributes_class_is_ignored() {
    let pvc = PvcBuilder::new().attributes_class("gold").build();
    let config = ProvisionerConfig {
        volume_attributes_classes: false,
        ..config()
    };
    // Not even MODIFY_VOLUME is asked for, as upstream.
    let caps = DriverCapabilities {
        modify_volume: false,
        ..caps()
    };
    let plan =
        plan_provision(&pvc, &ClassBuilder::new().build(), &config, &caps, &[]).expect("plan");
    assert_eq!(plan.attributes_class, None);
}

#[test]
fn bad_naming_flags_are_reported() {
    let mut config = config();
    config.volume_name_prefix = String::new();
    let pvc = PvcBuilder::new().build();
    let class = ClassBuilder::new().build();
    assert_eq!(
        plan_provision(&pvc, &class, &config, &caps(), &[]).map_err(|e| e.to_string()),
        Err("volume name prefix cannot be empty".to_owned())
    );
    config.volume_name_prefix = "pvc".into();
    config.volume_name_uuid_length = 40;
    assert_eq!(
        plan_provision(&pvc, &class, &config, &caps(), &[]).map_err(|e| e.to_string()),
        Err(
            "volume name UUID length must be -1 (whole UID) or between 1 and 32, got 40".to_owned()
        )
    );
}

#[test]
fn claim_without_uid_name_or_namespace_is_refused() {
    assert_eq!(
        err(PvcBuilder::new().uid(""), ClassBuilder::new()),
        "claim has no UID"
    );
    assert_eq!(
        err(PvcBuilder::new().no_name(), ClassBuilder::new()),
        "claim has no metadata.name"
    );
    assert_eq!(
        err(PvcBuilder::new().no_namespace(), ClassBuilder::new()),
        "claim has no metadata.namespace"
    );
}

#[test]
fn bad_storage_requests_are_refused() {
    assert_eq!(
        err(PvcBuilder::new().storage("-5Gi"), ClassBuilder::new()),
        "invalid storage request: quantity \"-5Gi\" is negative"
    );
    assert_eq!(
        err(PvcBuilder::new().storage("100Ei"), ClassBuilder::new()),
        "invalid storage request: quantity \"100Ei\" is larger than 9223372036854775807 bytes"
    );
    assert_eq!(
        err(PvcBuilder::new().storage("ten gigs"), ClassBuilder::new()),
        "invalid storage request: invalid quantity \"ten gigs\": no digits"
    );
}

#[test]
fn claim_without_storage_request_asks_for_zero_bytes() {
    assert_eq!(
        ok(PvcBuilder::new().no_storage(), ClassBuilder::new()).required_bytes,
        0
    );
}

#[test]
fn empty_or_unknown_access_modes_are_refused() {
    assert_eq!(
        err(PvcBuilder::new().access_modes(&[]), ClassBuilder::new()),
        "claim has no access modes"
    );
    assert_eq!(
        err(
            PvcBuilder::new().access_modes(&["ReadWriteSometimes"]),
            ClassBuilder::new()
        ),
        "unsupported access mode \"ReadWriteSometimes\""
    );
}

#[test]
fn unknown_volume_mode_is_refused() {
    assert_eq!(
        err(PvcBuilder::new().volume_mode("Raw"), ClassBuilder::new()),
        "unsupported volume mode \"Raw\""
    );
}

#[test]
fn both_fstype_keys_are_refused() {
    assert_eq!(
        err(
            PvcBuilder::new(),
            ClassBuilder::new()
                .parameter("fstype", "ext4")
                .parameter("csi.storage.k8s.io/fstype", "xfs")
        ),
        "fstype specified in parameters with both \"fstype\" and \"csi.storage.k8s.io/fstype\" keys"
    );
}

#[test]
fn unknown_reserved_parameter_is_refused() {
    assert_eq!(
        err(
            PvcBuilder::new(),
            ClassBuilder::new().parameter("csi.storage.k8s.io/typo", "x")
        ),
        "failed to strip CSI Parameters of prefixed keys: found unknown parameter key \"csi.storage.k8s.io/typo\" with reserved namespace csi.storage.k8s.io/"
    );
}

#[test]
fn secret_errors_surface_before_parameter_errors_like_upstream() {
    assert_eq!(
        err(
            PvcBuilder::new(),
            ClassBuilder::new()
                .parameter("csi.storage.k8s.io/typo", "x")
                .parameter("csi.storage.k8s.io/node-stage-secret-name", "s")
        ),
        "failed to get name and namespace template from params: either name and namespace for NodeStage secrets specified, Both must be specified"
    );
}

#[test]
fn secret_template_using_an_annotation_of_the_claim_resolves() {
    let plan = ok(
        PvcBuilder::new().annotation("secret", "team-a"),
        ClassBuilder::new()
            .parameter(
                "csi.storage.k8s.io/node-publish-secret-name",
                "${pvc.annotations['secret']}",
            )
            .parameter(
                "csi.storage.k8s.io/node-publish-secret-namespace",
                "${pvc.namespace}",
            ),
    );
    assert_eq!(
        plan.secrets.node_publish,
        Some(SecretRef {
            name: "team-a".into(),
            namespace: "apps".into()
        })
    );
}

#[test]
fn secret_name_resolving_to_garbage_is_refused() {
    assert_eq!(
        err(
            PvcBuilder::new().annotation("secret", "../etc"),
            ClassBuilder::new()
                .parameter(
                    "csi.storage.k8s.io/provisioner-secret-name",
                    "${pvc.annotations['secret']}"
                )
                .parameter("csi.storage.k8s.io/provisioner-secret-namespace", "ns")
        ),
        "\"${pvc.annotations['secret']}\" resolved to \"../etc\" which is not a valid secret name"
    );
}
