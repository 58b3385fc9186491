//! Free loopback ports chosen at run time, so several test binaries can each run a control plane
//! at once. The kernel hands out an unused port for `127.0.0.1:0`; between dropping our listener
//! and the child binding it another process may take it, which the caller detects ("address
//! already in use" in the child's log) and answers by retrying with fresh ports.

use std::net::{Ipv4Addr, TcpListener};

use crate::error::Error;

/// `n` distinct free ports: all listeners stay open until every port is chosen.
pub fn free_ports(n: usize) -> Result<Vec<u16>, Error> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(Error::FreePorts)?;
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(Error::FreePorts)
}

/// The bind failure Go programs log when a port is taken, in the wording of `syscall.EADDRINUSE`.
pub fn log_says_port_taken(log: &str) -> bool {
    log.contains("address already in use")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_and_nonzero() {
        let ports = free_ports(3).expect("ports");
        assert_eq!(ports.len(), 3);
        assert!(ports.iter().all(|p| *p != 0));
        assert!(ports[0] != ports[1] && ports[1] != ports[2] && ports[0] != ports[2]);
    }

    #[test]
    fn recognises_go_bind_error() {
        assert!(log_says_port_taken(
            "failed to listen on 127.0.0.1:6443: listen tcp 127.0.0.1:6443: bind: address already in use"
        ));
        assert!(!log_says_port_taken("serving securely on 127.0.0.1:6443"));
    }
}
