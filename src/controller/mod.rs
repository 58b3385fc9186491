//! The executors: watch PVCs, PVs, StorageClasses (and VolumeAttachments, for a driver that
//! attaches volumes), and act on the decisions of
//! `crate::provision` by calling the driver and the Kubernetes API.
//!
//! Two kube-runtime controllers run side by side, one over claims (provisioning) and one over
//! volumes (deletion), plus the orphan reaper over operations in flight and, for a driver that
//! clones or restores, the two that take the data sources' protection finalizers off again
//! (`clone_protection`, `snapshot_sweeper`). The controllers never run two reconciles of the
//! same object at once; the driver calls are bounded by [`limits::CallLimits`].

mod actions;
pub mod backoff;
pub mod cache;
mod capacity_publisher;
mod claims;
mod clone_protection;
mod context;
mod drain;
pub mod events;
mod finalizers;
#[cfg(test)]
mod fixtures;
mod grants;
pub mod limits;
mod measured;
mod orphans;
mod ownership;
mod queue;
mod snapshot_sweeper;
mod sources;
mod topology_cache;
mod volumes;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, Stream, StreamExt, TryStreamExt, future};

use k8s_openapi::api::storage::v1::StorageClass;
use kube::runtime::controller::{self, Config, Controller};
use kube::runtime::reflector::{Lookup, ObjectRef, Store};
use tracing::{debug, info, warn};

use crate::csi_client::CsiController;
use crate::fence::LeaseFence;
use crate::journal::{Journal, JournalError};
use crate::kube_client::ApiClients;
use crate::metrics::{CLAIMS_QUEUE, Metrics, VOLUMES_QUEUE};
use crate::provision::{SingleNode, claim_class_name};
pub use capacity_publisher::{CapacitySettings, SegmentSource};
use claims::ClaimReconciler;
use clone_protection::CloneProtection;
use context::{Context, FencedDriver, Stores};
pub use context::{NodeDeployment, Settings, TopologyFlags};
use events::EventRecorder;
use measured::Measured;
use topology_cache::TopologyView;
use volumes::VolumeReconciler;

/// Periodic re-examination of every claim and volume, as upstream's 15-minute resync.
const RESYNC_PERIOD: Duration = Duration::from_secs(15 * 60);
/// The resync of claims under `--drain`: a claim whose operation the reaper finished (its PV
/// already existed) may see no change of its own, and its finalizer must still come off.
const DRAIN_RESYNC_PERIOD: Duration = Duration::from_secs(5);

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
    let worker_threads = settings.worker_threads;
    let cloning_protection_threads = settings.cloning_protection_threads.max(1);
    let sweep_interval = settings.snapshot_orphan_sweep_interval;
    let journal_timeout = settings.journal_timeout;
    let initial_list = cache::probe_initial_list(&client).await;
    // With --enable-capacity, every class event, and a Node label or CSINode key change of our
    // driver, wakes the capacity controller.
    let capacity_changes = settings
        .capacity
        .as_ref()
        .map(|_| Arc::new(tokio::sync::Notify::new()));
    let watches = cache::watch_all(&client, initial_list, capacity_changes.as_ref());
    let (claims, claim_stream) = watches.claims;
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
    let (topology, topology_watches) = match (&settings.node, settings.caps.topology) {
        (_, false) => (None, future::ready(()).boxed()),
        // Node mode sees this node only, as NodeGetInfo describes it: nothing to watch.
        (Some(node), true) => {
            let view = TopologyView::Node(SingleNode {
                name: node.name.clone(),
                segment: node.segment.clone(),
            });
            (Some(view), future::ready(()).boxed())
        }
        (None, true) => {
            let (cache, nodes, csinodes) = topology_cache::watch_topology(
                &client,
                initial_list,
                &settings.config.driver_name,
                capacity_changes.as_ref(),
            );
            let watches = future::join(drive(nodes), drive(csinodes)).map(|_| ());
            (Some(TopologyView::Watched(cache)), watches.boxed())
        }
    };
    // Not awaited before the controllers start, unlike upstream's (A6): only a claim with a
    // data source in another namespace waits for it.
    let (grants, grant_watch) = if settings.config.cross_namespace_data_sources {
        let (cache, changes) = grants::watch_grants(&client, initial_list);
        (Some(cache), drive(changes).boxed())
    } else {
        (None, future::ready(()).boxed())
    };
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
    // Upstream's two queues of claims share the name: their counts add up.
    let claim_queue = Measured::new(metrics.queue(CLAIMS_QUEUE));
    let clone_queue = Measured::new(metrics.queue(CLAIMS_QUEUE));
    let volume_queue = Measured::new(metrics.queue(VOLUMES_QUEUE));
    let stores = Stores {
        claims: claims.clone(),
        volumes: volumes.clone(),
        classes,
        topology,
        grants,
        attachments,
    };
    let driver = FencedDriver { csi: driver, fence };
    let ctx = Context::new(client, driver, stores, events, metrics, journal, &settings);
    let (ctx, capacity) = match capacity {
        Some((refresh, started)) => (ctx.with_capacity_refresh(refresh), Some(started)),
        None => (ctx, None),
    };
    let ctx = Arc::new(ctx);

    if settings.draining {
        info!(
            "--drain: no new provisioning; a claim without a recorded operation gets no CreateVolume and no finalizer. Finishing every recorded operation, removing the provisioning-protection finalizer from every claim, then exiting"
        );
    }
    let claims_listed = cache::listed(&claims);
    let (drain_tx, drain_rx) = tokio::sync::watch::channel(false);
    let (handed_over_tx, mut handed_over) = tokio::sync::oneshot::channel();
    tokio::spawn({
        let (ctx, draining) = (Arc::clone(&ctx), settings.draining);
        let claims_listed = claims_listed.clone();
        async move {
            let complete = async {
                if draining {
                    drain::until_complete(&ctx, claims_listed).await;
                } else {
                    future::pending::<()>().await;
                }
            };
            tokio::select! {
                () = drain => {}
                () = complete => { let _ = handed_over_tx.send(()); }
            }
            let _ = drain_tx.send(true);
        }
    });
    let drained = move || {
        let mut rx = drain_rx.clone();
        async move {
            let _ = rx.wait_for(|drained| *drained).await;
        }
    };

    // The cloning-protection controller sees the claims being deleted that carry its
    // finalizer, from the claim watch the claim controller drives.
    let (protected_tx, protected_rx) = futures::channel::mpsc::unbounded();
    let claim_stream = {
        let (ctx, cloning) = (Arc::clone(&ctx), ctx.caps.clone);
        claim_stream.inspect_ok(move |claim| {
            if cloning && CloneProtection::has_work(claim, &ctx) {
                let _ = protected_tx.unbounded_send(claim.clone());
            }
        })
    };
    let clone_protection = {
        let (ctx, claims, claims_listed) =
            (Arc::clone(&ctx), claims.clone(), claims_listed.clone());
        let (drained_early, drained) = (drained(), drained());
        async move {
            // Started once the claims have listed: kube-runtime's controller would wait on the
            // store itself, a second waiter beside the claim controller's (see `cache::listed`),
            // and no decision may take a partial cache for "no clone".
            if !ctx.caps.clone {
                return;
            }
            tokio::select! {
                listed = claims_listed => if !listed { return },
                () = drained_early => return,
            }
            let resync = resync_with_work(
                claims.clone(),
                &ctx,
                CloneProtection::has_work,
                RESYNC_PERIOD,
            );
            let results = Controller::for_stream(
                clone_queue.objects(protected_rx.map(Ok::<_, kube::runtime::watcher::Error>)),
                claims,
            )
            .with_config(
                Config::default()
                    .concurrency(u16::try_from(cloning_protection_threads).unwrap_or(u16::MAX)),
            )
            .reconcile_on(clone_queue.refs(resync))
            .graceful_shutdown_on(drained)
            .run(
                clone_queue.reconcile(CloneProtection::reconcile),
                never_fails,
                Arc::new(CloneProtection::new(ctx)),
            );
            clone_queue.results(results).for_each(log_result).await;
        }
    };
    let sweeper = {
        let (ctx, claims_listed, drained) = (Arc::clone(&ctx), claims_listed.clone(), drained());
        async move {
            if sweep_interval.is_zero() || !ctx.caps.snapshot {
                return;
            }
            snapshot_sweeper::run(&ctx, sweep_interval, claims_listed, drained).await;
        }
    };

    let volumes_ready = volumes.clone();
    let claim_results = Controller::for_stream(
        claim_queue.objects(with_work(claim_stream, &ctx, ClaimReconciler::has_work)),
        claims.clone(),
    )
    .watches_stream(class_stream, {
        let (claims, ctx, queue) = (claims.clone(), Arc::clone(&ctx), claim_queue.clone());
        move |class: StorageClass| {
            let name = class.metadata.name.unwrap_or_default();
            let due = claims
                .state()
                .into_iter()
                // Nearly every claim has no work: deciding that first parses each cached
                // claim once, and only the few with work a second time for their class.
                .filter(|claim| {
                    ClaimReconciler::has_work(claim, &ctx)
                        && claim
                            .to_claim()
                            .is_ok_and(|pvc| claim_class_name(&pvc) == name)
                })
                .map(|claim| ObjectRef::from_obj(claim.as_ref()));
            queue.mapped(due).collect::<Vec<_>>()
        }
    })
    .reconcile_on(claim_queue.refs(resync_with_work(
        claims.clone(),
        &ctx,
        ClaimReconciler::has_work,
        if settings.draining {
            DRAIN_RESYNC_PERIOD
        } else {
            RESYNC_PERIOD
        },
    )))
    .graceful_shutdown_on(drained())
    .run(
        claim_queue.reconcile(ClaimReconciler::reconcile),
        never_fails,
        Arc::clone(&ctx),
    );
    let claim_controller = claim_queue.results(claim_results).for_each(log_result);
    let mut volume_controller = Controller::for_stream(
        volume_queue.objects(with_work(volume_stream, &ctx, VolumeReconciler::has_work)),
        volumes.clone(),
    );
    if let Some(detached) = detached {
        // Unlike upstream, a PV waiting for its attachment to go is retried as soon as it has
        // gone, not at the next backoff step (up to --retry-interval-max later).
        let (volumes, ctx, queue) = (volumes.clone(), Arc::clone(&ctx), volume_queue.clone());
        volume_controller = volume_controller.watches_stream(detached, move |attachment| {
            let pv = ObjectRef::new(attachment.attachment().persistent_volume_name?);
            let due = volumes
                .get(&pv)
                .is_some_and(|cached| VolumeReconciler::has_work(&cached, &ctx))
                .then_some(pv);
            queue.mapped(due).next()
        });
    }
    let volume_results = volume_controller
        .reconcile_on(volume_queue.refs(resync_with_work(
            volumes,
            &ctx,
            VolumeReconciler::has_work,
            RESYNC_PERIOD,
        )))
        .graceful_shutdown_on(drained())
        .run(
            volume_queue.reconcile(VolumeReconciler::reconcile),
            never_fails,
            Arc::clone(&ctx),
        );
    let volume_controller = volume_queue.results(volume_results).for_each(log_result);
    let reaper = orphans::reap_orphans(Arc::clone(&ctx), worker_threads, drained());
    let capacity = {
        let drained = drained.clone();
        async move {
            if let Some(started) = capacity {
                started.run(drained).await;
            }
        }
    };
    let store_watches = {
        let drained = drained();
        async move {
            tokio::select! {
                _ = future::join(topology_watches, grant_watch) => {}
                () = drained => {}
            }
        }
    };
    tokio::join!(
        store_watches,
        until_drained_if_never_ready(claim_controller, claims_listed, drained()),
        until_drained_if_never_ready(
            volume_controller,
            async move { volumes_ready.wait_until_ready().await.is_ok() },
            drained()
        ),
        reaper,
        clone_protection,
        sweeper,
        capacity
    );
    let flushed = ctx.journal.flush(journal_timeout).await;
    // The reaper ends only at the drain signal, which is sent after the hand-over is.
    if handed_over.try_recv().is_err() {
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

/// A mutex's guard, also after a panic of another holder: every state behind these mutexes is
/// updated in single assignments, so a poisoned one is still whole.
fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Polls a watch that only fills a store (no controller reads its stream).
async fn drive<K, E: std::fmt::Display>(changes: impl Stream<Item = Result<K, E>>) {
    changes
        .for_each(|change| {
            if let Err(error) = change {
                warn!(%error, "watch error");
            }
            future::ready(())
        })
        .await;
}

/// Runs a controller to its end, or stops it at `drained` if its store has not listed yet.
///
/// kube-runtime holds every reconcile until the controller's store has listed once, and its
/// graceful shutdown waits for that hold to end; it ends the watch by no longer polling it, so
/// a drain that comes first waits forever. That happened to a sidecar SIGTERMed 90 ms after it
/// became leader: it kept renewing the Lease, so the other replica never took over. Before the
/// store is ready no reconcile has started, so there is nothing to drain.
async fn until_drained_if_never_ready(
    controller: impl Future<Output = ()>,
    store_ready: impl Future<Output = bool>,
    drained: impl Future<Output = ()>,
) {
    let mut controller = std::pin::pin!(controller);
    tokio::select! {
        biased;
        () = &mut controller => return,
        true = store_ready => {}
        () = drained => {
            debug!("drained before the first list completed: nothing to wait for");
            return;
        }
    }
    controller.await;
}

/// The changed objects that have work. An object without work is never queued: kube-runtime's
/// scheduler keeps the memory of its longest queue for good, and at start-up every cached
/// object arrives at once (10 MiB kept for 10,000 claims and 10,000 PVs).
fn with_work<K, E>(
    changed: impl Stream<Item = Result<K, E>> + Send + 'static,
    ctx: &Arc<Context>,
    has_work: fn(&K, &Context) -> bool,
) -> impl Stream<Item = Result<K, E>> + Send + 'static
where
    K: Send + 'static,
    E: Send + 'static,
{
    let ctx = Arc::clone(ctx);
    changed.try_filter(move |object| future::ready(has_work(object, &ctx)))
}

/// Every `period`, the cached objects that have work (upstream re-examines every object each
/// 15 minutes; for those without work that finds nothing, so they are not queued, see
/// [`with_work`]).
fn resync_with_work<K>(
    store: Store<K>,
    ctx: &Arc<Context>,
    has_work: fn(&K, &Context) -> bool,
    period: Duration,
) -> impl Stream<Item = ObjectRef<K>> + Send + 'static
where
    K: Lookup<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    let ctx = Arc::clone(ctx);
    futures::stream::unfold((), move |()| async move {
        tokio::time::sleep(period).await;
        Some(((), ()))
    })
    .flat_map(move |()| {
        let due: Vec<ObjectRef<K>> = store
            .state()
            .iter()
            .filter(|object| has_work(object, &ctx))
            .map(|object| ObjectRef::from_obj(object.as_ref()))
            .collect();
        futures::stream::iter(due)
    })
}

/// The reconcilers report and retry their own failures; see `provisioner` and `deleter`.
fn never_fails<K, C>(_: Arc<K>, error: &std::convert::Infallible, _: Arc<C>) -> controller::Action {
    match *error {}
}

fn log_result<K: kube::Resource, E: std::fmt::Debug, Q: std::fmt::Debug>(
    result: Result<(ObjectRef<K>, controller::Action), controller::Error<E, Q>>,
) -> future::Ready<()> {
    match result {
        Ok((object, _)) => debug!(%object, "reconciled"),
        Err(controller::Error::ObjectNotFound(object)) => {
            debug!(%object, "object gone before its reconcile")
        }
        Err(error) => warn!(?error, "controller error"),
    }
    future::ready(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    #[tokio::test]
    async fn a_drain_before_the_first_list_does_not_wait_for_the_held_controller() {
        let held_forever = future::pending::<()>();
        tokio::time::timeout(
            Duration::from_secs(5),
            until_drained_if_never_ready(held_forever, future::pending(), future::ready(())),
        )
        .await
        .expect("returned at the drain");
    }

    #[tokio::test]
    async fn once_the_store_is_ready_a_drain_waits_for_the_controller_to_finish() {
        let finished = Arc::new(AtomicBool::new(false));
        let (finish, finishing) = tokio::sync::oneshot::channel::<()>();
        let controller = {
            let finished = Arc::clone(&finished);
            async move {
                let _ = finishing.await;
                finished.store(true, Ordering::SeqCst);
            }
        };
        let run = tokio::spawn(until_drained_if_never_ready(
            controller,
            future::ready(true),
            future::ready(()),
        ));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!run.is_finished(), "stopped before the controller finished");
        finish.send(()).unwrap();
        run.await.unwrap();
        assert!(finished.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn a_store_whose_writer_is_gone_leaves_the_drain_to_decide() {
        tokio::time::timeout(
            Duration::from_secs(5),
            until_drained_if_never_ready(
                future::pending::<()>(),
                future::ready(false),
                tokio::time::sleep(Duration::from_millis(20)),
            ),
        )
        .await
        .expect("returned at the drain");
    }
}
