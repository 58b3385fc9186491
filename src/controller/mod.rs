//! The executors: watch PVCs, PVs, StorageClasses (and VolumeAttachments, for a driver that
//! attaches volumes), and act on the decisions of
//! `crate::provision` by calling the driver and the Kubernetes API.
//!
//! Two kube-runtime controllers run side by side, one over claims (provisioning) and one over
//! volumes (deletion), plus the orphan reaper over operations in flight and, for a driver that
//! clones or restores, the two that take the data sources' protection finalizers off again
//! (`clone_protection`, `snapshot_sweeper`). The controllers never run two reconciles of the
//! same object at once; the driver calls are bounded by [`limits::CallLimits`].
//!
//! One folder per job, top down, each importing only from the folders after it:
//! `provisioning` (claims, node mode's ownership race, data sources, the orphan reaper, the
//! drain), `deletion` (volumes), `source_protection` (the clone and snapshot finalizers off
//! again), `volume_audit`, `shared` (the `Context` and the actions taken through it),
//! `capacity`, `cluster_views` (topology and ReferenceGrant caches) and `runtime` (what every
//! controller runs on). `testing` (fixtures, simulation) is compiled only for tests.

mod capacity;
mod cluster_views;
mod deletion;
mod provisioning;
mod runtime;
mod shared;
mod source_protection;
#[cfg(test)]
mod testing;
mod volume_audit;

// The public paths of the modules that were directly under `controller` before it had folders.
pub use runtime::{backoff, cache, events, limits};

use std::future::Future;
use std::sync::Arc;

use futures::{FutureExt, future};
use tracing::{Instrument, info_span, warn};

use crate::csi_client::CsiController;
use crate::fence::LeaseFence;
use crate::journal::{Journal, JournalError};
use crate::kube_client::ApiClients;
use crate::metrics::Metrics;
use crate::provision::SingleNode;
use capacity::capacity_publisher;
pub use capacity::capacity_publisher::{CapacitySettings, SegmentSource};
use cluster_views::{grants, topology_cache};
use deletion::volumes::VolumeController;
use provisioning::claims::ClaimController;
use provisioning::drain;
use provisioning::orphans::Reaper;
use runtime::events::EventRecorder;
use runtime::runner::drive;
use shared::context::{Context, FencedDriver, Stores};
pub use shared::context::{NodeDeployment, Settings, TopologyFlags};
use source_protection::clone_protection::CloneProtectionController;
use source_protection::snapshot_sweeper::SnapshotSweeper;
use topology_cache::TopologyView;
use volume_audit::audit::Auditor;

/// How [`run`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// `drain` resolved (a signal, or a failing task of the sidecar).
    Stopped,
    /// `--drain`: nothing is left in flight and no claim carries our finalizer, and the
    /// journal's removals are stored.
    HandedOver,
}

/// Loads the journal, then runs the provisioning and deletion controllers and the orphan
/// reaper until `drain` resolves (or, with `settings.draining`, until the hand-over is
/// complete); lets the reconciles in flight finish (their driver calls included), stores the
/// journal's last changes and returns.
pub async fn run(
    clients: ApiClients,
    driver: Arc<dyn CsiController>,
    metrics: Arc<Metrics>,
    settings: Settings,
    fence: LeaseFence,
    drain: impl Future<Output = ()> + Send + Sync + 'static,
) -> Result<Ended, JournalError> {
    let ApiClients {
        client,
        prepaid,
        rate_limit,
        capacity: capacity_client,
    } = clients;
    let journal = Journal::load(
        prepaid,
        rate_limit.clone(),
        &settings.journal_namespace,
        &settings.journal_scope,
        &settings.config.driver_name,
        settings.journal_timeout,
    )
    .await?;
    journal.watch_shards();
    let initial_list = cache::probe_initial_list(&client).await;
    // With --enable-capacity, every class event, and a Node label or CSINode key change of our
    // driver, wakes the capacity controller.
    let capacity_changes = settings
        .capacity
        .as_ref()
        .map(|_| Arc::new(tokio::sync::Notify::new()));
    let watches = cache::watch_all(&client, initial_list, capacity_changes.as_ref());
    let (claims, claim_stream) = watches.claims;
    let claims_listed = watches.claims_listed;
    let (volumes, volume_stream) = watches.volumes;
    let (classes, class_stream) = watches.classes;
    // Only a driver that attaches volumes needs the attach check, as upstream.
    let (attachments, detached) = settings
        .caps
        .publish_unpublish
        .then(|| cache::watch_attachments(&client, initial_list))
        .unzip();
    let events = EventRecorder::new(
        client.clone(),
        settings.event_component.clone(),
        settings.hostname.clone(),
        rate_limit,
    );
    let (topology, topology_watches) =
        topology_view(&client, &settings, initial_list, capacity_changes.as_ref());
    let (grants, grant_watch) = grant_cache(&client, &settings, initial_list);
    // The capacity client exists exactly with --enable-capacity, as the settings do.
    let capacity = match (&settings.capacity, capacity_changes, capacity_client) {
        (Some(capacity_settings), Some(changes), Some(capacity_client)) => {
            Some(capacity_publisher::start(
                capacity_settings,
                changes,
                capacity_publisher::CapacityInputs {
                    client: capacity_client,
                    driver: Arc::clone(&driver),
                    classes: classes.clone(),
                    segments: capacity_publisher::segments(
                        &capacity_settings.segments,
                        topology.as_ref(),
                    ),
                    metrics: Arc::clone(&metrics),
                    retry_interval_start: settings.retry_interval_start,
                    retry_interval_max: settings.retry_interval_max,
                },
            ))
        }
        _ => None,
    };
    let stores = Stores {
        claims,
        claims_listed,
        volumes,
        classes,
        topology,
        grants,
        attachments,
    };
    let driver = FencedDriver { csi: driver, fence };
    let ctx = Context::new(client, driver, stores, events, metrics, journal, settings);
    let (ctx, capacity) = match capacity {
        Some((refresh, started)) => (ctx.with_capacity_refresh(refresh), Some(started)),
        None => (ctx, None),
    };
    let ctx = Arc::new(ctx);

    let claims_listed = ctx.claims_listed.clone();
    let (drain_signal, handed_over) = drain::start(&ctx, claims_listed.clone(), drain);
    let drained = || drain_signal.wait();
    let (claim_stream, clone_protection) =
        CloneProtectionController::new(&ctx, claim_stream, claims_listed.clone());
    let claim_controller =
        ClaimController::new(&ctx, claim_stream, class_stream, claims_listed.clone());
    let volume_controller = VolumeController::new(&ctx, volume_stream, detached);
    let reaper = Reaper::new(&ctx);
    let auditor = Auditor::new(&ctx);
    let sweeper = SnapshotSweeper::new(&ctx, claims_listed);
    let capacity = async {
        if let Some(started) = capacity {
            started.run(drained).await;
        }
    };
    let store_watches = async {
        tokio::select! {
            _ = future::join(topology_watches, grant_watch) => {}
            () = drained() => {}
        }
    };
    tokio::join!(
        store_watches.instrument(info_span!("store_watches")),
        claim_controller
            .run(drained)
            .instrument(info_span!("claims")),
        volume_controller
            .run(drained)
            .instrument(info_span!("volumes")),
        reaper.run(drained).instrument(info_span!("orphans")),
        clone_protection
            .run(drained)
            .instrument(info_span!("clone_protection")),
        sweeper
            .run(drained)
            .instrument(info_span!("snapshot_sweeper")),
        capacity.instrument(info_span!("capacity_publisher")),
        async {
            if let Some(auditor) = auditor {
                auditor.run(drained).await;
            }
        }
        .instrument(info_span!("audit")),
    );
    finish(&ctx, handed_over).await
}

/// The topology claims are planned against (`None` without the driver's capability) and the
/// watches that keep it; node mode sees its node only, as NodeGetInfo describes it, and
/// watches nothing.
fn topology_view(
    client: &kube::Client,
    settings: &Settings,
    initial_list: cache::InitialList,
    changes: Option<&Arc<tokio::sync::Notify>>,
) -> (Option<TopologyView>, future::BoxFuture<'static, ()>) {
    match (&settings.node, settings.caps.topology) {
        (_, false) => (None, future::ready(()).boxed()),
        (Some(node), true) => {
            let view = TopologyView::Node(SingleNode {
                name: node.name.clone(),
                segment: node.segment.clone(),
            });
            (Some(view), future::ready(()).boxed())
        }
        (None, true) => {
            let (cache, nodes, csinodes) = topology_cache::watch_topology(
                client,
                initial_list,
                &settings.config.driver_name,
                changes,
            );
            let watches = future::join(drive(nodes), drive(csinodes)).map(|_| ());
            (Some(TopologyView::Watched(cache)), watches.boxed())
        }
    }
}

/// The ReferenceGrant cache and its watch, with `--cross-namespace-data-sources`. Not awaited
/// before the controllers start, unlike upstream's (A6): only a claim with a data source in
/// another namespace waits for it.
fn grant_cache(
    client: &kube::Client,
    settings: &Settings,
    initial_list: cache::InitialList,
) -> (Option<grants::GrantCache>, future::BoxFuture<'static, ()>) {
    if settings.config.cross_namespace_data_sources {
        let (cache, changes) = grants::watch_grants(client, initial_list);
        (Some(cache), drive(changes).boxed())
    } else {
        (None, future::ready(()).boxed())
    }
}

/// Once every controller has ended: the journal's last changes stored, and how the run ended.
async fn finish(ctx: &Context, handed_over: drain::HandedOver) -> Result<Ended, JournalError> {
    let flushed = ctx.journal.flush(ctx.settings.journal_timeout).await;
    // The reaper ends only at the drain signal, which is sent after the hand-over is.
    if !handed_over.happened() {
        if let Err(error) = flushed {
            warn!(%error, "the next leader replays what is left");
        }
        return Ok(Ended::Stopped);
    }
    // The provisioner taking over keeps no journal: a removal left unwritten would make a
    // later sidecar of ours replay an operation that is over. Harmless (see journal.md), but
    // the drain promises an empty journal.
    flushed?;
    Ok(Ended::HandedOver)
}
