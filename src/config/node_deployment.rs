//! Distributed (per-node) deployment flags (refused: node deployment is not built).

use std::time::Duration;

use clap::ArgAction;

use super::error::{ConfigError, not_after};
use super::go::{parse_go_bool, parse_go_duration};

#[derive(Debug, Clone, clap::Args)]
pub struct NodeDeploymentArgs {
    /// One provisioner per node (needs env NODE_NAME).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub node_deployment: bool,

    /// Node instances race to own Immediate-binding PVCs.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "true", default_missing_value = "true", value_parser = parse_go_bool)]
    pub node_deployment_immediate_binding: bool,

    /// Initial wait before trying to own an Immediate PVC.
    #[arg(long, default_value = "20s", value_parser = parse_go_duration)]
    pub node_deployment_base_delay: Duration,

    /// Cap of the per-PVC ownership backoff.
    #[arg(long, default_value = "60s", value_parser = parse_go_duration)]
    pub node_deployment_max_delay: Duration,
}

impl NodeDeploymentArgs {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        not_after(
            (
                "node-deployment-base-delay",
                self.node_deployment_base_delay,
            ),
            ("node-deployment-max-delay", self.node_deployment_max_delay),
        )
    }
}
