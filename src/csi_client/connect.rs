//! Establishing the gRPC channel to the driver's unix domain socket.

use std::io;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint, Uri};
use tracing::info;

use super::error::Error;
use super::error::error_chain;

/// What is at the socket path right now.
#[derive(Debug)]
enum PathState {
    Socket,
    Missing,
    NotASocket,
    Unreadable(io::Error),
}

fn inspect(path: &Path) -> PathState {
    match std::fs::metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => PathState::Socket,
        Ok(_) => PathState::NotASocket,
        Err(err) if err.kind() == io::ErrorKind::NotFound => PathState::Missing,
        Err(err) => PathState::Unreadable(err),
    }
}

/// Why an attempt did not produce a channel.
#[derive(Debug)]
enum Failure {
    Missing,
    Refused(String),
}

/// The decision after a failed attempt.
#[derive(Debug)]
enum Next {
    RetryAfter(Duration),
    GiveUp(Error),
}

/// Retry at most every `interval` until `waited` reaches `timeout`, then fail naming the problem.
fn after_failure(
    failure: Failure,
    path: &Path,
    waited: Duration,
    timeout: Duration,
    interval: Duration,
) -> Next {
    if waited < timeout {
        return Next::RetryAfter(interval.min(timeout - waited));
    }
    let path = path.to_path_buf();
    Next::GiveUp(match failure {
        Failure::Missing => Error::SocketMissing { path, waited },
        Failure::Refused(reason) => Error::ConnectFailed {
            path,
            waited,
            reason,
        },
    })
}

/// Opens a channel whose connections are unix-socket streams to `path`. The channel reconnects
/// through the same connector on the first call after a lost connection, so a restarted driver
/// (socket re-created at the same path) is picked up without restarting the sidecar.
async fn open(path: &Path, attempt_timeout: Duration) -> Result<Channel, tonic::transport::Error> {
    let path: PathBuf = path.to_path_buf();
    let connector = tower::service_fn(move |_: Uri| {
        let path = path.clone();
        async move { Ok::<_, io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
    });
    // The URI only provides the :authority header; the connector ignores it. grpc-go sends
    // "localhost" over unix sockets, so drivers that look at it see the same.
    Endpoint::from_static("http://localhost")
        .connect_timeout(attempt_timeout)
        .connect_with_connector(connector)
        .await
}

/// Waits up to `timeout` for a unix socket at `path` and connects to it, retrying at most every
/// `interval` with a log line per failed attempt. A path that exists but is not a socket fails at
/// once; a missing socket or one nobody accepts on fails when `timeout` has passed.
pub(super) async fn connect(
    path: &Path,
    timeout: Duration,
    interval: Duration,
) -> Result<Channel, Error> {
    let started = Instant::now();
    let mut attempt: u32 = 0;
    loop {
        attempt += 1;
        let failure = match inspect(path) {
            PathState::Socket => match open(path, interval.max(Duration::from_secs(1))).await {
                Ok(channel) => {
                    info!(path = %path.display(), attempt, "Connected to the CSI driver");
                    return Ok(channel);
                }
                Err(err) => Failure::Refused(error_chain(&err)),
            },
            PathState::Missing => Failure::Missing,
            PathState::NotASocket => {
                return Err(Error::NotASocket {
                    path: path.to_path_buf(),
                });
            }
            PathState::Unreadable(source) => {
                return Err(Error::InspectSocket {
                    path: path.to_path_buf(),
                    source,
                });
            }
        };
        let reason = match &failure {
            Failure::Missing => "socket does not exist yet".to_string(),
            Failure::Refused(reason) => reason.clone(),
        };
        match after_failure(failure, path, started.elapsed(), timeout, interval) {
            Next::RetryAfter(pause) => {
                info!(path = %path.display(), attempt, %reason, "Still connecting to the CSI driver");
                tokio::time::sleep(pause).await;
            }
            Next::GiveUp(err) => return Err(err),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);
    const TIMEOUT: Duration = Duration::from_secs(30);

    #[test]
    fn retries_at_most_every_interval_until_the_deadline() {
        let path = Path::new("/run/csi/socket");
        assert!(matches!(
            after_failure(Failure::Missing, path, Duration::ZERO, TIMEOUT, SECOND),
            Next::RetryAfter(d) if d == SECOND
        ));
        assert!(matches!(
            after_failure(
                Failure::Missing,
                path,
                Duration::from_millis(29_700),
                TIMEOUT,
                SECOND
            ),
            Next::RetryAfter(d) if d == Duration::from_millis(300)
        ));
    }

    #[test]
    fn after_the_deadline_the_error_names_the_problem() {
        let path = Path::new("/run/csi/socket");
        let missing = after_failure(Failure::Missing, path, TIMEOUT, TIMEOUT, SECOND);
        assert!(
            matches!(&missing, Next::GiveUp(Error::SocketMissing { .. })),
            "{missing:?}"
        );
        let refused = after_failure(
            Failure::Refused("connection refused".into()),
            path,
            TIMEOUT + SECOND,
            TIMEOUT,
            SECOND,
        );
        match refused {
            Next::GiveUp(err @ Error::ConnectFailed { .. }) => {
                assert!(err.to_string().contains("connection refused"), "{err}");
                assert!(err.to_string().contains("/run/csi/socket"), "{err}");
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn path_states() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            inspect(&dir.path().join("nope")),
            PathState::Missing
        ));
        assert!(matches!(inspect(dir.path()), PathState::NotASocket));
        let file = dir.path().join("file");
        std::fs::write(&file, b"").unwrap();
        assert!(matches!(inspect(&file), PathState::NotASocket));
    }
}
