//! The client against in-process tonic servers on temp unix sockets. Each fake driver runs on
//! its own thread and runtime, so stopping it drops every connection like a crashed driver.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Server;
use tonic::{Code, Request, Response, Status};

use tracing_subscriber::fmt::MakeWriter;

use super::*;
use crate::csi::controller_server::{Controller, ControllerServer};
use crate::csi::controller_service_capability::{self, rpc::Type as RpcType};
use crate::csi::identity_server::{Identity, IdentityServer};
use crate::csi::plugin_capability::{self, service::Type as ServiceType};
use crate::csi::*;
use crate::logging::Verbosity;

const DRIVER: &str = "fake.csi.example.com";

/// What the fake answers to Probe, one entry per call; empty = ready.
#[derive(Clone, Copy, Debug)]
enum ProbeAnswer {
    Ready(Option<bool>),
    Fail(Code),
    Slow(Duration),
}

#[derive(Debug)]
struct FakeDriver {
    name: String,
    probes: Mutex<VecDeque<ProbeAnswer>>,
    controller_service: bool,
    /// How long CreateVolume takes, and what it answers after that (`None` = success).
    create_delay: Mutex<Duration>,
    create_error: Mutex<Option<Code>>,
    /// Secrets of the CreateVolume and DeleteVolume requests received.
    received_secrets: Mutex<Vec<HashMap<String, String>>>,
}

impl FakeDriver {
    fn new() -> Self {
        FakeDriver {
            name: DRIVER.to_string(),
            probes: Mutex::default(),
            controller_service: true,
            create_delay: Mutex::new(Duration::ZERO),
            create_error: Mutex::new(None),
            received_secrets: Mutex::default(),
        }
    }

    fn named(name: &str) -> Self {
        FakeDriver {
            name: name.to_string(),
            ..FakeDriver::new()
        }
    }
}

#[tonic::async_trait]
impl Identity for FakeDriver {
    async fn get_plugin_info(
        &self,
        _: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: self.name.clone(),
            vendor_version: "0.0.1".into(),
            ..Default::default()
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        let services = if self.controller_service {
            vec![
                ServiceType::ControllerService,
                ServiceType::VolumeAccessibilityConstraints,
            ]
        } else {
            vec![]
        };
        Ok(Response::new(GetPluginCapabilitiesResponse {
            capabilities: services
                .into_iter()
                .map(|t| PluginCapability {
                    r#type: Some(plugin_capability::Type::Service(
                        plugin_capability::Service { r#type: t as i32 },
                    )),
                })
                .collect(),
        }))
    }

    async fn probe(&self, _: Request<ProbeRequest>) -> Result<Response<ProbeResponse>, Status> {
        let answer = self.probes.lock().unwrap().pop_front();
        match answer.unwrap_or(ProbeAnswer::Ready(None)) {
            ProbeAnswer::Ready(ready) => Ok(Response::new(ProbeResponse { ready })),
            ProbeAnswer::Fail(code) => Err(Status::new(code, "probe failed")),
            ProbeAnswer::Slow(delay) => {
                tokio::time::sleep(delay).await;
                Ok(Response::new(ProbeResponse { ready: Some(true) }))
            }
        }
    }
}

/// Controller RPCs the client never calls. Spelled the way `async_trait` expands an `async fn`,
/// because the attribute does not see methods produced by a macro inside the impl.
macro_rules! unimplemented_rpcs {
    ($($name:ident($req:ident) -> $resp:ident;)*) => {
        $(
            fn $name<'life0, 'async_trait>(
                &'life0 self,
                _: Request<$req>,
            ) -> std::pin::Pin<Box<
                dyn std::future::Future<Output = Result<Response<$resp>, Status>>
                    + Send
                    + 'async_trait,
            >>
            where
                'life0: 'async_trait,
                Self: 'async_trait,
            {
                Box::pin(async { Err(Status::unimplemented(stringify!($name))) })
            }
        )*
    };
}

#[tonic::async_trait]
impl Controller for FakeDriver {
    async fn create_volume(
        &self,
        request: Request<CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        let request = request.into_inner();
        self.received_secrets
            .lock()
            .unwrap()
            .push(request.secrets.clone());
        let delay = *self.create_delay.lock().unwrap();
        tokio::time::sleep(delay).await;
        if let Some(code) = *self.create_error.lock().unwrap() {
            return Err(Status::new(code, "scripted failure"));
        }
        Ok(Response::new(CreateVolumeResponse {
            volume: Some(Volume {
                volume_id: format!("id-{}", request.name),
                capacity_bytes: 1 << 30,
                ..Default::default()
            }),
        }))
    }

    async fn delete_volume(
        &self,
        request: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        self.received_secrets
            .lock()
            .unwrap()
            .push(request.into_inner().secrets);
        Ok(Response::new(DeleteVolumeResponse {}))
    }

    async fn controller_get_capabilities(
        &self,
        _: Request<ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<ControllerGetCapabilitiesResponse>, Status> {
        if !self.controller_service {
            return Err(Status::unimplemented("no controller service"));
        }
        Ok(Response::new(ControllerGetCapabilitiesResponse {
            capabilities: [RpcType::CreateDeleteVolume, RpcType::CloneVolume]
                .into_iter()
                .map(|t| ControllerServiceCapability {
                    r#type: Some(controller_service_capability::Type::Rpc(
                        controller_service_capability::Rpc { r#type: t as i32 },
                    )),
                })
                .collect(),
        }))
    }

    async fn get_capacity(
        &self,
        _: Request<GetCapacityRequest>,
    ) -> Result<Response<GetCapacityResponse>, Status> {
        Ok(Response::new(GetCapacityResponse {
            available_capacity: 42,
            ..Default::default()
        }))
    }

    async fn list_volumes(
        &self,
        _: Request<ListVolumesRequest>,
    ) -> Result<Response<ListVolumesResponse>, Status> {
        Ok(Response::new(ListVolumesResponse {
            entries: vec![list_volumes_response::Entry {
                volume: Some(Volume {
                    volume_id: "id-1".into(),
                    ..Default::default()
                }),
                status: None,
            }],
            next_token: String::new(),
        }))
    }

    unimplemented_rpcs! {
        controller_publish_volume(ControllerPublishVolumeRequest) -> ControllerPublishVolumeResponse;
        controller_unpublish_volume(ControllerUnpublishVolumeRequest) -> ControllerUnpublishVolumeResponse;
        validate_volume_capabilities(ValidateVolumeCapabilitiesRequest) -> ValidateVolumeCapabilitiesResponse;
        create_snapshot(CreateSnapshotRequest) -> CreateSnapshotResponse;
        delete_snapshot(DeleteSnapshotRequest) -> DeleteSnapshotResponse;
        list_snapshots(ListSnapshotsRequest) -> ListSnapshotsResponse;
        get_snapshot(GetSnapshotRequest) -> GetSnapshotResponse;
        controller_expand_volume(ControllerExpandVolumeRequest) -> ControllerExpandVolumeResponse;
        controller_get_volume(ControllerGetVolumeRequest) -> ControllerGetVolumeResponse;
        controller_modify_volume(ControllerModifyVolumeRequest) -> ControllerModifyVolumeResponse;
    }
}

/// A fake driver serving on a unix socket from its own thread and runtime.
struct Running {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Running {
    /// Binds `path` before returning, so the socket exists when this returns.
    fn serve(path: &Path, driver: Arc<FakeDriver>) -> Running {
        let listener = std::os::unix::net::UnixListener::bind(path).unwrap();
        listener.set_nonblocking(true).unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let incoming =
                    UnixListenerStream::new(tokio::net::UnixListener::from_std(listener).unwrap());
                let server = Server::builder()
                    .add_service(IdentityServer::from_arc(driver.clone()))
                    .add_service(ControllerServer::from_arc(driver))
                    .serve_with_incoming(incoming);
                tokio::select! {
                    _ = server => {}
                    _ = stopped => {}
                }
            });
            // Dropping the runtime drops every connection task mid-flight: a crash, as far
            // as the client can tell.
            drop(runtime);
        });
        Running {
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    fn kill(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            thread.join().unwrap();
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.kill();
    }
}

fn socket_in(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("csi.sock")
}

fn fast_options() -> ClientOptions {
    ClientOptions {
        call_timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(5),
        retry_interval: Duration::from_millis(50),
    }
}

fn with_secrets(name: &str) -> CreateVolumeRequest {
    CreateVolumeRequest {
        name: name.into(),
        secrets: [
            ("username".to_string(), "admin-user-value".to_string()),
            ("password".to_string(), "hunter2-secret-value".to_string()),
        ]
        .into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn start_probes_until_ready_and_reads_the_driver() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket_in(&dir);
    let driver = Arc::new(FakeDriver::new());
    driver.probes.lock().unwrap().extend([
        ProbeAnswer::Ready(Some(false)),
        ProbeAnswer::Slow(Duration::from_secs(3)),
        ProbeAnswer::Ready(Some(true)),
    ]);
    let _server = Running::serve(&path, driver.clone());
    let metrics = Arc::new(Metrics::new());
    let options = ClientOptions {
        call_timeout: Duration::from_secs(1),
        ..fast_options()
    };

    let (client, info) = CsiClient::start(&path, options, metrics.clone())
        .await
        .unwrap();

    assert!(driver.probes.lock().unwrap().is_empty(), "probed 3 times");
    assert_eq!(info.name, DRIVER);
    assert_eq!(info.vendor_version, "0.0.1");
    assert!(info.can_provision() && info.supports_topology() && info.supports_clone());
    assert!(!info.supports_snapshot());
    assert_eq!(client.driver_name(), DRIVER);
    assert_eq!(client.timeout(), Duration::from_secs(1));

    let text = metrics.encode();
    for line in [
        "csi_sidecar_operations_seconds_count{driver_name=\"unknown-driver\",\
         method_name=\"/csi.v1.Identity/Probe\",grpc_status_code=\"OK\"} 2",
        "csi_sidecar_operations_seconds_count{driver_name=\"unknown-driver\",\
         method_name=\"/csi.v1.Identity/Probe\",grpc_status_code=\"DeadlineExceeded\"} 1",
        "csi_sidecar_operations_seconds_count{driver_name=\"unknown-driver\",\
         method_name=\"/csi.v1.Identity/GetPluginInfo\",grpc_status_code=\"OK\"} 1",
        "csi_sidecar_operations_seconds_count{driver_name=\"fake.csi.example.com\",\
         method_name=\"/csi.v1.Identity/GetPluginCapabilities\",grpc_status_code=\"OK\"} 1",
        "csi_sidecar_operations_seconds_count{driver_name=\"fake.csi.example.com\",\
         method_name=\"/csi.v1.Controller/ControllerGetCapabilities\",grpc_status_code=\"OK\"} 1",
    ] {
        assert!(text.contains(line), "missing {line}\n{text}");
    }
}

#[tokio::test]
async fn a_failing_probe_is_fatal() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket_in(&dir);
    let driver = Arc::new(FakeDriver::new());
    driver
        .probes
        .lock()
        .unwrap()
        .push_back(ProbeAnswer::Fail(Code::FailedPrecondition));
    let _server = Running::serve(&path, driver);

    let err = CsiClient::start(&path, fast_options(), Arc::new(Metrics::new()))
        .await
        .unwrap_err();

    assert!(
        matches!(&err, Error::Call { method: method::PROBE, source } if source.code() == Code::FailedPrecondition),
        "{err:?}"
    );
    assert!(err.to_string().contains("FailedPrecondition"), "{err}");
}

#[tokio::test]
async fn an_empty_or_invalid_driver_name_is_fatal() {
    for name in ["", "not_a_dns_name", "-dash-first"] {
        let dir = tempfile::tempdir().unwrap();
        let path = socket_in(&dir);
        let _server = Running::serve(&path, Arc::new(FakeDriver::named(name)));

        let err = CsiClient::start(&path, fast_options(), Arc::new(Metrics::new()))
            .await
            .unwrap_err();

        assert!(
            matches!(&err, Error::InvalidDriverName { name: n, .. } if n == name),
            "{name:?}: {err:?}"
        );
    }
}

#[tokio::test]
async fn a_driver_without_controller_service_still_starts() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket_in(&dir);
    let driver = FakeDriver {
        controller_service: false,
        ..FakeDriver::new()
    };
    let _server = Running::serve(&path, Arc::new(driver));

    let (_, info) = CsiClient::start(&path, fast_options(), Arc::new(Metrics::new()))
        .await
        .unwrap();

    assert!(!info.supports_controller_service());
    assert!(info.controller_capabilities.is_empty());
    assert!(!info.can_provision());
}

#[tokio::test]
async fn a_missing_socket_fails_after_the_connect_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket_in(&dir);
    let options = ClientOptions {
        connect_timeout: Duration::from_millis(300),
        ..fast_options()
    };
    let started = std::time::Instant::now();

    let err = CsiClient::connect(&path, options, Arc::new(Metrics::new()))
        .await
        .unwrap_err();

    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(
        matches!(&err, Error::SocketMissing { path: p, .. } if p == &path),
        "{err:?}"
    );
    assert!(err.to_string().contains("does not exist"), "{err}");
}

#[tokio::test]
async fn a_path_that_is_not_a_socket_fails_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-socket");
    std::fs::write(&file, b"").unwrap();
    for path in [file.as_path(), dir.path()] {
        let err = CsiClient::connect(path, fast_options(), Arc::new(Metrics::new()))
            .await
            .unwrap_err();
        assert!(matches!(&err, Error::NotASocket { .. }), "{err:?}");
        assert!(
            err.to_string().contains("not a unix domain socket"),
            "{err}"
        );
    }
}

#[tokio::test]
async fn a_socket_nobody_listens_on_fails_after_the_connect_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket_in(&dir);
    // A driver that died and left its socket file behind.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    let options = ClientOptions {
        connect_timeout: Duration::from_millis(300),
        ..fast_options()
    };

    let err = CsiClient::connect(&path, options, Arc::new(Metrics::new()))
        .await
        .unwrap_err();

    assert!(matches!(&err, Error::ConnectFailed { .. }), "{err:?}");
    assert!(err.to_string().contains("refused"), "{err}");
}

#[tokio::test]
async fn connect_waits_for_the_socket_to_appear() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket_in(&dir);
    let server_path = path.clone();
    let late = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        Running::serve(&server_path, Arc::new(FakeDriver::new()))
    });

    let client = CsiClient::connect(&path, fast_options(), Arc::new(Metrics::new()))
        .await
        .unwrap();

    let _server = late.join().unwrap();
    assert_eq!(client.probe().await.unwrap().ready, None);
}

#[tokio::test]
async fn every_call_is_bounded_by_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket_in(&dir);
    let driver = Arc::new(FakeDriver::new());
    *driver.create_delay.lock().unwrap() = Duration::from_secs(3);
    let _server = Running::serve(&path, driver);
    let metrics = Arc::new(Metrics::new());
    let options = ClientOptions {
        call_timeout: Duration::from_millis(200),
        ..fast_options()
    };
    let client = CsiClient::connect(&path, options, metrics.clone())
        .await
        .unwrap();
    let started = std::time::Instant::now();

    let err = client
        .create_volume(with_secrets("slow"))
        .await
        .unwrap_err();

    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(err.code(), Code::DeadlineExceeded);
    assert_eq!(err.class(), ErrorClass::InProgress);
    assert!(metrics.encode().contains(
        "csi_sidecar_operations_seconds_count{driver_name=\"unknown-driver\",\
         method_name=\"/csi.v1.Controller/CreateVolume\",grpc_status_code=\"DeadlineExceeded\"} 1"
    ));
}

#[tokio::test]
async fn driver_statuses_are_classified() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket_in(&dir);
    let driver = Arc::new(FakeDriver::new());
    let _server = Running::serve(&path, driver.clone());
    let metrics = Arc::new(Metrics::new());
    let client = CsiClient::connect(&path, fast_options(), metrics.clone())
        .await
        .unwrap();

    for (code, class, infeasible) in [
        (Code::Aborted, ErrorClass::InProgress, false),
        (Code::ResourceExhausted, ErrorClass::Reschedule, false),
        (Code::InvalidArgument, ErrorClass::Final, true),
        (Code::Internal, ErrorClass::Final, false),
    ] {
        *driver.create_error.lock().unwrap() = Some(code);
        let err = client.create_volume(with_secrets("v")).await.unwrap_err();
        assert!(matches!(&err, CallError::Status(_)), "{err:?}");
        assert_eq!(
            (err.code(), err.class(), err.is_infeasible()),
            (code, class, infeasible)
        );
        assert_eq!(
            err.to_string(),
            format!(
                "rpc error: code = {} desc = scripted failure",
                go_code_name(code)
            )
        );
    }
    assert!(metrics.encode().contains(
        "csi_sidecar_operations_seconds_count{driver_name=\"unknown-driver\",\
         method_name=\"/csi.v1.Controller/CreateVolume\",grpc_status_code=\"ResourceExhausted\"} 1"
    ));
}

#[tokio::test]
async fn the_remaining_calls_and_the_controller_trait() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket_in(&dir);
    let _server = Running::serve(&path, Arc::new(FakeDriver::new()));
    let client = CsiClient::connect(&path, fast_options(), Arc::new(Metrics::new()))
        .await
        .unwrap();

    let capacity = client
        .get_capacity(GetCapacityRequest::default())
        .await
        .unwrap();
    assert_eq!(capacity.available_capacity, 42);
    let listed = client
        .list_volumes(ListVolumesRequest::default())
        .await
        .unwrap();
    assert_eq!(listed.entries.len(), 1);
    // The fake serves no Node service; the router answers Unimplemented.
    let err = client.node_get_info().await.unwrap_err();
    assert_eq!(
        (err.code(), err.class()),
        (Code::Unimplemented, ErrorClass::Final)
    );

    let controller: Arc<dyn CsiController> = Arc::new(client);
    let created = controller
        .create_volume(with_secrets("pvc-1"))
        .await
        .unwrap();
    assert_eq!(created.volume.unwrap().volume_id, "id-pvc-1");
    controller
        .delete_volume(DeleteVolumeRequest {
            volume_id: "id-pvc-1".into(),
            secrets: HashMap::new(),
        })
        .await
        .unwrap();
}

thread_local! {
    /// This thread's log capture and the `-v` it applies, open while a test reads its own logs.
    static CAPTURED_LOGS: RefCell<Option<(Verbosity, Vec<u8>)>> = const { RefCell::new(None) };
}

/// Appends a line to the calling thread's capture when one is open and its `-v` (the
/// sidecar's own filter, `crate::logging::Verbosity`) writes it, else discards it.
struct ThreadCapture {
    written: bool,
}

impl Write for ThreadCapture {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        if self.written {
            CAPTURED_LOGS.with_borrow_mut(|captured| {
                if let Some((_, buffer)) = captured {
                    buffer.extend_from_slice(bytes);
                }
            });
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

struct CaptureWriter;

impl<'a> MakeWriter<'a> for CaptureWriter {
    type Writer = ThreadCapture;

    fn make_writer(&'a self) -> ThreadCapture {
        ThreadCapture { written: false }
    }

    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> ThreadCapture {
        let written = CAPTURED_LOGS.with_borrow(|captured| {
            captured
                .as_ref()
                .is_some_and(|(verbosity, _)| verbosity.enables(meta))
        });
        ThreadCapture { written }
    }
}

/// Opens a log capture on this thread that keeps what `-v=verbosity` writes.
///
/// The subscriber is global, at TRACE for every target, rather than `set_default`: tracing
/// caches per-callsite interest process-wide, and a callsite first hit by a parallel test
/// while only a scoped subscriber existed elsewhere can be cached as disabled, silently
/// losing this test's log lines. The `-v` filter is applied per line by the writer instead.
fn capture_logs_on_this_thread(verbosity: i32) {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(CaptureWriter)
            .finish();
        tracing::subscriber::set_global_default(subscriber)
            .expect("no other test installs a global subscriber");
    });
    CAPTURED_LOGS.with_borrow_mut(|captured| {
        *captured = Some((Verbosity::new(verbosity, &[]), Vec::new()));
    });
}

fn captured_logs() -> String {
    let bytes = CAPTURED_LOGS
        .with_borrow_mut(Option::take)
        .map(|(_, bytes)| bytes)
        .unwrap_or_default();
    String::from_utf8(bytes).expect("log output is UTF-8")
}

/// Creates and deletes a volume with secrets, logging at `-v=verbosity`; returns the log.
async fn log_of_calls_with_secrets(verbosity: i32) -> String {
    capture_logs_on_this_thread(verbosity);
    let dir = tempfile::tempdir().unwrap();
    let path = socket_in(&dir);
    let driver = Arc::new(FakeDriver::new());
    let _server = Running::serve(&path, driver.clone());
    let client = CsiClient::connect(&path, fast_options(), Arc::new(Metrics::new()))
        .await
        .unwrap();
    let request = with_secrets("pvc-secret-test");
    let secrets = request.secrets.clone();
    client.create_volume(request).await.unwrap();
    client
        .delete_volume(DeleteVolumeRequest {
            volume_id: "id-pvc-secret-test".into(),
            secrets: secrets.clone(),
        })
        .await
        .unwrap();
    // The driver did get the secrets: only the logs must not show them.
    assert_eq!(
        *driver.received_secrets.lock().unwrap(),
        [secrets.clone(), secrets]
    );
    captured_logs()
}

// Current-thread runtime: the client's log lines are written on this test's thread.
#[tokio::test(flavor = "current_thread")]
async fn requests_are_logged_without_secret_values() {
    for verbosity in [5, 10] {
        let log = log_of_calls_with_secrets(verbosity).await;
        for marker in [
            "GRPC call",
            "GRPC response",
            "/csi.v1.Controller/CreateVolume",
            "/csi.v1.Controller/DeleteVolume",
            "pvc-secret-test",
            "username",
            "password",
            crate::csi::STRIPPED,
        ] {
            assert!(
                log.contains(marker),
                "-v={verbosity}: {marker:?} not logged:\n{log}"
            );
        }
        for secret in ["admin-user-value", "hunter2-secret-value"] {
            assert!(!log.contains(secret), "secret {secret:?} leaked:\n{log}");
        }
    }
}

/// docs/flags.md places CSI request and response bodies at `-v=5`, as upstream's `V(5)`.
#[tokio::test(flavor = "current_thread")]
async fn request_bodies_are_not_logged_below_v5() {
    for verbosity in 0..=4 {
        let log = log_of_calls_with_secrets(verbosity).await;
        for body in [
            "GRPC",
            "pvc-secret-test",
            "username",
            "hunter2-secret-value",
        ] {
            assert!(!log.contains(body), "-v={verbosity} logs {body:?}:\n{log}");
        }
    }
}

#[tokio::test]
async fn a_restarted_driver_is_reconnected() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket_in(&dir);
    let mut server = Running::serve(&path, Arc::new(FakeDriver::new()));
    let client = CsiClient::connect(&path, fast_options(), Arc::new(Metrics::new()))
        .await
        .unwrap();
    client.probe().await.unwrap();

    server.kill();
    std::fs::remove_file(&path).unwrap();
    // Down: the first call fails on the dead connection, the next on the missing socket.
    for _ in 0..2 {
        let err = client.probe().await.unwrap_err();
        assert!(matches!(&err, CallError::Transport(_)), "{err:?}");
        assert_eq!(
            (err.code(), err.class()),
            (Code::Unavailable, ErrorClass::InProgress)
        );
    }

    let _restarted = Running::serve(&path, Arc::new(FakeDriver::new()));
    let created = client.create_volume(with_secrets("after-restart")).await;
    assert_eq!(
        created.unwrap().volume.unwrap().volume_id,
        "id-after-restart",
        "the first call after the restart reconnects"
    );
}

#[tokio::test]
async fn a_call_in_flight_when_the_driver_dies_fails_as_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket_in(&dir);
    let driver = Arc::new(FakeDriver::new());
    *driver.create_delay.lock().unwrap() = Duration::from_secs(30);
    let mut server = Running::serve(&path, driver.clone());
    let client = CsiClient::connect(&path, fast_options(), Arc::new(Metrics::new()))
        .await
        .unwrap();
    let in_flight = tokio::spawn({
        let client = client.clone();
        async move { client.create_volume(with_secrets("in-flight")).await }
    });
    while driver.received_secrets.lock().unwrap().is_empty() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let started = std::time::Instant::now();

    server.kill();
    let err = in_flight.await.unwrap().unwrap_err();

    assert!(started.elapsed() < Duration::from_secs(2), "failed fast");
    assert!(matches!(&err, CallError::Transport(_)), "{err:?}");
    assert_eq!(
        (err.code(), err.class()),
        (Code::Unavailable, ErrorClass::InProgress)
    );
}

#[test]
fn only_a_lost_answer_or_already_exists_says_a_volume_may_have_been_created() {
    let may = |error: CallError| error.may_have_created();
    assert!(may(CallError::Timeout(Duration::from_secs(1))));
    assert!(may(CallError::Transport("reset".into())));
    assert!(may(Status::aborted("busy").into()));
    assert!(may(Status::already_exists("other parameters").into()));
    assert!(!may(Status::internal("broken").into()));
    assert!(!may(Status::resource_exhausted("full").into()));
    assert!(!may(Status::invalid_argument("bad").into()));
}

#[test]
fn probe_verdicts() {
    let ready = |ready| probe_verdict(Ok(ProbeResponse { ready }));
    assert!(matches!(ready(None), ProbeVerdict::Ready));
    assert!(matches!(ready(Some(true)), ProbeVerdict::Ready));
    assert!(matches!(ready(Some(false)), ProbeVerdict::NotYet(_)));
    assert!(matches!(
        probe_verdict(Err(CallError::Timeout(Duration::from_secs(1)))),
        ProbeVerdict::NotYet(_)
    ));
    assert!(matches!(
        probe_verdict(Err(Status::deadline_exceeded("slow").into())),
        ProbeVerdict::NotYet(_)
    ));
    for status in [
        Status::unimplemented("no probe"),
        Status::failed_precondition("sick"),
        Status::unavailable("gone"),
    ] {
        assert!(matches!(
            probe_verdict(Err(status.into())),
            ProbeVerdict::Failed(_)
        ));
    }
}

#[tokio::test]
async fn a_driver_restarted_between_calls_is_reconnected_on_the_next_call() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket_in(&dir);
    let mut server = Running::serve(&path, Arc::new(FakeDriver::new()));
    let client = CsiClient::connect(&path, fast_options(), Arc::new(Metrics::new()))
        .await
        .unwrap();
    client.probe().await.unwrap();

    server.kill();
    // A real restart takes a moment, in which the client's connection task sees the end of
    // the old connection; without it the first call would fail as Unavailable (see above).
    tokio::time::sleep(Duration::from_millis(100)).await;
    std::fs::remove_file(&path).unwrap();
    let _restarted = Running::serve(&path, Arc::new(FakeDriver::new()));

    let probed = client.probe().await;
    assert!(probed.is_ok(), "{probed:?}");
}
