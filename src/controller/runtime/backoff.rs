//! Retry timing: per-object exponential backoff and the slow-retry set for infeasible claims.
//!
//! Both are plain data structures driven by explicit `Instant`s so they are unit-tested
//! without a clock; the reconcilers own one of each behind a mutex.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

/// Per-key exponential backoff from `start` doubling up to `max`, like client-go's
/// per-item rate limiter behind `--retry-interval-start` / `--retry-interval-max`.
#[derive(Debug)]
pub struct Backoff<K> {
    start: Duration,
    max: Duration,
    failures: HashMap<K, u32>,
}

impl<K: Eq + Hash> Backoff<K> {
    pub fn new(start: Duration, max: Duration) -> Self {
        Self {
            start,
            max: max.max(start),
            failures: HashMap::new(),
        }
    }

    /// Records one more failure of `key` and returns how long to wait before the next try.
    pub fn failure(&mut self, key: K) -> Duration {
        let count = self.failures.entry(key).or_insert(0);
        let delay = self
            .start
            .checked_mul(2u32.saturating_pow((*count).min(31)))
            .unwrap_or(self.max)
            .min(self.max);
        *count = count.saturating_add(1);
        delay
    }

    /// Forgets the failures of `key` (after a success, or when the object is gone).
    pub fn forget(&mut self, key: &K) {
        self.failures.remove(key);
    }

    pub fn failures(&self, key: &K) -> u32 {
        self.failures.get(key).copied().unwrap_or(0)
    }
}

/// Claims whose CreateVolume was rejected with InvalidArgument ("infeasible"): left alone for
/// `delay` unless their StorageClass is replaced meanwhile. Upstream always waits 5 minutes
/// and ignores `--retry-interval-max` here; we use `--retry-interval-max`,
/// whose default is 5 minutes, so the default behaviour is unchanged.
/// Entries map claim UID → (StorageClass UID, when).
#[derive(Debug)]
pub struct InfeasibleSet {
    delay: Duration,
    entries: HashMap<String, (String, Instant)>,
}

impl InfeasibleSet {
    pub fn new(delay: Duration) -> Self {
        Self {
            delay,
            entries: HashMap::new(),
        }
    }

    pub fn insert(&mut self, claim_uid: &str, class_uid: &str, now: Instant) {
        self.entries
            .insert(claim_uid.to_string(), (class_uid.to_string(), now));
    }

    /// Time left before the claim may be retried, or `None` if it may be retried now:
    /// never recorded, the delay has passed, or the StorageClass was replaced.
    pub fn remaining(
        &mut self,
        claim_uid: &str,
        class_uid: &str,
        now: Instant,
    ) -> Option<Duration> {
        let (recorded_class, since) = self.entries.get(claim_uid)?;
        let elapsed = now.saturating_duration_since(*since);
        if recorded_class != class_uid || elapsed >= self.delay {
            self.entries.remove(claim_uid);
            return None;
        }
        Some(self.delay - elapsed)
    }

    pub fn forget(&mut self, claim_uid: &str) {
        self.entries.remove(claim_uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_start_and_stops_at_max() {
        let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(5));
        let delays: Vec<_> = (0..5).map(|_| backoff.failure("a").as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 5, 5]);
        assert_eq!(
            backoff.failure("b"),
            Duration::from_secs(1),
            "keys are independent"
        );
    }

    #[test]
    fn backoff_restarts_after_forget() {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(60));
        backoff.failure("a");
        backoff.failure("a");
        backoff.forget(&"a");
        assert_eq!(backoff.failure("a"), Duration::from_millis(100));
    }

    #[test]
    fn backoff_never_overflows_after_many_failures() {
        let mut backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(300));
        for _ in 0..200 {
            assert!(backoff.failure("a") <= Duration::from_secs(300));
        }
    }

    #[test]
    fn infeasible_claim_waits_the_delay_unless_class_changes() {
        let t0 = Instant::now();
        let mut set = InfeasibleSet::new(Duration::from_secs(300));
        set.insert("claim", "class-1", t0);
        let left = set.remaining("claim", "class-1", t0 + Duration::from_secs(60));
        assert_eq!(left, Some(Duration::from_secs(240)));
        assert_eq!(
            set.remaining("claim", "class-2", t0 + Duration::from_secs(61)),
            None
        );
        assert_eq!(
            set.remaining("claim", "class-1", t0 + Duration::from_secs(62)),
            None,
            "entry dropped"
        );
    }

    #[test]
    fn infeasible_claim_may_retry_after_the_delay() {
        let t0 = Instant::now();
        let mut set = InfeasibleSet::new(Duration::from_secs(30));
        set.insert("claim", "class", t0);
        assert_eq!(
            set.remaining("claim", "class", t0 + Duration::from_secs(29)),
            Some(Duration::from_secs(1))
        );
        assert_eq!(
            set.remaining("claim", "class", t0 + Duration::from_secs(30)),
            None
        );
        assert_eq!(set.remaining("other", "class", t0), None);
    }
}
