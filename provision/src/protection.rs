//! When a data source's protection finalizer may come off again: a clone's source claim
//! ([`CLONE_PROTECTION_FINALIZER`]) once it is being deleted, a restore's VolumeSnapshot
//! ([`SNAPSHOT_PROTECTION_FINALIZER`]) once no claim still needs it. Upstream's rules, plus
//! ours: while an operation in the journal names the source in its recorded CreateVolume
//! request, the finalizer stays, since that request is replayed (by the claim reconciler, or by
//! the orphan reaper once its claim is gone) and the driver reads the source again.

use std::collections::HashSet;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;

use crate::api::VolumeSnapshot;
use crate::csi;
use crate::csi::volume_content_source::Type;

use super::claim::storage_provisioner;
use super::data_source::{
    CLAIM_KIND, CLONE_PROTECTION_FINALIZER, SNAPSHOT_API_GROUP, SNAPSHOT_KIND,
    SNAPSHOT_PROTECTION_FINALIZER,
};

/// The sources the operations in flight read: the recorded requests' `volume_content_source`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct InFlightSources {
    volumes: HashSet<String>,
    snapshots: HashSet<String>,
}

impl InFlightSources {
    pub fn new<'a>(sources: impl IntoIterator<Item = &'a csi::VolumeContentSource>) -> Self {
        let mut in_flight = InFlightSources::default();
        for source in sources {
            match &source.r#type {
                Some(Type::Volume(volume)) => {
                    in_flight.volumes.insert(volume.volume_id.clone());
                }
                Some(Type::Snapshot(snapshot)) => {
                    in_flight.snapshots.insert(snapshot.snapshot_id.clone());
                }
                None => {}
            }
        }
        in_flight
    }

    /// Whether any operation in flight restores a snapshot: only then is a snapshot's content
    /// worth reading to learn its handle.
    pub fn restores_any(&self) -> bool {
        !self.snapshots.is_empty()
    }
}

/// Whether a claim's protection finalizer may come off, or why it stays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloneVerdict {
    /// Not being deleted, or not carrying the finalizer: nothing to do.
    Untouched,
    Keep(CloneHold),
    Release,
}

/// What still reads a clone source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloneHold {
    /// Upstream's rule: a clone of it is still Pending (`namespace/name`).
    PendingClone(String),
    /// Ours: an operation in the journal clones this volume.
    InFlight { volume_id: String },
    /// Ours: the source's volume handle is unknown (its PV is not cached), and some operation
    /// in flight clones a volume, which may be this one.
    UnknownVolume,
}

impl std::fmt::Display for CloneHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CloneHold::PendingClone(claim) => {
                write!(
                    f,
                    "PVC '{claim}' is in 'Pending' state, cloning in progress"
                )
            }
            CloneHold::InFlight { volume_id } => write!(
                f,
                "an operation in the journal clones volume {volume_id:?}; the driver may read it again"
            ),
            CloneHold::UnknownVolume => write!(
                f,
                "the source's volume is not known and operations in the journal clone volumes"
            ),
        }
    }
}

/// The source claim's PV, as the cache knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceVolume<'a> {
    /// `spec.csi.driver`.
    pub driver: &'a str,
    /// `spec.csi.volumeHandle`.
    pub handle: &'a str,
}

/// Whether `source`'s [`CLONE_PROTECTION_FINALIZER`] may come off. `claims` are all claims
/// known (any namespace: a clone through `dataSourceRef.namespace` holds its source too,
/// where upstream looks at the source's namespace only, its quirk A2); `volume` is the
/// source's PV, if known. A source whose volume is another driver's (or, its PV unknown, whose
/// provisioner is) is left to that driver's sidecar: only its journal knows whether a clone
/// still reads the volume (upstream's controller releases any claim of any driver).
pub fn clone_verdict<'a>(
    source: &PersistentVolumeClaim,
    claims: impl IntoIterator<Item = &'a PersistentVolumeClaim>,
    volume: Option<SourceVolume<'_>>,
    our_driver: &str,
    in_flight: &InFlightSources,
) -> CloneVerdict {
    // Ours if its PV is our driver's, or (PV not known here) the claim names our driver as
    // its provisioner.
    let ours = match volume {
        Some(volume) => volume.driver == our_driver,
        None => storage_provisioner(source) == Some(our_driver),
    };
    if source.metadata.deletion_timestamp.is_none()
        || !has_finalizer(&source.metadata.finalizers, CLONE_PROTECTION_FINALIZER)
        || !ours
    {
        return CloneVerdict::Untouched;
    }
    let key = object_key(
        source.metadata.namespace.as_deref(),
        source.metadata.name.as_deref(),
    );
    let pending_clone = claims
        .into_iter()
        .filter(|claim| is_pending(claim))
        .find(|claim| clone_source_key(claim).as_deref() == Some(key.as_str()));
    if let Some(clone) = pending_clone {
        let clone = object_key(
            clone.metadata.namespace.as_deref(),
            clone.metadata.name.as_deref(),
        );
        return CloneVerdict::Keep(CloneHold::PendingClone(clone));
    }
    match volume.map(|volume| volume.handle) {
        Some(handle) if in_flight.volumes.contains(handle) => {
            CloneVerdict::Keep(CloneHold::InFlight {
                volume_id: handle.to_owned(),
            })
        }
        None if !in_flight.volumes.is_empty() => CloneVerdict::Keep(CloneHold::UnknownVolume),
        _ => CloneVerdict::Release,
    }
}

/// `namespace/name` of the claim a claim clones: `spec.dataSource` of kind
/// PersistentVolumeClaim (any group, as upstream), else `spec.dataSourceRef` of that kind, in
/// its namespace if it names one.
fn clone_source_key(claim: &PersistentVolumeClaim) -> Option<String> {
    source_key(claim, |kind, _| kind == CLAIM_KIND)
}

/// Whether a claim may still be waiting for its volume. The API server defaults the phase
/// to Pending at create; an unset one (never seen from an API server) counts as Pending too,
/// as upstream's snapshot sweeper counts it: a claim nobody has seen provisioned may still be.
fn is_pending(claim: &PersistentVolumeClaim) -> bool {
    let phase = claim
        .status
        .as_ref()
        .and_then(|status| status.phase.as_deref());
    matches!(phase, None | Some("") | Some("Pending"))
}

/// The snapshots Pending claims restore from, as `namespace/name` (upstream's index).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PendingRestores(HashSet<String>);

impl PendingRestores {
    /// From every claim in the cluster (any class, any driver, as upstream): those whose phase
    /// is Pending or unset and whose `spec.dataSource` is a VolumeSnapshot (group unset or
    /// snapshot.storage.k8s.io), else whose `spec.dataSourceRef` is one (in the ref's
    /// namespace if it names one).
    pub fn new<'a>(claims: impl IntoIterator<Item = &'a PersistentVolumeClaim>) -> Self {
        PendingRestores(
            claims
                .into_iter()
                .filter(|claim| is_pending(claim))
                .filter_map(|claim| {
                    source_key(claim, |kind, group| {
                        kind == SNAPSHOT_KIND && matches!(group, None | Some(SNAPSHOT_API_GROUP))
                    })
                })
                .collect(),
        )
    }
}

/// Whether a VolumeSnapshot's [`SNAPSHOT_PROTECTION_FINALIZER`] may come off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SnapshotVerdict {
    /// It does not carry the finalizer.
    Untouched,
    Keep(SnapshotHold),
    Release,
}

/// What still reads a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SnapshotHold {
    /// Upstream's rule: a Pending claim restores from it (`namespace/name`).
    PendingRestore,
    /// Ours: an operation in the journal restores from its handle.
    InFlight { snapshot_id: String },
    /// Ours: its handle could not be learnt, and operations in flight restore snapshots.
    UnknownHandle,
}

impl std::fmt::Display for SnapshotHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SnapshotHold::PendingRestore => write!(f, "a Pending claim restores from it"),
            SnapshotHold::InFlight { snapshot_id } => write!(
                f,
                "an operation in the journal restores from snapshot {snapshot_id:?}; the driver may read it again"
            ),
            SnapshotHold::UnknownHandle => write!(
                f,
                "its handle is not known and operations in the journal restore snapshots"
            ),
        }
    }
}

/// A snapshot's bound content, as the sweep listed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotContent<'a> {
    /// The content's `spec.driver` and `status.snapshotHandle`.
    Listed {
        driver: &'a str,
        handle: Option<&'a str>,
    },
    /// No content is bound, or the bound one is gone: no restore can read a handle from it.
    Missing,
    /// The contents could not be listed.
    Unknown,
}

/// Whether `snapshot`'s [`SNAPSHOT_PROTECTION_FINALIZER`] may come off. A snapshot of another
/// driver is left to that driver's sidecar, whose journal alone knows whether a restore still
/// reads it (upstream's sweeper releases any driver's snapshot); one whose content could not be
/// listed waits for the next sweep.
pub fn snapshot_verdict(
    snapshot: &VolumeSnapshot,
    pending: &PendingRestores,
    in_flight: &InFlightSources,
    content: SnapshotContent<'_>,
    our_driver: &str,
) -> SnapshotVerdict {
    if !has_finalizer(&snapshot.metadata.finalizers, SNAPSHOT_PROTECTION_FINALIZER) {
        return SnapshotVerdict::Untouched;
    }
    match content {
        SnapshotContent::Listed { driver, .. } if driver != our_driver => {
            return SnapshotVerdict::Untouched;
        }
        SnapshotContent::Unknown => return SnapshotVerdict::Keep(SnapshotHold::UnknownHandle),
        _ => {}
    }
    let key = object_key(
        snapshot.metadata.namespace.as_deref(),
        snapshot.metadata.name.as_deref(),
    );
    if pending.0.contains(&key) {
        return SnapshotVerdict::Keep(SnapshotHold::PendingRestore);
    }
    match content {
        SnapshotContent::Listed {
            handle: Some(handle),
            ..
        } if in_flight.snapshots.contains(handle) => {
            SnapshotVerdict::Keep(SnapshotHold::InFlight {
                snapshot_id: handle.to_owned(),
            })
        }
        _ => SnapshotVerdict::Release,
    }
}

/// `namespace/name` of the object a claim's `spec.dataSource` names if `wanted(kind, group)`,
/// else of the one its `spec.dataSourceRef` names if `wanted`.
fn source_key(
    claim: &PersistentVolumeClaim,
    wanted: impl Fn(&str, Option<&str>) -> bool,
) -> Option<String> {
    let spec = claim.spec.as_ref()?;
    let namespace = claim.metadata.namespace.as_deref();
    if let Some(source) = spec.data_source.as_ref()
        && wanted(&source.kind, source.api_group.as_deref())
    {
        return Some(object_key(namespace, Some(&source.name)));
    }
    let source = spec.data_source_ref.as_ref()?;
    if !wanted(&source.kind, source.api_group.as_deref()) {
        return None;
    }
    let namespace = source
        .namespace
        .as_deref()
        .filter(|ns| !ns.is_empty())
        .or(namespace);
    Some(object_key(namespace, Some(&source.name)))
}

fn object_key(namespace: Option<&str>, name: Option<&str>) -> String {
    format!(
        "{}/{}",
        namespace.unwrap_or_default(),
        name.unwrap_or_default()
    )
}

fn has_finalizer(finalizers: &Option<Vec<String>>, finalizer: &str) -> bool {
    finalizers.iter().flatten().any(|f| f == finalizer)
}

#[cfg(test)]
mod tests;
