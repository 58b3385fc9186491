//! The Identity, Controller and Node services: each RPC validates, takes its in-flight keys,
//! waits out any injected delay, applies a pure decision from `state` and persists the result,
//! all wrapped in the fault hooks and the per-call log line.

use std::fmt::Debug;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use tonic::{Code, Request, Response, Status};
use uuid::Uuid;

use csi_spec as csi;
use csi_spec::controller_service_capability::rpc::Type as ControllerRpc;
use csi_spec::node_service_capability::rpc::Type as NodeRpc;
use csi_spec::plugin_capability::service::Type as PluginService;

use super::config::DriverConfig;
use super::data::VolumeData;
use super::faults::{Action, FaultInjector, Phase};
use super::guard::{self, Held, InFlight};
use super::mounts;
use super::node;
use super::request_log::{self, RequestLog};
use super::state::{
    self, AccessKind, ContentSource, CreateSnapshotDecision, CreateVolumeDecision, CsiError,
    Features, Limits, PublishDecision, Staging, State, VolumeRecord,
};
use super::store::{Locked, Store, StoreError};
use super::topology::{self, Labels};
use super::validate;

/// Controller capabilities served whatever the flags; every advertised capability is
/// implemented and accepted by csi-sanity v5.6.
const CONTROLLER_CAPABILITIES: &[ControllerRpc] = &[
    ControllerRpc::CreateDeleteVolume,
    ControllerRpc::ListVolumes,
];

/// Advertised unless `--no-snapshots`.
const SNAPSHOT_CAPABILITIES: &[ControllerRpc] = &[
    ControllerRpc::CreateDeleteSnapshot,
    ControllerRpc::ListSnapshots,
    ControllerRpc::GetSnapshot,
];

/// [`CONTROLLER_CAPABILITIES`]; GET_CAPACITY, the snapshot ones and CLONE_VOLUME as `features`
/// allow; PUBLISH_UNPUBLISH_VOLUME with `--attach-required`: only advertised, for testing sidecars
/// that behave differently for attachable volumes (the provisioner's VolumeAttachment check
/// before DeleteVolume); and MODIFY_VOLUME with `--modify-volume`: CreateVolume then takes
/// `mutable_parameters` (a claim's VolumeAttributesClass), ControllerModifyVolume stays
/// UNIMPLEMENTED (the provisioner never calls it).
fn controller_capabilities(features: Features, attach_required: bool) -> Vec<ControllerRpc> {
    let snapshots = if features.snapshots {
        SNAPSHOT_CAPABILITIES
    } else {
        &[]
    };
    let capacity = features.get_capacity.then_some(ControllerRpc::GetCapacity);
    let clone = features.clone.then_some(ControllerRpc::CloneVolume);
    let attach = attach_required.then_some(ControllerRpc::PublishUnpublishVolume);
    let modify = features
        .modify_volume
        .then_some(ControllerRpc::ModifyVolume);
    CONTROLLER_CAPABILITIES
        .iter()
        .copied()
        .chain(capacity)
        .chain(snapshots.iter().copied())
        .chain(clone)
        .chain(attach)
        .chain(modify)
        .collect()
}

/// Node capabilities: staging (a bind mount of the volume's data at the staging path) and
/// volume statistics.
const NODE_CAPABILITIES: &[NodeRpc] = &[NodeRpc::StageUnstageVolume, NodeRpc::GetVolumeStats];

/// The name fault and delay rules know a CreateVolume by: `CreateVolume/snapshot` for a
/// restore, `CreateVolume/volume` for a clone (see `faults::CALL_KINDS`), else `CreateVolume`.
/// Taken from the raw request, since before-faults fire before validation.
fn create_volume_call(req: &csi::CreateVolumeRequest) -> &'static str {
    use csi::volume_content_source::Type;
    match req
        .volume_content_source
        .as_ref()
        .and_then(|s| s.r#type.as_ref())
    {
        Some(Type::Snapshot(_)) => "CreateVolume/snapshot",
        Some(Type::Volume(_)) => "CreateVolume/volume",
        None => "CreateVolume",
    }
}

/// The driver; cheap to clone, every clone serves the same state.
#[derive(Clone)]
pub struct Driver {
    inner: Arc<Inner>,
    /// `--request-log`: where CreateVolume, CreateSnapshot and DeleteSnapshot requests are
    /// written as JSON.
    request_log: Option<Arc<RequestLog>>,
}

struct Inner {
    driver_name: String,
    node_id: String,
    node_topology: Labels,
    limits: Limits,
    /// The state, shared with other processes on the same state directory: locked (flock) for
    /// decide + save + commit, never across an await, so a cancelled call cannot leave memory
    /// and disk disagreeing.
    store: Store,
    /// The volumes' data under `<state-dir>/volumes/`.
    data: VolumeData,
    inflight: InFlight,
    faults: FaultInjector,
    features: Features,
    controller_capabilities: Vec<ControllerRpc>,
    /// `--volume-id-prefix`.
    volume_id_prefix: Option<String>,
}

impl Driver {
    /// Loads the saved state (or starts empty).
    pub fn open(config: &DriverConfig) -> Result<Self, StoreError> {
        let store = Store::open(&config.state_dir)?;
        let data = VolumeData::new(&config.state_dir);
        {
            // Under the lock, so no other process is between making data and recording it.
            let locked = store.lock()?;
            let state = locked.state();
            let (removed, created) = data.sweep(state).map_err(|source| StoreError::Sweep {
                path: config.state_dir.join(super::data::VOLUMES_DIR),
                source,
            })?;
            for path in &removed {
                tracing::info!(path = %path.display(), "removed volume or snapshot data no record names");
            }
            for id in &created {
                tracing::info!(volume = %id, "made missing data for a recorded volume");
            }
            tracing::info!(
                state = %store.path().display(),
                volumes = state.volumes.len(),
                snapshots = state.snapshots.len(),
                "state loaded"
            );
        }
        Ok(Self {
            inner: Arc::new(Inner {
                driver_name: config.driver_name.clone(),
                node_id: config.node_id.clone(),
                node_topology: config.node_topology.clone(),
                limits: config.limits.clone(),
                store,
                data,
                inflight: InFlight::default(),
                faults: FaultInjector::new(config.faults.clone(), config.control_file.clone()),
                features: config.features,
                controller_capabilities: controller_capabilities(
                    config.features,
                    config.attach_required,
                ),
                volume_id_prefix: config.volume_id_prefix.clone(),
            }),
            request_log: None,
        })
    }

    /// Also writes every CreateVolume, CreateSnapshot and DeleteSnapshot request to `log`
    /// (`--request-log`).
    #[must_use]
    pub fn with_request_log(mut self, log: RequestLog) -> Self {
        self.request_log = Some(Arc::new(log));
        self
    }

    /// The current state, locked against this and every other process on the state directory.
    fn lock(&self) -> Result<Locked<'_>, CsiError> {
        self.inner
            .store
            .lock()
            .map_err(|e| CsiError::Internal(e.to_string()))
    }

    /// Runs `read` on the current state, under the lock.
    fn read<T>(&self, read: impl FnOnce(&State) -> T) -> Result<T, CsiError> {
        Ok(read(self.lock()?.state()))
    }

    /// [`Driver::read`] on the blocking pool (see [`Driver::blocking`]).
    async fn read_blocking<T: Send + 'static>(
        &self,
        read: impl FnOnce(&State) -> T + Send + 'static,
    ) -> Result<T, CsiError> {
        self.unkeyed_blocking(move |driver| driver.read(read)).await
    }

    /// [`Driver::blocking`] for a call that holds no in-flight keys.
    async fn unkeyed_blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Driver) -> Result<T, CsiError> + Send + 'static,
    ) -> Result<T, CsiError> {
        let driver = self.clone();
        tokio::task::spawn_blocking(move || work(&driver))
            .await
            .map_err(|e| CsiError::Internal(format!("the call's work failed: {e}")))?
    }

    /// Runs `decide` on the current state; when it returns a new state, saves it and only then
    /// makes it current. All under the lock.
    fn mutate<T>(
        &self,
        decide: impl FnOnce(&State) -> Result<(T, Option<State>), CsiError>,
    ) -> Result<T, CsiError> {
        let mut locked = self.lock()?;
        let (value, next) = decide(locked.state())?;
        if let Some(next) = next {
            save(&mut locked, next)?;
        }
        Ok(value)
    }

    /// Runs `work` on tokio's blocking pool (flock waits, mount(2), mountinfo reads, data
    /// copies), so a state lock held by another process stalls no async worker. `held` (the
    /// call's in-flight keys) is released only when `work` ends: a caller that gives up does not
    /// stop work already under way, and no other call on the same object starts meanwhile.
    async fn blocking<T: Send + 'static>(
        &self,
        held: Held,
        work: impl FnOnce(&Driver) -> Result<T, CsiError> + Send + 'static,
    ) -> Result<T, CsiError> {
        self.blocking_with(held, move |driver, _| work(driver))
            .await
    }

    /// [`Driver::blocking`] for work that adds keys to `held`.
    async fn blocking_with<T: Send + 'static>(
        &self,
        mut held: Held,
        work: impl FnOnce(&Driver, &mut Held) -> Result<T, CsiError> + Send + 'static,
    ) -> Result<T, CsiError> {
        let driver = self.clone();
        tokio::task::spawn_blocking(move || work(&driver, &mut held))
            .await
            .map_err(|e| CsiError::Internal(format!("the call's work failed: {e}")))?
    }

    /// Sleeps the injected delay for `call` (a method, or `METHOD/KIND`).
    async fn pause(&self, call: &str) {
        let delay = self.inner.faults.delay_for(call);
        if !delay.is_zero() {
            tracing::debug!(call, ?delay, "injected delay");
            tokio::time::sleep(delay).await;
        }
    }

    /// Appends the request to the `--request-log`, if any, as it arrives.
    fn log_request(&self, request: impl FnOnce() -> serde_json::Value) {
        if let Some(log) = &self.request_log {
            // The log serves tests; a failed write must not change what the caller sees.
            if let Err(error) = log.write(&request()) {
                tracing::warn!(%error, "cannot write to the request log");
            }
        }
    }

    /// [`Driver::call_as`] for a call that fault rules know by its method name.
    async fn call<T>(
        &self,
        method: &'static str,
        request: &(dyn Debug + Sync),
        work: impl Future<Output = Result<T, CsiError>>,
    ) -> Result<T, CsiError> {
        self.call_as(method, method, request, work).await
    }

    /// The frame around every RPC: control-file refresh, logging (under `method`), and the
    /// before/after fault hooks of the rules for `rules_for` (the method, or `METHOD/KIND`). An
    /// after-fault replaces only a successful reply, so the effect has happened.
    async fn call_as<T>(
        &self,
        method: &'static str,
        rules_for: &'static str,
        request: &(dyn Debug + Sync),
        work: impl Future<Output = Result<T, CsiError>>,
    ) -> Result<T, CsiError> {
        self.inner.faults.refresh();
        tracing::debug!(method, ?request, "CSI call");
        let mut log = CallLog {
            method,
            started: Instant::now(),
            finished: false,
        };
        let result = async {
            if let Some(action) = self.inner.faults.take(rules_for, Phase::Before) {
                return inject(rules_for, Phase::Before, action).await;
            }
            let value = work.await?;
            if let Some(action) = self.inner.faults.take(rules_for, Phase::After) {
                return inject(rules_for, Phase::After, action).await;
            }
            Ok(value)
        }
        .await;
        log.finish(&result);
        result
    }

    // ----------------------------------------------------------------- controller

    async fn exec_create_volume(
        &self,
        req: &csi::CreateVolumeRequest,
    ) -> Result<csi::Volume, CsiError> {
        let args = validate::create_volume(req)?;
        validate::source_served(args.source.as_ref(), self.inner.features)?;
        validate::mutable_parameters_served(&args, self.inner.features)?;
        let held = self
            .inner
            .inflight
            .acquire(guard::volume_name(&args.name))?;
        self.pause(create_volume_call(req)).await;
        let new_id = match &self.inner.volume_id_prefix {
            Some(prefix) => format!("{prefix}{}", args.name),
            None => format!("vol-{}", Uuid::new_v4()),
        };
        self.blocking_with(held, move |driver, held| {
            driver.create_volume(&args, held, new_id)
        })
        .await
    }

    fn create_volume(
        &self,
        args: &state::CreateVolumeArgs,
        held: &mut Held,
        new_id: String,
    ) -> Result<csi::Volume, CsiError> {
        let mut locked = self.lock()?;
        let state = locked.state();
        if let Some(existing) = state.volume_by_name(&args.name) {
            held.add(guard::volume_id(&existing.id))?;
        }
        let volume = match state::decide_create_volume(state, args, &self.inner.limits, new_id)? {
            CreateVolumeDecision::Existing(volume) => volume,
            CreateVolumeDecision::Create(volume) => {
                // Data first, record second: a crash in between leaves data without a record,
                // which the next start removes, never a record without its data. A clone
                // starts as a copy of its source's data, a restore as a copy of the snapshot's.
                let source = match &volume.source {
                    Some(ContentSource::Volume(id)) => state
                        .volumes
                        .get(id)
                        .map(|source| self.inner.data.path(id, source.access)),
                    Some(ContentSource::Snapshot(id)) => {
                        self.inner.data.snapshot_source(id, volume.access)
                    }
                    None => None,
                };
                self.inner
                    .data
                    .create(&volume, source.as_deref(), state)
                    .map_err(|e| {
                        CsiError::Internal(format!("cannot make the data of {}: {e}", volume.id))
                    })?;
                let mut next = state.clone();
                next.volumes.insert(volume.id.clone(), volume.clone());
                if let Err(e) = save(&mut locked, next) {
                    let _ = self.inner.data.remove(&volume.id, volume.access);
                    return Err(e);
                }
                volume
            }
        };
        Ok(volume.to_csi())
    }

    async fn exec_delete_volume(&self, req: &csi::DeleteVolumeRequest) -> Result<(), CsiError> {
        validate::required("volume_id", &req.volume_id)?;
        let held = self
            .inner
            .inflight
            .acquire(guard::volume_id(&req.volume_id))?;
        self.pause("DeleteVolume").await;
        let id = req.volume_id.clone();
        self.blocking(held, move |driver| driver.delete_volume(&id))
            .await
    }

    fn delete_volume(&self, id: &str) -> Result<(), CsiError> {
        let mut locked = self.lock()?;
        let Some(volume) = state::decide_delete_volume(locked.state(), id)? else {
            return Ok(());
        };
        // Record first, data second: a crash in between leaves data without a record (removed
        // at the next start), never a record whose data is gone.
        let mut next = locked.state().clone();
        next.volumes.remove(&volume.id);
        save(&mut locked, next)?;
        if let Err(error) = self.inner.data.remove(&volume.id, volume.access) {
            tracing::warn!(volume = %volume.id, %error, "cannot remove the volume's data; the next start will");
        }
        Ok(())
    }

    async fn exec_validate_volume_capabilities(
        &self,
        req: &csi::ValidateVolumeCapabilitiesRequest,
    ) -> Result<csi::ValidateVolumeCapabilitiesResponse, CsiError> {
        validate::required("volume_id", &req.volume_id)?;
        if req.volume_capabilities.is_empty() {
            return Err(CsiError::InvalidArgument(
                "volume_capabilities is required".into(),
            ));
        }
        let checked = req
            .volume_capabilities
            .iter()
            .map(validate::capability)
            .collect::<Result<Vec<_>, _>>()?;
        self.pause("ValidateVolumeCapabilities").await;
        let id = req.volume_id.clone();
        let access = self
            .read_blocking(move |state| state.volumes.get(&id).map(|v| v.access))
            .await?
            .ok_or_else(|| {
                CsiError::NotFound(format!("volume {} does not exist", req.volume_id))
            })?;
        let unsupported = checked.iter().find_map(|(kind, mode_ok)| {
            if *kind != access {
                Some(format!(
                    "volume {} serves {access:?} access, not {kind:?}",
                    req.volume_id
                ))
            } else if !mode_ok {
                Some("an access mode is not supported".to_string())
            } else {
                None
            }
        });
        Ok(match unsupported {
            Some(message) => csi::ValidateVolumeCapabilitiesResponse {
                confirmed: None,
                message,
            },
            None => csi::ValidateVolumeCapabilitiesResponse {
                confirmed: Some(csi::validate_volume_capabilities_response::Confirmed {
                    volume_context: req.volume_context.clone(),
                    volume_capabilities: req.volume_capabilities.clone(),
                    parameters: req.parameters.clone(),
                    mutable_parameters: req.mutable_parameters.clone(),
                }),
                message: String::new(),
            },
        })
    }

    async fn exec_list_volumes(
        &self,
        req: &csi::ListVolumesRequest,
    ) -> Result<csi::ListVolumesResponse, CsiError> {
        self.pause("ListVolumes").await;
        let volumes: Vec<_> = self
            .read_blocking(|state| state.volumes.values().cloned().collect())
            .await?;
        let (page, next_token) = state::page(&volumes, req.max_entries, &req.starting_token)?;
        Ok(csi::ListVolumesResponse {
            entries: page
                .iter()
                .map(|v| csi::list_volumes_response::Entry {
                    volume: Some(v.to_csi()),
                    status: None,
                })
                .collect(),
            next_token,
        })
    }

    async fn exec_get_capacity(
        &self,
        req: &csi::GetCapacityRequest,
    ) -> Result<csi::GetCapacityResponse, CsiError> {
        self.pause("GetCapacity").await;
        let term = req.accessible_topology.as_ref().map(validate::labels);
        let usage = self.read_blocking(State::usage).await?;
        let (available, largest) = topology::capacity(
            &self.inner.limits.segments,
            &usage,
            term.as_ref(),
            self.inner.limits.max_volume_size,
        );
        Ok(csi::GetCapacityResponse {
            available_capacity: available,
            maximum_volume_size: Some(largest),
            minimum_volume_size: None,
        })
    }

    async fn exec_create_snapshot(
        &self,
        req: &csi::CreateSnapshotRequest,
    ) -> Result<csi::Snapshot, CsiError> {
        validate::required("name", &req.name)?;
        validate::required("source_volume_id", &req.source_volume_id)?;
        let held = self
            .inner
            .inflight
            .acquire(guard::snapshot_name(&req.name))?;
        self.pause("CreateSnapshot").await;
        let new_id = format!("snap-{}", Uuid::new_v4());
        let req = req.clone();
        let snapshot = self
            .blocking_with(held, move |driver, held| {
                // The copy made for a snapshot whose record then fails to save is removed at
                // once (the start-up sweep would, later).
                let mut copied = None;
                let created = driver.mutate(|state| {
                    if let Some(existing) = state.snapshot_by_name(&req.name) {
                        held.add(guard::snapshot_id(&existing.id))?;
                    }
                    let decision = state::decide_create_snapshot(
                        state,
                        &req.name,
                        &req.source_volume_id,
                        new_id,
                        now(),
                    )?;
                    Ok(match decision {
                        CreateSnapshotDecision::Existing(snapshot) => (snapshot, None),
                        CreateSnapshotDecision::Create(snapshot) => {
                            // Copy first, record second, as CreateVolume does (data.rs).
                            if let Some(source) = state.volumes.get(&snapshot.source_volume_id) {
                                driver
                                    .inner
                                    .data
                                    .create_snapshot(&snapshot.id, source)
                                    .map_err(|e| {
                                        CsiError::Internal(format!(
                                            "cannot copy {} for snapshot {}: {e}",
                                            source.id, snapshot.id
                                        ))
                                    })?;
                                copied = Some(snapshot.id.clone());
                            }
                            let mut next = state.clone();
                            next.snapshots.insert(snapshot.id.clone(), snapshot.clone());
                            (snapshot, Some(next))
                        }
                    })
                });
                if created.is_err()
                    && let Some(id) = copied
                {
                    let _ = driver.inner.data.remove_snapshot(&id);
                }
                created
            })
            .await?;
        Ok(snapshot.to_csi())
    }

    async fn exec_delete_snapshot(&self, req: &csi::DeleteSnapshotRequest) -> Result<(), CsiError> {
        validate::required("snapshot_id", &req.snapshot_id)?;
        let held = self
            .inner
            .inflight
            .acquire(guard::snapshot_id(&req.snapshot_id))?;
        self.pause("DeleteSnapshot").await;
        let id = req.snapshot_id.clone();
        self.blocking(held, move |driver| {
            driver.mutate(|state| {
                if !state.snapshots.contains_key(&id) {
                    return Ok(((), None));
                }
                let mut next = state.clone();
                next.snapshots.remove(&id);
                Ok(((), Some(next)))
            })?;
            // Record removed first, copy second: a crash in between leaves a copy no record
            // names, which the next start's sweep removes.
            driver.inner.data.remove_snapshot(&id).map_err(|e| {
                CsiError::Internal(format!("cannot remove the copy of snapshot {id}: {e}"))
            })
        })
        .await
    }

    async fn exec_list_snapshots(
        &self,
        req: &csi::ListSnapshotsRequest,
    ) -> Result<csi::ListSnapshotsResponse, CsiError> {
        self.pause("ListSnapshots").await;
        let (id, source) = (req.snapshot_id.clone(), req.source_volume_id.clone());
        let snapshots = self
            .read_blocking(move |state| state::filter_snapshots(state, &id, &source))
            .await?;
        let (page, next_token) = state::page(&snapshots, req.max_entries, &req.starting_token)?;
        Ok(csi::ListSnapshotsResponse {
            entries: page
                .iter()
                .map(|s| csi::list_snapshots_response::Entry {
                    snapshot: Some(s.to_csi()),
                })
                .collect(),
            next_token,
        })
    }

    async fn exec_get_snapshot(
        &self,
        req: &csi::GetSnapshotRequest,
    ) -> Result<csi::Snapshot, CsiError> {
        validate::required("snapshot_id", &req.snapshot_id)?;
        self.pause("GetSnapshot").await;
        let id = req.snapshot_id.clone();
        self.read_blocking(move |state| state::find_snapshot(state, &id).map(|s| s.to_csi()))
            .await?
    }

    // ----------------------------------------------------------------------- node

    async fn exec_node_stage(&self, req: &csi::NodeStageVolumeRequest) -> Result<(), CsiError> {
        let access = validate::node_stage(req)?;
        let held = self
            .inner
            .inflight
            .acquire(guard::volume_id(&req.volume_id))?;
        self.pause("NodeStageVolume").await;
        let req = req.clone();
        self.blocking(held, move |driver| driver.node_stage(&req, access))
            .await
    }

    fn node_stage(
        &self,
        req: &csi::NodeStageVolumeRequest,
        access: AccessKind,
    ) -> Result<(), CsiError> {
        let staging = Path::new(&req.staging_target_path);
        let mut locked = self.lock()?;
        let state = locked.state();
        let volume = find_volume(state, &req.volume_id)?;
        if volume.access != access {
            return Err(CsiError::InvalidArgument(format!(
                "volume {} was created for {:?} access, not {access:?}",
                volume.id, volume.access
            )));
        }
        if let Some(other) = state
            .volumes
            .values()
            .find(|v| v.id != volume.id && v.stagings.contains_key(&req.staging_target_path))
        {
            return Err(CsiError::AlreadyExists(format!(
                "volume {} is staged at {}",
                other.id, req.staging_target_path
            )));
        }
        let recorded = volume.stagings.contains_key(&req.staging_target_path);
        let data = self.inner.data.path(&volume.id, access);
        if access == AccessKind::Mount && !recorded && is_mounted(staging)? {
            return Err(CsiError::AlreadyExists(format!(
                "something else is mounted at {}",
                req.staging_target_path
            )));
        }
        // Record first, mount second: a crash in between leaves a record whose unstage finds
        // nothing mounted, never a mount nobody knows about.
        if !recorded {
            let mut next = state.clone();
            if let Some(v) = next.volumes.get_mut(&req.volume_id) {
                v.stagings
                    .insert(req.staging_target_path.clone(), Staging { access });
            }
            save(&mut locked, next)?;
        }
        let staged = match access {
            AccessKind::Mount => node::ensure_dir(staging).and_then(|()| {
                if mounts::is_mount_point(staging)? {
                    Ok(())
                } else {
                    mounts::bind(&data, staging)
                }
            }),
            // Nothing to prepare: publish binds the volume's file itself.
            AccessKind::Block => Ok(()),
        };
        if let Err(error) = staged {
            if !recorded {
                forget(&mut locked, &req.volume_id, |v| {
                    v.stagings.remove(&req.staging_target_path).is_some()
                });
            }
            return Err(CsiError::Internal(format!(
                "cannot stage {} at {}: {error}",
                req.volume_id, req.staging_target_path
            )));
        }
        Ok(())
    }

    async fn exec_node_unstage(&self, req: &csi::NodeUnstageVolumeRequest) -> Result<(), CsiError> {
        validate::required("volume_id", &req.volume_id)?;
        validate::required("staging_target_path", &req.staging_target_path)?;
        let held = self
            .inner
            .inflight
            .acquire(guard::volume_id(&req.volume_id))?;
        self.pause("NodeUnstageVolume").await;
        let req = req.clone();
        self.blocking(held, move |driver| driver.node_unstage(&req))
            .await
    }

    /// Unmounts the staging path only when it is this volume's: recorded as its staging, or
    /// showing its data (a mount left by a stage whose record was lost). Any other path is not
    /// staged for this volume, which is OK (idempotent) and leaves the path alone. The staging
    /// directory itself is the CO's and stays.
    fn node_unstage(&self, req: &csi::NodeUnstageVolumeRequest) -> Result<(), CsiError> {
        let staging = Path::new(&req.staging_target_path);
        let mut locked = self.lock()?;
        let volume = find_volume(locked.state(), &req.volume_id)?;
        let recorded = volume.stagings.contains_key(&req.staging_target_path);
        if volume.access == AccessKind::Mount {
            let data = self.inner.data.path(&volume.id, volume.access);
            let ours = recorded || shows(staging, &data)?;
            if ours {
                mounts::unmount_all(staging).map_err(|e| {
                    CsiError::Internal(format!("cannot unmount {}: {e}", req.staging_target_path))
                })?;
            } else if is_mounted(staging)? {
                tracing::info!(
                    volume = %volume.id,
                    path = %req.staging_target_path,
                    "not staged there; leaving another mount alone"
                );
            }
        }
        if recorded {
            forget(&mut locked, &req.volume_id, |v| {
                v.stagings.remove(&req.staging_target_path).is_some()
            });
        }
        Ok(())
    }

    async fn exec_node_publish(&self, req: &csi::NodePublishVolumeRequest) -> Result<(), CsiError> {
        let wanted = validate::node_publish(req)?;
        let held = self
            .inner
            .inflight
            .acquire(guard::volume_id(&req.volume_id))?;
        self.pause("NodePublishVolume").await;
        let req = req.clone();
        self.blocking(held, move |driver| driver.node_publish(&req, &wanted))
            .await
    }

    fn node_publish(
        &self,
        req: &csi::NodePublishVolumeRequest,
        wanted: &state::Publication,
    ) -> Result<(), CsiError> {
        let target = Path::new(&req.target_path);
        let mut locked = self.lock()?;
        let state = locked.state();
        let decision = state::decide_node_publish(state, &req.volume_id, &req.target_path, wanted)?;
        let volume = find_volume(state, &req.volume_id)?;
        let data = self.inner.data.path(&volume.id, volume.access);
        // With a staging path, the volume must be staged there; a mount volume is then bound
        // from it. Without one (a CO that skips staging), from the data itself.
        let source = if req.staging_target_path.is_empty() {
            data
        } else if !volume.stagings.contains_key(&req.staging_target_path) {
            return Err(CsiError::FailedPrecondition(format!(
                "volume {} is not staged at {}",
                volume.id, req.staging_target_path
            )));
        } else if wanted.access == AccessKind::Mount {
            let staging = Path::new(&req.staging_target_path);
            self.ensure_staged(&volume.id, &data, staging)?;
            staging.to_path_buf()
        } else {
            data
        };
        let fresh = decision == PublishDecision::Publish;
        // The data file of a block volume published nowhere else, whose loop device a failed
        // publish must not leave behind.
        let alone_block = (wanted.access == AccessKind::Block && volume.publications.is_empty())
            .then(|| self.inner.data.path(&volume.id, volume.access));
        if fresh && is_mounted(target)? {
            return Err(CsiError::AlreadyExists(format!(
                "something else is mounted at {}",
                req.target_path
            )));
        }
        // Record first, mount second: a crash in between leaves a record whose unpublish finds
        // nothing mounted, never a mount nobody knows about (DeleteVolume refuses recorded ones).
        if fresh {
            let mut next = state.clone();
            if let Some(v) = next.volumes.get_mut(&req.volume_id) {
                v.publications
                    .insert(req.target_path.clone(), wanted.clone());
            }
            save(&mut locked, next)?;
        }
        if let Err(error) = node::publish(&source, target, wanted.access, wanted.readonly) {
            if fresh {
                let _ = mounts::unmount_all(target);
                let _ = node::remove_target(target);
                // A loop device attached for this publication alone goes with it.
                if let Some(data) = &alone_block {
                    let _ = node::release_block(data);
                }
                forget(&mut locked, &req.volume_id, |v| {
                    v.publications.remove(&req.target_path).is_some()
                });
            }
            return Err(CsiError::Internal(format!(
                "cannot publish {} at {}: {error}",
                req.volume_id, req.target_path
            )));
        }
        Ok(())
    }

    /// Makes sure a recorded staging path of a mount volume still shows its data before a
    /// publish binds from it: a stage mount that is gone (unmounted behind our back, a reboot)
    /// is bound again, so the pod never gets the bare staging directory; something else
    /// mounted there is FAILED_PRECONDITION.
    fn ensure_staged(&self, id: &str, data: &Path, staging: &Path) -> Result<(), CsiError> {
        if is_mounted(staging)? {
            if shows(staging, data)? {
                return Ok(());
            }
            return Err(CsiError::FailedPrecondition(format!(
                "volume {id} is recorded as staged at {}, but something else is mounted there",
                staging.display()
            )));
        }
        tracing::warn!(volume = id, path = %staging.display(), "stage mount gone; binding the data again");
        node::ensure_dir(staging)
            .and_then(|()| mounts::bind(data, staging))
            .map_err(|e| {
                CsiError::FailedPrecondition(format!(
                    "volume {id} is not mounted at its staging path {} and cannot be again: {e}",
                    staging.display()
                ))
            })
    }

    async fn exec_node_unpublish(
        &self,
        req: &csi::NodeUnpublishVolumeRequest,
    ) -> Result<(), CsiError> {
        validate::required("volume_id", &req.volume_id)?;
        validate::required("target_path", &req.target_path)?;
        let held = self
            .inner
            .inflight
            .acquire(guard::volume_id(&req.volume_id))?;
        self.pause("NodeUnpublishVolume").await;
        let req = req.clone();
        self.blocking(held, move |driver| driver.node_unpublish(&req))
            .await
    }

    /// Unmounts and removes the target only when it is this volume's: recorded as its
    /// publication, or showing its data (a mount left by a publish whose record was lost). A
    /// target this volume is not published at is OK (idempotent, as the spec asks) and is left
    /// alone: it may be another volume's, in another pod.
    fn node_unpublish(&self, req: &csi::NodeUnpublishVolumeRequest) -> Result<(), CsiError> {
        let target = Path::new(&req.target_path);
        let mut locked = self.lock()?;
        let publication =
            state::decide_node_unpublish(locked.state(), &req.volume_id, &req.target_path)?;
        let volume = find_volume(locked.state(), &req.volume_id)?;
        let data = self.inner.data.path(&volume.id, volume.access);
        let mounted = is_mounted(target)?;
        let ours = publication.is_some()
            || (mounted
                && node::shows_volume(target, &data, volume.access).map_err(|e| {
                    CsiError::Internal(format!("cannot read the mount table: {e}"))
                })?);
        if !ours {
            if mounted {
                tracing::info!(
                    volume = %volume.id,
                    path = %req.target_path,
                    "not published there; leaving another mount alone"
                );
            }
            return Ok(());
        }
        if mounted {
            mounts::unmount_all(target).map_err(|e| {
                CsiError::Internal(format!("cannot unmount {}: {e}", req.target_path))
            })?;
        }
        node::remove_target(target).map_err(|error| {
            CsiError::Internal(format!("cannot remove target {}: {error}", req.target_path))
        })?;
        // The last target of a block volume gone: its loop devices go too, before the record
        // does, so a detach that fails is retried with the unpublish.
        let last = volume.access == AccessKind::Block
            && volume.publications.keys().all(|t| t == &req.target_path);
        if last {
            node::release_block(&data).map_err(|e| {
                CsiError::Internal(format!(
                    "cannot detach the loop device of {}: {e}",
                    req.volume_id
                ))
            })?;
        }
        forget(&mut locked, &req.volume_id, |v| {
            v.publications.remove(&req.target_path).is_some()
        });
        Ok(())
    }

    async fn exec_node_get_volume_stats(
        &self,
        req: &csi::NodeGetVolumeStatsRequest,
    ) -> Result<csi::NodeGetVolumeStatsResponse, CsiError> {
        validate::required("volume_id", &req.volume_id)?;
        validate::required("volume_path", &req.volume_path)?;
        self.pause("NodeGetVolumeStats").await;
        let req = req.clone();
        let usage = self
            .unkeyed_blocking(move |driver| driver.node_get_volume_stats(&req))
            .await?;
        Ok(csi::NodeGetVolumeStatsResponse {
            usage,
            volume_condition: None,
        })
    }

    fn node_get_volume_stats(
        &self,
        req: &csi::NodeGetVolumeStatsRequest,
    ) -> Result<Vec<csi::VolumeUsage>, CsiError> {
        let (access, capacity) = self.read(|state| {
            let volume = find_volume(state, &req.volume_id)?;
            let path = req.volume_path.trim_end_matches('/');
            let here = |p: &String| p == &req.volume_path || p.trim_end_matches('/') == path;
            if volume.publications.keys().any(here) || volume.stagings.keys().any(here) {
                Ok((volume.access, volume.capacity_bytes))
            } else {
                Err(CsiError::NotFound(format!(
                    "volume {} is neither published nor staged at {}",
                    volume.id, req.volume_path
                )))
            }
        })??;
        let path = Path::new(&req.volume_path);
        if !path.exists() {
            return Err(CsiError::NotFound(format!(
                "{} does not exist",
                req.volume_path
            )));
        }
        node::stats(path, access, capacity).map_err(|e| {
            CsiError::Internal(format!("cannot read the usage of {}: {e}", req.volume_path))
        })
    }

    /// An RPC this driver does not serve (never, or not with the features it runs with).
    async fn unimplemented<T>(
        &self,
        method: &'static str,
        request: &(dyn Debug + Sync),
    ) -> Result<T, CsiError> {
        self.call(method, request, async move {
            Err(CsiError::Unimplemented(format!(
                "{method} is not served by this reference driver"
            )))
        })
        .await
    }
}

/// Logs one line per finished call, or a cancellation line if the caller gave up first (the
/// call's future is then dropped before it finishes).
struct CallLog {
    method: &'static str,
    started: Instant,
    finished: bool,
}

impl CallLog {
    fn finish<T>(&mut self, result: &Result<T, CsiError>) {
        self.finished = true;
        let elapsed_ms = self.started.elapsed().as_millis();
        match result {
            Ok(_) => {
                tracing::info!(method = self.method, code = ?Code::Ok, elapsed_ms, "CSI call finished")
            }
            Err(e) => {
                tracing::info!(method = self.method, code = ?e.code(), elapsed_ms, error = %e, "CSI call finished")
            }
        }
    }
}

impl Drop for CallLog {
    fn drop(&mut self) {
        if !self.finished {
            let elapsed_ms = self.started.elapsed().as_millis();
            tracing::info!(
                method = self.method,
                elapsed_ms,
                "CSI call cancelled by the caller"
            );
        }
    }
}

async fn inject<T>(method: &'static str, phase: Phase, action: Action) -> Result<T, CsiError> {
    tracing::info!(method, ?phase, ?action, "injecting fault");
    match action {
        Action::Fail(code) => Err(CsiError::Injected(
            code,
            format!("injected fault: {method} {phase:?} returns {code:?}"),
        )),
        Action::Hang => std::future::pending().await,
    }
}

fn now() -> (i64, i32) {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    (
        i64::try_from(since_epoch.as_secs()).unwrap_or(i64::MAX),
        i32::try_from(since_epoch.subsec_nanos()).unwrap_or(0),
    )
}

/// Saves `next` as the state, under the lock the caller holds.
fn save(locked: &mut Locked<'_>, next: State) -> Result<(), CsiError> {
    locked
        .save(next)
        .map_err(|e| CsiError::Internal(e.to_string()))
}

/// Undoes a record when the work it announced failed or was undone: `change` edits the volume
/// and says whether it changed anything. A failed save is logged; the record stays, which only
/// makes a later call do (idempotent) work again.
fn forget(
    locked: &mut Locked<'_>,
    volume_id: &str,
    change: impl FnOnce(&mut VolumeRecord) -> bool,
) {
    let mut next = locked.state().clone();
    let changed = next.volumes.get_mut(volume_id).is_some_and(change);
    if changed && let Err(error) = save(locked, next) {
        tracing::warn!(volume = volume_id, %error, "cannot drop a node record");
    }
}

fn find_volume<'a>(state: &'a State, id: &str) -> Result<&'a VolumeRecord, CsiError> {
    state
        .volumes
        .get(id)
        .ok_or_else(|| CsiError::NotFound(format!("volume {id} does not exist")))
}

/// Whether the mount on `target` shows `source` (see [`mounts::mounted_from`]).
fn shows(target: &Path, source: &Path) -> Result<bool, CsiError> {
    mounts::mounted_from(target, source)
        .map_err(|e| CsiError::Internal(format!("cannot read the mount table: {e}")))
}

fn is_mounted(path: &Path) -> Result<bool, CsiError> {
    mounts::is_mount_point(path)
        .map_err(|e| CsiError::Internal(format!("cannot read the mount table: {e}")))
}

// ------------------------------------------------------------------- gRPC glue

type RpcResult<T> = Result<Response<T>, Status>;

fn reply<T>(result: Result<T, CsiError>) -> RpcResult<T> {
    result.map(Response::new).map_err(Status::from)
}

#[tonic::async_trait]
impl csi::identity_server::Identity for Driver {
    async fn get_plugin_info(
        &self,
        request: Request<csi::GetPluginInfoRequest>,
    ) -> RpcResult<csi::GetPluginInfoResponse> {
        let req = request.into_inner();
        reply(
            self.call("GetPluginInfo", &req, async {
                self.pause("GetPluginInfo").await;
                Ok(csi::GetPluginInfoResponse {
                    name: self.inner.driver_name.clone(),
                    vendor_version: env!("CARGO_PKG_VERSION").to_string(),
                    manifest: Default::default(),
                })
            })
            .await,
        )
    }

    async fn get_plugin_capabilities(
        &self,
        request: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> RpcResult<csi::GetPluginCapabilitiesResponse> {
        let req = request.into_inner();
        reply(
            self.call("GetPluginCapabilities", &req, async {
                self.pause("GetPluginCapabilities").await;
                let mut services = vec![PluginService::ControllerService];
                if !self.inner.node_topology.is_empty()
                    || topology::is_labelled(&self.inner.limits.segments)
                {
                    services.push(PluginService::VolumeAccessibilityConstraints);
                }
                Ok(csi::GetPluginCapabilitiesResponse {
                    capabilities: services
                        .into_iter()
                        .map(|t| csi::PluginCapability {
                            r#type: Some(csi::plugin_capability::Type::Service(
                                csi::plugin_capability::Service { r#type: t as i32 },
                            )),
                        })
                        .collect(),
                })
            })
            .await,
        )
    }

    async fn probe(&self, request: Request<csi::ProbeRequest>) -> RpcResult<csi::ProbeResponse> {
        let req = request.into_inner();
        reply(
            self.call("Probe", &req, async {
                self.pause("Probe").await;
                Ok(csi::ProbeResponse { ready: Some(true) })
            })
            .await,
        )
    }
}

#[tonic::async_trait]
impl csi::controller_server::Controller for Driver {
    async fn create_volume(
        &self,
        request: Request<csi::CreateVolumeRequest>,
    ) -> RpcResult<csi::CreateVolumeResponse> {
        let req = request.into_inner();
        self.log_request(|| request_log::create_volume_json(&req));
        let result = self
            .call_as(
                "CreateVolume",
                create_volume_call(&req),
                &req,
                self.exec_create_volume(&req),
            )
            .await;
        reply(result.map(|volume| csi::CreateVolumeResponse {
            volume: Some(volume),
        }))
    }

    async fn delete_volume(
        &self,
        request: Request<csi::DeleteVolumeRequest>,
    ) -> RpcResult<csi::DeleteVolumeResponse> {
        let req = request.into_inner();
        let result = self
            .call("DeleteVolume", &req, self.exec_delete_volume(&req))
            .await;
        reply(result.map(|()| csi::DeleteVolumeResponse {}))
    }

    async fn controller_publish_volume(
        &self,
        request: Request<csi::ControllerPublishVolumeRequest>,
    ) -> RpcResult<csi::ControllerPublishVolumeResponse> {
        reply(
            self.unimplemented("ControllerPublishVolume", &request.into_inner())
                .await,
        )
    }

    async fn controller_unpublish_volume(
        &self,
        request: Request<csi::ControllerUnpublishVolumeRequest>,
    ) -> RpcResult<csi::ControllerUnpublishVolumeResponse> {
        reply(
            self.unimplemented("ControllerUnpublishVolume", &request.into_inner())
                .await,
        )
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<csi::ValidateVolumeCapabilitiesRequest>,
    ) -> RpcResult<csi::ValidateVolumeCapabilitiesResponse> {
        let req = request.into_inner();
        reply(
            self.call(
                "ValidateVolumeCapabilities",
                &req,
                self.exec_validate_volume_capabilities(&req),
            )
            .await,
        )
    }

    async fn list_volumes(
        &self,
        request: Request<csi::ListVolumesRequest>,
    ) -> RpcResult<csi::ListVolumesResponse> {
        let req = request.into_inner();
        reply(
            self.call("ListVolumes", &req, self.exec_list_volumes(&req))
                .await,
        )
    }

    async fn get_capacity(
        &self,
        request: Request<csi::GetCapacityRequest>,
    ) -> RpcResult<csi::GetCapacityResponse> {
        let req = request.into_inner();
        if !self.inner.features.get_capacity {
            return reply(self.unimplemented("GetCapacity", &req).await);
        }
        reply(
            self.call("GetCapacity", &req, self.exec_get_capacity(&req))
                .await,
        )
    }

    async fn controller_get_capabilities(
        &self,
        request: Request<csi::ControllerGetCapabilitiesRequest>,
    ) -> RpcResult<csi::ControllerGetCapabilitiesResponse> {
        let req = request.into_inner();
        reply(
            self.call("ControllerGetCapabilities", &req, async {
                self.pause("ControllerGetCapabilities").await;
                Ok(csi::ControllerGetCapabilitiesResponse {
                    capabilities: self
                        .inner
                        .controller_capabilities
                        .iter()
                        .map(|t| csi::ControllerServiceCapability {
                            r#type: Some(csi::controller_service_capability::Type::Rpc(
                                csi::controller_service_capability::Rpc { r#type: *t as i32 },
                            )),
                        })
                        .collect(),
                })
            })
            .await,
        )
    }

    async fn create_snapshot(
        &self,
        request: Request<csi::CreateSnapshotRequest>,
    ) -> RpcResult<csi::CreateSnapshotResponse> {
        let req = request.into_inner();
        self.log_request(|| request_log::create_snapshot_json(&req));
        if !self.inner.features.snapshots {
            return reply(self.unimplemented("CreateSnapshot", &req).await);
        }
        let result = self
            .call("CreateSnapshot", &req, self.exec_create_snapshot(&req))
            .await;
        reply(result.map(|snapshot| csi::CreateSnapshotResponse {
            snapshot: Some(snapshot),
        }))
    }

    async fn delete_snapshot(
        &self,
        request: Request<csi::DeleteSnapshotRequest>,
    ) -> RpcResult<csi::DeleteSnapshotResponse> {
        let req = request.into_inner();
        self.log_request(|| request_log::delete_snapshot_json(&req));
        if !self.inner.features.snapshots {
            return reply(self.unimplemented("DeleteSnapshot", &req).await);
        }
        let result = self
            .call("DeleteSnapshot", &req, self.exec_delete_snapshot(&req))
            .await;
        reply(result.map(|()| csi::DeleteSnapshotResponse {}))
    }

    async fn list_snapshots(
        &self,
        request: Request<csi::ListSnapshotsRequest>,
    ) -> RpcResult<csi::ListSnapshotsResponse> {
        let req = request.into_inner();
        if !self.inner.features.snapshots {
            return reply(self.unimplemented("ListSnapshots", &req).await);
        }
        reply(
            self.call("ListSnapshots", &req, self.exec_list_snapshots(&req))
                .await,
        )
    }

    async fn get_snapshot(
        &self,
        request: Request<csi::GetSnapshotRequest>,
    ) -> RpcResult<csi::GetSnapshotResponse> {
        let req = request.into_inner();
        if !self.inner.features.snapshots {
            return reply(self.unimplemented("GetSnapshot", &req).await);
        }
        let result = self
            .call("GetSnapshot", &req, self.exec_get_snapshot(&req))
            .await;
        reply(result.map(|snapshot| csi::GetSnapshotResponse {
            snapshot: Some(snapshot),
        }))
    }

    async fn controller_expand_volume(
        &self,
        request: Request<csi::ControllerExpandVolumeRequest>,
    ) -> RpcResult<csi::ControllerExpandVolumeResponse> {
        reply(
            self.unimplemented("ControllerExpandVolume", &request.into_inner())
                .await,
        )
    }

    async fn controller_get_volume(
        &self,
        request: Request<csi::ControllerGetVolumeRequest>,
    ) -> RpcResult<csi::ControllerGetVolumeResponse> {
        reply(
            self.unimplemented("ControllerGetVolume", &request.into_inner())
                .await,
        )
    }

    async fn controller_modify_volume(
        &self,
        request: Request<csi::ControllerModifyVolumeRequest>,
    ) -> RpcResult<csi::ControllerModifyVolumeResponse> {
        reply(
            self.unimplemented("ControllerModifyVolume", &request.into_inner())
                .await,
        )
    }
}

#[tonic::async_trait]
impl csi::node_server::Node for Driver {
    async fn node_stage_volume(
        &self,
        request: Request<csi::NodeStageVolumeRequest>,
    ) -> RpcResult<csi::NodeStageVolumeResponse> {
        let req = request.into_inner();
        let result = self
            .call("NodeStageVolume", &req, self.exec_node_stage(&req))
            .await;
        reply(result.map(|()| csi::NodeStageVolumeResponse {}))
    }

    async fn node_unstage_volume(
        &self,
        request: Request<csi::NodeUnstageVolumeRequest>,
    ) -> RpcResult<csi::NodeUnstageVolumeResponse> {
        let req = request.into_inner();
        let result = self
            .call("NodeUnstageVolume", &req, self.exec_node_unstage(&req))
            .await;
        reply(result.map(|()| csi::NodeUnstageVolumeResponse {}))
    }

    async fn node_publish_volume(
        &self,
        request: Request<csi::NodePublishVolumeRequest>,
    ) -> RpcResult<csi::NodePublishVolumeResponse> {
        let req = request.into_inner();
        let result = self
            .call("NodePublishVolume", &req, self.exec_node_publish(&req))
            .await;
        reply(result.map(|()| csi::NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> RpcResult<csi::NodeUnpublishVolumeResponse> {
        let req = request.into_inner();
        let result = self
            .call("NodeUnpublishVolume", &req, self.exec_node_unpublish(&req))
            .await;
        reply(result.map(|()| csi::NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<csi::NodeGetVolumeStatsRequest>,
    ) -> RpcResult<csi::NodeGetVolumeStatsResponse> {
        let req = request.into_inner();
        reply(
            self.call(
                "NodeGetVolumeStats",
                &req,
                self.exec_node_get_volume_stats(&req),
            )
            .await,
        )
    }

    async fn node_expand_volume(
        &self,
        request: Request<csi::NodeExpandVolumeRequest>,
    ) -> RpcResult<csi::NodeExpandVolumeResponse> {
        reply(
            self.unimplemented("NodeExpandVolume", &request.into_inner())
                .await,
        )
    }

    async fn node_get_capabilities(
        &self,
        request: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> RpcResult<csi::NodeGetCapabilitiesResponse> {
        let req = request.into_inner();
        reply(
            self.call("NodeGetCapabilities", &req, async {
                self.pause("NodeGetCapabilities").await;
                Ok(csi::NodeGetCapabilitiesResponse {
                    capabilities: NODE_CAPABILITIES
                        .iter()
                        .map(|t| csi::NodeServiceCapability {
                            r#type: Some(csi::node_service_capability::Type::Rpc(
                                csi::node_service_capability::Rpc { r#type: *t as i32 },
                            )),
                        })
                        .collect(),
                })
            })
            .await,
        )
    }

    async fn node_get_info(
        &self,
        request: Request<csi::NodeGetInfoRequest>,
    ) -> RpcResult<csi::NodeGetInfoResponse> {
        let req = request.into_inner();
        reply(
            self.call("NodeGetInfo", &req, async {
                self.pause("NodeGetInfo").await;
                Ok(csi::NodeGetInfoResponse {
                    node_id: self.inner.node_id.clone(),
                    max_volumes_per_node: 0,
                    accessible_topology: (!self.inner.node_topology.is_empty())
                        .then(|| state::to_csi_topology(&self.inner.node_topology)),
                })
            })
            .await,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publish_unpublish_is_advertised_only_with_attach_required() {
        let all = controller_capabilities(Features::default(), false);
        assert!(!all.contains(&ControllerRpc::PublishUnpublishVolume));
        let attaching = controller_capabilities(Features::default(), true);
        assert!(attaching.contains(&ControllerRpc::PublishUnpublishVolume));
        assert_eq!(attaching.len(), all.len() + 1);
    }

    #[test]
    fn snapshot_and_clone_capabilities_follow_the_features() {
        use ControllerRpc::{
            CloneVolume, CreateDeleteSnapshot, GetCapacity, GetSnapshot, ListSnapshots,
        };
        let all = controller_capabilities(Features::default(), false);
        for rpc in [
            CreateDeleteSnapshot,
            ListSnapshots,
            GetSnapshot,
            CloneVolume,
            GetCapacity,
        ] {
            assert!(all.contains(&rpc), "{rpc:?}");
        }
        let none = controller_capabilities(
            Features {
                snapshots: false,
                clone: false,
                get_capacity: false,
                modify_volume: false,
            },
            false,
        );
        assert_eq!(none, CONTROLLER_CAPABILITIES);
        let clone_only = controller_capabilities(
            Features {
                snapshots: false,
                clone: true,
                get_capacity: false,
                modify_volume: false,
            },
            false,
        );
        assert_eq!(clone_only.last(), Some(&CloneVolume));
        assert_eq!(clone_only.len(), CONTROLLER_CAPABILITIES.len() + 1);
        assert!(!all.contains(&ControllerRpc::ModifyVolume));
        let modifying = Features {
            modify_volume: true,
            ..Features::default()
        };
        let modifying = controller_capabilities(modifying, false);
        assert_eq!(modifying.last(), Some(&ControllerRpc::ModifyVolume));
    }

    #[test]
    fn create_volume_calls_are_named_by_their_source() {
        use csi::volume_content_source::{SnapshotSource, Type, VolumeSource};
        let with = |source: Option<Type>| csi::CreateVolumeRequest {
            volume_content_source: source.map(|t| csi::VolumeContentSource { r#type: Some(t) }),
            ..Default::default()
        };
        assert_eq!(create_volume_call(&with(None)), "CreateVolume");
        assert_eq!(
            create_volume_call(&with(Some(Type::Snapshot(SnapshotSource::default())))),
            "CreateVolume/snapshot"
        );
        assert_eq!(
            create_volume_call(&with(Some(Type::Volume(VolumeSource::default())))),
            "CreateVolume/volume"
        );
    }
}
