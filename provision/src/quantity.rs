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
mod tests {
    use super::*;
    use crate::fixtures::PvcBuilder;

    fn bytes(value: &str) -> i64 {
        match parse_quantity_bytes(value) {
            Ok(bytes) => bytes,
            Err(error) => panic!("{value}: {error}"),
        }
    }

    fn err(value: &str) -> String {
        match parse_quantity_bytes(value) {
            Ok(bytes) => panic!("{value}: expected an error, got {bytes}"),
            Err(error) => error.to_string(),
        }
    }

    #[test]
    fn plain_numbers_are_bytes() {
        assert_eq!(bytes("0"), 0);
        assert_eq!(bytes("1"), 1);
        assert_eq!(bytes("+42"), 42);
        assert_eq!(bytes("007"), 7);
        assert_eq!(bytes("9223372036854775807"), i64::MAX);
    }

    #[test]
    fn binary_suffixes_are_powers_of_1024() {
        assert_eq!(bytes("1Ki"), 1024);
        assert_eq!(bytes("1Mi"), 1 << 20);
        assert_eq!(bytes("5Gi"), 5 << 30);
        assert_eq!(bytes("1Ti"), 1 << 40);
        assert_eq!(bytes("1Pi"), 1 << 50);
        assert_eq!(bytes("7Ei"), 7 << 60);
    }

    #[test]
    fn decimal_suffixes_are_powers_of_1000() {
        assert_eq!(bytes("1k"), 1_000);
        assert_eq!(bytes("1M"), 1_000_000);
        assert_eq!(bytes("2G"), 2_000_000_000);
        assert_eq!(bytes("1T"), 1_000_000_000_000);
        assert_eq!(bytes("1P"), 1_000_000_000_000_000);
        assert_eq!(bytes("9E"), 9_000_000_000_000_000_000);
    }

    #[test]
    fn fractions_are_exact_and_round_up_to_whole_bytes() {
        assert_eq!(bytes("1.5Gi"), 1536 << 20);
        assert_eq!(bytes("0.5Ki"), 512);
        assert_eq!(bytes(".5k"), 500);
        assert_eq!(bytes("1."), 1);
        assert_eq!(bytes("1.1"), 2);
        assert_eq!(bytes("1.000000000000000000000000000000000000000001"), 2);
        assert_eq!(bytes("0.0000000000000000000000000000000000001Ei"), 1);
        assert_eq!(bytes("0.001Ki"), 2); // 1.024 bytes
        assert_eq!(bytes("1.0000000000000000000000000000000000000000000"), 1);
    }

    #[test]
    fn sub_unit_suffixes_round_up() {
        assert_eq!(bytes("500m"), 1);
        assert_eq!(bytes("1000m"), 1);
        assert_eq!(bytes("1001m"), 2);
        assert_eq!(bytes("1u"), 1);
        assert_eq!(bytes("3000000000n"), 3);
    }

    #[test]
    fn exponents_scale_by_powers_of_ten() {
        assert_eq!(bytes("1e3"), 1_000);
        assert_eq!(bytes("1E3"), 1_000);
        assert_eq!(bytes("1.5e+3"), 1_500);
        assert_eq!(bytes("15e-1"), 2);
        assert_eq!(bytes("1e-999999999999999999999999"), 1);
        assert_eq!(bytes("0e999999999999"), 0);
        assert_eq!(bytes("9.223372036854775807e18"), i64::MAX);
    }

    #[test]
    fn zero_in_any_form_is_zero() {
        for zero in ["0", "0Gi", "0.0", "-0", "00.000e5", ".0k"] {
            assert_eq!(bytes(zero), 0, "{zero}");
        }
    }

    #[test]
    fn negative_sizes_are_rejected() {
        assert_eq!(err("-1"), "quantity \"-1\" is negative");
        assert_eq!(err("-1Gi"), "quantity \"-1Gi\" is negative");
        assert_eq!(err("-0.001m"), "quantity \"-0.001m\" is negative");
    }

    #[test]
    fn sizes_beyond_int64_are_rejected() {
        let too_large =
            |v: &str| format!("quantity {v:?} is larger than 9223372036854775807 bytes");
        for value in [
            "9223372036854775808",
            "8Ei",
            "10E",
            "1e19",
            "1e999999999999999999999",
            "99999999999999999999999999999999999999999999Ki",
            "9223372036854775807.1",
        ] {
            assert_eq!(err(value), too_large(value));
        }
    }

    #[test]
    fn garbage_is_rejected_with_the_reason() {
        let cases = [
            ("", "empty"),
            ("Gi", "no digits"),
            ("+", "no digits"),
            (".", "no digits"),
            ("-.Ki", "no digits"),
            ("1GB", "unknown suffix"),
            ("1gi", "unknown suffix"),
            ("1K", "unknown suffix"),
            ("1 Gi", "unknown suffix"),
            (" 1", "no digits"),
            ("1Gi ", "unknown suffix"),
            ("1.2.3", "unknown suffix"),
            ("1e", "unknown suffix"),
            ("1e+", "unknown suffix"),
            ("1e1.5", "unknown suffix"),
            ("1ee3", "unknown suffix"),
            ("0x10", "unknown suffix"),
            ("1KiB", "unknown suffix"),
            ("1Gi1", "unknown suffix"),
            ("--1", "no digits"),
            ("１", "no digits"),
        ];
        for (value, reason) in cases {
            assert_eq!(err(value), format!("invalid quantity {value:?}: {reason}"));
        }
    }

    #[test]
    fn claim_request_is_read_from_storage_and_defaults_to_zero() {
        assert_eq!(
            requested_bytes(&PvcBuilder::new().storage("2Gi").build()),
            Ok(2 << 30)
        );
        assert_eq!(
            requested_bytes(&PvcBuilder::new().no_storage().build()),
            Ok(0)
        );
        assert_eq!(
            requested_bytes(&PvcBuilder::new().storage("lots").build()).map_err(|e| e.to_string()),
            Err("invalid quantity \"lots\": no digits".to_owned())
        );
    }

    /// A small deterministic generator, so the sweeps below need no extra crate.
    fn lcg(state: &mut u64) -> u64 {
        *state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        *state >> 33
    }

    #[test]
    fn arbitrary_strings_never_panic() {
        let alphabet: Vec<char> = "0123456789.+-eEkKMGTPiumn x\u{e9}".chars().collect();
        let mut state = 7;
        for _ in 0..50_000 {
            let len = lcg(&mut state) % 14;
            let text: String = (0..len)
                .map(|_| alphabet[(lcg(&mut state) as usize) % alphabet.len()])
                .collect();
            let _ = parse_quantity_bytes(&text);
        }
    }

    #[test]
    fn decimal_fractions_with_suffixes_match_exact_rational_arithmetic() {
        let suffixes: [(&str, u128, u128); 9] = [
            ("", 1, 1),
            ("m", 1, 1_000),
            ("k", 1_000, 1),
            ("M", 1_000_000, 1),
            ("G", 1_000_000_000, 1),
            ("Ki", 1 << 10, 1),
            ("Mi", 1 << 20, 1),
            ("Gi", 1 << 30, 1),
            ("Ti", 1 << 40, 1),
        ];
        let mut state = 11;
        for _ in 0..20_000 {
            let int = u128::from(lcg(&mut state) % 1_000_000);
            let frac_len = u32::try_from(lcg(&mut state) % 7).unwrap_or(0);
            let frac = u128::from(lcg(&mut state)) % 10u128.pow(frac_len);
            let (suffix, numerator, denominator) =
                suffixes[(lcg(&mut state) as usize) % suffixes.len()];
            let text = if frac_len == 0 {
                format!("{int}{suffix}")
            } else {
                format!("{int}.{frac:0width$}{suffix}", width = frac_len as usize)
            };
            let scaled = (int * 10u128.pow(frac_len) + frac) * numerator;
            let divisor = 10u128.pow(frac_len) * denominator;
            let expected = i64::try_from(scaled.div_ceil(divisor)).unwrap_or(i64::MAX);
            assert_eq!(parse_quantity_bytes(&text), Ok(expected), "{text}");
        }
    }

    #[test]
    fn byte_counts_print_in_the_largest_exact_binary_unit() {
        assert_eq!(format_binary_si(0), "0");
        assert_eq!(format_binary_si(1), "1");
        assert_eq!(format_binary_si(512), "512");
        assert_eq!(format_binary_si(1000), "1000");
        assert_eq!(format_binary_si(1_000_000_000), "1000000000");
        assert_eq!(format_binary_si(1024), "1Ki");
        assert_eq!(format_binary_si(1 << 30), "1Gi");
        assert_eq!(format_binary_si(1536 << 20), "1536Mi");
        assert_eq!(format_binary_si(1 << 62), "4Ei");
        assert_eq!(format_binary_si(i64::MAX), i64::MAX.to_string());
    }

    #[test]
    fn formatted_sizes_parse_back_to_the_same_bytes() {
        for n in [0, 1, 1023, 1024, 3 << 20, 1_000_000_007, 5 << 40, i64::MAX] {
            assert_eq!(bytes(&format_binary_si(n)), n);
        }
    }
}
