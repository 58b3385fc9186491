//! Log setup from `-v` and `--logging-format`, written to stderr like klog.
//!
//! Verbosity mapping (upstream uses klog levels; these are the nearest tracing filters):
//!
//! | `-v`  | filter |
//! |-------|--------|
//! | ≤ 0   | `info` everywhere |
//! | 1–3   | `info`, this crate at `debug` (decisions, retries, state changes) |
//! | 4     | as 1–3, plus `kube_client=debug`: one line per API request and response status |
//! | 5     | `debug` everywhere, this crate and kube at `trace` (CSI request/response payloads, secrets redacted), noisy transport crates (h2, hyper, rustls, tower) kept at `info` |
//! | ≥ 6   | `trace` everywhere |
//!
//! The environment variable `RUST_LOG`, when set, replaces the filter (ours; upstream has
//! `--vmodule` for per-file levels instead, which the sidecar refuses: it is not built).

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::config::{LogArgs, LoggingFormat};

#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    #[error("invalid RUST_LOG filter: {0}")]
    Filter(#[from] tracing_subscriber::filter::ParseError),
    #[error("cannot install the log subscriber: {0}")]
    Install(String),
}

/// The filter directives for a `-v` level.
pub fn filter_directives(verbosity: i32) -> &'static str {
    match verbosity {
        i32::MIN..=0 => "info",
        1..=3 => "info,csi_provisioner=debug",
        4 => "info,csi_provisioner=debug,kube_client=debug",
        5 => {
            "debug,csi_provisioner=trace,kube_client=trace,kube_runtime=trace,\
             h2=info,hyper=info,hyper_util=info,rustls=info,tower=info"
        }
        _ => "trace",
    }
}

/// Chooses `RUST_LOG` when set and non-empty, otherwise the `-v` mapping.
fn env_filter(verbosity: i32, rust_log: Option<&str>) -> Result<EnvFilter, LoggingError> {
    let directives = rust_log
        .filter(|s| !s.trim().is_empty())
        .unwrap_or(filter_directives(verbosity));
    Ok(EnvFilter::builder().parse(directives)?)
}

/// Installs the global subscriber from `-v` and `--logging-format`; call once, first thing
/// in main.
pub fn init(args: &LogArgs) -> Result<(), LoggingError> {
    let rust_log = std::env::var("RUST_LOG").ok();
    let filter = env_filter(args.verbosity, rust_log.as_deref())?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only for a terminal: container logs are read by log collectors.
        .with_ansi(std::io::stderr().is_terminal());
    let installed = match args.logging_format {
        LoggingFormat::Text => builder.try_init(),
        LoggingFormat::Json => builder.json().try_init(),
    };
    installed.map_err(|e| LoggingError::Install(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_level_maps_to_a_valid_filter() {
        for v in [-1, 0, 1, 2, 3, 4, 5, 6, 10] {
            assert!(env_filter(v, None).is_ok(), "-v={v}");
        }
        assert_eq!(filter_directives(0), "info");
        assert_eq!(filter_directives(-3), "info");
        assert_eq!(filter_directives(2), "info,csi_provisioner=debug");
        assert!(filter_directives(4).contains("kube_client=debug"));
        assert!(filter_directives(5).contains("csi_provisioner=trace"));
        assert_eq!(filter_directives(9), "trace");
    }

    #[test]
    fn rust_log_overrides_verbosity() {
        let f = env_filter(0, Some("csi_provisioner::leader=trace")).expect("valid");
        assert!(f.to_string().contains("csi_provisioner::leader=trace"));
        let f = env_filter(2, Some("  ")).expect("blank RUST_LOG is ignored");
        assert!(f.to_string().contains("csi_provisioner=debug"));
        assert!(matches!(
            env_filter(0, Some("a=b=c")),
            Err(LoggingError::Filter(_))
        ));
    }
}
