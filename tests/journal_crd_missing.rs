//! A cluster where deploy/base/crd.yaml was not applied: the sidecar exits 1 with one line that
//! names the CRD and the command installing it (not kube's "Failed to parse error data" dump).
//! This binary runs its own control plane, without the CRD the shared one installs.

use csi_test_support as support;

use std::process::Command;

use csi_testbed::ControlPlane;
use support::peers::Driver;

#[tokio::test]
async fn without_the_journal_crd_the_sidecar_exits_with_one_line_naming_it() {
    let cp = ControlPlane::start().await.expect("control plane");
    let driver = Driver::start(&[]).await;
    let out = Command::new(support::peers::sidecar_program())
        .arg(format!("--csi-address={}", driver.socket().display()))
        .arg(format!("--kubeconfig={}", cp.kubeconfig_path().display()))
        .env_remove("KUBECONFIG")
        .env_remove("RUST_LOG")
        .env("POD_NAMESPACE", "default")
        .output()
        .expect("running csi-provisioner");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let lines: Vec<_> = stderr
        .lines()
        .filter(|l| l.starts_with("csi-provisioner: "))
        .collect();
    assert_eq!(
        lines,
        [
            "csi-provisioner: the CRD provisioningjournals.provisioner.csi-rs.dev is not installed; \
             install it with `kubectl apply -f deploy/base/crd.yaml` (the sidecar keeps its \
             operations in flight there)"
        ],
        "{stderr}"
    );
    assert!(!stderr.contains("Failed to parse"), "{stderr}");
}
