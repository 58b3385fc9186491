//! Readiness probes. Each one proves the answer comes from *our* child (etcd's JSON health body;
//! a TLS handshake against this run's CA), so a foreign process that grabbed the port is never
//! mistaken for a ready component.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

pub enum Probe {
    /// etcd's plain-HTTP `/health` on its client port.
    EtcdHealth { port: u16 },
    /// A unix socket accepts connections (containerd's).
    UnixSocket { path: std::path::PathBuf },
    /// Plain-HTTP `GET path` on 127.0.0.1 answered 200 `ok` (the kubelet's healthz).
    Http { port: u16, path: &'static str },
    /// `GET path` answered `ok` over HTTPS (kube-apiserver `/readyz`, controller manager `/healthz`).
    Https {
        client: kube::Client,
        path: &'static str,
    },
}

impl Probe {
    /// `Err` describes why the component is not ready (yet).
    pub async fn check(&self) -> Result<(), String> {
        match self {
            Probe::EtcdHealth { port } => tokio::time::timeout(PROBE_TIMEOUT, etcd_health(*port))
                .await
                .map_err(|_| format!("no answer within {PROBE_TIMEOUT:?}"))?,
            Probe::UnixSocket { path } => tokio::net::UnixStream::connect(path)
                .await
                .map(drop)
                .map_err(|e| format!("connect {}: {e}", path.display())),
            Probe::Http { port, path } => {
                tokio::time::timeout(PROBE_TIMEOUT, plain_http_ok(*port, path))
                    .await
                    .map_err(|_| format!("no answer within {PROBE_TIMEOUT:?}"))?
            }
            Probe::Https { client, path } => {
                let request = http::Request::get(*path)
                    .body(Vec::new())
                    .map_err(|e| e.to_string())?;
                let body = tokio::time::timeout(PROBE_TIMEOUT, client.request_text(request))
                    .await
                    .map_err(|_| format!("no answer within {PROBE_TIMEOUT:?}"))?
                    .map_err(|e| e.to_string())?;
                if body.trim() == "ok" {
                    Ok(())
                } else {
                    Err(format!("{path} answered {:?}", body.trim()))
                }
            }
        }
    }
}

async fn etcd_health(port: u16) -> Result<(), String> {
    etcd_healthy(&http_get(port, "/health").await?)
}

async fn plain_http_ok(port: u16, path: &str) -> Result<(), String> {
    let response = http_get(port, path).await?;
    let status_ok = response
        .lines()
        .next()
        .is_some_and(|status| status.split_whitespace().nth(1) == Some("200"));
    if status_ok && response.split("\r\n\r\n").nth(1).map(str::trim) == Some("ok") {
        Ok(())
    } else {
        Err(format!(
            "{path} answered {:?}",
            response.chars().take(200).collect::<String>()
        ))
    }
}

/// A raw HTTP/1.0 `GET path` on 127.0.0.1:port; the whole response.
async fn http_get(port: u16, path: &str) -> Result<String, String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .await
        .map_err(|e| format!("send: {e}"))?;
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .await
        .map_err(|e| format!("receive: {e}"))?;
    Ok(String::from_utf8_lossy(&response).into_owned())
}

/// Pure: judges a raw HTTP/1.0 response of etcd's `/health`.
fn etcd_healthy(response: &str) -> Result<(), String> {
    let status_ok = response
        .lines()
        .next()
        .is_some_and(|status| status.split_whitespace().nth(1) == Some("200"));
    if status_ok && response.contains(r#""health":"true""#) {
        Ok(())
    } else {
        Err(format!(
            "/health answered {:?}",
            response.chars().take(200).collect::<String>()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_health_needs_status_and_body() {
        let ok = "HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{\"health\":\"true\",\"reason\":\"\"}";
        assert!(etcd_healthy(ok).is_ok());
        let unhealthy = "HTTP/1.0 503 Service Unavailable\r\n\r\n{\"health\":\"false\"}";
        assert!(etcd_healthy(unhealthy).is_err());
        assert!(etcd_healthy("SSH-2.0-OpenSSH_9.2\r\n").is_err());
    }
}
