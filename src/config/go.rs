//! Go-style flag syntax, as upstream's pflag parses it: single-dash long flags of Go's `flag`
//! package, `strconv.ParseBool` bools and `time.ParseDuration` durations.

use std::ffi::OsString;
use std::time::Duration;

/// Rewrites `-long-name[=v]` to `--long-name[=v]` for known long flags longer than one
/// character, leaving values of the previous flag and everything after `--` alone.
pub(super) fn normalize_single_dash(cmd: &clap::Command, argv: Vec<OsString>) -> Vec<OsString> {
    // Flags whose value may be the next argument (bools need `=`, like pflag).
    let takes_separate_value = |name: &str| {
        cmd.get_arguments().any(|a| {
            (a.get_long() == Some(name)
                || (name.len() == 1 && a.get_short() == name.chars().next()))
                && a.get_num_args().is_some_and(|n| n.min_values() > 0)
        })
    };
    let is_long = |name: &str| cmd.get_arguments().any(|a| a.get_long() == Some(name));

    let mut out = Vec::with_capacity(argv.len());
    let mut value_expected = false;
    let mut rest_positional = false;
    for (i, arg) in argv.into_iter().enumerate() {
        let Some(s) = arg
            .to_str()
            .filter(|_| i > 0 && !rest_positional && !value_expected)
        else {
            value_expected = false;
            out.push(arg);
            continue;
        };
        if s == "--" {
            rest_positional = true;
            out.push(arg);
            continue;
        }
        let (dashes, body) = if let Some(b) = s.strip_prefix("--") {
            (2, b)
        } else if let Some(b) = s.strip_prefix('-') {
            (1, b)
        } else {
            out.push(arg);
            continue;
        };
        let (name, has_value) = match body.split_once('=') {
            Some((n, _)) => (n, true),
            None => (body, false),
        };
        value_expected = !has_value && takes_separate_value(name);
        if dashes == 1 && name.len() > 1 && is_long(name) {
            out.push(OsString::from(format!("-{s}")));
        } else {
            out.push(arg);
        }
    }
    out
}

/// Go's `strconv.ParseBool`.
pub fn parse_go_bool(s: &str) -> Result<bool, String> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(format!("{s:?} is not a boolean (use true or false)")),
    }
}

/// Go's `time.ParseDuration` restricted to non-negative values: `300ms`, `1.5h`, `2h45m`,
/// units ns, us, µs, ms, s, m, h; a bare `0` is allowed.
pub fn parse_go_duration(s: &str) -> Result<Duration, String> {
    let invalid = || format!("invalid duration {s:?} (examples: 10s, 5m, 1m30s, 500ms)");
    let (negative, body) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    if body == "0" {
        return Ok(Duration::ZERO);
    }
    if body.is_empty() {
        return Err(invalid());
    }
    let mut nanos: u128 = 0;
    let mut rest = body;
    while !rest.is_empty() {
        let int_len = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let (int_part, after_int) = rest.split_at(int_len);
        let (frac_part, after_num) = match after_int.strip_prefix('.') {
            Some(f) => {
                let len = f.find(|c: char| !c.is_ascii_digit()).unwrap_or(f.len());
                f.split_at(len)
            }
            None => ("", after_int),
        };
        if int_part.is_empty() && frac_part.is_empty() {
            return Err(invalid());
        }
        let unit_len = after_num
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after_num.len());
        let (unit, after_unit) = after_num.split_at(unit_len);
        let unit_nanos: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "" => return Err(format!("missing unit in duration {s:?}")),
            _ => return Err(format!("unknown unit {unit:?} in duration {s:?}")),
        };
        let int: u128 = if int_part.is_empty() {
            0
        } else {
            int_part.parse().map_err(|_| invalid())?
        };
        // Digits beyond nanosecond resolution cannot change the result.
        let frac_digits = &frac_part[..frac_part.len().min(18)];
        let frac: u128 = if frac_digits.is_empty() {
            0
        } else {
            frac_digits.parse().map_err(|_| invalid())?
        };
        let scale = 10u128.pow(frac_digits.len() as u32);
        nanos = int
            .checked_mul(unit_nanos)
            .and_then(|n| n.checked_add(frac * unit_nanos / scale))
            .and_then(|n| n.checked_add(nanos))
            .filter(|n| *n <= i64::MAX as u128)
            .ok_or_else(|| format!("duration {s:?} is too large"))?;
        rest = after_unit;
    }
    if negative && nanos > 0 {
        return Err(format!("duration {s:?} must not be negative"));
    }
    Ok(Duration::from_nanos(nanos as u64))
}
