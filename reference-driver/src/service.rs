//! The Identity, Controller and Node services: each RPC validates, takes its in-flight keys,
//! waits out any injected delay, applies a pure decision from `state` and persists the result,
//! all wrapped in the fault hooks and the per-call log line.

use std::fmt::Debug;
use std::fs;
use std::future::Future;
use std::io;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use tonic::{Code, Request, Response, Status};
use uuid::Uuid;

use csi_spec as csi;
use csi_spec::controller_service_capability::rpc::Type as ControllerRpc;
use csi_spec::plugin_capability::service::Type as PluginService;

use super::config::DriverConfig;
use super::faults::{Action, FaultInjector, Phase};
use super::guard::{self, InFlight};
use super::request_log::{self, RequestLog};
use super::state::{
    self, AccessKind, CreateSnapshotDecision, CreateVolumeDecision, CsiError, Features, Limits,
    PublishDecision, State,
};
use super::store::{Store, StoreError};
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
    store: Store,
    /// Held only for decide + save + commit, never across an await, so a cancelled call cannot
    /// leave memory and disk disagreeing.
    state: Mutex<State>,
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
        let state = store.load()?;
        tracing::info!(
            state = %store.path().display(),
            volumes = state.volumes.len(),
            snapshots = state.snapshots.len(),
            "state loaded"
        );
        Ok(Self {
            inner: Arc::new(Inner {
                driver_name: config.driver_name.clone(),
                node_id: config.node_id.clone(),
                node_topology: config.node_topology.clone(),
                limits: config.limits.clone(),
                store,
                state: Mutex::new(state),
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

    fn state(&self) -> MutexGuard<'_, State> {
        // Every update replaces the whole state in one assignment after a successful save, so
        // the value behind a poisoned lock is still a consistent state.
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `decide` on the current state; when it returns a new state, saves it and only then
    /// makes it current.
    fn mutate<T>(
        &self,
        decide: impl FnOnce(&State) -> Result<(T, Option<State>), CsiError>,
    ) -> Result<T, CsiError> {
        let mut state = self.state();
        let (value, next) = decide(&state)?;
        if let Some(next) = next {
            self.inner
                .store
                .save(&next)
                .map_err(|e| CsiError::Internal(e.to_string()))?;
            *state = next;
        }
        Ok(value)
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
        let mut held = self
            .inner
            .inflight
            .acquire(guard::volume_name(&args.name))?;
        self.pause(create_volume_call(req)).await;
        let new_id = match &self.inner.volume_id_prefix {
            Some(prefix) => format!("{prefix}{}", args.name),
            None => format!("vol-{}", Uuid::new_v4()),
        };
        let volume = self.mutate(|state| {
            if let Some(existing) = state.volume_by_name(&args.name) {
                held.add(guard::volume_id(&existing.id))?;
            }
            let decision = state::decide_create_volume(state, &args, &self.inner.limits, new_id)?;
            Ok(match decision {
                CreateVolumeDecision::Existing(volume) => (volume, None),
                CreateVolumeDecision::Create(volume) => {
                    let mut next = state.clone();
                    next.volumes.insert(volume.id.clone(), volume.clone());
                    (volume, Some(next))
                }
            })
        })?;
        Ok(volume.to_csi())
    }

    async fn exec_delete_volume(&self, req: &csi::DeleteVolumeRequest) -> Result<(), CsiError> {
        validate::required("volume_id", &req.volume_id)?;
        let _held = self
            .inner
            .inflight
            .acquire(guard::volume_id(&req.volume_id))?;
        self.pause("DeleteVolume").await;
        self.mutate(|state| {
            Ok(match state::decide_delete_volume(state, &req.volume_id)? {
                None => ((), None),
                Some(volume) => {
                    let mut next = state.clone();
                    next.volumes.remove(&volume.id);
                    ((), Some(next))
                }
            })
        })
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
        let access = self
            .state()
            .volumes
            .get(&req.volume_id)
            .map(|v| v.access)
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
        let volumes: Vec<_> = self.state().volumes.values().cloned().collect();
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
        let usage = self.state().usage();
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
        let mut held = self
            .inner
            .inflight
            .acquire(guard::snapshot_name(&req.name))?;
        self.pause("CreateSnapshot").await;
        let new_id = format!("snap-{}", Uuid::new_v4());
        let snapshot = self.mutate(|state| {
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
                    let mut next = state.clone();
                    next.snapshots.insert(snapshot.id.clone(), snapshot.clone());
                    (snapshot, Some(next))
                }
            })
        })?;
        Ok(snapshot.to_csi())
    }

    async fn exec_delete_snapshot(&self, req: &csi::DeleteSnapshotRequest) -> Result<(), CsiError> {
        validate::required("snapshot_id", &req.snapshot_id)?;
        let _held = self
            .inner
            .inflight
            .acquire(guard::snapshot_id(&req.snapshot_id))?;
        self.pause("DeleteSnapshot").await;
        self.mutate(|state| {
            if !state.snapshots.contains_key(&req.snapshot_id) {
                return Ok(((), None));
            }
            let mut next = state.clone();
            next.snapshots.remove(&req.snapshot_id);
            Ok(((), Some(next)))
        })
    }

    async fn exec_list_snapshots(
        &self,
        req: &csi::ListSnapshotsRequest,
    ) -> Result<csi::ListSnapshotsResponse, CsiError> {
        self.pause("ListSnapshots").await;
        let snapshots =
            state::filter_snapshots(&self.state(), &req.snapshot_id, &req.source_volume_id);
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
        state::find_snapshot(&self.state(), &req.snapshot_id).map(|s| s.to_csi())
    }

    // ----------------------------------------------------------------------- node

    async fn exec_node_publish(&self, req: &csi::NodePublishVolumeRequest) -> Result<(), CsiError> {
        let wanted = validate::node_publish(req)?;
        let _held = self
            .inner
            .inflight
            .acquire(guard::volume_id(&req.volume_id))?;
        self.pause("NodePublishVolume").await;
        // Record first, create second: a crash in between leaves a record whose unpublish is a
        // no-op, never a directory nobody knows about.
        let decision = self.mutate(|state| {
            let decision =
                state::decide_node_publish(state, &req.volume_id, &req.target_path, &wanted)?;
            if decision == PublishDecision::AlreadyPublished {
                return Ok((decision, None));
            }
            let mut next = state.clone();
            if let Some(volume) = next.volumes.get_mut(&req.volume_id) {
                volume
                    .publications
                    .insert(req.target_path.clone(), wanted.clone());
            }
            Ok((decision, Some(next)))
        })?;
        if let Err(error) = create_target(Path::new(&req.target_path), wanted.access) {
            if decision == PublishDecision::Publish {
                self.forget_publication(&req.volume_id, &req.target_path)?;
            }
            return Err(CsiError::Internal(format!(
                "cannot create target {}: {error}",
                req.target_path
            )));
        }
        Ok(())
    }

    async fn exec_node_unpublish(
        &self,
        req: &csi::NodeUnpublishVolumeRequest,
    ) -> Result<(), CsiError> {
        validate::required("volume_id", &req.volume_id)?;
        validate::required("target_path", &req.target_path)?;
        let _held = self
            .inner
            .inflight
            .acquire(guard::volume_id(&req.volume_id))?;
        self.pause("NodeUnpublishVolume").await;
        let publication =
            state::decide_node_unpublish(&self.state(), &req.volume_id, &req.target_path)?;
        let Some(publication) = publication else {
            return Ok(());
        };
        remove_target(Path::new(&req.target_path), publication.access).map_err(|error| {
            CsiError::Internal(format!("cannot remove target {}: {error}", req.target_path))
        })?;
        self.forget_publication(&req.volume_id, &req.target_path)
    }

    fn forget_publication(&self, volume_id: &str, target: &str) -> Result<(), CsiError> {
        self.mutate(|state| {
            let mut next = state.clone();
            let removed = next
                .volumes
                .get_mut(volume_id)
                .and_then(|v| v.publications.remove(target));
            Ok(((), removed.map(|_| next)))
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

/// A directory for mount access, an empty file standing in for the device for block access.
fn create_target(path: &Path, access: AccessKind) -> io::Result<()> {
    match access {
        AccessKind::Mount => match fs::create_dir(path) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && path.is_dir() => Ok(()),
            other => other,
        },
        AccessKind::Block => {
            if path.is_dir() {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    "a directory is in the way",
                ));
            }
            fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)
                .map(drop)
        }
    }
}

fn remove_target(path: &Path, access: AccessKind) -> io::Result<()> {
    let removed = match access {
        AccessKind::Mount => fs::remove_dir(path),
        AccessKind::Block => fs::remove_file(path),
    };
    match removed {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
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
        reply(
            self.unimplemented("NodeStageVolume", &request.into_inner())
                .await,
        )
    }

    async fn node_unstage_volume(
        &self,
        request: Request<csi::NodeUnstageVolumeRequest>,
    ) -> RpcResult<csi::NodeUnstageVolumeResponse> {
        reply(
            self.unimplemented("NodeUnstageVolume", &request.into_inner())
                .await,
        )
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
        reply(
            self.unimplemented("NodeGetVolumeStats", &request.into_inner())
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
                    capabilities: Vec::new(),
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
