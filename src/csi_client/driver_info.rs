//! What the driver says about itself at start-up.

use std::collections::BTreeSet;

use crate::csi::controller_service_capability::{self, rpc::Type as ControllerCapability};
use crate::csi::plugin_capability::{self, service::Type as PluginCapability};
use crate::csi::{
    ControllerGetCapabilitiesResponse, GetPluginCapabilitiesResponse, GetPluginInfoResponse,
};

use super::error::Error;

/// Longest driver name the CSI spec allows.
const MAX_NAME_LEN: usize = 63;

/// The driver's identity and capabilities, read once at start-up.
///
/// Missing capabilities are not an error here (upstream starts anyway and fails each operation
/// that needs them); the predicates let callers decide per operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverInfo {
    /// GetPluginInfo `name`, validated: the provisioner name and the metrics' `driver_name`.
    pub name: String,
    /// GetPluginInfo `vendor_version`, opaque.
    pub vendor_version: String,
    /// Service types from GetPluginCapabilities (unknown values dropped).
    pub plugin_capabilities: BTreeSet<PluginCapability>,
    /// RPC types from ControllerGetCapabilities (unknown values dropped; empty if the driver
    /// has no controller service).
    pub controller_capabilities: BTreeSet<ControllerCapability>,
}

impl DriverInfo {
    /// Assembles the answers of GetPluginInfo, GetPluginCapabilities and
    /// ControllerGetCapabilities, rejecting a name that cannot name a driver.
    pub fn from_responses(
        info: GetPluginInfoResponse,
        plugin: GetPluginCapabilitiesResponse,
        controller: ControllerGetCapabilitiesResponse,
    ) -> Result<Self, Error> {
        if let Err(problem) = validate_driver_name(&info.name) {
            return Err(Error::InvalidDriverName {
                name: info.name,
                problem,
            });
        }
        let plugin_capabilities = plugin
            .capabilities
            .iter()
            .filter_map(|c| match c.r#type {
                Some(plugin_capability::Type::Service(s)) => {
                    PluginCapability::try_from(s.r#type).ok()
                }
                _ => None,
            })
            .collect();
        let controller_capabilities = controller
            .capabilities
            .iter()
            .filter_map(|c| match c.r#type {
                Some(controller_service_capability::Type::Rpc(r)) => {
                    ControllerCapability::try_from(r.r#type).ok()
                }
                None => None,
            })
            .collect();
        Ok(DriverInfo {
            name: info.name,
            vendor_version: info.vendor_version,
            plugin_capabilities,
            controller_capabilities,
        })
    }

    fn has_plugin(&self, capability: PluginCapability) -> bool {
        self.plugin_capabilities.contains(&capability)
    }

    fn has_controller(&self, capability: ControllerCapability) -> bool {
        self.controller_capabilities.contains(&capability)
    }

    /// CONTROLLER_SERVICE: needed for every provisioning and deletion.
    pub fn supports_controller_service(&self) -> bool {
        self.has_plugin(PluginCapability::ControllerService)
    }

    /// VOLUME_ACCESSIBILITY_CONSTRAINTS: topology requirements, node affinity, rescheduling on
    /// ResourceExhausted.
    pub fn supports_topology(&self) -> bool {
        self.has_plugin(PluginCapability::VolumeAccessibilityConstraints)
    }

    /// CREATE_DELETE_VOLUME: needed for every provisioning and deletion.
    pub fn supports_create_delete(&self) -> bool {
        self.has_controller(ControllerCapability::CreateDeleteVolume)
    }

    /// Both CONTROLLER_SERVICE and CREATE_DELETE_VOLUME: the driver can provision at all.
    pub fn can_provision(&self) -> bool {
        self.supports_controller_service() && self.supports_create_delete()
    }

    /// CLONE_VOLUME: PVC data sources.
    pub fn supports_clone(&self) -> bool {
        self.has_controller(ControllerCapability::CloneVolume)
    }

    /// CREATE_DELETE_SNAPSHOT: VolumeSnapshot data sources.
    pub fn supports_snapshot(&self) -> bool {
        self.has_controller(ControllerCapability::CreateDeleteSnapshot)
    }

    /// SINGLE_NODE_MULTI_WRITER: the single-node access modes map to their own CSI modes.
    pub fn supports_single_node_multi_writer(&self) -> bool {
        self.has_controller(ControllerCapability::SingleNodeMultiWriter)
    }

    /// PUBLISH_UNPUBLISH_VOLUME: volumes get attached, so deletion waits for detachment.
    pub fn supports_publish_unpublish(&self) -> bool {
        self.has_controller(ControllerCapability::PublishUnpublishVolume)
    }

    /// MODIFY_VOLUME: needed for PVCs with a VolumeAttributesClass.
    pub fn supports_modify_volume(&self) -> bool {
        self.has_controller(ControllerCapability::ModifyVolume)
    }

    /// GET_CAPACITY (upstream does not check it before calling GetCapacity).
    pub fn supports_get_capacity(&self) -> bool {
        self.has_controller(ControllerCapability::GetCapacity)
    }

    /// LIST_VOLUMES.
    pub fn supports_list_volumes(&self) -> bool {
        self.has_controller(ControllerCapability::ListVolumes)
    }
}

/// Checks a driver name against the CSI spec: 1 to 63 characters, ASCII letters, digits, `-`
/// and `.`, beginning and ending with a letter or digit. Returns what is wrong otherwise.
pub fn validate_driver_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("the name is empty");
    }
    if name.len() > MAX_NAME_LEN {
        return Err("the name is longer than 63 characters");
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
    {
        return Err("the name may only contain ASCII letters, digits, '-' and '.'");
    }
    let alphanumeric_ends = name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if !alphanumeric_ends {
        return Err("the name must begin and end with a letter or digit");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::csi::{ControllerServiceCapability, PluginCapability as PluginCap};

    fn plugin(types: &[PluginCapability]) -> GetPluginCapabilitiesResponse {
        GetPluginCapabilitiesResponse {
            capabilities: types
                .iter()
                .map(|t| PluginCap {
                    r#type: Some(plugin_capability::Type::Service(
                        plugin_capability::Service { r#type: *t as i32 },
                    )),
                })
                .collect(),
        }
    }

    fn controller(types: &[i32]) -> ControllerGetCapabilitiesResponse {
        ControllerGetCapabilitiesResponse {
            capabilities: types
                .iter()
                .map(|t| ControllerServiceCapability {
                    r#type: Some(controller_service_capability::Type::Rpc(
                        controller_service_capability::Rpc { r#type: *t },
                    )),
                })
                .collect(),
        }
    }

    fn info(name: &str) -> GetPluginInfoResponse {
        GetPluginInfoResponse {
            name: name.into(),
            vendor_version: "1.2.3".into(),
            ..Default::default()
        }
    }

    #[test]
    fn driver_names() {
        for good in [
            "hostpath.csi.k8s.io",
            "a",
            "EBS.csi.aws.com",
            &"a".repeat(63),
        ] {
            assert_eq!(validate_driver_name(good), Ok(()), "{good}");
        }
        for bad in [
            "",
            &"a".repeat(64),
            "-driver",
            "driver.",
            "my driver",
            "my_driver",
            "drïver",
            "csi/driver",
        ] {
            assert!(validate_driver_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn capabilities_become_predicates() {
        let info = DriverInfo::from_responses(
            info("hostpath.csi.k8s.io"),
            plugin(&[
                PluginCapability::ControllerService,
                PluginCapability::VolumeAccessibilityConstraints,
            ]),
            controller(&[
                ControllerCapability::CreateDeleteVolume as i32,
                ControllerCapability::CloneVolume as i32,
                ControllerCapability::SingleNodeMultiWriter as i32,
                9999, // from a newer spec: ignored
            ]),
        )
        .unwrap();
        assert_eq!(info.name, "hostpath.csi.k8s.io");
        assert_eq!(info.vendor_version, "1.2.3");
        assert!(info.supports_controller_service());
        assert!(info.supports_topology());
        assert!(info.supports_create_delete());
        assert!(info.can_provision());
        assert!(info.supports_clone());
        assert!(info.supports_single_node_multi_writer());
        assert!(!info.supports_snapshot());
        assert!(!info.supports_publish_unpublish());
        assert!(!info.supports_modify_volume());
        assert!(!info.supports_get_capacity());
        assert!(!info.supports_list_volumes());
        assert_eq!(info.controller_capabilities.len(), 3);
    }

    #[test]
    fn no_controller_service_is_not_an_error() {
        let info =
            DriverInfo::from_responses(info("node.only"), plugin(&[]), controller(&[])).unwrap();
        assert!(!info.supports_controller_service());
        assert!(!info.can_provision());
    }

    #[test]
    fn invalid_name_is_an_error_naming_the_problem() {
        let err = DriverInfo::from_responses(info(""), plugin(&[]), controller(&[])).unwrap_err();
        assert!(
            matches!(&err, Error::InvalidDriverName { problem, .. } if problem.contains("empty")),
            "{err:?}"
        );
        assert!(err.to_string().contains("GetPluginInfo"), "{err}");
    }
}
