//! `testbed`: runs the local control plane by hand (`testbed up`).

#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use csi_testbed::ControlPlane;

mod bench;

#[derive(Parser)]
#[command(about = "A real local Kubernetes control plane for the CSI provisioner")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start etcd, kube-apiserver and kube-controller-manager, print the KUBECONFIG, and run until
    /// Ctrl-C or SIGTERM; then stop everything and remove the run's directory
    /// (kept with CSI_TESTBED_KEEP=1).
    Up,
    /// Benchmark our sidecar against upstream external-provisioner v6.3.0 and write
    /// docs/benchmarks.md (see that file for the method).
    Bench(bench::BenchArgs),
}

#[tokio::main]
async fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Up => up().await,
        Command::Bench(args) => bench::run(args).await,
    }
}

async fn up() -> ExitCode {
    let control_plane = tokio::select! {
        started = ControlPlane::start() => started,
        () = shutdown_signal() => {
            // Dropping the start-up future has already stopped whatever it had started.
            eprintln!("testbed: interrupted during start-up");
            return ExitCode::from(130);
        }
    };
    let control_plane = match control_plane {
        Ok(cp) => cp,
        Err(e) => {
            eprintln!("testbed: {e}");
            return ExitCode::FAILURE;
        }
    };
    let kubeconfig = control_plane.kubeconfig_path().display().to_string();
    println!("{kubeconfig}");
    println!("export KUBECONFIG={kubeconfig}");
    eprintln!(
        "[testbed] apiserver {} is up (run directory {}); press Ctrl-C to stop",
        control_plane.apiserver_url(),
        control_plane.dir().display()
    );
    shutdown_signal().await;
    drop(control_plane);
    eprintln!("[testbed] stopped");
    ExitCode::SUCCESS
}

/// Ctrl-C or SIGTERM, whichever comes first.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(e) => {
            eprintln!("[testbed] cannot listen for SIGTERM ({e}); stop with Ctrl-C");
            // An error here means no signal can ever be observed; waiting forever is all that is left.
            if tokio::signal::ctrl_c().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}
