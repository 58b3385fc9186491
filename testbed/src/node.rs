//! A real node beside the control plane (`StartOptions::node`, `testbed up --node`): containerd
//! 2.x with Debian's runc and a CNI bridge, and a kubelet registered as [`NODE_NAME`], so pods
//! run as on a production node. docs/control-plane.md ("A real node") says what differs.
//!
//! The node is machine-wide, as a kubelet is: it uses `/var/lib/kubelet` (deploy/'s DaemonSet
//! names that path), a bridge, an address on loopback and the kubelet's ports. So one node runs
//! per machine at a time ([`Host::prepare`] takes a lock), and every start first removes what a
//! killed earlier run left behind (containers, mounts, directories, the bridge).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node as NodeObject;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::Run;
use crate::args::Layout;
use crate::binaries::Binaries;
use crate::error::{Component, Error};
use crate::process::{self, Supervisor};
use crate::readiness::Probe;

pub use crate::node_identity::{APISERVER_PORT, NODE_NAME, SERVICE_IP};
/// The kubelet's root directory: the path deploy/'s node DaemonSet mounts.
pub const KUBELET_ROOT: &str = "/var/lib/kubelet";
/// containerd's root (images, snapshots), wiped at every start.
const STATE_ROOT: &str = "/var/lib/csi-testbed-node";
/// Sockets, containerd's state, the CNI configuration and IPAM leases, the kubelet's
/// configuration. Every node process has this path on its command line, which is how a later
/// start finds what a killed run left.
const RUN_ROOT: &str = "/run/csi-testbed-node";
/// Outside [`RUN_ROOT`], which start-up wipes while holding it.
const LOCK_FILE: &str = "/run/csi-testbed-node.lock";
/// How long a start waits for another run's node (a test binary before it) to end.
const LOCK_WAIT: Duration = Duration::from_secs(30 * 60);
/// A file in [`KUBELET_ROOT`] saying the testbed made it: a `/var/lib/kubelet` without it
/// belongs to a real kubelet, and the testbed refuses to touch it.
const MARKER: &str = ".csi-testbed-node";
/// The label of [`SERVICE_IP`] on `lo`, so a later start removes it after a killed run.
const ADDRESS_LABEL: &str = "lo:csitb";
/// The kubelet's `cgroupRoot`: every pod's cgroup is under it, so a cleanup kills only the
/// testbed's pods.
const CGROUP_ROOT: &str = "csi-testbed-node";
/// A runtime call that takes longer is stuck (containerd wedged): the start fails, a teardown
/// goes on without it.
const CTR_TIMEOUT: Duration = Duration::from_secs(120);
const BRIDGE: &str = "csitb0";
const NEEDS_ROOT: &str = "a node needs root (mounts, cgroups, network namespaces); run as root";
const POD_SUBNET: &str = "10.88.0.0/16";
const KUBELET_HEALTHZ_PORT: u16 = 10248;
const CNI_BIN_DIR: &str = "/usr/lib/cni";
/// What `hack/build-node.sh` builds.
const NODE_BINARIES: [&str; 4] = ["kubelet", "containerd", "containerd-shim-runc-v2", "ctr"];

const CONTAINERD_READY_TIMEOUT: Duration = Duration::from_secs(30);
const KUBELET_READY_TIMEOUT: Duration = Duration::from_secs(60);
/// From the kubelet's first answer to a Ready Node without the `not-ready` taint: the node
/// lifecycle controller lifts it within its 5 s monitor period.
const NODE_READY_TIMEOUT: Duration = Duration::from_secs(120);
const POLL: Duration = Duration::from_millis(250);
const LEFTOVER_KILL_ROUNDS: u32 = 40;

/// The machine's side of the node: the lock, the loopback address, the kubelet's shared root.
/// Taken before the apiserver starts (it listens on [`SERVICE_IP`]); dropping it removes all
/// of that again, also after a failure half-way through [`Host::prepare`].
pub struct Host {
    binaries: Binaries,
    runc: PathBuf,
    _lock: File,
}

impl Host {
    /// Builds (or finds) the node's binaries and installs the runtime pieces Debian ships
    /// (`hack/build-node.sh`), then checks what a node needs, takes the machine's node lock
    /// (waiting a bounded time for another run's node to end), removes a killed run's leftovers
    /// and prepares the host. Installing comes before checking: on a fresh machine the check
    /// would otherwise report as missing what the build script installs.
    pub fn prepare() -> Result<Self, Error> {
        if !nix::unistd::geteuid().is_root() {
            return Err(Error::NodeUnavailable(NEEDS_ROOT.to_owned()));
        }
        let binaries = locate_binaries()?;
        check_prerequisites()?;
        let runc = find_in_path("runc").ok_or_else(|| {
            Error::NodeUnavailable("runc is not installed (apt-get install runc)".to_owned())
        })?;
        let lock = take_lock()?;
        // Before `Host` exists: its `Drop` cleans up, which on a real node would do the damage
        // this check is here to prevent.
        refuse_a_foreign_kubelet()?;
        let host = Host {
            binaries,
            runc,
            _lock: lock,
        };
        clean_slate();
        make_cgroup_roots()?;
        for dir in [KUBELET_ROOT, STATE_ROOT, RUN_ROOT] {
            std::fs::create_dir_all(dir).map_err(|source| Error::WriteFile {
                path: dir.into(),
                source,
            })?;
        }
        write(&Path::new(KUBELET_ROOT).join(MARKER), "csi-testbed\n")?;
        // Bidirectional mount propagation (the node plugin's mounts reaching the kubelet and
        // the pods) needs the kubelet's root to be a shared mount; `/` is private here.
        run_host("mount", &["--bind", KUBELET_ROOT, KUBELET_ROOT])?;
        run_host("mount", &["--make-rshared", KUBELET_ROOT])?;
        run_host(
            "ip",
            &[
                "addr",
                "add",
                &format!("{SERVICE_IP}/32"),
                "dev",
                "lo",
                "label",
                ADDRESS_LABEL,
            ],
        )?;
        Ok(host)
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        clean_slate();
    }
}

/// The running node: containerd and the kubelet. Dropping it stops the pods' containers, then
/// the kubelet and containerd, then cleans the host.
pub struct Node {
    supervisor: Supervisor,
    ctr: PathBuf,
    logs: Vec<(Component, PathBuf)>,
    // Last: the host is cleaned once every process is gone.
    _host: Host,
}

/// `hack/build-node.sh`'s output directory, checked.
fn locate_binaries() -> Result<Binaries, Error> {
    let dir = crate::workspace::run_build_script("build-node.sh")
        .map_err(|e| Error::NodeUnavailable(format!("building the node binaries: {e}")))?;
    for name in NODE_BINARIES {
        if !dir.join(name).is_file() {
            return Err(Error::NodeUnavailable(format!(
                "{} has no {name}",
                dir.display()
            )));
        }
    }
    Ok(Binaries::at(&dir))
}

/// What [`Node::start`] needs from the control plane.
pub struct NodeStart<'a> {
    pub host: Host,
    /// The run directory (logs, the kubelet's kubeconfig).
    pub layout: &'a Layout,
    pub apiserver_url: &'a str,
    pub pki: &'a crate::pki::PkiFiles,
    /// `docker-archive` tarballs imported into containerd before the kubelet starts (no
    /// registry is reachable: every image a pod uses, the pause image included).
    pub images: &'a [PathBuf],
    pub admin: kube::Client,
}

impl Node {
    pub async fn start(start: NodeStart<'_>) -> Result<Self, Error> {
        let NodeStart {
            host,
            layout,
            apiserver_url,
            pki,
            images,
            admin,
        } = start;
        let binaries = Binaries::at(host.binaries.dir());
        let runc = host.runc.clone();
        let cni_dir = Path::new(RUN_ROOT).join("cni");
        let kubelet_dir = Path::new(RUN_ROOT).join("kubelet");
        for dir in [&cni_dir, &kubelet_dir] {
            std::fs::create_dir_all(dir).map_err(|source| Error::WriteFile {
                path: dir.clone(),
                source,
            })?;
        }
        let containerd_config = Path::new(RUN_ROOT).join("containerd.toml");
        write(
            &containerd_config,
            &containerd_toml(&binaries.dir().join("containerd-shim-runc-v2"), &runc),
        )?;
        write(&cni_dir.join("10-csi-testbed.conflist"), &cni_conflist())?;
        let kubelet_config = kubelet_dir.join("config.yaml");
        write(
            &kubelet_config,
            &kubelet_yaml(&containerd_socket(), &pki.client_ca),
        )?;
        let kubelet_kubeconfig = layout.root.join("kubelet.kubeconfig");
        crate::pki::write_file(
            &kubelet_kubeconfig,
            &crate::kubeconfig::render_node(apiserver_url, pki),
        )?;

        // Its reaper must not remove the run directory: the control plane's does.
        let mut node = Node {
            supervisor: Supervisor::new(&layout.root, true)?,
            ctr: binaries.dir().join("ctr"),
            logs: [Component::Containerd, Component::Kubelet]
                .into_iter()
                .map(|c| (c, layout.log(c)))
                .collect(),
            _host: host,
        };
        let containerd_args = [format!("--config={}", containerd_config.display())];
        node.run(&binaries, layout)
            .launch(Component::Containerd, 0, CONTAINERD_READY_TIMEOUT, |_| {
                let probe = Probe::UnixSocket {
                    path: containerd_socket(),
                };
                std::future::ready(Ok((containerd_args.to_vec(), probe)))
            })
            .await?;
        for image in images {
            node.import(image).await?;
        }
        let kubelet_args = [
            format!("--config={}", kubelet_config.display()),
            format!("--kubeconfig={}", kubelet_kubeconfig.display()),
            format!("--hostname-override={NODE_NAME}"),
            format!("--node-ip={SERVICE_IP}"),
            format!("--root-dir={KUBELET_ROOT}"),
            format!("--cert-dir={}", kubelet_dir.join("pki").display()),
            // Logs each pod's and volume's steps: what a failing in-cluster test needs.
            "--v=2".to_owned(),
        ];
        node.run(&binaries, layout)
            .launch(Component::Kubelet, 0, KUBELET_READY_TIMEOUT, |_| {
                let probe = Probe::Http {
                    port: KUBELET_HEALTHZ_PORT,
                    path: "/healthz",
                };
                std::future::ready(Ok((kubelet_args.to_vec(), probe)))
            })
            .await?;
        node.wait_schedulable(&admin, &layout.log(Component::Kubelet))
            .await?;
        Ok(node)
    }

    /// Starts the node's components the way the control plane's are started and waited for.
    fn run<'a>(&'a mut self, binaries: &'a Binaries, layout: &'a Layout) -> Run<'a> {
        Run {
            supervisor: &mut self.supervisor,
            binaries,
            layout,
        }
    }

    /// Each node component's log (containerd, kubelet).
    pub fn log_paths(&self) -> &[(Component, PathBuf)] {
        &self.logs
    }

    /// containerd's socket (for `ctr --address`, e.g. to kill a container as the runtime would
    /// see it die).
    pub fn containerd_socket(&self) -> PathBuf {
        containerd_socket()
    }

    /// The `ctr` binary matching the node's containerd.
    pub fn ctr(&self) -> &Path {
        &self.ctr
    }

    async fn import(&mut self, archive: &Path) -> Result<(), Error> {
        let import = tokio::process::Command::new(&self.ctr)
            .arg(format!("--address={}", containerd_socket().display()))
            .args(["--namespace=k8s.io", "images", "import"])
            .arg(archive)
            .kill_on_drop(true)
            .output();
        let output = tokio::time::timeout(CTR_TIMEOUT, import)
            .await
            .map_err(|_| {
                Error::NodeUnavailable(format!(
                    "importing the image {} into containerd took over {CTR_TIMEOUT:?}",
                    archive.display()
                ))
            })?
            .map_err(|e| Error::NodeUnavailable(format!("running ctr: {e}")))?;
        if output.status.success() {
            Ok(())
        } else {
            Err(Error::NodeUnavailable(format!(
                "importing the image {} into containerd failed ({}): {}",
                archive.display(),
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            )))
        }
    }

    /// Until the Node reports Ready and carries no `not-ready`/`unreachable` taint: from then
    /// on a pod is scheduled onto it and started.
    async fn wait_schedulable(&mut self, admin: &kube::Client, log: &Path) -> Result<(), Error> {
        let nodes: kube::Api<NodeObject> = kube::Api::all(admin.clone());
        let started = Instant::now();
        loop {
            let state = match nodes.get_opt(NODE_NAME).await {
                Ok(Some(node)) => node_schedulable(&node),
                Ok(None) => Err("not registered yet".to_owned()),
                Err(e) => Err(e.to_string()),
            };
            match state {
                Ok(()) => {
                    eprintln!(
                        "[testbed] node {NODE_NAME} Ready and schedulable in {:.1}s",
                        started.elapsed().as_secs_f64()
                    );
                    return Ok(());
                }
                Err(last_error) if started.elapsed() > NODE_READY_TIMEOUT => {
                    return Err(Error::NotReady {
                        component: Component::Kubelet,
                        waited: started.elapsed(),
                        last_error: format!("Node {NODE_NAME}: {last_error}"),
                        log: log.to_owned(),
                        log_tail: process::log_tail(log, 30),
                    });
                }
                Err(_) => {}
            }
            if let Some(status) = self.supervisor.exit_status(Component::Kubelet) {
                return Err(Error::Exited {
                    component: Component::Kubelet,
                    status: status.to_string(),
                    log: log.to_owned(),
                    log_tail: process::log_tail(log, 30),
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Kills every container of the node through containerd (the pods' processes are not in
    /// the supervisor's process groups: the runtime's shims own them).
    fn kill_containers(&self) {
        let address = format!("--address={}", containerd_socket().display());
        let Some(listed) = output_within(Command::new(&self.ctr).args([
            address.as_str(),
            "--namespace=k8s.io",
            "tasks",
            "ls",
            "-q",
        ])) else {
            return;
        };
        for task in listed.split_whitespace() {
            output_within(Command::new(&self.ctr).args([
                address.as_str(),
                "--namespace=k8s.io",
                "tasks",
                "kill",
                "--signal=SIGKILL",
                task,
            ]));
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        eprintln!("[testbed] stopping the node ...");
        // The kubelet first, so it does not restart what is killed next.
        self.supervisor.stop(Component::Kubelet);
        self.kill_containers();
        self.supervisor.stop(Component::Containerd);
        // `_host` cleans up after the fields before it are dropped.
    }
}

/// A teardown's runtime call: its stdout, or `None` if it failed or took over [`CTR_TIMEOUT`]
/// (then it is killed; the host cleanup that follows kills the pods by their cgroups anyway).
fn output_within(command: &mut Command) -> Option<String> {
    let mut child = command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    let started = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => {
                let mut out = String::new();
                std::io::Read::read_to_string(child.stdout.as_mut()?, &mut out).ok()?;
                return Some(out);
            }
            Ok(Some(_)) | Err(_) => return None,
            Ok(None) if started.elapsed() > CTR_TIMEOUT => {
                let _ = child.kill();
                let _ = child.wait();
                eprintln!("[testbed] node: {command:?} took over {CTR_TIMEOUT:?}; killed");
                return None;
            }
            Ok(None) => std::thread::sleep(POLL),
        }
    }
}

/// Pure: whether a Node object is Ready and free of the taints that keep pods off it.
fn node_schedulable(node: &NodeObject) -> Result<(), String> {
    let status = node.status.as_ref().ok_or("no status yet")?;
    let ready = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Ready");
    match ready {
        Some(c) if c.status == "True" => {}
        Some(c) => {
            return Err(format!(
                "Ready is {} ({})",
                c.status,
                c.message.as_deref().unwrap_or("")
            ));
        }
        None => return Err("no Ready condition yet".to_owned()),
    }
    let blocking = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .find(|t| t.effect == "NoSchedule" || t.effect == "NoExecute");
    match blocking {
        Some(t) => Err(format!("tainted {}:{}", t.key, t.effect)),
        None => Ok(()),
    }
}

fn containerd_socket() -> PathBuf {
    Path::new(RUN_ROOT).join("containerd.sock")
}

/// Pure: containerd's configuration. The CRI plugin runs pods with runc on cgroupfs (the
/// kubelet's driver here), networks them with the CNI bridge, and keeps pod network namespaces
/// under its state directory, so a cleanup finds them.
fn containerd_toml(shim: &Path, runc: &Path) -> String {
    let socket = containerd_socket();
    format!(
        r#"version = 3
root = "{STATE_ROOT}/containerd"
state = "{RUN_ROOT}/containerd"

[grpc]
  address = "{socket}"

[plugins.'io.containerd.cri.v1.runtime']
  # Raising the sandbox's oom_score_adj to the runtime's own: this VM refuses to lower it
  # (root without CAP_SYS_RESOURCE over it), and runc fails the pod sandbox otherwise.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true

[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = ['{CNI_BIN_DIR}']
  conf_dir = '{RUN_ROOT}/cni'

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = 'io.containerd.runc.v2'
  runtime_path = '{shim}'

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  BinaryName = '{runc}'
  SystemdCgroup = false
"#,
        socket = socket.display(),
        shim = shim.display(),
        runc = runc.display(),
    )
}

/// Pure: the pod network, a bridge on the host with addresses from [`POD_SUBNET`]; the bridge
/// is the pods' gateway, so their traffic to [`SERVICE_IP`] ends on the host's loopback.
fn cni_conflist() -> String {
    let doc = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "csi-testbed",
        "plugins": [{
            "type": "bridge",
            "bridge": BRIDGE,
            "isGateway": true,
            "ipMasq": false,
            "hairpinMode": true,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": POD_SUBNET}]],
                "routes": [{"dst": "0.0.0.0/0"}],
                "dataDir": format!("{RUN_ROOT}/ipam"),
            },
        }],
    });
    format!("{doc:#}\n")
}

/// Pure: the kubelet's configuration.
fn kubelet_yaml(containerd_socket: &Path, client_ca: &Path) -> String {
    let doc = serde_json::json!({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        // The machines mount cgroup v1; kubelet 1.35+ refuses it unless told.
        "failCgroupV1": false,
        "failSwapOn": false,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": format!("/{CGROUP_ROOT}"),
        "containerRuntimeEndpoint": format!("unix://{}", containerd_socket.display()),
        "address": SERVICE_IP,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": KUBELET_HEALTHZ_PORT,
        // The apiserver calls the kubelet (logs, exec) as the admin, whose certificate the
        // client CA signed; the kubelet asks the apiserver whether the caller may.
        "authentication": {
            "anonymous": {"enabled": false},
            "webhook": {"enabled": true},
            "x509": {"clientCAFile": client_ca},
        },
        "authorization": {"mode": "Webhook"},
        // Images are imported, never pulled: they must never be garbage-collected.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        // A test machine's disk holds build trees far bigger than the pods' data: evict only
        // when memory or disk is really gone (production nodes keep 10-15 % free).
        "evictionHard": {
            "memory.available": "50Mi",
            "nodefs.available": "100Mi",
            "imagefs.available": "100Mi",
        },
        "serializeImagePulls": false,
    });
    format!("{doc:#}\n")
}

fn write(path: &Path, contents: &str) -> Result<(), Error> {
    std::fs::write(path, contents).map_err(|source| Error::WriteFile {
        path: path.to_owned(),
        source,
    })
}

fn check_prerequisites() -> Result<(), Error> {
    let host = HostFacts {
        root: nix::unistd::geteuid().is_root(),
        cgroups: Path::new("/sys/fs/cgroup/pids").is_dir()
            || Path::new("/sys/fs/cgroup/cgroup.controllers").is_file(),
        cni_bridge: Path::new(CNI_BIN_DIR).join("bridge").is_file(),
    };
    match missing_piece(&host, |program| find_in_path(program).is_some()) {
        Some(what) => Err(Error::NodeUnavailable(what)),
        None => Ok(()),
    }
}

/// What [`missing_piece`] judges, read from the machine.
struct HostFacts {
    root: bool,
    cgroups: bool,
    cni_bridge: bool,
}

/// Pure: the first thing a node needs that the machine lacks, said so that the user knows what
/// to do.
fn missing_piece(host: &HostFacts, installed: impl Fn(&str) -> bool) -> Option<String> {
    if !host.root {
        return Some(NEEDS_ROOT.into());
    }
    if !host.cgroups {
        return Some("no cgroup hierarchy with the pids controller under /sys/fs/cgroup".into());
    }
    for (program, package) in [
        ("runc", "runc"),
        ("ip", "iproute2"),
        ("mount", "mount"),
        ("umount", "mount"),
    ] {
        if !installed(program) {
            return Some(format!(
                "{program} is not installed (apt-get install {package})"
            ));
        }
    }
    if !host.cni_bridge {
        return Some(format!(
            "the CNI plugins are not in {CNI_BIN_DIR} (apt-get install containernetworking-plugins)"
        ));
    }
    None
}

/// Waits (up to [`LOCK_WAIT`]) while another run's node holds the machine (one test binary
/// after the other), then holds the lock for as long as the returned file lives.
fn take_lock() -> Result<File, Error> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(LOCK_FILE)
        .map_err(|source| Error::WriteFile {
            path: LOCK_FILE.into(),
            source,
        })?;
    let started = Instant::now();
    let mut said = false;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(file),
            Err(std::fs::TryLockError::WouldBlock) if started.elapsed() < LOCK_WAIT => {
                if !said {
                    eprintln!(
                        "[testbed] node: another run's node holds {LOCK_FILE}; waiting up to {LOCK_WAIT:?} for it"
                    );
                    said = true;
                }
                std::thread::sleep(POLL);
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(Error::NodeUnavailable(format!(
                    "another run's node held {LOCK_FILE} for {LOCK_WAIT:?} (see `fuser {LOCK_FILE}`)"
                )));
            }
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(Error::NodeUnavailable(format!("locking {LOCK_FILE}: {e}")));
            }
        }
    }
}

/// A `/var/lib/kubelet` the testbed did not make, or a kubelet it did not start, belongs to a
/// real node: cleaning up would kill its pods and remove its volumes.
fn refuse_a_foreign_kubelet() -> Result<(), Error> {
    let root = Path::new(KUBELET_ROOT);
    if root.exists() && !root.join(MARKER).exists() {
        return Err(Error::NodeUnavailable(format!(
            "{KUBELET_ROOT} exists and was not made by the testbed (no {MARKER}): this machine \
             looks like a real node, which the testbed's node would damage"
        )));
    }
    let foreign = node_processes(|exe, cmdline| exe == "kubelet" && !cmdline.contains(RUN_ROOT));
    if !foreign.is_empty() {
        return Err(Error::NodeUnavailable(format!(
            "a kubelet the testbed did not start is running (pids {foreign:?})"
        )));
    }
    Ok(())
}

/// Best effort, and logged: kills what an earlier run left (its kubelet, containerd and shims,
/// the pods' processes by their cgroups under [`CGROUP_ROOT`]), unmounts everything under the
/// node's directories and removes them (not a directory that still has a mount under it),
/// deletes the bridge and the loopback address.
fn clean_slate() {
    for pid in node_processes(|exe, cmdline| {
        matches!(exe, "kubelet" | "containerd" | "containerd-shim-runc-v2")
            && cmdline.contains(RUN_ROOT)
    }) {
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
    let cgroups = cgroup_roots();
    for round in 0..LEFTOVER_KILL_ROUNDS {
        let mut pids = Vec::new();
        for root in &cgroups {
            collect_procs(root, &mut pids);
        }
        if pids.is_empty() {
            break;
        }
        if round + 1 == LEFTOVER_KILL_ROUNDS {
            eprintln!(
                "[testbed] node: {} pod processes survived SIGKILL",
                pids.len()
            );
        }
        for pid in pids {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for root in &cgroups {
        remove_dirs_deepest_first(root);
    }
    for root in [KUBELET_ROOT, STATE_ROOT, RUN_ROOT] {
        let still_mounted = unmount_under(root);
        if !still_mounted.is_empty() {
            eprintln!("[testbed] node: not removing {root}: still mounted: {still_mounted:?}");
            continue;
        }
        if let Err(e) = std::fs::remove_dir_all(root)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            eprintln!("[testbed] node: cannot remove {root}: {e}");
        }
    }
    if Path::new("/sys/class/net").join(BRIDGE).exists() {
        let _ = run_host("ip", &["link", "del", BRIDGE]);
    }
    let labelled = Command::new("ip")
        .args(["-o", "addr", "show", "label", ADDRESS_LABEL])
        .output()
        .is_ok_and(|o| !o.stdout.is_empty());
    if labelled {
        let cidr = format!("{SERVICE_IP}/32");
        if let Err(e) = run_host("ip", &["addr", "del", &cidr, "dev", "lo"]) {
            eprintln!("[testbed] node: {e}");
        }
    }
}

/// Processes whose executable's file name and command line `matches` (the name, not the
/// command line alone: an editor open on a file of the node's is no node process).
fn node_processes(matches: impl Fn(&str, &str) -> bool) -> Vec<i32> {
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_str()?.parse::<i32>().ok()?;
            if u32::try_from(pid).is_ok_and(|p| p == me) {
                return None;
            }
            let exe = std::fs::read_link(entry.path().join("exe")).ok()?;
            let name = exe.file_name()?.to_str()?.to_owned();
            let raw = std::fs::read(entry.path().join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&raw).replace('\0', " ");
            matches(&name, &cmdline).then_some(pid)
        })
        .collect()
}

/// [`CGROUP_ROOT`] in every cgroup hierarchy mounted (each v1 controller, and v2).
fn cgroup_roots() -> Vec<PathBuf> {
    let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    cgroup_mounts(&mountinfo)
        .into_iter()
        .map(|mount| mount.join(CGROUP_ROOT))
        .collect()
}

/// Pure: the mount points of the cgroup file systems (v1 and v2) of a mountinfo text.
fn cgroup_mounts(mountinfo: &str) -> Vec<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let fstype = right.split(' ').next()?;
            matches!(fstype, "cgroup" | "cgroup2").then(|| left.split(' ').nth(4))?
        })
        .map(PathBuf::from)
        .collect()
}

/// Makes [`CGROUP_ROOT`] in every hierarchy: the kubelet refuses a `cgroupRoot` that does not
/// exist.
fn make_cgroup_roots() -> Result<(), Error> {
    for root in cgroup_roots() {
        std::fs::create_dir_all(&root).map_err(|source| Error::WriteFile { path: root, source })?;
    }
    Ok(())
}

fn collect_procs(dir: &Path, pids: &mut Vec<i32>) {
    if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        pids.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                collect_procs(&entry.path(), pids);
            }
        }
    }
}

/// Removes a tree of empty cgroups, deepest first.
fn remove_dirs_deepest_first(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_dirs_deepest_first(&entry.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// Unmounts every mount point at or under `root`, deepest first (`umount --lazy`: a cleanup
/// must not wait on a busy mount); returns the ones still there afterwards.
fn unmount_under(root: &str) -> Vec<PathBuf> {
    let under = || -> Vec<PathBuf> {
        std::fs::read_to_string("/proc/self/mountinfo")
            .map(|mountinfo| {
                csi_reference_driver::mounts::parse_mount_points(&mountinfo)
                    .into_iter()
                    .filter(|point| point.starts_with(root))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut points = under();
    points.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
    for point in points {
        let _ = Command::new("umount").arg("--lazy").arg(&point).output();
    }
    under()
}

fn run_host(program: &str, args: &[&str]) -> Result<(), Error> {
    let output = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| Error::NodeUnavailable(format!("running {program}: {e}")))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(Error::NodeUnavailable(format!(
            "{program} {} failed ({}): {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )))
    }
}

fn find_in_path(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(program))
            .find(|p| p.is_file())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_piece_is_named_with_what_installs_it() {
        let ready = HostFacts {
            root: true,
            cgroups: true,
            cni_bridge: true,
        };
        assert_eq!(missing_piece(&ready, |_| true), None);
        let no_runc = missing_piece(&ready, |program| program != "runc");
        assert_eq!(
            no_runc.as_deref(),
            Some("runc is not installed (apt-get install runc)")
        );
        let no_cgroups = HostFacts {
            cgroups: false,
            ..ready
        };
        assert!(
            missing_piece(&no_cgroups, |_| true).is_some_and(|m| m.contains("no cgroup hierarchy"))
        );
        let no_cni = HostFacts {
            cni_bridge: false,
            ..no_cgroups
        };
        let user = HostFacts {
            root: false,
            ..no_cni
        };
        assert!(missing_piece(&user, |_| false).is_some_and(|m| m.contains("needs root")));
    }

    #[test]
    fn cgroup_mounts_of_both_versions_are_found() {
        let mountinfo = "\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
30 25 0:26 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
31 25 0:27 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
32 25 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755
";
        assert_eq!(
            cgroup_mounts(mountinfo),
            vec![
                PathBuf::from("/sys/fs/cgroup/pids"),
                PathBuf::from("/sys/fs/cgroup/unified")
            ]
        );
    }

    #[test]
    fn containerd_runs_pods_with_the_given_runc_on_cgroupfs() {
        let toml = containerd_toml(Path::new("/bin/shim"), Path::new("/usr/sbin/runc"));
        assert!(toml.contains("BinaryName = '/usr/sbin/runc'"));
        assert!(toml.contains("SystemdCgroup = false"));
        assert!(toml.contains("runtime_path = '/bin/shim'"));
        assert!(toml.contains(&format!("address = \"{RUN_ROOT}/containerd.sock\"")));
    }

    #[test]
    fn the_kubelet_accepts_cgroup_v1_and_never_collects_imported_images() {
        let yaml = kubelet_yaml(Path::new("/run/c.sock"), Path::new("/pki/ca.crt"));
        let doc: serde_json::Value = serde_json::from_str(&yaml).expect("json");
        assert_eq!(doc["failCgroupV1"], false);
        assert_eq!(doc["imageGCHighThresholdPercent"], 100);
        assert_eq!(doc["containerRuntimeEndpoint"], "unix:///run/c.sock");
        assert_eq!(doc["authentication"]["x509"]["clientCAFile"], "/pki/ca.crt");
    }

    #[test]
    fn a_node_is_schedulable_only_when_ready_and_untainted() {
        let node = |ready: &str, taint: Option<&str>| -> NodeObject {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": NODE_NAME},
                "spec": {"taints": taint.map(|k| vec![serde_json::json!({"key": k, "effect": "NoSchedule"})])},
                "status": {"conditions": [{"type": "Ready", "status": ready}]},
            }))
            .expect("node")
        };
        assert!(node_schedulable(&node("True", None)).is_ok());
        assert!(node_schedulable(&node("False", None)).is_err());
        let tainted = node_schedulable(&node("True", Some("node.kubernetes.io/not-ready")));
        assert_eq!(
            tainted,
            Err("tainted node.kubernetes.io/not-ready:NoSchedule".to_owned())
        );
    }
}
