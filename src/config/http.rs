//! Flags of the diagnostics HTTP server (metrics, leader-election health).

use clap::ArgAction;

use super::error::ConfigError;
use super::go::parse_go_bool;

/// The leader-election health path; `--metrics-path` must not take it.
pub const LEADER_HEALTH_PATH: &str = "/healthz/leader-election";

#[derive(Debug, Clone, clap::Args)]
pub struct HttpArgs {
    /// `host:port` of the HTTP server (metrics, /healthz/leader-election). Empty = no server.
    #[arg(long, default_value = "")]
    pub http_endpoint: String,

    /// Deprecated alias of --http-endpoint without the leader-election health path.
    #[arg(long, default_value = "")]
    pub metrics_address: String,

    /// HTTP path of the metrics.
    #[arg(long, default_value = "/metrics")]
    pub metrics_path: String,

    /// Serve /debug/pprof/ (CPU profile, heap statistics) on the metrics server.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub enable_pprof: bool,
}

impl HttpArgs {
    /// `leader_election`: whether the health path is served, so the metrics cannot take it.
    pub(super) fn validate(&self, leader_election: bool) -> Result<(), ConfigError> {
        if !self.http_endpoint.is_empty() && !self.metrics_address.is_empty() {
            return Err(ConfigError::EndpointConflict);
        }
        for (flag, value) in [
            ("http-endpoint", &self.http_endpoint),
            ("metrics-address", &self.metrics_address),
        ] {
            if !value.is_empty() && !has_port(value) {
                return Err(ConfigError::Invalid {
                    flag,
                    reason: format!("{value:?} is not of the form host:port or :port"),
                });
            }
        }
        if !self.metrics_path.starts_with('/') {
            return Err(ConfigError::OutOfRange {
                flag: "metrics-path",
                value: self.metrics_path.clone(),
                expected: "a path starting with '/'",
            });
        }
        if leader_election && self.metrics_path == LEADER_HEALTH_PATH {
            return Err(ConfigError::Invalid {
                flag: "metrics-path",
                reason: format!("{} is the leader-election health path", self.metrics_path),
            });
        }
        Ok(())
    }
}

fn has_port(addr: &str) -> bool {
    addr.rsplit_once(':')
        .is_some_and(|(_, port)| port.parse::<u16>().is_ok())
}
