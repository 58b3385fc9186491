//! Two-stage shutdown. The first SIGTERM/SIGINT starts a drain: workers stop picking new
//! work while in-flight CSI calls run to completion, so no CreateVolume result is lost. A
//! second signal aborts at once (the process then exits with `ABORT_EXIT_CODE`).
//!
//! Upstream only handles signals with the ReleaseLeaderElectionOnExit gate; without it a
//! SIGTERM kills the process mid-call. We always drain (docs/flags.md).

use std::future::Future;

use tokio::signal::unix::{SignalKind, signal};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Exit code after an abort (a second signal): 128 + SIGINT, as shells report Ctrl-C.
pub const ABORT_EXIT_CODE: i32 = 130;

/// Where the process is in its shutdown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Running,
    /// No new work is started; in-flight work finishes.
    Draining,
    /// Stop now, without waiting for in-flight work.
    Aborted,
}

impl Stage {
    /// The stage after one more termination signal.
    pub fn on_signal(self) -> Stage {
        match self {
            Stage::Running => Stage::Draining,
            Stage::Draining | Stage::Aborted => Stage::Aborted,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ShutdownError {
    #[error("cannot install the {signal} handler: {source}")]
    InstallHandler {
        signal: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// A cloneable handle on the shutdown state.
#[derive(Debug, Clone, Default)]
pub struct Shutdown {
    drain: CancellationToken,
    abort: CancellationToken,
}

impl Shutdown {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn stage(&self) -> Stage {
        if self.abort.is_cancelled() {
            Stage::Aborted
        } else if self.drain.is_cancelled() {
            Stage::Draining
        } else {
            Stage::Running
        }
    }

    /// Applies one termination signal and returns the new stage.
    pub fn signal(&self) -> Stage {
        let next = self.stage().on_signal();
        self.enter(next);
        next
    }

    /// Starts the drain without a signal (e.g. after leadership was lost); idempotent.
    pub fn start_drain(&self) {
        self.enter(Stage::Draining);
    }

    fn enter(&self, stage: Stage) {
        match stage {
            Stage::Running => {}
            Stage::Draining => self.drain.cancel(),
            Stage::Aborted => {
                // An abort implies a drain, so waiters on either wake up.
                self.drain.cancel();
                self.abort.cancel();
            }
        }
    }

    /// True once the drain started (also after an abort).
    pub fn is_draining(&self) -> bool {
        self.drain.is_cancelled()
    }

    /// Completes when the drain starts (or immediately if it has).
    pub fn drain_started(&self) -> impl Future<Output = ()> + Send + 'static {
        self.drain.clone().cancelled_owned()
    }

    /// Completes on abort (second signal).
    pub fn aborted(&self) -> impl Future<Output = ()> + Send + 'static {
        self.abort.clone().cancelled_owned()
    }

    /// A token cancelled when the drain starts, for APIs that take a `CancellationToken`.
    pub fn drain_token(&self) -> CancellationToken {
        self.drain.child_token()
    }
}

/// Listens for SIGTERM and SIGINT and feeds them into `shutdown`. Must be called inside a
/// Tokio runtime. The task ends after the abort.
pub fn spawn_signal_listener(shutdown: Shutdown) -> Result<JoinHandle<()>, ShutdownError> {
    let install = |kind: SignalKind, name: &'static str| {
        signal(kind).map_err(|source| ShutdownError::InstallHandler {
            signal: name,
            source,
        })
    };
    let mut term = install(SignalKind::terminate(), "SIGTERM")?;
    let mut int = install(SignalKind::interrupt(), "SIGINT")?;
    Ok(tokio::spawn(async move {
        loop {
            let received = tokio::select! {
                s = term.recv() => s.map(|()| "SIGTERM"),
                s = int.recv() => s.map(|()| "SIGINT"),
            };
            // `None` means the signal driver is gone; nothing more can arrive.
            let Some(name) = received else { return };
            match shutdown.signal() {
                Stage::Running => {}
                Stage::Draining => tracing::info!(
                    signal = name,
                    "shutting down: no new operations are started, in-flight CSI calls may \
                     finish; send the signal again to abort"
                ),
                Stage::Aborted => {
                    tracing::warn!(signal = name, "second signal: aborting");
                    return;
                }
            }
        }
    }))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn stage_machine() {
        assert_eq!(Stage::Running.on_signal(), Stage::Draining);
        assert_eq!(Stage::Draining.on_signal(), Stage::Aborted);
        assert_eq!(Stage::Aborted.on_signal(), Stage::Aborted);
    }

    #[tokio::test]
    async fn two_signals_drain_then_abort() {
        let s = Shutdown::new();
        let other = s.clone();
        let token = s.drain_token();
        assert_eq!(s.stage(), Stage::Running);
        assert!(!s.is_draining());

        let drained = tokio::spawn(other.drain_started());
        let aborted = tokio::spawn(other.aborted());

        assert_eq!(s.signal(), Stage::Draining);
        assert!(other.is_draining());
        assert!(token.is_cancelled());
        tokio::time::timeout(Duration::from_secs(1), drained)
            .await
            .expect("drain future completes")
            .expect("task");
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!aborted.is_finished(), "one signal must not abort");

        assert_eq!(s.signal(), Stage::Aborted);
        tokio::time::timeout(Duration::from_secs(1), aborted)
            .await
            .expect("abort future completes")
            .expect("task");
        assert_eq!(other.stage(), Stage::Aborted);
        assert_eq!(s.signal(), Stage::Aborted);
    }

    #[tokio::test]
    async fn start_drain_is_idempotent_and_not_an_abort() {
        let s = Shutdown::new();
        s.start_drain();
        s.start_drain();
        assert_eq!(s.stage(), Stage::Draining);
        s.drain_started().await;
        // A signal during a programmatic drain is the second stage.
        assert_eq!(s.signal(), Stage::Aborted);
    }

    #[tokio::test]
    async fn listener_installs() {
        let handle = spawn_signal_listener(Shutdown::new()).expect("handlers install");
        handle.abort();
    }
}
