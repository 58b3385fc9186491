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
mod tests {
    use super::*;
    use crate::controller::fixtures::{
        Cluster, RETRY_START, Scenario, Step, bounded, cached, claim_volume, every_node_journal,
        get, journal_path, patch, recorded_operation,
    };
    use crate::csi;
    use crate::csi::volume_content_source::{Type, VolumeSource};
    use crate::provision::fixtures::{PvBuilder, PvcBuilder};
    use serde_json::json;

    const SOURCE_PATH: &str = "/api/v1/namespaces/apps/persistentvolumeclaims/src";

    /// Claim `apps/src` being deleted, with the clone finalizer, bound to PV `pv-src`.
    fn source() -> PersistentVolumeClaim {
        PvcBuilder::new()
            .name("src")
            .uid("src-uid")
            .volume_name("pv-src")
            .phase("Bound")
            .finalizer("kubernetes.io/pvc-protection")
            .finalizer(CLONE_PROTECTION_FINALIZER)
            .deleting()
            .build()
    }

    fn source_pv() -> k8s_openapi::api::core::v1::PersistentVolume {
        PvBuilder::new().name("pv-src").handle("vol-src").build()
    }

    fn clone(phase: &str) -> PersistentVolumeClaim {
        PvcBuilder::new()
            .phase(phase)
            .data_source(None, "PersistentVolumeClaim", "src")
            .build()
    }

    fn finalizer_removed() -> Step {
        patch(SOURCE_PATH)
            .body(json!([
                {"op": "test", "path": "/metadata/uid", "value": "src-uid"},
                {"op": "test", "path": "/metadata/finalizers/1", "value": CLONE_PROTECTION_FINALIZER},
                {"op": "remove", "path": "/metadata/finalizers/1"},
            ]))
            .answer(200, PvcBuilder::new().name("src").build())
    }

    async fn reconcile(scenario: &Scenario) -> Next {
        let this = Arc::new(CloneProtection::new(scenario.ctx()));
        let Ok(action) = bounded(CloneProtection::reconcile(
            Arc::new(cached(&source())),
            this,
        ))
        .await;
        action
    }

    #[tokio::test(start_paused = true)]
    async fn the_finalizer_stays_while_a_pending_clone_exists() {
        let scenario = Cluster::new()
            .claim(source())
            .claim(clone("Pending"))
            .volume(source_pv())
            .start([])
            .await;
        assert!(CloneProtection::has_work(
            &cached(&source()),
            &scenario.ctx()
        ));
        assert_eq!(reconcile(&scenario).await, Next::RetryIn(RETRY_START));
        assert_eq!(scenario.finish().await, Vec::<String>::new(), "no events");
    }

    /// An operation cloning the source's volume.
    fn cloning() -> crate::journal::Operation {
        crate::journal::Operation {
            request: csi::CreateVolumeRequest {
                volume_content_source: Some(csi::VolumeContentSource {
                    r#type: Some(Type::Volume(VolumeSource {
                        volume_id: "vol-src".into(),
                    })),
                }),
                ..recorded_operation().request
            },
            ..recorded_operation()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_finalizer_stays_while_the_journal_clones_the_volume() {
        // The clone's claim is gone: only the journal knows it still reads the source.
        let scenario = Cluster::new()
            .claim(source())
            .volume(source_pv())
            .journaled(cloning())
            .start([])
            .await;
        assert!(scenario.ctx().journal.registry().contains(&claim_volume()));
        assert_eq!(reconcile(&scenario).await, Next::RetryIn(RETRY_START));
        scenario.finish().await;
    }

    #[tokio::test(start_paused = true)]
    async fn the_finalizer_comes_off_once_nothing_reads_the_source() {
        let scenario = Cluster::new()
            .claim(source())
            .claim(clone("Bound"))
            .volume(source_pv())
            .journaled(recorded_operation())
            .start([finalizer_removed()])
            .await;
        assert_eq!(reconcile(&scenario).await, Next::Wait);
        scenario.finish().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_not_being_deleted_is_not_queued() {
        let alive = PvcBuilder::new()
            .name("src")
            .finalizer(CLONE_PROTECTION_FINALIZER)
            .build();
        let scenario = Cluster::new().start([]).await;
        assert!(!CloneProtection::has_work(&cached(&alive), &scenario.ctx()));
        scenario.finish().await;
    }

    fn node_b() -> Cluster {
        Cluster::new()
            .node_mode("node-b", &[])
            .claim(source())
            .volume(source_pv())
    }

    #[tokio::test(start_paused = true)]
    async fn in_node_mode_another_nodes_clone_keeps_the_finalizer() {
        // Node b's journal is empty; node a's still clones the source (its reaper replays it).
        let scenario = node_b().start([every_node_journal(&[cloning()])]).await;
        assert_eq!(reconcile(&scenario).await, Next::RetryIn(RETRY_START));
        scenario.finish().await;
    }

    #[tokio::test(start_paused = true)]
    async fn in_node_mode_an_unread_journal_keeps_the_finalizer() {
        let scenario = node_b()
            .start([get(journal_path()).refuse(500, "InternalError")])
            .await;
        assert_eq!(reconcile(&scenario).await, Next::RetryIn(RETRY_START));
        scenario.finish().await;
    }

    #[tokio::test(start_paused = true)]
    async fn in_node_mode_the_finalizer_comes_off_once_no_node_clones_the_source() {
        let scenario = node_b()
            .start([
                every_node_journal(&[recorded_operation()]),
                finalizer_removed(),
            ])
            .await;
        assert_eq!(reconcile(&scenario).await, Next::Wait);
        scenario.finish().await;
    }
}
