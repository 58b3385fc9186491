//! What the driver must support, and the CSI volume capabilities of a claim (upstream's
//! capability checks and access-mode mapping).

use std::collections::BTreeMap;

use thiserror::Error;

use crate::csi::VolumeCapability;
use crate::csi::volume_capability::access_mode::Mode;
use crate::csi::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};

use super::settings::DriverCapabilities;

pub(super) const FSTYPE_KEY: &str = "csi.storage.k8s.io/fstype";
/// Deprecated spelling, matched in any letter case and forwarded to the driver, as upstream
/// does.
pub(super) const LEGACY_FSTYPE_KEY: &str = "fstype";

/// A capability the claim needs and the driver lacks, or a claim the mapping cannot express.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CapabilityError {
    #[error(
        "CSI driver does not support dynamic provisioning: plugin CONTROLLER_SERVICE capability is not reported"
    )]
    NoControllerService,
    #[error(
        "CSI driver does not support dynamic provisioning: controller CREATE_DELETE_VOLUME capability is not reported"
    )]
    NoCreateDeleteVolume,
    #[error(
        "CSI driver does not support snapshot restore: controller CREATE_DELETE_SNAPSHOT capability is not reported"
    )]
    NoSnapshot,
    #[error(
        "CSI driver does not support clone operations: controller CLONE_VOLUME capability is not reported"
    )]
    NoClone,
    #[error(
        "CSI driver does not support VolumeAttributesClass: controller MODIFY_VOLUME capability is not reported"
    )]
    NoModifyVolume,
    /// Upstream would send CreateVolume with no capability at all; the driver must reject that.
    #[error("claim has no access modes")]
    NoAccessModes,
    #[error("unsupported access mode {0:?}")]
    UnsupportedAccessMode(String),
    #[error("unsupported volume mode {0:?}")]
    UnsupportedVolumeMode(String),
    #[error(
        "fstype specified in parameters with both \"fstype\" and \"csi.storage.k8s.io/fstype\" keys"
    )]
    ConflictingFsType,
}

/// What kind of content a new volume starts with; decides which capabilities are needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceKind {
    Empty,
    Snapshot,
    Clone,
}

/// The provisioning capability checks, in upstream's order. `attributes_class`: the claim
/// names a VolumeAttributesClass and the gate is on.
pub(super) fn check_provisioning_capabilities(
    caps: &DriverCapabilities,
    source: SourceKind,
    attributes_class: bool,
) -> Result<(), CapabilityError> {
    check_create_delete_capabilities(caps)?;
    match source {
        SourceKind::Snapshot if !caps.snapshot => return Err(CapabilityError::NoSnapshot),
        SourceKind::Clone if !caps.clone => return Err(CapabilityError::NoClone),
        _ => {}
    }
    if attributes_class && !caps.modify_volume {
        return Err(CapabilityError::NoModifyVolume);
    }
    Ok(())
}

/// CONTROLLER_SERVICE and CREATE_DELETE_VOLUME, required for every CreateVolume and
/// DeleteVolume.
pub fn check_create_delete_capabilities(caps: &DriverCapabilities) -> Result<(), CapabilityError> {
    if !caps.controller_service {
        return Err(CapabilityError::NoControllerService);
    }
    if !caps.create_delete_volume {
        return Err(CapabilityError::NoCreateDeleteVolume);
    }
    Ok(())
}

/// The CSI access mode of a Kubernetes one. Drivers with SINGLE_NODE_MULTI_WRITER get the
/// finer single-node modes.
pub fn csi_access_mode(
    mode: &str,
    single_node_multi_writer: bool,
) -> Result<Mode, CapabilityError> {
    Ok(match (mode, single_node_multi_writer) {
        ("ReadWriteOnce", false) | ("ReadWriteOncePod", false) => Mode::SingleNodeWriter,
        ("ReadWriteOnce", true) => Mode::SingleNodeMultiWriter,
        ("ReadWriteOncePod", true) => Mode::SingleNodeSingleWriter,
        ("ReadOnlyMany", _) => Mode::MultiNodeReaderOnly,
        ("ReadWriteMany", _) => Mode::MultiNodeMultiWriter,
        _ => return Err(CapabilityError::UnsupportedAccessMode(mode.to_owned())),
    })
}

/// The filesystem type from the class parameters (`csi.storage.k8s.io/fstype`, or `fstype` in
/// any letter case; more than one is an error), else `default_fstype`; `None` when both are
/// empty.
pub fn fs_type(
    parameters: &BTreeMap<String, String>,
    default_fstype: &str,
) -> Result<Option<String>, CapabilityError> {
    let mut found = parameters
        .iter()
        .filter(|(key, _)| *key == FSTYPE_KEY || key.eq_ignore_ascii_case(LEGACY_FSTYPE_KEY))
        .map(|(_, value)| value);
    let from_class = found.next();
    if found.next().is_some() {
        return Err(CapabilityError::ConflictingFsType);
    }
    let chosen = from_class
        .map(String::as_str)
        .filter(|value| !value.is_empty())
        .unwrap_or(default_fstype);
    Ok((!chosen.is_empty()).then(|| chosen.to_owned()))
}

/// Whether `spec.volumeMode` asks for a raw block device (`None` means Filesystem).
pub(super) fn is_block(volume_mode: Option<&str>) -> Result<bool, CapabilityError> {
    match volume_mode {
        None | Some("Filesystem") => Ok(false),
        Some("Block") => Ok(true),
        Some(other) => Err(CapabilityError::UnsupportedVolumeMode(other.to_owned())),
    }
}

/// One capability per claim access mode, in order and not deduplicated. Block volumes carry no
/// filesystem or mount flags.
pub fn volume_capabilities(
    access_modes: &[String],
    block: bool,
    fs_type: Option<&str>,
    mount_flags: &[String],
    single_node_multi_writer: bool,
) -> Result<Vec<VolumeCapability>, CapabilityError> {
    if access_modes.is_empty() {
        return Err(CapabilityError::NoAccessModes);
    }
    let access_type = if block {
        AccessType::Block(BlockVolume {})
    } else {
        AccessType::Mount(MountVolume {
            fs_type: fs_type.unwrap_or_default().to_owned(),
            mount_flags: mount_flags.to_vec(),
            volume_mount_group: String::new(),
        })
    };
    access_modes
        .iter()
        .map(|mode| {
            Ok(VolumeCapability {
                access_mode: Some(AccessMode {
                    mode: csi_access_mode(mode, single_node_multi_writer)? as i32,
                }),
                access_type: Some(access_type.clone()),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests;
