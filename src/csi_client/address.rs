//! `--csi-address` parsing.

use std::path::PathBuf;

use super::error::Error;

const UNIX_SCHEME: &str = "unix://";

/// Turns `--csi-address` into the path of the driver's unix domain socket.
///
/// Accepted, as by csi-lib-utils: an absolute path (`/run/csi/socket`) or `unix://` followed by
/// the path (`unix:///run/csi/socket`). Everything else (TCP, DNS targets, relative paths) is
/// rejected with an error that says what to give instead.
pub fn parse_csi_address(address: &str) -> Result<PathBuf, Error> {
    if address.starts_with('/') {
        return Ok(PathBuf::from(address));
    }
    if let Some(path) = address.strip_prefix(UNIX_SCHEME) {
        // Go's dialer takes whatever follows `unix://` as the path; so do we.
        return if path.is_empty() {
            Err(Error::EmptyAddress {
                address: address.to_string(),
            })
        } else {
            Ok(PathBuf::from(path))
        };
    }
    if address.trim().is_empty() {
        return Err(Error::EmptyAddress {
            address: address.to_string(),
        });
    }
    match address.split_once("://") {
        Some((scheme, _)) => Err(Error::UnsupportedScheme {
            address: address.to_string(),
            scheme: scheme.to_string(),
        }),
        None => Err(Error::NotAnAddress {
            address: address.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absolute_paths_and_unix_uris_are_socket_paths() {
        for (address, path) in [
            ("/run/csi/socket", "/run/csi/socket"),
            ("unix:///run/csi/socket", "/run/csi/socket"),
            ("/csi.sock", "/csi.sock"),
            ("unix://csi.sock", "csi.sock"),
        ] {
            assert_eq!(
                parse_csi_address(address).ok(),
                Some(PathBuf::from(path)),
                "{address}"
            );
        }
    }

    #[test]
    fn other_schemes_are_rejected_by_name() {
        for (address, scheme) in [
            ("tcp://127.0.0.1:10000", "tcp"),
            ("dns:///csi.example.com:443", "dns"),
            ("http://localhost", "http"),
        ] {
            let err = parse_csi_address(address).unwrap_err();
            assert!(
                matches!(&err, Error::UnsupportedScheme { scheme: s, .. } if s == scheme),
                "{address}: {err:?}"
            );
            let text = err.to_string();
            assert!(
                text.contains(&format!("{scheme}:// is not supported")),
                "{text}"
            );
        }
    }

    #[test]
    fn empty_and_relative_addresses_are_rejected() {
        for address in ["", " ", "unix://"] {
            assert!(
                matches!(parse_csi_address(address), Err(Error::EmptyAddress { .. })),
                "{address:?}"
            );
        }
        for address in [
            "csi.sock",
            "run/csi/socket",
            "unix:/run/csi/socket",
            "localhost:10000",
        ] {
            assert!(
                matches!(parse_csi_address(address), Err(Error::NotAnAddress { .. })),
                "{address:?}"
            );
        }
    }
}
