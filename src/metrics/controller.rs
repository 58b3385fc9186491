//! `controller_persistentvolumeclaim_provision*` and `controller_persistentvolume_delete*`: the
//! provisioning library's metrics, recorded by the claim and volume reconcilers.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::HistogramFamily;

/// Prometheus' default buckets, used by the provisioning library's duration histograms.
const DEFAULT_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Labels of the PVC provisioning metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProvisionLabels {
    class: String,
    source: String,
}

/// Labels of the PV deletion metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeleteLabels {
    class: String,
}

fn default_histogram() -> Histogram {
    Histogram::new(DEFAULT_BUCKETS)
}

/// The provisioning and deletion metrics of the claim and volume controllers.
#[derive(Debug)]
pub(super) struct ControllerMetrics {
    provision: Family<ProvisionLabels, Counter>,
    provision_failed: Family<ProvisionLabels, Counter>,
    provision_duration: HistogramFamily<ProvisionLabels>,
    delete: Family<DeleteLabels, Counter>,
    delete_failed: Family<DeleteLabels, Counter>,
    delete_duration: HistogramFamily<DeleteLabels>,
}

impl ControllerMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        // prometheus-client appends `_total` to counters, so they are registered without it.
        let provision = Family::<ProvisionLabels, Counter>::default();
        registry.register(
            "controller_persistentvolumeclaim_provision",
            "Number of persistent volume claims provisioned successfully",
            provision.clone(),
        );
        let provision_failed = Family::<ProvisionLabels, Counter>::default();
        registry.register(
            "controller_persistentvolumeclaim_provision_failed",
            "Number of failed attempts to provision a persistent volume claim",
            provision_failed.clone(),
        );
        let provision_duration: HistogramFamily<ProvisionLabels> =
            Family::new_with_constructor(default_histogram);
        registry.register(
            "controller_persistentvolumeclaim_provision_duration_seconds",
            "Duration of successful provisioning of a persistent volume claim",
            provision_duration.clone(),
        );
        let delete = Family::<DeleteLabels, Counter>::default();
        registry.register(
            "controller_persistentvolume_delete",
            "Number of persistent volumes deleted successfully",
            delete.clone(),
        );
        let delete_failed = Family::<DeleteLabels, Counter>::default();
        registry.register(
            "controller_persistentvolume_delete_failed",
            "Number of failed attempts to delete a persistent volume",
            delete_failed.clone(),
        );
        let delete_duration: HistogramFamily<DeleteLabels> =
            Family::new_with_constructor(default_histogram);
        registry.register(
            "controller_persistentvolume_delete_duration_seconds",
            "Duration of successful deletion of a persistent volume",
            delete_duration.clone(),
        );
        ControllerMetrics {
            provision,
            provision_failed,
            provision_duration,
            delete,
            delete_failed,
            delete_duration,
        }
    }

    /// See [`super::Metrics::provision_succeeded`].
    pub(super) fn provision_succeeded(&self, class: &str, source: &str, elapsed: Duration) {
        let labels = ProvisionLabels {
            class: class.to_string(),
            source: source.to_string(),
        };
        self.provision.get_or_create(&labels).inc();
        self.provision_duration
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
    }

    /// See [`super::Metrics::provision_failed`].
    pub(super) fn provision_failed(&self, class: &str, source: &str) {
        self.provision_failed
            .get_or_create(&ProvisionLabels {
                class: class.to_string(),
                source: source.to_string(),
            })
            .inc();
    }

    /// See [`super::Metrics::delete_succeeded`].
    pub(super) fn delete_succeeded(&self, class: &str, elapsed: Duration) {
        let labels = DeleteLabels {
            class: class.to_string(),
        };
        self.delete.get_or_create(&labels).inc();
        self.delete_duration
            .get_or_create(&labels)
            .observe(elapsed.as_secs_f64());
    }

    /// See [`super::Metrics::delete_failed`].
    pub(super) fn delete_failed(&self, class: &str) {
        self.delete_failed
            .get_or_create(&DeleteLabels {
                class: class.to_string(),
            })
            .inc();
    }
}
