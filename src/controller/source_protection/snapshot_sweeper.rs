//! The snapshot orphan sweeper (`--snapshot-orphan-sweep-interval`): takes
//! `provision::SNAPSHOT_PROTECTION_FINALIZER` off every VolumeSnapshot nothing restores from
//! any more (`provision::snapshot_verdict`: no Pending claim names it, no operation in the
//! journal restores from its handle). The claim reconciler removes the finalizer after a
//! restore succeeds; this finds the ones left behind (a claim deleted mid-flight, a final
//! error, a cross-namespace restore).
//!
//! It runs only for a driver with CREATE_DELETE_SNAPSHOT and only where the API server serves
//! `snapshot.storage.k8s.io/v1` VolumeSnapshots; a cluster without the CRD, or a role without
//! `list` on them, only disables it. The snapshots are listed at each sweep (upstream keeps an
//! informer of them all, for a sweep every five minutes); the claims come from the claim cache.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::ResourceExt;
use std::collections::HashMap;

use kube::api::{Api, ListParams};
use thiserror::Error;
use tracing::{debug, info, warn};

use crate::api::{VolumeSnapshot, VolumeSnapshotContent};
use crate::controller::runtime::cache::CacheError;
use crate::controller::runtime::finalizers::remove_finalizer_once;
use crate::controller::shared::context::Context;
use crate::journal::JournalError;
use crate::provision::{
    InFlightSources, PendingRestores, SNAPSHOT_PROTECTION_FINALIZER, SnapshotContent,
    SnapshotVerdict, snapshot_verdict,
};

const SNAPSHOT_GROUP_VERSION: &str = "snapshot.storage.k8s.io/v1";
const SNAPSHOT_KIND: &str = "VolumeSnapshot";

/// Why a sweep removed nothing.
#[derive(Debug, Error)]
pub enum SweepError {
    #[error("failed to list VolumeSnapshots: {0}")]
    ListSnapshots(kube::Error),
    /// Upstream's quirk A5 removes every finalizer then; we remove none.
    #[error("the claim watch has not listed, so which snapshots Pending claims restore is unknown")]
    ClaimsNotListed,
    #[error(transparent)]
    Claims(#[from] CacheError),
    #[error("which snapshots operations in flight restore is unknown: {0}")]
    Journal(#[from] JournalError),
}

/// What one sweep did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Swept {
    pub released: usize,
    pub kept: usize,
}

/// The sweeper, for a driver with CREATE_DELETE_SNAPSHOT and a sweep interval.
pub(in crate::controller) struct SnapshotSweeper {
    ctx: Arc<Context>,
    /// Whether the claim store has listed (see `cache::listed`).
    claims_listed: Shared<BoxFuture<'static, bool>>,
}

impl SnapshotSweeper {
    pub(in crate::controller) fn new(
        ctx: &Arc<Context>,
        claims_listed: Shared<BoxFuture<'static, bool>>,
    ) -> Self {
        SnapshotSweeper {
            ctx: Arc::clone(ctx),
            claims_listed,
        }
    }

    /// Sweeps every `--snapshot-orphan-sweep-interval` until `drained` (see [`run`]); not at
    /// all with a zero interval or a driver without snapshots.
    pub(in crate::controller) async fn run<D>(self, drained: impl Fn() -> D)
    where
        D: Future<Output = ()>,
    {
        let interval = self.ctx.settings.snapshot_orphan_sweep_interval;
        if interval.is_zero() || !self.ctx.settings.caps.snapshot {
            return;
        }
        run(&self.ctx, interval, self.claims_listed, drained()).await;
    }
}

/// Sweeps at once, then `interval` after the end of each sweep, until `drained`, if the
/// cluster and the role allow it (see the module comment). Snapshot CRDs installed after the
/// sidecar started are found at a later interval (upstream looks once, at start-up).
pub(in crate::controller) async fn run(
    ctx: &Context,
    interval: Duration,
    claims_listed: Shared<BoxFuture<'static, bool>>,
    drained: impl Future<Output = ()>,
) {
    let mut drained = std::pin::pin!(drained);
    let mut said_unserved = false;
    let mut enabled = false;
    loop {
        let step = async {
            if !enabled {
                if !served(ctx, &mut said_unserved).await {
                    return true;
                }
                // Nothing is decided on claims before their watch has listed.
                if !(allowed(ctx).await && claims_listed.clone().await) {
                    return false;
                }
                enabled = true;
            }
            match sweep(ctx, &claims_listed).await {
                Ok(swept) => debug!(?swept, "snapshot orphan sweep done"),
                Err(error) => warn!(%error, "snapshot orphan sweep removed nothing"),
            }
            true
        };
        tokio::select! {
            () = &mut drained => return,
            go_on = step => if !go_on { return },
        }
        tokio::select! {
            () = &mut drained => return,
            () = tokio::time::sleep(interval) => {}
        }
    }
}

/// Whether the API server serves VolumeSnapshots in `snapshot.storage.k8s.io/v1`; says so
/// once when it does not.
async fn served(ctx: &Context, said_unserved: &mut bool) -> bool {
    let served = match ctx
        .client
        .list_api_group_resources(SNAPSHOT_GROUP_VERSION)
        .await
    {
        Ok(resources) => resources.resources.iter().any(|r| r.kind == SNAPSHOT_KIND),
        Err(_) => false,
    };
    if !served && !*said_unserved {
        *said_unserved = true;
        info!(
            "the API server does not serve {SNAPSHOT_KIND} in {SNAPSHOT_GROUP_VERSION} (the snapshot CRDs are not installed?); the snapshot orphan sweeper waits for them"
        );
    }
    served
}

/// The preflight: one VolumeSnapshot listed. Only Forbidden disables the sweeper (an older
/// role); any other error is left to the sweeps.
async fn allowed(ctx: &Context) -> bool {
    let api: Api<VolumeSnapshot> = Api::all(ctx.client.clone());
    match api.list(&ListParams::default().limit(1)).await {
        Err(kube::Error::Api(status)) if status.code == 403 => {
            info!(
                "the snapshot orphan sweeper is disabled: the sidecar's role lacks list on volumesnapshots.snapshot.storage.k8s.io"
            );
            false
        }
        _ => true,
    }
}

/// One sweep: every VolumeSnapshot with the finalizer that nothing restores from loses it.
/// A removal that fails (gone, changed meanwhile) is left to the next sweep.
pub(in crate::controller) async fn sweep(
    ctx: &Context,
    claims_listed: &Shared<BoxFuture<'static, bool>>,
) -> Result<Swept, SweepError> {
    let api: Api<VolumeSnapshot> = Api::all(ctx.client.clone());
    let protected: Vec<VolumeSnapshot> = api
        .list(&ListParams::default())
        .await
        .map_err(SweepError::ListSnapshots)?
        .items
        .into_iter()
        .filter(|snapshot| {
            snapshot
                .finalizers()
                .iter()
                .any(|f| f == SNAPSHOT_PROTECTION_FINALIZER)
        })
        .collect();
    if protected.is_empty() {
        return Ok(Swept::default());
    }
    // Read after the snapshots, so a restore that protected one of them is seen.
    if !claims_listed.clone().now_or_never().unwrap_or(false) {
        return Err(SweepError::ClaimsNotListed);
    }
    let claims = ctx
        .claims
        .state()
        .iter()
        .map(|claim| claim.to_claim())
        .collect::<Result<Vec<PersistentVolumeClaim>, _>>()?;
    let pending = PendingRestores::new(&claims);
    let in_flight = InFlightSources::new(&ctx.journal.sources_in_flight().await?);
    // One list for all: whose each snapshot is (its content's driver), and its handle.
    let contents = list_contents(ctx).await;
    let mut swept = Swept::default();
    for snapshot in &protected {
        let key = format!(
            "{}/{}",
            snapshot.namespace().unwrap_or_default(),
            snapshot.name_any()
        );
        let content = snapshot
            .status
            .as_ref()
            .and_then(|status| status.bound_volume_snapshot_content_name.as_deref());
        let content = match (&contents, content) {
            (Err(_), _) => SnapshotContent::Unknown,
            (Ok(contents), Some(name)) => {
                contents
                    .get(name)
                    .map_or(SnapshotContent::Missing, |(driver, handle)| {
                        SnapshotContent::Listed {
                            driver,
                            handle: handle.as_deref(),
                        }
                    })
            }
            (Ok(_), None) => SnapshotContent::Missing,
        };
        let verdict = snapshot_verdict(
            snapshot,
            &pending,
            &in_flight,
            content,
            &ctx.settings.config.driver_name,
        );
        match verdict {
            SnapshotVerdict::Release => {
                let api: Api<VolumeSnapshot> = Api::namespaced(
                    ctx.client.clone(),
                    &snapshot.namespace().unwrap_or_default(),
                );
                match remove_finalizer_once(&api, snapshot, SNAPSHOT_PROTECTION_FINALIZER).await {
                    Ok(()) => {
                        swept.released += 1;
                        info!("removed orphaned finalizer from snapshot {key}");
                    }
                    Err(kube::Error::Api(status)) if matches!(status.code, 409 | 422) => {
                        debug!(
                            snapshot = key,
                            "changed meanwhile; will retry at the next sweep"
                        );
                    }
                    Err(kube::Error::Api(status)) if status.code == 403 => {
                        info!(
                            snapshot = key,
                            "no permission to remove the orphaned finalizer (patch on volumesnapshots.snapshot.storage.k8s.io)"
                        );
                    }
                    Err(error) => {
                        warn!(snapshot = key, %error, "failed to remove the orphaned finalizer")
                    }
                }
            }
            SnapshotVerdict::Keep(hold) => {
                swept.kept += 1;
                debug!(snapshot = key, reason = %hold, "snapshot still needed");
            }
            SnapshotVerdict::Untouched => {}
        }
    }
    Ok(swept)
}

/// Every VolumeSnapshotContent's driver and `status.snapshotHandle`, by name; `Err` (logged)
/// when they cannot be listed, and the sweep then releases nothing.
async fn list_contents(ctx: &Context) -> Result<HashMap<String, (String, Option<String>)>, ()> {
    let api: Api<VolumeSnapshotContent> = Api::all(ctx.client.clone());
    match api.list(&ListParams::default()).await {
        Ok(list) => Ok(list
            .items
            .into_iter()
            .map(|content| {
                let handle = content.status.and_then(|status| status.snapshot_handle);
                (
                    content.metadata.name.unwrap_or_default(),
                    (content.spec.driver, handle),
                )
            })
            .collect()),
        Err(error) => {
            warn!(%error, "failed to list VolumeSnapshotContents; no snapshot is released this sweep");
            Err(())
        }
    }
}

#[cfg(test)]
mod tests;
