//! The sidecar's client of the CSI driver: connection over the driver's unix domain socket,
//! start-up handshake (Probe until ready, GetPluginInfo, capabilities), and the calls the
//! sidecar makes, each bounded by `--timeout`, logged with secrets redacted and measured in
//! `csi_sidecar_operations_seconds`.
//!
//! Typical use in `main`:
//! ```no_run
//! # async fn run(address: &str, timeout: std::time::Duration) -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use csi_provisioner::csi_client::{parse_csi_address, ClientOptions, CsiClient};
//! use csi_provisioner::metrics::Metrics;
//!
//! let metrics = Arc::new(Metrics::new());
//! let path = parse_csi_address(address)?;
//! let options = ClientOptions { call_timeout: timeout, ..ClientOptions::default() };
//! let (client, driver) = CsiClient::start(&path, options, metrics).await?;
//! println!("driver {} can provision: {}", driver.name, driver.can_provision());
//! # Ok(()) }
//! ```
//!
//! Unlike upstream, a lost connection does not end the process: the channel reconnects on the
//! next call (a restarted driver re-creates its socket at the same path), and calls that were in
//! flight fail with [`CallError::Transport`] (`Unavailable`, [`ErrorClass::InProgress`]).

mod address;
mod connect;
mod driver_info;
mod error;
#[cfg(test)]
mod tests;

use std::fmt;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tonic::transport::Channel;
use tonic::{Code, Status};
use tracing::{info, trace, warn};

use crate::csi::controller_client::ControllerClient;
use crate::csi::identity_client::IdentityClient;
use crate::csi::node_client::NodeClient;
use crate::csi::{
    ControllerGetCapabilitiesRequest, ControllerGetCapabilitiesResponse, CreateVolumeRequest,
    CreateVolumeResponse, DeleteVolumeRequest, DeleteVolumeResponse, GetCapacityRequest,
    GetCapacityResponse, GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse,
    GetPluginInfoRequest, GetPluginInfoResponse, ListVolumesRequest, ListVolumesResponse,
    NodeGetInfoRequest, NodeGetInfoResponse, ProbeRequest, ProbeResponse,
};
use crate::metrics::{Metrics, UNKNOWN_DRIVER};
use crate::provision::InTreePlugin;

pub use address::parse_csi_address;
pub use driver_info::{DriverInfo, validate_driver_name};

tokio::task_local! {
    /// Whether the calls of the current task are made for an in-tree volume (a migrated claim
    /// or PV): the `migrated` label of their metric samples. Set by the reconcilers around one
    /// claim's or PV's work, as upstream sets it in the call's context, so that every driver
    /// call on the way (CreateVolume, a clean-up DeleteVolume) is labelled without each
    /// carrying it.
    static MIGRATED_CALLS: bool;
}

/// Runs `work` with its driver calls labelled `migrated="<migrated>"` (for a driver that is
/// a migration target; other drivers' samples have no such label).
pub async fn migrated_calls<F: Future>(migrated: bool, work: F) -> F::Output {
    MIGRATED_CALLS.scope(migrated, work).await
}
pub use error::{
    CallError, Error, ErrorClass, classify, go_code_name, is_infeasible, status_code_label,
};

/// Full gRPC paths of the CSI methods the sidecar calls (the `method_name` metric label).
pub mod method {
    /// Identity.Probe
    pub const PROBE: &str = "/csi.v1.Identity/Probe";
    /// Identity.GetPluginInfo
    pub const GET_PLUGIN_INFO: &str = "/csi.v1.Identity/GetPluginInfo";
    /// Identity.GetPluginCapabilities
    pub const GET_PLUGIN_CAPABILITIES: &str = "/csi.v1.Identity/GetPluginCapabilities";
    /// Controller.ControllerGetCapabilities
    pub const CONTROLLER_GET_CAPABILITIES: &str = "/csi.v1.Controller/ControllerGetCapabilities";
    /// Controller.CreateVolume
    pub const CREATE_VOLUME: &str = "/csi.v1.Controller/CreateVolume";
    /// Controller.DeleteVolume
    pub const DELETE_VOLUME: &str = "/csi.v1.Controller/DeleteVolume";
    /// Controller.GetCapacity
    pub const GET_CAPACITY: &str = "/csi.v1.Controller/GetCapacity";
    /// Controller.ListVolumes
    pub const LIST_VOLUMES: &str = "/csi.v1.Controller/ListVolumes";
    /// Node.NodeGetInfo
    pub const NODE_GET_INFO: &str = "/csi.v1.Node/NodeGetInfo";
}

/// Timing of the client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientOptions {
    /// Bound of every CSI call (`--timeout`, default 10 s).
    pub call_timeout: Duration,
    /// How long to wait for the socket to appear and accept a connection (30 s).
    pub connect_timeout: Duration,
    /// Pause between connection attempts and between Probes of a driver not ready yet (1 s).
    pub retry_interval: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            call_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(30),
            retry_interval: Duration::from_secs(1),
        }
    }
}

/// The provisioning calls, as a seam: the provisioner uses `dyn CsiController`, its unit tests a
/// fake returning scripted results.
#[tonic::async_trait]
pub trait CsiController: Send + Sync {
    /// Controller.CreateVolume.
    async fn create_volume(
        &self,
        request: CreateVolumeRequest,
    ) -> Result<CreateVolumeResponse, CallError>;

    /// Controller.DeleteVolume.
    async fn delete_volume(
        &self,
        request: DeleteVolumeRequest,
    ) -> Result<DeleteVolumeResponse, CallError>;

    /// Controller.GetCapacity (capacity tracking and the node-mode ownership check).
    async fn get_capacity(
        &self,
        request: GetCapacityRequest,
    ) -> Result<GetCapacityResponse, CallError>;

    /// Controller.ListVolumes, one page (the backend audit, `--audit-volumes-interval`). The
    /// fakes of the unit tests serve none.
    async fn list_volumes(
        &self,
        _request: ListVolumesRequest,
    ) -> Result<ListVolumesResponse, CallError> {
        Err(CallError::Status(Status::unimplemented(
            "ListVolumes is not served",
        )))
    }
}

/// A connection to the CSI driver. Cheap to clone; clones share the connection.
#[derive(Clone)]
pub struct CsiClient {
    channel: Channel,
    options: ClientOptions,
    metrics: Arc<Metrics>,
    /// `driver_name` of the metrics: "unknown-driver" until [`CsiClient::identify`].
    driver_name: Arc<str>,
}

impl fmt::Debug for CsiClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CsiClient")
            .field("driver_name", &self.driver_name)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// What one Probe answer means at start-up.
#[derive(Debug)]
enum ProbeVerdict {
    Ready,
    NotYet(&'static str),
    Failed(CallError),
}

/// Upstream's rule: an absent `ready` is ready, `false` or a timeout means wait, any other
/// failure is fatal.
fn probe_verdict(result: Result<ProbeResponse, CallError>) -> ProbeVerdict {
    match result {
        Ok(ProbeResponse { ready: Some(false) }) => {
            ProbeVerdict::NotYet("driver answered ready=false")
        }
        Ok(_) => ProbeVerdict::Ready,
        Err(err) if err.code() == Code::DeadlineExceeded => ProbeVerdict::NotYet("Probe timed out"),
        Err(err) => ProbeVerdict::Failed(err),
    }
}

impl CsiClient {
    /// Waits for the socket at `path` and connects (see [`ClientOptions`]); calls nothing yet.
    pub async fn connect(
        path: &Path,
        options: ClientOptions,
        metrics: Arc<Metrics>,
    ) -> Result<Self, Error> {
        let channel =
            connect::connect(path, options.connect_timeout, options.retry_interval).await?;
        Ok(CsiClient {
            channel,
            options,
            metrics,
            driver_name: Arc::from(UNKNOWN_DRIVER),
        })
    }

    /// The whole start-up: connect, Probe until ready, then read the driver's name and
    /// capabilities. The returned client labels its metrics with the driver's name.
    pub async fn start(
        path: &Path,
        options: ClientOptions,
        metrics: Arc<Metrics>,
    ) -> Result<(Self, DriverInfo), Error> {
        let mut client = Self::connect(path, options, metrics).await?;
        client.wait_until_ready().await?;
        let info = client.identify().await?;
        info!(
            driver = %info.name,
            vendor_version = %info.vendor_version,
            plugin_capabilities = ?info.plugin_capabilities,
            controller_capabilities = ?info.controller_capabilities,
            "CSI driver is ready"
        );
        Ok((client, info))
    }

    /// Probes every [`ClientOptions::retry_interval`] while the driver answers `ready: false` or
    /// does not answer within the call timeout; there is no overall limit (as upstream). Any
    /// other failure is returned.
    pub async fn wait_until_ready(&self) -> Result<(), Error> {
        loop {
            match probe_verdict(self.probe().await) {
                ProbeVerdict::Ready => return Ok(()),
                ProbeVerdict::NotYet(reason) => {
                    info!(reason, "CSI driver is not ready yet, probing again");
                }
                ProbeVerdict::Failed(source) => {
                    return Err(Error::Call {
                        method: method::PROBE,
                        source,
                    });
                }
            }
            tokio::time::sleep(self.options.retry_interval).await;
        }
    }

    /// GetPluginInfo, GetPluginCapabilities and ControllerGetCapabilities. A name that cannot
    /// name a driver is an error; missing capabilities are not (a driver without a controller
    /// service, answering Unimplemented, gets an empty set). From here on the metrics carry the
    /// driver's name (in this client and its later clones).
    pub async fn identify(&mut self) -> Result<DriverInfo, Error> {
        let call_failed = |method| move |source| Error::Call { method, source };
        let plugin_info = self
            .get_plugin_info()
            .await
            .map_err(call_failed(method::GET_PLUGIN_INFO))?;
        if let Err(problem) = validate_driver_name(&plugin_info.name) {
            return Err(Error::InvalidDriverName {
                name: plugin_info.name,
                problem,
            });
        }
        self.driver_name = Arc::from(plugin_info.name.as_str());
        let plugin_capabilities = self
            .get_plugin_capabilities()
            .await
            .map_err(call_failed(method::GET_PLUGIN_CAPABILITIES))?;
        let controller_capabilities = match self.controller_get_capabilities().await {
            Err(err) if err.code() == Code::Unimplemented => {
                warn!(error = %err, "CSI driver has no controller service; provisioning will fail");
                ControllerGetCapabilitiesResponse::default()
            }
            other => other.map_err(call_failed(method::CONTROLLER_GET_CAPABILITIES))?,
        };
        DriverInfo::from_responses(plugin_info, plugin_capabilities, controller_capabilities)
    }

    /// The bound of every call (`--timeout`).
    pub fn timeout(&self) -> Duration {
        self.options.call_timeout
    }

    /// The driver name the metrics carry ("unknown-driver" before [`CsiClient::identify`]).
    pub fn driver_name(&self) -> &str {
        &self.driver_name
    }

    /// Identity.Probe.
    pub async fn probe(&self) -> Result<ProbeResponse, CallError> {
        self.call(
            method::PROBE,
            ProbeRequest {},
            |channel, request| async move { IdentityClient::new(channel).probe(request).await },
        )
        .await
    }

    /// Identity.GetPluginInfo (not validated; see [`CsiClient::identify`]).
    pub async fn get_plugin_info(&self) -> Result<GetPluginInfoResponse, CallError> {
        self.call(
            method::GET_PLUGIN_INFO,
            GetPluginInfoRequest {},
            |channel, request| async move {
                IdentityClient::new(channel).get_plugin_info(request).await
            },
        )
        .await
    }

    /// Identity.GetPluginCapabilities.
    pub async fn get_plugin_capabilities(
        &self,
    ) -> Result<GetPluginCapabilitiesResponse, CallError> {
        self.call(
            method::GET_PLUGIN_CAPABILITIES,
            GetPluginCapabilitiesRequest {},
            |channel, request| async move {
                IdentityClient::new(channel)
                    .get_plugin_capabilities(request)
                    .await
            },
        )
        .await
    }

    /// Controller.ControllerGetCapabilities.
    pub async fn controller_get_capabilities(
        &self,
    ) -> Result<ControllerGetCapabilitiesResponse, CallError> {
        self.call(
            method::CONTROLLER_GET_CAPABILITIES,
            ControllerGetCapabilitiesRequest {},
            |channel, request| async move {
                ControllerClient::new(channel)
                    .controller_get_capabilities(request)
                    .await
            },
        )
        .await
    }

    /// Controller.CreateVolume.
    pub async fn create_volume(
        &self,
        request: CreateVolumeRequest,
    ) -> Result<CreateVolumeResponse, CallError> {
        self.call(
            method::CREATE_VOLUME,
            request,
            |channel, request| async move {
                ControllerClient::new(channel).create_volume(request).await
            },
        )
        .await
    }

    /// Controller.DeleteVolume.
    pub async fn delete_volume(
        &self,
        request: DeleteVolumeRequest,
    ) -> Result<DeleteVolumeResponse, CallError> {
        self.call(
            method::DELETE_VOLUME,
            request,
            |channel, request| async move {
                ControllerClient::new(channel).delete_volume(request).await
            },
        )
        .await
    }

    /// Controller.GetCapacity.
    pub async fn get_capacity(
        &self,
        request: GetCapacityRequest,
    ) -> Result<GetCapacityResponse, CallError> {
        self.call(
            method::GET_CAPACITY,
            request,
            |channel, request| async move {
                ControllerClient::new(channel).get_capacity(request).await
            },
        )
        .await
    }

    /// Controller.ListVolumes (one page; follow `next_token` for more).
    pub async fn list_volumes(
        &self,
        request: ListVolumesRequest,
    ) -> Result<ListVolumesResponse, CallError> {
        self.call(
            method::LIST_VOLUMES,
            request,
            |channel, request| async move {
                ControllerClient::new(channel).list_volumes(request).await
            },
        )
        .await
    }

    /// Node.NodeGetInfo.
    pub async fn node_get_info(&self) -> Result<NodeGetInfoResponse, CallError> {
        self.call(
            method::NODE_GET_INFO,
            NodeGetInfoRequest {},
            |channel, request| async move { NodeClient::new(channel).node_get_info(request).await },
        )
        .await
    }

    /// The one place every call goes through: trace logs of request and response, so only
    /// `-v=5` and above show them, as upstream's `V(5)` (secrets are redacted by the messages'
    /// `Debug`), the `--timeout` bound (sent to the driver as
    /// `grpc-timeout` too), and the `csi_sidecar_operations_seconds` sample.
    async fn call<Req, Resp, Fut>(
        &self,
        method: &'static str,
        request: Req,
        send: impl FnOnce(Channel, tonic::Request<Req>) -> Fut,
    ) -> Result<Resp, CallError>
    where
        Req: fmt::Debug,
        Resp: fmt::Debug,
        Fut: Future<Output = Result<tonic::Response<Resp>, tonic::Status>>,
    {
        trace!(method, ?request, "GRPC call");
        let timeout = self.options.call_timeout;
        let mut request = tonic::Request::new(request);
        request.set_timeout(timeout);
        let started = Instant::now();
        let result = match tokio::time::timeout(timeout, send(self.channel.clone(), request)).await
        {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) => Err(CallError::from_tonic(status, timeout)),
            Err(_elapsed) => Err(CallError::Timeout(timeout)),
        };
        let code = match &result {
            Ok(_) => Code::Ok,
            Err(err) => err.code(),
        };
        // Upstream labels every call of a migration target's driver `migrated`, "true" for
        // the calls made for an in-tree volume (see `migrated_calls`).
        let migrated = InTreePlugin::for_csi_driver(&self.driver_name).map(|_| {
            MIGRATED_CALLS
                .try_with(|migrated| *migrated)
                .unwrap_or(false)
        });
        self.metrics.observe_csi_operation(
            &self.driver_name,
            method,
            status_code_label(Some(code)),
            migrated,
            started.elapsed(),
        );
        match &result {
            Ok(response) => trace!(method, ?response, "GRPC response"),
            Err(error) => trace!(method, %error, "GRPC response"),
        }
        result
    }
}

#[tonic::async_trait]
impl CsiController for CsiClient {
    async fn create_volume(
        &self,
        request: CreateVolumeRequest,
    ) -> Result<CreateVolumeResponse, CallError> {
        CsiClient::create_volume(self, request).await
    }

    async fn delete_volume(
        &self,
        request: DeleteVolumeRequest,
    ) -> Result<DeleteVolumeResponse, CallError> {
        CsiClient::delete_volume(self, request).await
    }

    async fn get_capacity(
        &self,
        request: GetCapacityRequest,
    ) -> Result<GetCapacityResponse, CallError> {
        CsiClient::get_capacity(self, request).await
    }

    async fn list_volumes(
        &self,
        request: ListVolumesRequest,
    ) -> Result<ListVolumesResponse, CallError> {
        CsiClient::list_volumes(self, request).await
    }
}
