//! The reference driver as a real node plugin: bind mounts made by NodeStage/NodePublish and seen
//! through the target paths, the socket's `--socket-mode`, and several driver processes sharing
//! one state directory. The mount tests need root (CI runs as root) and fail, not skip,
//! without it.

// The CSI client helpers of the provisioner's integration tests, shared rather than copied.
#[path = "../../test-support/src/csi_wire.rs"]
mod csi_wire;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use csi_reference_driver::{self as driver, DriverConfig, mounts};
use csi_spec as csi;
use csi_spec::controller_client::ControllerClient;
use csi_spec::node_client::NodeClient;
use csi_spec::node_service_capability::rpc::Type as NodeRpc;
use csi_spec::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume, access_mode};
use csi_spec::volume_usage::Unit;
use csi_wire::{channel, list_volume_ids};
use tokio::sync::oneshot;
use tonic::Code;
use tonic::transport::Channel;

const MI: i64 = 1 << 20;

/// Fails (never skips) the calling test unless it runs as root.
fn require_root() {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let euid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        .expect("Uid line in /proc/self/status");
    assert_eq!(
        euid, "0",
        "this test bind-mounts volumes and must run as root (CI does); effective uid is {euid}"
    );
}

/// Unmounts every path it was given when dropped, also when the test panics, so a failed test
/// leaves no mount behind.
#[derive(Default)]
struct MountGuard(Vec<PathBuf>);

impl MountGuard {
    fn watch(&mut self, path: &Path) -> String {
        self.0.push(path.to_path_buf());
        path.display().to_string()
    }
}

impl Drop for MountGuard {
    fn drop(&mut self) {
        // Targets first (they may be bound from staging paths).
        for path in self.0.iter().rev() {
            if let Err(error) = mounts::unmount_all(path) {
                eprintln!("cleanup: cannot unmount {}: {error}", path.display());
            }
        }
    }
}

fn cap(block: bool) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(if block {
            AccessType::Block(BlockVolume {})
        } else {
            AccessType::Mount(MountVolume::default())
        }),
        access_mode: Some(AccessMode {
            mode: access_mode::Mode::SingleNodeWriter as i32,
        }),
    }
}

async fn create(client: &mut ControllerClient<Channel>, name: &str, block: bool) -> String {
    client
        .create_volume(csi::CreateVolumeRequest {
            name: name.into(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: 4 * MI,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![cap(block)],
            ..Default::default()
        })
        .await
        .expect("CreateVolume")
        .into_inner()
        .volume
        .expect("volume")
        .volume_id
}

fn stage_req(volume_id: &str, staging: &str, block: bool) -> csi::NodeStageVolumeRequest {
    csi::NodeStageVolumeRequest {
        volume_id: volume_id.into(),
        staging_target_path: staging.into(),
        volume_capability: Some(cap(block)),
        ..Default::default()
    }
}

fn publish_req(
    volume_id: &str,
    staging: &str,
    target: &str,
    block: bool,
    readonly: bool,
) -> csi::NodePublishVolumeRequest {
    csi::NodePublishVolumeRequest {
        volume_id: volume_id.into(),
        staging_target_path: staging.into(),
        target_path: target.into(),
        volume_capability: Some(cap(block)),
        readonly,
        ..Default::default()
    }
}

fn unpublish_req(volume_id: &str, target: &str) -> csi::NodeUnpublishVolumeRequest {
    csi::NodeUnpublishVolumeRequest {
        volume_id: volume_id.into(),
        target_path: target.into(),
    }
}

fn unstage_req(volume_id: &str, staging: &str) -> csi::NodeUnstageVolumeRequest {
    csi::NodeUnstageVolumeRequest {
        volume_id: volume_id.into(),
        staging_target_path: staging.into(),
    }
}

fn stats_req(volume_id: &str, path: &str) -> csi::NodeGetVolumeStatsRequest {
    csi::NodeGetVolumeStatsRequest {
        volume_id: volume_id.into(),
        volume_path: path.into(),
        staging_target_path: String::new(),
    }
}

fn mounted(path: &str) -> bool {
    mounts::is_mount_point(Path::new(path)).expect("read mountinfo")
}

struct InProcess {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), driver::DriverError>>,
}

fn start(config: &DriverConfig) -> InProcess {
    let bound = driver::bind(config).expect("driver binds");
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(bound.serve(async {
        let _ = stopped.await;
    }));
    InProcess { stop, task }
}

/// A driver served in this process on a temporary directory (its socket and state dir inside),
/// with its clients; the guard unmounts what a test mounted before the directory goes (fields
/// drop in order; a test's bindings in reverse, so it names `dir` first).
struct Plugin {
    guard: MountGuard,
    running: InProcess,
    controller: ControllerClient<Channel>,
    node: NodeClient<Channel>,
    dir: tempfile::TempDir,
}

async fn plugin() -> Plugin {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let config = DriverConfig::new(dir.path().join("csi.sock"), dir.path().join("state"));
    let running = start(&config);
    let channel = channel(&config.endpoint).await;
    Plugin {
        guard: MountGuard::default(),
        running,
        controller: ControllerClient::new(channel.clone()),
        node: NodeClient::new(channel),
        dir,
    }
}

#[tokio::test]
async fn mount_volumes_are_bind_mounted_through_stage_and_publish() {
    let Plugin {
        dir,
        mut guard,
        running,
        mut controller,
        mut node,
    } = plugin().await;

    let caps: BTreeSet<i32> = node
        .node_get_capabilities(csi::NodeGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities
        .into_iter()
        .filter_map(|c| match c.r#type {
            Some(csi::node_service_capability::Type::Rpc(rpc)) => Some(rpc.r#type),
            _ => None,
        })
        .collect();
    assert_eq!(
        caps,
        BTreeSet::from([
            NodeRpc::StageUnstageVolume as i32,
            NodeRpc::GetVolumeStats as i32
        ])
    );

    let id = create(&mut controller, "pvc-mount", false).await;
    let data = dir.path().join("state/volumes").join(&id);
    assert!(data.is_dir(), "CreateVolume makes the data directory");

    // Stage and publish (twice each: idempotent), then write through the target.
    let staging = guard.watch(&dir.path().join("plugins/globalmount"));
    let target = guard.watch(&dir.path().join("pods/a/volumes/mount"));
    for _ in 0..2 {
        node.node_stage_volume(stage_req(&id, &staging, false))
            .await
            .expect("NodeStageVolume");
    }
    assert!(mounted(&staging), "the staging path is a bind mount");
    for _ in 0..2 {
        node.node_publish_volume(publish_req(&id, &staging, &target, false, false))
            .await
            .expect("NodePublishVolume");
    }
    assert!(mounted(&target), "the target is a bind mount");
    std::fs::write(Path::new(&target).join("hello.txt"), b"written by pod a").unwrap();
    assert_eq!(
        std::fs::read(data.join("hello.txt")).unwrap(),
        b"written by pod a",
        "the write landed in the volume's data"
    );

    let usage = node
        .node_get_volume_stats(stats_req(&id, &target))
        .await
        .expect("NodeGetVolumeStats")
        .into_inner()
        .usage;
    let bytes = usage.iter().find(|u| u.unit == Unit::Bytes as i32).unwrap();
    let inodes = usage
        .iter()
        .find(|u| u.unit == Unit::Inodes as i32)
        .unwrap();
    assert!(bytes.total > 0 && bytes.used <= bytes.total && bytes.available <= bytes.total);
    assert!(inodes.used <= inodes.total);
    let elsewhere = dir.path().join("elsewhere").display().to_string();
    for (req, what) in [
        (stats_req(&id, &elsewhere), "a path it is not published at"),
        (stats_req("vol-unknown", &target), "an unknown volume"),
    ] {
        let err = node.node_get_volume_stats(req).await.unwrap_err();
        assert_eq!(err.code(), Code::NotFound, "{what}: {err:?}");
    }

    let busy = controller
        .delete_volume(csi::DeleteVolumeRequest {
            volume_id: id.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(busy.code(), Code::FailedPrecondition, "{busy:?}");

    for _ in 0..2 {
        node.node_unpublish_volume(unpublish_req(&id, &target))
            .await
            .expect("NodeUnpublishVolume");
    }
    assert!(!mounted(&target) && !Path::new(&target).exists());
    for _ in 0..2 {
        node.node_unstage_volume(unstage_req(&id, &staging))
            .await
            .expect("NodeUnstageVolume");
    }
    assert!(!mounted(&staging));

    // Another pod, another staging path: the file is still there.
    let staging2 = guard.watch(&dir.path().join("plugins/globalmount2"));
    let target2 = guard.watch(&dir.path().join("pods/b/volumes/mount"));
    let target_ro = guard.watch(&dir.path().join("pods/c/volumes/mount"));
    node.node_stage_volume(stage_req(&id, &staging2, false))
        .await
        .unwrap();
    node.node_publish_volume(publish_req(&id, &staging2, &target2, false, false))
        .await
        .unwrap();
    assert_eq!(
        std::fs::read(Path::new(&target2).join("hello.txt")).unwrap(),
        b"written by pod a"
    );
    // Read-only: reads work, writes are refused by the kernel.
    node.node_publish_volume(publish_req(&id, &staging2, &target_ro, false, true))
        .await
        .unwrap();
    assert_eq!(
        std::fs::read(Path::new(&target_ro).join("hello.txt")).unwrap(),
        b"written by pod a"
    );
    let refused = std::fs::write(Path::new(&target_ro).join("nope.txt"), b"x").unwrap_err();
    assert_eq!(
        refused.kind(),
        std::io::ErrorKind::ReadOnlyFilesystem,
        "{refused}"
    );
    let conflict = node
        .node_publish_volume(publish_req(&id, &staging2, &target_ro, false, false))
        .await
        .unwrap_err();
    assert_eq!(conflict.code(), Code::AlreadyExists, "{conflict:?}");
    for target in [&target2, &target_ro] {
        node.node_unpublish_volume(unpublish_req(&id, target))
            .await
            .unwrap();
        assert!(!mounted(target) && !Path::new(target).exists());
    }
    node.node_unstage_volume(unstage_req(&id, &staging2))
        .await
        .unwrap();
    assert!(!mounted(&staging2));

    // Spec errors: unknown volumes, missing fields, a publish from a path it is not staged at.
    let unknown = node
        .node_stage_volume(stage_req("vol-unknown", &staging, false))
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
    let unknown = node
        .node_unpublish_volume(unpublish_req("vol-unknown", &target))
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
    let unstaged = node
        .node_publish_volume(publish_req(&id, &staging, &target, false, false))
        .await
        .unwrap_err();
    assert_eq!(unstaged.code(), Code::FailedPrecondition, "{unstaged:?}");
    assert!(!mounted(&target));
    let invalid = node
        .node_stage_volume(stage_req(&id, "", false))
        .await
        .unwrap_err();
    assert_eq!(invalid.code(), Code::InvalidArgument);
    let invalid = node
        .node_stage_volume(csi::NodeStageVolumeRequest {
            volume_capability: None,
            ..stage_req(&id, &staging, false)
        })
        .await
        .unwrap_err();
    assert_eq!(invalid.code(), Code::InvalidArgument);

    controller
        .delete_volume(csi::DeleteVolumeRequest {
            volume_id: id.clone(),
            ..Default::default()
        })
        .await
        .expect("DeleteVolume");
    assert!(!data.exists(), "DeleteVolume removes the data");

    let _ = running.stop.send(());
    running.task.await.unwrap().unwrap();
}

#[tokio::test]
async fn block_volumes_are_published_as_loop_devices_of_their_files() {
    require_root();
    let Plugin {
        dir,
        mut guard,
        running,
        mut controller,
        mut node,
    } = plugin().await;

    let id = create(&mut controller, "pvc-block", true).await;
    let data = dir.path().join(format!("state/volumes/{id}.block"));
    assert_eq!(std::fs::metadata(&data).unwrap().len(), 4 * MI as u64);

    let staging = guard.watch(&dir.path().join("volumeDevices/staging/pv"));
    let target = guard.watch(&dir.path().join("volumeDevices/publish/pv/pod-uid"));
    node.node_stage_volume(stage_req(&id, &staging, true))
        .await
        .unwrap();
    node.node_publish_volume(publish_req(&id, &staging, &target, true, false))
        .await
        .unwrap();
    // A device node, as a container runtime needs to map it into a pod: a loop device of the
    // volume's file.
    assert!(mounted(&target));
    let device = std::fs::metadata(&target).unwrap().file_type();
    assert!(device.is_block_device(), "{target} is {device:?}");
    let loops = backing_loops(&data);
    assert_eq!(loops.len(), 1, "one loop device backs {}", data.display());
    // Written in place through the device, never truncated.
    let mut written = std::fs::OpenOptions::new()
        .write(true)
        .open(&target)
        .unwrap();
    std::io::Write::write_all(&mut written, b"raw bytes").unwrap();
    written.sync_all().unwrap();
    drop(written);
    assert_eq!(&std::fs::read(&data).unwrap()[..9], b"raw bytes");
    assert_eq!(std::fs::metadata(&data).unwrap().len(), 4 * MI as u64);

    // A second pod's target shows the same device.
    let second = guard.watch(&dir.path().join("volumeDevices/publish/pv/pod-uid-2"));
    node.node_publish_volume(publish_req(&id, &staging, &second, true, false))
        .await
        .unwrap();
    assert_eq!(backing_loops(&data), loops);
    node.node_unpublish_volume(unpublish_req(&id, &second))
        .await
        .unwrap();
    assert_eq!(backing_loops(&data), loops, "still published at {target}");

    // A read-only publication gets a device of its own, attached read-only: writes fail.
    let readonly = guard.watch(&dir.path().join("volumeDevices/publish/pv/pod-uid-ro"));
    node.node_publish_volume(publish_req(&id, &staging, &readonly, true, true))
        .await
        .unwrap();
    assert_eq!(backing_loops(&data).len(), 2);
    let refused = std::fs::OpenOptions::new()
        .write(true)
        .open(&readonly)
        .and_then(|mut device| {
            std::io::Write::write_all(&mut device, b"changed")?;
            device.sync_all()
        });
    assert!(refused.is_err(), "wrote through a read-only publication");
    assert_eq!(&std::fs::read(&readonly).unwrap()[..9], b"raw bytes");
    node.node_unpublish_volume(unpublish_req(&id, &readonly))
        .await
        .unwrap();

    let usage = node
        .node_get_volume_stats(stats_req(&id, &target))
        .await
        .unwrap()
        .into_inner()
        .usage;
    assert_eq!(usage[0].total, 4 * MI);

    node.node_unpublish_volume(unpublish_req(&id, &target))
        .await
        .unwrap();
    assert!(!mounted(&target) && !Path::new(&target).exists());
    assert_eq!(
        backing_loops(&data),
        Vec::<String>::new(),
        "the last unpublish detaches"
    );
    node.node_unstage_volume(unstage_req(&id, &staging))
        .await
        .unwrap();
    controller
        .delete_volume(csi::DeleteVolumeRequest {
            volume_id: id,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(!data.exists());

    let _ = running.stop.send(());
    running.task.await.unwrap().unwrap();
}

/// The loop devices (`loopN`) the kernel shows backed by `file`.
fn backing_loops(file: &Path) -> Vec<String> {
    let file = std::fs::canonicalize(file).unwrap();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/sys/block").unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        let shown = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file"));
        if name.starts_with("loop") && shown.is_ok_and(|s| Path::new(s.trim_end()) == file) {
            found.push(name);
        }
    }
    found.sort();
    found
}

/// A driver binary whose stderr is watched for its start-up line; SIGTERM-ed when dropped.
struct Process {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Process {
    /// Starts the binary and waits until it logs that it listens (or exits, or 30s pass).
    fn start(args: &[&std::ffi::OsStr]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_csi-reference-driver"))
            .args(args)
            .env("RUST_LOG", "info")
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the driver binary");
        let stderr = child.stderr.take().unwrap();
        let (send, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("driver: {line}");
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        let process = Self { child, lines };
        process.wait_for("CSI reference driver listening");
        process
    }

    fn wait_for(&self, text: &str) -> String {
        loop {
            match self.lines.recv_timeout(Duration::from_secs(30)) {
                Ok(line) if line.contains(text) => return line,
                Ok(_) => {}
                Err(e) => panic!("the driver never logged {text:?}: {e}"),
            }
        }
    }

    fn terminate(mut self) -> std::process::ExitStatus {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        self.child.wait().unwrap()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_on_one_state_dir_see_each_others_volumes() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let sockets = [dir.path().join("a.sock"), dir.path().join("b.sock")];
    let processes: Vec<Process> = sockets
        .iter()
        .map(|s| {
            Process::start(&[
                "--endpoint".as_ref(),
                s.as_os_str(),
                "--state-dir".as_ref(),
                state.as_os_str(),
            ])
        })
        .collect();
    let mut a = ControllerClient::new(channel(&sockets[0]).await);
    let mut b = ControllerClient::new(channel(&sockets[1]).await);

    // Many creates through both at once: without the shared lock, one process's write would
    // drop the other's volumes.
    let names = |p: &'static str| (0..12).map(move |i| format!("pvc-{p}-{i}"));
    let (from_a, from_b) = tokio::join!(
        async {
            let mut ids = Vec::new();
            for name in names("a") {
                ids.push(create(&mut a, &name, false).await);
            }
            ids
        },
        async {
            let mut ids = Vec::new();
            for name in names("b") {
                ids.push(create(&mut b, &name, false).await);
            }
            ids
        }
    );
    let all: BTreeSet<String> = from_a.iter().chain(&from_b).cloned().collect();
    assert_eq!(all.len(), 24);
    assert_eq!(list_volume_ids(&sockets[0]).await, all);
    assert_eq!(list_volume_ids(&sockets[1]).await, all);
    for id in &all {
        assert!(state.join("volumes").join(id).is_dir(), "{id} has its data");
    }
    // A retry through the other process finds the same volume.
    assert_eq!(create(&mut b, "pvc-a-0", false).await, from_a[0]);

    // Deleted through b, gone for a.
    b.delete_volume(csi::DeleteVolumeRequest {
        volume_id: from_a[0].clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    assert!(!list_volume_ids(&sockets[0]).await.contains(&from_a[0]));
    assert!(!state.join("volumes").join(&from_a[0]).exists());
    assert_eq!(driver::load_state(&state).unwrap().volumes.len(), 23);

    drop((a, b));
    for process in processes {
        assert!(process.terminate().success());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_serves_its_socket_with_socket_mode_and_cleans_up() {
    let dir = tempfile::tempdir().unwrap();
    let csi_socket = dir.path().join("plugins/csi.sock");
    let process = Process::start(&[
        "--endpoint".as_ref(),
        csi_socket.as_os_str(),
        "--state-dir".as_ref(),
        dir.path().join("state").as_os_str(),
        "--socket-mode=0660".as_ref(),
    ]);
    let csi_meta = std::fs::symlink_metadata(&csi_socket).unwrap();
    assert!(csi_meta.file_type().is_socket());
    assert_eq!(csi_meta.permissions().mode() & 0o777, 0o660);

    let mut node = NodeClient::new(channel(&csi_socket).await);
    let info = node
        .node_get_info(csi::NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.node_id, driver::DEFAULT_NODE_ID);
    drop(node);

    assert!(process.terminate().success());
    assert!(!csi_socket.exists(), "CSI socket removed on SIGTERM");
}

/// Unpublish and unstage touch only what the named volume has there: NodeUnpublish(A, B's
/// target) and NodeUnstage(A, B's staging) answer OK and leave B's mounts to its pod; a mount
/// that shows A's data is A's even without a record. A publish from a staging path whose mount
/// is gone binds the data there again, so the pod never gets the bare directory. Relative paths
/// are INVALID_ARGUMENT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_calls_leave_other_volumes_mounts_alone() {
    let Plugin {
        dir,
        mut guard,
        running,
        mut controller,
        mut node,
    } = plugin().await;

    let a = create(&mut controller, "pvc-a", false).await;
    let b = create(&mut controller, "pvc-b", false).await;
    let data_a = dir.path().join("state/volumes").join(&a);
    let staging_a = guard.watch(&dir.path().join("plugins/a/globalmount"));
    let staging_b = guard.watch(&dir.path().join("plugins/b/globalmount"));
    let target_a = guard.watch(&dir.path().join("pods/a/volumes/mount"));
    let target_b = guard.watch(&dir.path().join("pods/b/volumes/mount"));
    for (id, staging, target) in [(&a, &staging_a, &target_a), (&b, &staging_b, &target_b)] {
        node.node_stage_volume(stage_req(id, staging, false))
            .await
            .expect("NodeStageVolume");
        node.node_publish_volume(publish_req(id, staging, target, false, false))
            .await
            .expect("NodePublishVolume");
    }
    std::fs::write(Path::new(&target_b).join("b.txt"), b"pod b").unwrap();

    node.node_unpublish_volume(unpublish_req(&a, &target_b))
        .await
        .expect("NodeUnpublish of a target the volume is not published at is OK");
    assert!(mounted(&target_b), "B's target is still mounted");
    assert_eq!(
        std::fs::read(Path::new(&target_b).join("b.txt")).unwrap(),
        b"pod b"
    );
    node.node_unstage_volume(unstage_req(&a, &staging_b))
        .await
        .expect("NodeUnstage of a path the volume is not staged at is OK");
    assert!(mounted(&staging_b), "B's staging is still mounted");
    assert!(mounted(&staging_a), "A's own staging is untouched too");

    // A mount of A's data nobody recorded is still A's to undo.
    let stray = guard.watch(&dir.path().join("pods/stray"));
    std::fs::create_dir_all(&stray).unwrap();
    mounts::bind(&data_a, Path::new(&stray)).unwrap();
    node.node_unpublish_volume(unpublish_req(&a, &stray))
        .await
        .expect("NodeUnpublish of a mount of A's data");
    assert!(!mounted(&stray) && !Path::new(&stray).exists());

    // The stage mount vanishes behind the driver's back: a new publish binds it again.
    node.node_unpublish_volume(unpublish_req(&a, &target_a))
        .await
        .unwrap();
    mounts::unmount_all(Path::new(&staging_a)).unwrap();
    assert!(!mounted(&staging_a));
    let target_a2 = guard.watch(&dir.path().join("pods/a2/volumes/mount"));
    node.node_publish_volume(publish_req(&a, &staging_a, &target_a2, false, false))
        .await
        .expect("NodePublishVolume with the stage mount gone");
    assert!(mounted(&staging_a), "the stage mount is back");
    std::fs::write(data_a.join("a.txt"), b"volume a").unwrap();
    assert_eq!(
        std::fs::read(Path::new(&target_a2).join("a.txt")).unwrap(),
        b"volume a",
        "the pod sees the volume's data, not the empty staging directory"
    );

    // Something else mounted on the recorded staging path: refused.
    node.node_unpublish_volume(unpublish_req(&a, &target_a2))
        .await
        .unwrap();
    mounts::unmount_all(Path::new(&staging_a)).unwrap();
    let other = dir.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    mounts::bind(&other, Path::new(&staging_a)).unwrap();
    let status = node
        .node_publish_volume(publish_req(&a, &staging_a, &target_a2, false, false))
        .await
        .expect_err("a staging path showing something else");
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert!(!mounted(&target_a2));
    mounts::unmount_all(Path::new(&staging_a)).unwrap();

    // Relative paths.
    let status = node
        .node_stage_volume(stage_req(&a, "relative/staging", false))
        .await
        .expect_err("relative staging path");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    let status = node
        .node_publish_volume(publish_req(&a, &staging_a, "pods/target", false, false))
        .await
        .expect_err("relative target path");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");

    // B still has everything; clean up.
    assert!(mounted(&target_b) && mounted(&staging_b));
    node.node_unpublish_volume(unpublish_req(&b, &target_b))
        .await
        .unwrap();
    node.node_unstage_volume(unstage_req(&b, &staging_b))
        .await
        .unwrap();
    node.node_unstage_volume(unstage_req(&a, &staging_a))
        .await
        .unwrap();
    assert!(!mounted(&target_b) && !mounted(&staging_b) && !mounted(&staging_a));
    for id in [&a, &b] {
        controller
            .delete_volume(csi::DeleteVolumeRequest {
                volume_id: id.clone(),
                secrets: Default::default(),
            })
            .await
            .expect("DeleteVolume");
    }
    drop(guard);
    let _ = running.stop.send(());
    running.task.await.unwrap().unwrap();
}
