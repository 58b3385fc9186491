//! The pure decision layer of the sidecar: everything it decides about a claim, a StorageClass
//! and a PersistentVolume, with no IO, no kube client and no async. Executors fetch the
//! objects, call these functions and act on what they return. Every function is total on data
//! coming from the API server or the driver: bad input is a typed error, never a panic.
//!
//! Provisioning one claim:
//! 1. [`claim_work`] says what the claim needs now (through [`should_provision`]: Provision,
//!    Skip with a reason, or Error).
//! 2. [`plan_provision`] validates the claim and its class and computes everything that does not
//!    need the driver: volume name, size, capabilities, parameters and all secret references.
//! 3. The executor GETs `plan.secrets.provisioner` (if any), turns it into a map with
//!    [`secret_data`] and builds the request with [`build_create_volume_request`].
//! 4. After CreateVolume succeeds, [`build_persistent_volume`] gives the PV to create. When the
//!    PV create answers AlreadyExists, [`already_exists_is_ours`] says whether that is success.
//!
//! Deleting one PV: [`volume_has_work`] (from [`is_provisioner_for_volume`],
//! [`pv_finalizer_action`] and [`should_delete`]), then [`deletion_target`] (and
//! [`deletion_secret_from_class`] when the PV does not record its deletion secret).

mod capabilities;
mod claim;
mod consistency;
mod deletion;
mod finalizers;
mod naming;
mod parameters;
mod plan;
mod quantity;
mod secrets;
mod validation;
mod volume;
mod work;

#[cfg(test)]
pub(crate) mod fixtures;

pub use capabilities::{
    CapabilityError, check_create_delete_capabilities, csi_access_mode, fs_type,
    volume_capabilities,
};
pub use claim::{
    DecisionError, ProvisionDecision, SkipReason, claim_class_name, selected_node,
    should_provision, storage_provisioner,
};
pub use consistency::{
    ANN_PROVISIONING_CONSISTENCY, PROVISIONING_FINALIZER, consistency_enabled,
    has_provisioning_finalizer, may_release_finalizer, needs_finalizer,
};
pub use deletion::{
    DeletionError, DeletionSecrets, DeletionTarget, FinalizerAction, already_exists_is_ours,
    deletion_secret_from_class, deletion_secrets, deletion_target, is_provisioner_for_volume,
    may_delete_pv_first, pv_finalizer_action, should_delete,
};
pub use finalizers::{finalizer_addition_patch, finalizer_removal_patch};
pub use naming::{VolumeNameError, check_volume_name_flags, volume_name};
pub use parameters::{
    ExtraCreateMetadata, ParameterError, create_volume_parameters, deprecated_parameter_keys,
};
pub use plan::{ProvisionError, ProvisionPlan, build_create_volume_request, plan_provision};
pub use quantity::{QuantityError, format_binary_si, parse_quantity_bytes, requested_bytes};
pub use secrets::{
    SecretError, SecretKind, SecretRef, SecretRefs, TemplateContext, resolve_secret_ref,
    resolve_secret_refs, secret_data,
};
pub use volume::{CreateResponseError, build_persistent_volume};
pub use work::{ClaimWork, claim_work, volume_has_work};

/// Claim annotation written by kube-controller-manager naming the provisioner it waits for.
pub const ANN_STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
/// Deprecated twin of [`ANN_STORAGE_PROVISIONER`], read when the GA key is absent.
pub const ANN_BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";
/// CSI driver an in-tree claim or volume was migrated to.
pub const ANN_MIGRATED_TO: &str = "pv.kubernetes.io/migrated-to";
/// Node chosen by the scheduler for a WaitForFirstConsumer claim.
pub const ANN_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// Historic key of [`ANN_SELECTED_NODE`], still honoured as a fallback.
pub const ANN_ALPHA_SELECTED_NODE: &str = "volume.alpha.kubernetes.io/selected-node";
/// Legacy class annotation; wins over `spec.storageClassName` on claims and volumes.
pub const ANN_BETA_STORAGE_CLASS: &str = "volume.beta.kubernetes.io/storage-class";
/// PV annotation naming the provisioner that created the volume.
pub const ANN_PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
/// PV annotations recording the provisioner secret to use at deletion time.
pub const ANN_DELETION_SECRET_NAME: &str = "volume.kubernetes.io/provisioner-deletion-secret-name";
/// See [`ANN_DELETION_SECRET_NAME`].
pub const ANN_DELETION_SECRET_NAMESPACE: &str =
    "volume.kubernetes.io/provisioner-deletion-secret-namespace";
/// PV annotations recording the controller-modify secret (read by external-resizer).
pub const ANN_CONTROLLER_MODIFY_SECRET_NAME: &str =
    "volume.kubernetes.io/controller-modify-secret-name";
/// See [`ANN_CONTROLLER_MODIFY_SECRET_NAME`].
pub const ANN_CONTROLLER_MODIFY_SECRET_NAMESPACE: &str =
    "volume.kubernetes.io/controller-modify-secret-namespace";
/// Finalizer that keeps a PV until its backend volume is deleted.
pub const PV_FINALIZER: &str = "external-provisioner.volume.kubernetes.io/finalizer";
/// `volumeAttributes` key carrying the identity of the provisioner process.
pub const PROVISIONER_IDENTITY_KEY: &str = "storage.kubernetes.io/csiProvisionerIdentity";

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
    /// `--default-fstype`; empty means none.
    pub default_fstype: String,
    /// `--controller-publish-readonly`.
    pub controller_publish_readonly: bool,
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
