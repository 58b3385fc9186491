//! `testbed`: runs the local control plane by hand (`testbed up`).

#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use csi_testbed::{ControlPlane, StartOptions};

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
    Up(UpArgs),
    /// Benchmark our sidecar against upstream external-provisioner v6.3.0 and write
    /// docs/benchmarks.md (see that file for the method).
    Bench(bench::BenchArgs),
}

#[derive(clap::Args)]
struct UpArgs {
    /// Also run kube-scheduler.
    #[arg(long)]
    scheduler: bool,
    /// Also run a real node: containerd and a kubelet (built by hack/build-node.sh), with the
    /// images of hack/build-images.sh imported (implies --scheduler; root only, one per
    /// machine; docs/control-plane.md "A real node").
    #[arg(long)]
    node: bool,
    /// With --node: import the images listed in DIR/images.txt (`FILE NAME` a line, files
    /// relative to DIR) instead of building them with hack/build-images.sh.
    #[arg(long, value_name = "DIR", requires = "node")]
    images: Option<std::path::PathBuf>,
    /// Also serve volume snapshots: install the VolumeSnapshot CRDs and run the common
    /// snapshot-controller of external-snapshotter (built by hack/build-snapshotter.sh). Each
    /// driver brings its own csi-snapshotter sidecar.
    #[arg(long)]
    snapshots: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Up(args) => up(args).await,
        Command::Bench(args) => bench::run(args).await,
    }
}

async fn up(args: UpArgs) -> ExitCode {
    let images = if args.node {
        let listed = move || match args.images {
            Some(dir) => csi_testbed::workspace::images_in(&dir),
            None => csi_testbed::workspace::images(),
        };
        match tokio::task::spawn_blocking(listed).await {
            Ok(Ok(archives)) => Some(archives),
            Ok(Err(e)) => {
                eprintln!("testbed: building the node's images: {e}");
                return ExitCode::FAILURE;
            }
            Err(e) => {
                eprintln!("testbed: building the node's images: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        None
    };
    let options = StartOptions {
        apiserver_flags: &[],
        scheduler: args.scheduler,
        node: images.as_deref(),
    };
    let control_plane = tokio::select! {
        started = ControlPlane::start_with(options) => started,
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
    let snapshot_controller = if args.snapshots {
        let served = tokio::select! {
            served = serve_snapshots(&control_plane) => served,
            () = shutdown_signal() => {
                eprintln!("testbed: interrupted during start-up");
                return ExitCode::from(130);
            }
        };
        match served {
            Ok(controller) => Some(controller),
            Err(e) => {
                eprintln!("testbed: serving volume snapshots: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        None
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
    drop(snapshot_controller);
    drop(control_plane);
    eprintln!("[testbed] stopped");
    ExitCode::SUCCESS
}

/// Installs the snapshot CRDs and starts the snapshot-controller; dropping the peer stops it.
async fn serve_snapshots(
    control_plane: &ControlPlane,
) -> Result<csi_testbed::snapshots::SnapshotPeer, String> {
    use csi_testbed::snapshots::{self, SnapshotBinaries};
    let dir = tokio::task::spawn_blocking(csi_testbed::workspace::snapshotter)
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    snapshots::serve(control_plane, &SnapshotBinaries::at(&dir))
        .await
        .map_err(|e| e.to_string())
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
