//! The real `csi-provisioner` binary's log streams: which lines go to stdout and which to
//! stderr, the alpha options' gate, and the info buffer's flushes. No control plane: the
//! sidecar connects to a reference driver (an INFO line), then fails for want of a kubeconfig
//! (an ERROR line) and exits 1; or, without a driver, logs an INFO line every second.

use csi_test_support as support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use support::peers::Driver;

const GATE: &str = "--feature-gates=LoggingAlphaOptions=true";
const NO_KUBECONFIG: &str = "--kubeconfig=/nonexistent/kubeconfig";

fn sidecar() -> Command {
    let mut command = Command::new(support::peers::sidecar_program());
    command.env_remove("KUBECONFIG").env_remove("RUST_LOG");
    command
}

/// Runs the sidecar with `flags` until it exits on its own.
fn run(flags: &[&str]) -> Output {
    sidecar()
        .args(flags)
        .output()
        .unwrap_or_else(|e| panic!("running csi-provisioner: {e}"))
}

/// Runs the sidecar against `driver` until it fails on the missing kubeconfig; returns stdout
/// and stderr.
fn run_to_the_kubeconfig_error(driver: &Driver, flags: &[&str]) -> (String, String) {
    let address = format!("--csi-address={}", driver.socket().display());
    let mut all = vec![address.as_str(), NO_KUBECONFIG];
    all.extend_from_slice(flags);
    let out = run(&all);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "{flags:?}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    (stdout, stderr)
}

fn lines_with<'a>(text: &'a str, words: &[&str]) -> Vec<&'a str> {
    text.lines()
        .filter(|l| words.iter().all(|w| l.contains(w)))
        .collect()
}

#[tokio::test]
async fn split_streams_send_info_lines_to_stdout_and_errors_to_stderr() {
    let driver = Driver::start(&[]).await;
    let connected = "Connected to the CSI driver";

    // One stream, as upstream: everything on stderr, in both formats.
    for format in ["--logging-format=text", "--logging-format=json"] {
        let (stdout, stderr) = run_to_the_kubeconfig_error(&driver, &[format]);
        assert!(stdout.is_empty(), "{format}: stdout:\n{stdout}");
        assert_eq!(
            lines_with(&stderr, &[connected]).len(),
            1,
            "{format}:\n{stderr}"
        );
        assert!(!lines_with(&stderr, &["ERROR", "/nonexistent/kubeconfig"]).is_empty());
    }

    for (format, split, info, error) in [
        (
            "--logging-format=text",
            "--log-text-split-stream",
            " INFO ",
            " ERROR ",
        ),
        (
            "--logging-format=json",
            "--log-json-split-stream=true",
            r#""level":"INFO""#,
            r#""level":"ERROR""#,
        ),
    ] {
        let (stdout, stderr) = run_to_the_kubeconfig_error(&driver, &[format, split, GATE]);
        let why = format!("{format}\nstdout:\n{stdout}\nstderr:\n{stderr}");
        assert_eq!(lines_with(&stdout, &[info, connected]).len(), 1, "{why}");
        assert!(lines_with(&stdout, &[error]).is_empty(), "{why}");
        assert!(
            !lines_with(&stderr, &[error, "/nonexistent/kubeconfig"]).is_empty(),
            "{why}"
        );
        assert!(lines_with(&stderr, &[info]).is_empty(), "{why}");
    }
}

#[test]
fn alpha_options_need_the_logging_gate_and_vmodule_the_text_format() {
    for (flags, expected) in [
        (
            &["--log-text-split-stream"][..],
            "csi-provisioner: --log-text-split-stream: options.text.splitStream: Forbidden: \
             Feature LoggingAlphaOptions is disabled",
        ),
        (
            &["--logging-format=json", "--log-json-info-buffer-size=4Ki"][..],
            "csi-provisioner: --log-json-info-buffer-size: options.json.infoBufferSize: \
             Forbidden: Feature LoggingAlphaOptions is disabled",
        ),
        (
            &["--logging-format=json", "--vmodule=claim=5"][..],
            "csi-provisioner: --vmodule: Forbidden: Only supported for text log format",
        ),
    ] {
        let out = run(flags);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{flags:?}: {stderr}");
        assert!(stderr.contains(expected), "{flags:?}: {stderr}");
    }
}

#[tokio::test]
async fn buffered_info_lines_are_flushed_every_period_and_at_exit() {
    // At exit: the sidecar fails right after its INFO line, long before a flush period.
    let driver = Driver::start(&[]).await;
    let (stdout, _) = run_to_the_kubeconfig_error(
        &driver,
        &[
            "--log-text-split-stream",
            "--log-text-info-buffer-size=1Mi",
            "--log-flush-frequency=1h",
            GATE,
        ],
    );
    assert_eq!(
        lines_with(&stdout, &["Connected to the CSI driver"]).len(),
        1,
        "{stdout}"
    );

    // Every period: without a driver the sidecar runs on, logging one INFO line a second,
    // far below the buffer's size; only the flusher can write them while it runs.
    let dir = tempfile::tempdir().expect("temp dir");
    let mut child = sidecar()
        .args([
            &format!("--csi-address={}", dir.path().join("none.sock").display()),
            "--log-text-split-stream",
            "--log-text-info-buffer-size=1Mi",
            "--log-flush-frequency=1s",
            GATE,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start csi-provisioner");
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let line = rx.recv_timeout(Duration::from_secs(30));
    let running = child.try_wait().expect("child status").is_none();
    let _ = child.kill();
    let _ = child.wait();
    let line = line.expect("an info line on stdout within 30 s");
    assert!(
        line.contains("Still connecting to the CSI driver"),
        "{line}"
    );
    assert!(running, "the line was written while the sidecar ran");
}
