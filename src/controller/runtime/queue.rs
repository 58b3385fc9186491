//! A work queue like client-go's: a key waits in it at most once, a key being worked on is
//! never handed to a second worker, and a key added while it is worked on runs again once its
//! worker is done. Retries with a per-key backoff are the caller's ([`super::backoff`]).
//! Measured as client-go's queues (`workqueue_*`).

use std::collections::{HashSet, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;

use crate::metrics::QueueMetrics;

pub struct WorkQueue<K> {
    state: Mutex<State<K>>,
    added: Notify,
    metrics: Arc<QueueMetrics>,
}

struct State<K> {
    waiting: VecDeque<K>,
    queued: HashSet<K>,
    active: HashSet<K>,
    /// Added while active: queued again when done.
    dirty: HashSet<K>,
}

impl<K: Clone + Eq + Hash> WorkQueue<K> {
    pub fn new(metrics: Arc<QueueMetrics>) -> Self {
        WorkQueue {
            metrics,
            state: Mutex::new(State {
                waiting: VecDeque::new(),
                queued: HashSet::new(),
                active: HashSet::new(),
                dirty: HashSet::new(),
            }),
            added: Notify::new(),
        }
    }

    pub fn add(&self, key: K) {
        let metrics_key = self.metrics.key(&key);
        let mut state = self.lock();
        if state.active.contains(&key) {
            if state.dirty.insert(key) {
                drop(state);
                self.metrics.added(metrics_key);
            }
        } else if state.queued.insert(key.clone()) {
            state.waiting.push_back(key);
            drop(state);
            self.metrics.added(metrics_key);
            self.added.notify_one();
        }
    }

    /// The caller adds `key` again after `delay` (client-go's `AddRateLimited`): counted as
    /// a retry now.
    pub fn retried(&self, key: &K, delay: Duration) {
        self.metrics.retried(self.metrics.key(key), delay);
    }

    /// The next key, once there is one; it is active until [`Self::done`].
    pub async fn next(&self) -> K {
        loop {
            let added = self.added.notified();
            let mut added = std::pin::pin!(added);
            added.as_mut().enable();
            if let Some(key) = self.take() {
                return key;
            }
            added.await;
        }
    }

    fn take(&self) -> Option<K> {
        let mut state = self.lock();
        let key = state.waiting.pop_front()?;
        state.queued.remove(&key);
        state.active.insert(key.clone());
        let more = !state.waiting.is_empty();
        drop(state);
        self.metrics.started(self.metrics.key(&key));
        if more {
            // Another worker may be waiting for the rest.
            self.added.notify_one();
        }
        Some(key)
    }

    pub fn done(&self, key: &K) {
        self.metrics.done(self.metrics.key(key));
        let again = {
            let mut state = self.lock();
            state.active.remove(key);
            state.dirty.remove(key)
        };
        if again {
            self.add(key.clone());
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.lock().waiting.len()
    }

    fn lock(&self) -> MutexGuard<'_, State<K>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Metrics;

    fn queue<K: Clone + Eq + Hash>() -> WorkQueue<K> {
        WorkQueue::new(Metrics::new().queue("test"))
    }

    /// The value of `workqueue_<series>{name="test"}`.
    fn series(metrics: &Metrics, series: &str) -> String {
        let prefix = format!("workqueue_{series}{{name=\"test\"}} ");
        let text = metrics.encode();
        text.lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
            .to_owned()
    }

    /// client-go's accounting: a key waiting twice is one add; a key added while active is
    /// one more add, taken after `done`; a retry is counted apart from its later add.
    #[tokio::test]
    async fn adds_depth_and_retries_are_client_gos() {
        let metrics = Metrics::new();
        let queue = WorkQueue::new(metrics.queue("test"));
        queue.add("a");
        queue.add("a");
        queue.add("b");
        assert_eq!(series(&metrics, "adds_total"), "2");
        assert_eq!(series(&metrics, "depth"), "2");
        let a = queue.next().await;
        assert_eq!(series(&metrics, "depth"), "1");
        queue.add("a");
        queue.add("a");
        assert_eq!(
            series(&metrics, "adds_total"),
            "3",
            "added again while active"
        );
        assert_eq!(series(&metrics, "depth"), "2");
        queue.done(&a);
        assert_eq!(
            series(&metrics, "adds_total"),
            "3",
            "re-queued at done, no new add"
        );
        assert_eq!(queue.next().await, "b");
        assert_eq!(queue.next().await, "a");
        assert_eq!(series(&metrics, "depth"), "0");
        queue.retried(&"a", Duration::from_millis(5));
        queue.done(&"a");
        queue.done(&"b");
        assert_eq!(series(&metrics, "retries_total"), "1");
        queue.add("a");
        assert_eq!(series(&metrics, "adds_total"), "4");
        assert_eq!(
            series(&metrics, "queue_duration_seconds_count"),
            "3",
            "one wait per take"
        );
        assert_eq!(series(&metrics, "work_duration_seconds_count"), "3");
        assert_eq!(series(&metrics, "unfinished_work_seconds"), "0.0");
    }

    #[tokio::test]
    async fn a_key_waits_once() {
        let queue = queue();
        queue.add("a");
        queue.add("b");
        queue.add("a");
        assert_eq!(queue.len(), 2);
        assert_eq!(queue.next().await, "a");
        assert_eq!(queue.next().await, "b");
    }

    #[tokio::test]
    async fn a_key_added_while_active_runs_again_after_done_never_twice_at_once() {
        let queue = queue();
        queue.add("a");
        let key = queue.next().await;
        queue.add("a");
        assert_eq!(queue.len(), 0, "not handed out while active");
        queue.done(&key);
        assert_eq!(queue.len(), 1);
        assert_eq!(queue.next().await, "a");
        queue.done(&"a");
        assert_eq!(queue.len(), 0);
    }

    #[tokio::test]
    async fn waiting_workers_are_woken_by_adds() {
        let queue = Arc::new(queue());
        let workers: Vec<_> = (0..2)
            .map(|_| {
                let queue = Arc::clone(&queue);
                tokio::spawn(async move { queue.next().await })
            })
            .collect();
        tokio::task::yield_now().await;
        queue.add(1);
        queue.add(2);
        let mut got = Vec::new();
        for worker in workers {
            got.push(
                tokio::time::timeout(Duration::from_secs(10), worker)
                    .await
                    .expect("woken")
                    .expect("worker"),
            );
        }
        got.sort_unstable();
        assert_eq!(got, [1, 2]);
    }
}
