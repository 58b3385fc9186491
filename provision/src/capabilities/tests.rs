use super::*;

fn modes(list: &[&str]) -> Vec<String> {
    list.iter().map(|m| (*m).to_owned()).collect()
}

fn params(list: &[(&str, &str)]) -> BTreeMap<String, String> {
    list.iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn mode_of(capability: &VolumeCapability) -> Option<Mode> {
    capability
        .access_mode
        .and_then(|m| Mode::try_from(m.mode).ok())
}

#[test]
fn access_modes_map_without_single_node_multi_writer() {
    let map = |m| csi_access_mode(m, false);
    assert_eq!(map("ReadWriteOnce"), Ok(Mode::SingleNodeWriter));
    assert_eq!(map("ReadWriteOncePod"), Ok(Mode::SingleNodeWriter));
    assert_eq!(map("ReadOnlyMany"), Ok(Mode::MultiNodeReaderOnly));
    assert_eq!(map("ReadWriteMany"), Ok(Mode::MultiNodeMultiWriter));
}

#[test]
fn access_modes_map_with_single_node_multi_writer() {
    let map = |m| csi_access_mode(m, true);
    assert_eq!(map("ReadWriteOnce"), Ok(Mode::SingleNodeMultiWriter));
    assert_eq!(map("ReadWriteOncePod"), Ok(Mode::SingleNodeSingleWriter));
    assert_eq!(map("ReadOnlyMany"), Ok(Mode::MultiNodeReaderOnly));
    assert_eq!(map("ReadWriteMany"), Ok(Mode::MultiNodeMultiWriter));
}

#[test]
fn unknown_access_modes_are_rejected() {
    for bad in ["", "readwriteonce", "RWO", "ReadWriteSome"] {
        assert_eq!(
            csi_access_mode(bad, false).map_err(|e| e.to_string()),
            Err(format!("unsupported access mode {bad:?}"))
        );
    }
}

#[test]
fn one_mount_capability_per_access_mode_in_order() {
    let caps = volume_capabilities(
        &modes(&["ReadOnlyMany", "ReadWriteOnce", "ReadOnlyMany"]),
        false,
        Some("ext4"),
        &modes(&["noatime"]),
        false,
    )
    .unwrap_or_default();
    assert_eq!(
        caps.iter().map(mode_of).collect::<Vec<_>>(),
        [
            Some(Mode::MultiNodeReaderOnly),
            Some(Mode::SingleNodeWriter),
            Some(Mode::MultiNodeReaderOnly)
        ]
    );
    for capability in &caps {
        assert_eq!(
            capability.access_type,
            Some(AccessType::Mount(MountVolume {
                fs_type: "ext4".into(),
                mount_flags: vec!["noatime".into()],
                volume_mount_group: String::new(),
            }))
        );
    }
}

#[test]
fn block_capabilities_carry_no_filesystem_or_mount_flags() {
    let caps = volume_capabilities(
        &modes(&["ReadWriteOnce"]),
        true,
        Some("ext4"),
        &modes(&["noatime"]),
        true,
    )
    .unwrap_or_default();
    assert_eq!(caps.len(), 1);
    assert_eq!(caps[0].access_type, Some(AccessType::Block(BlockVolume {})));
    assert_eq!(mode_of(&caps[0]), Some(Mode::SingleNodeMultiWriter));
}

#[test]
fn empty_access_modes_are_rejected() {
    assert_eq!(
        volume_capabilities(&[], false, None, &[], false).map_err(|e| e.to_string()),
        Err("claim has no access modes".to_owned())
    );
}

#[test]
fn one_unknown_access_mode_rejects_the_whole_claim() {
    assert_eq!(
        volume_capabilities(&modes(&["ReadWriteOnce", "Bogus"]), false, None, &[], false)
            .map_err(|e| e.to_string()),
        Err("unsupported access mode \"Bogus\"".to_owned())
    );
}

#[test]
fn fs_type_comes_from_either_key_in_any_case_else_the_default() {
    assert_eq!(
        fs_type(&params(&[(FSTYPE_KEY, "xfs")]), "ext4"),
        Ok(Some("xfs".into()))
    );
    assert_eq!(
        fs_type(&params(&[("FsType", "btrfs")]), ""),
        Ok(Some("btrfs".into()))
    );
    assert_eq!(
        fs_type(&params(&[("fstype", "")]), "ext4"),
        Ok(Some("ext4".into()))
    );
    assert_eq!(fs_type(&params(&[]), "ext4"), Ok(Some("ext4".into())));
    assert_eq!(fs_type(&params(&[("other", "x")]), ""), Ok(None));
}

#[test]
fn both_fstype_keys_are_rejected_with_upstreams_text() {
    let expected = Err(
        "fstype specified in parameters with both \"fstype\" and \"csi.storage.k8s.io/fstype\" keys"
            .to_owned(),
    );
    let both = params(&[("fstype", "ext4"), (FSTYPE_KEY, "xfs")]);
    assert_eq!(fs_type(&both, "").map_err(|e| e.to_string()), expected);
    let two_cases = params(&[("fstype", "ext4"), ("FSTYPE", "ext4")]);
    assert_eq!(fs_type(&two_cases, "").map_err(|e| e.to_string()), expected);
}

#[test]
fn volume_mode_is_filesystem_or_block() {
    assert_eq!(is_block(None), Ok(false));
    assert_eq!(is_block(Some("Filesystem")), Ok(false));
    assert_eq!(is_block(Some("Block")), Ok(true));
    assert_eq!(
        is_block(Some("block")).map_err(|e| e.to_string()),
        Err("unsupported volume mode \"block\"".to_owned())
    );
}

#[test]
fn provisioning_needs_controller_service_then_create_delete_volume() {
    let mut caps = DriverCapabilities::default();
    let check = |caps: &DriverCapabilities, source| {
        check_provisioning_capabilities(caps, source, false).map_err(|e| e.to_string())
    };
    assert_eq!(
        check(&caps, SourceKind::Empty),
        Err("CSI driver does not support dynamic provisioning: plugin CONTROLLER_SERVICE capability is not reported".to_owned())
    );
    caps.controller_service = true;
    assert_eq!(
        check(&caps, SourceKind::Empty),
        Err("CSI driver does not support dynamic provisioning: controller CREATE_DELETE_VOLUME capability is not reported".to_owned())
    );
    caps.create_delete_volume = true;
    assert_eq!(check(&caps, SourceKind::Empty), Ok(()));
    assert_eq!(
        check(&caps, SourceKind::Snapshot),
        Err("CSI driver does not support snapshot restore: controller CREATE_DELETE_SNAPSHOT capability is not reported".to_owned())
    );
    assert_eq!(
        check(&caps, SourceKind::Clone),
        Err("CSI driver does not support clone operations: controller CLONE_VOLUME capability is not reported".to_owned())
    );
    caps.snapshot = true;
    caps.clone = true;
    assert_eq!(check(&caps, SourceKind::Snapshot), Ok(()));
    assert_eq!(check(&caps, SourceKind::Clone), Ok(()));
}

#[test]
fn an_attributes_class_needs_modify_volume_after_the_source_checks() {
    let mut caps = DriverCapabilities {
        controller_service: true,
        create_delete_volume: true,
        ..DriverCapabilities::default()
    };
    assert_eq!(
        check_provisioning_capabilities(&caps, SourceKind::Clone, true),
        Err(CapabilityError::NoClone)
    );
    assert_eq!(
        check_provisioning_capabilities(&caps, SourceKind::Empty, true)
            .map_err(|e| e.to_string()),
        Err("CSI driver does not support VolumeAttributesClass: controller MODIFY_VOLUME capability is not reported".to_owned())
    );
    assert_eq!(
        check_provisioning_capabilities(&caps, SourceKind::Empty, false),
        Ok(())
    );
    caps.modify_volume = true;
    assert_eq!(
        check_provisioning_capabilities(&caps, SourceKind::Empty, true),
        Ok(())
    );
}
