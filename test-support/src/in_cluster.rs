//! The shipped artefacts on the real node ([`crate::control_plane_with_node`]): deploy/ applied
//! with `kubectl apply -k` as docs/deploy.md tells users (only the image names set, by a
//! kustomization on top), the images the Dockerfile builds, pods started by the kubelet.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, PostParams};

use crate::eventually;

/// The namespace deploy/ puts everything in.
pub const NAMESPACE: &str = "csi-provisioner";
/// deploy/'s pods carry `app.kubernetes.io/name=<this>`.
pub const SIDECAR_APP: &str = "csi-provisioner";
/// The node plugin DaemonSet's pods carry `app.kubernetes.io/name=<this>`.
pub const NODE_PLUGIN_APP: &str = "csi-reference-node";
/// The reference driver's storage in deploy/ (a hostPath the controller and node plugins
/// share): what "the backend" holds.
pub const BACKEND_DIR: &str = "/var/lib/csi-reference-rs";
/// The sidecar's and driver's images as `hack/build-images.sh` names them.
pub const SIDECAR_IMAGE: (&str, &str) = ("localhost/csi-provisioner-rs", "dev");
pub const DRIVER_IMAGE: (&str, &str) = ("localhost/csi-reference-driver-rs", "dev");
pub const REGISTRAR_IMAGE: (&str, &str) = ("localhost/csi-registrar", "dev");
/// What test pods run (imported by the node).
pub const BUSYBOX_IMAGE: &str = "registry.k8s.io/e2e-test-images/busybox:1.37.0-1";

/// Rollouts pull nothing but start several containers on 2 shared cores.
pub const ROLLOUT_TIMEOUT: Duration = Duration::from_secs(180);

/// deploy/ (or an overlay of it) applied to the node's cluster; dropping it runs
/// `kubectl delete -k` and waits until the namespace is gone.
pub struct Deployed {
    dir: tempfile::TempDir,
    kubectl: PathBuf,
    kubeconfig: PathBuf,
}

impl Deployed {
    /// `kubectl apply -k` of a kustomization whose only resource is `overlay` (a directory of
    /// the repository, e.g. `deploy` or `deploy/node`) and whose only change is the image names.
    pub fn apply(overlay: &str) -> Self {
        let cp = crate::control_plane_with_node();
        let source = csi_testbed::workspace::root().join(overlay);
        let dir = tempfile::Builder::new()
            .prefix("csi-deploy-")
            .tempdir()
            .expect("temp dir");
        std::fs::write(
            dir.path().join("kustomization.yaml"),
            kustomization(&relative_to(dir.path(), &source)),
        )
        .expect("write kustomization.yaml");
        let deployed = Deployed {
            dir,
            kubectl: cp.kubectl(),
            kubeconfig: cp.kubeconfig_path().to_owned(),
        };
        deployed.kubectl_ok(&["apply", "-k", &deployed.path()]);
        deployed
    }

    fn path(&self) -> String {
        self.dir.path().display().to_string()
    }

    /// Runs kubectl with the admin kubeconfig; panics with its output when it fails.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let output = Command::new(&self.kubectl)
            .env("KUBECONFIG", &self.kubeconfig)
            .args(args)
            .output()
            .expect("running kubectl");
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "kubectl {} failed ({}):\n{stdout}\n{}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        stdout
    }
}

impl Drop for Deployed {
    fn drop(&mut self) {
        let path = self.path();
        let output = Command::new(&self.kubectl)
            .env("KUBECONFIG", &self.kubeconfig)
            .args([
                "delete",
                "-k",
                &path,
                "--ignore-not-found",
                "--wait=true",
                "--timeout=180s",
            ])
            .output();
        match output {
            Ok(o) if o.status.success() => {}
            Ok(o) => eprintln!(
                "kubectl delete -k failed: {}",
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => eprintln!("kubectl delete -k: {e}"),
        }
    }
}

/// Pure: `to` as seen from the directory `from`, both absolute (kustomize refuses an absolute
/// resource path).
fn relative_to(from: &Path, to: &Path) -> PathBuf {
    let ups = from.components().skip(1).count();
    let mut relative: PathBuf = std::iter::repeat_n("..", ups).collect();
    relative.push(to.strip_prefix("/").unwrap_or(to));
    relative
}

/// Pure: the kustomization users would write on top of `source` to set the image names.
fn kustomization(source: &Path) -> String {
    let (sidecar, sidecar_tag) = SIDECAR_IMAGE;
    let (driver, driver_tag) = DRIVER_IMAGE;
    let (registrar, registrar_tag) = REGISTRAR_IMAGE;
    format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1\n\
         kind: Kustomization\n\
         resources:\n  - {}\n\
         images:\n\
         \x20 - name: csi-provisioner-rs\n    newName: {sidecar}\n    newTag: {sidecar_tag}\n\
         \x20 - name: csi-reference-driver-rs\n    newName: {driver}\n    newTag: {driver_tag}\n\
         \x20 - name: csi-registrar\n    newName: {registrar}\n    newTag: {registrar_tag}\n",
        source.display()
    )
}

/// Waits until `n` pods labelled `app.kubernetes.io/name=<app>` in [`NAMESPACE`] are Ready
/// (every container started and passing its readiness probe); returns them.
pub async fn wait_pods_ready(client: &Client, app: &str, n: usize) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let selector = format!("app.kubernetes.io/name={app}");
    eventually(
        &format!("{n} Ready pods of {app}"),
        ROLLOUT_TIMEOUT,
        || async {
            let list = pods
                .list(&ListParams::default().labels(&selector))
                .await
                .map_err(|e| e.to_string())?;
            let ready: Vec<Pod> = list
                .items
                .into_iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none() && pod_ready(p))
                .collect();
            if ready.len() == n {
                Ok(ready)
            } else {
                Err(format!("{} Ready", ready.len()))
            }
        },
    )
    .await
}

/// Pure: the pod's Ready condition is True.
pub fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The restart count and containerd id of a container of a pod.
pub fn container_state(pod: &Pod, container: &str) -> Option<(i32, String)> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == container)
        .map(|c| {
            let id = c
                .container_id
                .as_deref()
                .and_then(|id| id.strip_prefix("containerd://"))
                .unwrap_or_default()
                .to_owned();
            (c.restart_count, id)
        })
}

/// Kills a container with SIGKILL through the node's runtime (as an OOM kill or a crash would
/// end it); the kubelet then restarts it.
pub fn kill_container(container_id: &str) {
    let cp = crate::control_plane_with_node();
    let node = cp.node().expect("a node");
    let output = Command::new(node.ctr())
        .arg(format!("--address={}", node.containerd_socket().display()))
        .args([
            "--namespace=k8s.io",
            "tasks",
            "kill",
            "--signal=SIGKILL",
            container_id,
        ])
        .output()
        .expect("running ctr");
    assert!(
        output.status.success(),
        "ctr tasks kill {container_id}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The holder of the sidecar's leader-election Lease in [`NAMESPACE`] (a pod name).
pub async fn lease_holder(client: &Client) -> Result<String, String> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), NAMESPACE);
    let list = leases
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?;
    list.items
        .iter()
        .filter(|l| {
            l.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.contains("reference-csi-example-com"))
        })
        .find_map(|l| l.spec.as_ref()?.holder_identity.clone())
        .filter(|h| !h.is_empty())
        .ok_or_else(|| format!("no held Lease among {} Leases", list.items.len()))
}

/// A claim of deploy/'s class `csi-reference`.
pub async fn create_claim(client: &Client, namespace: &str, name: &str) -> PersistentVolumeClaim {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    let claim: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "storageClassName": "csi-reference",
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }))
    .expect("claim");
    claims
        .create(&PostParams::default(), &claim)
        .await
        .expect("create claim")
}

/// Runs a busybox pod that mounts `claim` at /data and runs `script`; waits until it
/// Succeeded and returns its log. The pod is deleted afterwards.
pub async fn run_pod(
    client: &Client,
    namespace: &str,
    name: &str,
    claim: &str,
    script: &str,
) -> String {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "c",
                "image": BUSYBOX_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", script],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            }],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
        },
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
    let phase = eventually(
        &format!("pod {name} to finish"),
        ROLLOUT_TIMEOUT,
        || async {
            let pod = pods.get(name).await.map_err(|e| e.to_string())?;
            let phase = pod
                .status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_default();
            if phase == "Succeeded" || phase == "Failed" {
                Ok(phase)
            } else {
                Err(format!("{phase}: {:?}", pod.status))
            }
        },
    )
    .await;
    let log = pods.logs(name, &Default::default()).await.expect("pod log");
    assert_eq!(phase, "Succeeded", "pod {name} failed; its log:\n{log}");
    pods.delete(name, &DeleteParams::default())
        .await
        .expect("delete pod");
    eventually(&format!("pod {name} gone"), ROLLOUT_TIMEOUT, || async {
        match pods.get_opt(name).await {
            Ok(None) => Ok(()),
            Ok(Some(_)) => Err("still there".to_owned()),
            Err(e) => Err(e.to_string()),
        }
    })
    .await;
    log
}

/// The volume ids the reference driver's backend holds (its state in [`BACKEND_DIR`]).
pub fn backend_volumes() -> Vec<String> {
    match csi_reference_driver::load_state(Path::new(BACKEND_DIR)) {
        Ok(state) => state.volumes.keys().cloned().collect(),
        Err(e) => panic!("reading the backend's state in {BACKEND_DIR}: {e}"),
    }
}
