//! The reference CSI driver end to end: started in-process on a temp socket (and once as the real
//! binary), spoken to by the generated tonic clients over the unix socket.

// The CSI client helpers of the provisioner's integration tests, shared rather than copied.
#[path = "../../test-support/src/csi_wire.rs"]
mod csi_wire;

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use csi_reference_driver::{self as driver, DriverConfig};
use csi_spec as csi;
use csi_spec::controller_client::ControllerClient;
use csi_spec::identity_client::IdentityClient;
use csi_spec::node_client::NodeClient;
use csi_spec::volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode};
use csi_wire::{channel, list_volume_ids};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::Code;
use tonic::transport::Channel;

const GI: i64 = 1 << 30;

struct Running {
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), driver::DriverError>>,
}

impl Running {
    async fn stop(self) {
        let _ = self.stop.send(());
        self.task
            .await
            .expect("driver task")
            .expect("driver stops cleanly");
    }
}

fn config(dir: &Path) -> DriverConfig {
    DriverConfig::new(dir.join("csi.sock"), dir.join("state"))
}

fn start(config: &DriverConfig) -> Running {
    let bound = driver::bind(config).expect("driver binds");
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(bound.serve(async {
        let _ = stopped.await;
    }));
    Running { stop, task }
}

fn mount_cap() -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume::default())),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    }
}

fn create_req(name: &str, required: i64, limit: i64) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: required,
            limit_bytes: limit,
        }),
        volume_capabilities: vec![mount_cap()],
        secrets: [("password".to_string(), "hunter2".to_string())].into(),
        ..Default::default()
    }
}

async fn create(
    client: &mut ControllerClient<Channel>,
    name: &str,
    size: i64,
) -> Result<csi::Volume, tonic::Status> {
    let reply = client.create_volume(create_req(name, size, 0)).await?;
    Ok(reply.into_inner().volume.expect("volume in reply"))
}

/// Replaces the control file the way the docs ask: write aside, then rename into place.
fn write_control_file(config: &DriverConfig, text: &str) {
    let tmp = config.control_file.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write control file");
    std::fs::rename(&tmp, &config.control_file).expect("install control file");
}

#[tokio::test]
async fn serves_idempotent_volumes_on_a_private_socket() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let running = start(&config);

    let meta = std::fs::symlink_metadata(&config.endpoint).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(
        meta.permissions().mode() & 0o777,
        0o600,
        "socket must be owner-only"
    );

    let channel = channel(&config.endpoint).await;
    let mut identity = IdentityClient::new(channel.clone());
    let info = identity
        .get_plugin_info(csi::GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, driver::DEFAULT_DRIVER_NAME);

    let mut controller = ControllerClient::new(channel.clone());
    let first = create(&mut controller, "pvc-a", GI).await.unwrap();
    let again = create(&mut controller, "pvc-a", GI).await.unwrap();
    assert_eq!(
        first.volume_id, again.volume_id,
        "same name and arguments: same volume"
    );
    assert_eq!(first.capacity_bytes, GI);

    let conflict = controller
        .create_volume(create_req("pvc-a", 2 * GI, 2 * GI))
        .await
        .expect_err("a bigger volume under the same name must be refused");
    assert_eq!(conflict.code(), Code::AlreadyExists, "{conflict:?}");

    let too_big = create(&mut controller, "pvc-huge", 2 << 40)
        .await
        .unwrap_err();
    assert_eq!(too_big.code(), Code::OutOfRange, "{too_big:?}");

    controller
        .delete_volume(csi::DeleteVolumeRequest {
            volume_id: "fake-vol-id".into(),
            ..Default::default()
        })
        .await
        .expect("deleting an unknown volume is OK");
    let missing = controller
        .validate_volume_capabilities(csi::ValidateVolumeCapabilitiesRequest {
            volume_id: "fake-vol-id-0123456789".into(),
            volume_capabilities: vec![mount_cap()],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
    assert_eq!(
        list_volume_ids(&config.endpoint).await,
        BTreeSet::from([first.volume_id.clone()])
    );

    let unimplemented = controller
        .controller_publish_volume(csi::ControllerPublishVolumeRequest::default())
        .await
        .unwrap_err();
    assert_eq!(unimplemented.code(), Code::Unimplemented);

    // Node publish creates the target path, unpublish removes it.
    let target = dir.path().join("target");
    let mut node = NodeClient::new(channel);
    node.node_publish_volume(csi::NodePublishVolumeRequest {
        volume_id: first.volume_id.clone(),
        target_path: target.display().to_string(),
        volume_capability: Some(mount_cap()),
        ..Default::default()
    })
    .await
    .unwrap();
    assert!(target.is_dir());
    let in_use = controller
        .delete_volume(csi::DeleteVolumeRequest {
            volume_id: first.volume_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(in_use.code(), Code::FailedPrecondition);
    node.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
        volume_id: first.volume_id.clone(),
        target_path: target.display().to_string(),
    })
    .await
    .unwrap();
    assert!(!target.exists());

    running.stop().await;
    assert!(!config.endpoint.exists(), "socket removed at shutdown");
}

#[tokio::test]
async fn a_pending_operation_makes_the_same_name_aborted_but_not_other_volumes() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let running = start(&config);
    let mut controller = ControllerClient::new(channel(&config.endpoint).await);
    let other = create(&mut controller, "pvc-other", GI).await.unwrap();

    write_control_file(&config, "delay CreateVolume=1500ms\n");
    let mut slow_client = controller.clone();
    let slow = tokio::spawn(async move { create(&mut slow_client, "pvc-slow", GI).await });
    tokio::time::sleep(Duration::from_millis(300)).await;

    let started = Instant::now();
    let aborted = create(&mut controller, "pvc-slow", GI).await.unwrap_err();
    assert_eq!(aborted.code(), Code::Aborted, "{aborted:?}");
    // A different volume is not held up by the pending call or its delay.
    controller
        .delete_volume(csi::DeleteVolumeRequest {
            volume_id: other.volume_id,
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(700),
        "took {:?}",
        started.elapsed()
    );

    let created = slow
        .await
        .unwrap()
        .expect("the pending call still succeeds");
    std::fs::remove_file(&config.control_file).unwrap();
    let retried = create(&mut controller, "pvc-slow", GI).await.unwrap();
    assert_eq!(created.volume_id, retried.volume_id);
    running.stop().await;
}

#[tokio::test]
async fn injected_deadline_exceeded_after_create_leaves_the_volume() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path());
    config
        .faults
        .faults
        .push("CreateVolume=after:deadline-exceeded:1".parse().unwrap());
    config
        .faults
        .faults
        .push("Probe=before:unavailable:2".parse().unwrap());
    let running = start(&config);
    let channel = channel(&config.endpoint).await;
    let mut controller = ControllerClient::new(channel.clone());

    let timed_out = create(&mut controller, "pvc-dl", GI).await.unwrap_err();
    assert_eq!(timed_out.code(), Code::DeadlineExceeded, "{timed_out:?}");
    let saved = driver::load_state(&config.state_dir).unwrap();
    let names: Vec<_> = saved.volumes.values().map(|v| v.name.as_str()).collect();
    assert_eq!(
        names,
        vec!["pvc-dl"],
        "the volume was created and persisted before the error"
    );

    let retried = create(&mut controller, "pvc-dl", GI)
        .await
        .expect("the fault fired once");
    assert_eq!(
        list_volume_ids(&config.endpoint).await,
        BTreeSet::from([retried.volume_id])
    );

    let mut identity = IdentityClient::new(channel);
    for _ in 0..2 {
        let err = identity.probe(csi::ProbeRequest {}).await.unwrap_err();
        assert_eq!(err.code(), Code::Unavailable);
    }
    identity
        .probe(csi::ProbeRequest {})
        .await
        .expect("third probe passes");
    running.stop().await;
}

#[tokio::test]
async fn a_hanging_call_ends_when_the_caller_gives_up() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let running = start(&config);
    let mut controller = ControllerClient::new(channel(&config.endpoint).await);
    let volume = create(&mut controller, "pvc-hang", GI).await.unwrap();

    write_control_file(&config, "# hang once\nfault DeleteVolume=after:hang:1\n");
    let mut request = tonic::Request::new(csi::DeleteVolumeRequest {
        volume_id: volume.volume_id.clone(),
        ..Default::default()
    });
    request.set_timeout(Duration::from_millis(300));
    let hung = controller.delete_volume(request).await.unwrap_err();
    assert!(
        matches!(hung.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{hung:?}"
    );
    assert!(
        list_volume_ids(&config.endpoint).await.is_empty(),
        "the delete itself happened"
    );

    // A retry is answered at once, and deleting a deleted volume is OK.
    controller
        .delete_volume(csi::DeleteVolumeRequest {
            volume_id: volume.volume_id,
            ..Default::default()
        })
        .await
        .unwrap();
    running.stop().await;
}

#[tokio::test]
async fn state_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let running = start(&config);
    let mut controller = ControllerClient::new(channel(&config.endpoint).await);
    let a = create(&mut controller, "pvc-1", GI).await.unwrap();
    let b = create(&mut controller, "pvc-2", 2 * GI).await.unwrap();
    let snapshot = controller
        .create_snapshot(csi::CreateSnapshotRequest {
            source_volume_id: a.volume_id.clone(),
            name: "snap-1".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    let mut restore = create_req("pvc-3", 0, 0);
    restore.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Snapshot(
            csi::volume_content_source::SnapshotSource {
                snapshot_id: snapshot.snapshot_id.clone(),
            },
        )),
    });
    let restored = controller
        .create_volume(restore)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(restored.capacity_bytes, GI);
    assert!(restored.content_source.is_some());
    running.stop().await;

    let running = start(&config);
    let mut controller = ControllerClient::new(channel(&config.endpoint).await);
    assert_eq!(
        list_volume_ids(&config.endpoint).await,
        BTreeSet::from([a.volume_id.clone(), b.volume_id.clone(), restored.volume_id])
    );
    assert_eq!(
        create(&mut controller, "pvc-2", 2 * GI)
            .await
            .unwrap()
            .volume_id,
        b.volume_id
    );
    let snapshots = controller
        .list_snapshots(csi::ListSnapshotsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .entries;
    assert_eq!(snapshots.len(), 1);
    let capacity = controller
        .get_capacity(csi::GetCapacityRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(capacity.available_capacity, (1 << 40) - 4 * GI);
    running.stop().await;
}

#[tokio::test]
async fn refuses_to_replace_something_that_is_not_a_socket() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path());
    config.endpoint = dir.path().join("precious.txt");
    std::fs::write(&config.endpoint, "keep me").unwrap();
    let err = driver::bind(&config).err().expect("must refuse");
    assert!(err.to_string().contains("not a socket"), "{err}");
    assert_eq!(
        std::fs::read_to_string(&config.endpoint).unwrap(),
        "keep me"
    );
}

#[test]
fn the_binary_rejects_bad_flags_and_cleans_up_on_sigterm() {
    let bin = env!("CARGO_BIN_EXE_csi-reference-driver");
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(bin)
        .args([
            "--endpoint",
            "/tmp/x.sock",
            "--fault",
            "CreateVolume=later:internal",
        ])
        .env_remove("CSI_ENDPOINT")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--fault"), "{stderr}");

    let regular = dir.path().join("file");
    std::fs::write(&regular, "x").unwrap();
    let out = std::process::Command::new(bin)
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .env("CSI_ENDPOINT", format!("unix://{}", regular.display()))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a socket"));

    let socket = dir.path().join("csi.sock");
    let mut child = std::process::Command::new(bin)
        .arg("--endpoint")
        .arg(&socket)
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        assert!(Instant::now() < deadline, "socket never appeared");
        std::thread::sleep(Duration::from_millis(20));
    }
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    assert!(!socket.exists(), "socket removed on SIGTERM");
}

fn zone(z: &str) -> csi_reference_driver::Labels {
    [("zone".to_string(), z.to_string())].into()
}

fn csi_zone(z: &str) -> csi::Topology {
    csi::Topology {
        segments: [("zone".to_string(), z.to_string())].into(),
    }
}

async fn capacity_in(client: &mut ControllerClient<Channel>, z: Option<&str>) -> i64 {
    client
        .get_capacity(csi::GetCapacityRequest {
            accessible_topology: z.map(csi_zone),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .available_capacity
}

#[tokio::test]
async fn segments_fill_up_independently_and_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path());
    config.limits.segments = vec![
        driver::Segment {
            labels: zone("a"),
            capacity_bytes: 2 * GI,
        },
        driver::Segment {
            labels: zone("b"),
            capacity_bytes: 4 * GI,
        },
    ];
    config.node_topology = zone("b");
    let running = start(&config);
    let conn = channel(&config.endpoint).await;

    let capabilities = IdentityClient::new(conn.clone())
        .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities;
    let topology_capability = csi::PluginCapability {
        r#type: Some(csi::plugin_capability::Type::Service(
            csi::plugin_capability::Service {
                r#type: csi::plugin_capability::service::Type::VolumeAccessibilityConstraints
                    as i32,
            },
        )),
    };
    assert!(
        capabilities.contains(&topology_capability),
        "{capabilities:?}"
    );
    let info = NodeClient::new(conn.clone())
        .node_get_info(csi::NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.accessible_topology, Some(csi_zone("b")));

    let mut controller = ControllerClient::new(conn);
    let in_zone = |name: &str, size: i64, requisite: &[&str], preferred: &[&str]| {
        let mut req = create_req(name, size, 0);
        req.accessibility_requirements = Some(csi::TopologyRequirement {
            requisite: requisite.iter().map(|z| csi_zone(z)).collect(),
            preferred: preferred.iter().map(|z| csi_zone(z)).collect(),
        });
        req
    };
    let placed = |reply: Result<tonic::Response<csi::CreateVolumeResponse>, tonic::Status>| {
        reply
            .expect("CreateVolume")
            .into_inner()
            .volume
            .expect("volume")
            .accessible_topology
    };
    assert_eq!(
        placed(
            controller
                .create_volume(in_zone("v1", 2 * GI, &[], &[]))
                .await
        ),
        vec![csi_zone("a")]
    );
    assert_eq!(
        placed(
            controller
                .create_volume(in_zone("v2", GI, &["a", "b"], &["a"]))
                .await
        ),
        vec![csi_zone("b")],
        "a is full: the next allowed segment"
    );
    let full = controller
        .create_volume(in_zone("v3", GI, &["a"], &[]))
        .await
        .unwrap_err();
    assert_eq!(full.code(), Code::ResourceExhausted, "{full:?}");
    let unserved = controller
        .create_volume(in_zone("v3", GI, &["x"], &[]))
        .await
        .unwrap_err();
    assert_eq!(unserved.code(), Code::ResourceExhausted, "{unserved:?}");
    assert_eq!(capacity_in(&mut controller, Some("a")).await, 0);
    assert_eq!(capacity_in(&mut controller, Some("b")).await, 3 * GI);
    assert_eq!(capacity_in(&mut controller, None).await, 3 * GI);
    running.stop().await;

    let running = start(&config);
    let mut controller = ControllerClient::new(channel(&config.endpoint).await);
    assert_eq!(
        placed(
            controller
                .create_volume(in_zone("v1", 2 * GI, &["a"], &[]))
                .await
        ),
        vec![csi_zone("a")],
        "a retry returns the stored segment although a is full"
    );
    let moved = controller
        .create_volume(in_zone("v1", 2 * GI, &["b"], &[]))
        .await
        .unwrap_err();
    assert_eq!(moved.code(), Code::AlreadyExists, "{moved:?}");
    assert_eq!(capacity_in(&mut controller, Some("b")).await, 3 * GI);
    running.stop().await;
}

fn snapshot_source(id: &str) -> Option<csi::VolumeContentSource> {
    Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Snapshot(
            csi::volume_content_source::SnapshotSource {
                snapshot_id: id.into(),
            },
        )),
    })
}

fn volume_source(id: &str) -> Option<csi::VolumeContentSource> {
    Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Volume(
            csi::volume_content_source::VolumeSource {
                volume_id: id.into(),
            },
        )),
    })
}

fn sourced_req(
    name: &str,
    required: i64,
    source: Option<csi::VolumeContentSource>,
) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        volume_content_source: source,
        ..create_req(name, required, 0)
    }
}

fn snapshot_req(name: &str, source_volume_id: &str) -> csi::CreateSnapshotRequest {
    csi::CreateSnapshotRequest {
        source_volume_id: source_volume_id.into(),
        name: name.into(),
        secrets: [("token".to_string(), "hunter2".to_string())].into(),
        ..Default::default()
    }
}

async fn get_snapshot(
    client: &mut ControllerClient<Channel>,
    id: &str,
) -> Result<csi::Snapshot, tonic::Status> {
    let reply = client
        .get_snapshot(csi::GetSnapshotRequest {
            snapshot_id: id.into(),
            ..Default::default()
        })
        .await?;
    Ok(reply.into_inner().snapshot.expect("snapshot in reply"))
}

async fn controller_rpcs(client: &mut ControllerClient<Channel>) -> BTreeSet<i32> {
    use csi::controller_service_capability::Type;
    client
        .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner()
        .capabilities
        .into_iter()
        .filter_map(|c| c.r#type.map(|Type::Rpc(rpc)| rpc.r#type))
        .collect()
}

#[tokio::test]
async fn snapshots_restores_and_clones_are_durable_and_take_faults() {
    use csi::controller_service_capability::rpc::Type as Rpc;
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path());
    let request_log = dir.path().join("requests.jsonl");
    config.request_log = Some(request_log.clone());
    for rule in [
        "CreateSnapshot=after:deadline-exceeded:1",
        "CreateVolume/snapshot=after:deadline-exceeded:1",
        "CreateVolume/volume=before:unavailable:1",
    ] {
        config.faults.faults.push(rule.parse().unwrap());
    }
    let running = start(&config);
    let mut controller = ControllerClient::new(channel(&config.endpoint).await);
    let rpcs = controller_rpcs(&mut controller).await;
    for rpc in [
        Rpc::CreateDeleteSnapshot,
        Rpc::ListSnapshots,
        Rpc::GetSnapshot,
        Rpc::CloneVolume,
    ] {
        assert!(rpcs.contains(&(rpc as i32)), "{rpc:?} in {rpcs:?}");
    }
    let source = create(&mut controller, "pvc-src", 2 * GI).await.unwrap();

    // The snapshot is taken, then the reply is lost; the retry finds it.
    let lost = controller
        .create_snapshot(snapshot_req("snap-a", &source.volume_id))
        .await
        .unwrap_err();
    assert_eq!(lost.code(), Code::DeadlineExceeded, "{lost:?}");
    let snapshot = controller
        .create_snapshot(snapshot_req("snap-a", &source.volume_id))
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert_eq!(snapshot.size_bytes, 2 * GI);
    assert_eq!(snapshot.source_volume_id, source.volume_id);
    assert!(snapshot.ready_to_use);
    assert!(snapshot.creation_time.is_some_and(|t| t.seconds > 0));
    assert_eq!(
        get_snapshot(&mut controller, &snapshot.snapshot_id)
            .await
            .unwrap(),
        snapshot.clone()
    );
    let unknown = get_snapshot(&mut controller, "none-exist-id")
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
    let other = create(&mut controller, "pvc-other", GI).await.unwrap();
    let reused = controller
        .create_snapshot(snapshot_req("snap-a", &other.volume_id))
        .await
        .unwrap_err();
    assert_eq!(reused.code(), Code::AlreadyExists);

    // A restore: created, then the reply is lost; the retry returns the same volume.
    let lost = controller
        .create_volume(sourced_req(
            "pvc-restore",
            2 * GI,
            snapshot_source(&snapshot.snapshot_id),
        ))
        .await
        .unwrap_err();
    assert_eq!(lost.code(), Code::DeadlineExceeded, "{lost:?}");
    let restore = controller
        .create_volume(sourced_req(
            "pvc-restore",
            2 * GI,
            snapshot_source(&snapshot.snapshot_id),
        ))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(
        restore.content_source,
        snapshot_source(&snapshot.snapshot_id)
    );
    let smaller = controller
        .create_volume(sourced_req(
            "pvc-small",
            GI,
            snapshot_source(&snapshot.snapshot_id),
        ))
        .await
        .unwrap_err();
    assert_eq!(smaller.code(), Code::OutOfRange);

    // A clone: refused once before anything happens, then made.
    let refused = controller
        .create_volume(sourced_req(
            "pvc-clone",
            0,
            volume_source(&source.volume_id),
        ))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable);
    let clone = controller
        .create_volume(sourced_req(
            "pvc-clone",
            0,
            volume_source(&source.volume_id),
        ))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(clone.capacity_bytes, 2 * GI);
    assert_eq!(clone.content_source, volume_source(&source.volume_id));

    // The source goes; its snapshot stays.
    controller
        .delete_volume(csi::DeleteVolumeRequest {
            volume_id: source.volume_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    running.stop().await;

    let saved = driver::load_state(&config.state_dir).unwrap();
    let sources: BTreeMap<&str, Option<driver::ContentSource>> = saved
        .volumes
        .values()
        .map(|v| (v.name.as_str(), v.source.clone()))
        .collect();
    assert_eq!(
        sources,
        BTreeMap::from([
            ("pvc-other", None),
            (
                "pvc-restore",
                Some(driver::ContentSource::Snapshot(
                    snapshot.snapshot_id.clone()
                ))
            ),
            (
                "pvc-clone",
                Some(driver::ContentSource::Volume(source.volume_id.clone()))
            ),
        ]),
        "the durable records name their sources"
    );

    let running = start(&config);
    let mut controller = ControllerClient::new(channel(&config.endpoint).await);
    assert_eq!(
        get_snapshot(&mut controller, &snapshot.snapshot_id)
            .await
            .unwrap(),
        snapshot.clone(),
        "the snapshot survives its source and a restart"
    );
    controller
        .delete_snapshot(csi::DeleteSnapshotRequest {
            snapshot_id: snapshot.snapshot_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    let gone = get_snapshot(&mut controller, &snapshot.snapshot_id)
        .await
        .unwrap_err();
    assert_eq!(gone.code(), Code::NotFound);
    running.stop().await;

    let text = std::fs::read_to_string(&request_log).unwrap();
    assert!(
        !text.contains("hunter2"),
        "secret values never reach the log"
    );
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let methods: Vec<&str> = lines.iter().filter_map(|l| l["method"].as_str()).collect();
    assert_eq!(
        methods.iter().filter(|m| **m == "CreateSnapshot").count(),
        3
    );
    assert_eq!(methods.last(), Some(&"DeleteSnapshot"));
    let restores: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|l| l["name"] == "pvc-restore")
        .collect();
    assert_eq!(restores.len(), 2);
    assert_eq!(
        restores[0]["volume_content_source"],
        serde_json::json!({"snapshot": {"snapshot_id": snapshot.snapshot_id}})
    );
}

#[tokio::test]
async fn without_snapshots_and_clones_their_rpcs_and_sources_are_refused() {
    use csi::controller_service_capability::rpc::Type as Rpc;
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path());
    config.features = driver::Features {
        snapshots: false,
        clone: false,
        get_capacity: true,
        modify_volume: false,
    };
    let running = start(&config);
    let mut controller = ControllerClient::new(channel(&config.endpoint).await);
    assert_eq!(
        controller_rpcs(&mut controller).await,
        BTreeSet::from([
            Rpc::CreateDeleteVolume as i32,
            Rpc::ListVolumes as i32,
            Rpc::GetCapacity as i32
        ])
    );
    let volume = create(&mut controller, "pvc-1", GI).await.unwrap();
    let snapshot = controller
        .create_snapshot(snapshot_req("snap-1", &volume.volume_id))
        .await
        .unwrap_err();
    assert_eq!(snapshot.code(), Code::Unimplemented);
    let delete = controller
        .delete_snapshot(csi::DeleteSnapshotRequest {
            snapshot_id: "snap-1".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(delete.code(), Code::Unimplemented);
    let list = controller
        .list_snapshots(csi::ListSnapshotsRequest::default())
        .await
        .unwrap_err();
    assert_eq!(list.code(), Code::Unimplemented);
    let get = get_snapshot(&mut controller, "snap-1").await.unwrap_err();
    assert_eq!(get.code(), Code::Unimplemented);
    for source in [snapshot_source("snap-1"), volume_source(&volume.volume_id)] {
        let refused = controller
            .create_volume(sourced_req("pvc-2", GI, source))
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    }
    assert_eq!(
        driver::load_state(&config.state_dir).unwrap().volumes.len(),
        1
    );
    running.stop().await;
}
