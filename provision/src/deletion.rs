//! Decisions about existing PersistentVolumes (upstream's deletion path): responsibility, the PV finalizer, when to
//! delete, what to send to DeleteVolume; and whether an AlreadyExists PV is the one we wanted.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::StorageClass;
use thiserror::Error;

use super::capabilities::{CapabilityError, check_create_delete_capabilities};
use super::claim::{annotation, migrated_plugin};
use super::migration::{Holding, InTreePlugin, MigrationError, same_in_tree_volume};
use super::node::{NodeScope, VolumePlace, volume_place};
use super::secrets::{SecretError, SecretKind, SecretRef, TemplateContext, resolve_secret_ref};
use super::settings::DriverCapabilities;
use super::well_known::{
    ANN_BETA_STORAGE_CLASS, ANN_DELETION_SECRET_NAME, ANN_DELETION_SECRET_NAMESPACE,
    ANN_MIGRATED_TO, ANN_PROVISIONED_BY, PV_FINALIZER,
};

const POLICY_DELETE: &str = "Delete";
const POLICY_RETAIN: &str = "Retain";
const POLICY_RECYCLE: &str = "Recycle";
const PHASE_BOUND: &str = "Bound";
const PHASE_RELEASED: &str = "Released";

/// Why a PV's backend volume cannot be deleted.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DeletionError {
    /// The PV has no `spec.csi`, and no in-tree source of the plugin migrated to this driver.
    #[error("invalid CSI PV")]
    NotCsi,
    /// The in-tree source of a migrated PV, or its in-tree class, could not be translated.
    #[error(transparent)]
    Migration(#[from] MigrationError),
    #[error("PV has an empty spec.csi.volumeHandle")]
    EmptyVolumeHandle,
    #[error(transparent)]
    Capability(#[from] CapabilityError),
    /// The class's secret templates no longer resolve for this PV.
    #[error("failed to get secretreference for volume {volume}: {source}")]
    SecretReference { volume: String, source: SecretError },
}

/// What to do with [`PV_FINALIZER`] on a PV (upstream's handleProtectionFinalizer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinalizerAction {
    Add,
    Remove,
    None,
}

/// Where DeleteVolume's secrets come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeletionSecrets {
    /// Call DeleteVolume without secrets.
    None,
    /// GET this Secret and send its data. Upstream deletes without secrets when the GET fails
    /// (upstream deletes without secrets then); that choice is the executor's.
    Fetch(SecretRef),
    /// The PV predates the deletion-secret annotations: GET this StorageClass and pass it to
    /// [`deletion_secret_from_class`] (a missing class means no secrets).
    FromStorageClass { class_name: String },
}

/// The DeleteVolume inputs of a PV.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeletionTarget {
    pub volume_handle: String,
    /// The handle was translated from the PV's in-tree source (the `migrated` metric label).
    pub migrated: bool,
    pub secrets: DeletionSecrets,
}

/// Whether this driver is responsible for the PV: by `provisioned-by` (the driver, or the
/// in-tree plugin migrated to it) or `migrated-to` when present; otherwise (static PVs) by
/// `spec.csi.driver`, or `migrated-to` for in-tree sources.
pub fn is_provisioner_for_volume(pv: &PersistentVolume, driver: &str) -> bool {
    let migrated_to_us = annotation(&pv.metadata, ANN_MIGRATED_TO) == Some(driver);
    if let Some(provisioner) = annotation(&pv.metadata, ANN_PROVISIONED_BY) {
        let in_tree = InTreePlugin::for_csi_driver(driver).map(InTreePlugin::in_tree_name);
        return provisioner == driver || Some(provisioner) == in_tree || migrated_to_us;
    }
    match pv.spec.as_ref().and_then(|spec| spec.csi.as_ref()) {
        Some(csi) => csi.driver == driver,
        None => migrated_to_us,
    }
}

/// Whether the PV is an in-tree one of the plugin migrated to `driver` (no CSI source).
pub fn is_migrated(pv: &PersistentVolume, driver: &str) -> bool {
    pv.spec.as_ref().is_some_and(|spec| spec.csi.is_none()) && has_deletable_source(pv, driver)
}

/// Whether this sidecar can name the PV's backend volume to the driver: a CSI source, or the
/// in-tree source of the plugin migrated to the driver. Any other PV never gets our
/// finalizer and is never deleted by us, whatever its annotations say (upstream adds the
/// finalizer to it and then fails "invalid CSI PV" forever).
pub fn has_deletable_source(pv: &PersistentVolume, driver: &str) -> bool {
    pv.spec.as_ref().is_some_and(|spec| spec.csi.is_some())
        || InTreePlugin::for_csi_driver(driver).is_some_and(|plugin| plugin.has_source(pv))
}

/// [`pv_finalizer_action`] for a PV of ours: one without a [`has_deletable_source`] loses our
/// finalizer (a version that did not check put it there): it would hold the PV forever for a
/// deletion that can never be made.
pub fn volume_finalizer_action(pv: &PersistentVolume, driver: &str) -> FinalizerAction {
    if has_deletable_source(pv, driver) {
        pv_finalizer_action(pv)
    } else if has_finalizer(pv) {
        FinalizerAction::Remove
    } else {
        FinalizerAction::None
    }
}

/// Add the finalizer to a live, Bound PV with policy Delete; remove it when the policy is
/// Retain or Recycle, since then the backend volume outlives the PV anyway.
pub fn pv_finalizer_action(pv: &PersistentVolume) -> FinalizerAction {
    let has_finalizer = has_finalizer(pv);
    match reclaim_policy(pv) {
        Some(POLICY_DELETE)
            if !has_finalizer
                && pv.metadata.deletion_timestamp.is_none()
                && phase(pv) == Some(PHASE_BOUND) =>
        {
            FinalizerAction::Add
        }
        Some(POLICY_RETAIN | POLICY_RECYCLE) if has_finalizer => FinalizerAction::Remove,
        _ => FinalizerAction::None,
    }
}

/// Whether to delete the backend volume now: phase Released and policy Delete, unless the PV
/// is already being deleted without our finalizer (nothing would wait for us).
pub fn should_delete(pv: &PersistentVolume) -> bool {
    if pv.metadata.deletion_timestamp.is_some() && !has_finalizer(pv) {
        return false;
    }
    phase(pv) == Some(PHASE_RELEASED) && reclaim_policy(pv) == Some(POLICY_DELETE)
}

/// Whether a PV [`should_delete`] may be deleted before its backend volume: only while it is
/// not yet being deleted and carries our finalizer, which then keeps it (Terminating) until
/// DeleteVolume has succeeded. Deleting it first, with the cached UID and resourceVersion as
/// preconditions, checks the cached decision on a quorum without a read of its own.
pub fn may_delete_pv_first(pv: &PersistentVolume) -> bool {
    pv.metadata.deletion_timestamp.is_none() && has_finalizer(pv)
}

/// The volume handle and the secret decision for DeleteVolume: the CSI source's handle, or
/// the handle translated from the in-tree source of the plugin migrated to `driver`.
pub fn deletion_target(
    pv: &PersistentVolume,
    caps: &DriverCapabilities,
    driver: &str,
) -> Result<DeletionTarget, DeletionError> {
    let (volume_handle, migrated) = match pv.spec.as_ref().and_then(|spec| spec.csi.as_ref()) {
        Some(csi) => (csi.volume_handle.clone(), false),
        None => {
            let plugin = InTreePlugin::for_csi_driver(driver)
                .filter(|plugin| plugin.has_source(pv))
                .ok_or(DeletionError::NotCsi)?;
            (plugin.csi_handle(pv)?, true)
        }
    };
    check_create_delete_capabilities(caps)?;
    if volume_handle.is_empty() {
        return Err(DeletionError::EmptyVolumeHandle);
    }
    Ok(DeletionTarget {
        volume_handle,
        migrated,
        secrets: deletion_secrets(pv),
    })
}

/// Upstream's rules: with both deletion-secret annotations, use them when both are non-empty
/// and send no secrets otherwise (both empty, or one empty); without them, fall back to the
/// PV's StorageClass, unless the PV names no class or has no claimRef (no secrets).
pub fn deletion_secrets(pv: &PersistentVolume) -> DeletionSecrets {
    let meta = &pv.metadata;
    match (
        annotation(meta, ANN_DELETION_SECRET_NAME),
        annotation(meta, ANN_DELETION_SECRET_NAMESPACE),
    ) {
        (Some(name), Some(namespace)) if !name.is_empty() && !namespace.is_empty() => {
            DeletionSecrets::Fetch(SecretRef {
                name: name.to_owned(),
                namespace: namespace.to_owned(),
            })
        }
        (Some(_), Some(_)) => DeletionSecrets::None,
        _ => {
            let class_name = volume_class_name(pv);
            let has_claim = pv.spec.as_ref().is_some_and(|s| s.claim_ref.is_some());
            if class_name.is_empty() || !has_claim {
                DeletionSecrets::None
            } else {
                DeletionSecrets::FromStorageClass {
                    class_name: class_name.to_owned(),
                }
            }
        }
    }
}

/// The provisioner secret for a PV without deletion-secret annotations, from its class
/// (`None` if the class is gone), resolved for a claim that only has the claimRef's name and
/// namespace. A template that no longer resolves is an error, as upstream.
///
/// For a migrated PV (no CSI source) of an in-tree class migrated to `driver`, the class is
/// translated first, as upstream (only Portworx's translation has secrets).
pub fn deletion_secret_from_class(
    pv: &PersistentVolume,
    class: Option<&StorageClass>,
    driver: &str,
) -> Result<Option<SecretRef>, DeletionError> {
    let Some(class) = class else {
        return Ok(None);
    };
    let migrated = is_migrated(pv, driver);
    let translated = match migrated_plugin(class, driver) {
        Some(plugin) if migrated => Some(plugin.translate_class(class)?),
        _ => None,
    };
    let class = translated.as_ref().unwrap_or(class);
    let Some(claim_ref) = pv.spec.as_ref().and_then(|spec| spec.claim_ref.as_ref()) else {
        return Ok(None);
    };
    let pv_name = pv.metadata.name.as_deref().unwrap_or_default();
    let no_parameters = BTreeMap::new();
    let context = TemplateContext {
        pv_name,
        pvc_name: claim_ref.name.as_deref().unwrap_or_default(),
        pvc_namespace: claim_ref.namespace.as_deref().unwrap_or_default(),
        pvc_annotations: None,
    };
    resolve_secret_ref(
        SecretKind::Provisioner,
        class.parameters.as_ref().unwrap_or(&no_parameters),
        &context,
    )
    .map_err(|source| DeletionError::SecretReference {
        volume: pv_name.to_owned(),
        source,
    })
}

/// What an existing PV that made our PV create fail with AlreadyExists means for the volume
/// CreateVolume just returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExistingPv {
    /// The PV we wanted: same driver, volume handle and claim UID, not being deleted.
    Ours,
    /// Another PV (another claim's, or one being deleted) references the very volume: it is in
    /// use and must not be deleted. Two claims whose names collide (a short
    /// `--volume-name-uuid-length`) get the same volume back from an idempotent CreateVolume.
    HoldsTheVolume,
    /// A PV of another volume or driver: the volume just created has no PV and is deleted
    /// (upstream counts every AlreadyExists as success and leaks it, #1469).
    Other,
    /// The operation's own PV (same volume, same claim), being deleted: its volume may have
    /// been deleted already and the one just created be a new one it will not delete. Neither
    /// kept as done nor deleted now: the operation stays and is retried once the PV is gone.
    BeingDeleted,
}

///
/// In node mode (`node`) the volume handle is one node's driver's: local drivers reuse handles
/// on every node, so an existing PV known to be on another node ([`volume_place`]) holds
/// another volume, whatever its handle.
pub fn existing_pv(
    existing: &PersistentVolume,
    wanted: &PersistentVolume,
    node: Option<&NodeScope<'_>>,
) -> ExistingPv {
    let csi = |pv: &PersistentVolume| pv.spec.as_ref().and_then(|spec| spec.csi.clone());
    let claim_uid = |pv: &PersistentVolume| {
        pv.spec
            .as_ref()
            .and_then(|spec| spec.claim_ref.as_ref())
            .and_then(|claim_ref| claim_ref.uid.clone())
    };
    let same_volume = match (csi(existing), csi(wanted)) {
        (Some(existing_csi), Some(wanted_csi)) => {
            existing_csi.driver == wanted_csi.driver
                && existing_csi.volume_handle == wanted_csi.volume_handle
                && may_be_here(existing, &existing_csi.driver, node)
        }
        // A migrated claim's PV holds the in-tree source translated from the volume.
        (None, None) => same_in_tree_volume(existing, wanted),
        _ => false,
    };
    if !same_volume {
        return ExistingPv::Other;
    }
    let same_claim = claim_uid(wanted).is_some() && claim_uid(existing) == claim_uid(wanted);
    match (same_claim, existing.metadata.deletion_timestamp.is_some()) {
        (true, false) => ExistingPv::Ours,
        (true, true) => ExistingPv::BeingDeleted,
        (false, _) => ExistingPv::HoldsTheVolume,
    }
}

/// Whether `pv` references the backend volume `handle` of `driver`, whatever its name: such a
/// volume is in use and never deleted for an operation in flight. In node mode (`node`), a PV
/// known to be on another node references that node's volume of the same handle, not ours;
/// one whose place is unknown is taken to hold ours (it is never deleted on a guess). An
/// in-tree PV of the plugin migrated to `driver` whose source cannot be translated is
/// `Unknown`: neither the volume nor its record may go while it exists.
pub fn pv_holds_volume(
    pv: &PersistentVolume,
    driver: &str,
    handle: &str,
    node: Option<&NodeScope<'_>>,
) -> Holding {
    match pv.spec.as_ref().and_then(|spec| spec.csi.as_ref()) {
        Some(csi)
            if csi.driver == driver
                && csi.volume_handle == handle
                && may_be_here(pv, driver, node) =>
        {
            Holding::Holds
        }
        Some(_) => Holding::DoesNotHold,
        None => InTreePlugin::for_csi_driver(driver)
            .map_or(Holding::DoesNotHold, |plugin| plugin.holds(pv, handle)),
    }
}

/// Central mode: every PV of the driver is this sidecar's. Node mode: all but those known to
/// be on another node.
fn may_be_here(pv: &PersistentVolume, driver: &str, node: Option<&NodeScope<'_>>) -> bool {
    node.is_none_or(|node| volume_place(pv, driver, node) != VolumePlace::OtherNode)
}

/// What a PV named like an operation's volume says of that operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PvOfOperation {
    /// It is the operation's PV: the volume is safe, the operation over.
    Ends,
    /// Node mode: it is the same claim's PV, but of another node's volume (the claim moved
    /// there): this node's operation is an orphan, its volume unused.
    ServesAnotherNode,
    /// Another claim's or driver's, one being deleted, or (node mode) one whose node cannot
    /// be told: it says nothing of the operation, whose replay's handle decides
    /// (`pv_holds_volume`).
    Unrelated,
}

/// What `pv` says of the operation of `driver` for claim `claim_uid` of this sidecar; in node
/// mode (`node`) only a PV known to be on this node ends it, as [`existing_pv`] judges: local
/// drivers give the same volume name, and often the same handle, a volume on every node.
pub fn pv_of_operation(
    pv: &PersistentVolume,
    driver: &str,
    claim_uid: &str,
    node: Option<&NodeScope<'_>>,
) -> PvOfOperation {
    // A PV being deleted may have had its volume deleted already, and a replay may have
    // created it again since: it ends nothing (the replay's holder check waits for it to go).
    if !pv_is_for_claim(pv, driver, claim_uid) || pv.metadata.deletion_timestamp.is_some() {
        return PvOfOperation::Unrelated;
    }
    match node.map(|node| volume_place(pv, driver, node)) {
        None | Some(VolumePlace::ThisNode) => PvOfOperation::Ends,
        Some(VolumePlace::OtherNode) => PvOfOperation::ServesAnotherNode,
        Some(VolumePlace::Unknown) => PvOfOperation::Unrelated,
    }
}

/// Whether `pv` is the PV of an operation of `driver` for the claim `claim_uid`: the only PV
/// whose existence ends that operation (the volume reconciler owns the volume from then on).
/// A PV of that name from another driver or for another claim says nothing about it.
pub fn pv_is_for_claim(pv: &PersistentVolume, driver: &str, claim_uid: &str) -> bool {
    let spec = pv.spec.as_ref();
    let of_driver = match spec.and_then(|spec| spec.csi.as_ref()) {
        Some(csi) => csi.driver == driver,
        None => InTreePlugin::for_csi_driver(driver).is_some_and(|plugin| plugin.has_source(pv)),
    };
    of_driver
        && spec
            .and_then(|spec| spec.claim_ref.as_ref())
            .and_then(|claim| claim.uid.as_deref())
            == Some(claim_uid)
}

/// The PV's class: the legacy beta annotation wins over `spec.storageClassName`.
fn volume_class_name(pv: &PersistentVolume) -> &str {
    annotation(&pv.metadata, ANN_BETA_STORAGE_CLASS)
        .or_else(|| {
            pv.spec
                .as_ref()
                .and_then(|spec| spec.storage_class_name.as_deref())
        })
        .unwrap_or_default()
}

fn has_finalizer(pv: &PersistentVolume) -> bool {
    pv.metadata
        .finalizers
        .as_ref()
        .is_some_and(|finalizers| finalizers.iter().any(|f| f == PV_FINALIZER))
}

fn reclaim_policy(pv: &PersistentVolume) -> Option<&str> {
    pv.spec
        .as_ref()?
        .persistent_volume_reclaim_policy
        .as_deref()
}

fn phase(pv: &PersistentVolume) -> Option<&str> {
    pv.status.as_ref()?.phase.as_deref()
}

#[cfg(test)]
mod tests;
