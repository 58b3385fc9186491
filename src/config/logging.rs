//! Logging flags (the names of Kubernetes' component-base logs API; see src/logging/ for what
//! they do here).

use std::time::Duration;

use clap::{ArgAction, ValueEnum};

use super::error::{ConfigError, positive_duration};
use super::go::{parse_go_bool, parse_go_duration};

#[derive(Debug, Clone, clap::Args)]
pub struct LogArgs {
    /// Log format.
    #[arg(long, value_enum, default_value_t = LoggingFormat::Text)]
    pub logging_format: LoggingFormat,

    /// Maximum time between flushes of buffered info messages (see the info buffer sizes).
    #[arg(long, default_value = "5s", value_parser = parse_go_duration)]
    pub log_flush_frequency: Duration,

    /// Log verbosity (see src/logging/verbosity.rs for the mapping to log levels).
    #[arg(short = 'v', long = "v", default_value_t = 0, value_name = "LEVEL")]
    pub verbosity: i32,

    /// Per-file verbosity `pattern=N,...` (text format only; repeatable, occurrences add up):
    /// glob patterns matched against the Rust source file name without `.rs`.
    #[arg(long, action = ArgAction::Append, value_parser = parse_vmodule)]
    pub vmodule: Vec<VModule>,

    /// Alpha (needs --feature-gates=LoggingAlphaOptions=true): in text format, info messages
    /// to stdout, warnings and errors to stderr.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub log_text_split_stream: bool,

    /// Alpha: in text format with split streams, buffer up to this many bytes of info
    /// messages (quantity: 512, 1k, 2Ki, 5Mi); 0 disables buffering.
    #[arg(long, default_value = "0", value_parser = parse_quantity)]
    pub log_text_info_buffer_size: i64,

    /// Alpha (needs --feature-gates=LoggingAlphaOptions=true): in JSON format, errors to
    /// stderr, every other message to stdout.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub log_json_split_stream: bool,

    /// Alpha: in JSON format with split streams, buffer up to this many bytes of info
    /// messages (quantity: 512, 1k, 2Ki, 5Mi); 0 disables buffering.
    #[arg(long, default_value = "0", value_parser = parse_quantity)]
    pub log_json_info_buffer_size: i64,
}

/// `--logging-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LoggingFormat {
    Text,
    Json,
}

/// One occurrence of `--vmodule`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VModule(pub Vec<VModuleItem>);

/// `pattern=N` of `--vmodule`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VModuleItem {
    pub pattern: String,
    pub level: u32,
}

/// The largest info buffer; upstream caps it there too.
const MAX_INFO_BUFFER: i64 = 2 * 1024 * 1024 * 1024;

/// Upstream's option path of each alpha logging flag, for its error text.
const ALPHA_OPTIONS: [(&str, &str); 4] = [
    ("log-text-split-stream", "options.text.splitStream"),
    ("log-text-info-buffer-size", "options.text.infoBufferSize"),
    ("log-json-split-stream", "options.json.splitStream"),
    ("log-json-info-buffer-size", "options.json.infoBufferSize"),
];

impl LogArgs {
    /// Every `pattern=N` of every `--vmodule`, in order (the first match wins).
    pub fn vmodule_items(&self) -> Vec<VModuleItem> {
        self.vmodule
            .iter()
            .flat_map(|v| v.0.iter().cloned())
            .collect()
    }

    /// Whether info messages go to stdout and errors to stderr (the flag of the chosen format).
    pub fn split_stream(&self) -> bool {
        match self.logging_format {
            LoggingFormat::Text => self.log_text_split_stream,
            LoggingFormat::Json => self.log_json_split_stream,
        }
    }

    /// Bytes of info messages to buffer with split streams; 0 for none.
    pub fn info_buffer_size(&self) -> usize {
        let size = match self.logging_format {
            LoggingFormat::Text => self.log_text_info_buffer_size,
            LoggingFormat::Json => self.log_json_info_buffer_size,
        };
        usize::try_from(size.clamp(0, MAX_INFO_BUFFER)).unwrap_or(0)
    }

    /// Upstream's checks of the logging configuration. The alpha options need the
    /// LoggingAlphaOptions gate, as in component-base; upstream v6.3 never hands its
    /// `--feature-gates` to that check, so there they are refused whatever the gates.
    pub fn validate(&self, logging_alpha_options: bool) -> Result<(), ConfigError> {
        positive_duration("log-flush-frequency", self.log_flush_frequency)?;
        if !self.vmodule_items().is_empty() && self.logging_format != LoggingFormat::Text {
            return Err(ConfigError::Invalid {
                flag: "vmodule",
                reason: "Forbidden: Only supported for text log format".into(),
            });
        }
        let given = [
            self.log_text_split_stream,
            self.log_text_info_buffer_size != 0,
            self.log_json_split_stream,
            self.log_json_info_buffer_size != 0,
        ];
        if logging_alpha_options {
            return Ok(());
        }
        match ALPHA_OPTIONS.iter().zip(given).find(|(_, given)| *given) {
            Some(((flag, option), _)) => Err(ConfigError::Invalid {
                flag,
                reason: format!(
                    "{option}: Forbidden: Feature LoggingAlphaOptions is disabled \
                     (enable it with --feature-gates=LoggingAlphaOptions=true)"
                ),
            }),
            None => Ok(()),
        }
    }
}

/// `pattern=N,...` like component-base's `--vmodule`: empty items are skipped, N is an
/// unsigned 31-bit level.
pub fn parse_vmodule(s: &str) -> Result<VModule, String> {
    let mut items = Vec::new();
    for item in s.split(',').filter(|i| !i.is_empty()) {
        let (pattern, level) = match item.split('=').collect::<Vec<_>>()[..] {
            [pattern, level] if !pattern.is_empty() && !level.is_empty() => (pattern, level),
            _ => return Err(format!("{item:?} does not have the pattern=N format")),
        };
        let level = level
            .parse::<u32>()
            .ok()
            .filter(|l| i32::try_from(*l).is_ok())
            .ok_or_else(|| {
                format!("parsing verbosity in {item:?}: {level:?} is not 0..=2147483647")
            })?;
        items.push(VModuleItem {
            pattern: pattern.to_owned(),
            level,
        });
    }
    Ok(VModule(items))
}

/// A Kubernetes quantity (`512`, `1k` = 1000, `2Ki` = 1024, `1.5Mi`, `1e3`) as a whole number,
/// rounded up away from zero as `Quantity.Value()` does.
pub fn parse_quantity(s: &str) -> Result<i64, String> {
    let bad = || format!("{s:?} is not a quantity like 512, 1k, 2Ki, 5Mi or 1e3");
    let split = s
        .char_indices()
        .find(|(i, c)| !(c.is_ascii_digit() || *c == '.' || (*i == 0 && "+-".contains(*c))))
        .map_or(s.len(), |(i, _)| i);
    let (number, suffix) = s.split_at(split);
    let number: f64 = number.parse().map_err(|_| bad())?;
    let scale = match suffix {
        "" => 1.0,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        exponent => {
            let digits = exponent
                .strip_prefix(['e', 'E'])
                .filter(|d| !d.is_empty())
                .ok_or_else(bad)?;
            10f64.powi(digits.parse().map_err(|_| bad())?)
        }
    };
    let value = number * scale;
    let rounded = value.abs().ceil().copysign(value);
    // `as` saturates; the info buffer is capped far below i64::MAX anyway.
    Ok(rounded as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_follow_kubernetes() {
        for (text, value) in [
            ("0", 0),
            ("512", 512),
            ("1k", 1000),
            ("2Ki", 2048),
            ("3M", 3_000_000),
            ("5Mi", 5 * 1024 * 1024),
            ("6Gi", 6 * 1024 * 1024 * 1024),
            ("1.5Ki", 1536),
            ("1e3", 1000),
            ("1E3", 1000),
            ("+7", 7),
            ("1.1", 2),
            ("500m", 1),
            ("-1.5", -2),
        ] {
            assert_eq!(parse_quantity(text), Ok(value), "{text}");
        }
        for text in ["", "1K", "Ki", "1KB", "1.2.3", "1e", "1 Ki", "x"] {
            assert!(parse_quantity(text).is_err(), "{text:?}");
        }
    }

    #[test]
    fn vmodule_follows_component_base() {
        assert_eq!(
            parse_vmodule("claim=5,,cap*=3,"),
            Ok(VModule(vec![
                VModuleItem {
                    pattern: "claim".into(),
                    level: 5
                },
                VModuleItem {
                    pattern: "cap*".into(),
                    level: 3
                },
            ]))
        );
        assert_eq!(parse_vmodule(""), Ok(VModule(vec![])));
        for bad in [
            "claim",
            "=3",
            "claim=",
            "a=b=3",
            "claim=-1",
            "claim=x",
            "c=2147483648",
        ] {
            assert!(parse_vmodule(bad).is_err(), "{bad:?}");
        }
    }
}
