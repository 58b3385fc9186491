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
use std::sync::{Arc, Mutex, MutexGuard};

use super::measured::Next;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use thiserror::Error;
use tracing::{debug, info, warn};

use super::backoff::Backoff;
use super::cache::{CacheError, CachedClaim};
use super::context::Context;
use super::finalizers::remove_finalizer;
use crate::journal::JournalError;
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

/// The controller's state: the shared context and its own per-claim backoff.
pub struct CloneProtection {
    ctx: Arc<Context>,
    backoff: Mutex<Backoff<String>>,
}

impl CloneProtection {
    pub fn new(ctx: Arc<Context>) -> Self {
        let backoff = Backoff::new(ctx.retry_interval_start, ctx.retry_interval_max);
        CloneProtection {
            ctx,
            backoff: Mutex::new(backoff),
        }
    }

    /// Whether the claim is being deleted and carries the finalizer: only such claims are
    /// queued (upstream queues every claim being deleted and then finds most without it).
    pub fn has_work(cached: &CachedClaim, _: &Context) -> bool {
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
            &ctx.config.driver_name,
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
        self.backoff
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
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
