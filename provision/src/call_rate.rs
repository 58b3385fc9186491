//! Ours (not upstream): how fast the sidecar may call the driver for one StorageClass.
//!
//! An admin sets a class's rate with the annotation [`CALLS_PER_SECOND_ANNOTATION`] (an
//! annotation, not a parameter: parameters go to the driver, and upstream refuses unknown keys
//! under `csi.storage.k8s.io/`, so a class keeps working if the sidecar is swapped back).
//! With `--adaptive-call-rate` the rate of a class is halved when its driver answers that it
//! is overloaded, and climbs back in steps ([`AdaptiveRate`]); these are pure decisions, the
//! limiter (`controller::limits`) applies them.

use std::time::{Duration, Instant};

use k8s_openapi::api::storage::v1::StorageClass;
use thiserror::Error;

/// The StorageClass annotation holding the class's CreateVolume/DeleteVolume calls per second.
pub const CALLS_PER_SECOND_ANNOTATION: &str = "provisioner.csi-rs.dev/calls-per-second";

/// The highest rate accepted; above it the limit would not limit anything a driver notices.
pub const MAX_CALLS_PER_SECOND: f64 = 10_000.0;
/// The lowest rate accepted: one call every 1000 s.
pub const MIN_CALLS_PER_SECOND: f64 = 0.001;
/// The lowest rate the adaptive mode goes down to: one call every 20 s still makes progress.
pub const MIN_ADAPTIVE_RATE: f64 = 0.05;
/// At most one halving per this long: calls in flight when the driver first pushed back
/// answer the same, and they are one signal, not many.
pub const CUT_COOLDOWN: Duration = Duration::from_secs(1);
/// Without a new overload answer for this long, the rate climbs one step.
pub const RECOVERY_STEP: Duration = Duration::from_secs(2);
/// Each step adds this share of the rate the class recovers to.
const RECOVERY_SHARE: f64 = 0.1;

#[derive(Debug, Error, PartialEq)]
pub enum CallRateError {
    #[error(
        "StorageClass {class}: annotation {CALLS_PER_SECOND_ANNOTATION}={value:?} is not a number of calls per second from {MIN_CALLS_PER_SECOND} to {MAX_CALLS_PER_SECOND}; the class is not rate-limited"
    )]
    Invalid { class: String, value: String },
}

/// The rate the admin set on `class`, if any.
pub fn class_call_rate(class: &StorageClass) -> Result<Option<f64>, CallRateError> {
    let Some(value) = class
        .metadata
        .annotations
        .as_ref()
        .and_then(|annotations| annotations.get(CALLS_PER_SECOND_ANNOTATION))
    else {
        return Ok(None);
    };
    match value.trim().parse::<f64>() {
        Ok(rate) if (MIN_CALLS_PER_SECOND..=MAX_CALLS_PER_SECOND).contains(&rate) => Ok(Some(rate)),
        _ => Err(CallRateError::Invalid {
            class: class.metadata.name.clone().unwrap_or_default(),
            value: value.clone(),
        }),
    }
}

/// The adaptive slowdown of one class, once its driver has pushed back: the rate it is held
/// to now, and the rate it climbs back to (the class's own rate, or, for a class without one,
/// the rate its calls were going at when the driver first pushed back, after which it is
/// unlimited again).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdaptiveRate {
    pub current: f64,
    pub ceiling: f64,
    changed: Instant,
}

impl AdaptiveRate {
    /// The driver answered that it is overloaded. `state` is the slowdown so far, `set` the
    /// class's own rate, `observed` the rate its calls went at lately (calls per second).
    pub fn overloaded(
        state: Option<AdaptiveRate>,
        set: Option<f64>,
        observed: f64,
        now: Instant,
    ) -> AdaptiveRate {
        if let Some(state) = state
            && now.saturating_duration_since(state.changed) < CUT_COOLDOWN
        {
            return state;
        }
        let ceiling = set
            .or(state.map(|state| state.ceiling))
            .unwrap_or(observed)
            .max(MIN_ADAPTIVE_RATE);
        let from = state.map_or(ceiling, |state| state.current);
        AdaptiveRate {
            current: (from / 2.0).max(MIN_ADAPTIVE_RATE),
            ceiling,
            changed: now,
        }
    }

    /// Time passed without an overload answer: one step up per [`RECOVERY_STEP`]; `None` once
    /// the class is back at its ceiling (its own rate holds again, or none).
    pub fn recovered(self, now: Instant) -> Option<AdaptiveRate> {
        let quiet = now.saturating_duration_since(self.changed);
        if quiet < RECOVERY_STEP {
            return Some(self);
        }
        let steps = (quiet.as_secs_f64() / RECOVERY_STEP.as_secs_f64()).floor();
        let current = self.current + steps * self.ceiling * RECOVERY_SHARE;
        (current < self.ceiling).then(|| AdaptiveRate {
            current,
            ceiling: self.ceiling,
            changed: self.changed + RECOVERY_STEP.mul_f64(steps),
        })
    }
}

/// The rate a class's calls are held to: the adaptive slowdown's if there is one, else the
/// class's own; `None` is unlimited.
pub fn effective_rate(set: Option<f64>, adaptive: Option<&AdaptiveRate>) -> Option<f64> {
    adaptive.map(|state| state.current).or(set)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn class(annotation: Option<&str>) -> StorageClass {
        StorageClass {
            metadata: ObjectMeta {
                name: Some("gold".to_owned()),
                annotations: annotation.map(|value| {
                    [(CALLS_PER_SECOND_ANNOTATION.to_owned(), value.to_owned())].into()
                }),
                ..ObjectMeta::default()
            },
            provisioner: "driver".to_owned(),
            ..StorageClass::default()
        }
    }

    #[test]
    fn a_class_rate_is_read_from_its_annotation() {
        assert_eq!(class_call_rate(&class(None)), Ok(None));
        assert_eq!(class_call_rate(&class(Some("5"))), Ok(Some(5.0)));
        assert_eq!(class_call_rate(&class(Some(" 0.5 "))), Ok(Some(0.5)));
        for bad in ["0", "-1", "fast", "NaN", "inf", "", "10001", "1e-300"] {
            let error = class_call_rate(&class(Some(bad))).unwrap_err();
            assert!(error.to_string().contains("StorageClass gold"), "{error}");
        }
    }

    #[test]
    fn an_overload_halves_the_rate_once_per_cooldown() {
        let start = Instant::now();
        let first = AdaptiveRate::overloaded(None, Some(8.0), 3.0, start);
        assert_eq!((first.current, first.ceiling), (4.0, 8.0));
        let same_burst =
            AdaptiveRate::overloaded(Some(first), Some(8.0), 3.0, start + CUT_COOLDOWN / 2);
        assert_eq!(same_burst.current, 4.0, "answers of one burst cut once");
        let later = AdaptiveRate::overloaded(Some(first), Some(8.0), 3.0, start + CUT_COOLDOWN);
        assert_eq!(later.current, 2.0);
    }

    #[test]
    fn a_class_without_a_rate_is_slowed_from_the_rate_it_went_at() {
        let start = Instant::now();
        let cut = AdaptiveRate::overloaded(None, None, 10.0, start);
        assert_eq!((cut.current, cut.ceiling), (5.0, 10.0));
        assert_eq!(effective_rate(None, Some(&cut)), Some(5.0));
        assert_eq!(effective_rate(None, None), None);
        let floor = AdaptiveRate::overloaded(None, None, 0.0, start);
        assert_eq!(floor.current, MIN_ADAPTIVE_RATE);
    }

    #[test]
    fn the_rate_climbs_back_in_steps_and_then_the_slowdown_ends() {
        let start = Instant::now();
        let cut = AdaptiveRate::overloaded(None, Some(10.0), 0.0, start);
        assert_eq!(cut.recovered(start + RECOVERY_STEP / 2), Some(cut));
        let one = cut.recovered(start + RECOVERY_STEP).expect("still slowed");
        assert!((one.current - 6.0).abs() < 1e-9, "{one:?}");
        let two = one
            .recovered(start + RECOVERY_STEP * 2)
            .expect("still slowed");
        assert!((two.current - 7.0).abs() < 1e-9, "{two:?}");
        assert_eq!(cut.recovered(start + RECOVERY_STEP * 5), None);
    }
}
