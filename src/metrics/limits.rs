//! `csi_provisioner_storage_class_*`: the per-StorageClass call limits' gauges, recorded by
//! `controller::limits`. Ours, not upstream's: upstream has no per-class limits.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClassLabels {
    storage_class: String,
}

fn labels(class: &str) -> ClassLabels {
    ClassLabels {
        storage_class: class.to_owned(),
    }
}

/// The call limits' gauges.
#[derive(Debug)]
pub(super) struct LimitGauges {
    rate: Family<ClassLabels, Gauge<f64, AtomicU64>>,
    queued: Family<ClassLabels, Gauge>,
}

impl LimitGauges {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let rate = Family::<ClassLabels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "csi_provisioner_storage_class_calls_per_second",
            "CreateVolume and DeleteVolume calls per second a StorageClass is held to now (its annotation provisioner.csi-rs.dev/calls-per-second, or less while the adaptive rate slows it); no series for a class without a limit",
            rate.clone(),
        );
        let queued = Family::<ClassLabels, Gauge>::default();
        registry.register(
            "csi_provisioner_storage_class_queued_calls",
            "CreateVolume and DeleteVolume calls of a StorageClass waiting for its concurrency, its rate or a worker",
            queued.clone(),
        );
        LimitGauges { rate, queued }
    }

    /// See [`super::Metrics::set_call_rate`].
    pub(super) fn set_rate(&self, class: &str, rate: Option<f64>) {
        match rate {
            Some(rate) => {
                self.rate.get_or_create(&labels(class)).set(rate);
            }
            None => {
                self.rate.remove(&labels(class));
            }
        }
    }

    /// See [`super::Metrics::set_calls_queued`].
    pub(super) fn set_queued(&self, class: &str, queued: usize) {
        self.queued
            .get_or_create(&labels(class))
            .set(i64::try_from(queued).unwrap_or(i64::MAX));
    }
}
