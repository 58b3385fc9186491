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

/// Whether `source`'s [`CLONE_PROTECTION_FINALIZER`] may come off. `claims` are all claims
/// known (any namespace: a clone through `dataSourceRef.namespace` holds its source too,
/// where upstream looks at the source's namespace only, its quirk A2); `volume_handle` is the
/// source's PV's `spec.csi.volumeHandle`, if known.
pub fn clone_verdict<'a>(
    source: &PersistentVolumeClaim,
    claims: impl IntoIterator<Item = &'a PersistentVolumeClaim>,
    volume_handle: Option<&str>,
    in_flight: &InFlightSources,
) -> CloneVerdict {
    if source.metadata.deletion_timestamp.is_none()
        || !has_finalizer(&source.metadata.finalizers, CLONE_PROTECTION_FINALIZER)
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
    match volume_handle {
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
    /// Operations in flight restore snapshots: read the snapshot's content for its handle,
    /// then decide again with it.
    ReadContent(String),
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

/// What the executor learnt of a snapshot's content, when asked to ([`SnapshotVerdict::ReadContent`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentHandle<'a> {
    /// Not read yet.
    NotRead,
    /// The content's `status.snapshotHandle` (`None`: the content has none, or no content is
    /// bound).
    Read(Option<&'a str>),
    /// Reading the content failed.
    Unknown,
}

/// Whether `snapshot`'s [`SNAPSHOT_PROTECTION_FINALIZER`] may come off.
pub fn snapshot_verdict(
    snapshot: &VolumeSnapshot,
    pending: &PendingRestores,
    in_flight: &InFlightSources,
    content: ContentHandle<'_>,
) -> SnapshotVerdict {
    if !has_finalizer(&snapshot.metadata.finalizers, SNAPSHOT_PROTECTION_FINALIZER) {
        return SnapshotVerdict::Untouched;
    }
    let key = object_key(
        snapshot.metadata.namespace.as_deref(),
        snapshot.metadata.name.as_deref(),
    );
    if pending.0.contains(&key) {
        return SnapshotVerdict::Keep(SnapshotHold::PendingRestore);
    }
    if !in_flight.restores_any() {
        return SnapshotVerdict::Release;
    }
    let bound_content = snapshot
        .status
        .as_ref()
        .and_then(|status| status.bound_volume_snapshot_content_name.clone());
    match (content, bound_content) {
        // No content bound: no restore can have read a handle from it.
        (ContentHandle::NotRead, None) => SnapshotVerdict::Release,
        (ContentHandle::NotRead, Some(content)) => SnapshotVerdict::ReadContent(content),
        (ContentHandle::Read(Some(handle)), _) if in_flight.snapshots.contains(handle) => {
            SnapshotVerdict::Keep(SnapshotHold::InFlight {
                snapshot_id: handle.to_owned(),
            })
        }
        (ContentHandle::Read(_), _) => SnapshotVerdict::Release,
        (ContentHandle::Unknown, _) => SnapshotVerdict::Keep(SnapshotHold::UnknownHandle),
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
mod tests {
    use super::*;
    use crate::api::VolumeSnapshotStatus;
    use crate::csi::volume_content_source::{SnapshotSource, VolumeSource};
    use crate::provision::fixtures::PvcBuilder;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn cloning(volume_id: &str) -> csi::VolumeContentSource {
        csi::VolumeContentSource {
            r#type: Some(Type::Volume(VolumeSource {
                volume_id: volume_id.to_owned(),
            })),
        }
    }

    fn restoring(snapshot_id: &str) -> csi::VolumeContentSource {
        csi::VolumeContentSource {
            r#type: Some(Type::Snapshot(SnapshotSource {
                snapshot_id: snapshot_id.to_owned(),
            })),
        }
    }

    /// Claim `apps/src`, being deleted, with the clone finalizer.
    fn source() -> PersistentVolumeClaim {
        PvcBuilder::new()
            .name("src")
            .finalizer(CLONE_PROTECTION_FINALIZER)
            .deleting()
            .build()
    }

    fn clone_of(name: &str, phase: &str) -> PvcBuilder {
        PvcBuilder::new()
            .name("copy")
            .phase(phase)
            .data_source(None, CLAIM_KIND, name)
    }

    #[test]
    fn a_source_not_deleted_or_without_the_finalizer_is_untouched() {
        let none = InFlightSources::default();
        let alive = PvcBuilder::new()
            .name("src")
            .finalizer(CLONE_PROTECTION_FINALIZER)
            .build();
        assert_eq!(
            clone_verdict(&alive, [], None, &none),
            CloneVerdict::Untouched
        );
        let unprotected = PvcBuilder::new().name("src").deleting().build();
        assert_eq!(
            clone_verdict(&unprotected, [], None, &none),
            CloneVerdict::Untouched
        );
    }

    #[test]
    fn a_pending_clone_holds_its_source_with_upstreams_text() {
        let clone = clone_of("src", "Pending").build();
        let verdict = clone_verdict(&source(), [&clone], Some("vol-1"), &Default::default());
        assert_eq!(
            verdict,
            CloneVerdict::Keep(CloneHold::PendingClone("apps/copy".into()))
        );
        let CloneVerdict::Keep(hold) = verdict else {
            unreachable!()
        };
        assert_eq!(
            hold.to_string(),
            "PVC 'apps/copy' is in 'Pending' state, cloning in progress"
        );
    }

    #[test]
    fn a_bound_clone_or_a_clone_of_another_claim_holds_nothing() {
        let bound = clone_of("src", "Bound").build();
        let other = clone_of("other", "Pending").build();
        let elsewhere = clone_of("src", "Pending").namespace("other-ns").build();
        assert_eq!(
            clone_verdict(
                &source(),
                [&bound, &other, &elsewhere],
                Some("vol-1"),
                &Default::default()
            ),
            CloneVerdict::Release
        );
    }

    #[test]
    fn a_cross_namespace_clone_holds_its_source_unlike_upstreams_a2() {
        let clone = PvcBuilder::new()
            .name("copy")
            .namespace("other-ns")
            .phase("Pending")
            .data_source_ref(None, CLAIM_KIND, "src", Some("apps"))
            .build();
        assert_eq!(
            clone_verdict(&source(), [&clone], Some("vol-1"), &Default::default()),
            CloneVerdict::Keep(CloneHold::PendingClone("other-ns/copy".into()))
        );
    }

    #[test]
    fn an_operation_in_flight_cloning_the_volume_holds_it() {
        let in_flight = InFlightSources::new(&[cloning("vol-1"), restoring("snap-1")]);
        assert_eq!(
            clone_verdict(&source(), [], Some("vol-1"), &in_flight),
            CloneVerdict::Keep(CloneHold::InFlight {
                volume_id: "vol-1".into()
            })
        );
        assert_eq!(
            clone_verdict(&source(), [], Some("vol-2"), &in_flight),
            CloneVerdict::Release
        );
        assert_eq!(
            clone_verdict(&source(), [], None, &in_flight),
            CloneVerdict::Keep(CloneHold::UnknownVolume),
            "an unknown volume may be the one cloned"
        );
        let restores_only = InFlightSources::new(&[restoring("snap-1")]);
        assert_eq!(
            clone_verdict(&source(), [], None, &restores_only),
            CloneVerdict::Release
        );
    }

    fn snapshot(name: &str, content: Option<&str>, protected: bool) -> VolumeSnapshot {
        VolumeSnapshot {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("apps".into()),
                finalizers: protected.then(|| vec![SNAPSHOT_PROTECTION_FINALIZER.to_owned()]),
                ..ObjectMeta::default()
            },
            status: Some(VolumeSnapshotStatus {
                bound_volume_snapshot_content_name: content.map(str::to_owned),
                ..VolumeSnapshotStatus::default()
            }),
            ..VolumeSnapshot::default()
        }
    }

    fn restore_of(phase: &str) -> PvcBuilder {
        PvcBuilder::new().phase(phase)
    }

    #[test]
    fn pending_or_unset_claims_index_the_snapshots_they_restore() {
        let claims = [
            restore_of("Pending")
                .data_source(Some(SNAPSHOT_API_GROUP), SNAPSHOT_KIND, "a")
                .build(),
            restore_of("").data_source(None, SNAPSHOT_KIND, "b").build(),
            restore_of("Pending")
                .data_source_ref(Some(SNAPSHOT_API_GROUP), SNAPSHOT_KIND, "c", Some("other"))
                .build(),
            restore_of("Pending")
                .data_source_ref(None, SNAPSHOT_KIND, "d", None)
                .build(),
            // Bound, another group, another kind: not indexed.
            restore_of("Bound")
                .data_source(None, SNAPSHOT_KIND, "e")
                .build(),
            restore_of("Pending")
                .data_source(Some("example.com"), SNAPSHOT_KIND, "f")
                .build(),
            restore_of("Pending")
                .data_source(None, CLAIM_KIND, "g")
                .build(),
        ];
        let index = PendingRestores::new(&claims);
        let mut keys: Vec<_> = index.0.iter().cloned().collect();
        keys.sort();
        assert_eq!(keys, ["apps/a", "apps/b", "apps/d", "other/c"]);
    }

    #[test]
    fn a_snapshot_a_pending_claim_restores_is_kept_and_others_released() {
        let claims = [restore_of("Pending")
            .data_source(None, SNAPSHOT_KIND, "wanted")
            .build()];
        let pending = PendingRestores::new(&claims);
        let none = InFlightSources::default();
        let verdict =
            |snap: &VolumeSnapshot| snapshot_verdict(snap, &pending, &none, ContentHandle::NotRead);
        assert_eq!(
            verdict(&snapshot("wanted", Some("c1"), true)),
            SnapshotVerdict::Keep(SnapshotHold::PendingRestore)
        );
        assert_eq!(
            verdict(&snapshot("orphan", Some("c2"), true)),
            SnapshotVerdict::Release
        );
        assert_eq!(
            verdict(&snapshot("orphan", Some("c2"), false)),
            SnapshotVerdict::Untouched
        );
    }

    #[test]
    fn with_restores_in_flight_the_content_handle_decides() {
        let pending = PendingRestores::default();
        let in_flight = InFlightSources::new(&[restoring("snap-1")]);
        let snap = snapshot("s", Some("content-1"), true);
        let verdict = |content| snapshot_verdict(&snap, &pending, &in_flight, content);
        assert_eq!(
            verdict(ContentHandle::NotRead),
            SnapshotVerdict::ReadContent("content-1".into())
        );
        assert_eq!(
            verdict(ContentHandle::Read(Some("snap-1"))),
            SnapshotVerdict::Keep(SnapshotHold::InFlight {
                snapshot_id: "snap-1".into()
            })
        );
        assert_eq!(
            verdict(ContentHandle::Read(Some("snap-2"))),
            SnapshotVerdict::Release
        );
        assert_eq!(verdict(ContentHandle::Read(None)), SnapshotVerdict::Release);
        assert_eq!(
            verdict(ContentHandle::Unknown),
            SnapshotVerdict::Keep(SnapshotHold::UnknownHandle)
        );
        let unbound = snapshot("s", None, true);
        assert_eq!(
            snapshot_verdict(&unbound, &pending, &in_flight, ContentHandle::NotRead),
            SnapshotVerdict::Release
        );
    }
}
