//! A second driver for the end-to-end tests, one nobody on this team wrote: the Kubernetes
//! end-to-end mock CSI driver (`csi-mock-driver`, hack/mock-driver/), as a separate process on a
//! unix socket of its own. It keeps its volumes in memory and logs every call it received as one
//! JSON line (`method`, `request` as protojson with secret values redacted, `code`, `message`,
//! `response`), which the tests read back.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use tempfile::TempDir;

use super::peers::{CsiEndpoint, Process, temp_dir, unique_suffix};

/// The mock's executable, found or built once per test binary by `hack/build-mock-driver.sh`.
fn mock_program() -> PathBuf {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let built =
        BUILT.get_or_init(|| csi_testbed::workspace::mock_driver().map_err(|e| e.to_string()));
    match built {
        Ok(program) => program.clone(),
        Err(e) => panic!("building the mock CSI driver: {e}"),
    }
}

/// The mock's knobs (its `Config`) that the tests use; the rest go in `args` as flags
/// (`csi-mock-driver -help` lists them).
#[derive(Debug, Clone)]
pub struct MockDriverOptions {
    /// Report VOLUME_ACCESSIBILITY_CONSTRAINTS; volumes and the node get the mock's one fixed
    /// segment, `io.kubernetes.storage.mock/node=some-mock-node`.
    pub topology: bool,
    /// Report PUBLISH_UNPUBLISH_VOLUME (the mock's default).
    pub attach_required: bool,
    /// NodeGetInfo's max_volumes_per_node, also enforced by ControllerPublishVolume; 0: none.
    pub attach_limit: u32,
    /// Further flags, e.g. `--node-expansion-required`.
    pub args: Vec<String>,
}

impl Default for MockDriverOptions {
    fn default() -> Self {
        MockDriverOptions {
            topology: false,
            attach_required: true,
            attach_limit: 0,
            args: Vec::new(),
        }
    }
}

/// A running mock driver with a unique name (`m-<random>.csi.example.com`), killed on drop.
pub struct MockDriver {
    name: String,
    socket: PathBuf,
    // Declared before `dir` so the process is killed before its directory goes.
    process: Process,
    _dir: TempDir,
}

impl MockDriver {
    /// Starts a mock driver and waits until its socket accepts connections.
    pub async fn start(options: MockDriverOptions) -> MockDriver {
        let name = format!("m-{}.csi.example.com", unique_suffix());
        let dir = temp_dir("csi-mock-driver-");
        let socket = dir.path().join("csi.sock");
        let mut args: Vec<OsString> = vec![
            "--endpoint".into(),
            socket.clone().into(),
            "--driver-name".into(),
            name.clone().into(),
            format!("--enable-topology={}", options.topology).into(),
            format!("--attach-required={}", options.attach_required).into(),
            format!("--attach-limit={}", options.attach_limit).into(),
        ];
        args.extend(options.args.iter().map(OsString::from));
        let mut driver = MockDriver {
            process: Process {
                label: format!("mock driver {name}"),
                program: mock_program(),
                args,
                env: Vec::new(),
                hostname: None,
                log: dir.path().join("mock-driver.log"),
                child: None,
                starts: 0,
            },
            name,
            socket,
            _dir: dir,
        };
        driver.process.spawn();
        driver.process.wait_listening(&driver.socket).await;
        driver
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub fn log(&self) -> String {
        self.process.log_text()
    }

    /// Every finished call of `method` (the last part of the gRPC method, e.g. `DeleteVolume`),
    /// oldest first, as logged: `method`, `request`, `code` (`OK` or the gRPC code name),
    /// `message` and, on success, `response`. Messages use the spec's field names
    /// (`capacity_range`); 64-bit numbers are strings, as in protojson.
    pub fn calls(&self, method: &str) -> Vec<serde_json::Value> {
        let suffix = format!("/{method}");
        self.log()
            .lines()
            // The log also holds the start markers and the mock's own messages.
            .filter(|line| line.starts_with('{'))
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter(|call| {
                call.get("method")
                    .and_then(serde_json::Value::as_str)
                    .is_some_and(|m| m.ends_with(&suffix))
            })
            .collect()
    }

    /// The request of every CreateVolume received, oldest first (secret values redacted).
    pub fn create_volume_requests(&self) -> Vec<serde_json::Value> {
        self.calls("CreateVolume")
            .into_iter()
            .filter_map(|mut call| call.get_mut("request").map(serde_json::Value::take))
            .collect()
    }
}

impl CsiEndpoint for MockDriver {
    fn name(&self) -> &str {
        MockDriver::name(self)
    }

    fn socket(&self) -> &Path {
        MockDriver::socket(self)
    }
}
