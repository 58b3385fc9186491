//! Claims with a data source: which object the new volume's content comes from, whether that
//! object may be used, and the CreateVolume `volume_content_source` made from it. Upstream's
//! checks, in upstream's order and with its texts; the executor reads the objects (the source
//! claim and its PV, or the VolumeSnapshot and its content) and these functions decide.

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use thiserror::Error;

use crate::api::{VolumeSnapshot, VolumeSnapshotContent};
use crate::csi;
use crate::csi::volume_content_source::{SnapshotSource, Type, VolumeSource};

use super::capabilities::SourceKind;
use super::quantity::{parse_quantity_bytes, requested_bytes};

/// On a claim being cloned: the claim may not go while a clone of it is still pending.
pub const CLONE_PROTECTION_FINALIZER: &str = "provisioner.storage.kubernetes.io/cloning-protection";
/// On a VolumeSnapshot being restored: a restore in flight may go on while it is deleted.
pub const SNAPSHOT_PROTECTION_FINALIZER: &str =
    "provisioner.storage.kubernetes.io/volumesnapshot-as-source-protection";
/// On a VolumeSnapshotContent: whether a restore may change the volume mode.
pub const ANN_ALLOW_VOLUME_MODE_CHANGE: &str =
    "snapshot.storage.kubernetes.io/allow-volume-mode-change";

pub(super) const SNAPSHOT_KIND: &str = "VolumeSnapshot";
pub(super) const SNAPSHOT_API_GROUP: &str = "snapshot.storage.k8s.io";
pub(super) const CLAIM_KIND: &str = "PersistentVolumeClaim";
const FILESYSTEM: &str = "Filesystem";
const BLOCK: &str = "Block";

/// The object a claim's content comes from, after `dataSource` / `dataSourceRef` are
/// reconciled (upstream's rule: `dataSource` wins, in the claim's namespace).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataSource {
    pub kind: SourceKind,
    pub namespace: String,
    pub name: String,
}

impl DataSource {
    /// The kind as the API names it.
    pub fn kind_name(&self) -> &'static str {
        match self.kind {
            SourceKind::Snapshot => SNAPSHOT_KIND,
            SourceKind::Clone => CLAIM_KIND,
            SourceKind::Empty => "",
        }
    }

    /// The finalizer that protects the source while the new volume is made from it.
    pub fn protection_finalizer(&self) -> &'static str {
        match self.kind {
            SourceKind::Snapshot => SNAPSHOT_PROTECTION_FINALIZER,
            SourceKind::Clone | SourceKind::Empty => CLONE_PROTECTION_FINALIZER,
        }
    }
}

/// Why the source object cannot be used (yet): the claim is retried, as upstream retries it.
/// The text is upstream's, wrapped as upstream wraps it.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("error getting handle for DataSource Type {kind} by Name {name}: {problem}")]
pub struct DataSourceError {
    pub kind: &'static str,
    pub name: String,
    pub problem: SourceProblem,
}

/// What is wrong with a clone's source claim or a restore's snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SourceProblem {
    /// The executor could not read the source claim; `error` is the API error's text.
    #[error("error getting PVC {source_name} (namespace {namespace:?}) from api server: {error}")]
    ClaimRead {
        source_name: String,
        /// The new claim's namespace, as upstream names it.
        namespace: String,
        error: String,
    },
    /// Upstream reads the source claim from its informer, whose miss reads so.
    #[error(
        "error getting PVC {source_name} (namespace {namespace:?}) from api server: persistentvolumeclaim \"{source_name}\" not found"
    )]
    ClaimMissing {
        source_name: String,
        /// The new claim's namespace, as upstream names it.
        namespace: String,
    },
    #[error("the PVC DataSource {source_name} must have a status of Bound.  Got {status}")]
    ClaimNotBound { source_name: String, status: String },
    #[error("the PVC DataSource {0} is currently being deleted")]
    ClaimDeleting(String),
    #[error("the source PVC ({0}) storageclass cannot be empty")]
    SourceClassEmpty(String),
    #[error("the requested PVC ({0}) storageclass cannot be empty")]
    ClassEmpty(String),
    #[error(
        "error, new PVC request must be greater than or equal in size to the specified PVC data source, requested {requested} but source is {source_size}"
    )]
    CloneTooSmall { requested: i64, source_size: i64 },
    #[error("volume name is empty in source PVC {0}")]
    NoVolumeName(String),
    /// The source PV is missing, not CSI, another driver's, or not bound to the source claim;
    /// `detail` says which (upstream logs it and shows only the generic text).
    #[error("claim in dataSource not bound or invalid")]
    SourceVolumeInvalid { detail: String },
    #[error(
        "the source PVC and destination PVCs must have the same volume mode for cloning.  Source is Block, but new PVC requested Filesystem"
    )]
    BlockIntoFilesystem,
    #[error(
        "the source PVC and destination PVCs must have the same volume mode for cloning.  Source is Filesystem, but new PVC requested Block"
    )]
    FilesystemIntoBlock,
    /// The executor could not read the VolumeSnapshot; `error` is the API error's text.
    #[error("error getting snapshot {snapshot} from api server: {error}")]
    SnapshotRead { snapshot: String, error: String },
    #[error("snapshot {0} is being deleted")]
    SnapshotDeleting(String),
    #[error("snapshot {0} not bound")]
    SnapshotNotBound(String),
    #[error("error getting snapshotcontent {content} for snapshot {snapshot}")]
    ContentRead { content: String, snapshot: String },
    #[error("snapshotcontent {content} for snapshot {snapshot} is bound to a different snapshot")]
    ContentOfAnotherSnapshot { content: String, snapshot: String },
    #[error(
        "snapshotcontent {content} for snapshot {snapshot} is not handled by CSI driver of StorageClass {class}"
    )]
    ContentOfAnotherDriver {
        content: String,
        snapshot: String,
        class: String,
    },
    #[error("snapshot {0} is not Ready")]
    SnapshotNotReady(String),
    #[error("snapshot handle {0} is not available")]
    NoSnapshotHandle(String),
    #[error("error getting capacity for PVC {claim} when creating snapshot {snapshot}")]
    NoStorageRequest { claim: String, snapshot: String },
    /// Ours: upstream reads an unparsable restoreSize as 0.
    #[error("snapshot {snapshot} has an invalid restoreSize {value:?}")]
    InvalidRestoreSize { snapshot: String, value: String },
    #[error(
        "requested volume size {requested} is less than the size {restore_size} for the source snapshot {snapshot}"
    )]
    RestoreTooSmall {
        requested: i64,
        restore_size: i64,
        snapshot: String,
    },
    #[error(
        "requested volume {claim} modifies the mode of the source volume but does not have permission to do so. {reason}"
    )]
    VolumeModeChange { claim: String, reason: String },
}

/// The name of the PV behind a clone's source claim, once upstream's checks of the source
/// claim itself pass (rows 2 to 7 of its table; the executor read the claim, row 1).
pub fn check_clone_source(
    pvc: &PersistentVolumeClaim,
    source: &DataSource,
    source_claim: &PersistentVolumeClaim,
) -> Result<String, DataSourceError> {
    let fail = |problem| DataSourceError {
        kind: CLAIM_KIND,
        name: source.name.clone(),
        problem,
    };
    let status = source_claim.status.clone().unwrap_or_default();
    if status.phase.as_deref() != Some("Bound") {
        return Err(fail(SourceProblem::ClaimNotBound {
            source_name: source.name.clone(),
            status: go_claim_status(&status),
        }));
    }
    if source_claim.metadata.deletion_timestamp.is_some() {
        return Err(fail(SourceProblem::ClaimDeleting(source.name.clone())));
    }
    let source_spec = source_claim.spec.clone().unwrap_or_default();
    if source_spec.storage_class_name.is_none() {
        let name = source_claim.metadata.name.clone().unwrap_or_default();
        return Err(fail(SourceProblem::SourceClassEmpty(name)));
    }
    let spec = pvc.spec.clone().unwrap_or_default();
    if spec.storage_class_name.is_none() {
        let name = pvc.metadata.name.clone().unwrap_or_default();
        return Err(fail(SourceProblem::ClassEmpty(name)));
    }
    // Both were accepted by the API server; an unparsable one counts as 0, as upstream's.
    let requested = requested_bytes(pvc).unwrap_or(0);
    let source_size = requested_bytes(source_claim).unwrap_or(0);
    if requested < source_size {
        return Err(fail(SourceProblem::CloneTooSmall {
            requested,
            source_size,
        }));
    }
    match source_spec.volume_name.filter(|name| !name.is_empty()) {
        Some(volume) => Ok(volume),
        None => {
            let name = source_claim.metadata.name.clone().unwrap_or_default();
            Err(fail(SourceProblem::NoVolumeName(name)))
        }
    }
}

/// The content source of a clone: the source claim's volume, if its PV (`None`: not found)
/// is bound to that claim, is the class's driver's, and has the claim's volume mode.
pub fn clone_content_source(
    pvc: &PersistentVolumeClaim,
    class: &StorageClass,
    source: &DataSource,
    source_claim: &PersistentVolumeClaim,
    source_pv: Option<&PersistentVolume>,
) -> Result<csi::VolumeContentSource, DataSourceError> {
    let fail = |problem| DataSourceError {
        kind: CLAIM_KIND,
        name: source.name.clone(),
        problem,
    };
    let invalid = |detail: &str| {
        fail(SourceProblem::SourceVolumeInvalid {
            detail: detail.to_owned(),
        })
    };
    let pv = source_pv.ok_or_else(|| invalid("the source claim's PV does not exist"))?;
    let pv_spec = pv.spec.clone().unwrap_or_default();
    let csi_source = pv_spec
        .csi
        .as_ref()
        .ok_or_else(|| invalid("the source claim's PV is not a CSI volume"))?;
    if csi_source.driver != class.provisioner {
        return Err(invalid(
            "the source claim's PV is another CSI driver's than the class's",
        ));
    }
    let meta = &source_claim.metadata;
    let bound_to_source = pv_spec.claim_ref.as_ref().is_some_and(|claim| {
        claim.uid == meta.uid && claim.namespace == meta.namespace && claim.name == meta.name
    });
    if !bound_to_source {
        return Err(invalid("the source claim's PV is not bound to it"));
    }
    let phase = pv
        .status
        .as_ref()
        .and_then(|status| status.phase.as_deref());
    if phase != Some("Bound") {
        return Err(invalid("the source claim's PV is not Bound"));
    }
    let wanted = pvc
        .spec
        .as_ref()
        .and_then(|spec| spec.volume_mode.as_deref());
    let has = pv_spec.volume_mode.as_deref();
    if wanted == Some(BLOCK) {
        if has != Some(BLOCK) {
            return Err(fail(SourceProblem::FilesystemIntoBlock));
        }
    } else if has.is_some_and(|mode| mode != FILESYSTEM) {
        return Err(fail(SourceProblem::BlockIntoFilesystem));
    }
    Ok(csi::VolumeContentSource {
        r#type: Some(Type::Volume(VolumeSource {
            volume_id: csi_source.volume_handle.clone(),
        })),
    })
}

/// The name of the VolumeSnapshotContent a restore reads, once the snapshot itself passes
/// upstream's checks: not being deleted (unless a restore of it already started, which put
/// [`SNAPSHOT_PROTECTION_FINALIZER`] on it) and bound to a content.
pub fn check_snapshot_source(
    source: &DataSource,
    snapshot: &VolumeSnapshot,
) -> Result<String, DataSourceError> {
    let fail = |problem| DataSourceError {
        kind: SNAPSHOT_KIND,
        name: source.name.clone(),
        problem,
    };
    let meta = &snapshot.metadata;
    let protected = meta
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == SNAPSHOT_PROTECTION_FINALIZER);
    if meta.deletion_timestamp.is_some() && !protected {
        return Err(fail(SourceProblem::SnapshotDeleting(source.name.clone())));
    }
    snapshot
        .status
        .as_ref()
        .and_then(|status| status.bound_volume_snapshot_content_name.clone())
        .ok_or_else(|| fail(SourceProblem::SnapshotNotBound(source.name.clone())))
}

/// The content source of a restore from `snapshot`, bound to `content`: upstream's checks of
/// the content, readiness, size and volume mode, in its order.
pub fn snapshot_content_source(
    pvc: &PersistentVolumeClaim,
    class: &StorageClass,
    source: &DataSource,
    snapshot: &VolumeSnapshot,
    content: &VolumeSnapshotContent,
    prevent_volume_mode_conversion: bool,
) -> Result<csi::VolumeContentSource, DataSourceError> {
    let fail = |problem| DataSourceError {
        kind: SNAPSHOT_KIND,
        name: source.name.clone(),
        problem,
    };
    let content_name = content.metadata.name.clone().unwrap_or_default();
    let reference = &content.spec.volume_snapshot_ref;
    let meta = &snapshot.metadata;
    if reference.uid != meta.uid
        || reference.namespace != meta.namespace
        || reference.name != meta.name
    {
        return Err(fail(SourceProblem::ContentOfAnotherSnapshot {
            content: content_name,
            snapshot: source.name.clone(),
        }));
    }
    if content.spec.driver != class.provisioner {
        return Err(fail(SourceProblem::ContentOfAnotherDriver {
            content: content_name,
            snapshot: source.name.clone(),
            class: class.metadata.name.clone().unwrap_or_default(),
        }));
    }
    let status = snapshot.status.clone().unwrap_or_default();
    if status.ready_to_use != Some(true) {
        return Err(fail(SourceProblem::SnapshotNotReady(source.name.clone())));
    }
    let handle = content
        .status
        .as_ref()
        .and_then(|status| status.snapshot_handle.clone())
        .ok_or_else(|| fail(SourceProblem::NoSnapshotHandle(source.name.clone())))?;
    let snapshot_name = meta.name.clone().unwrap_or_default();
    if let Some(restore_size) = &status.restore_size {
        check_restore_size(pvc, &snapshot_name, &restore_size.0).map_err(fail)?;
    }
    if prevent_volume_mode_conversion {
        check_volume_mode_change(pvc, content, &content_name).map_err(fail)?;
    }
    Ok(csi::VolumeContentSource {
        r#type: Some(Type::Snapshot(SnapshotSource {
            snapshot_id: handle,
        })),
    })
}

/// A restored volume must be at least as large as the snapshot; larger is the driver's to
/// expand.
fn check_restore_size(
    pvc: &PersistentVolumeClaim,
    snapshot: &str,
    restore_size: &str,
) -> Result<(), SourceProblem> {
    let has_request = pvc
        .spec
        .as_ref()
        .and_then(|spec| spec.resources.as_ref())
        .and_then(|resources| resources.requests.as_ref())
        .is_some_and(|requests| requests.contains_key("storage"));
    if !has_request {
        return Err(SourceProblem::NoStorageRequest {
            claim: pvc.metadata.name.clone().unwrap_or_default(),
            snapshot: snapshot.to_owned(),
        });
    }
    let restore_size =
        parse_quantity_bytes(restore_size).map_err(|_| SourceProblem::InvalidRestoreSize {
            snapshot: snapshot.to_owned(),
            value: restore_size.to_owned(),
        })?;
    let requested = requested_bytes(pvc).unwrap_or(0);
    if requested < restore_size {
        return Err(SourceProblem::RestoreTooSmall {
            requested,
            restore_size,
            snapshot: snapshot.to_owned(),
        });
    }
    Ok(())
}

/// `--prevent-volume-mode-conversion`: a restore into another volume mode than the
/// snapshotted volume's needs the content's permission annotation set to a Go `true`.
fn check_volume_mode_change(
    pvc: &PersistentVolumeClaim,
    content: &VolumeSnapshotContent,
    content_name: &str,
) -> Result<(), SourceProblem> {
    let wanted = pvc
        .spec
        .as_ref()
        .and_then(|spec| spec.volume_mode.as_deref());
    let (Some(source_mode), Some(wanted)) = (content.spec.source_volume_mode.as_deref(), wanted)
    else {
        return Ok(());
    };
    if source_mode == wanted {
        return Ok(());
    }
    let annotation = content
        .metadata
        .annotations
        .as_ref()
        .and_then(|annotations| annotations.get(ANN_ALLOW_VOLUME_MODE_CHANGE));
    let reason = match annotation.map(|value| (value, go_parse_bool(value))) {
        Some((_, Some(true))) => return Ok(()),
        None => format!(
            "{ANN_ALLOW_VOLUME_MODE_CHANGE} annotation is not present on snapshotcontent {content_name}"
        ),
        Some((value, None)) => format!(
            "failed to convert {ANN_ALLOW_VOLUME_MODE_CHANGE} annotation value to boolean with error: strconv.ParseBool: parsing {value:?}: invalid syntax"
        ),
        Some((_, Some(false))) => format!(
            "{ANN_ALLOW_VOLUME_MODE_CHANGE} is set to false on snapshotcontent {content_name}"
        ),
    };
    Err(SourceProblem::VolumeModeChange {
        claim: format!(
            "{}/{}",
            pvc.metadata.namespace.as_deref().unwrap_or_default(),
            pvc.metadata.name.as_deref().unwrap_or_default()
        ),
        reason,
    })
}

/// Go's `strconv.ParseBool`.
fn go_parse_bool(value: &str) -> Option<bool> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// A claim status as Go's `%v` prints it, for upstream's "must have a status of Bound"
/// text: exact for the usual unbound source (phase only); a non-empty capacity is shown as
/// `map[storage:1Gi]`, where Go would print the Quantity's internals.
fn go_claim_status(status: &k8s_openapi::api::core::v1::PersistentVolumeClaimStatus) -> String {
    let modes = status.access_modes.clone().unwrap_or_default().join(" ");
    let capacity = status
        .capacity
        .iter()
        .flatten()
        .map(|(name, quantity)| format!("{name}:{}", quantity.0))
        .collect::<Vec<_>>()
        .join(" ");
    let conditions = if status.conditions.iter().flatten().next().is_some() {
        "[...]"
    } else {
        "[]"
    };
    format!(
        "{{{} [{modes}] map[{capacity}] {conditions} map[] map[] <nil> <nil>}}",
        status.phase.as_deref().unwrap_or_default()
    )
}

#[cfg(test)]
mod tests;
