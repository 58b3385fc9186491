//! `csi-provisioner`: parse flags, set up logging, run; see `csi_provisioner::app`.

use std::process::ExitCode;

use csi_provisioner::config::{Args, version_line};
use csi_provisioner::{app, logging};

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse_flags();
    if args.version {
        println!(
            "{}",
            version_line(&std::env::args().next().unwrap_or_default())
        );
        return ExitCode::SUCCESS;
    }
    if let Err(error) = logging::init(args.verbosity, args.logging_format) {
        eprintln!("csi-provisioner: {error}");
        return ExitCode::FAILURE;
    }
    if let Err(error) = args.validate() {
        eprintln!("csi-provisioner: {error}");
        return ExitCode::FAILURE;
    }
    for flag in args.not_built_yet_in_use() {
        tracing::warn!(flag, "flag accepted, but its behaviour is not built yet");
    }
    app::run(args).await
}
