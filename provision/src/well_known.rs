//! The names this sidecar shares with Kubernetes and upstream: annotation keys on claims and
//! PVs, finalizers, and the volume-context key of the provisioner identity.

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
