//! What the root package's integration tests share (package `csi-test-support`, a
//! dev-dependency of the root package; a test file imports it with
//! `use csi_test_support as support;`). A library compiled once, not a module compiled into
//! every test binary.
//!
//! One control plane per test binary, started lazily by the first test that asks and shared by
//! the rest; each test gets its own namespace. Processes and the run directory go away when the
//! test binary exits, even though the handle sits in a `static` that is never dropped: the
//! testbed starts every child under `setpriv --pdeathsig KILL` from a thread that lives as long
//! as the handle, and an `sh` reaper removes the directory once this process is gone.

pub mod cluster;
pub mod csi_wire;
pub mod in_cluster;
pub mod manifests;
pub mod mock_driver;
pub mod peers;
pub mod snapshots;
pub mod topology;

use std::future::Future;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use csi_testbed::{ControlPlane, StartOptions};
use k8s_openapi::api::core::v1::Namespace;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};

/// Log lines of each component printed when a test fails.
const LOG_LINES_ON_FAILURE: usize = 80;
const POLL: Duration = Duration::from_millis(200);

static CONTROL_PLANE: OnceLock<Result<ControlPlane, String>> = OnceLock::new();
static NAMESPACE_SEQ: AtomicUsize = AtomicUsize::new(0);

/// The test binary's control plane, started on first use.
pub fn control_plane() -> &'static ControlPlane {
    control_plane_with_apiserver_flags(&[])
}

/// The test binary's control plane, started on first use with these extra kube-apiserver
/// flags. A test binary that needs them calls this before anything else touches the cluster.
pub fn control_plane_with_apiserver_flags(
    apiserver_flags: &'static [&str],
) -> &'static ControlPlane {
    shared_control_plane(StartOptions {
        apiserver_flags,
        scheduler: false,
        node: None,
    })
}

/// The test binary's control plane with kube-scheduler, started on first use. Every test of a
/// binary that needs the scheduler calls this (or `topology::scheduling_cluster`) before
/// anything else touches the cluster: whichever test comes first starts the shared instance.
pub fn control_plane_with_scheduler() -> &'static ControlPlane {
    let cp = shared_control_plane(StartOptions {
        apiserver_flags: &[],
        scheduler: true,
        node: None,
    });
    assert!(
        cp.scheduler_url().is_some(),
        "this test binary's control plane was started without kube-scheduler: call \
         support::control_plane_with_scheduler() before anything else touches the cluster"
    );
    cp
}

/// The test binary's control plane with a real node (containerd and a kubelet, with the images
/// of `hack/build-images.sh` imported), started on first use; every test of such a binary calls
/// this first. One node runs per machine: a second test binary with a node waits for the
/// first to end (docs/control-plane.md, "A real node").
pub fn control_plane_with_node() -> &'static ControlPlane {
    static IMAGES: OnceLock<Result<Vec<std::path::PathBuf>, String>> = OnceLock::new();
    let images = match IMAGES.get_or_init(|| {
        csi_testbed::workspace::images().map_err(|e| format!("building the node's images: {e}"))
    }) {
        Ok(images) => images.as_slice(),
        Err(e) => panic!("{e}"),
    };
    let cp = shared_control_plane(StartOptions {
        apiserver_flags: &[],
        scheduler: true,
        node: Some(images),
    });
    assert!(
        cp.node().is_some(),
        "this test binary's control plane was started without a node: call \
         support::control_plane_with_node() before anything else touches the cluster"
    );
    cp
}

/// Start-up runs on a thread with its own runtime: the handle outlives every test's runtime, and
/// nothing in it may depend on the runtime of whichever test happened to come first. `options`
/// count only for the first call of the test binary.
fn shared_control_plane(options: StartOptions<'static>) -> &'static ControlPlane {
    let started = CONTROL_PLANE.get_or_init(|| {
        std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("building a runtime: {e}"))?
                .block_on(async {
                    let cp = ControlPlane::start_with(options)
                        .await
                        .map_err(|e| e.to_string())?;
                    install_journal_crd(&cp).await?;
                    Ok(cp)
                })
        })
        .join()
        .unwrap_or_else(|_| Err("the control-plane start-up thread panicked".to_owned()))
    });
    match started {
        Ok(cp) => cp,
        Err(e) => panic!("the local control plane did not start: {e}"),
    }
}

/// The sidecar refuses to start without its journal CRD (deploy/base/crd.yaml), as in a cluster
/// where the CRD was not applied; every test cluster gets it up front.
async fn install_journal_crd(cp: &ControlPlane) -> Result<(), String> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::CustomResourceExt;
    let client = cp.client().await.map_err(|e| e.to_string())?;
    let crds: Api<CustomResourceDefinition> = Api::all(client);
    let crd = csi_provisioner::journal::ProvisioningJournal::crd();
    let name = crd.metadata.name.clone().unwrap_or_default();
    crds.create(&PostParams::default(), &crd)
        .await
        .map_err(|e| format!("installing the journal CRD: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let established = crds
            .get(&name)
            .await
            .ok()
            .and_then(|crd| crd.status)
            .and_then(|status| status.conditions)
            .is_some_and(|conditions| {
                conditions
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            });
        if established {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err("the journal CRD was not established within 60 s".to_owned());
        }
        tokio::time::sleep(POLL).await;
    }
}

/// A fresh admin client on the calling test's runtime.
pub async fn client() -> Client {
    match control_plane().client().await {
        Ok(client) => client,
        Err(e) => panic!("building a client for the local control plane: {e}"),
    }
}

/// A namespace of this test's own. While it is alive, a failing (panicking) test prints the tail
/// of each component's log.
pub struct TestNamespace {
    name: String,
}

impl TestNamespace {
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl std::fmt::Display for TestNamespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "test in namespace {} failed; control-plane logs follow",
                self.name
            );
            control_plane().dump_logs_tail(LOG_LINES_ON_FAILURE);
        }
    }
}

/// An admin client and a new namespace named after `prefix` (unique within the test binary).
/// Namespaces are not deleted: the whole control plane goes away with the test binary.
pub async fn test_namespace(prefix: &str) -> (Client, TestNamespace) {
    let client = client().await;
    let name = namespace_name(prefix, NAMESPACE_SEQ.fetch_add(1, Ordering::Relaxed));
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    let guard = TestNamespace { name };
    if let Err(e) = Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
    {
        panic!("creating namespace {guard}: {e}");
    }
    (client, guard)
}

/// A DNS-1123 label: lower-case alphanumerics and '-', at most 63 characters.
fn namespace_name(prefix: &str, seq: usize) -> String {
    let cleaned: String = prefix
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let suffix = format!("-{}-{seq}", std::process::id());
    let room = 63 - suffix.len();
    let head = cleaned.trim_matches('-');
    let head = if head.is_empty() { "test" } else { head };
    format!("{}{suffix}", &head[..head.len().min(room)]).replace("--", "-")
}

/// Polls `check` until it yields `Ok`, failing the test after `timeout` with `what` and the last
/// observation (`Err` carries a description of the state seen).
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let started = Instant::now();
    loop {
        match check().await {
            Ok(value) => return value,
            Err(seen) if started.elapsed() >= timeout => {
                panic!("timed out after {timeout:?} waiting for {what}; last seen: {seen}")
            }
            Err(_) => tokio::time::sleep(POLL).await,
        }
    }
}
