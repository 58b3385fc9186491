//! Why a set of well-formed flags is not accepted, and the checks every group shares. Every
//! message names the flag (or the feature gate) to change.

use std::time::Duration;

/// A flag combination or value that is well-formed but not allowed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    #[error("only one of --metrics-address and --http-endpoint can be set")]
    EndpointConflict,
    #[error("--{flag}={value}: must be {expected}")]
    OutOfRange {
        flag: &'static str,
        value: String,
        expected: &'static str,
    },
    #[error("--{flag} ({value:?}) must be {relation} --{other} ({other_value:?})")]
    Ordering {
        flag: &'static str,
        value: Duration,
        relation: &'static str,
        other: &'static str,
        other_value: Duration,
    },
    #[error("--{flag}: {reason}")]
    Invalid { flag: &'static str, reason: String },
    /// Upstream's fatal text, which names a flag that does not exist (`--node-deployment` is
    /// meant).
    #[error("The NODE_NAME environment variable must be set when using --enable-node-deployment.")]
    NodeNameMissing,
}

pub(super) fn positive_count(flag: &'static str, value: u64) -> Result<(), ConfigError> {
    if value == 0 {
        return Err(ConfigError::OutOfRange {
            flag,
            value: "0".into(),
            expected: "at least 1",
        });
    }
    Ok(())
}

pub(super) fn positive_duration(flag: &'static str, value: Duration) -> Result<(), ConfigError> {
    if value.is_zero() {
        return Err(ConfigError::OutOfRange {
            flag,
            value: "0s".into(),
            expected: "greater than 0",
        });
    }
    Ok(())
}

pub(super) fn not_after(
    (flag, value): (&'static str, Duration),
    (other, other_value): (&'static str, Duration),
) -> Result<(), ConfigError> {
    if value > other_value {
        return Err(ConfigError::Ordering {
            flag,
            value,
            relation: "at most",
            other,
            other_value,
        });
    }
    Ok(())
}
