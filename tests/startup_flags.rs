//! The real `csi-provisioner` binary accepts every flag and gate of upstream v6.3: none is
//! refused, so a start with any of them goes past the flag checks and the driver to the API
//! client, which fails here for want of a kubeconfig (no control plane is needed).

use csi_test_support as support;

use std::process::{Command, Output};

use support::peers::Driver;

/// Runs the sidecar with `flags` and returns its output; it must exit on its own.
fn sidecar(flags: &[&str]) -> Output {
    Command::new(support::peers::sidecar_program())
        .args(flags)
        .env_remove("KUBECONFIG")
        .env_remove("RUST_LOG")
        .output()
        .unwrap_or_else(|e| panic!("running csi-provisioner: {e}"))
}

/// Asserts exit code 1 and returns the stderr lines that start with `csi-provisioner: `.
fn exit_lines(flags: &[&str]) -> Vec<String> {
    let out = sidecar(flags);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{flags:?}: {stderr}");
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix("csi-provisioner: "))
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn every_gate_and_every_once_refused_flag_is_accepted() {
    let driver = Driver::start(&[]).await;
    let address = format!("--csi-address={}", driver.socket().display());
    // No gate is refused: the sidecar goes past the driver check to the API client, which
    // fails here for want of a kubeconfig.
    let lines = exit_lines(&[
        &address,
        "--feature-gates=AllAlpha=true,CrossNamespaceVolumeDataSource=true",
        "--feature-gates=Topology=true",
        "--feature-gates=VolumeAttributesClass=true",
        // Refused until built: profiling, per-file verbosity, split streams.
        "--enable-pprof",
        "--vmodule=claims=4",
        "--log-text-split-stream=false",
        "--kubeconfig=/nonexistent/kubeconfig",
    ]);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(!lines[0].contains("feature-gates"), "{lines:?}");
    assert!(lines[0].contains("/nonexistent/kubeconfig"), "{lines:?}");
}

#[test]
fn version_prints_and_exits_before_anything_is_contacted() {
    let out = sidecar(&[
        "--version",
        "--enable-pprof",
        "--csi-address=/nonexistent/socket",
    ]);
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
        let lines = exit_lines(&[
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
