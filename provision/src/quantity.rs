//! Kubernetes resource quantities as byte counts.
//!
//! Grammar (apimachinery): `[+-]` digits with an optional `.` fraction (`1`, `1.5`, `1.`,
//! `.5`), then one suffix: binary `Ki Mi Gi Ti Pi Ei`, decimal `n u m k M G T P E`, or an
//! exponent `e`/`E` with an optional sign and digits. The value is computed exactly on the
//! decimal digits and rounded up to whole bytes, so no input can lose precision or overflow
//! silently.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use thiserror::Error;

/// Powers of 1024 in BinarySI order.
const BINARY_SUFFIXES: [&str; 6] = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];

/// Why a quantity is not a byte count.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum QuantityError {
    /// Not a quantity at all.
    #[error("invalid quantity {value:?}: {reason}")]
    Invalid { value: String, reason: &'static str },
    /// A size below zero.
    #[error("quantity {value:?} is negative")]
    Negative { value: String },
    /// More bytes than an `int64` holds (the type of CSI's `required_bytes`).
    #[error("quantity {value:?} is larger than {max} bytes", max = i64::MAX)]
    TooLarge { value: String },
}

/// The claim's `spec.resources.requests.storage` in bytes, rounded up; 0 when absent.
pub fn requested_bytes(pvc: &PersistentVolumeClaim) -> Result<i64, QuantityError> {
    pvc.spec
        .as_ref()
        .and_then(|spec| spec.resources.as_ref())
        .and_then(|resources| resources.requests.as_ref())
        .and_then(|requests| requests.get("storage"))
        .map_or(Ok(0), |quantity| parse_quantity_bytes(&quantity.0))
}

/// Parses a quantity into bytes, rounding any fraction of a byte up.
pub fn parse_quantity_bytes(value: &str) -> Result<i64, QuantityError> {
    let invalid = |reason| QuantityError::Invalid {
        value: value.to_owned(),
        reason,
    };
    let (negative, unsigned) = match value.as_bytes().first() {
        None => return Err(invalid("empty")),
        Some(b'-') => (true, &value[1..]),
        Some(b'+') => (false, &value[1..]),
        Some(_) => (false, value),
    };
    let int_end = unsigned
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(unsigned.len());
    let (int_digits, rest) = unsigned.split_at(int_end);
    let (frac_digits, suffix) = match rest.strip_prefix('.') {
        Some(after_dot) => {
            let frac_end = after_dot
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(after_dot.len());
            after_dot.split_at(frac_end)
        }
        None => ("", rest),
    };
    if int_digits.is_empty() && frac_digits.is_empty() {
        return Err(invalid("no digits"));
    }
    let (exp10, exp2) = suffix_exponents(suffix).ok_or_else(|| invalid("unknown suffix"))?;

    let significant = format!("{int_digits}{frac_digits}");
    let significant = significant.trim_start_matches('0');
    if significant.is_empty() {
        return Ok(0);
    }
    if negative {
        return Err(QuantityError::Negative {
            value: value.to_owned(),
        });
    }
    // value = significant × 2^exp2 × 10^(exp10 - frac_len)
    let frac_len = i64::try_from(frac_digits.len()).unwrap_or(i64::MAX);
    let exp10 = exp10.saturating_sub(frac_len);
    let digits = times_power_of_two(significant, exp2);
    ceil_scaled(&digits, exp10).ok_or_else(|| QuantityError::TooLarge {
        value: value.to_owned(),
    })
}

/// The BinarySI text of a byte count: the largest exact binary unit (`1Gi`, `1536Mi`), else
/// plain bytes (`1000`), as Kubernetes would print it.
pub fn format_binary_si(bytes: i64) -> String {
    if bytes <= 0 || bytes % 1024 != 0 {
        return bytes.to_string();
    }
    let mut amount = bytes;
    let mut unit = 0;
    while unit < BINARY_SUFFIXES.len() && amount % 1024 == 0 {
        amount /= 1024;
        unit += 1;
    }
    format!("{amount}{}", BINARY_SUFFIXES[unit - 1])
}

/// `(power of ten, power of two)` a suffix multiplies by; `None` if it is not a suffix.
fn suffix_exponents(suffix: &str) -> Option<(i64, u32)> {
    let decimal = match suffix {
        "" => Some(0),
        "n" => Some(-9),
        "u" => Some(-6),
        "m" => Some(-3),
        "k" => Some(3),
        "M" => Some(6),
        "G" => Some(9),
        "T" => Some(12),
        "P" => Some(15),
        "E" => Some(18),
        _ => None,
    };
    if let Some(exp10) = decimal {
        return Some((exp10, 0));
    }
    if let Some(unit) = BINARY_SUFFIXES.iter().position(|s| *s == suffix) {
        let exp2 = 10 * (u32::try_from(unit).ok()? + 1);
        return Some((0, exp2));
    }
    // `E` alone is exa (handled above); `e`/`E` followed by digits is an exponent.
    let exponent = suffix.strip_prefix(['e', 'E'])?;
    let (negative, digits) = match exponent.as_bytes().first()? {
        b'-' => (true, &exponent[1..]),
        b'+' => (false, &exponent[1..]),
        _ => (false, exponent),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Saturating: past a few dozen the result is 0, 1 or "too large" all the same.
    let magnitude = digits.bytes().fold(0i64, |acc, b| {
        acc.saturating_mul(10).saturating_add(i64::from(b - b'0'))
    });
    Some((if negative { -magnitude } else { magnitude }, 0))
}

/// The decimal digits (least significant first) of `digits × 2^exp2`; `digits` are ASCII
/// decimal digits, most significant first, and `exp2 <= 60`.
fn times_power_of_two(digits: &str, exp2: u32) -> Vec<u8> {
    let factor = 1u128 << exp2;
    let mut product = Vec::with_capacity(digits.len() + 20);
    let mut carry = 0u128;
    for digit in digits.bytes().rev() {
        let v = u128::from(digit - b'0') * factor + carry;
        product.push((v % 10) as u8);
        carry = v / 10;
    }
    while carry > 0 {
        product.push((carry % 10) as u8);
        carry /= 10;
    }
    product
}

/// `ceil(digits × 10^exp10)` as an i64, `None` on overflow. `digits` is least significant first
/// with a non-zero most significant digit.
fn ceil_scaled(digits: &[u8], exp10: i64) -> Option<i64> {
    let (integer, fraction): (&[u8], &[u8]) = if exp10 >= 0 {
        (digits, &[])
    } else {
        match usize::try_from(exp10.unsigned_abs()) {
            Ok(shift) if shift < digits.len() => (&digits[shift..], &digits[..shift]),
            // All digits are below the decimal point.
            _ => (&[], digits),
        }
    };
    let mut value = integer.iter().rev().try_fold(0i64, |acc, d| {
        acc.checked_mul(10)?.checked_add(i64::from(*d))
    })?;
    if exp10 > 0 {
        let scale = u32::try_from(exp10)
            .ok()
            .and_then(|e| 10i64.checked_pow(e))?;
        value = value.checked_mul(scale)?;
    }
    if fraction.iter().any(|d| *d != 0) {
        value = value.checked_add(1)?;
    }
    Some(value)
}

#[cfg(test)]
mod tests;
