//! An in-memory CSI driver with CSI's semantics: CreateVolume is idempotent by name (the same
//! name and a compatible request give the same volume, an incompatible one ALREADY_EXISTS), a
//! restore needs its snapshot, DeleteVolume of a missing volume succeeds. Faults are drawn per
//! call from the run's seed: a timeout after creating the volume or before, a lost answer
//! (created, the connection dropped), a final INVALID_ARGUMENT or RESOURCE_EXHAUSTED (nothing
//! created). Parameters with `sim/invalid: "true"` are always refused (a bad class).
//!
//! In node mode each node has its own driver (its own local volumes); volume ids name the
//! node, so a PV's handle says which node's volume it is.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tonic::{Code, Status};

use super::apiserver::{ApiServer, text};
use super::gate::{Gate, ProcId};
use super::rng::Rng;
use super::trace::Trace;
use crate::csi;
use crate::csi_client::{CallError, CsiController};

/// The parameter a class carries to be refused by the driver, always.
pub const INVALID_PARAMETER: &str = "sim/invalid";

/// Per-mille chances of each fault per call.
#[derive(Clone, Copy, Debug, Default)]
pub struct Faults {
    pub timeout_created: u32,
    pub timeout_not_created: u32,
    pub lost_answer: u32,
    pub invalid: u32,
    pub exhausted: u32,
    pub delete_timeout: u32,
}

pub struct BackendVolume {
    pub id: String,
    /// The request that created it, without secrets.
    pub request: csi::CreateVolumeRequest,
}

pub struct Driver {
    /// `None`: the central driver.
    pub node: Option<String>,
    pub segment: BTreeMap<String, String>,
    state: Mutex<DriverState>,
}

/// One call of the driver on a volume name, for the classification of findings.
#[derive(Clone, Debug)]
pub struct Touch {
    pub delete: bool,
    /// The actor that called (empty: a background task).
    pub actor: String,
    /// CreateVolume: whether this call created the volume; DeleteVolume: whether it deleted.
    pub changed: bool,
    pub outcome: String,
}

pub struct DriverState {
    /// Every call, by volume name.
    pub history: BTreeMap<String, Vec<Touch>>,
    /// By name.
    pub volumes: BTreeMap<String, BackendVolume>,
    /// Snapshot handles the backend holds.
    pub snapshots: BTreeSet<String>,
    pub faults: Faults,
    /// Whether faults are drawn (off for the quiescence phase).
    pub faulty: bool,
    rng: Rng,
    /// Invariant 2 as the calls happen: DeleteVolume of a volume a live PV references.
    pub violations: Vec<(String, String)>,
    pub created: u64,
}

impl Driver {
    pub fn new(
        node: Option<String>,
        segment: BTreeMap<String, String>,
        faults: Faults,
        rng: Rng,
    ) -> Self {
        Driver {
            node,
            segment,
            state: Mutex::new(DriverState {
                history: BTreeMap::new(),
                volumes: BTreeMap::new(),
                snapshots: BTreeSet::new(),
                faults,
                faulty: true,
                rng,
                violations: Vec::new(),
                created: 0,
            }),
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, DriverState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn label(&self) -> String {
        self.node.clone().unwrap_or_else(|| "central".to_owned())
    }

    fn volume_id(&self, name: &str) -> String {
        format!("{}:{name}", self.label())
    }
}

fn compatible(a: &csi::CreateVolumeRequest, b: &csi::CreateVolumeRequest) -> bool {
    let bytes =
        |r: &csi::CreateVolumeRequest| r.capacity_range.as_ref().map_or(0, |c| c.required_bytes);
    a.parameters == b.parameters
        && bytes(a) == bytes(b)
        && a.volume_content_source == b.volume_content_source
        && a.mutable_parameters == b.mutable_parameters
}

fn snapshot_source(request: &csi::CreateVolumeRequest) -> Option<&str> {
    match request.volume_content_source.as_ref()?.r#type.as_ref()? {
        csi::volume_content_source::Type::Snapshot(snapshot) => Some(&snapshot.snapshot_id),
        csi::volume_content_source::Type::Volume(_) => None,
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Fault {
    None,
    TimeoutCreated,
    TimeoutNotCreated,
    LostAnswer,
    Invalid,
    Exhausted,
}

/// One process's connection to a driver.
pub struct ProcessDriver {
    pub driver: Arc<Driver>,
    pub gate: Gate,
    pub proc: ProcId,
    pub trace: Trace,
    pub server: ApiServer,
}

impl ProcessDriver {
    fn create(
        &self,
        request: &csi::CreateVolumeRequest,
    ) -> (Result<csi::CreateVolumeResponse, CallError>, String) {
        let driver = &self.driver;
        let mut state = driver.lock();
        let fault = if state.faulty {
            let f = state.faults;
            let weights = [
                1000u32.saturating_sub(
                    f.timeout_created
                        + f.timeout_not_created
                        + f.lost_answer
                        + f.invalid
                        + f.exhausted,
                ),
                f.timeout_created,
                f.timeout_not_created,
                f.lost_answer,
                f.invalid,
                f.exhausted,
            ];
            [
                Fault::None,
                Fault::TimeoutCreated,
                Fault::TimeoutNotCreated,
                Fault::LostAnswer,
                Fault::Invalid,
                Fault::Exhausted,
            ][state.rng.weighted(&weights)]
        } else {
            Fault::None
        };
        let status = |code: Code, message: &str| Err(CallError::from(Status::new(code, message)));
        if request
            .parameters
            .get(INVALID_PARAMETER)
            .map(String::as_str)
            == Some("true")
        {
            return (
                status(Code::InvalidArgument, "invalid parameters"),
                "INVALID_ARGUMENT (bad class)".into(),
            );
        }
        let exists = state.volumes.contains_key(&request.name);
        match fault {
            Fault::TimeoutNotCreated => {
                return (
                    status(Code::DeadlineExceeded, "timeout"),
                    "DEADLINE_EXCEEDED (not created)".into(),
                );
            }
            Fault::Invalid if !exists => {
                return (
                    status(Code::InvalidArgument, "injected"),
                    "INVALID_ARGUMENT (injected, nothing created)".into(),
                );
            }
            Fault::Exhausted if !exists => {
                return (
                    status(Code::ResourceExhausted, "no space"),
                    "RESOURCE_EXHAUSTED (nothing created)".into(),
                );
            }
            _ => {}
        }
        let id = match state.volumes.get(&request.name) {
            Some(volume) if compatible(&volume.request, request) => volume.id.clone(),
            Some(_) => {
                return (
                    status(Code::AlreadyExists, "incompatible"),
                    "ALREADY_EXISTS (incompatible)".into(),
                );
            }
            None => {
                if let Some(handle) = snapshot_source(request)
                    && !state.snapshots.contains(handle)
                {
                    return (
                        status(Code::NotFound, "snapshot not found"),
                        format!("NOT_FOUND (snapshot {handle})"),
                    );
                }
                let id = driver.volume_id(&request.name);
                state.volumes.insert(
                    request.name.clone(),
                    BackendVolume {
                        id: id.clone(),
                        request: csi::CreateVolumeRequest {
                            secrets: HashMap::new(),
                            ..request.clone()
                        },
                    },
                );
                state.created += 1;
                id
            }
        };
        match fault {
            Fault::TimeoutCreated => {
                return (
                    status(Code::DeadlineExceeded, "timeout"),
                    format!("DEADLINE_EXCEEDED (created {id})"),
                );
            }
            Fault::LostAnswer => {
                return (
                    Err(CallError::Transport("connection reset".into())),
                    format!("answer lost (created {id})"),
                );
            }
            _ => {}
        }
        let accessible_topology =
            if request.accessibility_requirements.is_some() && !driver.segment.is_empty() {
                vec![csi::Topology {
                    segments: driver.segment.clone().into_iter().collect(),
                }]
            } else {
                Vec::new()
            };
        let response = csi::CreateVolumeResponse {
            volume: Some(csi::Volume {
                volume_id: id.clone(),
                capacity_bytes: request
                    .capacity_range
                    .as_ref()
                    .map_or(0, |c| c.required_bytes),
                content_source: request.volume_content_source.clone(),
                accessible_topology,
                ..csi::Volume::default()
            }),
        };
        (Ok(response), format!("OK {id}"))
    }

    fn delete(
        &self,
        volume_id: &str,
        actor: &str,
    ) -> (Result<csi::DeleteVolumeResponse, CallError>, String) {
        let mut state = self.driver.lock();
        // Invariant 2, at the moment of the call.
        for pv in self.server.list("persistentvolumes") {
            if text(&pv["spec"]["csi"]["volumeHandle"]) == volume_id
                && text(&pv["status"]["phase"]) != "Released"
            {
                let violation = format!(
                    "unsafe delete: {actor} calls DeleteVolume {volume_id} while PV {} (phase {:?}) references it",
                    text(&pv["metadata"]["name"]),
                    text(&pv["status"]["phase"])
                );
                let name = volume_id
                    .split_once(':')
                    .map_or(volume_id, |(_, name)| name);
                state.violations.push((name.to_owned(), violation));
            }
        }
        let chance = state.faults.delete_timeout;
        let timeout = state.faulty && state.rng.chance(chance);
        let deleted = !timeout || state.rng.chance(500);
        let name = state
            .volumes
            .iter()
            .find(|(_, volume)| volume.id == volume_id)
            .map(|(name, _)| name.clone());
        if let Some(name) = &name {
            if deleted {
                state.volumes.remove(name);
            }
            state.history.entry(name.clone()).or_default().push(Touch {
                delete: true,
                actor: actor.to_owned(),
                changed: deleted,
                outcome: String::new(),
            });
        }
        if timeout {
            let what = if deleted { "deleted" } else { "not deleted" };
            return (
                Err(CallError::from(Status::new(
                    Code::DeadlineExceeded,
                    "timeout",
                ))),
                format!("DEADLINE_EXCEEDED ({what})"),
            );
        }
        (Ok(csi::DeleteVolumeResponse {}), "OK".into())
    }
}

#[tonic::async_trait]
impl CsiController for ProcessDriver {
    async fn create_volume(
        &self,
        request: csi::CreateVolumeRequest,
    ) -> Result<csi::CreateVolumeResponse, CallError> {
        let what = format!("CreateVolume {}", request.name);
        let actor = self.gate.pass(self.proc, &what).await;
        let before = self.driver.lock().created;
        let (result, outcome) = self.create(&request);
        {
            let mut state = self.driver.lock();
            let changed = state.created != before;
            state
                .history
                .entry(request.name.clone())
                .or_default()
                .push(Touch {
                    delete: false,
                    actor: actor.clone().unwrap_or_default(),
                    changed,
                    outcome: outcome.clone(),
                });
        }
        self.trace.call(
            self.proc,
            actor.as_deref(),
            &format!("{what} @{} → {outcome}", self.driver.label()),
        );
        result
    }

    async fn delete_volume(
        &self,
        request: csi::DeleteVolumeRequest,
    ) -> Result<csi::DeleteVolumeResponse, CallError> {
        let what = format!("DeleteVolume {}", request.volume_id);
        let actor = self.gate.pass(self.proc, &what).await;
        let (result, outcome) =
            self.delete(&request.volume_id, actor.as_deref().unwrap_or_default());
        self.trace
            .call(self.proc, actor.as_deref(), &format!("{what} → {outcome}"));
        result
    }

    async fn get_capacity(
        &self,
        _request: csi::GetCapacityRequest,
    ) -> Result<csi::GetCapacityResponse, CallError> {
        self.gate.pass(self.proc, "GetCapacity").await;
        Ok(csi::GetCapacityResponse {
            available_capacity: 1 << 50,
            ..csi::GetCapacityResponse::default()
        })
    }
}
