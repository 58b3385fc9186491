//! Distributed (per-node) deployment flags: `--node-deployment` and its tuning, and env
//! `NODE_NAME`.

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
    /// With `--node-deployment`, the node this sidecar serves: env `NODE_NAME` (`node_name`),
    /// which must be set and not empty. `None` without the flag.
    pub fn node_name(&self, node_name: Option<String>) -> Result<Option<String>, ConfigError> {
        if !self.node_deployment {
            return Ok(None);
        }
        match node_name.filter(|name| !name.is_empty()) {
            Some(name) => Ok(Some(name)),
            None => Err(ConfigError::NodeNameMissing),
        }
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    fn args(node_deployment: bool) -> NodeDeploymentArgs {
        NodeDeploymentArgs {
            node_deployment,
            node_deployment_immediate_binding: true,
            node_deployment_base_delay: Duration::from_secs(20),
            node_deployment_max_delay: Duration::from_secs(60),
        }
    }

    #[test]
    fn node_name_is_required_only_in_node_mode() {
        assert_eq!(args(false).node_name(None), Ok(None));
        assert_eq!(
            args(true).node_name(Some("n1".into())),
            Ok(Some("n1".into()))
        );
        for missing in [None, Some(String::new())] {
            let error = args(true).node_name(missing).unwrap_err();
            assert_eq!(
                error.to_string(),
                "The NODE_NAME environment variable must be set when using --enable-node-deployment."
            );
        }
    }
}
