//! A work queue like client-go's: a key waits in it at most once, a key being worked on is
//! never handed to a second worker, and a key added while it is worked on runs again once its
//! worker is done. Retries with a per-key backoff are the caller's ([`super::backoff`]).

use std::collections::{HashSet, VecDeque};
use std::hash::Hash;
use std::sync::{Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;

pub struct WorkQueue<K> {
    state: Mutex<State<K>>,
    added: Notify,
}

struct State<K> {
    waiting: VecDeque<K>,
    queued: HashSet<K>,
    active: HashSet<K>,
    /// Added while active: queued again when done.
    dirty: HashSet<K>,
}

impl<K: Clone + Eq + Hash> WorkQueue<K> {
    pub fn new() -> Self {
        WorkQueue {
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
        let mut state = self.lock();
        if state.active.contains(&key) {
            state.dirty.insert(key);
        } else if state.queued.insert(key.clone()) {
            state.waiting.push_back(key);
            drop(state);
            self.added.notify_one();
        }
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
        if more {
            // Another worker may be waiting for the rest.
            self.added.notify_one();
        }
        Some(key)
    }

    pub fn done(&self, key: &K) {
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
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test]
    async fn a_key_waits_once() {
        let queue = WorkQueue::new();
        queue.add("a");
        queue.add("b");
        queue.add("a");
        assert_eq!(queue.len(), 2);
        assert_eq!(queue.next().await, "a");
        assert_eq!(queue.next().await, "b");
    }

    #[tokio::test]
    async fn a_key_added_while_active_runs_again_after_done_never_twice_at_once() {
        let queue = WorkQueue::new();
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
        let queue = Arc::new(WorkQueue::new());
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
