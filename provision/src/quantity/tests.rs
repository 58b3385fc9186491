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
    let too_large = |v: &str| format!("quantity {v:?} is larger than 9223372036854775807 bytes");
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
