//! A small reference CSI driver for testing the provisioner: volumes and snapshots recorded in a
//! JSON file, each volume's data a directory or sparse file next to it, plus fault injection. It
//! serves Identity, Controller and Node on one unix socket. Kubelet plugin registration is not
//! ours: `csi-registrar` (hack/registrar/, Go) does it beside the node plugin.
//! docs/reference-driver.md is the user-facing description; this comment is the design summary.
//!
//! # What it implements
//! - Identity: GetPluginInfo, GetPluginCapabilities (CONTROLLER_SERVICE, and
//!   VOLUME_ACCESSIBILITY_CONSTRAINTS when `--topology` or `--segment` is set), Probe.
//! - Controller: CreateVolume (from nothing, a snapshot or a volume), DeleteVolume, ListVolumes,
//!   GetCapacity, ValidateVolumeCapabilities, ControllerGetCapabilities, CreateSnapshot,
//!   DeleteSnapshot, ListSnapshots, GetSnapshot. Advertised: CREATE_DELETE_VOLUME, LIST_VOLUMES,
//!   GET_CAPACITY, CREATE_DELETE_SNAPSHOT, LIST_SNAPSHOTS, GET_SNAPSHOT, CLONE_VOLUME.
//!   `--no-snapshots` and `--no-clone` ([`Features`]) withdraw the snapshot capabilities and
//!   CLONE_VOLUME: their RPCs answer UNIMPLEMENTED and such sources INVALID_ARGUMENT, so tests can
//!   watch a sidecar refuse what its driver cannot do. Snapshots are independent copies of
//!   their source's data (`data`), restored as clones are: a volume with snapshots may be
//!   deleted. A restore or clone is placed in its source's segment
//!   when the requirements allow it.
//! - Node (STAGE_UNSTAGE_VOLUME, GET_VOLUME_STATS): NodeStageVolume bind-mounts a mount
//!   volume's data directory on the staging path; NodePublishVolume bind-mounts the staging path
//!   (or, for a block volume, a loop device backed by its `.block` file: `loopdev`) on the
//!   target, read-only if asked, binding the data to
//!   the staging path again if that mount is gone; NodeUnpublishVolume unmounts the target and
//!   removes it, NodeUnstageVolume unmounts the staging path and leaves the directory (the CO's)
//!   in place, both only for a path the volume records (or whose mount shows the volume's data):
//!   any other path is answered OK and left alone. Staging and target paths must be absolute.
//!   NodeGetVolumeStats is `statvfs` (or a block volume's size); NodeGetInfo. Mounts use the
//!   mount(2) syscall through rustix (`mounts`), so they need root. Stagings and publications are
//!   recorded before mounting. `node` holds the filesystem side. The blocking part of every RPC
//!   (flock, mount(2), mountinfo, data copies) runs on tokio's blocking pool.
//! - Every other RPC answers UNIMPLEMENTED.
//!
//! Errors follow the spec exactly: arguments are validated before any lookup; unknown ids are
//! NOT_FOUND (or OK for deletes), never INVALID_ARGUMENT; a reused name with incompatible
//! arguments is ALREADY_EXISTS; `--capacity` and `--max-volume-size` make RESOURCE_EXHAUSTED and
//! OUT_OF_RANGE reachable; a call that names a volume, volume name or snapshot another call is
//! still working on is ABORTED (per-object in-flight keys, never a global lock).
//!
//! # Topology
//! Like a local-storage driver, it creates volumes in segments (`--segment`, or the one
//! `--topology` segment), each with its own capacity. CreateVolume takes the first segment that
//! matches a preferred, then a requisite term and still has room, and stores it with the volume;
//! GetCapacity counts the segments a term matches; NodeGetInfo reports `--topology`. The rules
//! are in `topology`.
//!
//! # State
//! `<state-dir>/state.json` holds every volume, snapshot, node staging and publication. It is
//! replaced atomically (temp file, fsync, rename, directory fsync) before a change is
//! acknowledged, and loaded at start, so volumes survive restarts and tests can count them after
//! chaos. Several processes may share the directory: every access holds an exclusive flock on
//! `state.json.lock` for the whole read-modify-write and re-reads the file each time (`store`). Volume data lives in `<state-dir>/volumes/` (`data`): made before the
//! record is saved, removed after the record is; data without a record is removed at start.
//!
//! # Fault injection
//! Modelled as pre/post hooks around every RPC:
//! 1. before-faults fire first, before validation or any change;
//! 2. then the RPC validates its arguments and takes its in-flight keys;
//! 3. then the delay for the method is slept (so a delayed call keeps its volume busy, which is
//!    how ABORTED is provoked);
//! 4. then the real work happens and is persisted;
//! 5. after-faults fire only if the work succeeded, replacing the reply: e.g. the volume exists but
//!    the caller sees DEADLINE_EXCEEDED.
//!
//! Rules: `--delay METHOD=DURATION` (`CreateVolume=2s`, `*=50ms`; durations `0`, `Nms`, `Ns`,
//! `Nm`, `Nh`; a call kind beats its method, which beats `*`) and `--fault METHOD=PHASE:ACTION[:COUNT]` where PHASE is
//! `before` or `after`, ACTION is a gRPC code name (`deadline-exceeded`, `UNAVAILABLE`, ...) or
//! `hang` (never answer; ends when the caller cancels or its deadline passes), and COUNT is how
//! many calls it fires for (default `always`). Several faults for one method fire in the order
//! given, each until its count is used up. METHOD may also be a kind of call:
//! `CreateVolume/snapshot` (a restore) or `CreateVolume/volume` (a clone); a `CreateVolume` rule
//! matches those too.
//!
//! While running, the control file (`--control-file`, default `<state-dir>/faults.txt`) is checked
//! at the start of every RPC; whenever it appears or changes (mtime, size or inode) its rules
//! replace the whole rule set with fresh counts, and when it is deleted no rule remains. One rule
//! per line: `delay SPEC` or `fault SPEC` with the flag syntax; `#` starts a comment. Write it
//! atomically (temp file + rename) so a half-written file is never read; an unparsable file is
//! logged and ignored.

mod config;
mod data;
mod faults;
mod guard;
mod loopdev;
pub mod mounts;
mod node;
mod request_log;
mod service;
mod socket;
mod state;
mod store;
mod topology;
mod validate;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;

pub use config::{
    CONTROL_FILE, Cli, ConfigError, DEFAULT_DRIVER_NAME, DEFAULT_NODE_ID, DEFAULT_SOCKET_MODE,
    DriverConfig, SegmentFlag,
};
pub use data::{VOLUMES_DIR, VolumeData};
pub use faults::{
    Action, DelayRule, FaultParseError, FaultRule, FaultRules, MethodPattern, Phase, Times,
};
pub use request_log::RequestLog;
pub use service::Driver;
pub use socket::SocketError;
pub use state::{
    AccessKind, ContentSource, Features, Limits, Publication, SnapshotRecord, Staging, State,
    VolumeRecord,
};
pub use store::{LOCK_FILE, STATE_FILE, StoreError, load_state};
pub use topology::{Labels, Segment};

/// How long in-flight calls may run on after a shutdown request before the server stops anyway
/// (a call hung by a fault would otherwise block shutdown forever).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

#[derive(Debug, Error)]
pub enum DriverError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("state: {0}")]
    Store(#[from] StoreError),
    #[error("request log {path}: {source}")]
    RequestLog {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("endpoint: {0}")]
    Socket(#[from] SocketError),
    #[error("cannot install signal handler: {0}")]
    Signal(std::io::Error),
    #[error("gRPC server failed: {0}")]
    Serve(#[from] tonic::transport::Error),
}

/// A driver whose socket exists and accepts connections; [`BoundDriver::serve`] answers them.
pub struct BoundDriver {
    driver: Driver,
    listener: UnixListener,
    endpoint: PathBuf,
    socket: socket::SocketId,
}

/// Loads the state and creates the socket (mode `--socket-mode`, 0600 by default). Once this
/// returns, clients may connect.
pub fn bind(config: &DriverConfig) -> Result<BoundDriver, DriverError> {
    let mut driver = Driver::open(config)?;
    if let Some(path) = &config.request_log {
        let log = RequestLog::open(path).map_err(|source| DriverError::RequestLog {
            path: path.clone(),
            source,
        })?;
        driver = driver.with_request_log(log);
    }
    let (listener, socket) = socket::bind_with_mode(&config.endpoint, config.socket_mode)?;
    tracing::info!(
        endpoint = %config.endpoint.display(),
        driver = %config.driver_name,
        node = %config.node_id,
        "CSI reference driver listening"
    );
    Ok(BoundDriver {
        driver,
        listener,
        endpoint: config.endpoint.clone(),
        socket,
    })
}

impl BoundDriver {
    /// Serves until `shutdown` completes, then removes the socket and lets running calls finish
    /// for a short grace period.
    pub async fn serve(self, shutdown: impl Future<Output = ()>) -> Result<(), DriverError> {
        let stop = Arc::new(tokio::sync::Notify::new());
        let stopped = stop.clone();
        let server = tonic::transport::Server::builder()
            .add_service(csi_spec::identity_server::IdentityServer::new(
                self.driver.clone(),
            ))
            .add_service(csi_spec::controller_server::ControllerServer::new(
                self.driver.clone(),
            ))
            .add_service(csi_spec::node_server::NodeServer::new(self.driver))
            .serve_with_incoming_shutdown(UnixListenerStream::new(self.listener), async move {
                stopped.notified().await;
            });
        tokio::pin!(server);
        tokio::pin!(shutdown);
        let result = tokio::select! {
            result = &mut server => result,
            () = &mut shutdown => {
                tracing::info!("shutting down");
                socket::remove_if_ours(&self.endpoint, self.socket);
                stop.notify_one();
                match tokio::time::timeout(SHUTDOWN_GRACE, &mut server).await {
                    Ok(result) => result,
                    Err(_) => {
                        tracing::warn!(grace = ?SHUTDOWN_GRACE, "calls still running after the grace period; stopping anyway");
                        Ok(())
                    }
                }
            }
        };
        socket::remove_if_ours(&self.endpoint, self.socket);
        result.map_err(DriverError::from)
    }
}

/// Binds and serves until `shutdown` completes.
pub async fn run(
    config: &DriverConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<(), DriverError> {
    bind(config)?.serve(shutdown).await
}

/// Completes on the first SIGTERM or SIGINT. Installs the handlers immediately, so a signal that
/// arrives before the future is first polled is not lost.
pub fn termination_signal() -> Result<impl Future<Output = ()>, DriverError> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).map_err(DriverError::Signal)?;
    let mut int = signal(SignalKind::interrupt()).map_err(DriverError::Signal)?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = int.recv() => tracing::info!("SIGINT received"),
        }
    })
}
