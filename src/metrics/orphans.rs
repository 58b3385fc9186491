//! `csi_provisioner_orphaned_volumes_*`: the orphan reaper's metrics. Ours, not upstream's:
//! upstream has no journal of operations in flight.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The orphan reaper's metrics.
#[derive(Debug)]
pub(super) struct OrphanMetrics {
    deleted: Counter,
    waiting_for_secret: Gauge,
}

impl OrphanMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let deleted = Counter::default();
        registry.register(
            "csi_provisioner_orphaned_volumes_deleted",
            "Volumes deleted because the claim they were created for no longer exists",
            deleted.clone(),
        );
        let waiting_for_secret = Gauge::default();
        registry.register(
            "csi_provisioner_orphaned_volumes_waiting_for_secret",
            "Volumes of claims that no longer exist, not deleted yet because their provisioner secret cannot be read",
            waiting_for_secret.clone(),
        );
        OrphanMetrics {
            deleted,
            waiting_for_secret,
        }
    }

    /// See [`super::Metrics::orphan_deleted`].
    pub(super) fn deleted(&self) {
        self.deleted.inc();
    }

    /// See [`super::Metrics::set_orphans_waiting_for_secret`].
    pub(super) fn set_waiting_for_secret(&self, waiting: usize) {
        self.waiting_for_secret
            .set(i64::try_from(waiting).unwrap_or(i64::MAX));
    }
}
