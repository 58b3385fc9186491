//! The CSIStorageCapacity controller (`--enable-capacity`): publishes what GetCapacity reports
//! for every (topology segment, StorageClass of our driver) as upstream's objects, in
//! `NAMESPACE`, and deletes the objects with our labels that no item wants. What to publish
//! and which object is whose is decided by `provision::storage_capacity`; this module does the IO.
//!
//! One loop decides, `--capacity-threads` workers act. The loop recomputes the wanted items and
//! matches them with the watched objects whenever a class or one of our objects changes, or a
//! Node's labels or a CSINode's keys for our driver (then items without an object are queued,
//! obsolete objects are queued for deletion, and the gauges set); every
//! `--capacity-poll-interval` (the first time at start) it queues every item; a provisioning or
//! deletion queues the items it may have changed (a bounded backlog: the poll catches up). A
//! queued item waits at most once, one worker at a time works on it, and a failed one is
//! retried with its own backoff (`--retry-interval-start`, `--retry-interval-max`).

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{Stream, StreamExt, TryStreamExt, future};
use k8s_openapi::api::storage::v1::{CSIStorageCapacity, StorageClass};
use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::sync::{Notify, mpsc};
use tracing::{debug, info, warn};

use crate::controller::cluster_views::topology_cache::{TopologyCache, TopologyView};
use crate::controller::runtime::backoff::Backoff;
use crate::controller::runtime::cache::listed;
use crate::controller::runtime::queue::WorkQueue;
use crate::controller::runtime::runner::lock;
use crate::csi_client::{CallError, CsiController};
use crate::metrics::{CAPACITY_QUEUE, Metrics};
use crate::provision::storage_capacity::{
    Capacity, Matching, ObjectTemplate, Obsolete, PendingCreates, RefreshCause, Segment,
    SyncTarget, WorkItem, being_deleted, desired_items, get_capacity_request, match_objects,
    object_of, refreshed_items, still_obsolete,
};

/// `--enable-capacity` settings, from flags, env and the owner lookup (`app::capacity_start`).
#[derive(Clone, Debug)]
pub struct CapacitySettings {
    pub template: ObjectTemplate,
    pub segments: SegmentSource,
    /// `--capacity-poll-interval`.
    pub poll_interval: Duration,
    /// `--capacity-threads`.
    pub threads: usize,
    /// `--capacity-for-immediate-binding`.
    pub immediate_binding: bool,
}

/// Where the segments come from.
#[derive(Clone, Debug, PartialEq)]
pub enum SegmentSource {
    /// One segment for good: the node's with `--node-deployment`, the nil segment for a
    /// central provisioner whose driver has no topology.
    Fixed(Segment),
    /// The CSINodes listing our driver and their Nodes' labels.
    Cluster,
}

/// Where the segments are read from at run time.
#[derive(Clone)]
pub enum Segments {
    Fixed(Segment),
    Cluster(TopologyCache),
}

impl Segments {
    fn current(&self) -> BTreeSet<Segment> {
        match self {
            Segments::Fixed(segment) => BTreeSet::from([segment.clone()]),
            Segments::Cluster(cache) => cache.capacity_segments(),
        }
    }

    async fn ready(&self) -> bool {
        match self {
            Segments::Fixed(_) => true,
            Segments::Cluster(cache) => cache.wait_until_ready().await,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CapacityError {
    #[error("CSI GetCapacity for {item}: {source}")]
    GetCapacity {
        item: WorkItem,
        #[source]
        source: CallError,
    },
    #[error("create CSIStorageCapacity for {item}: {source}")]
    Create {
        item: WorkItem,
        #[source]
        source: kube::Error,
    },
    #[error("read created CSIStorageCapacity {name} for {item}: {source}")]
    ReadCreated {
        name: String,
        item: WorkItem,
        #[source]
        source: kube::Error,
    },
    #[error("update CSIStorageCapacity {name} for {item}: {source}")]
    Update {
        name: String,
        item: WorkItem,
        #[source]
        source: kube::Error,
    },
    #[error("delete obsolete CSIStorageCapacity {name}: {source}")]
    Delete {
        name: String,
        #[source]
        source: kube::Error,
    },
}

/// One unit of work of the queue.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Work {
    Sync(WorkItem),
    Delete(Obsolete),
}

/// How many refresh requests may wait for the controller's loop. A burst beyond (thousands of
/// provisionings between two turns of the loop) drops requests rather than memory: the poll
/// queries every item anyway.
const REFRESH_BACKLOG: usize = 1024;

/// Sends the refresh requests of the claim and volume reconcilers to the controller.
#[derive(Clone)]
pub struct CapacityRefresh(mpsc::Sender<RefreshCause>);

impl CapacityRefresh {
    pub fn channel() -> (Self, mpsc::Receiver<RefreshCause>) {
        let (sender, receiver) = mpsc::channel(REFRESH_BACKLOG);
        (CapacityRefresh(sender), receiver)
    }

    /// Asks for the items `cause` may have changed to be queried again, without waiting: a
    /// full backlog drops the request (the next poll catches up), and a controller that has
    /// stopped needs nothing.
    pub fn request(&self, cause: RefreshCause) {
        if let Err(mpsc::error::TrySendError::Full(cause)) = self.0.try_send(cause) {
            debug!(
                ?cause,
                "capacity refresh backlog full: the next poll refreshes these objects"
            );
        }
    }
}

/// The controller's state, shared by the loop and the workers.
pub struct CapacityController {
    client: Client,
    driver: Arc<dyn CsiController>,
    template: ObjectTemplate,
    classes: Store<StorageClass>,
    segments: Segments,
    objects: Store<CSIStorageCapacity>,
    /// Objects created and not reported by the watch yet.
    pending: Mutex<PendingCreates>,
    immediate_binding: bool,
    metrics: Arc<Metrics>,
    queue: WorkQueue<Work>,
    backoff: Mutex<Backoff<Work>>,
    /// The items of the last recompute; a worker acts only on a wanted item.
    desired: Mutex<BTreeSet<WorkItem>>,
}

/// The watch of our objects: `NAMESPACE`, our two labels.
struct ObjectWatch<S> {
    store: Store<CSIStorageCapacity>,
    events: S,
}

/// Starts watching the objects `template` describes; every event also signals `changes`.
fn watch_objects(
    client: &Client,
    template: &ObjectTemplate,
    changes: Arc<Notify>,
) -> ObjectWatch<impl Stream<Item = Result<(), watcher::Error>> + Send + 'static + use<>> {
    let api = Api::<CSIStorageCapacity>::namespaced(client.clone(), &template.namespace);
    let config = watcher::Config::default()
        .labels(&template.label_selector())
        .any_semantic();
    let (store, writer) = reflector::store();
    let events = watcher(api, config)
        .default_backoff()
        .reflect(writer)
        .map_ok(move |_| changes.notify_one());
    ObjectWatch { store, events }
}

/// What [`CapacityController::new`] needs besides the settings.
pub struct CapacityInputs {
    /// The capacity client (`--kube-api-capacity-qps`, `--kube-api-capacity-burst`).
    pub client: Client,
    pub driver: Arc<dyn CsiController>,
    pub classes: Store<StorageClass>,
    pub segments: Segments,
    pub metrics: Arc<Metrics>,
    pub retry_interval_start: Duration,
    pub retry_interval_max: Duration,
}

impl CapacityController {
    pub fn new(
        inputs: CapacityInputs,
        settings: &CapacitySettings,
        objects: Store<CSIStorageCapacity>,
    ) -> Self {
        let queue = WorkQueue::new(inputs.metrics.queue(CAPACITY_QUEUE));
        CapacityController {
            client: inputs.client,
            driver: inputs.driver,
            template: settings.template.clone(),
            classes: inputs.classes,
            segments: inputs.segments,
            objects,
            pending: Mutex::new(PendingCreates::default()),
            immediate_binding: settings.immediate_binding,
            metrics: inputs.metrics,
            queue,
            backoff: Mutex::new(Backoff::new(
                inputs.retry_interval_start,
                inputs.retry_interval_max,
            )),
            desired: Mutex::new(BTreeSet::new()),
        }
    }

    fn api(&self) -> Api<CSIStorageCapacity> {
        Api::namespaced(self.client.clone(), &self.template.namespace)
    }

    /// The wanted items now, remembered for the workers.
    fn recompute(&self) -> (BTreeSet<WorkItem>, Matching) {
        let segments = self.segments.current();
        let classes = self.classes.state();
        let desired = desired_items(
            &segments,
            classes.iter().map(AsRef::as_ref),
            &self.template.driver,
            self.immediate_binding,
        );
        let matching = match_objects(&desired, self.objects.state());
        self.metrics.set_capacity_objects(
            desired.len(),
            matching.linked.len(),
            matching.obsolete.len(),
        );
        lock(&self.pending).settle(&desired, |name| {
            let object = ObjectRef::new(name).within(&self.template.namespace);
            self.objects.get(&object).is_some()
        });
        *lock(&self.desired) = desired.clone();
        (desired, matching)
    }

    /// After a change: obsolete objects go and items without an object are created, unless
    /// their last attempt failed (then the retry comes after its backoff); with `every_item`
    /// (the poll) every item is queried again.
    fn queue_changes(&self, every_item: bool) {
        let (desired, matching) = self.recompute();
        // Work that failed waits for its retry, whatever changes meanwhile.
        let waiting_retry = |work: &Work| lock(&self.backoff).failures(work) > 0;
        for obsolete in matching.obsolete {
            let work = Work::Delete(obsolete);
            if !waiting_retry(&work) {
                self.queue.add(work);
            }
        }
        for item in desired {
            // A create the watch has not reported yet is checked by the poll.
            let missing =
                !matching.linked.contains_key(&item) && !lock(&self.pending).pending(&item);
            let work = Work::Sync(item);
            if every_item || (missing && !waiting_retry(&work)) {
                self.queue.add(work);
            }
        }
    }

    fn queue_refresh(&self, cause: &RefreshCause) {
        let refresh = refreshed_items(&lock(&self.desired), cause);
        if refresh.skipped_terms > 0 {
            warn!(
                terms = refresh.skipped_terms,
                "node affinity terms that are not plain topology segments: their capacity is refreshed at the next poll"
            );
        }
        for item in refresh.items {
            self.queue.add(Work::Sync(item));
        }
    }

    async fn work(&self, work: &Work) -> Result<(), CapacityError> {
        match work {
            Work::Sync(item) => self.sync(item).await,
            Work::Delete(obsolete) => self.delete(obsolete).await,
        }
    }

    /// Queries the driver for `item` and creates or updates its object.
    async fn sync(&self, item: &WorkItem) -> Result<(), CapacityError> {
        if !lock(&self.desired).contains(item) {
            return Ok(());
        }
        let Some(class) = self.classes.get(&ObjectRef::new(&item.class)) else {
            return Ok(());
        };
        let response = self
            .driver
            .get_capacity(get_capacity_request(item, &class))
            .await
            .map_err(|source| CapacityError::GetCapacity {
                item: item.clone(),
                source,
            })?;
        let capacity = Capacity::from(&response);
        let object = object_of(item, self.objects.state());
        let target = lock(&self.pending).target(item, object);
        let existing = match target {
            SyncTarget::Update(object) => object,
            SyncTarget::Created(name) => match self.read_created(item, &name).await? {
                Some(object) => object,
                None => return self.create(item, capacity).await,
            },
            SyncTarget::Create => return self.create(item, capacity).await,
        };
        self.update(item, &existing, capacity).await
    }

    async fn update(
        &self,
        item: &WorkItem,
        existing: &CSIStorageCapacity,
        capacity: Capacity,
    ) -> Result<(), CapacityError> {
        let Some(updated) = self.template.updated_object(existing, capacity) else {
            debug!(%item, "capacity unchanged");
            return Ok(());
        };
        let name = existing.metadata.name.clone().unwrap_or_default();
        self.api()
            .replace(&name, &PostParams::default(), &updated)
            .await
            .map_err(|source| CapacityError::Update {
                name: name.clone(),
                item: item.clone(),
                source,
            })?;
        debug!(%item, name, "updated");
        Ok(())
    }

    /// The object this instance created as `name` for `item`, which the watch has not
    /// reported yet, read from the API server; `None`, and the create settled, when it is
    /// gone, being deleted or no longer ours (its labels changed: the watch never reports it).
    async fn read_created(
        &self,
        item: &WorkItem,
        name: &str,
    ) -> Result<Option<Arc<CSIStorageCapacity>>, CapacityError> {
        let read = self
            .api()
            .get_opt(name)
            .await
            .map_err(|source| CapacityError::ReadCreated {
                name: name.to_owned(),
                item: item.clone(),
                source,
            })?;
        match read {
            Some(object) if !being_deleted(&object) && self.template.manages(&object) => {
                Ok(Some(Arc::new(object)))
            }
            _ => {
                lock(&self.pending).forget(item);
                Ok(None)
            }
        }
    }

    async fn create(&self, item: &WorkItem, capacity: Capacity) -> Result<(), CapacityError> {
        let created = self
            .api()
            .create(
                &PostParams::default(),
                &self.template.new_object(item, capacity),
            )
            .await
            .map_err(|source| CapacityError::Create {
                item: item.clone(),
                source,
            })?;
        let name = created.metadata.name.unwrap_or_default();
        debug!(%item, name, "created");
        // Until the watch reports it, the item's syncs read it instead of creating another.
        lock(&self.pending).created(item.clone(), name);
        Ok(())
    }

    /// Deletes an object no item wants, unless it became wanted meanwhile.
    async fn delete(&self, obsolete: &Obsolete) -> Result<(), CapacityError> {
        let object = ObjectRef::new(&obsolete.name).within(&self.template.namespace);
        let Some(object) = self.objects.get(&object) else {
            return Ok(());
        };
        let same = object.metadata.uid.as_deref() == Some(obsolete.uid.as_str());
        if !same || !still_obsolete(&object, &lock(&self.desired), self.objects.state()) {
            return Ok(());
        }
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(obsolete.uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match self.api().delete(&obsolete.name, &params).await {
            Ok(_) => {
                debug!(name = obsolete.name, "deleted obsolete object");
                Ok(())
            }
            // Gone, or replaced by a namesake that is not this one.
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(()),
            Err(source) => Err(CapacityError::Delete {
                name: obsolete.name.clone(),
                source,
            }),
        }
    }

    /// One worker: takes work until `drained`, retrying failures with their backoff.
    async fn worker(self: Arc<Self>, drained: impl Future<Output = ()>) {
        let mut drained = std::pin::pin!(drained);
        loop {
            let work = tokio::select! {
                biased;
                () = &mut drained => return,
                work = self.queue.next() => work,
            };
            match self.work(&work).await {
                Ok(()) => lock(&self.backoff).forget(&work),
                Err(error) => {
                    let delay = lock(&self.backoff).failure(work.clone());
                    warn!(%error, retry_in = ?delay, "capacity");
                    self.queue.retried(&work, delay);
                    let this = Arc::clone(&self);
                    let retry = work.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(delay).await;
                        this.queue.add(retry);
                    });
                }
            }
            self.queue.done(&work);
        }
    }
}

/// The segments of `source` at run time; a central provisioner reads them from the topology
/// cache.
pub fn segments(source: &SegmentSource, topology: Option<&TopologyView>) -> Segments {
    match (source, topology) {
        (SegmentSource::Cluster, Some(TopologyView::Watched(cache))) => {
            Segments::Cluster(cache.clone())
        }
        // Not reached: the settings (`app::capacity_start`) ask for `Cluster` only for a central
        // provisioner whose driver has topology, which is exactly when the cache is watched
        // (node mode's settings give `Fixed`, a driver without topology `Fixed(nil)`). Should
        // that change, the nil segment, one object for all nodes, is what "no topology" means.
        (SegmentSource::Cluster, _) => Segments::Fixed(Segment::new()),
        (SegmentSource::Fixed(segment), _) => Segments::Fixed(segment.clone()),
    }
}

/// A controller whose watch is set up, to run once the rest of the sidecar is wired.
pub struct Started<S> {
    controller: Arc<CapacityController>,
    settings: CapacitySettings,
    changes: Arc<Notify>,
    refresh: mpsc::Receiver<RefreshCause>,
    object_events: S,
}

/// Sets the controller up: its object watch (on the capacity client) and the channel the
/// reconcilers ask for refreshes on.
pub fn start(
    settings: &CapacitySettings,
    changes: Arc<Notify>,
    inputs: CapacityInputs,
) -> (
    CapacityRefresh,
    Started<impl Stream<Item = Result<(), watcher::Error>> + Send + 'static + use<>>,
) {
    let watch = watch_objects(&inputs.client, &settings.template, Arc::clone(&changes));
    let controller = Arc::new(CapacityController::new(inputs, settings, watch.store));
    let (refresh, receiver) = CapacityRefresh::channel();
    let started = Started {
        controller,
        settings: settings.clone(),
        changes,
        refresh: receiver,
        object_events: watch.events,
    };
    (refresh, started)
}

impl<S> Started<S>
where
    S: Stream<Item = Result<(), watcher::Error>> + Send + 'static,
{
    /// Runs the controller until `drained`.
    pub async fn run<D>(self, drained: impl Fn() -> D)
    where
        D: Future<Output = ()> + Send + 'static,
    {
        run(
            self.controller,
            &self.settings,
            self.changes,
            self.refresh,
            self.object_events,
            drained,
        )
        .await;
    }
}

/// Runs the controller until `drained`: waits for the class, topology and object stores to
/// list, then decides in one loop and acts in `threads` workers.
async fn run<S, D>(
    controller: Arc<CapacityController>,
    settings: &CapacitySettings,
    changes: Arc<Notify>,
    mut refresh: mpsc::Receiver<RefreshCause>,
    object_events: S,
    drained: impl Fn() -> D,
) where
    S: Stream<Item = Result<(), watcher::Error>> + Send + 'static,
    D: Future<Output = ()> + Send + 'static,
{
    let watch = object_events.for_each(|event| {
        if let Err(error) = event {
            warn!(%error, "CSIStorageCapacity watch error");
        }
        future::ready(())
    });
    let decide = async {
        let ready = future::join3(
            listed(&controller.classes),
            controller.segments.ready(),
            listed(&controller.objects),
        );
        let (classes, segments, objects) = tokio::select! {
            ready = ready => ready,
            () = drained() => return,
        };
        if !(classes && segments && objects) {
            warn!(
                classes,
                topology = segments,
                objects,
                "a watch the capacity controller needs ended before it listed (false above): no CSIStorageCapacity objects are published"
            );
            return;
        }
        info!(
            namespace = controller.template.namespace,
            managed_by = controller.template.managed_by,
            "publishing CSIStorageCapacity objects"
        );
        let workers = (0..settings.threads.max(1))
            .map(|_| tokio::spawn(Arc::clone(&controller).worker(drained())))
            .collect::<Vec<_>>();
        // 0 is refused at start (config).
        let mut poll = tokio::time::interval(settings.poll_interval.max(Duration::from_millis(1)));
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut drained = std::pin::pin!(drained());
        loop {
            tokio::select! {
                biased;
                () = &mut drained => break,
                _ = poll.tick() => controller.queue_changes(true),
                Some(cause) = refresh.recv() => controller.queue_refresh(&cause),
                () = changes.notified() => controller.queue_changes(false),
            }
        }
        for worker in workers {
            let _ = worker.await;
        }
    };
    let mut watch = std::pin::pin!(watch);
    tokio::select! {
        () = decide => {}
        () = &mut watch => {}
    }
    // Lost leadership or drained: another instance (or none) publishes now, not these counts.
    controller.metrics.set_capacity_objects(0, 0, 0);
}

#[cfg(test)]
mod tests;
