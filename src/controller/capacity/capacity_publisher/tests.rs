use super::*;
use crate::controller::testing::fixtures::{
    Finish, RETRY_MAX, RETRY_START, Step, bounded, delete, get, listed, post, put, scripted,
};
use crate::csi;
use crate::provision::storage_capacity::{MANAGED_BY, selector};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};
use std::sync::atomic::{AtomicUsize, Ordering};

const DRIVER: &str = "d.example.com";
const OBJECTS: &str = "/apis/storage.k8s.io/v1/namespaces/csi/csistoragecapacities";
const GIB: i64 = 1 << 30;

fn zone(zone: &str) -> Segment {
    Segment::from([("zone".to_owned(), zone.to_owned())])
}

fn class(name: &str) -> StorageClass {
    StorageClass {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        provisioner: DRIVER.to_owned(),
        volume_binding_mode: Some("WaitForFirstConsumer".to_owned()),
        parameters: Some([("type".to_owned(), "ssd".to_owned())].into()),
        ..StorageClass::default()
    }
}

fn template() -> ObjectTemplate {
    ObjectTemplate {
        namespace: "csi".to_owned(),
        driver: DRIVER.to_owned(),
        managed_by: MANAGED_BY.to_owned(),
        owner: None,
    }
}

/// An object of ours as stored.
fn object(name: &str, class: &str, segment: &Segment, capacity: &str) -> CSIStorageCapacity {
    let mut object: CSIStorageCapacity = serde_json::from_value(json!({
        "metadata": {
            "name": name, "namespace": "csi", "uid": format!("uid-{name}"),
            "resourceVersion": "7", "labels": template().labels(),
        },
        "storageClassName": class,
        "capacity": capacity,
    }))
    .expect("object");
    object.node_topology = Some(selector(segment));
    object
}

fn get_capacity(segment: &Segment, available: i64, maximum: Option<i64>) -> Step {
    Step::GetCapacity {
        expected: csi::GetCapacityRequest {
            volume_capabilities: Vec::new(),
            parameters: [("type".to_owned(), "ssd".to_owned())].into(),
            accessible_topology: Some(csi::Topology {
                segments: segment.clone().into_iter().collect(),
            }),
        },
        answer: Ok(csi::GetCapacityResponse {
            available_capacity: available,
            maximum_volume_size: maximum,
            minimum_volume_size: None,
        }),
    }
}

struct Test {
    controller: Arc<CapacityController>,
    metrics: Arc<Metrics>,
    finish: Finish,
}

fn start(
    segment: Segment,
    classes: Vec<StorageClass>,
    objects: Vec<CSIStorageCapacity>,
    steps: Vec<Step>,
) -> Test {
    let (client, driver, finish) = scripted(steps);
    let mut metrics = Metrics::new();
    metrics.register_capacity();
    let metrics = Arc::new(metrics);
    let settings = CapacitySettings {
        template: template(),
        segments: SegmentSource::Fixed(segment.clone()),
        poll_interval: Duration::from_secs(60),
        threads: 1,
        immediate_binding: false,
    };
    let inputs = CapacityInputs {
        client,
        driver,
        classes: listed(classes),
        segments: Segments::Fixed(segment),
        metrics: Arc::clone(&metrics),
        retry_interval_start: RETRY_START,
        retry_interval_max: RETRY_MAX,
    };
    let controller = CapacityController::new(inputs, &settings, listed(objects));
    Test {
        controller: Arc::new(controller),
        metrics,
        finish,
    }
}

impl Test {
    /// A poll, with every queued work done in order.
    async fn poll(self) -> Self {
        self.controller.queue_changes(true);
        while self.controller.queue.len() > 0 {
            let work = self.controller.queue.next().await;
            bounded(self.controller.work(&work))
                .await
                .expect("work succeeds");
            self.controller.queue.done(&work);
        }
        self
    }

    fn gauges(&self) -> Vec<String> {
        let text = self.metrics.encode();
        text.lines()
            .filter(|line| line.starts_with("csistoragecapacities_"))
            .map(str::to_owned)
            .collect()
    }

    async fn finish(self) {
        drop(self.controller);
        self.finish.finish().await;
    }
}

fn created_body(capacity: &str, maximum: &str) -> Value {
    json!({
        "metadata": {
            "generateName": "csisc-",
            "namespace": "csi",
            "labels": {
                "csi.storage.k8s.io/drivername": DRIVER,
                "csi.storage.k8s.io/managed-by": "external-provisioner",
            },
        },
        "storageClassName": "fast",
        "nodeTopology": {"matchLabels": {"zone": "z1"}},
        "capacity": capacity,
        "maximumVolumeSize": maximum,
    })
}

#[tokio::test(start_paused = true)]
async fn an_item_without_an_object_gets_one() {
    let test = start(
        zone("z1"),
        vec![class("fast")],
        vec![],
        vec![
            get_capacity(&zone("z1"), 100 * GIB, Some(10 * GIB)),
            post(OBJECTS)
                .body(created_body("100Gi", "10Gi"))
                .answer(201, object("csisc-a", "fast", &zone("z1"), "100Gi")),
        ],
    )
    .poll()
    .await;
    test.finish().await;
}

/// The watch lags: the next poll reads the created object instead of creating another;
/// once it is gone (deleted before the watch reported it), a new one is created.
#[tokio::test(start_paused = true)]
async fn a_create_the_watch_has_not_reported_is_read_not_repeated() {
    let created = object("csisc-a", "fast", &zone("z1"), "100Gi");
    let test = start(
        zone("z1"),
        vec![class("fast")],
        vec![],
        vec![
            get_capacity(&zone("z1"), 100 * GIB, None),
            post(OBJECTS).answer(201, created.clone()),
            get_capacity(&zone("z1"), 100 * GIB, None),
            get(format!("{OBJECTS}/csisc-a")).answer(200, created),
            get_capacity(&zone("z1"), 100 * GIB, None),
            get(format!("{OBJECTS}/csisc-a")).refuse(404, "NotFound"),
            post(OBJECTS).answer(201, object("csisc-b", "fast", &zone("z1"), "100Gi")),
        ],
    )
    .poll()
    .await;
    test.controller.queue_changes(false);
    assert_eq!(test.controller.queue.len(), 0, "events do not create again");
    let test = test.poll().await.poll().await;
    test.finish().await;
}

#[tokio::test(start_paused = true)]
async fn a_changed_capacity_updates_the_object() {
    let test = start(
        zone("z1"),
        vec![class("fast")],
        vec![object("csisc-a", "fast", &zone("z1"), "5Gi")],
        vec![
            get_capacity(&zone("z1"), 10 * GIB, None),
            put(format!("{OBJECTS}/csisc-a"))
                .body(json!({
                    "metadata": {"name": "csisc-a", "resourceVersion": "7"},
                    "capacity": "10Gi",
                }))
                .echo(200),
        ],
    )
    .poll()
    .await;
    test.finish().await;
}

#[tokio::test(start_paused = true)]
async fn an_unchanged_capacity_writes_nothing() {
    let test = start(
        zone("z1"),
        vec![class("fast")],
        vec![object("csisc-a", "fast", &zone("z1"), "10Gi")],
        vec![get_capacity(&zone("z1"), 10 * GIB, None)],
    )
    .poll()
    .await;
    assert_eq!(
        test.gauges(),
        [
            "csistoragecapacities_desired_goal 1",
            "csistoragecapacities_desired_current 1",
            "csistoragecapacities_obsolete 0"
        ]
    );
    test.finish().await;
}

#[tokio::test(start_paused = true)]
async fn obsolete_objects_and_duplicates_are_deleted_at_start() {
    let mut duplicate = object("csisc-b", "fast", &zone("z1"), "10Gi");
    duplicate.metadata.creation_timestamp = Some(Time(Timestamp::from_second(100).expect("time")));
    let mut kept = object("csisc-a", "fast", &zone("z1"), "10Gi");
    kept.metadata.creation_timestamp = Some(Time(Timestamp::from_second(50).expect("time")));
    let test = start(
        zone("z1"),
        vec![class("fast")],
        vec![
            object("csisc-gone", "deleted-class", &zone("z1"), "1Gi"),
            duplicate,
            kept,
        ],
        vec![
            delete(format!("{OBJECTS}/csisc-gone"))
                .body(json!({"preconditions": {"uid": "uid-csisc-gone"}}))
                .answer(
                    200,
                    json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}),
                ),
            delete(format!("{OBJECTS}/csisc-b"))
                .body(json!({"preconditions": {"uid": "uid-csisc-b"}}))
                .refuse(404, "NotFound"),
            get_capacity(&zone("z1"), 10 * GIB, None),
        ],
    )
    .poll()
    .await;
    assert_eq!(
        test.gauges(),
        [
            "csistoragecapacities_desired_goal 1",
            "csistoragecapacities_desired_current 1",
            "csistoragecapacities_obsolete 2"
        ]
    );
    test.finish().await;
}

/// A controller that stops (lost leadership, drain) publishes no counts any more.
#[tokio::test(start_paused = true)]
async fn the_gauges_are_zero_once_the_controller_stops() {
    let test = start(
        zone("z1"),
        vec![class("fast")],
        vec![object("csisc-a", "fast", &zone("z1"), "10Gi")],
        vec![],
    );
    test.controller.recompute();
    assert_eq!(test.gauges()[0], "csistoragecapacities_desired_goal 1");
    let settings = CapacitySettings {
        template: template(),
        segments: SegmentSource::Fixed(zone("z1")),
        poll_interval: Duration::from_secs(60),
        threads: 1,
        immediate_binding: false,
    };
    let (_refresh, receiver) = CapacityRefresh::channel();
    bounded(run(
        Arc::clone(&test.controller),
        &settings,
        Arc::new(Notify::new()),
        receiver,
        futures::stream::pending(),
        || future::ready(()),
    ))
    .await;
    assert_eq!(
        test.gauges(),
        [
            "csistoragecapacities_desired_goal 0",
            "csistoragecapacities_desired_current 0",
            "csistoragecapacities_obsolete 0"
        ]
    );
    test.finish().await;
}

/// The backlog is bounded: requests beyond it are dropped, never waited for.
#[tokio::test]
async fn refresh_requests_beyond_the_backlog_are_dropped() {
    let (refresh, mut receiver) = CapacityRefresh::channel();
    let cause = RefreshCause::Deleted { affinity: None };
    for _ in 0..REFRESH_BACKLOG + 10 {
        refresh.request(cause.clone());
    }
    let mut received = 0;
    while receiver.try_recv().is_ok() {
        received += 1;
    }
    assert_eq!(received, REFRESH_BACKLOG);
    drop(receiver);
    refresh.request(cause);
}

/// A delete that failed waits for its backoff: a class, Node or object event meanwhile
/// does not queue it again.
#[tokio::test(start_paused = true)]
async fn a_failed_delete_is_not_queued_again_before_its_retry() {
    let gone = object("csisc-gone", "deleted-class", &zone("z1"), "1Gi");
    let test = start(zone("z1"), vec![], vec![gone], vec![]);
    let work = Work::Delete(Obsolete {
        name: "csisc-gone".to_owned(),
        uid: "uid-csisc-gone".to_owned(),
    });
    test.controller.queue_changes(false);
    assert_eq!(test.controller.queue.len(), 1, "queued once");
    let queued = test.controller.queue.next().await;
    assert_eq!(queued, work);
    lock(&test.controller.backoff).failure(work.clone());
    test.controller.queue.done(&work);
    test.controller.queue_changes(false);
    assert_eq!(test.controller.queue.len(), 0, "waits for its retry");
    test.finish().await;
}

/// A driver whose GetCapacity calls each wait for a permit of `release`; counts the calls
/// and the most that were in flight at once.
struct GatedDriver {
    calls: AtomicUsize,
    in_flight: AtomicUsize,
    most_in_flight: AtomicUsize,
    release: tokio::sync::Semaphore,
}

#[tonic::async_trait]
impl CsiController for GatedDriver {
    async fn create_volume(
        &self,
        _: csi::CreateVolumeRequest,
    ) -> Result<csi::CreateVolumeResponse, CallError> {
        unreachable!("the capacity controller creates no volume")
    }

    async fn delete_volume(
        &self,
        _: csi::DeleteVolumeRequest,
    ) -> Result<csi::DeleteVolumeResponse, CallError> {
        unreachable!("the capacity controller deletes no volume")
    }

    async fn get_capacity(
        &self,
        _: csi::GetCapacityRequest,
    ) -> Result<csi::GetCapacityResponse, CallError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_in_flight.fetch_max(now, Ordering::SeqCst);
        self.release
            .acquire()
            .await
            .expect("the semaphore stays open")
            .forget();
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        Ok(csi::GetCapacityResponse {
            available_capacity: 10 * GIB,
            maximum_volume_size: None,
            minimum_volume_size: None,
        })
    }
}

/// The controller running on `classes` in one zone, their objects up to date (so only
/// GetCapacity is called), against a [`GatedDriver`] with `permits`.
struct Running {
    driver: Arc<GatedDriver>,
    stop: tokio::sync::watch::Sender<bool>,
    running: tokio::task::JoinHandle<()>,
    finish: Finish,
}

fn run_gated(classes: &[&str], threads: usize, poll_interval: Duration, permits: usize) -> Running {
    let (client, _, finish) = scripted([]);
    let driver = Arc::new(GatedDriver {
        calls: AtomicUsize::new(0),
        in_flight: AtomicUsize::new(0),
        most_in_flight: AtomicUsize::new(0),
        release: tokio::sync::Semaphore::new(permits),
    });
    let mut metrics = Metrics::new();
    metrics.register_capacity();
    let settings = CapacitySettings {
        template: template(),
        segments: SegmentSource::Fixed(zone("z1")),
        poll_interval,
        threads,
        immediate_binding: false,
    };
    let inputs = CapacityInputs {
        client,
        driver: Arc::clone(&driver) as Arc<dyn CsiController>,
        classes: listed(classes.iter().map(|name| class(name))),
        segments: Segments::Fixed(zone("z1")),
        metrics: Arc::new(metrics),
        retry_interval_start: RETRY_START,
        retry_interval_max: RETRY_MAX,
    };
    let objects = classes
        .iter()
        .map(|name| object(&format!("csisc-{name}"), name, &zone("z1"), "10Gi"));
    let controller = Arc::new(CapacityController::new(inputs, &settings, listed(objects)));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let running = tokio::spawn(async move {
        let (_refresh, receiver) = CapacityRefresh::channel();
        run(
            controller,
            &settings,
            Arc::new(Notify::new()),
            receiver,
            futures::stream::pending(),
            move || {
                let mut stopped = stopped.clone();
                async move {
                    let _ = stopped.wait_for(|stop| *stop).await;
                }
            },
        )
        .await;
    });
    Running {
        driver,
        stop,
        running,
        finish,
    }
}

impl Running {
    async fn stop(self) -> Arc<GatedDriver> {
        self.stop.send_replace(true);
        bounded(self.running).await.expect("the controller ran");
        self.finish.finish().await;
        self.driver
    }
}

/// Runs the controller with `threads` workers on three items and returns how many
/// GetCapacity calls were in flight once everything else waited, and the most in flight
/// at once over the whole poll.
async fn get_capacity_in_flight(threads: usize) -> (usize, usize) {
    let classes = ["a", "b", "c"];
    let running = run_gated(&classes, threads, Duration::from_secs(3600), 0);
    let driver = Arc::clone(&running.driver);
    // The clock is paused: this sleep ends only once every task waits (on the driver,
    // the queue or the poll), so the count below is what the workers reached.
    tokio::time::sleep(Duration::from_millis(1)).await;
    let reached = driver.in_flight.load(Ordering::SeqCst);
    driver.release.add_permits(classes.len());
    bounded(async {
        while driver.calls.load(Ordering::SeqCst) < classes.len()
            || driver.in_flight.load(Ordering::SeqCst) > 0
        {
            tokio::task::yield_now().await;
        }
    })
    .await;
    running.stop().await;
    (reached, driver.most_in_flight.load(Ordering::SeqCst))
}

/// How many times the one item is queried in `window`, polled every `poll_interval`.
async fn polls_within(poll_interval: Duration, window: Duration) -> usize {
    let running = run_gated(
        &["a"],
        1,
        poll_interval,
        tokio::sync::Semaphore::MAX_PERMITS,
    );
    tokio::time::sleep(window).await;
    running.stop().await.calls.load(Ordering::SeqCst)
}

/// `--capacity-poll-interval`: every item is queried at start and once per interval.
#[tokio::test(start_paused = true)]
async fn capacity_poll_interval_spaces_the_queries() {
    let window = Duration::from_secs(75);
    assert_eq!(polls_within(Duration::from_secs(30), window).await, 3);
    assert_eq!(polls_within(Duration::from_secs(60), window).await, 2);
    assert_eq!(polls_within(Duration::from_secs(300), window).await, 1);
}

/// `--capacity-threads`: that many GetCapacity calls run at once, never more.
#[tokio::test(start_paused = true)]
async fn capacity_threads_is_how_many_get_capacity_calls_run_at_once() {
    assert_eq!(get_capacity_in_flight(1).await, (1, 1), "one worker");
    assert_eq!(get_capacity_in_flight(2).await, (2, 2), "two workers");
    assert_eq!(get_capacity_in_flight(3).await, (3, 3), "three workers");
}

/// A10: the object of the nil segment as the API server returns it (no `matchLabels`)
/// is adopted, not deleted and created again.
#[tokio::test(start_paused = true)]
async fn an_existing_object_is_adopted_whatever_its_empty_selector_looks_like() {
    let mut existing = object("csisc-a", "fast", &Segment::new(), "10Gi");
    existing.node_topology = Some(serde_json::from_value(json!({})).expect("selector"));
    let test = start(
        Segment::new(),
        vec![class("fast")],
        vec![existing],
        vec![get_capacity(&Segment::new(), 10 * GIB, None)],
    )
    .poll()
    .await;
    test.finish().await;
}
