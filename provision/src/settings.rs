//! What the decisions depend on besides the objects: the driver's capabilities and the
//! command-line settings.

use super::metadata::MetadataAllowLists;

/// What the driver reported, reduced to the bits the decisions need. The CSI client maps its
/// own driver info onto this.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DriverCapabilities {
    /// Plugin capability CONTROLLER_SERVICE.
    pub controller_service: bool,
    /// Controller capability CREATE_DELETE_VOLUME.
    pub create_delete_volume: bool,
    /// Controller capability SINGLE_NODE_MULTI_WRITER (changes the access-mode mapping).
    pub single_node_multi_writer: bool,
    /// Plugin capability VOLUME_ACCESSIBILITY_CONSTRAINTS with the Topology gate on.
    pub topology: bool,
    /// Controller capability CLONE_VOLUME.
    pub clone: bool,
    /// Controller capability CREATE_DELETE_SNAPSHOT.
    pub snapshot: bool,
    /// Controller capability PUBLISH_UNPUBLISH_VOLUME: volumes are attached to nodes, so a
    /// volume is deleted only once no VolumeAttachment names its PV.
    pub publish_unpublish: bool,
    /// Controller capability MODIFY_VOLUME: needed by a claim that names a
    /// VolumeAttributesClass (its parameters go to CreateVolume as `mutable_parameters`).
    pub modify_volume: bool,
}

/// The command-line settings the decisions depend on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProvisionerConfig {
    /// Driver name from GetPluginInfo.
    pub driver_name: String,
    /// `--volume-name-prefix`.
    pub volume_name_prefix: String,
    /// `--volume-name-uuid-length`: -1 for the whole UID, else 1..=32.
    pub volume_name_uuid_length: i32,
    /// `--extra-create-metadata`.
    pub extra_create_metadata: bool,
    /// Ours: the claim and namespace metadata passed on by allow-list (`--copy-claim-labels`,
    /// `--extra-create-metadata-claim-annotations`, `--extra-create-metadata-namespace-*`).
    pub metadata: MetadataAllowLists,
    /// `--default-fstype`; empty means none.
    pub default_fstype: String,
    /// `--controller-publish-readonly`.
    pub controller_publish_readonly: bool,
    /// `--prevent-volume-mode-conversion`.
    pub prevent_volume_mode_conversion: bool,
    /// The CrossNamespaceVolumeDataSource gate: a `dataSourceRef` may name another namespace.
    pub cross_namespace_data_sources: bool,
    /// The VolumeAttributesClass gate (switched off at start when the API server does not
    /// serve the kind and the gate was not named on the command line): a claim's
    /// `volumeAttributesClassName` is honoured; off, it is ignored, as upstream.
    pub volume_attributes_classes: bool,
    /// Identity of this process, see [`provisioner_identity`].
    pub identity: String,
}

/// The identity stored in every PV this process creates:
/// `<unix-ms>-<random 0..9999>-<driver>`, plus `-<node>` in per-node deployments.
pub fn provisioner_identity(
    unix_millis: u128,
    random: u16,
    driver: &str,
    node: Option<&str>,
) -> String {
    match node {
        Some(node) => format!("{unix_millis}-{random}-{driver}-{node}"),
        None => format!("{unix_millis}-{random}-{driver}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_is_time_random_driver_and_optional_node() {
        assert_eq!(
            provisioner_identity(1_700_000_000_000, 42, "hostpath.csi.k8s.io", None),
            "1700000000000-42-hostpath.csi.k8s.io"
        );
        assert_eq!(
            provisioner_identity(5, 9999, "d", Some("node-1")),
            "5-9999-d-node-1"
        );
    }
}
