//! `csistoragecapacities_*`: the CSIStorageCapacity controller's gauges, recorded by
//! `controller::capacity_publisher`.

use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The gauges of the CSIStorageCapacity controller. They exist from the start but are
/// registered only with `--enable-capacity` ([`CapacityGauges::register`]), as upstream
/// registers them only then; so, unlike the other owners', `register` takes `&self`.
#[derive(Debug, Default)]
pub(super) struct CapacityGauges {
    goal: Gauge,
    current: Gauge,
    obsolete: Gauge,
}

impl CapacityGauges {
    /// Registers the gauges with upstream's names and help texts (the registry appends the
    /// final period).
    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "csistoragecapacities_desired_goal",
            "[ALPHA] Number of CSIStorageCapacity objects that are supposed to be managed automatically",
            self.goal.clone(),
        );
        registry.register(
            "csistoragecapacities_desired_current",
            "[ALPHA] Number of CSIStorageCapacity objects that exist and are supposed to be managed automatically",
            self.current.clone(),
        );
        registry.register(
            "csistoragecapacities_obsolete",
            "[ALPHA] Number of CSIStorageCapacity objects that exist and will be deleted automatically. Objects that exist and may need an update are not considered obsolete and therefore not included in this value",
            self.obsolete.clone(),
        );
    }

    /// See [`super::Metrics::set_capacity_objects`].
    pub(super) fn set(&self, goal: usize, current: usize, obsolete: usize) {
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.goal.set(count(goal));
        self.current.set(count(current));
        self.obsolete.set(count(obsolete));
    }
}
