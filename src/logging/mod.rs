//! Log setup from the logging flags: which lines (`-v`, `--vmodule`: `verbosity`), where
//! they go (`--log-*-split-stream`, `--log-*-info-buffer-size`, `--log-flush-frequency`:
//! `streams`), in which layout (`--logging-format`: tracing-subscriber's text or JSON).
//!
//! The environment variable `RUST_LOG`, when set and not blank, replaces `-v` and
//! `--vmodule` (ours; tracing's per-module filter syntax).

pub mod streams;
pub mod verbosity;

use std::io::IsTerminal;

use tracing_subscriber::layer::{Filter, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

use crate::config::{LogArgs, LoggingFormat};

pub use streams::FlushGuard;
pub use verbosity::Verbosity;

#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    #[error("invalid RUST_LOG filter: {0}")]
    Filter(#[from] tracing_subscriber::filter::ParseError),
    #[error("cannot install the log subscriber: {0}")]
    Install(String),
}

type LineFilter = Box<dyn Filter<Registry> + Send + Sync>;

/// `RUST_LOG` when set and not blank, otherwise `-v` and `--vmodule`.
fn line_filter(args: &LogArgs, rust_log: Option<&str>) -> Result<LineFilter, LoggingError> {
    Ok(match rust_log.filter(|s| !s.trim().is_empty()) {
        Some(directives) => Box::new(EnvFilter::builder().parse(directives)?),
        None => Box::new(Verbosity::new(args.verbosity, &args.vmodule_items())),
    })
}

/// Installs the global subscriber from validated logging flags; call once, first thing in
/// main, and hold the guard until the process exits (it writes the buffered info lines).
pub fn init(args: &LogArgs) -> Result<FlushGuard, LoggingError> {
    let rust_log = std::env::var("RUST_LOG").ok();
    let filter = line_filter(args, rust_log.as_deref())?;
    let split = args.split_stream();
    let outputs = streams::Outputs::new(args.logging_format, split, args.info_buffer_size());
    let guard = outputs.start_flushing(args.log_flush_frequency);
    // Colour codes only when every stream written is a terminal: container logs are read by
    // log collectors.
    let ansi = std::io::stderr().is_terminal() && (!split || std::io::stdout().is_terminal());
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(outputs)
        .with_ansi(ansi);
    let layer = match args.logging_format {
        LoggingFormat::Text => layer.with_filter(filter).boxed(),
        LoggingFormat::Json => layer.json().with_filter(filter).boxed(),
    };
    tracing_subscriber::registry()
        .with(layer)
        .try_init()
        .map_err(|e| LoggingError::Install(e.to_string()))?;
    Ok(guard)
}

#[cfg(test)]
mod tests {
    use tracing::level_filters::LevelFilter;

    use super::*;
    use crate::config::Args;

    fn log_args(flags: &[&str]) -> LogArgs {
        Args::parse_flags_from(std::iter::once("csi-provisioner").chain(flags.iter().copied()))
            .expect("valid flags")
            .log
    }

    #[test]
    fn rust_log_replaces_verbosity_and_vmodule() {
        let args = log_args(&["-v=2", "--vmodule=claim=5"]);
        let hint = |rust_log| {
            let filter = line_filter(&args, rust_log).expect("valid filter");
            Filter::<Registry>::max_level_hint(&*filter)
        };
        assert_eq!(hint(Some("warn")), Some(LevelFilter::WARN));
        assert_eq!(
            hint(Some("  ")),
            Some(LevelFilter::TRACE),
            "blank RUST_LOG is ignored"
        );
        assert_eq!(hint(None), Some(LevelFilter::TRACE));
        assert!(matches!(
            line_filter(&args, Some("a=b=c")),
            Err(LoggingError::Filter(_))
        ));
    }
}
