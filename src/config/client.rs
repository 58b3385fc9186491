//! Flags of the Kubernetes API client.

use super::error::ConfigError;

#[derive(Debug, Clone, clap::Args)]
pub struct ClientArgs {
    /// Path to a kubeconfig file (out-of-cluster). Env KUBECONFIG, if set, overrides it.
    #[arg(long, default_value = "")]
    pub kubeconfig: String,

    /// API server URL (out-of-cluster).
    #[arg(long, default_value = "")]
    pub master: String,

    /// Client-side queries per second towards the API server (0 = 5, negative = unlimited).
    #[arg(long, default_value_t = 5.0)]
    pub kube_api_qps: f64,

    /// Client-side burst towards the API server (0 = 10).
    #[arg(long, default_value_t = 10)]
    pub kube_api_burst: i32,
}

impl ClientArgs {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if !self.kube_api_qps.is_finite() {
            return Err(ConfigError::OutOfRange {
                flag: "kube-api-qps",
                value: self.kube_api_qps.to_string(),
                expected: "a finite number",
            });
        }
        if self.kube_api_burst < 0 {
            return Err(ConfigError::OutOfRange {
                flag: "kube-api-burst",
                value: self.kube_api_burst.to_string(),
                expected: "0 or more",
            });
        }
        Ok(())
    }
}
