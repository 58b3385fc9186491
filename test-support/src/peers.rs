//! The peers of an integration test: the reference driver and the sidecar as separate OS
//! processes talking over a real unix socket, against the test binary's control plane. The
//! Kubernetes objects they act on are support::cluster's.
//!
//! Every test gets a driver of its own with a unique name (`t-<random>.csi.example.com`), so
//! tests running in parallel on the shared control plane never act on each other's claims or
//! volumes. Children are started through `setpriv --pdeathsig KILL`, so the kernel kills them
//! when the test's thread ends even if `Drop` never runs; `Drop` kills them as well and, when
//! the test is failing, prints the tail of their logs.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs::{self, OpenOptions};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use csi_reference_driver::{VolumeRecord, load_state};
use k8s_openapi::jiff::Timestamp;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tempfile::TempDir;

/// The generous bound of every wait on the cluster or a process (2 shared cores).
pub const TIMEOUT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(100);
const LOG_TAIL_ON_FAILURE: usize = 60;

// ------------------------------------------------------------------------------ processes

/// One child process and its log file (appended to across restarts); killed on drop.
pub(super) struct Process {
    pub(super) label: String,
    pub(super) program: PathBuf,
    pub(super) args: Vec<OsString>,
    pub(super) env: Vec<(&'static str, String)>,
    /// Run in a UTS namespace of its own with this hostname (the leader-election identity).
    pub(super) hostname: Option<String>,
    pub(super) log: PathBuf,
    pub(super) child: Option<Child>,
    pub(super) starts: usize,
}

impl Process {
    pub(super) fn spawn(&mut self) {
        let mut out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap_or_else(|e| panic!("opening {}: {e}", self.log.display()));
        self.starts += 1;
        let _ = writeln!(out, "===== start #{} of {} =====", self.starts, self.label);
        let err = out
            .try_clone()
            .unwrap_or_else(|e| panic!("duplicating {}: {e}", self.log.display()));
        let mut cmd = match &self.hostname {
            // `unshare` and `sh` exec into the program, so the pid stays the child's and the
            // death signal set by setpriv (last, after the namespace change) sticks.
            Some(hostname) => {
                let mut cmd = Command::new("unshare");
                cmd.args(["--user", "--map-root-user", "--uts", "--", "sh", "-c"])
                    .arg(r#"hostname "$0" && exec setpriv --pdeathsig KILL -- "$@""#)
                    .arg(hostname);
                cmd
            }
            None => {
                let mut cmd = Command::new("setpriv");
                cmd.args(["--pdeathsig", "KILL", "--"]);
                cmd
            }
        };
        cmd.arg(&self.program)
            .args(&self.args)
            // Our own process group: a Ctrl-C in the terminal must not start a drain mid-test.
            .process_group(0)
            .env_remove("KUBECONFIG")
            .env_remove("POD_NAMESPACE")
            .env_remove("RUST_LOG")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", self.label));
        self.child = Some(child);
    }

    fn pid(&self) -> Option<Pid> {
        let id = self.child.as_ref()?.id();
        Some(Pid::from_raw(i32::try_from(id).ok()?))
    }

    pub(super) fn signal(&self, signal: Signal) {
        let pid = self
            .pid()
            .unwrap_or_else(|| panic!("{} is not running", self.label));
        kill(pid, signal).unwrap_or_else(|e| panic!("sending {signal} to {}: {e}", self.label));
    }

    /// The exit status once the process has exited (reaped; later calls return the same).
    fn try_exit(&mut self) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        child
            .try_wait()
            .unwrap_or_else(|e| panic!("waiting for {}: {e}", self.label))
    }

    fn is_running(&mut self) -> bool {
        self.child.is_some() && self.try_exit().is_none()
    }

    /// Waits until `socket` accepts connections, failing the test if the process exits first.
    pub(super) async fn wait_listening(&mut self, socket: &Path) {
        let started = Instant::now();
        // A socket left by a killed process exists but refuses connections.
        while UnixStream::connect(socket).is_err() {
            if let Some(status) = self.try_exit() {
                panic!("{} exited during start-up: {status}", self.label);
            }
            if started.elapsed() > TIMEOUT {
                panic!("{} did not listen within {TIMEOUT:?}", self.label);
            }
            tokio::time::sleep(POLL / 2).await;
        }
    }

    pub(super) async fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let started = Instant::now();
        loop {
            if let Some(status) = self.try_exit() {
                return status;
            }
            if started.elapsed() > timeout {
                panic!("{} did not exit within {timeout:?}", self.label);
            }
            tokio::time::sleep(POLL / 2).await;
        }
    }

    /// SIGKILL, as a crash, and wait until the process is gone.
    async fn kill(&mut self) {
        self.signal(Signal::SIGKILL);
        self.wait_exit(TIMEOUT).await;
        self.child = None;
    }

    /// Starts the process again with the same program, flags and log (killing it first if it
    /// still runs).
    async fn restart(&mut self) {
        if self.is_running() {
            self.kill().await;
        }
        self.spawn();
    }

    /// SIGKILL (if still running) and reap.
    fn kill_now(&mut self) {
        if let Some(mut child) = self.child.take() {
            if matches!(child.try_wait(), Ok(None)) {
                let _ = child.kill();
            }
            let _ = child.wait();
        }
    }

    pub(super) fn log_text(&self) -> String {
        fs::read(&self.log)
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
            .unwrap_or_default()
    }

    fn dump_tail(&self) {
        let text = self.log_text();
        let lines: Vec<&str> = text.lines().collect();
        let tail = &lines[lines.len().saturating_sub(LOG_TAIL_ON_FAILURE)..];
        eprintln!(
            "----- last {} lines of {} ({}) -----\n{}",
            tail.len(),
            self.label,
            self.log.display(),
            tail.join("\n")
        );
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill_now();
        if std::thread::panicking() {
            self.dump_tail();
        }
    }
}

pub(super) fn unique_suffix() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..10].to_owned()
}

pub(super) fn temp_dir(prefix: &str) -> TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .unwrap_or_else(|e| panic!("creating a temporary directory: {e}"))
}

// ------------------------------------------------------------------------------ driver

/// A CSI driver a sidecar connects to: the reference driver ([`Driver`]) or the Kubernetes e2e
/// mock (support::mock_driver).
pub trait CsiEndpoint {
    /// The driver name (GetPluginInfo), which StorageClasses name as their provisioner.
    fn name(&self) -> &str;
    /// The unix socket the driver serves on.
    fn socket(&self) -> &Path;
}

impl CsiEndpoint for Driver {
    fn name(&self) -> &str {
        Driver::name(self)
    }

    fn socket(&self) -> &Path {
        Driver::socket(self)
    }
}

/// The driver's executable, built once per test binary with this binary's profile. It belongs to
/// another package of the workspace, so cargo builds it for that package's tests only
/// (`CARGO_BIN_EXE_*` names this package's binaries alone).
fn driver_program() -> PathBuf {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let built = BUILT.get_or_init(|| {
        csi_testbed::workspace::build(["csi-reference-driver"], !cfg!(debug_assertions))
            .map(|[program]| program)
            .map_err(|e| e.to_string())
    });
    match built {
        Ok(program) => program.clone(),
        Err(e) => panic!("building the reference driver: {e}"),
    }
}

/// The reference CSI driver (`csi-reference-driver`) with a unique name, its own socket and
/// state directory. Logs every request at debug level (secret keys only, never values), and
/// every CreateVolume request as JSON to its `--request-log`.
pub struct Driver {
    name: String,
    socket: PathBuf,
    state_dir: PathBuf,
    request_log: PathBuf,
    // Declared before `dir` so the process is killed before its directory goes.
    process: Process,
    _dir: TempDir,
}

/// One received request naming a volume id, as the driver logged it.
#[derive(Debug, Clone)]
pub struct VolumeRequest {
    /// When the driver received it.
    pub at: Timestamp,
    pub volume_id: String,
}

/// One finished RPC, as the driver logged it.
#[derive(Debug, Clone)]
pub struct Call {
    pub at: Timestamp,
    /// `Ok` or the gRPC code name, e.g. `Internal`.
    pub code: String,
}

impl Driver {
    /// Starts a driver with `extra` flags (e.g. `--delay CreateVolume=2s`) and waits until its
    /// socket accepts connections.
    pub async fn start(extra: &[&str]) -> Driver {
        Self::start_logging(extra, "info,csi_reference_driver=debug").await
    }

    /// As [`Driver::start`], with the driver's log filter (`RUST_LOG`), e.g. `trace`.
    pub async fn start_logging(extra: &[&str], log_filter: &str) -> Driver {
        let name = format!("t-{}.csi.example.com", unique_suffix());
        Self::start_named(name, extra, log_filter).await
    }

    /// A driver named `name`, for the one test of its binary that needs that very name (a
    /// CSI migration target: the in-tree migration tests). Tests sharing a binary must not use
    /// the same name concurrently.
    pub async fn start_as(name: &str, extra: &[&str]) -> Driver {
        Self::start_named(name.to_owned(), extra, "info,csi_reference_driver=debug").await
    }

    /// A second driver process of the same name with its own state, as the driver container
    /// of a second sidecar replica: each replica's calls arrive at its own driver.
    pub async fn twin(&self, extra: &[&str]) -> Driver {
        Self::start_named(self.name.clone(), extra, "info,csi_reference_driver=debug").await
    }

    async fn start_named(name: String, extra: &[&str], log_filter: &str) -> Driver {
        let dir = temp_dir("csi-driver-");
        let socket = dir.path().join("csi.sock");
        let state_dir = dir.path().join("state");
        let request_log = dir.path().join("create-volume-requests.jsonl");
        let mut driver = Driver {
            process: Process {
                label: format!("driver {name}"),
                program: driver_program(),
                args: driver_args(&socket, &state_dir, &request_log, &name, extra),
                env: vec![("RUST_LOG", log_filter.to_owned())],
                hostname: None,
                log: dir.path().join("driver.log"),
                child: None,
                starts: 0,
            },
            name,
            socket,
            state_dir,
            request_log,
            _dir: dir,
        };
        driver.process.spawn();
        driver.wait_ready().await;
        driver
    }

    async fn wait_ready(&mut self) {
        self.process.wait_listening(&self.socket).await;
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Replaces every fault and delay rule at runtime (control-file syntax, one rule a line),
    /// written atomically as the driver expects.
    pub fn set_faults(&self, rules: &str) {
        let target = self.state_dir.join("faults.txt");
        let temp = self.state_dir.join(".faults.txt.tmp");
        fs::write(&temp, rules).unwrap_or_else(|e| panic!("writing {}: {e}", temp.display()));
        fs::rename(&temp, &target)
            .unwrap_or_else(|e| panic!("renaming to {}: {e}", target.display()));
    }

    /// Removes every rule (also those given as flags at start).
    pub fn clear_faults(&self) {
        // The rules from flags are only replaced by a control file; an empty one clears them.
        self.set_faults("# no rules\n");
    }

    /// The volumes in the driver's durable state.
    pub fn volumes(&self) -> Vec<VolumeRecord> {
        load_state(&self.state_dir)
            .unwrap_or_else(|e| panic!("reading the state of {}: {e}", self.name))
            .volumes
            .into_values()
            .collect()
    }

    /// Creates a 1 MiB volume `name` by calling the driver directly, as a provisioner that then
    /// forgot it would; returns its id.
    pub async fn create_directly(&self, name: &str) -> String {
        use csi_spec::volume_capability::{AccessMode, AccessType, MountVolume, access_mode};
        let request = csi_spec::CreateVolumeRequest {
            name: name.to_owned(),
            capacity_range: Some(csi_spec::CapacityRange {
                required_bytes: 1 << 20,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![csi_spec::VolumeCapability {
                access_type: Some(AccessType::Mount(MountVolume::default())),
                access_mode: Some(AccessMode {
                    mode: access_mode::Mode::SingleNodeWriter as i32,
                }),
            }],
            ..Default::default()
        };
        csi_spec::controller_client::ControllerClient::new(
            super::csi_wire::channel(&self.socket).await,
        )
        .create_volume(request)
        .await
        .unwrap_or_else(|e| panic!("CreateVolume {name} on the driver: {e}"))
        .into_inner()
        .volume
        .unwrap_or_else(|| panic!("a reply without a volume"))
        .volume_id
    }

    pub fn volume_count(&self) -> usize {
        self.volumes().len()
    }

    pub fn log(&self) -> String {
        self.process.log_text()
    }

    /// Every finished call of `method` (e.g. `CreateVolume`), oldest first.
    pub fn calls(&self, method: &str) -> Vec<Call> {
        let method_field = format!("method=\"{method}\"");
        self.log()
            .lines()
            .filter(|line| line.contains("CSI call finished") && line.contains(&method_field))
            .filter_map(|line| {
                let at = line.split_whitespace().next()?.parse().ok()?;
                let code = line.split("code=").nth(1)?.split_whitespace().next()?;
                Some(Call {
                    at,
                    code: code.to_owned(),
                })
            })
            .collect()
    }

    /// Every CreateVolume request received, oldest first, as the driver's `--request-log` JSON
    /// (docs/reference-driver.md, "Request log"; secret values redacted). The log also holds
    /// the snapshot calls, each line naming its `method`.
    pub fn create_volume_requests(&self) -> Vec<serde_json::Value> {
        fs::read_to_string(&self.request_log)
            .unwrap_or_default()
            .lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter(|request| request["method"] == "CreateVolume")
            .collect()
    }

    /// The debug lines of every `method` request received (secret values are redacted by the
    /// driver, keys are visible).
    pub fn requests(&self, method: &str) -> Vec<String> {
        let marker = format!("CSI call method=\"{method}\" request=");
        self.log()
            .lines()
            .filter(|line| line.contains(&marker))
            .map(str::to_owned)
            .collect()
    }

    /// Waits until the driver has received a CreateVolume for `volume` (it logs requests as
    /// they arrive, before any injected delay).
    pub async fn wait_create_received(&self, volume: &str) {
        let needle = format!("name: \"{volume}\"");
        super::eventually(
            &format!("the driver to receive CreateVolume for {volume}"),
            TIMEOUT,
            || async {
                let requests = self.requests("CreateVolume");
                if requests.iter().any(|line| line.contains(&needle)) {
                    Ok(())
                } else {
                    Err(format!(
                        "{} CreateVolume requests, none for {volume}",
                        requests.len()
                    ))
                }
            },
        )
        .await;
    }

    /// Waits until the driver's state holds a volume named `volume`.
    pub async fn wait_holds(&self, volume: &str) {
        super::eventually(
            &format!("the driver to hold volume {volume}"),
            TIMEOUT,
            || async {
                let volumes = self.volumes();
                if volumes.iter().any(|v| v.name == volume) {
                    Ok(())
                } else {
                    Err(format!("{volumes:?}"))
                }
            },
        )
        .await;
    }

    /// Every `method` request that names a volume id (e.g. `DeleteVolume`), oldest first,
    /// whatever its outcome.
    pub fn volume_requests(&self, method: &str) -> Vec<VolumeRequest> {
        self.requests(method)
            .iter()
            .filter_map(|line| {
                let at = line.split_whitespace().next()?.parse().ok()?;
                let volume_id = line.split("volume_id: \"").nth(1)?.split('"').next()?;
                Some(VolumeRequest {
                    at,
                    volume_id: volume_id.to_owned(),
                })
            })
            .collect()
    }

    /// SIGKILL, as a crash: no socket clean-up, calls in flight are lost.
    pub async fn kill(&mut self) {
        self.process.kill().await;
    }

    /// Starts the driver again with the same flags, socket and state directory.
    pub async fn restart(&mut self) {
        self.process.restart().await;
        self.wait_ready().await;
    }

    /// Starts the driver again with the same name, socket and state but `extra` flags instead
    /// of those it ran with, as a driver reconfigured under a running sidecar.
    pub async fn restart_with(&mut self, extra: &[&str]) {
        self.process.args = driver_args(
            &self.socket,
            &self.state_dir,
            &self.request_log,
            &self.name,
            extra,
        );
        self.restart().await;
    }

    /// Every CreateVolume request received, oldest first, with its accessibility requirements
    /// (from [`Driver::create_volume_requests`]).
    pub fn create_requests(&self) -> Vec<CreateRequest> {
        self.create_volume_requests()
            .iter()
            .filter_map(CreateRequest::from_logged)
            .collect()
    }
}

fn driver_args(
    socket: &Path,
    state_dir: &Path,
    request_log: &Path,
    name: &str,
    extra: &[&str],
) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec![
        "--endpoint".into(),
        socket.into(),
        "--state-dir".into(),
        state_dir.into(),
        "--driver-name".into(),
        name.into(),
        "--request-log".into(),
        request_log.into(),
    ];
    args.extend(extra.iter().map(OsString::from));
    args
}

/// One topology segment map (a CSI `Topology`), ordered by key for comparisons.
pub type Segments = BTreeMap<String, String>;

/// A CreateVolume request's name and accessibility requirements, as the driver logged them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateRequest {
    pub name: String,
    /// `None`: the request had no `accessibility_requirements`.
    pub requirements: Option<Requirements>,
}

/// The `accessibility_requirements` of a CreateVolume, terms in the order sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirements {
    pub requisite: Vec<Segments>,
    pub preferred: Vec<Segments>,
}

impl CreateRequest {
    /// From one line of the driver's `--request-log` (segments are JSON objects there).
    fn from_logged(request: &serde_json::Value) -> Option<CreateRequest> {
        let name = request.get("name")?.as_str()?.to_owned();
        let terms = |requirements: &serde_json::Value, field: &str| -> Vec<Segments> {
            requirements
                .get(field)
                .and_then(|terms| serde_json::from_value(terms.clone()).ok())
                .unwrap_or_default()
        };
        let requirements = request
            .get("accessibility_requirements")
            .filter(|requirements| !requirements.is_null())
            .map(|requirements| Requirements {
                requisite: terms(requirements, "requisite"),
                preferred: terms(requirements, "preferred"),
            });
        Some(CreateRequest { name, requirements })
    }
}

// ------------------------------------------------------------------------------ sidecar

/// This package's `csi-provisioner`, the program under test, for every test that runs it (through
/// [`Sidecar`] or on its own). Cargo builds it for the root package's integration tests and puts
/// it in the profile directory, above the `deps/` holding the test binary that runs this: where
/// `env!("CARGO_BIN_EXE_csi-provisioner")` points in a test target (cargo sets that variable for
/// the test targets only, not for a library they use). Found next to the running test binary,
/// it is the one built with it, also when the binaries are run from a copy of that layout.
pub fn sidecar_program() -> PathBuf {
    static FOUND: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let found = FOUND.get_or_init(|| {
        let test_binary =
            std::env::current_exe().map_err(|e| format!("locating the test binary: {e}"))?;
        let profile_dir = test_binary
            .parent()
            .and_then(Path::parent)
            .ok_or_else(|| format!("{} is not in a deps/ directory", test_binary.display()))?;
        let program = profile_dir.join("csi-provisioner");
        if program.is_file() {
            Ok(program)
        } else {
            Err(format!(
                "{} does not exist (is {} a test binary of the root package, built by cargo?)",
                program.display(),
                test_binary.display()
            ))
        }
    });
    match found {
        Ok(program) => program.clone(),
        Err(e) => panic!("finding csi-provisioner: {e}"),
    }
}

/// Upstream's executable, found or built once per test binary.
fn upstream_program() -> PathBuf {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let built = BUILT
        .get_or_init(|| csi_testbed::workspace::upstream_provisioner().map_err(|e| e.to_string()));
    match built {
        Ok(program) => program.clone(),
        Err(e) => panic!("building upstream's csi-provisioner: {e}"),
    }
}

/// How to start a sidecar beyond the connection flags every sidecar gets.
#[derive(Debug, Clone, Default)]
pub struct SidecarOptions {
    /// Extra flags, e.g. `--retry-interval-max=3s`.
    pub args: Vec<String>,
    /// Serve metrics on a free local port (`--http-endpoint`).
    pub metrics: bool,
    /// Run in a UTS namespace with this hostname: the leader-election identity is the
    /// hostname, so two replicas on one machine need different ones, as two pods have.
    pub hostname: Option<String>,
    /// Environment variables, e.g. `NODE_NAME` for `--node-deployment`.
    pub env: Vec<(&'static str, String)>,
}

impl SidecarOptions {
    pub fn args(args: &[&str]) -> Self {
        SidecarOptions {
            args: args.iter().map(|s| (*s).to_owned()).collect(),
            ..SidecarOptions::default()
        }
    }
}

/// One `csi-provisioner` process for a driver, using the control plane's admin kubeconfig.
pub struct Sidecar {
    http: Option<SocketAddr>,
    process: Process,
    _dir: TempDir,
}

impl Sidecar {
    pub fn start(driver: &impl CsiEndpoint, args: &[&str]) -> Sidecar {
        Self::start_with(driver, SidecarOptions::args(args))
    }

    pub fn start_with(driver: &impl CsiEndpoint, options: SidecarOptions) -> Sidecar {
        Self::spawn(sidecar_program(), "sidecar", driver, options)
    }

    /// Upstream's `csi-provisioner` v6.3 (built and cached by
    /// `hack/build-upstream-provisioner.sh`) for the driver, with the same connection flags,
    /// for the downgrade and upgrade tests. `options.args` must be flags upstream knows.
    pub fn start_upstream(driver: &impl CsiEndpoint, options: SidecarOptions) -> Sidecar {
        Self::spawn(upstream_program(), "upstream sidecar", driver, options)
    }

    fn spawn(
        program: PathBuf,
        kind: &str,
        driver: &impl CsiEndpoint,
        options: SidecarOptions,
    ) -> Sidecar {
        let dir = temp_dir("csi-sidecar-");
        let mut args: Vec<OsString> = vec![
            "--csi-address".into(),
            driver.socket().into(),
            "--kubeconfig".into(),
            super::control_plane().kubeconfig_path().into(),
            "-v=2".into(),
        ];
        let http = options.metrics.then(free_local_port);
        if let Some(address) = http {
            args.push(format!("--http-endpoint={address}").into());
        }
        args.extend(options.args.iter().map(OsString::from));
        let label = match &options.hostname {
            Some(host) => format!("{kind} {host} of {}", driver.name()),
            None => format!("{kind} of {}", driver.name()),
        };
        let mut process = Process {
            label,
            program,
            args,
            env: options.env,
            hostname: options.hostname,
            log: dir.path().join("sidecar.log"),
            child: None,
            starts: 0,
        };
        process.spawn();
        Sidecar {
            http,
            process,
            _dir: dir,
        }
    }

    pub fn signal(&self, signal: Signal) {
        self.process.signal(signal);
    }

    /// SIGKILL, as a crash: nothing is released, calls in flight are lost.
    pub async fn kill(&mut self) {
        self.process.kill().await;
    }

    /// Starts the sidecar again with the same flags (and the same metrics port).
    pub async fn restart(&mut self) {
        self.process.restart().await;
    }

    pub async fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        self.process.wait_exit(timeout).await
    }

    pub fn is_running(&mut self) -> bool {
        self.process.is_running()
    }

    pub fn log(&self) -> String {
        self.process.log_text()
    }

    /// Whether the running process (not an earlier start) has loaded the journal: it runs its
    /// controllers, as the leader when leader election is on.
    pub fn has_loaded_journal(&self) -> bool {
        let log = self.log();
        let current = log.rfind("===== start #").map_or("", |start| &log[start..]);
        current.contains("journal loaded")
    }

    /// Fails the test if the process has exited, with its status and log tail.
    pub fn assert_running(&mut self) {
        if let Some(status) = self.process.try_exit() {
            panic!("{} exited unexpectedly: {status}", self.process.label);
        }
    }

    /// The metrics page; `Err` while the server is not up yet.
    pub fn metrics(&self) -> Result<String, String> {
        let address = self
            .http
            .unwrap_or_else(|| panic!("{} serves no metrics", self.process.label));
        http_get(address, "/metrics")
    }

    /// GET `path` on the metrics server, allowing `slow` beyond the usual read timeout: the
    /// status and the body.
    pub fn http_get(&self, path: &str, slow: Duration) -> Result<(u16, Vec<u8>), String> {
        let address = self
            .http
            .unwrap_or_else(|| panic!("{} serves no HTTP", self.process.label));
        http_get_bytes_within(address, path, slow)
    }

    /// Polls until the metrics server answers.
    pub async fn wait_metrics(&mut self) -> String {
        let started = Instant::now();
        loop {
            match self.metrics() {
                Ok(page) => return page,
                Err(error) if started.elapsed() > TIMEOUT => {
                    panic!("metrics of {} not served: {error}", self.process.label)
                }
                Err(_) => {
                    self.assert_running();
                    tokio::time::sleep(POLL).await;
                }
            }
        }
    }
}

/// "exit code N" or "killed by signal N", for messages.
pub fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => status.to_string(),
    }
}

fn free_local_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .unwrap_or_else(|e| panic!("finding a free local port: {e}"))
}

/// A minimal HTTP/1.0 GET; returns the body of a 200 answer.
fn http_get(address: SocketAddr, path: &str) -> Result<String, String> {
    match http_get_bytes_within(address, path, Duration::ZERO)? {
        (200, body) => String::from_utf8(body).map_err(|e| format!("GET {path}: {e}")),
        (status, _) => Err(format!("GET {path}: status {status}")),
    }
}

/// A minimal HTTP/1.0 GET with a read timeout of `10 s` plus `slow`: the status and body.
fn http_get_bytes_within(
    address: SocketAddr,
    path: &str,
    slow: Duration,
) -> Result<(u16, Vec<u8>), String> {
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(2))
        .map_err(|e| format!("connecting to {address}: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10) + slow))
        .map_err(|e| e.to_string())?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n")
        .map_err(|e| format!("sending to {address}: {e}"))?;
    let mut answer = Vec::new();
    stream
        .read_to_end(&mut answer)
        .map_err(|e| format!("reading from {address}: {e}"))?;
    let end = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| format!("no HTTP header end in {answer:?}"))?;
    let head = String::from_utf8_lossy(&answer[..end]);
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("no status in {head:?}"))?;
    Ok((status, answer[end + 4..].to_vec()))
}

/// One sample of a Prometheus/OpenMetrics text page.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Parses the sample lines of a metrics page (comments skipped).
pub fn parse_metrics(page: &str) -> Vec<Sample> {
    page.lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .filter_map(parse_sample)
        .collect()
}

fn parse_sample(line: &str) -> Option<Sample> {
    let (name, labels, rest) = match line.split_once('{') {
        Some((name, rest)) => {
            let (labels, rest) = rest.rsplit_once('}')?;
            (name, parse_labels(labels)?, rest)
        }
        None => {
            let (name, rest) = line.split_once(' ')?;
            (name, BTreeMap::new(), rest)
        }
    };
    let value = rest.split_whitespace().next()?.parse().ok()?;
    Some(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

fn parse_labels(text: &str) -> Option<BTreeMap<String, String>> {
    let mut labels = BTreeMap::new();
    let mut rest = text.trim();
    while !rest.is_empty() {
        let (key, after) = rest.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '\\' => value.push(chars.next()?.1),
                '"' => break i,
                c => value.push(c),
            }
        };
        labels.insert(key.trim().to_owned(), value);
        rest = after[end + 1..].trim_start_matches(',').trim();
    }
    Some(labels)
}

/// The sum of the samples named `name` whose labels include every pair of `labels`.
pub fn metric_sum(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name)
        .filter(|s| {
            labels
                .iter()
                .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.value)
        .sum()
}
