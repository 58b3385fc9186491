//! `csi-provisioner`: parse flags, set up logging, run; see `csi_provisioner::app`.

use std::process::ExitCode;

use csi_provisioner::config::{Args, version_line};
use csi_provisioner::{app, logging, memory};

fn main() -> ExitCode {
    memory::return_large_blocks_to_the_os();
    let args = Args::parse_flags();
    if let Err(code) = check(&args) {
        return code;
    }
    // Held past the runtime's end: dropping it writes the buffered info lines.
    let _log = match logging::init(&args.log) {
        Ok(guard) => guard,
        Err(error) => {
            eprintln!("csi-provisioner: {error}");
            return ExitCode::FAILURE;
        }
    };
    // One thread runs every task: the sidecar waits on the API server and the driver far more
    // than it computes, and with a worker per core a third of its CPU went to waking and parking
    // threads for each response (docs/benchmarks.md, "CPU per provision").
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(app::run(args)),
        Err(error) => {
            eprintln!("csi-provisioner: cannot start the async runtime: {error}");
            ExitCode::FAILURE
        }
    }
}

/// What ends the process before anything starts: `--version`, and flags that are not
/// accepted (one line each on stderr, exit 1).
fn check(args: &Args) -> Result<(), ExitCode> {
    // Before `--version`, as upstream.
    if let Err(error) = args
        .node_deployment
        .node_name(std::env::var("NODE_NAME").ok())
    {
        eprintln!("csi-provisioner: {error}");
        return Err(ExitCode::FAILURE);
    }
    if args.version {
        println!(
            "{}",
            version_line(&std::env::args().next().unwrap_or_default())
        );
        return Err(ExitCode::SUCCESS);
    }
    if let Err(error) = args.validate() {
        eprintln!("csi-provisioner: {error}");
        return Err(ExitCode::FAILURE);
    }
    Ok(())
}
