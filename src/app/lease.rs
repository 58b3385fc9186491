//! Running the controllers only while this replica holds the Lease.

use std::future::Future;

use tracing::{info, warn};

use super::error::AppError;
use crate::leader::{Elector, LeaderWatch, Outcome};

/// Waits for leadership (or the drain), runs `controllers` while leading and returns when
/// they have drained and the Lease is released. The elector keeps renewing while the
/// controllers drain. Losing the Lease ends everything at once, as upstream.
pub(super) async fn run_while_leading<F, Fut>(
    elector: Elector,
    watch: LeaderWatch,
    drain: impl Future<Output = ()> + Send + 'static,
    controllers: F,
) -> Result<(), AppError>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), AppError>> + Send + 'static,
{
    // A task of their own, so that the elector's renewals never wait behind the controllers.
    let mut work = tokio::spawn(async move {
        let mut leading = watch.leading();
        let lead = tokio::select! {
            became = leading.wait_for(|leading| *leading) => became.is_ok(),
            () = drain => false,
        };
        if !lead {
            return Ok(());
        }
        info!("became leader, starting controllers");
        controllers().await
    });
    let mut finished = None;
    let outcome = elector
        .run(async {
            finished = Some((&mut work).await.unwrap_or_else(|e| Err(AppError::Task(e))));
        })
        .await;
    match outcome {
        Outcome::Lost => {
            work.abort();
            Err(AppError::LeadershipLost)
        }
        Outcome::NotReleased(reason) => {
            warn!(%reason, "the lease was not released; the other replica takes over when it expires");
            finished.unwrap_or(Ok(()))
        }
        // The elector only returns these after the controllers finished, so `finished` is set.
        Outcome::Released | Outcome::StoppedBeforeLeading => finished.unwrap_or(Ok(())),
    }
}
