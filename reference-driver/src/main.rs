//! The reference CSI driver used by the provisioner's tests and by hack/csi-sanity.sh.
//! See docs/reference-driver.md for flags, fault injection and the state layout.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use csi_reference_driver::{Cli, DriverConfig, run, termination_signal};
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    // clap prints usage errors naming the flag and exits with status 2.
    let cli = Cli::parse();
    let config = match DriverConfig::try_from(cli) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("csi-reference-driver: {error}");
            return ExitCode::from(2);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("csi-reference-driver: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let shutdown = termination_signal()?;
        run(&config, shutdown).await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("csi-reference-driver: {error}");
            ExitCode::FAILURE
        }
    }
}
