//! Kubernetes name rules (DNS-1123), checked before a name reaches the API server so a bad
//! name is reported up front instead of as a rejected create after the driver did its work.

const LABEL_MAX: usize = 63;
const SUBDOMAIN_MAX: usize = 253;

/// Why `value` is not a DNS-1123 label (namespace names), or `None` when it is one.
pub fn dns1123_label_problem(value: &str) -> Option<&'static str> {
    if value.len() > LABEL_MAX {
        return Some("must be no more than 63 characters");
    }
    if !is_label(value) {
        return Some(
            "must consist of lower case alphanumeric characters or '-', and must start and end \
             with an alphanumeric character",
        );
    }
    None
}

/// Why `value` is not a DNS-1123 subdomain (Secret and PV names), or `None` when it is one.
pub fn dns1123_subdomain_problem(value: &str) -> Option<&'static str> {
    if value.len() > SUBDOMAIN_MAX {
        return Some("must be no more than 253 characters");
    }
    if !value.split('.').all(is_label) {
        return Some(
            "must consist of lower case alphanumeric characters, '-' or '.', and must start and \
             end with an alphanumeric character",
        );
    }
    None
}

/// Why `value` is not a Kubernetes qualified name (a label or annotation key: an optional
/// DNS-1123 subdomain prefix and `/`, then a name of at most 63 characters of alphanumerics,
/// `-`, `_` and `.`, starting and ending with an alphanumeric), or `None` when it is one. The
/// prefix is checked in lower case, as the API server checks annotation keys.
pub fn qualified_name_problem(value: &str) -> Option<&'static str> {
    let (prefix, name) = match value.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, value),
    };
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            return Some("prefix part must be non-empty");
        }
        if dns1123_subdomain_problem(&prefix.to_ascii_lowercase()).is_some() {
            return Some("prefix part must be a DNS-1123 subdomain");
        }
    }
    if name.is_empty() {
        return Some("name part must be non-empty");
    }
    if name.len() > LABEL_MAX {
        return Some("name part must be no more than 63 characters");
    }
    let bytes = name.as_bytes();
    let edge = |b: &u8| b.is_ascii_alphanumeric();
    let inner = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.');
    let well_formed = bytes.first().is_some_and(edge)
        && bytes.last().is_some_and(edge)
        && bytes.iter().all(inner);
    if !well_formed {
        return Some(
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start \
             and end with an alphanumeric character",
        );
    }
    None
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, without the length limit.
fn is_label(value: &str) -> bool {
    let bytes = value.as_bytes();
    let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            alnum(first) && alnum(last) && bytes.iter().all(|b| alnum(b) || *b == b'-')
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_lowercase_alphanumerics_and_inner_dashes() {
        for ok in ["a", "default", "kube-system", "0", "a-0-b"] {
            assert_eq!(dns1123_label_problem(ok), None, "{ok}");
        }
        for bad in ["", "-a", "a-", "A", "a.b", "a_b", "ä"] {
            assert!(dns1123_label_problem(bad).is_some(), "{bad}");
        }
        assert_eq!(dns1123_label_problem(&"a".repeat(63)), None);
        assert_eq!(
            dns1123_label_problem(&"a".repeat(64)),
            Some("must be no more than 63 characters")
        );
    }

    #[test]
    fn qualified_names_are_an_optional_subdomain_prefix_and_a_name() {
        for ok in [
            "team",
            "Team_1.x",
            "example.com/team",
            "Example.COM/cost-center",
            "a/b",
        ] {
            assert_eq!(qualified_name_problem(ok), None, "{ok}");
        }
        for bad in [
            "",
            "/a",
            "a/",
            "a/b/c",
            "-a",
            "a-",
            "a b",
            "ex_ample.com/a",
            "a*",
        ] {
            assert!(qualified_name_problem(bad).is_some(), "{bad}");
        }
        assert_eq!(qualified_name_problem(&"a".repeat(63)), None);
        assert_eq!(
            qualified_name_problem(&"a".repeat(64)),
            Some("name part must be no more than 63 characters")
        );
    }

    #[test]
    fn subdomains_are_dot_separated_labels_up_to_253_characters() {
        for ok in ["a", "my-secret", "a.b.c", "pvc-1234"] {
            assert_eq!(dns1123_subdomain_problem(ok), None, "{ok}");
        }
        for bad in ["", ".a", "a.", "a..b", "A", "a/b", "$x"] {
            assert!(dns1123_subdomain_problem(bad).is_some(), "{bad}");
        }
        // Unlike a label, a subdomain's parts are not limited to 63 characters each.
        assert_eq!(dns1123_subdomain_problem(&"a".repeat(253)), None);
        assert_eq!(
            dns1123_subdomain_problem(&"a".repeat(254)),
            Some("must be no more than 253 characters")
        );
    }
}
