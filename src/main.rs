//! `csi-provisioner`: parse flags, set up logging, run; see `csi_provisioner::app`.

use std::process::ExitCode;

use csi_provisioner::config::{Args, version_line};
use csi_provisioner::{app, logging, memory};

fn main() -> ExitCode {
    memory::return_large_blocks_to_the_os();
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(run()),
        Err(error) => {
            eprintln!("csi-provisioner: cannot start the async runtime: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> ExitCode {
    let args = Args::parse_flags();
    // Before `--version`, as upstream.
    if let Err(error) = args
        .node_deployment
        .node_name(std::env::var("NODE_NAME").ok())
    {
        eprintln!("csi-provisioner: {error}");
        return ExitCode::FAILURE;
    }
    if args.version {
        println!(
            "{}",
            version_line(&std::env::args().next().unwrap_or_default())
        );
        return ExitCode::SUCCESS;
    }
    if let Err(error) = logging::init(&args.log) {
        eprintln!("csi-provisioner: {error}");
        return ExitCode::FAILURE;
    }
    if let Err(error) = args.validate() {
        eprintln!("csi-provisioner: {error}");
        return ExitCode::FAILURE;
    }
    // A flag whose behaviour is not built is refused, never silently ignored.
    let refused = args.refused();
    if !refused.is_empty() {
        for error in refused {
            eprintln!("csi-provisioner: {error}");
        }
        return ExitCode::FAILURE;
    }
    app::run(args).await
}
