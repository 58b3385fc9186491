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
mod tests {
    use super::*;
    use crate::api::VolumeSnapshotStatus;
    use crate::csi::volume_content_source::{SnapshotSource, VolumeSource};
    use crate::fixtures::{DRIVER, PvcBuilder};

    fn ours(handle: &str) -> Option<SourceVolume<'_>> {
        Some(SourceVolume {
            driver: DRIVER,
            handle,
        })
    }
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
            .annotation(crate::ANN_STORAGE_PROVISIONER, DRIVER)
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
            clone_verdict(&alive, [], None, DRIVER, &none),
            CloneVerdict::Untouched
        );
        let unprotected = PvcBuilder::new().name("src").deleting().build();
        assert_eq!(
            clone_verdict(&unprotected, [], None, DRIVER, &none),
            CloneVerdict::Untouched
        );
    }

    #[test]
    fn a_pending_clone_holds_its_source_with_upstreams_text() {
        let clone = clone_of("src", "Pending").build();
        let verdict = clone_verdict(
            &source(),
            [&clone],
            ours("vol-1"),
            DRIVER,
            &Default::default(),
        );
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
                ours("vol-1"),
                DRIVER,
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
            clone_verdict(
                &source(),
                [&clone],
                ours("vol-1"),
                DRIVER,
                &Default::default()
            ),
            CloneVerdict::Keep(CloneHold::PendingClone("other-ns/copy".into()))
        );
    }

    #[test]
    fn an_operation_in_flight_cloning_the_volume_holds_it() {
        let in_flight = InFlightSources::new(&[cloning("vol-1"), restoring("snap-1")]);
        assert_eq!(
            clone_verdict(&source(), [], ours("vol-1"), DRIVER, &in_flight),
            CloneVerdict::Keep(CloneHold::InFlight {
                volume_id: "vol-1".into()
            })
        );
        assert_eq!(
            clone_verdict(&source(), [], ours("vol-2"), DRIVER, &in_flight),
            CloneVerdict::Release
        );
        let foreign = SourceVolume {
            driver: "other.example.com",
            handle: "vol-1",
        };
        assert_eq!(
            clone_verdict(&source(), [], Some(foreign), DRIVER, &Default::default()),
            CloneVerdict::Untouched,
            "another driver's sidecar decides for its volumes"
        );
        let mut foreign_claim = source();
        foreign_claim.metadata.annotations = Some(
            [(
                crate::ANN_STORAGE_PROVISIONER.to_owned(),
                "other.example.com".to_owned(),
            )]
            .into(),
        );
        assert_eq!(
            clone_verdict(&foreign_claim, [], None, DRIVER, &Default::default()),
            CloneVerdict::Untouched,
            "a claim of another provisioner whose PV is not known here is not ours either"
        );
        assert_eq!(
            clone_verdict(&source(), [], None, DRIVER, &in_flight),
            CloneVerdict::Keep(CloneHold::UnknownVolume),
            "an unknown volume may be the one cloned"
        );
        let restores_only = InFlightSources::new(&[restoring("snap-1")]);
        assert_eq!(
            clone_verdict(&source(), [], None, DRIVER, &restores_only),
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

    fn our_content(handle: Option<&str>) -> SnapshotContent<'_> {
        SnapshotContent::Listed {
            driver: DRIVER,
            handle,
        }
    }

    #[test]
    fn a_snapshot_a_pending_claim_restores_is_kept_and_others_released() {
        let claims = [restore_of("Pending")
            .data_source(None, SNAPSHOT_KIND, "wanted")
            .build()];
        let pending = PendingRestores::new(&claims);
        let none = InFlightSources::default();
        let verdict = |snap: &VolumeSnapshot| {
            snapshot_verdict(snap, &pending, &none, our_content(Some("snap-1")), DRIVER)
        };
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
        let verdict = |content| snapshot_verdict(&snap, &pending, &in_flight, content, DRIVER);
        assert_eq!(
            verdict(our_content(Some("snap-1"))),
            SnapshotVerdict::Keep(SnapshotHold::InFlight {
                snapshot_id: "snap-1".into()
            })
        );
        assert_eq!(
            verdict(our_content(Some("snap-2"))),
            SnapshotVerdict::Release
        );
        assert_eq!(verdict(our_content(None)), SnapshotVerdict::Release);
        assert_eq!(verdict(SnapshotContent::Missing), SnapshotVerdict::Release);
        assert_eq!(
            verdict(SnapshotContent::Unknown),
            SnapshotVerdict::Keep(SnapshotHold::UnknownHandle)
        );
    }

    #[test]
    fn another_drivers_snapshot_is_left_to_its_sidecar() {
        let pending = PendingRestores::default();
        let none = InFlightSources::default();
        let foreign = SnapshotContent::Listed {
            driver: "other.example.com",
            handle: Some("snap-1"),
        };
        assert_eq!(
            snapshot_verdict(
                &snapshot("s", Some("c"), true),
                &pending,
                &none,
                foreign,
                DRIVER
            ),
            SnapshotVerdict::Untouched
        );
    }
}
