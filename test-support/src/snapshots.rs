//! The Kubernetes volume snapshot machinery as real peers of a test (csi_testbed::snapshots):
//! the snapshot CRDs, the ReferenceGrant CRD and one `snapshot-controller` per test binary's
//! control plane, started by the first test that asks, and a `csi-snapshotter` per driver that
//! the test owns. Snapshots are taken as a user takes them: a VolumeSnapshotClass of the driver
//! and a VolumeSnapshot of a claim, never a VolumeSnapshotContent by hand.
//!
//! ```ignore
//! let snapshotter = Snapshotter::start(&driver);
//! let class = cluster.snapshot_class("snap", &driver).await;
//! let (snapshot, content) = cluster.take_snapshot("snap", "data", &class, &snapshotter).await;
//! ```

use std::sync::{Mutex, OnceLock};

use csi_provisioner::api::{VolumeSnapshot, VolumeSnapshotContent};
use csi_testbed::snapshots::{self, SnapshotBinaries, SnapshotPeer};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use serde_json::json;

use super::cluster::Cluster;
use super::peers::{CsiEndpoint, TIMEOUT};
use super::{control_plane, eventually};

const LOG_TAIL_ON_FAILURE: usize = 40;
/// Our field manager for the objects a test applies.
const FIELD_MANAGER: &str = "csi-provisioner-tests";

/// What is started once per test binary.
struct Machinery {
    binaries: SnapshotBinaries,
    controller: Mutex<SnapshotPeer>,
}

static MACHINERY: OnceLock<Result<Machinery, String>> = OnceLock::new();

/// Builds (or finds) the programs, installs the CRDs and starts the snapshot controller, on the
/// first call of the test binary. Like the control plane, on a thread with a runtime of its own:
/// the handle outlives every test's runtime, and the controller's `--pdeathsig` is tied to its
/// supervisor's spawner thread, not to whichever test came first.
fn machinery() -> &'static Machinery {
    let started = MACHINERY.get_or_init(|| {
        let cp = control_plane();
        std::thread::spawn(move || {
            let dir = csi_testbed::workspace::snapshotter().map_err(|e| e.to_string())?;
            let binaries = SnapshotBinaries::at(&dir);
            let controller = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("building a runtime: {e}"))?
                .block_on(snapshots::serve(cp, &binaries))
                .map_err(|e| e.to_string())?;
            Ok(Machinery {
                binaries,
                controller: Mutex::new(controller),
            })
        })
        .join()
        .unwrap_or_else(|_| Err("the snapshot machinery's start-up thread panicked".to_owned()))
    });
    match started {
        Ok(machinery) => machinery,
        Err(e) => panic!("the snapshot machinery did not start: {e}"),
    }
}

/// `Err` with its log tail once the shared snapshot controller has exited.
fn controller_running() -> Result<(), String> {
    let mut controller = machinery()
        .controller
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    controller.check_running().map_err(|e| e.to_string())
}

fn controller_log_tail() -> String {
    machinery()
        .controller
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .log_tail(LOG_TAIL_ON_FAILURE)
}

/// The `csi-snapshotter` of one driver, with the snapshot machinery of the test binary's control
/// plane (CRDs, snapshot-controller) started on first use. Killed on drop; when the test is
/// failing, the tails of its log and of the controller's are printed.
pub struct Snapshotter {
    driver: String,
    peer: Mutex<SnapshotPeer>,
}

impl Snapshotter {
    pub fn start(driver: &impl CsiEndpoint) -> Snapshotter {
        let machinery = machinery();
        let peer = SnapshotPeer::start_csi_snapshotter(
            control_plane(),
            &machinery.binaries,
            driver.name(),
            driver.socket(),
        )
        .unwrap_or_else(|e| panic!("starting csi-snapshotter for {}: {e}", driver.name()));
        Snapshotter {
            driver: driver.name().to_owned(),
            peer: Mutex::new(peer),
        }
    }

    /// `Err` when this csi-snapshotter or the shared snapshot controller has exited.
    pub fn check_running(&self) -> Result<(), String> {
        self.peer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .check_running()
            .map_err(|e| e.to_string())?;
        controller_running()
    }

    pub fn log_tail(&self, lines: usize) -> String {
        self.peer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .log_tail(lines)
    }
}

impl Drop for Snapshotter {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "----- last {LOG_TAIL_ON_FAILURE} lines of csi-snapshotter of {} -----\n{}\n\
                 ----- last {LOG_TAIL_ON_FAILURE} lines of snapshot-controller -----\n{}",
                self.driver,
                self.log_tail(LOG_TAIL_ON_FAILURE),
                controller_log_tail(),
            );
        }
    }
}

/// `snapshot.storage.k8s.io/v1` VolumeSnapshotClass: the sidecar never reads it, so it has no
/// type in `csi_provisioner::api`.
fn snapshot_classes(client: &kube::Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("snapshot.storage.k8s.io", "v1", "VolumeSnapshotClass");
    Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(&gvk, "volumesnapshotclasses"),
    )
}

impl Cluster {
    pub fn snapshots(&self) -> Api<VolumeSnapshot> {
        Api::namespaced(self.client.clone(), self.ns())
    }

    pub fn snapshot_contents(&self) -> Api<VolumeSnapshotContent> {
        Api::all(self.client.clone())
    }

    /// Creates a VolumeSnapshotClass `<ns>-<suffix>` of `driver` (deletionPolicy Delete) and
    /// returns its name.
    pub async fn snapshot_class(&self, suffix: &str, driver: &impl CsiEndpoint) -> String {
        let name = format!("{}-{suffix}", self.ns());
        let class = json!({
            "apiVersion": "snapshot.storage.k8s.io/v1",
            "kind": "VolumeSnapshotClass",
            "metadata": {"name": name},
            "driver": driver.name(),
            "deletionPolicy": "Delete",
        });
        snapshot_classes(&self.client)
            .patch(&name, &apply_params(), &Patch::Apply(&class))
            .await
            .unwrap_or_else(|e| panic!("creating VolumeSnapshotClass {name}: {e}"));
        name
    }

    /// Creates a VolumeSnapshot `name` of the claim `claim` in `class`, as `kubectl apply
    /// --server-side` does.
    pub async fn create_snapshot(&self, name: &str, claim: &str, class: &str) -> VolumeSnapshot {
        // Applied, not created: a custom resource's body must carry apiVersion and kind, which
        // the partial type does not serialize.
        let snapshot = json!({
            "apiVersion": "snapshot.storage.k8s.io/v1",
            "kind": "VolumeSnapshot",
            "metadata": {"name": name},
            "spec": {
                "source": {"persistentVolumeClaimName": claim},
                "volumeSnapshotClassName": class,
            },
        });
        self.snapshots()
            .patch(name, &apply_params(), &Patch::Apply(&snapshot))
            .await
            .unwrap_or_else(|e| panic!("creating VolumeSnapshot {name}: {e}"))
    }

    /// Waits until the VolumeSnapshot `name` is readyToUse and returns it with its bound
    /// content; fails early when a snapshot program has exited.
    pub async fn wait_snapshot_ready(
        &self,
        name: &str,
        snapshotter: &Snapshotter,
    ) -> (VolumeSnapshot, VolumeSnapshotContent) {
        eventually(
            &format!("VolumeSnapshot {name} to be readyToUse"),
            TIMEOUT,
            || async {
                if let Err(stopped) = snapshotter.check_running() {
                    panic!("{stopped}");
                }
                let snapshot = self
                    .snapshots()
                    .get(name)
                    .await
                    .map_err(|e| e.to_string())?;
                let status = snapshot.status.clone().unwrap_or_default();
                let content_name = match (
                    status.ready_to_use,
                    &status.bound_volume_snapshot_content_name,
                ) {
                    (Some(true), Some(content)) => content.clone(),
                    _ => return Err(format!("status {status:?}")),
                };
                let content = self
                    .snapshot_contents()
                    .get(&content_name)
                    .await
                    .map_err(|e| format!("reading VolumeSnapshotContent {content_name}: {e}"))?;
                Ok((snapshot, content))
            },
        )
        .await
    }

    /// [`Cluster::create_snapshot`], then [`Cluster::wait_snapshot_ready`].
    pub async fn take_snapshot(
        &self,
        name: &str,
        claim: &str,
        class: &str,
        snapshotter: &Snapshotter,
    ) -> (VolumeSnapshot, VolumeSnapshotContent) {
        self.create_snapshot(name, claim, class).await;
        self.wait_snapshot_ready(name, snapshotter).await
    }

    pub async fn delete_snapshot(&self, name: &str) {
        self.snapshots()
            .delete(name, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("deleting VolumeSnapshot {name}: {e}"));
    }

    /// Waits until the VolumeSnapshot `name` and the content `content` are both gone (with
    /// deletionPolicy Delete, the content goes after the driver deleted the snapshot).
    pub async fn wait_snapshot_gone(&self, name: &str, content: &str) {
        eventually(
            &format!("VolumeSnapshot {name} and VolumeSnapshotContent {content} to be gone"),
            TIMEOUT,
            || async {
                let snapshot = self
                    .snapshots()
                    .get_opt(name)
                    .await
                    .map_err(|e| e.to_string())?;
                let left = self
                    .snapshot_contents()
                    .get_opt(content)
                    .await
                    .map_err(|e| e.to_string())?;
                match (snapshot, left) {
                    (None, None) => Ok(()),
                    (snapshot, left) => Err(format!(
                        "snapshot finalizers {:?}, content finalizers {:?}, content status {:?}",
                        snapshot.map(|s| s.metadata.finalizers),
                        left.as_ref().map(|c| &c.metadata.finalizers),
                        left.as_ref().map(|c| &c.status),
                    )),
                }
            },
        )
        .await;
    }
}

fn apply_params() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER)
}
