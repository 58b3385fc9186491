//! The real `csi-provisioner` binary refuses flags and feature gates whose behaviour is not
//! built: exit 1 and one message naming each. Flags are refused before anything is contacted,
//! so no control plane is needed. A topology-capable driver is accepted (topology is built).

mod support;

use std::process::{Command, Output};

use support::peers::Driver;

/// Runs the sidecar with `flags` and returns its output; it must exit on its own.
fn sidecar(flags: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_csi-provisioner"))
        .args(flags)
        .env_remove("KUBECONFIG")
        .env_remove("RUST_LOG")
        .output()
        .unwrap_or_else(|e| panic!("running csi-provisioner: {e}"))
}

/// Asserts exit code 1 and returns the stderr lines that start with `csi-provisioner: `.
fn refused(flags: &[&str]) -> Vec<String> {
    let out = sidecar(flags);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{flags:?}: {stderr}");
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix("csi-provisioner: "))
        .map(str::to_owned)
        .collect()
}

#[test]
fn flags_whose_behaviour_is_not_built_are_refused() {
    // Given is refused whatever the value, Go's single-dash form included.
    assert_eq!(
        refused(&["-log-text-split-stream=false"]),
        vec![
            "--log-text-split-stream is not supported yet (split log streams are not built); remove the flag"
        ]
    );
    // One line per flag, so every one to remove is named at once.
    assert_eq!(
        refused(&["--vmodule=foo=2", "--log-text-split-stream",]),
        vec![
            "--vmodule is not supported yet (per-module verbosity is not built); remove the flag",
            "--log-text-split-stream is not supported yet (split log streams are not built); remove the flag",
        ]
    );
}

#[test]
fn gates_turned_on_without_their_behaviour_are_refused() {
    // Every alpha gate is built (AllAlpha included): only VolumeAttributesClass is refused.
    let lines = refused(&[
        "--feature-gates=AllAlpha=true,CrossNamespaceVolumeDataSource=true",
        "--feature-gates=Topology=true",
        "--feature-gates=VolumeAttributesClass=true",
    ]);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].starts_with("--feature-gates=VolumeAttributesClass=true is not supported yet"),
        "{lines:?}"
    );
}

#[test]
fn version_still_wins_over_refusals() {
    let out = sidecar(&["--version", "--enable-pprof"]);
    assert_eq!(out.status.code(), Some(0));
}

#[tokio::test]
async fn a_topology_capable_driver_is_accepted_with_the_topology_flags() {
    let driver = Driver::start(&["--topology=zone=a"]).await;
    let socket = driver
        .socket()
        .to_str()
        .expect("utf-8 socket path")
        .to_owned();
    let address = format!("--csi-address={socket}");
    // The sidecar goes past the driver check to the API client, which fails here for want of
    // a kubeconfig (no control plane in this test).
    for gates in [
        "--feature-gates=Topology=true",
        "--feature-gates=Topology=false",
    ] {
        let lines = refused(&[
            &address,
            gates,
            "--strict-topology",
            "--immediate-topology=false",
            "--kubeconfig=/nonexistent/kubeconfig",
        ]);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(!lines[0].contains("opology"), "{lines:?}");
        assert!(lines[0].contains("/nonexistent/kubeconfig"), "{lines:?}");
    }
}
