//! `workqueue_*`: client-go's work-queue metrics (component-base's provider), with upstream's
//! names, types, buckets, help texts and `name` label, for every queue of the sidecar.
//!
//! [`QueueMetrics`] is the one recorder every queue uses: the queue (or, for kube-runtime's
//! controllers, the code around it) says when a key is added, taken by a worker, finished and
//! retried; the recorder keeps client-go's bookkeeping (when each waiting key was added, when
//! each running key started) and turns it into the series. A key is remembered by a 64-bit
//! hash, not a copy: no allocation per add, 24 bytes per waiting or running key (a collision,
//! about 1 in 10^9 with 100,000 keys, would only merge two keys' timings).
//!
//! `workqueue_unfinished_work_seconds` and `workqueue_longest_running_processor_seconds` are
//! computed at each scrape (client-go recomputes them every 500 ms).
//!
//! Help texts are registered without a final period: prometheus-client's registry appends
//! one to every help text (so Go's texts that have none show one here).

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, RandomState};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// client-go's buckets of both duration histograms: 10 ns to 10 s, ×10.
const BUCKETS: [f64; 10] = [1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0];

/// Above this many remembered keys, maps that have emptied give their memory back: a start-up
/// burst of 100,000 claims must not stay allocated for good.
const SHRINK_ABOVE: usize = 1024;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueLabel {
    name: &'static str,
}

type FloatGauge = Gauge<f64, AtomicU64>;

fn duration_histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

/// The seven families, registered once, and every recorder created, for the scrape-time gauges.
#[derive(Debug)]
pub(super) struct Workqueues {
    depth: Family<QueueLabel, Gauge>,
    adds: Family<QueueLabel, Counter>,
    queue_duration: Family<QueueLabel, Histogram, fn() -> Histogram>,
    work_duration: Family<QueueLabel, Histogram, fn() -> Histogram>,
    unfinished: Family<QueueLabel, FloatGauge>,
    longest: Family<QueueLabel, FloatGauge>,
    retries: Family<QueueLabel, Counter>,
    queues: Mutex<Vec<Arc<QueueMetrics>>>,
}

impl Workqueues {
    /// Registers the families with upstream's names and help texts (prometheus-client adds
    /// the counters' `_total`).
    pub(super) fn register(registry: &mut Registry) -> Self {
        let this = Workqueues {
            depth: Family::default(),
            adds: Family::default(),
            queue_duration: Family::new_with_constructor(duration_histogram),
            work_duration: Family::new_with_constructor(duration_histogram),
            unfinished: Family::default(),
            longest: Family::default(),
            retries: Family::default(),
            queues: Mutex::default(),
        };
        registry.register(
            "workqueue_depth",
            "[BETA] Current depth of workqueue",
            this.depth.clone(),
        );
        registry.register(
            "workqueue_adds",
            "[BETA] Total number of adds handled by workqueue",
            this.adds.clone(),
        );
        registry.register(
            "workqueue_queue_duration_seconds",
            "[BETA] How long in seconds an item stays in workqueue before being requested",
            this.queue_duration.clone(),
        );
        registry.register(
            "workqueue_work_duration_seconds",
            "[BETA] How long in seconds processing an item from workqueue takes",
            this.work_duration.clone(),
        );
        registry.register(
            "workqueue_unfinished_work_seconds",
            "[BETA] How many seconds of work has done that is in progress and hasn't been observed by work_duration. Large values indicate stuck threads. One can deduce the number of stuck threads by observing the rate at which this increases",
            this.unfinished.clone(),
        );
        registry.register(
            "workqueue_longest_running_processor_seconds",
            "[BETA] How many seconds has the longest running processor for workqueue been running",
            this.longest.clone(),
        );
        registry.register(
            "workqueue_retries",
            "[BETA] Total number of retries handled by workqueue",
            this.retries.clone(),
        );
        this
    }

    /// Creates the series of a queue named `name`, at zero, as client-go does when it creates
    /// the queue.
    pub(super) fn declare(&self, name: &'static str) {
        let label = QueueLabel { name };
        drop(self.depth.get_or_create(&label));
        drop(self.adds.get_or_create(&label));
        drop(self.queue_duration.get_or_create(&label));
        drop(self.work_duration.get_or_create(&label));
        drop(self.unfinished.get_or_create(&label));
        drop(self.longest.get_or_create(&label));
        drop(self.retries.get_or_create(&label));
    }

    /// A recorder for one queue. Several queues may share a name (upstream's two `claims`
    /// queues): their counts add up, and the two scrape-time gauges are their sum and their
    /// maximum.
    pub(super) fn queue(&self, name: &'static str) -> Arc<QueueMetrics> {
        self.declare(name);
        let label = QueueLabel { name };
        let queue = Arc::new(QueueMetrics {
            depth: self.depth.get_or_create(&label).clone(),
            adds: self.adds.get_or_create(&label).clone(),
            queue_duration: self.queue_duration.get_or_create(&label).clone(),
            work_duration: self.work_duration.get_or_create(&label).clone(),
            retries: self.retries.get_or_create(&label).clone(),
            name,
            hasher: RandomState::new(),
            keys: Mutex::default(),
        });
        lock(&self.queues).push(Arc::clone(&queue));
        queue
    }

    /// Sets the two gauges client-go updates every 500 ms; called before each encoding.
    pub(super) fn refresh(&self, now: Instant) {
        let mut by_name: HashMap<&'static str, (f64, f64)> = HashMap::new();
        for queue in lock(&self.queues).iter() {
            let (total, longest) = queue.running_for(now);
            let entry = by_name.entry(queue.name).or_default();
            entry.0 += total;
            entry.1 = entry.1.max(longest);
        }
        for (name, (total, longest)) in by_name {
            let label = QueueLabel { name };
            self.unfinished.get_or_create(&label).set(total);
            self.longest.get_or_create(&label).set(longest);
        }
    }
}

/// A key as the recorder remembers it (see the module comment).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QueueKey(u64);

/// The recorder of one queue.
#[derive(Debug)]
pub struct QueueMetrics {
    name: &'static str,
    depth: Gauge,
    adds: Counter,
    queue_duration: Histogram,
    work_duration: Histogram,
    retries: Counter,
    hasher: RandomState,
    keys: Mutex<Keys>,
}

#[derive(Debug, Default)]
struct Keys {
    /// Added and not taken yet (client-go's dirty set), with when it was added. A key retried
    /// later waits from the time its delay ends.
    waiting: HashMap<QueueKey, Instant>,
    /// Taken by a worker and not done, with when it was taken.
    running: HashMap<QueueKey, Instant>,
    /// Retried, with when its delay ends.
    delayed: HashMap<QueueKey, Instant>,
}

impl Keys {
    /// Maps that have emptied give their memory back after a burst.
    fn shrink(&mut self) {
        for map in [&mut self.waiting, &mut self.running, &mut self.delayed] {
            if map.is_empty() && map.capacity() > SHRINK_ABOVE {
                map.shrink_to_fit();
            }
        }
    }
}

impl QueueMetrics {
    /// The key the other methods take; equal values give equal keys.
    pub fn key<K: Hash + ?Sized>(&self, key: &K) -> QueueKey {
        QueueKey(self.hasher.hash_one(key))
    }

    /// A key was added. Adding a key that already waits changes nothing (the queue keeps one
    /// copy), as client-go's queue ignores it; a retry still waiting for its delay is merged
    /// into this add, as kube-runtime's scheduler merges them.
    pub fn added(&self, key: QueueKey) {
        let mut keys = lock(&self.keys);
        keys.delayed.remove(&key);
        if keys.waiting.contains_key(&key) {
            return;
        }
        keys.waiting.insert(key, Instant::now());
        drop(keys);
        self.adds.inc();
        self.depth.inc();
    }

    /// A worker took the key. A retry whose delay has ended is counted as added when its
    /// delay ended (client-go's delaying queue adds it then), and waited since.
    pub fn started(&self, key: QueueKey) {
        let now = Instant::now();
        let mut keys = lock(&self.keys);
        let added = keys.waiting.remove(&key);
        let due = keys.delayed.remove(&key);
        keys.running.insert(key, now);
        keys.shrink();
        drop(keys);
        let waited_since = match (added, due) {
            (Some(at), _) => {
                self.depth.dec();
                Some(at)
            }
            (None, due) => {
                self.adds.inc();
                due
            }
        };
        if let Some(at) = waited_since {
            self.queue_duration
                .observe(now.saturating_duration_since(at).as_secs_f64());
        }
    }

    /// The worker finished the key (whatever the outcome).
    pub fn done(&self, key: QueueKey) {
        let now = Instant::now();
        let mut keys = lock(&self.keys);
        let started = keys.running.remove(&key);
        keys.shrink();
        drop(keys);
        if let Some(at) = started {
            self.work_duration
                .observe(now.saturating_duration_since(at).as_secs_f64());
        }
    }

    /// The key goes back to the queue after `delay` (client-go's `AddRateLimited`): a retry
    /// now, and an add once the delay has passed, unless the key is added before.
    pub fn retried(&self, key: QueueKey, delay: Duration) {
        self.retries.inc();
        let due = Instant::now() + delay;
        let mut keys = lock(&self.keys);
        if !keys.waiting.contains_key(&key) {
            keys.delayed.insert(key, due);
        }
    }

    /// Total and longest time the running keys have run.
    fn running_for(&self, now: Instant) -> (f64, f64) {
        let keys = lock(&self.keys);
        keys.running
            .values()
            .map(|at| now.saturating_duration_since(*at).as_secs_f64())
            .fold((0.0, 0.0), |(total, longest), age| {
                (total + age, f64::max(longest, age))
            })
    }
}

/// The bookkeeping is updated in single statements, so a poisoned lock still holds whole state.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::super::Metrics;
    use super::*;

    /// The value of `series` with `{name="<queue>"}` (or a label set starting so).
    fn value(text: &str, series: &str, queue: &str) -> f64 {
        let prefix = format!("{series}{{name=\"{queue}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
    }

    #[test]
    fn upstream_queues_exist_at_zero_with_client_gos_help_and_buckets() {
        let text = Metrics::new().encode();
        for queue in ["claims", "volumes"] {
            for series in [
                "workqueue_depth",
                "workqueue_adds_total",
                "workqueue_retries_total",
                "workqueue_unfinished_work_seconds",
                "workqueue_longest_running_processor_seconds",
                "workqueue_queue_duration_seconds_count",
                "workqueue_work_duration_seconds_count",
            ] {
                assert_eq!(value(&text, series, queue), 0.0, "{series} {queue}");
            }
        }
        for line in [
            "# HELP workqueue_depth [BETA] Current depth of workqueue.",
            "# TYPE workqueue_depth gauge",
            "# HELP workqueue_adds_total [BETA] Total number of adds handled by workqueue.",
            "# TYPE workqueue_adds_total counter",
            "# HELP workqueue_queue_duration_seconds [BETA] How long in seconds an item stays in workqueue before being requested.",
            "# TYPE workqueue_queue_duration_seconds histogram",
            "# HELP workqueue_work_duration_seconds [BETA] How long in seconds processing an item from workqueue takes.",
            "# TYPE workqueue_work_duration_seconds histogram",
            "# HELP workqueue_unfinished_work_seconds [BETA] How many seconds of work has done that is in progress and hasn't been observed by work_duration. Large values indicate stuck threads. One can deduce the number of stuck threads by observing the rate at which this increases.",
            "# TYPE workqueue_unfinished_work_seconds gauge",
            "# HELP workqueue_longest_running_processor_seconds [BETA] How many seconds has the longest running processor for workqueue been running.",
            "# TYPE workqueue_longest_running_processor_seconds gauge",
            "# HELP workqueue_retries_total [BETA] Total number of retries handled by workqueue.",
            "# TYPE workqueue_retries_total counter",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        let bounds: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("workqueue_work_duration_seconds_bucket{name=\"claims\""))
            .filter_map(|l| l.split("le=\"").nth(1)?.split('"').next())
            .collect();
        assert_eq!(
            bounds,
            [
                "1e-08", "1e-07", "1e-06", "1e-05", "0.0001", "0.001", "0.01", "0.1", "1", "10",
                "+Inf"
            ],
            "{text}"
        );
    }

    /// kube-runtime's scheduler runs a retried key once, at the end of its delay or at an
    /// earlier trigger: one add either way, the retry counted apart.
    #[test]
    fn a_retry_is_one_add_at_its_delay_or_at_an_earlier_trigger() {
        let metrics = Metrics::new();
        let queue = metrics.queue("claims");
        let key = queue.key(&(Some("ns"), "pvc"));
        queue.added(key);
        queue.started(key);
        queue.retried(key, Duration::ZERO);
        queue.done(key);
        let text = metrics.encode();
        assert_eq!(value(&text, "workqueue_retries_total", "claims"), 1.0);
        assert_eq!(value(&text, "workqueue_adds_total", "claims"), 1.0);
        assert_eq!(value(&text, "workqueue_depth", "claims"), 0.0);
        // The delay ended: taken again without a trigger.
        queue.started(key);
        queue.retried(key, Duration::from_secs(600));
        queue.done(key);
        // A trigger before the delay ends replaces the delayed add.
        queue.added(key);
        queue.started(key);
        queue.done(key);
        let text = metrics.encode();
        assert_eq!(value(&text, "workqueue_adds_total", "claims"), 3.0);
        assert_eq!(value(&text, "workqueue_retries_total", "claims"), 2.0);
        assert_eq!(value(&text, "workqueue_depth", "claims"), 0.0);
        assert_eq!(
            value(&text, "workqueue_queue_duration_seconds_count", "claims"),
            3.0
        );
        assert_eq!(
            value(&text, "workqueue_work_duration_seconds_count", "claims"),
            3.0
        );
        let keys = lock(&queue.keys);
        assert!(keys.waiting.is_empty() && keys.running.is_empty() && keys.delayed.is_empty());
    }

    /// Two queues of one name (upstream's `claims`): counts add up, unfinished work is the
    /// sum of both, the longest runner the longer of the two.
    #[test]
    fn queues_sharing_a_name_add_up() {
        let metrics = Metrics::new();
        let claims = metrics.queue("claims");
        let clones = metrics.queue("claims");
        let now = Instant::now();
        for (queue, name, ran) in [(&claims, "a", 3), (&clones, "b", 5)] {
            let key = queue.key(name);
            queue.added(key);
            queue.started(key);
            lock(&queue.keys)
                .running
                .insert(key, now - Duration::from_secs(ran));
        }
        metrics.workqueues.refresh(now);
        let text = metrics.encode();
        assert_eq!(value(&text, "workqueue_adds_total", "claims"), 2.0);
        let unfinished = value(&text, "workqueue_unfinished_work_seconds", "claims");
        assert!((8.0..8.1).contains(&unfinished), "{unfinished}");
        let longest = value(
            &text,
            "workqueue_longest_running_processor_seconds",
            "claims",
        );
        assert!((5.0..5.1).contains(&longest), "{longest}");
        assert_eq!(
            value(&text, "workqueue_unfinished_work_seconds", "volumes"),
            0.0
        );
    }

    #[test]
    fn a_burst_gives_its_memory_back() {
        let queue = Metrics::new().queue("volumes");
        let keys: Vec<QueueKey> = (0..5000).map(|i| queue.key(&i)).collect();
        for key in &keys {
            queue.added(*key);
        }
        for key in &keys {
            queue.started(*key);
        }
        for key in &keys {
            queue.done(*key);
        }
        let keys = lock(&queue.keys);
        assert!(
            keys.waiting.capacity() <= SHRINK_ABOVE,
            "{}",
            keys.waiting.capacity()
        );
        assert!(
            keys.running.capacity() <= SHRINK_ABOVE,
            "{}",
            keys.running.capacity()
        );
    }
}
