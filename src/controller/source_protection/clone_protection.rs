//! The cloning-protection controller (only for a driver with CLONE_VOLUME): takes
//! `provision::CLONE_PROTECTION_FINALIZER` off a claim being deleted once nothing reads it any
//! more (`provision::clone_verdict`: no Pending clone of it, no operation in the journal
//! cloning its volume), and retries with the per-claim backoff while something does. Upstream
//! emits no event here, nor do we.
//!
//! It decides on the caches only, as upstream's controller on its informer: the claims (with
//! their phase, see `cache::CachedClaim`) and the source's PV for its volume handle. It starts
//! only once the claim watch has listed, so an empty cache never passes for "no clone".

use std::convert::Infallible;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};

use futures::channel::mpsc::UnboundedReceiver;
use futures::future::{BoxFuture, Shared};
use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::{Config, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use thiserror::Error;
use tracing::{debug, info, warn};

use crate::controller::runtime::backoff::Backoff;
use crate::controller::runtime::cache::{CacheError, CachedClaim};
use crate::controller::runtime::finalizers::remove_finalizer;
use crate::controller::runtime::measured::{Measured, Next};
use crate::controller::runtime::runner::{
    RESYNC_PERIOD, lock, log_result, never_fails, resync_with_work,
};
use crate::controller::shared::context::Context;
use crate::journal::JournalError;
use crate::metrics::CLAIMS_QUEUE;
use crate::provision::{
    CLONE_PROTECTION_FINALIZER, CloneHold, CloneVerdict, InFlightSources, SourceVolume,
    clone_verdict,
};

/// Why a reconcile could not take the finalizer off; retried with backoff.
#[derive(Debug, Error)]
pub enum CloneProtectionError {
    #[error(transparent)]
    Cache(#[from] CacheError),
    #[error("{0}")]
    Held(CloneHold),
    #[error("failed to remove the cloning-protection finalizer: {0}")]
    Remove(kube::Error),
    #[error("which sources operations in flight read is unknown: {0}")]
    Journal(#[from] JournalError),
}

/// The cloning-protection controller: kube-runtime's controller over the claims being
/// deleted that carry the finalizer, as the claim watch (driven by the claim controller)
/// reports them, and a periodic resync.
pub(in crate::controller) struct CloneProtectionController {
    ctx: Arc<Context>,
    /// The claims being deleted with the clone finalizer, tapped from the claim watch by [`Self::new`].
    protected: UnboundedReceiver<CachedClaim>,
    /// Whether the claim store has listed (see `cache::listed`).
    listed: Shared<BoxFuture<'static, bool>>,
    queue: Measured,
}

impl CloneProtectionController {
    /// The controller, and the claim watch `changed` with the claims it wants tapped off for
    /// it; the claim controller drives that watch.
    pub(in crate::controller) fn new<C>(
        ctx: &Arc<Context>,
        changed: C,
        listed: Shared<BoxFuture<'static, bool>>,
    ) -> (
        impl Stream<Item = Result<CachedClaim, watcher::Error>> + Send + 'static + use<C>,
        Self,
    )
    where
        C: Stream<Item = Result<CachedClaim, watcher::Error>> + Send + 'static,
    {
        let (protected_tx, protected) = futures::channel::mpsc::unbounded();
        let cloning = ctx.settings.caps.clone;
        let changed = changed.inspect_ok(move |claim| {
            if cloning && CloneProtection::has_work(claim) {
                let _ = protected_tx.unbounded_send(claim.clone());
            }
        });
        let controller = CloneProtectionController {
            ctx: Arc::clone(ctx),
            protected,
            listed,
            // Upstream's two queues of claims share the name: their counts add up.
            queue: Measured::new(ctx.metrics.queue(CLAIMS_QUEUE)),
        };
        (changed, controller)
    }

    /// Runs until `drained` (only for a driver with CLONE_VOLUME), letting the reconciles in
    /// flight finish.
    pub(in crate::controller) async fn run<D>(self, drained: impl Fn() -> D)
    where
        D: Future<Output = ()> + Send + Sync + 'static,
    {
        let CloneProtectionController {
            ctx,
            protected,
            listed,
            queue,
        } = self;
        // Started once the claims have listed: kube-runtime's controller would wait on the
        // store itself, a second waiter beside the claim controller's (see `cache::listed`),
        // and no decision may take a partial cache for "no clone".
        if !ctx.settings.caps.clone {
            return;
        }
        // The source's PV is read from the PV store too (`source_volume`).
        let both_listed = async { listed.await && ctx.volumes_listed.clone().await };
        tokio::select! {
            listed = both_listed => if !listed { return },
            () = drained() => return,
        }
        let claims = ctx.claims.clone();
        let resync = resync_with_work(claims.clone(), CloneProtection::has_work, RESYNC_PERIOD);
        let threads = ctx.settings.cloning_protection_threads.max(1);
        let results = Controller::for_stream(
            queue.objects(protected.map(Ok::<_, watcher::Error>)),
            claims,
        )
        .with_config(Config::default().concurrency(u16::try_from(threads).unwrap_or(u16::MAX)))
        .reconcile_on(queue.refs(resync))
        .graceful_shutdown_on(drained())
        .run(
            queue.reconcile(CloneProtection::reconcile),
            never_fails,
            Arc::new(CloneProtection::new(ctx)),
        );
        queue.results(results).for_each(log_result).await;
    }
}

/// The controller's state: the shared context and its own per-claim backoff.
pub struct CloneProtection {
    ctx: Arc<Context>,
    backoff: Mutex<Backoff<String>>,
}

impl CloneProtection {
    pub fn new(ctx: Arc<Context>) -> Self {
        let settings = &ctx.settings;
        let backoff = Backoff::new(settings.retry_interval_start, settings.retry_interval_max);
        CloneProtection {
            ctx,
            backoff: Mutex::new(backoff),
        }
    }

    /// Whether the claim is being deleted and carries the finalizer: only such claims are
    /// queued (upstream queues every claim being deleted and then finds most without it).
    pub fn has_work(cached: &CachedClaim) -> bool {
        cached.metadata.deletion_timestamp.is_some()
            && cached.to_claim().is_ok_and(|claim| {
                claim
                    .finalizers()
                    .iter()
                    .any(|f| f == CLONE_PROTECTION_FINALIZER)
            })
    }

    pub async fn reconcile(
        cached: Arc<CachedClaim>,
        this: Arc<CloneProtection>,
    ) -> Result<Next, Infallible> {
        let key = format!(
            "{}/{}",
            cached.namespace().unwrap_or_default(),
            cached.name_any()
        );
        let uid = cached.uid().unwrap_or_default();
        Ok(match this.release(&cached).await {
            Ok(released) => {
                this.backoff().forget(&uid);
                if released {
                    info!(claim = key, "removed the cloning-protection finalizer");
                }
                Next::Wait
            }
            Err(error) => {
                let delay = this.backoff().failure(uid);
                match &error {
                    CloneProtectionError::Held(_) => {
                        debug!(claim = key, reason = %error, retry_in = ?delay, "clone source kept")
                    }
                    _ => warn!(claim = key, %error, retry_in = ?delay, "clone source not released"),
                }
                Next::RetryIn(delay)
            }
        })
    }

    /// Takes the finalizer off if nothing reads the claim; returns whether it did.
    async fn release(&self, cached: &CachedClaim) -> Result<bool, CloneProtectionError> {
        let ctx = &self.ctx;
        let source = cached.to_claim()?;
        let claims = ctx
            .claims
            .state()
            .iter()
            .filter_map(|claim| claim.to_claim().ok())
            .collect::<Vec<_>>();
        let in_flight = InFlightSources::new(&ctx.journal.sources_in_flight().await?);
        let volume = source_volume(ctx, &source);
        let volume = volume
            .as_ref()
            .map(|(driver, handle)| SourceVolume { driver, handle });
        match clone_verdict(
            &source,
            &claims,
            volume,
            &ctx.settings.config.driver_name,
            &in_flight,
        ) {
            CloneVerdict::Untouched => Ok(false),
            CloneVerdict::Keep(hold) => Err(CloneProtectionError::Held(hold)),
            CloneVerdict::Release => {
                let api: Api<PersistentVolumeClaim> =
                    Api::namespaced(ctx.client.clone(), &source.namespace().unwrap_or_default());
                remove_finalizer(&api, &source, CLONE_PROTECTION_FINALIZER)
                    .await
                    .map_err(CloneProtectionError::Remove)?;
                Ok(true)
            }
        }
    }

    fn backoff(&self) -> MutexGuard<'_, Backoff<String>> {
        lock(&self.backoff)
    }
}

/// The driver and handle of the source claim's cached PV (`None`: no PV named, not cached, or
/// not CSI).
fn source_volume(ctx: &Context, source: &PersistentVolumeClaim) -> Option<(String, String)> {
    let volume = source.spec.as_ref()?.volume_name.as_deref()?;
    let pv = ctx.volumes.get(&ObjectRef::new(volume))?.to_volume().ok()?;
    let csi = pv.spec?.csi?;
    Some((csi.driver, csi.volume_handle))
}

#[cfg(test)]
mod tests;
