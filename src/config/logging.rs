//! Logging flags (klog's names; see src/logging.rs for what they do here).

use std::time::Duration;

use clap::{ArgAction, ValueEnum};

use super::go::{parse_go_bool, parse_go_duration};

#[derive(Debug, Clone, clap::Args)]
pub struct LogArgs {
    /// Log format.
    #[arg(long, value_enum, default_value_t = LoggingFormat::Text)]
    pub logging_format: LoggingFormat,

    /// Go log flush period; accepted and ignored (our logs are not buffered).
    #[arg(long, default_value = "5s", value_parser = parse_go_duration)]
    pub log_flush_frequency: Duration,

    /// Log verbosity (see src/logging.rs for the mapping to log levels).
    #[arg(short = 'v', long = "v", default_value_t = 0, value_name = "LEVEL")]
    pub verbosity: i32,

    /// Per-file verbosity `pattern=N,...` (Go klog).
    #[arg(long, default_value = "", value_parser = parse_vmodule)]
    pub vmodule: String,

    /// Alpha: info messages to stdout, errors to stderr (text format).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub log_text_split_stream: bool,

    /// Alpha: buffer size of the info stream with split streams (text format).
    #[arg(long, default_value = "0")]
    pub log_text_info_buffer_size: String,

    /// Alpha: info messages to stdout, errors to stderr (json format).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub log_json_split_stream: bool,

    /// Alpha: buffer size of the info stream with split streams (json format).
    #[arg(long, default_value = "0")]
    pub log_json_info_buffer_size: String,
}

/// `--logging-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LoggingFormat {
    Text,
    Json,
}

/// `pattern=N,...` like klog's `--vmodule`.
pub fn parse_vmodule(s: &str) -> Result<String, String> {
    for item in s.split(',').filter(|i| !i.is_empty()) {
        match item.split_once('=') {
            Some((pattern, level)) if !pattern.is_empty() && level.parse::<i32>().is_ok() => {}
            _ => return Err(format!("{item:?} is not of the form pattern=N")),
        }
    }
    Ok(s.to_owned())
}
