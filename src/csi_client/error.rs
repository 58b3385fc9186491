//! Errors of the CSI client: [`Error`] for start-up problems the binary reports before exiting,
//! [`CallError`] for a failed CSI call, and the pure classification of a call's outcome.

use std::error::Error as _;
use std::path::PathBuf;
use std::time::Duration;

use tonic::{Code, Status};

use crate::fence::Fenced;
use crate::metrics::NON_GRPC_STATUS;

/// A problem that stops the sidecar from using the CSI driver at all: a bad `--csi-address`, a
/// socket that never appears, a driver that fails its start-up calls or names itself invalidly.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `--csi-address` is empty (or `unix://` without a path).
    #[error(
        "CSI address {address:?} names no socket: expected an absolute path or unix:///path/to/socket"
    )]
    EmptyAddress {
        /// The address as given.
        address: String,
    },
    /// `--csi-address` uses a scheme other than `unix://`.
    #[error(
        "CSI address {address:?}: {scheme}:// is not supported, the CSI driver must listen on a \
         unix domain socket (give an absolute path or unix:///path/to/socket)"
    )]
    UnsupportedScheme {
        /// The address as given.
        address: String,
        /// The scheme found before `://`.
        scheme: String,
    },
    /// `--csi-address` is neither an absolute path nor a `unix://` URI.
    #[error(
        "CSI address {address:?} is neither an absolute path nor a unix:// URI \
         (give an absolute path or unix:///path/to/socket)"
    )]
    NotAnAddress {
        /// The address as given.
        address: String,
    },
    /// Nothing appeared at the socket path before the connect deadline.
    #[error("CSI driver socket {} does not exist (waited {waited:?} for it to appear)", path.display())]
    SocketMissing {
        /// The socket path.
        path: PathBuf,
        /// How long we waited.
        waited: Duration,
    },
    /// Something other than a unix domain socket is at the socket path.
    #[error("CSI address {} is not a unix domain socket", path.display())]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// The socket path cannot be inspected (e.g. permission denied on a parent directory).
    #[error("cannot inspect CSI driver socket {}: {source}", path.display())]
    InspectSocket {
        /// The path.
        path: PathBuf,
        /// What `stat` said.
        source: std::io::Error,
    },
    /// The socket exists but no connection could be established before the deadline.
    #[error("cannot connect to CSI driver socket {} (tried for {waited:?}): {reason}", path.display())]
    ConnectFailed {
        /// The socket path.
        path: PathBuf,
        /// How long we tried.
        waited: Duration,
        /// The last connection error.
        reason: String,
    },
    /// A start-up call (Probe, GetPluginInfo, capabilities, NodeGetInfo) failed.
    #[error("CSI driver failed {method}: {source}")]
    Call {
        /// Full gRPC method path.
        method: &'static str,
        /// The call's error.
        source: CallError,
    },
    /// GetPluginInfo returned a name that cannot name a CSI driver.
    #[error("CSI driver returned an invalid name {name:?} from GetPluginInfo: {problem}")]
    InvalidDriverName {
        /// The name as returned.
        name: String,
        /// What is wrong with it.
        problem: &'static str,
    },
}

/// Why a CSI call failed. `Display` mimics Go's gRPC error text
/// (`rpc error: code = Internal desc = …`) so events and logs read like upstream's.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The driver answered with a non-OK gRPC status.
    #[error("rpc error: code = {} desc = {}", go_code_name(.0.code()), .0.message())]
    Status(Status),
    /// No answer within the per-call timeout (`--timeout`); the driver may still be working.
    #[error("rpc error: code = DeadlineExceeded desc = no answer within {0:?}")]
    Timeout(Duration),
    /// The connection to the driver failed or dropped before it answered (driver not running,
    /// restarting or crashed). Reported as `Unavailable`, as grpc-go does.
    #[error("rpc error: code = Unavailable desc = connection to the CSI driver failed: {0}")]
    Transport(String),
    /// Not sent at all: this replica could not prove it still leads (see `crate::fence`).
    /// Reported as `Unavailable`: retried, and it says nothing about the volume.
    #[error("rpc error: code = Unavailable desc = {0}")]
    Fenced(#[from] Fenced),
}

impl CallError {
    /// Sorts a tonic status into what the driver said and what the transport made up: tonic
    /// builds statuses for local failures from an error it keeps as `source`, whereas a status
    /// decoded from the driver's answer has none. tonic enforces the `grpc-timeout` we send as
    /// well, so its own deadline is a [`CallError::Timeout`] too.
    pub(super) fn from_tonic(status: Status, timeout: Duration) -> Self {
        let Some(source) = status.source() else {
            return CallError::Status(status);
        };
        let mut cause = Some(source);
        while let Some(err) = cause {
            if err.is::<tonic::TimeoutExpired>() {
                return CallError::Timeout(timeout);
            }
            cause = err.source();
        }
        CallError::Transport(error_chain(source))
    }

    /// The gRPC code of the failure (`Unavailable` for transport failures, `DeadlineExceeded`
    /// for timeouts).
    pub fn code(&self) -> Code {
        match self {
            CallError::Status(status) => status.code(),
            CallError::Timeout(_) => Code::DeadlineExceeded,
            CallError::Transport(_) | CallError::Fenced(_) => Code::Unavailable,
        }
    }

    /// The class of this failure, see [`classify`].
    pub fn class(&self) -> ErrorClass {
        classify(Some(self.code()))
    }

    /// Whether a CreateVolume that failed this way may have left a volume under its name: the
    /// driver may still be creating it, or it says one exists (ALREADY_EXISTS, with other
    /// parameters than asked).
    pub fn may_have_created(&self) -> bool {
        !matches!(self, CallError::Fenced(_))
            && (self.class() == ErrorClass::InProgress || self.code() == Code::AlreadyExists)
    }

    /// Whether the driver answered that it or its backend is overloaded, for the adaptive
    /// call rate (`--adaptive-call-rate`): UNAVAILABLE, or RESOURCE_EXHAUSTED unless the request
    /// asked for a place (accessibility requirements), where it means "no room there" and
    /// reschedules. A failed connection or a lost lease is not the driver's answer.
    pub fn signals_overload(&self, placement_requested: bool) -> bool {
        match self {
            CallError::Status(status) => match status.code() {
                Code::Unavailable => true,
                Code::ResourceExhausted => !placement_requested,
                _ => false,
            },
            CallError::Timeout(_) | CallError::Transport(_) | CallError::Fenced(_) => false,
        }
    }

    /// Whether the request is infeasible (InvalidArgument) and should be retried only slowly
    /// (5 min, or when the StorageClass is re-created).
    pub fn is_infeasible(&self) -> bool {
        is_infeasible(Some(self.code()))
    }
}

impl From<Status> for CallError {
    /// A status as if the driver had answered it; handy for fakes of [`super::CsiController`].
    fn from(status: Status) -> Self {
        CallError::Status(status)
    }
}

/// An error and its sources, joined with ": " (tonic's own texts, like "transport error", say
/// little; the cause is further down), skipping a cause that repeats its parent's text.
pub(super) fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut last = text.clone();
    let mut cause = err.source();
    while let Some(err) = cause {
        let part = err.to_string();
        if !last.ends_with(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        last = part;
        cause = err.source();
    }
    text
}

/// What a failed CSI call means for the operation, upstream's `checkError` table (the raw class;
/// whether `Reschedule` really reschedules depends on topology and the selected node, which the
/// caller knows).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorClass {
    /// The driver may still be working on it (Canceled, DeadlineExceeded, Unavailable, Aborted,
    /// or no gRPC status at all): retry the very same request, never forget it.
    InProgress,
    /// ResourceExhausted: the driver cannot do it here; with topology and a selected node the
    /// caller gives up this node, otherwise it is final.
    Reschedule,
    /// Any other code: the driver did not start or has given up; nothing runs in background.
    Final,
}

/// Classifies a call's failure by its gRPC code; `None` means the call failed without any gRPC
/// status.
pub fn classify(code: Option<Code>) -> ErrorClass {
    match code {
        None
        | Some(Code::Cancelled | Code::DeadlineExceeded | Code::Unavailable | Code::Aborted) => {
            ErrorClass::InProgress
        }
        Some(Code::ResourceExhausted) => ErrorClass::Reschedule,
        Some(_) => ErrorClass::Final,
    }
}

/// Whether a failure marks the request as infeasible (InvalidArgument): upstream retries those
/// only after 5 minutes or a change of StorageClass.
pub fn is_infeasible(code: Option<Code>) -> bool {
    code == Some(Code::InvalidArgument)
}

/// Go's spelling of a gRPC code (`codes.Code.String()`), used in metrics and error texts.
pub fn go_code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "Canceled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

/// The `grpc_status_code` metric label of a call's outcome; `None` = failed without any gRPC
/// status.
pub fn status_code_label(code: Option<Code>) -> &'static str {
    code.map_or(NON_GRPC_STATUS, go_code_name)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL_CODES: [Code; 17] = [
        Code::Ok,
        Code::Cancelled,
        Code::Unknown,
        Code::InvalidArgument,
        Code::DeadlineExceeded,
        Code::NotFound,
        Code::AlreadyExists,
        Code::PermissionDenied,
        Code::ResourceExhausted,
        Code::FailedPrecondition,
        Code::Aborted,
        Code::OutOfRange,
        Code::Unimplemented,
        Code::Internal,
        Code::Unavailable,
        Code::DataLoss,
        Code::Unauthenticated,
    ];

    #[test]
    fn classification_follows_upstream_check_error() {
        let in_progress = [
            Code::Cancelled,
            Code::DeadlineExceeded,
            Code::Unavailable,
            Code::Aborted,
        ];
        for code in ALL_CODES {
            let expected = if in_progress.contains(&code) {
                ErrorClass::InProgress
            } else if code == Code::ResourceExhausted {
                ErrorClass::Reschedule
            } else {
                ErrorClass::Final
            };
            assert_eq!(classify(Some(code)), expected, "{code:?}");
        }
        assert_eq!(classify(None), ErrorClass::InProgress);
    }

    #[test]
    fn only_invalid_argument_is_infeasible() {
        for code in ALL_CODES {
            assert_eq!(
                is_infeasible(Some(code)),
                code == Code::InvalidArgument,
                "{code:?}"
            );
        }
        assert!(!is_infeasible(None));
    }

    #[test]
    fn code_names_are_gos() {
        let names: Vec<&str> = ALL_CODES.into_iter().map(go_code_name).collect();
        assert_eq!(
            names,
            [
                "OK",
                "Canceled",
                "Unknown",
                "InvalidArgument",
                "DeadlineExceeded",
                "NotFound",
                "AlreadyExists",
                "PermissionDenied",
                "ResourceExhausted",
                "FailedPrecondition",
                "Aborted",
                "OutOfRange",
                "Unimplemented",
                "Internal",
                "Unavailable",
                "DataLoss",
                "Unauthenticated",
            ]
        );
        assert_eq!(status_code_label(None), "unknown-non-grpc");
        assert_eq!(status_code_label(Some(Code::Cancelled)), "Canceled");
    }

    #[test]
    fn call_errors_have_codes_classes_and_go_like_text() {
        let timeout = Duration::from_secs(10);
        let driver = CallError::from_tonic(Status::internal("disk on fire"), timeout);
        assert!(matches!(driver, CallError::Status(_)));
        assert_eq!(driver.class(), ErrorClass::Final);
        assert_eq!(
            driver.to_string(),
            "rpc error: code = Internal desc = disk on fire"
        );

        let local = CallError::from_tonic(
            Status::from_error(Box::new(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "pipe gone",
            ))),
            timeout,
        );
        assert!(matches!(local, CallError::Transport(_)), "{local:?}");
        assert_eq!(local.code(), Code::Unavailable);
        assert_eq!(local.class(), ErrorClass::InProgress);

        let expired = CallError::from_tonic(
            Status::from_error(Box::new(tonic::TimeoutExpired(()))),
            timeout,
        );
        assert!(
            matches!(expired, CallError::Timeout(t) if t == timeout),
            "{expired:?}"
        );
        assert_eq!(expired.code(), Code::DeadlineExceeded);
        assert_eq!(expired.class(), ErrorClass::InProgress);

        let exhausted = CallError::from(Status::resource_exhausted("full"));
        assert_eq!(exhausted.class(), ErrorClass::Reschedule);
        assert!(CallError::from(Status::invalid_argument("bad")).is_infeasible());
    }
}
