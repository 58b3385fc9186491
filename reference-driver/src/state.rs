//! The driver's durable model (volumes, snapshots, node publications) and the pure decisions that
//! map a validated request onto it. Nothing here does IO; `store` persists a [`State`] and
//! `service` wires decisions to RPCs.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};
use thiserror::Error;
use tonic::Code;

use csi_spec as csi;

use super::topology::{self, Labels, PlacementError, Requirements, Segment, Usage};

/// An RPC failure with its CSI error code; the message is returned to the caller verbatim.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CsiError {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    ResourceExhausted(String),
    #[error("{0}")]
    OutOfRange(String),
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    Aborted(String),
    #[error("{0}")]
    Internal(String),
    #[error("{0}")]
    Unimplemented(String),
    /// A code chosen by a fault rule.
    #[error("{1}")]
    Injected(Code, String),
}

impl CsiError {
    pub fn code(&self) -> Code {
        match self {
            Self::InvalidArgument(_) => Code::InvalidArgument,
            Self::NotFound(_) => Code::NotFound,
            Self::AlreadyExists(_) => Code::AlreadyExists,
            Self::ResourceExhausted(_) => Code::ResourceExhausted,
            Self::OutOfRange(_) => Code::OutOfRange,
            Self::FailedPrecondition(_) => Code::FailedPrecondition,
            Self::Aborted(_) => Code::Aborted,
            Self::Internal(_) => Code::Internal,
            Self::Unimplemented(_) => Code::Unimplemented,
            Self::Injected(code, _) => *code,
        }
    }
}

impl From<CsiError> for tonic::Status {
    fn from(e: CsiError) -> Self {
        tonic::Status::new(e.code(), e.to_string())
    }
}

/// How a volume is consumed. A volume serves exactly one kind for its whole life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AccessKind {
    Mount,
    Block,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ContentSource {
    Snapshot(String),
    Volume(String),
}

impl ContentSource {
    pub fn to_csi(&self) -> csi::VolumeContentSource {
        use csi::volume_content_source::{SnapshotSource, Type, VolumeSource};
        let source = match self {
            Self::Snapshot(id) => Type::Snapshot(SnapshotSource {
                snapshot_id: id.clone(),
            }),
            Self::Volume(id) => Type::Volume(VolumeSource {
                volume_id: id.clone(),
            }),
        };
        csi::VolumeContentSource {
            r#type: Some(source),
        }
    }
}

/// One NodePublishVolume target.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Publication {
    pub access: AccessKind,
    pub readonly: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeRecord {
    pub id: String,
    pub name: String,
    pub capacity_bytes: i64,
    pub access: AccessKind,
    #[serde(default)]
    pub parameters: BTreeMap<String, String>,
    /// CreateVolume's `mutable_parameters` (only with `--modify-volume`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub mutable_parameters: BTreeMap<String, String>,
    #[serde(default)]
    pub source: Option<ContentSource>,
    /// The labels of the segment the volume was created in; empty when the driver runs without
    /// topology.
    #[serde(default)]
    pub topology: Labels,
    /// Keyed by target path.
    #[serde(default)]
    pub publications: BTreeMap<String, Publication>,
    /// NodeStageVolume staging paths, keyed by path (absent in files of earlier releases).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub stagings: BTreeMap<String, Staging>,
}

/// One NodeStageVolume staging path.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Staging {
    pub access: AccessKind,
}

impl VolumeRecord {
    pub fn to_csi(&self) -> csi::Volume {
        csi::Volume {
            capacity_bytes: self.capacity_bytes,
            volume_id: self.id.clone(),
            volume_context: to_hash_map(&self.parameters),
            content_source: self.source.as_ref().map(ContentSource::to_csi),
            accessible_topology: if self.topology.is_empty() {
                Vec::new()
            } else {
                vec![to_csi_topology(&self.topology)]
            },
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRecord {
    pub id: String,
    pub name: String,
    pub source_volume_id: String,
    pub size_bytes: i64,
    pub created_secs: i64,
    pub created_nanos: i32,
    /// The segment its source volume was in when it was taken (empty without topology, and in
    /// state files written before this field existed); a restore goes there if it may.
    #[serde(default)]
    pub topology: Labels,
}

impl SnapshotRecord {
    pub fn to_csi(&self) -> csi::Snapshot {
        csi::Snapshot {
            size_bytes: self.size_bytes,
            snapshot_id: self.id.clone(),
            source_volume_id: self.source_volume_id.clone(),
            creation_time: Some(prost_types::Timestamp {
                seconds: self.created_secs,
                nanos: self.created_nanos,
            }),
            ready_to_use: true,
            group_snapshot_id: String::new(),
        }
    }
}

/// Everything the driver remembers; this is what `state.json` holds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    #[serde(default)]
    pub volumes: BTreeMap<String, VolumeRecord>,
    #[serde(default)]
    pub snapshots: BTreeMap<String, SnapshotRecord>,
}

impl State {
    pub fn volume_by_name(&self, name: &str) -> Option<&VolumeRecord> {
        self.volumes.values().find(|v| v.name == name)
    }

    pub fn snapshot_by_name(&self, name: &str) -> Option<&SnapshotRecord> {
        self.snapshots.values().find(|s| s.name == name)
    }

    /// Bytes in use per segment.
    pub fn usage(&self) -> Usage {
        Usage::tally(
            self.volumes
                .values()
                .map(|v| (&v.topology, v.capacity_bytes)),
        )
    }
}

/// Where volumes may go and how big one may be, from the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// In configured order, which is the order of preference without requirements. Never empty:
    /// a driver without topology has one unlabelled segment.
    pub segments: Vec<Segment>,
    pub max_volume_size: i64,
}

/// The optional controller features this driver serves; tests turn them off to see how a
/// sidecar copes with a driver without them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Features {
    /// CREATE_DELETE_SNAPSHOT, LIST_SNAPSHOTS, GET_SNAPSHOT and restores (`--no-snapshots`).
    pub snapshots: bool,
    /// CLONE_VOLUME (`--no-clone`).
    pub clone: bool,
    /// GET_CAPACITY (`--no-get-capacity`).
    pub get_capacity: bool,
    /// MODIFY_VOLUME, and CreateVolume's `mutable_parameters` (`--modify-volume`).
    pub modify_volume: bool,
}

impl Default for Features {
    fn default() -> Self {
        Self {
            snapshots: true,
            clone: true,
            get_capacity: true,
            modify_volume: false,
        }
    }
}

/// Size of a volume created without any capacity range or source.
pub const DEFAULT_VOLUME_SIZE: i64 = 1 << 30;

/// A CreateVolume request that passed argument validation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreateVolumeArgs {
    pub name: String,
    pub required_bytes: i64,
    pub limit_bytes: i64,
    pub access: AccessKind,
    pub parameters: BTreeMap<String, String>,
    pub mutable_parameters: BTreeMap<String, String>,
    pub source: Option<ContentSource>,
    pub requirements: Requirements,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CreateVolumeDecision {
    /// The name already exists with compatible arguments: reply with it unchanged.
    Existing(VolumeRecord),
    /// Add this record.
    Create(VolumeRecord),
}

/// Decides CreateVolume. The order of checks matters for the CSI error contract: an existing name
/// is judged only on compatibility (so a retry succeeds even when capacity has run out since), a
/// requisite no segment serves fails before the source is looked up, and a missing source is
/// NOT_FOUND before any size check. A restore or clone must not ask for less than its source
/// holds (OUT_OF_RANGE). The new volume goes to the first segment [`topology::candidates`]
/// offers that still has room, trying the source's segment first when it is among them.
pub fn decide_create_volume(
    state: &State,
    args: &CreateVolumeArgs,
    limits: &Limits,
    new_id: String,
) -> Result<CreateVolumeDecision, CsiError> {
    if let Some(existing) = state.volume_by_name(&args.name) {
        return check_compatible(existing, args)
            .map(|()| CreateVolumeDecision::Existing(existing.clone()));
    }
    let mut candidates = topology::candidates(&limits.segments, &args.requirements);
    if candidates.is_empty() {
        return Err(placement_error(PlacementError::NoMatchingSegment {
            requisite: args.requirements.requisite.clone(),
        }));
    }
    let (source_size, source_segment) = match &args.source {
        None => (0, None),
        Some(ContentSource::Snapshot(id)) => state
            .snapshots
            .get(id)
            .map(|s| (s.size_bytes, Some(&s.topology)))
            .ok_or_else(|| CsiError::NotFound(format!("source snapshot {id} does not exist")))?,
        Some(ContentSource::Volume(id)) => {
            let source = state
                .volumes
                .get(id)
                .ok_or_else(|| CsiError::NotFound(format!("source volume {id} does not exist")))?;
            if source.access != args.access {
                return Err(CsiError::InvalidArgument(format!(
                    "source volume {id} has {:?} access, the clone asks for {:?}",
                    source.access, args.access
                )));
            }
            (source.capacity_bytes, Some(&source.topology))
        }
    };
    if args.required_bytes > 0 && args.required_bytes < source_size {
        return Err(CsiError::OutOfRange(format!(
            "required_bytes {} is less than the {source_size} bytes of the source",
            args.required_bytes
        )));
    }
    if let Some(labels) = source_segment {
        topology::try_first(&mut candidates, labels);
    }
    let wanted = args.required_bytes.max(source_size);
    let size = match (wanted, args.limit_bytes) {
        (0, 0) => DEFAULT_VOLUME_SIZE.min(limits.max_volume_size),
        (0, limit) => DEFAULT_VOLUME_SIZE.min(limit),
        (wanted, _) => wanted,
    };
    if args.limit_bytes > 0 && size > args.limit_bytes {
        return Err(CsiError::OutOfRange(format!(
            "the source holds {source_size} bytes, more than limit_bytes {}",
            args.limit_bytes
        )));
    }
    if size > limits.max_volume_size {
        return Err(CsiError::OutOfRange(format!(
            "{size} bytes exceeds the maximum volume size of {} bytes",
            limits.max_volume_size
        )));
    }
    let segment = topology::choose(
        &candidates,
        &state.usage(),
        size,
        &args.requirements.requisite,
    )
    .map_err(placement_error)?;
    Ok(CreateVolumeDecision::Create(VolumeRecord {
        id: new_id,
        name: args.name.clone(),
        capacity_bytes: size,
        access: args.access,
        parameters: args.parameters.clone(),
        mutable_parameters: args.mutable_parameters.clone(),
        source: args.source.clone(),
        topology: segment.labels.clone(),
        publications: BTreeMap::new(),
        stagings: BTreeMap::new(),
    }))
}

/// Both ways of not finding room are RESOURCE_EXHAUSTED: the spec's code for "unable to
/// provision in accessible_topology", which is what lets a CO pick another node and retry.
fn placement_error(error: PlacementError) -> CsiError {
    CsiError::ResourceExhausted(error.to_string())
}

fn check_compatible(existing: &VolumeRecord, args: &CreateVolumeArgs) -> Result<(), CsiError> {
    let conflict = |what: String| {
        Err(CsiError::AlreadyExists(format!(
            "volume {:?} already exists as {} with a different {what}",
            args.name, existing.id
        )))
    };
    if existing.capacity_bytes < args.required_bytes
        || (args.limit_bytes > 0 && existing.capacity_bytes > args.limit_bytes)
    {
        return conflict(format!(
            "size ({} bytes, requested {}..{})",
            existing.capacity_bytes, args.required_bytes, args.limit_bytes
        ));
    }
    if existing.access != args.access {
        return conflict("access type".into());
    }
    if existing.parameters != args.parameters {
        return conflict("parameter set".into());
    }
    if existing.mutable_parameters != args.mutable_parameters {
        return conflict("mutable parameter set".into());
    }
    if existing.source != args.source {
        return conflict("content source".into());
    }
    if !topology::allowed_by(&existing.topology, &args.requirements.requisite) {
        return conflict(format!(
            "accessible topology ({:?}, not in the requisite)",
            existing.topology
        ));
    }
    Ok(())
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CreateSnapshotDecision {
    Existing(SnapshotRecord),
    Create(SnapshotRecord),
}

pub fn decide_create_snapshot(
    state: &State,
    name: &str,
    source_volume_id: &str,
    new_id: String,
    now: (i64, i32),
) -> Result<CreateSnapshotDecision, CsiError> {
    if let Some(existing) = state.snapshot_by_name(name) {
        if existing.source_volume_id == source_volume_id {
            return Ok(CreateSnapshotDecision::Existing(existing.clone()));
        }
        return Err(CsiError::AlreadyExists(format!(
            "snapshot {name:?} already exists as {} of volume {}",
            existing.id, existing.source_volume_id
        )));
    }
    let source = state.volumes.get(source_volume_id).ok_or_else(|| {
        CsiError::NotFound(format!("source volume {source_volume_id} does not exist"))
    })?;
    Ok(CreateSnapshotDecision::Create(SnapshotRecord {
        id: new_id,
        name: name.to_string(),
        source_volume_id: source_volume_id.to_string(),
        size_bytes: source.capacity_bytes,
        created_secs: now.0,
        created_nanos: now.1,
        topology: source.topology.clone(),
    }))
}

/// GetSnapshot: the snapshot, or NOT_FOUND.
pub fn find_snapshot<'a>(state: &'a State, id: &str) -> Result<&'a SnapshotRecord, CsiError> {
    state
        .snapshots
        .get(id)
        .ok_or_else(|| CsiError::NotFound(format!("snapshot {id} does not exist")))
}

/// ListSnapshots before paging: the snapshots, ordered by id, that match both filters (an
/// empty filter matches everything; an unknown id matches nothing, which is not an error).
pub fn filter_snapshots(
    state: &State,
    snapshot_id: &str,
    source_volume_id: &str,
) -> Vec<SnapshotRecord> {
    state
        .snapshots
        .values()
        .filter(|s| snapshot_id.is_empty() || s.id == snapshot_id)
        .filter(|s| source_volume_id.is_empty() || s.source_volume_id == source_volume_id)
        .cloned()
        .collect()
}

/// DeleteVolume: `Ok(None)` means "already gone, nothing to do".
pub fn decide_delete_volume(state: &State, id: &str) -> Result<Option<VolumeRecord>, CsiError> {
    let Some(volume) = state.volumes.get(id) else {
        return Ok(None);
    };
    if let Some(target) = volume.publications.keys().next() {
        return Err(CsiError::FailedPrecondition(format!(
            "volume {id} is still published at {target}"
        )));
    }
    if let Some(path) = volume.stagings.keys().next() {
        return Err(CsiError::FailedPrecondition(format!(
            "volume {id} is still staged at {path}"
        )));
    }
    Ok(Some(volume.clone()))
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PublishDecision {
    AlreadyPublished,
    Publish,
}

pub fn decide_node_publish(
    state: &State,
    volume_id: &str,
    target: &str,
    wanted: &Publication,
) -> Result<PublishDecision, CsiError> {
    let volume = state
        .volumes
        .get(volume_id)
        .ok_or_else(|| CsiError::NotFound(format!("volume {volume_id} does not exist")))?;
    if volume.access != wanted.access {
        return Err(CsiError::InvalidArgument(format!(
            "volume {volume_id} was created for {:?} access, not {:?}",
            volume.access, wanted.access
        )));
    }
    match volume.publications.get(target) {
        Some(existing) if existing == wanted => Ok(PublishDecision::AlreadyPublished),
        Some(_) => Err(CsiError::AlreadyExists(format!(
            "volume {volume_id} is already published at {target} with a different capability or readonly flag"
        ))),
        None => Ok(PublishDecision::Publish),
    }
}

/// NodeUnpublishVolume: the publication to undo, or `None` when the target is not ours.
pub fn decide_node_unpublish(
    state: &State,
    volume_id: &str,
    target: &str,
) -> Result<Option<Publication>, CsiError> {
    let volume = state
        .volumes
        .get(volume_id)
        .ok_or_else(|| CsiError::NotFound(format!("volume {volume_id} does not exist")))?;
    Ok(volume.publications.get(target).cloned())
}

/// One page of a listing. Tokens are decimal offsets into the id-ordered list; anything else,
/// or an offset past the end, is ABORTED as the spec requires for an invalid starting_token.
pub fn page<T: Clone>(
    items: &[T],
    max_entries: i32,
    starting_token: &str,
) -> Result<(Vec<T>, String), CsiError> {
    let max = usize::try_from(max_entries).map_err(|_| {
        CsiError::InvalidArgument(format!(
            "max_entries must not be negative, got {max_entries}"
        ))
    })?;
    let start = if starting_token.is_empty() {
        0
    } else {
        match starting_token.parse::<usize>() {
            Ok(n) if n <= items.len() => n,
            _ => {
                return Err(CsiError::Aborted(format!(
                    "invalid starting_token {starting_token:?}"
                )));
            }
        }
    };
    let end = if max == 0 {
        items.len()
    } else {
        start.saturating_add(max).min(items.len())
    };
    let next = if end < items.len() {
        end.to_string()
    } else {
        String::new()
    };
    Ok((items[start..end].to_vec(), next))
}

pub fn to_hash_map(map: &BTreeMap<String, String>) -> HashMap<String, String> {
    map.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

pub fn to_csi_topology(labels: &Labels) -> csi::Topology {
    csi::Topology {
        segments: to_hash_map(labels),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GI: i64 = 1 << 30;

    fn limits() -> Limits {
        Limits {
            segments: vec![Segment::unlabelled(100 * GI)],
            max_volume_size: 50 * GI,
        }
    }

    fn args(name: &str, required: i64, limit: i64) -> CreateVolumeArgs {
        CreateVolumeArgs {
            name: name.into(),
            required_bytes: required,
            limit_bytes: limit,
            access: AccessKind::Mount,
            parameters: BTreeMap::new(),
            mutable_parameters: BTreeMap::new(),
            source: None,
            requirements: Requirements::default(),
        }
    }

    fn create(state: &mut State, a: &CreateVolumeArgs, id: &str) -> Result<VolumeRecord, CsiError> {
        create_in(state, a, &limits(), id)
    }

    fn create_in(
        state: &mut State,
        a: &CreateVolumeArgs,
        limits: &Limits,
        id: &str,
    ) -> Result<VolumeRecord, CsiError> {
        match decide_create_volume(state, a, limits, id.into())? {
            CreateVolumeDecision::Existing(v) => Ok(v),
            CreateVolumeDecision::Create(v) => {
                state.volumes.insert(v.id.clone(), v.clone());
                Ok(v)
            }
        }
    }

    #[test]
    fn create_is_idempotent_by_name() {
        let mut state = State::default();
        let first = create(&mut state, &args("a", 10 * GI, 0), "vol-1").unwrap();
        let again = create(&mut state, &args("a", 10 * GI, 0), "vol-2").unwrap();
        assert_eq!(first, again);
        assert_eq!(state.volumes.len(), 1);
        // A smaller request is still satisfied by the existing volume.
        let smaller = create(&mut state, &args("a", GI, 0), "vol-3").unwrap();
        assert_eq!(smaller.id, "vol-1");
    }

    #[test]
    fn incompatible_reuse_is_already_exists() {
        let mut state = State::default();
        create(&mut state, &args("a", 10 * GI, 10 * GI), "vol-1").unwrap();
        let bigger = create(&mut state, &args("a", 20 * GI, 20 * GI), "vol-2");
        assert!(
            matches!(bigger, Err(CsiError::AlreadyExists(_))),
            "{bigger:?}"
        );
        let mut block = args("a", 10 * GI, 0);
        block.access = AccessKind::Block;
        assert!(matches!(
            create(&mut state, &block, "x"),
            Err(CsiError::AlreadyExists(_))
        ));
        let mut params = args("a", 10 * GI, 0);
        params.parameters.insert("type".into(), "fast".into());
        assert!(matches!(
            create(&mut state, &params, "x"),
            Err(CsiError::AlreadyExists(_))
        ));
        let mut sourced = args("a", 10 * GI, 0);
        sourced.source = Some(ContentSource::Volume("vol-1".into()));
        assert!(matches!(
            create(&mut state, &sourced, "x"),
            Err(CsiError::AlreadyExists(_))
        ));
        let mut mutable = args("a", 10 * GI, 0);
        mutable
            .mutable_parameters
            .insert("iops".into(), "3000".into());
        assert!(matches!(
            create(&mut state, &mutable, "x"),
            Err(CsiError::AlreadyExists(_))
        ));
    }

    #[test]
    fn mutable_parameters_are_kept_with_the_volume() {
        let mut state = State::default();
        let mut a = args("a", GI, 0);
        a.mutable_parameters.insert("iops".into(), "3000".into());
        let created = create(&mut state, &a, "vol-1").unwrap();
        assert_eq!(created.mutable_parameters, a.mutable_parameters);
        assert_eq!(create(&mut state, &a, "vol-2").unwrap().id, "vol-1");
    }

    #[test]
    fn sizes_follow_the_capacity_range() {
        let mut state = State::default();
        assert_eq!(
            create(&mut state, &args("exact", 5 * GI, 5 * GI), "1")
                .unwrap()
                .capacity_bytes,
            5 * GI
        );
        assert_eq!(
            create(&mut state, &args("none", 0, 0), "2")
                .unwrap()
                .capacity_bytes,
            DEFAULT_VOLUME_SIZE
        );
        assert_eq!(
            create(&mut state, &args("lim", 0, GI / 2), "3")
                .unwrap()
                .capacity_bytes,
            GI / 2
        );
        let too_big = create(&mut state, &args("big", 51 * GI, 0), "4");
        assert!(
            matches!(too_big, Err(CsiError::OutOfRange(_))),
            "{too_big:?}"
        );
    }

    #[test]
    fn capacity_runs_out() {
        let mut state = State::default();
        create(&mut state, &args("a", 50 * GI, 0), "1").unwrap();
        create(&mut state, &args("b", 40 * GI, 0), "2").unwrap();
        let full = create(&mut state, &args("c", 20 * GI, 0), "3");
        assert!(
            matches!(full, Err(CsiError::ResourceExhausted(_))),
            "{full:?}"
        );
        // Retrying an existing name still succeeds although the pool is full.
        assert_eq!(
            create(&mut state, &args("b", 40 * GI, 0), "4").unwrap().id,
            "2"
        );
        assert_eq!(
            state.usage().free_bytes(&Segment::unlabelled(100 * GI)),
            10 * GI
        );
    }

    #[test]
    fn sources_must_exist_and_fit() {
        let mut state = State::default();
        create(&mut state, &args("src", 10 * GI, 0), "vol-src").unwrap();
        let mut clone = args("clone", 0, 0);
        clone.source = Some(ContentSource::Volume("vol-src".into()));
        let v = create(&mut state, &clone, "vol-clone").unwrap();
        assert_eq!(
            v.capacity_bytes,
            10 * GI,
            "a clone inherits the source size"
        );
        assert_eq!(v.source, Some(ContentSource::Volume("vol-src".into())));

        let mut missing = args("m", 0, 0);
        missing.source = Some(ContentSource::Snapshot("non-existing-snapshot-id".into()));
        assert!(matches!(
            create(&mut state, &missing, "x"),
            Err(CsiError::NotFound(_))
        ));

        let mut small = args("small", 0, GI);
        small.source = Some(ContentSource::Volume("vol-src".into()));
        assert!(matches!(
            create(&mut state, &small, "x"),
            Err(CsiError::OutOfRange(_))
        ));

        let snap = match decide_create_snapshot(&state, "s", "vol-src", "snap-1".into(), (7, 8))
            .unwrap()
        {
            CreateSnapshotDecision::Create(s) => s,
            other => panic!("{other:?}"),
        };
        assert_eq!(snap.size_bytes, 10 * GI);
        state.snapshots.insert(snap.id.clone(), snap);
        let mut restore = args("restore", 12 * GI, 0);
        restore.source = Some(ContentSource::Snapshot("snap-1".into()));
        assert_eq!(
            create(&mut state, &restore, "vol-r")
                .unwrap()
                .capacity_bytes,
            12 * GI
        );
    }

    #[test]
    fn snapshot_names_are_idempotent_per_source() {
        let mut state = State::default();
        create(&mut state, &args("a", GI, 0), "vol-a").unwrap();
        create(&mut state, &args("b", GI, 0), "vol-b").unwrap();
        let CreateSnapshotDecision::Create(s) =
            decide_create_snapshot(&state, "s", "vol-a", "snap-1".into(), (1, 0)).unwrap()
        else {
            panic!("expected a new snapshot")
        };
        state.snapshots.insert(s.id.clone(), s.clone());
        assert_eq!(
            decide_create_snapshot(&state, "s", "vol-a", "snap-2".into(), (2, 0)),
            Ok(CreateSnapshotDecision::Existing(s))
        );
        assert!(matches!(
            decide_create_snapshot(&state, "s", "vol-b", "snap-3".into(), (3, 0)),
            Err(CsiError::AlreadyExists(_))
        ));
        assert!(matches!(
            decide_create_snapshot(&state, "t", "fake-vol-id", "snap-4".into(), (3, 0)),
            Err(CsiError::NotFound(_))
        ));
    }

    /// Takes a snapshot of `volume` named `name` as `id` and stores it.
    fn snapshot(state: &mut State, name: &str, volume: &str, id: &str) -> SnapshotRecord {
        match decide_create_snapshot(state, name, volume, id.into(), (1, 0)) {
            Ok(CreateSnapshotDecision::Create(s)) => {
                state.snapshots.insert(s.id.clone(), s.clone());
                s
            }
            other => panic!("expected a new snapshot, got {other:?}"),
        }
    }

    fn from(source: ContentSource, name: &str, required: i64) -> CreateVolumeArgs {
        CreateVolumeArgs {
            source: Some(source),
            ..args(name, required, 0)
        }
    }

    #[test]
    fn a_restore_or_clone_may_not_ask_for_less_than_its_source() {
        let mut state = State::default();
        create(&mut state, &args("src", 10 * GI, 0), "vol-src").unwrap();
        snapshot(&mut state, "s", "vol-src", "snap-1");
        for source in [
            ContentSource::Snapshot("snap-1".into()),
            ContentSource::Volume("vol-src".into()),
        ] {
            let smaller = create(&mut state, &from(source.clone(), "small", 5 * GI), "x");
            assert!(
                matches!(&smaller, Err(CsiError::OutOfRange(m)) if m.contains("less than")),
                "{smaller:?}"
            );
            let same_size = create(&mut state, &from(source.clone(), "same", 0), "vol-same");
            assert_eq!(same_size.map(|v| v.capacity_bytes), Ok(10 * GI));
            let bigger = create(&mut state, &from(source.clone(), "big", 11 * GI), "vol-big");
            assert_eq!(bigger.map(|v| v.capacity_bytes), Ok(11 * GI));
            for name in ["same", "big"] {
                let id = state.volume_by_name(name).unwrap().id.clone();
                state.volumes.remove(&id);
            }
        }
        let missing = create(
            &mut state,
            &from(ContentSource::Volume("vol-gone".into()), "m", 0),
            "x",
        );
        assert!(matches!(missing, Err(CsiError::NotFound(_))), "{missing:?}");
    }

    #[test]
    fn sourced_volumes_are_idempotent_per_source() {
        let mut state = State::default();
        create(&mut state, &args("src", GI, 0), "vol-src").unwrap();
        snapshot(&mut state, "s1", "vol-src", "snap-1");
        snapshot(&mut state, "s2", "vol-src", "snap-2");
        let restore = from(ContentSource::Snapshot("snap-1".into()), "r", GI);
        let first = create(&mut state, &restore, "vol-r").unwrap();
        assert_eq!(
            first.to_csi().content_source,
            Some(ContentSource::Snapshot("snap-1".into()).to_csi()),
            "the reply names the request's source"
        );
        assert_eq!(create(&mut state, &restore, "vol-r2"), Ok(first));
        for other in [
            from(ContentSource::Snapshot("snap-2".into()), "r", GI),
            from(ContentSource::Volume("vol-src".into()), "r", GI),
            args("r", GI, 0),
            from(ContentSource::Snapshot("snap-1".into()), "r", 2 * GI),
        ] {
            let conflict = create(&mut state, &other, "vol-x");
            assert!(
                matches!(conflict, Err(CsiError::AlreadyExists(_))),
                "{other:?}: {conflict:?}"
            );
        }
        // A snapshot stays usable after its source volume is gone.
        state.volumes.remove("vol-src");
        let late = create(
            &mut state,
            &from(ContentSource::Snapshot("snap-2".into()), "late", 0),
            "vol-l",
        );
        assert_eq!(late.map(|v| v.capacity_bytes), Ok(GI));
    }

    #[test]
    fn snapshots_are_found_filtered_and_paged() {
        let mut state = State::default();
        create(&mut state, &args("a", GI, 0), "vol-a").unwrap();
        create(&mut state, &args("b", 2 * GI, 0), "vol-b").unwrap();
        let a1 = snapshot(&mut state, "a1", "vol-a", "snap-1");
        let a2 = snapshot(&mut state, "a2", "vol-a", "snap-2");
        let b1 = snapshot(&mut state, "b1", "vol-b", "snap-3");
        assert_eq!(b1.size_bytes, 2 * GI, "a snapshot has its source's size");
        assert_eq!(find_snapshot(&state, "snap-2"), Ok(&a2));
        assert!(matches!(
            find_snapshot(&state, "none-exist-id"),
            Err(CsiError::NotFound(_))
        ));
        assert_eq!(
            filter_snapshots(&state, "", ""),
            [a1.clone(), a2.clone(), b1.clone()]
        );
        assert_eq!(
            filter_snapshots(&state, "", "vol-a"),
            [a1.clone(), a2.clone()]
        );
        assert_eq!(
            filter_snapshots(&state, "snap-3", ""),
            std::slice::from_ref(&b1)
        );
        assert_eq!(
            filter_snapshots(&state, "snap-3", "vol-b"),
            std::slice::from_ref(&b1)
        );
        assert!(filter_snapshots(&state, "snap-3", "vol-a").is_empty());
        assert!(filter_snapshots(&state, "snap-9", "").is_empty());
        assert!(filter_snapshots(&state, "", "vol-9").is_empty());

        let all = filter_snapshots(&state, "", "");
        let (first, token) = page(&all, 2, "").unwrap();
        assert_eq!((first, token.as_str()), (vec![a1, a2], "2"));
        assert_eq!(page(&all, 2, &token), Ok((vec![b1], String::new())));
        assert!(matches!(
            page(&all, 2, "invalid-token"),
            Err(CsiError::Aborted(_))
        ));
    }

    fn zone(z: &str) -> Labels {
        Labels::from([("zone".to_string(), z.to_string())])
    }

    fn zoned() -> Limits {
        Limits {
            segments: vec![
                Segment {
                    labels: zone("a"),
                    capacity_bytes: 10 * GI,
                },
                Segment {
                    labels: zone("b"),
                    capacity_bytes: 20 * GI,
                },
            ],
            max_volume_size: 50 * GI,
        }
    }

    fn within(name: &str, size: i64, requisite: &[&str], preferred: &[&str]) -> CreateVolumeArgs {
        CreateVolumeArgs {
            requirements: Requirements {
                requisite: requisite.iter().map(|z| zone(z)).collect(),
                preferred: preferred.iter().map(|z| zone(z)).collect(),
            },
            ..args(name, size, 0)
        }
    }

    #[test]
    fn volumes_go_to_the_first_allowed_segment_with_room() {
        let limits = zoned();
        let mut state = State::default();
        let place = |state: &mut State, a: &CreateVolumeArgs| {
            create_in(state, a, &limits, &format!("vol-{}", a.name)).map(|v| v.topology)
        };
        assert_eq!(
            place(&mut state, &within("1", 6 * GI, &[], &[])),
            Ok(zone("a"))
        );
        assert_eq!(
            place(&mut state, &within("2", 6 * GI, &[], &[])),
            Ok(zone("b")),
            "a is full for 6 GiB"
        );
        assert_eq!(
            place(&mut state, &within("3", GI, &["a", "b"], &["b"])),
            Ok(zone("b")),
            "preferred first"
        );
        assert_eq!(
            place(&mut state, &within("4", GI, &["b", "a"], &[])),
            Ok(zone("b")),
            "requisite order"
        );
        let full = place(&mut state, &within("5", 5 * GI, &["a"], &[]));
        assert!(
            matches!(&full, Err(CsiError::ResourceExhausted(m)) if m.contains("left")),
            "{full:?}"
        );
        let unserved = place(&mut state, &within("6", GI, &["x"], &[]));
        assert!(
            matches!(&unserved, Err(CsiError::ResourceExhausted(m)) if m.contains("no segment")),
            "{unserved:?}"
        );
        // The requisite is checked before the source is looked up.
        let mut sourced = within("7", GI, &["x"], &[]);
        sourced.source = Some(ContentSource::Snapshot("missing".into()));
        assert!(matches!(
            place(&mut state, &sourced),
            Err(CsiError::ResourceExhausted(_))
        ));
        let v = state.volume_by_name("3").unwrap().to_csi();
        assert_eq!(v.accessible_topology, vec![to_csi_topology(&zone("b"))]);
    }

    #[test]
    fn restores_and_clones_go_to_their_source_segment_if_allowed() {
        let limits = zoned();
        let mut state = State::default();
        let src = create_in(
            &mut state,
            &within("src", GI, &["b"], &[]),
            &limits,
            "vol-src",
        )
        .unwrap();
        assert_eq!(src.topology, zone("b"));
        let snap = snapshot(&mut state, "s", "vol-src", "snap-1");
        assert_eq!(
            snap.topology,
            zone("b"),
            "a snapshot remembers its source's segment"
        );
        let place = |state: &mut State, a: CreateVolumeArgs| {
            create_in(state, &a, &limits, &format!("vol-{}", a.name)).map(|v| v.topology)
        };
        let sourced =
            |source: &ContentSource, name: &str, size: i64, requisite: &[&str]| CreateVolumeArgs {
                source: Some(source.clone()),
                ..within(name, size, requisite, &[])
            };
        for (n, source) in [
            ContentSource::Snapshot("snap-1".into()),
            ContentSource::Volume("vol-src".into()),
        ]
        .iter()
        .enumerate()
        {
            assert_eq!(
                place(
                    &mut state,
                    sourced(source, &format!("free-{n}"), 8 * GI, &[])
                ),
                Ok(zone("b")),
                "next to the source although a comes first"
            );
            assert_eq!(
                place(
                    &mut state,
                    sourced(source, &format!("in-a-{n}"), GI, &["a"])
                ),
                Ok(zone("a")),
                "the requisite wins"
            );
        }
        // b holds 17 of its 20 GiB: a 5 GiB restore no longer fits there, and goes to a.
        assert_eq!(
            place(
                &mut state,
                sourced(
                    &ContentSource::Snapshot("snap-1".into()),
                    "big",
                    5 * GI,
                    &[]
                )
            ),
            Ok(zone("a"))
        );
    }

    #[test]
    fn retries_keep_the_stored_segment() {
        let limits = zoned();
        let mut state = State::default();
        let first = create_in(
            &mut state,
            &within("v", 8 * GI, &["a", "b"], &["a"]),
            &limits,
            "vol-1",
        )
        .unwrap();
        assert_eq!(first.topology, zone("a"));
        // Segment a is now too full for another 8 GiB, and the retry prefers b: still the same
        // volume, still in a.
        let again = create_in(
            &mut state,
            &within("v", 8 * GI, &["b", "a"], &["b"]),
            &limits,
            "vol-2",
        )
        .unwrap();
        assert_eq!(again, first);
        let no_requisite = create_in(&mut state, &within("v", 8 * GI, &[], &[]), &limits, "vol-3");
        assert_eq!(no_requisite, Ok(first));
        let elsewhere = create_in(
            &mut state,
            &within("v", 8 * GI, &["b"], &[]),
            &limits,
            "vol-4",
        );
        assert!(
            matches!(&elsewhere, Err(CsiError::AlreadyExists(m)) if m.contains("topology")),
            "{elsewhere:?}"
        );
        assert_eq!(state.volumes.len(), 1);
    }

    #[test]
    fn a_driver_without_topology_ignores_requirements() {
        let mut state = State::default();
        let v = create(&mut state, &within("t", GI, &["x"], &["y"]), "vol-1").unwrap();
        assert!(v.topology.is_empty());
        assert!(v.to_csi().accessible_topology.is_empty());
        assert_eq!(
            create(&mut state, &within("t", GI, &["z"], &[]), "vol-2").map(|v| v.id),
            Ok("vol-1".to_string())
        );
    }

    #[test]
    fn delete_refuses_published_volumes_and_ignores_unknown_ones() {
        let mut state = State::default();
        create(&mut state, &args("a", GI, 0), "vol-a").unwrap();
        assert_eq!(decide_delete_volume(&state, "fake-vol-id"), Ok(None));
        assert!(decide_delete_volume(&state, "vol-a").unwrap().is_some());
        let publication = Publication {
            access: AccessKind::Mount,
            readonly: false,
        };
        assert_eq!(
            decide_node_publish(&state, "vol-a", "/t", &publication),
            Ok(PublishDecision::Publish)
        );
        if let Some(v) = state.volumes.get_mut("vol-a") {
            v.publications.insert("/t".into(), publication.clone());
        }
        assert_eq!(
            decide_node_publish(&state, "vol-a", "/t", &publication),
            Ok(PublishDecision::AlreadyPublished)
        );
        let readonly = Publication {
            readonly: true,
            ..publication.clone()
        };
        assert!(matches!(
            decide_node_publish(&state, "vol-a", "/t", &readonly),
            Err(CsiError::AlreadyExists(_))
        ));
        assert!(matches!(
            decide_delete_volume(&state, "vol-a"),
            Err(CsiError::FailedPrecondition(_))
        ));
        assert_eq!(
            decide_node_unpublish(&state, "vol-a", "/t"),
            Ok(Some(publication))
        );
        assert_eq!(decide_node_unpublish(&state, "vol-a", "/other"), Ok(None));
        assert!(matches!(
            decide_node_unpublish(&state, "fake-vol-id", "/t"),
            Err(CsiError::NotFound(_))
        ));
    }

    #[test]
    fn delete_refuses_staged_volumes() {
        let mut state = State::default();
        create(&mut state, &args("a", GI, 0), "vol-a").unwrap();
        if let Some(v) = state.volumes.get_mut("vol-a") {
            v.stagings.insert(
                "/staging".into(),
                Staging {
                    access: AccessKind::Mount,
                },
            );
        }
        assert!(matches!(
            decide_delete_volume(&state, "vol-a"),
            Err(CsiError::FailedPrecondition(m)) if m.contains("staged")
        ));
    }

    #[test]
    fn paging_uses_offset_tokens() {
        let items: Vec<u32> = (0..5).collect();
        assert_eq!(page(&items, 0, ""), Ok((items.clone(), String::new())));
        assert_eq!(page(&items, 2, ""), Ok((vec![0, 1], "2".into())));
        assert_eq!(page(&items, 2, "2"), Ok((vec![2, 3], "4".into())));
        assert_eq!(page(&items, 0, "2"), Ok((vec![2, 3, 4], String::new())));
        assert_eq!(page(&items, 9, "4"), Ok((vec![4], String::new())));
        assert_eq!(page(&items, 0, "5"), Ok((vec![], String::new())));
        assert!(matches!(
            page(&items, 0, "invalid-token"),
            Err(CsiError::Aborted(_))
        ));
        assert!(matches!(page(&items, 0, "6"), Err(CsiError::Aborted(_))));
        assert!(matches!(
            page(&items, -1, ""),
            Err(CsiError::InvalidArgument(_))
        ));
    }
}
