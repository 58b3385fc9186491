//! When the controllers drain: at the sidecar's drain signal, or under `--drain` once the
//! hand-over to another provisioner is complete. The reconcilers
//! and the reaper do the work (with `provision::drain_claim_work` deciding for claims); this
//! only watches the journal and the claim cache, and says what is still holding it up.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::time::Instant;
use tracing::{Instrument, info, info_span};

use crate::controller::shared::context::Context;
use crate::provision::holds_up_drain;

/// How often completion is checked.
const CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// How often what is left is logged while the drain waits.
const PROGRESS_INTERVAL: Duration = Duration::from_secs(30);
/// Volume names named in a progress line, at most.
const NAMED: usize = 5;

/// The controllers' drain: resolves at the sidecar's drain signal or, under `--drain`, once
/// the hand-over is complete.
#[derive(Clone)]
pub(in crate::controller) struct Drained(watch::Receiver<bool>);

impl Drained {
    /// Resolves once the controllers are to drain.
    pub(in crate::controller) fn wait(
        &self,
    ) -> impl Future<Output = ()> + Send + Sync + 'static + use<> {
        let mut drained = self.0.clone();
        async move {
            let _ = drained.wait_for(|drained| *drained).await;
        }
    }
}

/// Whether the drain came from a complete hand-over (`--drain`), not the sidecar's signal.
pub(in crate::controller) struct HandedOver(oneshot::Receiver<()>);

impl HandedOver {
    /// Asked once every controller has ended, after the drain was sent.
    pub(in crate::controller) fn happened(mut self) -> bool {
        self.0.try_recv().is_ok()
    }
}

/// Starts the task that sends the drain: at `signal`, or under `--drain` once
/// [`until_complete`] resolves.
pub(in crate::controller) fn start(
    ctx: &Arc<Context>,
    claims_listed: impl Future<Output = bool> + Send + 'static,
    signal: impl Future<Output = ()> + Send + 'static,
) -> (Drained, HandedOver) {
    let draining = ctx.settings.draining;
    if draining {
        info!(
            "--drain: no new provisioning; a claim without a recorded operation gets no CreateVolume and no finalizer. Finishing every recorded operation, removing the provisioning-protection finalizer from every claim, then exiting"
        );
    }
    let (drain_tx, drain_rx) = watch::channel(false);
    let (handed_over_tx, handed_over) = oneshot::channel();
    let ctx = Arc::clone(ctx);
    let task = async move {
        let complete = async {
            if draining {
                until_complete(&ctx, claims_listed).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            () = signal => {}
            () = complete => { let _ = handed_over_tx.send(()); }
        }
        let _ = drain_tx.send(true);
    };
    tokio::spawn(task.instrument(info_span!("drain")));
    (Drained(drain_rx), HandedOver(handed_over))
}

/// Resolves once the claim cache has listed (`claims_listed`), the journal holds no
/// operation and no claim of this driver in the cache carries the provisioning-protection
/// finalizer. The provisioner taking over may then start: nothing it cannot see is left in
/// flight, and nothing it cannot remove is left on a claim. A cache that lags only delays
/// this: nothing adds the finalizer while a drain leads.
async fn until_complete(ctx: &Context, claims_listed: impl Future<Output = bool>) {
    // An empty cache before the first list would look drained.
    if !claims_listed.await {
        return std::future::pending().await;
    }
    let mut last_progress: Option<(Instant, Left)> = None;
    loop {
        let left = left(ctx);
        if left.operations == 0 && left.finalizers == 0 {
            info!(
                "drain complete: no operation in flight, no claim carries the provisioning-protection finalizer; exiting"
            );
            return;
        }
        let due = last_progress
            .as_ref()
            .is_none_or(|(at, before)| *before != left || at.elapsed() >= PROGRESS_INTERVAL);
        if due {
            let waiting: Vec<String> = ctx
                .journal
                .registry()
                .idle()
                .into_iter()
                .take(NAMED)
                .map(|operation| operation.volume_name)
                .collect();
            info!(
                operations = left.operations,
                claims_with_finalizer = left.finalizers,
                ?waiting,
                "draining: waiting for operations in flight and claim finalizers (an orphan that keeps failing is logged and has DrainBlocked events on its journal shard)"
            );
            last_progress = Some((Instant::now(), left));
        }
        tokio::time::sleep(CHECK_INTERVAL).await;
    }
}

#[derive(Debug, PartialEq)]
struct Left {
    operations: usize,
    finalizers: usize,
}

fn left(ctx: &Context) -> Left {
    let driver = &ctx.settings.config.driver_name;
    Left {
        operations: ctx.journal.registry().len(),
        finalizers: ctx
            .claims
            .state()
            .iter()
            .filter(|claim| {
                claim
                    .to_claim()
                    .is_ok_and(|pvc| holds_up_drain(&pvc, driver))
            })
            .count(),
    }
}
