//! `csi_provisioner_unreferenced_volumes*` and `csi_provisioner_volume_audits`: the backend
//! audit's metrics (`--audit-volumes-interval`), recorded by `controller::audit` and the
//! orphan reaper. Ours, not upstream's: upstream has no audit.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

/// The audit's metrics. They exist from the start but are registered only with
/// `--audit-volumes-interval` ([`AuditMetrics::register`]): without an audit, a gauge of 0
/// unreferenced volumes would claim something nobody checked.
#[derive(Debug, Default)]
pub(super) struct AuditMetrics {
    unreferenced: Gauge,
    unreferenced_bytes: Gauge,
    deleted: Counter,
    passes: Family<ResultLabels, Counter>,
}

impl AuditMetrics {
    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "csi_provisioner_unreferenced_volumes",
            "Volumes the driver lists that no PV, VolumeSnapshotContent or operation in flight referenced on audits at least --audit-volumes-interval apart",
            self.unreferenced.clone(),
        );
        registry.register(
            "csi_provisioner_unreferenced_volumes_bytes",
            "Capacity of the unreferenced volumes, as the driver lists it",
            self.unreferenced_bytes.clone(),
        );
        registry.register(
            "csi_provisioner_unreferenced_volumes_deleted",
            "Unreferenced volumes deleted under --audit-delete-after",
            self.deleted.clone(),
        );
        registry.register(
            "csi_provisioner_volume_audits",
            "Audits of the driver's volumes, by result: complete, or failed (nothing reported or deleted from it)",
            self.passes.clone(),
        );
    }

    /// See [`super::Metrics::audit_complete`].
    pub(super) fn complete(&self, unreferenced: usize, bytes: i64) {
        self.unreferenced
            .set(i64::try_from(unreferenced).unwrap_or(i64::MAX));
        self.unreferenced_bytes.set(bytes);
        self.passes
            .get_or_create(&ResultLabels { result: "complete" })
            .inc();
    }

    /// See [`super::Metrics::audit_failed`].
    pub(super) fn failed(&self) {
        self.passes
            .get_or_create(&ResultLabels { result: "failed" })
            .inc();
    }

    /// See [`super::Metrics::unreferenced_volume_deleted`].
    pub(super) fn deleted(&self) {
        self.deleted.inc();
    }
}
