//! Bounds on driver calls: `--worker-threads` over all calls (as upstream), and ours per
//! StorageClass: at most `--max-concurrent-per-storage-class` in flight, at most the class's
//! calls per second (annotation `provisioner.csi-rs.dev/calls-per-second`), and, with
//! `--adaptive-call-rate`, half the rate each time the driver answers that it is overloaded,
//! climbing back in steps (`provision::call_rate`). Storage backends often fail under many
//! parallel or rapid calls, and upstream's only knob is global.
//!
//! A call first waits for its class's permit, then for its class's next slot in time, and only
//! then for a global permit, so calls queued behind a saturated or slow class never hold
//! global permits that other classes could use.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::runner::lock;
use crate::metrics::Metrics;
use crate::provision::call_rate::RECOVERY_STEP;
use crate::provision::{AdaptiveRate, effective_rate};

/// A call waiting for its slot looks at its class's rate again this often, so a rate raised
/// (the annotation changed, the adaptive slowdown recovering) lets it go sooner.
const RATE_RECHECK: Duration = Duration::from_millis(250);
/// The window over which a class's recent call rate is measured, for the adaptive slowdown of
/// a class without a rate of its own.
const OBSERVED_WINDOW: Duration = Duration::from_secs(10);

#[derive(Debug)]
pub struct CallLimits {
    global: Arc<Semaphore>,
    per_class: usize,
    adaptive: bool,
    classes: Mutex<HashMap<String, Arc<ClassLimits>>>,
    metrics: Arc<Metrics>,
}

/// One StorageClass's limits and what they have seen.
#[derive(Debug, Default)]
struct ClassLimits {
    concurrency: Option<Arc<Semaphore>>,
    /// When the last call was let through by the rate; held while a call waits for its slot,
    /// so the calls of a class go in the order they came.
    last_start: tokio::sync::Mutex<Option<Instant>>,
    adaptive: Mutex<Adaptive>,
    /// Calls waiting for a permit or a slot.
    queued: AtomicUsize,
}

#[derive(Debug, Default)]
struct Adaptive {
    slowdown: Option<AdaptiveRate>,
    /// Recent call starts, for the rate the class went at.
    starts: VecDeque<Instant>,
    /// Whether a task is stepping the slowdown back up (so the gauge climbs even while no
    /// call of the class waits).
    recovering: bool,
}

/// Held for the duration of one driver call.
#[derive(Debug)]
pub struct CallPermit {
    _class: Option<OwnedSemaphorePermit>,
    _global: OwnedSemaphorePermit,
}

impl CallLimits {
    /// `per_class == 0` means no per-class cap.
    pub fn new(global: usize, per_class: usize, adaptive: bool, metrics: Arc<Metrics>) -> Self {
        Self {
            global: Arc::new(Semaphore::new(global.max(1))),
            per_class,
            adaptive,
            classes: Mutex::new(HashMap::new()),
            metrics,
        }
    }

    /// Waits until a call for `class` may start; `set_rate` is the class's own calls per
    /// second (`provision::class_call_rate`), `None` for none.
    pub async fn acquire(&self, class: &str, set_rate: Option<f64>) -> CallPermit {
        let limits = self.class(class);
        let _queued = Queued::new(class, &limits, &self.metrics);
        let class_permit = match &limits.concurrency {
            Some(semaphore) => Arc::clone(semaphore).acquire_owned().await.ok(),
            None => None,
        };
        // The class's slot is held until the call has its worker too, and only then stamped:
        // calls of a class start at least 1/rate apart however long the workers were busy, and
        // only one call of a rate-limited class waits for a worker at a time.
        let mut last_start = limits.last_start.lock().await;
        let rate = self
            .wait_for_slot(class, &limits, set_rate, &last_start)
            .await;
        let global = Arc::clone(&self.global)
            .acquire_owned()
            .await
            .unwrap_or_else(|_| unreachable!("the global semaphore is never closed"));
        let now = Instant::now();
        if rate.is_some() {
            *last_start = Some(now);
        }
        drop(last_start);
        if self.adaptive {
            let mut adaptive = lock(&limits.adaptive);
            adaptive.starts.push_back(now);
            observed_rate(&mut adaptive.starts, now);
        }
        CallPermit {
            _class: class_permit,
            _global: global,
        }
    }

    /// Tells the adaptive slowdown how a call of `class` ended: `overloaded` if the driver
    /// said so (`CallError::signals_overload`). Without `--adaptive-call-rate`, nothing.
    pub fn outcome(&self, class: &str, set_rate: Option<f64>, overloaded: bool) {
        if !self.adaptive || !overloaded {
            return;
        }
        let limits = self.class(class);
        let now = Instant::now();
        let (rate, start_recovery) = {
            let mut adaptive = lock(&limits.adaptive);
            let observed = observed_rate(&mut adaptive.starts, now);
            let slowdown =
                AdaptiveRate::overloaded(adaptive.slowdown, set_rate, observed, now.into_std());
            adaptive.slowdown = Some(slowdown);
            let start_recovery = !std::mem::replace(&mut adaptive.recovering, true);
            (slowdown.current, start_recovery)
        };
        self.metrics.set_call_rate(class, Some(rate));
        if start_recovery {
            tokio::spawn(recover(
                class.to_owned(),
                limits,
                set_rate,
                Arc::clone(&self.metrics),
            ));
        }
    }

    /// Waits for the class's next slot under its rate, if it has one now; the rate it went by.
    async fn wait_for_slot(
        &self,
        class: &str,
        limits: &ClassLimits,
        set_rate: Option<f64>,
        last_start: &Option<Instant>,
    ) -> Option<f64> {
        loop {
            let now = Instant::now();
            let rate = self.rate_now(class, limits, set_rate, now)?;
            let spacing = Duration::try_from_secs_f64(1.0 / rate).unwrap_or(Duration::MAX);
            let due = last_start.map_or(now, |last| {
                last.checked_add(spacing).unwrap_or(now + RATE_RECHECK)
            });
            if due <= now {
                return Some(rate);
            }
            tokio::time::sleep_until(due.min(now + RATE_RECHECK)).await;
        }
    }

    /// The rate the class's calls are held to at `now`, the slowdown's recovery applied.
    fn rate_now(
        &self,
        class: &str,
        limits: &ClassLimits,
        set_rate: Option<f64>,
        now: Instant,
    ) -> Option<f64> {
        let rate = limits.rate_now(set_rate, now);
        self.metrics.set_call_rate(class, rate);
        rate
    }

    fn class(&self, class: &str) -> Arc<ClassLimits> {
        let mut classes = lock(&self.classes);
        let limits = classes.entry(class.to_string()).or_insert_with(|| {
            Arc::new(ClassLimits {
                concurrency: (self.per_class > 0).then(|| Arc::new(Semaphore::new(self.per_class))),
                ..ClassLimits::default()
            })
        });
        Arc::clone(limits)
    }
}

/// Counts a call as queued for its class until dropped, whether it got its permit or was
/// cancelled while waiting (a reconcile dropped at shutdown).
struct Queued<'a> {
    class: &'a str,
    limits: &'a ClassLimits,
    metrics: &'a Metrics,
}

impl<'a> Queued<'a> {
    fn new(class: &'a str, limits: &'a ClassLimits, metrics: &'a Metrics) -> Self {
        let queued = limits.queued.fetch_add(1, Ordering::Relaxed) + 1;
        metrics.set_calls_queued(class, queued);
        Queued {
            class,
            limits,
            metrics,
        }
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        let queued = self.limits.queued.fetch_sub(1, Ordering::Relaxed) - 1;
        self.metrics.set_calls_queued(self.class, queued);
    }
}

impl ClassLimits {
    /// The rate the class's calls are held to at `now`, the slowdown's recovery applied.
    fn rate_now(&self, set_rate: Option<f64>, now: Instant) -> Option<f64> {
        let slowdown = {
            let mut adaptive = lock(&self.adaptive);
            adaptive.slowdown = adaptive
                .slowdown
                .and_then(|slowdown| slowdown.recovered(now.into_std()));
            adaptive.slowdown
        };
        effective_rate(set_rate, slowdown.as_ref())
    }
}

/// Steps a class's slowdown back up while no call of it may be waiting, so its gauge shows
/// the rate it is held to; ends once the slowdown has.
async fn recover(
    class: String,
    limits: Arc<ClassLimits>,
    set_rate: Option<f64>,
    metrics: Arc<Metrics>,
) {
    loop {
        tokio::time::sleep(RECOVERY_STEP).await;
        let rate = limits.rate_now(set_rate, Instant::now());
        metrics.set_call_rate(&class, rate);
        let mut adaptive = lock(&limits.adaptive);
        if adaptive.slowdown.is_none() {
            adaptive.recovering = false;
            return;
        }
    }
}

/// Calls per second over the last [`OBSERVED_WINDOW`], forgetting older starts.
fn observed_rate(starts: &mut VecDeque<Instant>, now: Instant) -> f64 {
    while starts
        .front()
        .is_some_and(|start| now.saturating_duration_since(*start) > OBSERVED_WINDOW)
    {
        starts.pop_front();
    }
    starts.len() as f64 / OBSERVED_WINDOW.as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(global: usize, per_class: usize, adaptive: bool) -> CallLimits {
        CallLimits::new(global, per_class, adaptive, Arc::new(Metrics::new()))
    }

    #[tokio::test]
    async fn a_saturated_class_does_not_block_another_class() {
        let limits = limits(3, 1, false);
        let _a1 = limits.acquire("a", None).await;
        let second_a =
            tokio::time::timeout(Duration::from_millis(50), limits.acquire("a", None)).await;
        assert!(second_a.is_err(), "class a is capped at one call");
        let b = tokio::time::timeout(Duration::from_millis(50), limits.acquire("b", None)).await;
        assert!(b.is_ok(), "class b still gets a permit");
    }

    #[tokio::test]
    async fn the_global_bound_applies_across_classes() {
        let limits = limits(2, 0, false);
        let _a = limits.acquire("a", None).await;
        let _b = limits.acquire("b", None).await;
        let third =
            tokio::time::timeout(Duration::from_millis(50), limits.acquire("c", None)).await;
        assert!(third.is_err());
        drop(_a);
        let fourth =
            tokio::time::timeout(Duration::from_millis(50), limits.acquire("c", None)).await;
        assert!(fourth.is_ok(), "a released permit is reused");
    }

    #[tokio::test(start_paused = true)]
    async fn calls_of_a_class_with_a_rate_are_spaced_and_others_are_not() {
        let limits = limits(10, 0, false);
        let start = Instant::now();
        for _ in 0..5 {
            drop(limits.acquire("slow", Some(2.0)).await);
        }
        assert_eq!(start.elapsed(), Duration::from_secs(2), "5 calls at 2/s");
        let start = Instant::now();
        for _ in 0..5 {
            drop(limits.acquire("free", None).await);
        }
        assert_eq!(start.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn an_overloaded_driver_halves_the_rate_only_when_adaptive() {
        let fixed = limits(10, 0, false);
        fixed.outcome("a", Some(4.0), true);
        let start = Instant::now();
        for _ in 0..3 {
            drop(fixed.acquire("a", Some(4.0)).await);
        }
        assert_eq!(start.elapsed(), Duration::from_millis(500));

        let adaptive = limits(10, 0, true);
        adaptive.outcome("a", Some(4.0), false);
        adaptive.outcome("a", Some(4.0), true);
        let start = Instant::now();
        for _ in 0..3 {
            drop(adaptive.acquire("a", Some(4.0)).await);
        }
        assert_eq!(start.elapsed(), Duration::from_secs(1), "3 calls at 2/s");
    }
}
