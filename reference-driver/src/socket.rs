//! The driver's unix socket: endpoint parsing, binding with mode 0600 from the first instant it is
//! reachable, stale-socket handling, and removal at shutdown.

use std::fs::{self, DirBuilder};
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use thiserror::Error;
use tokio::net::UnixListener;

#[derive(Debug, Error)]
pub enum SocketError {
    #[error("empty endpoint")]
    Empty,
    #[error("unsupported endpoint {0:?}: only unix sockets are served (a path or unix:///path)")]
    Scheme(String),
    #[error("refusing to replace {path}: it exists and is not a socket")]
    NotASocket { path: PathBuf },
    #[error("refusing to replace {path}: another process is still serving on it")]
    InUse { path: PathBuf },
    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        source: io::Error,
    },
}

fn io_err(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> SocketError {
    let path = path.to_path_buf();
    move |source| SocketError::Io {
        action,
        path,
        source,
    }
}

/// Accepts `/path/csi.sock`, `unix:///path/csi.sock` and `unix:/path/csi.sock` (the forms gRPC
/// clients accept), and relative paths in the same shapes.
pub fn parse_endpoint(endpoint: &str) -> Result<PathBuf, SocketError> {
    let endpoint = endpoint.trim();
    let path = if let Some(rest) = endpoint.strip_prefix("unix://") {
        rest
    } else if let Some(rest) = endpoint.strip_prefix("unix:") {
        rest
    } else if endpoint.contains("://") {
        return Err(SocketError::Scheme(endpoint.to_string()));
    } else {
        endpoint
    };
    if path.is_empty() {
        return Err(SocketError::Empty);
    }
    Ok(PathBuf::from(path))
}

/// Identity of the socket inode we created, so shutdown never removes somebody else's socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SocketId {
    dev: u64,
    ino: u64,
}

/// Binds a listener at `path` whose socket file is never reachable with other permissions than
/// `mode`: it is bound inside a fresh 0700 directory, chmod-ed to `mode` and only then renamed
/// into place.
pub fn bind_with_mode(path: &Path, mode: u32) -> Result<(UnixListener, SocketId), SocketError> {
    remove_stale(path)?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    fs::create_dir_all(&parent).map_err(io_err("cannot create directory", &parent))?;
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    let private_dir = parent.join(format!(".csi-{}", &suffix[..8]));
    DirBuilder::new()
        .mode(0o700)
        .create(&private_dir)
        .map_err(io_err("cannot create directory", &private_dir))?;
    let staged = private_dir.join("s");
    let result = bind_and_move(&staged, path, mode);
    // The directory is empty again whether or not the socket made it into place.
    let _ = fs::remove_file(&staged);
    let _ = fs::remove_dir(&private_dir);
    result
}

fn bind_and_move(
    staged: &Path,
    path: &Path,
    mode: u32,
) -> Result<(UnixListener, SocketId), SocketError> {
    let listener = UnixListener::bind(staged).map_err(io_err("cannot bind", staged))?;
    fs::set_permissions(staged, fs::Permissions::from_mode(mode))
        .map_err(io_err("cannot set permissions of", staged))?;
    fs::rename(staged, path).map_err(io_err("cannot move socket to", path))?;
    let meta = fs::symlink_metadata(path).map_err(io_err("cannot stat", path))?;
    Ok((
        listener,
        SocketId {
            dev: meta.dev(),
            ino: meta.ino(),
        },
    ))
}

/// A socket left by a dead driver is removed; anything else at the path is an operator mistake.
fn remove_stale(path: &Path) -> Result<(), SocketError> {
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_err("cannot stat", path)(e)),
    };
    if !meta.file_type().is_socket() {
        return Err(SocketError::NotASocket {
            path: path.to_path_buf(),
        });
    }
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(SocketError::InUse {
            path: path.to_path_buf(),
        });
    }
    fs::remove_file(path).map_err(io_err("cannot remove stale socket", path))
}

/// Removes the socket if it is still the one a bind of this module created.
pub fn remove_if_ours(path: &Path, id: SocketId) {
    let ours = fs::symlink_metadata(path)
        .map(|m| m.dev() == id.dev && m.ino() == id.ino)
        .unwrap_or(false);
    if ours && let Err(error) = fs::remove_file(path) {
        tracing::warn!(path = %path.display(), %error, "cannot remove socket");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_endpoints() {
        assert_eq!(
            parse_endpoint("/run/csi.sock").unwrap(),
            PathBuf::from("/run/csi.sock")
        );
        assert_eq!(
            parse_endpoint("unix:///run/csi.sock").unwrap(),
            PathBuf::from("/run/csi.sock")
        );
        assert_eq!(
            parse_endpoint("unix:/run/csi.sock").unwrap(),
            PathBuf::from("/run/csi.sock")
        );
        assert_eq!(
            parse_endpoint("csi.sock").unwrap(),
            PathBuf::from("csi.sock")
        );
        assert!(matches!(
            parse_endpoint("tcp://127.0.0.1:1"),
            Err(SocketError::Scheme(_))
        ));
        assert!(matches!(parse_endpoint("unix://"), Err(SocketError::Empty)));
        assert!(matches!(parse_endpoint(""), Err(SocketError::Empty)));
    }

    #[tokio::test]
    async fn binds_private_socket_and_handles_leftovers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("csi.sock");

        let (listener, id) = bind_with_mode(&path, 0o600).unwrap();
        let meta = fs::symlink_metadata(&path).unwrap();
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no temp dir left"
        );

        assert!(
            matches!(bind_with_mode(&path, 0o600), Err(SocketError::InUse { .. })),
            "live socket kept"
        );
        drop(listener);
        // The socket of a dead listener is stale and gets replaced.
        let (_listener, new_id) = bind_with_mode(&path, 0o600).unwrap();
        remove_if_ours(
            &path,
            SocketId {
                dev: id.dev,
                ino: u64::MAX,
            },
        );
        assert!(path.exists(), "a socket we did not create is left alone");
        remove_if_ours(&path, new_id);
        assert!(!path.exists());

        let file = dir.path().join("regular");
        fs::write(&file, b"x").unwrap();
        assert!(matches!(
            bind_with_mode(&file, 0o600),
            Err(SocketError::NotASocket { .. })
        ));
        assert!(matches!(
            bind_with_mode(dir.path(), 0o600),
            Err(SocketError::NotASocket { .. })
        ));
        assert_eq!(fs::read(&file).unwrap(), b"x");
    }

    #[tokio::test]
    async fn binds_with_the_mode_asked_for() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("csi.sock");
        let (_listener, _) = bind_with_mode(&path, 0o660).unwrap();
        let meta = fs::symlink_metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o660);
    }
}
