//! Command lines of the components (pure), following the envtest defaults plus what a
//! provisioner needs; docs/control-plane.md explains each choice.

use std::path::{Path, PathBuf};

use crate::error::Component;
use crate::pki::PkiFiles;

/// Exactly the controllers a CSI provisioner depends on: the binder writes the
/// storage-provisioner annotation, binds and releases; the protection controllers remove the
/// finalizers that admission adds (PVC/PV deletes hang otherwise); namespace and garbage
/// collector let tests clean up; the expander serves resize tests.
pub const CONTROLLERS: &str = "persistentvolume-binder-controller,\
persistentvolumeclaim-protection-controller,\
persistentvolume-protection-controller,\
namespace-controller,\
garbage-collector-controller,\
persistentvolume-expander-controller";

/// What a real node adds (`StartOptions::node`): the `default` ServiceAccount and the
/// `kube-root-ca.crt` ConfigMap of every namespace (pods mount both with their token), the
/// workload controllers that turn deploy/'s Deployment and DaemonSet into pods, the node
/// lifecycle controller, which lifts the `not-ready` taint once the kubelet reports Ready, and the
/// ephemeral volume controller, which makes the claims of pods' generic ephemeral volumes.
pub const NODE_CONTROLLERS: &str = "serviceaccount-controller,\
root-ca-certificate-publisher-controller,\
deployment-controller,\
replicaset-controller,\
daemonset-controller,\
node-lifecycle-controller,\
ephemeral-volume-controller";

/// Client rate limits of the controller manager and the scheduler: the defaults (20/30 and 50/100)
/// would make the binder, or the scheduler's claim updates and pod bindings, the bottleneck of
/// the benchmarks.
const CLIENT_QPS: u32 = 1000;
const CLIENT_BURST: u32 = 2000;

pub fn etcd(data_dir: &Path, client_port: u16, peer_port: u16) -> Vec<String> {
    let client = format!("http://127.0.0.1:{client_port}");
    let peer = format!("http://127.0.0.1:{peer_port}");
    vec![
        format!("--data-dir={}", data_dir.display()),
        format!("--listen-client-urls={client}"),
        format!("--advertise-client-urls={client}"),
        format!("--listen-peer-urls={peer}"),
        format!("--initial-advertise-peer-urls={peer}"),
        "--name=csi-testbed".to_owned(),
        format!("--initial-cluster=csi-testbed={peer}"),
        "--unsafe-no-fsync=true".to_owned(),
        "--log-level=warn".to_owned(),
    ]
}

pub struct ApiServer<'a> {
    pub etcd_port: u16,
    pub port: u16,
    pub cert_dir: &'a Path,
    pub pki: &'a PkiFiles,
    /// A real node runs: serve where its pods reach the `kubernetes` Service, authorize the
    /// kubelet as a production cluster does, and mount ServiceAccount tokens in pods.
    pub node: bool,
}

pub fn apiserver(a: &ApiServer<'_>) -> Vec<String> {
    let port = a.port;
    let mut args = vec![
        format!("--etcd-servers=http://127.0.0.1:{}", a.etcd_port),
        format!("--cert-dir={}", a.cert_dir.display()),
        format!("--tls-cert-file={}", a.pki.serving_cert.display()),
        format!("--tls-private-key-file={}", a.pki.serving_key.display()),
        format!("--secure-port={port}"),
        "--service-cluster-ip-range=10.0.0.0/24".to_owned(),
        "--allow-privileged=true".to_owned(),
        format!("--client-ca-file={}", a.pki.client_ca.display()),
        format!("--service-account-issuer=https://127.0.0.1:{port}/"),
        format!(
            "--service-account-key-file={}",
            a.pki.service_account_public.display()
        ),
        format!(
            "--service-account-signing-key-file={}",
            a.pki.service_account_private.display()
        ),
        // A loopback advertise address cannot back the `kubernetes` Service endpoints.
        "--endpoint-reconciler-type=none".to_owned(),
        // Otherwise benchmarks of non-exempt identities measure API Priority and Fairness.
        "--enable-priority-and-fairness=false".to_owned(),
    ];
    if a.node {
        let service_ip = crate::node_identity::SERVICE_IP;
        args.extend([
            // The first address of the service range, which the kubelet gives pods as
            // KUBERNETES_SERVICE_HOST (port 443); the testbed puts it on loopback, so pods on the
            // node's bridge reach the apiserver there without a kube-proxy.
            format!("--bind-address={service_ip}"),
            format!("--advertise-address={service_ip}"),
            "--authorization-mode=Node,RBAC".to_owned(),
            "--enable-admission-plugins=NodeRestriction".to_owned(),
            // Logs of pods (and `kubectl exec`) go through the kubelet, as the admin.
            format!(
                "--kubelet-client-certificate={}",
                a.pki.admin_cert.display()
            ),
            format!("--kubelet-client-key={}", a.pki.admin_key.display()),
            "--kubelet-preferred-address-types=InternalIP".to_owned(),
        ]);
    } else {
        args.extend([
            "--bind-address=127.0.0.1".to_owned(),
            "--authorization-mode=RBAC".to_owned(),
            // No controller creates the `default` ServiceAccount here, so pods would be refused.
            "--disable-admission-plugins=ServiceAccount".to_owned(),
        ]);
    }
    args
}

pub struct ControllerManager<'a> {
    pub kubeconfig: &'a Path,
    pub port: u16,
    pub cert_dir: &'a Path,
    pub pki: &'a PkiFiles,
    /// A real node runs: also [`NODE_CONTROLLERS`].
    pub node: bool,
}

pub fn controller_manager(a: &ControllerManager<'_>) -> Vec<String> {
    let controllers = if a.node {
        format!("{CONTROLLERS},{NODE_CONTROLLERS}")
    } else {
        CONTROLLERS.to_owned()
    };
    let mut args = vec![
        format!("--kubeconfig={}", a.kubeconfig.display()),
        format!("--controllers={controllers}"),
        "--leader-elect=false".to_owned(),
        "--use-service-account-credentials=false".to_owned(),
        // Served so that start-up can wait on /healthz and the benchmarks can read the client
        // metrics (`rest_client_requests_total`) on /metrics: both open without credentials.
        format!("--secure-port={}", a.port),
        "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics".to_owned(),
        "--bind-address=127.0.0.1".to_owned(),
        format!("--cert-dir={}", a.cert_dir.display()),
        format!("--tls-cert-file={}", a.pki.serving_cert.display()),
        format!("--tls-private-key-file={}", a.pki.serving_key.display()),
        format!("--kube-api-qps={CLIENT_QPS}"),
        format!("--kube-api-burst={CLIENT_BURST}"),
    ];
    if a.node {
        // What the root-CA publisher puts in every namespace's `kube-root-ca.crt`.
        args.push(format!("--root-ca-file={}", a.pki.serving_ca.display()));
    }
    args
}

pub struct Scheduler<'a> {
    pub kubeconfig: &'a Path,
    pub port: u16,
    pub pki: &'a PkiFiles,
}

/// kube-scheduler with its built-in default profile (VolumeBinding writes the selected-node
/// annotation in PreBind). The deprecated command-line settings stand in for a configuration
/// file: they are enough for one admin identity and no leader election.
pub fn scheduler(a: &Scheduler<'_>) -> Vec<String> {
    vec![
        format!("--kubeconfig={}", a.kubeconfig.display()),
        "--leader-elect=false".to_owned(),
        // Served so that start-up can wait on /readyz, which includes the informer sync; both
        // /healthz and /readyz are open without credentials by default.
        format!("--secure-port={}", a.port),
        "--bind-address=127.0.0.1".to_owned(),
        format!("--tls-cert-file={}", a.pki.serving_cert.display()),
        format!("--tls-private-key-file={}", a.pki.serving_key.display()),
        // Level 2 logs each binding and each unschedulable verdict: what a failing test needs.
        "--v=2".to_owned(),
        format!("--kube-api-qps={CLIENT_QPS}"),
        format!("--kube-api-burst={CLIENT_BURST}"),
    ]
}

/// Both snapshot programs: the VolumeGroupSnapshot CRDs are not installed, and with the feature
/// on (its default) each program waits 30 s for them at start-up before going on without it.
const NO_GROUP_SNAPSHOTS: &str = "--feature-gates=CSIVolumeGroupSnapshot=false";

/// The common snapshot controller: binds VolumeSnapshots to contents it creates for
/// csi-snapshotter to act on. One per control plane, so no leader election.
pub fn snapshot_controller(kubeconfig: &Path) -> Vec<String> {
    vec![
        format!("--kubeconfig={}", kubeconfig.display()),
        "--leader-election=false".to_owned(),
        NO_GROUP_SNAPSHOTS.to_owned(),
        // A test on 2 shared cores must not wait up to a minute for a retry of a step that
        // raced another controller.
        "--retry-interval-max=5s".to_owned(),
        "--v=2".to_owned(),
    ]
}

/// The snapshot sidecar of the driver on `csi_socket`: calls CreateSnapshot and DeleteSnapshot
/// for the contents of its driver. One per driver, so no leader election.
pub fn csi_snapshotter(kubeconfig: &Path, csi_socket: &Path) -> Vec<String> {
    vec![
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--csi-address={}", csi_socket.display()),
        "--leader-election=false".to_owned(),
        NO_GROUP_SNAPSHOTS.to_owned(),
        "--retry-interval-max=5s".to_owned(),
        "--v=2".to_owned(),
    ]
}

/// The run directory's layout.
pub struct Layout {
    pub root: PathBuf,
}

impl Layout {
    pub fn pki(&self) -> PathBuf {
        self.root.join("pki")
    }
    pub fn etcd_data(&self) -> PathBuf {
        self.root.join("etcd-data")
    }
    pub fn apiserver_certs(&self) -> PathBuf {
        self.root.join("apiserver-certs")
    }
    pub fn controller_manager_certs(&self) -> PathBuf {
        self.root.join("controller-manager-certs")
    }
    pub fn kubeconfig(&self) -> PathBuf {
        self.root.join("admin.kubeconfig")
    }
    pub fn logs(&self) -> PathBuf {
        self.root.join("logs")
    }
    pub fn log(&self, component: Component) -> PathBuf {
        self.logs().join(format!("{}.log", component.binary()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pki() -> PkiFiles {
        let p = |n: &str| PathBuf::from("/run").join(n);
        PkiFiles {
            serving_ca: p("ca"),
            serving_cert: p("crt"),
            serving_key: p("key"),
            client_ca: p("client-ca"),
            admin_cert: p("admin.crt"),
            admin_key: p("admin.key"),
            node_cert: p("node.crt"),
            node_key: p("node.key"),
            service_account_public: p("sa.pub"),
            service_account_private: p("sa.key"),
        }
    }

    #[test]
    fn etcd_listens_only_on_loopback_with_the_given_ports() {
        let args = etcd(Path::new("/run/etcd"), 4001, 4002);
        assert!(args.contains(&"--listen-client-urls=http://127.0.0.1:4001".to_owned()));
        assert!(args.contains(&"--listen-peer-urls=http://127.0.0.1:4002".to_owned()));
        assert!(args.contains(&"--initial-cluster=csi-testbed=http://127.0.0.1:4002".to_owned()));
        assert!(args.contains(&"--data-dir=/run/etcd".to_owned()));
    }

    #[test]
    fn apiserver_issuer_follows_its_port() {
        let pki = pki();
        let args = apiserver(&ApiServer {
            etcd_port: 4001,
            port: 6443,
            cert_dir: Path::new("/run/certs"),
            pki: &pki,
            node: false,
        });
        assert!(args.contains(&"--secure-port=6443".to_owned()));
        assert!(args.contains(&"--service-account-issuer=https://127.0.0.1:6443/".to_owned()));
        assert!(args.contains(&"--etcd-servers=http://127.0.0.1:4001".to_owned()));
        assert!(args.contains(&"--authorization-mode=RBAC".to_owned()));
    }

    #[test]
    fn controller_manager_runs_only_the_volume_controllers() {
        let pki = pki();
        let args = controller_manager(&ControllerManager {
            kubeconfig: Path::new("/run/admin.kubeconfig"),
            port: 10257,
            cert_dir: Path::new("/run/kcm"),
            pki: &pki,
            node: false,
        });
        let controllers = args
            .iter()
            .find_map(|a| a.strip_prefix("--controllers="))
            .expect("--controllers");
        assert!(!controllers.contains('*'));
        assert!(
            controllers
                .split(',')
                .any(|c| c == "persistentvolume-binder-controller")
        );
        assert!(args.contains(&"--leader-elect=false".to_owned()));
    }

    #[test]
    fn the_snapshot_programs_skip_leader_election_and_group_snapshots() {
        let controller = snapshot_controller(Path::new("/run/admin.kubeconfig"));
        let sidecar = csi_snapshotter(
            Path::new("/run/admin.kubeconfig"),
            Path::new("/tmp/d/csi.sock"),
        );
        for args in [&controller, &sidecar] {
            assert!(args.contains(&"--kubeconfig=/run/admin.kubeconfig".to_owned()));
            assert!(args.contains(&"--leader-election=false".to_owned()));
            assert!(args.contains(&NO_GROUP_SNAPSHOTS.to_owned()));
        }
        assert!(sidecar.contains(&"--csi-address=/tmp/d/csi.sock".to_owned()));
    }

    #[test]
    fn scheduler_serves_on_loopback_without_leader_election() {
        let pki = pki();
        let args = scheduler(&Scheduler {
            kubeconfig: Path::new("/run/admin.kubeconfig"),
            port: 10259,
            pki: &pki,
        });
        assert!(args.contains(&"--secure-port=10259".to_owned()));
        assert!(args.contains(&"--bind-address=127.0.0.1".to_owned()));
        assert!(args.contains(&"--leader-elect=false".to_owned()));
        assert!(args.contains(&"--kubeconfig=/run/admin.kubeconfig".to_owned()));
        assert!(args.contains(&format!("--kube-api-qps={CLIENT_QPS}")));
    }
}
