//! Flags of the connection to the CSI driver.

use std::time::Duration;

use super::error::{ConfigError, positive_duration};
use super::go::parse_go_duration;

#[derive(Debug, Clone, clap::Args)]
pub struct DriverArgs {
    /// The gRPC endpoint of the CSI driver; a path starting with `/` means `unix://<path>`.
    #[arg(long, default_value = "/run/csi/socket")]
    pub csi_address: String,

    /// Timeout of every CSI call issued by the sidecar.
    #[arg(long, default_value = "10s", value_parser = parse_go_duration)]
    pub timeout: Duration,
}

impl DriverArgs {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        positive_duration("timeout", self.timeout)
    }
}
