//! `leader_election_*`: client-go's leader-election metrics, recorded by `leader`. Registered
//! with every replica; their series appear only with --leader-election
//! ([`LeaderMetrics::started`]).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Labels of the leader-election metrics: client-go's `name`, the elector's name, which
/// csi-lib-utils never sets (upstream quirk A16: always `""`, kept so queries match).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ElectorLabels {
    name: &'static str,
}

const ELECTOR: ElectorLabels = ElectorLabels { name: "" };

/// The leader-election metrics.
#[derive(Debug)]
pub(super) struct LeaderMetrics {
    master_status: Family<ElectorLabels, Gauge>,
    slowpath: Family<ElectorLabels, Counter>,
}

impl LeaderMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let master_status = Family::<ElectorLabels, Gauge>::default();
        registry.register(
            "leader_election_master_status",
            "[ALPHA] Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease. Please make sure to group by name",
            master_status.clone(),
        );
        let slowpath = Family::<ElectorLabels, Counter>::default();
        registry.register(
            "leader_election_slowpath",
            "[ALPHA] Total number of slow path exercised in renewing leader leases. 'name' is the string used to identify the lease. Please make sure to group by name",
            slowpath.clone(),
        );
        LeaderMetrics {
            master_status,
            slowpath,
        }
    }

    /// See [`super::Metrics::leader_election_started`].
    pub(super) fn started(&self) {
        self.master_status.get_or_create(&ELECTOR).set(0);
        drop(self.slowpath.get_or_create(&ELECTOR));
    }

    /// See [`super::Metrics::set_leading`].
    pub(super) fn set_leading(&self, leading: bool) {
        self.master_status
            .get_or_create(&ELECTOR)
            .set(i64::from(leading));
    }

    /// See [`super::Metrics::leader_slowpath`].
    pub(super) fn slowpath(&self) {
        self.slowpath.get_or_create(&ELECTOR).inc();
    }
}
