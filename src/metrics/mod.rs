//! Prometheus metrics of the sidecar, exposed under upstream's names so existing dashboards and
//! alerts keep working.
//!
//! One [`Metrics`] value is created in `main` and shared (`Arc<Metrics>`) by everything that
//! records; nothing is global, so tests create their own. Each owner's module registers its
//! families and records them (`csi`: the CSI calls; `controller`: provisioning and deletion;
//! `orphans`: the orphan reaper; `leader`: leader election; `workqueue`: the work queues;
//! `process`: the process figures, read at each scrape; `capacity`: the CSIStorageCapacity
//! gauges; `limits`: the per-StorageClass call limits; `audit`: the backend audit);
//! [`Metrics::new`] composes them and keeps the method names callers use.

mod audit;
mod capacity;
mod controller;
mod csi;
mod leader;
mod limits;
mod orphans;
mod process;
mod workqueue;

pub use csi::{NON_GRPC_STATUS, UNKNOWN_DRIVER};
pub use workqueue::{QueueKey, QueueMetrics};

use std::time::{Duration, Instant};

use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// `name` of the claim queue's series (and of the cloning-protection queue's, as upstream).
pub const CLAIMS_QUEUE: &str = "claims";
/// `name` of the volume queue's series.
pub const VOLUMES_QUEUE: &str = "volumes";
/// `name` of the CSIStorageCapacity queue's series.
pub const CAPACITY_QUEUE: &str = "csistoragecapacity";

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// The sidecar's metrics registry and every metric in it, each family registered by the
/// module of its owner (`csi`, `controller`, `orphans`, `leader`, `workqueue`, `process`,
/// `capacity`).
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    csi: csi::CsiMetrics,
    controller: controller::ControllerMetrics,
    orphans: orphans::OrphanMetrics,
    limits: limits::LimitGauges,
    audit: audit::AuditMetrics,
    leader: leader::LeaderMetrics,
    workqueues: workqueue::Workqueues,
    capacity: capacity::CapacityGauges,
}

impl Metrics {
    /// `Content-Type` of [`Metrics::encode`]'s output (Prometheus text format 0.0.4, what the
    /// Go sidecar serves by default).
    pub const CONTENT_TYPE: &'static str = prometheus_text::CONTENT_TYPE;

    /// Creates the registry with every metric registered. `process_start_time_seconds` is set
    /// to now, so call this once, early in `main`. The order of registration is the order of
    /// the exposition.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let csi = csi::CsiMetrics::register(&mut registry);
        let controller = controller::ControllerMetrics::register(&mut registry);
        let orphans = orphans::OrphanMetrics::register(&mut registry);
        let limits = limits::LimitGauges::register(&mut registry);
        let leader = leader::LeaderMetrics::register(&mut registry);
        let workqueues = workqueue::Workqueues::register(&mut registry);
        // Upstream's provisioning library creates both queues at start, on every replica.
        workqueues.declare(CLAIMS_QUEUE);
        workqueues.declare(VOLUMES_QUEUE);
        process::register(&mut registry);
        Metrics {
            registry,
            csi,
            controller,
            orphans,
            limits,
            audit: audit::AuditMetrics::default(),
            leader,
            workqueues,
            capacity: capacity::CapacityGauges::default(),
        }
    }

    /// A recorder of `workqueue_*` for one queue named `name`.
    /// Queues may share a name (see [`CLAIMS_QUEUE`]).
    pub fn queue(&self, name: &'static str) -> std::sync::Arc<QueueMetrics> {
        self.workqueues.queue(name)
    }

    /// Registers the CSIStorageCapacity gauges and the capacity queue's series (upstream
    /// creates that queue at start).
    pub fn register_capacity(&mut self) {
        self.workqueues.declare(CAPACITY_QUEUE);
        self.capacity.register(&mut self.registry);
    }

    /// Registers the backend audit's metrics (`--audit-volumes-interval`).
    pub fn register_audit(&mut self) {
        self.audit.register(&mut self.registry);
    }

    /// Sets the CSIStorageCapacity gauges: objects wanted, wanted objects that exist, and
    /// objects of ours that no item wants.
    pub fn set_capacity_objects(&self, goal: usize, current: usize, obsolete: usize) {
        self.capacity.set(goal, current, obsolete);
    }

    /// Creates the leader-election series (at 0), as client-go does when the elector is made.
    pub fn leader_election_started(&self) {
        self.leader.started();
    }

    /// Records whether this replica leads, as client-go's `leader_election_master_status`.
    pub fn set_leading(&self, leading: bool) {
        self.leader.set_leading(leading);
    }

    /// Counts a renewal of our own Lease through the slow path (a fresh GET, then the
    /// update), as client-go's `leader_election_slowpath_total`.
    pub fn leader_slowpath(&self) {
        self.leader.slowpath();
    }

    /// Counts a volume deleted by the orphan reaper.
    pub fn orphan_deleted(&self) {
        self.orphans.deleted();
    }

    /// Sets how many orphans wait for their provisioner secret to be readable again.
    pub fn set_orphans_waiting_for_secret(&self, waiting: usize) {
        self.orphans.set_waiting_for_secret(waiting);
    }

    /// Sets the calls per second `class` is held to now; `None` (no limit) removes its series.
    pub fn set_call_rate(&self, class: &str, rate: Option<f64>) {
        self.limits.set_rate(class, rate);
    }

    /// Sets how many calls of `class` wait for a permit or their slot.
    pub fn set_calls_queued(&self, class: &str, queued: usize) {
        self.limits.set_queued(class, queued);
    }

    /// A complete audit found `unreferenced` volumes of `bytes` in all.
    pub fn audit_complete(&self, unreferenced: usize, bytes: i64) {
        self.audit.complete(unreferenced, bytes);
    }

    /// An audit could not be completed (its gauges keep the last complete one's figures).
    pub fn audit_failed(&self) {
        self.audit.failed();
    }

    /// Counts a volume the audit found unreferenced and the reaper deleted.
    pub fn unreferenced_volume_deleted(&self) {
        self.audit.deleted();
    }

    /// Records one CSI call. `method_name` is the full gRPC path
    /// (`/csi.v1.Controller/CreateVolume`), `grpc_status_code` Go's spelling of the code
    /// (`OK`, `DeadlineExceeded`, as the caller spells it) or [`NON_GRPC_STATUS`];
    /// `migrated` is `None` unless the driver is a CSI migration target.
    pub fn observe_csi_operation(
        &self,
        driver_name: &str,
        method_name: &'static str,
        grpc_status_code: &'static str,
        migrated: Option<bool>,
        elapsed: Duration,
    ) {
        self.csi.observe(
            driver_name,
            method_name,
            grpc_status_code,
            migrated,
            elapsed,
        );
    }

    /// Records a successful provisioning of a PVC of StorageClass `class` whose data source
    /// kind is `source` ("" without a data source).
    pub fn provision_succeeded(&self, class: &str, source: &str, elapsed: Duration) {
        self.controller.provision_succeeded(class, source, elapsed);
    }

    /// Records a failed provisioning attempt (any error, including ones that stop retries).
    pub fn provision_failed(&self, class: &str, source: &str) {
        self.controller.provision_failed(class, source);
    }

    /// Records a successful deletion of a PV of StorageClass `class`.
    pub fn delete_succeeded(&self, class: &str, elapsed: Duration) {
        self.controller.delete_succeeded(class, elapsed);
    }

    /// Records a failed deletion attempt of a PV of StorageClass `class`.
    pub fn delete_failed(&self, class: &str) {
        self.controller.delete_failed(class);
    }

    /// Every metric in Prometheus text format ([`Metrics::CONTENT_TYPE`]).
    pub fn encode(&self) -> String {
        self.workqueues.refresh(Instant::now());
        let mut text = String::new();
        // Writing into a String cannot fail; an encoder error would only drop the output.
        if prometheus_text::encode(&mut text, &self.registry).is_err() {
            text.clear();
        }
        text
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Metric names of the exposition (sample lines), without labels and suffix-free duplicates.
    fn sample_names(text: &str) -> Vec<String> {
        let mut names: Vec<String> = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .map(|l| l.split(['{', ' ']).next().unwrap_or_default().to_string())
            .collect();
        names.sort();
        names.dedup();
        names
    }

    #[test]
    fn exposed_names_and_labels_match_upstream() {
        let metrics = Metrics::new();
        metrics.observe_csi_operation(
            UNKNOWN_DRIVER,
            "/csi.v1.Identity/Probe",
            "OK",
            None,
            Duration::from_millis(20),
        );
        metrics.observe_csi_operation(
            "hostpath.csi.k8s.io",
            "/csi.v1.Controller/CreateVolume",
            NON_GRPC_STATUS,
            None,
            Duration::from_secs(3),
        );
        metrics.observe_csi_operation(
            "pd.csi.storage.gke.io",
            "/csi.v1.Controller/DeleteVolume",
            "OK",
            Some(true),
            Duration::from_millis(20),
        );
        metrics.provision_succeeded("fast", "", Duration::from_millis(300));
        metrics.provision_failed("fast", "VolumeSnapshot");
        metrics.delete_succeeded("fast", Duration::from_millis(30));
        metrics.delete_failed("slow");
        let text = metrics.encode();

        assert_eq!(
            sample_names(&text),
            [
                "controller_persistentvolume_delete_duration_seconds_bucket",
                "controller_persistentvolume_delete_duration_seconds_count",
                "controller_persistentvolume_delete_duration_seconds_sum",
                "controller_persistentvolume_delete_failed_total",
                "controller_persistentvolume_delete_total",
                "controller_persistentvolumeclaim_provision_duration_seconds_bucket",
                "controller_persistentvolumeclaim_provision_duration_seconds_count",
                "controller_persistentvolumeclaim_provision_duration_seconds_sum",
                "controller_persistentvolumeclaim_provision_failed_total",
                "controller_persistentvolumeclaim_provision_total",
                "csi_provisioner_orphaned_volumes_deleted_total",
                "csi_provisioner_orphaned_volumes_waiting_for_secret",
                "csi_sidecar_operations_seconds_bucket",
                "csi_sidecar_operations_seconds_count",
                "csi_sidecar_operations_seconds_sum",
                "process_cpu_seconds_total",
                "process_max_fds",
                "process_open_fds",
                "process_resident_memory_bytes",
                "process_start_time_seconds",
                "process_virtual_memory_bytes",
                "process_virtual_memory_max_bytes",
                "workqueue_adds_total",
                "workqueue_depth",
                "workqueue_longest_running_processor_seconds",
                "workqueue_queue_duration_seconds_bucket",
                "workqueue_queue_duration_seconds_count",
                "workqueue_queue_duration_seconds_sum",
                "workqueue_retries_total",
                "workqueue_unfinished_work_seconds",
                "workqueue_work_duration_seconds_bucket",
                "workqueue_work_duration_seconds_count",
                "workqueue_work_duration_seconds_sum",
            ],
            "{text}"
        );
        for expected in [
            "# TYPE csi_sidecar_operations_seconds histogram",
            "# TYPE controller_persistentvolumeclaim_provision_total counter",
            "# TYPE controller_persistentvolumeclaim_provision_failed_total counter",
            "# TYPE controller_persistentvolume_delete_total counter",
            "# TYPE controller_persistentvolume_delete_failed_total counter",
            "# TYPE process_start_time_seconds gauge",
            "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.",
            "# TYPE process_cpu_seconds_total counter",
            "# TYPE process_resident_memory_bytes gauge",
            "# TYPE process_virtual_memory_max_bytes gauge",
            "# TYPE process_open_fds gauge",
            "# TYPE csi_provisioner_orphaned_volumes_waiting_for_secret gauge",
            "csi_provisioner_orphaned_volumes_waiting_for_secret 0",
            "csi_sidecar_operations_seconds_count{driver_name=\"unknown-driver\",\
             method_name=\"/csi.v1.Identity/Probe\",grpc_status_code=\"OK\"} 1",
            "csi_sidecar_operations_seconds_bucket{driver_name=\"hostpath.csi.k8s.io\",\
             method_name=\"/csi.v1.Controller/CreateVolume\",\
             grpc_status_code=\"unknown-non-grpc\",le=\"2.5\"} 0",
            "csi_sidecar_operations_seconds_bucket{driver_name=\"hostpath.csi.k8s.io\",\
             method_name=\"/csi.v1.Controller/CreateVolume\",\
             grpc_status_code=\"unknown-non-grpc\",le=\"5\"} 1",
            "controller_persistentvolumeclaim_provision_total{class=\"fast\",source=\"\"} 1",
            "controller_persistentvolumeclaim_provision_failed_total{class=\"fast\",\
             source=\"VolumeSnapshot\"} 1",
            "controller_persistentvolume_delete_total{class=\"fast\"} 1",
            "csi_sidecar_operations_seconds_count{driver_name=\"pd.csi.storage.gke.io\",\
             method_name=\"/csi.v1.Controller/DeleteVolume\",grpc_status_code=\"OK\",\
             migrated=\"true\"} 1",
            "controller_persistentvolume_delete_failed_total{class=\"slow\"} 1",
        ] {
            assert!(text.contains(expected), "missing {expected:?} in\n{text}");
        }
    }

    #[test]
    fn histogram_buckets_are_upstreams() {
        let metrics = Metrics::new();
        metrics.observe_csi_operation("d", "/m", "OK", None, Duration::from_millis(1));
        metrics.provision_succeeded("c", "", Duration::from_millis(1));
        let text = metrics.encode();
        let bounds = |prefix: &str| -> Vec<String> {
            text.lines()
                .filter(|l| l.starts_with(prefix))
                .filter_map(|l| l.split("le=\"").nth(1))
                .filter_map(|rest| rest.split('"').next())
                .map(str::to_string)
                .collect()
        };
        assert_eq!(
            bounds("csi_sidecar_operations_seconds_bucket"),
            [
                "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "15", "25", "50", "120", "300", "600",
                "+Inf"
            ]
        );
        assert_eq!(
            bounds("controller_persistentvolumeclaim_provision_duration_seconds_bucket"),
            [
                "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10",
                "+Inf"
            ]
        );
    }

    #[test]
    fn orphans_waiting_for_their_secret_go_up_and_down() {
        let metrics = Metrics::new();
        metrics.set_orphans_waiting_for_secret(2);
        assert!(
            metrics
                .encode()
                .contains("\ncsi_provisioner_orphaned_volumes_waiting_for_secret 2\n")
        );
        metrics.set_orphans_waiting_for_secret(0);
        assert!(
            metrics
                .encode()
                .contains("\ncsi_provisioner_orphaned_volumes_waiting_for_secret 0\n")
        );
    }

    #[test]
    fn process_start_time_is_set() {
        let text = Metrics::new().encode();
        let value = text
            .lines()
            .find_map(|l| l.strip_prefix("process_start_time_seconds "))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or_default();
        assert!(value > 1.7e9, "{text}");
    }

    #[test]
    fn leader_election_series_exist_only_once_started_with_an_empty_name() {
        let metrics = Metrics::new();
        assert!(!metrics.encode().contains("leader_election_master_status{"));
        assert!(!metrics.encode().contains("leader_election_slowpath_total{"));
        metrics.leader_election_started();
        let text = metrics.encode();
        assert!(text.contains("# HELP leader_election_master_status [ALPHA] Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease. Please make sure to group by name.\n"), "{text}");
        assert!(text.contains("# TYPE leader_election_slowpath_total counter\n"));
        assert!(text.contains("# HELP leader_election_slowpath_total [ALPHA] Total number of slow path exercised in renewing leader leases. 'name' is the string used to identify the lease. Please make sure to group by name.\n"), "{text}");
        assert!(text.contains("\nleader_election_master_status{name=\"\"} 0\n"));
        assert!(text.contains("\nleader_election_slowpath_total{name=\"\"} 0\n"));
        metrics.set_leading(true);
        metrics.leader_slowpath();
        let text = metrics.encode();
        assert!(text.contains("\nleader_election_master_status{name=\"\"} 1\n"));
        assert!(text.contains("\nleader_election_slowpath_total{name=\"\"} 1\n"));
    }

    #[test]
    fn capacity_gauges_appear_only_once_registered() {
        let mut metrics = Metrics::new();
        assert!(!metrics.encode().contains("csistoragecapacit"));
        metrics.register_capacity();
        metrics.set_capacity_objects(4, 3, 1);
        let text = metrics.encode();
        assert!(text.contains("# HELP csistoragecapacities_desired_goal [ALPHA] Number of CSIStorageCapacity objects that are supposed to be managed automatically.\n"), "{text}");
        assert!(text.contains("# TYPE csistoragecapacities_desired_goal gauge"));
        assert!(text.contains("\ncsistoragecapacities_desired_goal 4\n"));
        assert!(text.contains("\ncsistoragecapacities_desired_current 3\n"));
        assert!(text.contains("\ncsistoragecapacities_obsolete 1\n"));
        assert!(text.contains("\nworkqueue_depth{name=\"csistoragecapacity\"} 0\n"));
    }

    #[test]
    fn audit_metrics_appear_only_once_registered_and_call_limits_only_per_class() {
        let mut metrics = Metrics::new();
        let text = metrics.encode();
        assert!(!text.contains("unreferenced"), "{text}");
        assert!(!text.contains("csi_provisioner_storage_class"), "{text}");
        metrics.register_audit();
        metrics.audit_complete(2, 3 << 30);
        metrics.audit_failed();
        metrics.unreferenced_volume_deleted();
        metrics.set_call_rate("gold", Some(2.5));
        metrics.set_calls_queued("gold", 3);
        let text = metrics.encode();
        for line in [
            "\ncsi_provisioner_unreferenced_volumes 2\n",
            "\ncsi_provisioner_unreferenced_volumes_bytes 3221225472\n",
            "\ncsi_provisioner_unreferenced_volumes_deleted_total 1\n",
            "\ncsi_provisioner_volume_audits_total{result=\"complete\"} 1\n",
            "\ncsi_provisioner_volume_audits_total{result=\"failed\"} 1\n",
            "\ncsi_provisioner_storage_class_calls_per_second{storage_class=\"gold\"} 2.5\n",
            "\ncsi_provisioner_storage_class_queued_calls{storage_class=\"gold\"} 3\n",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        metrics.set_call_rate("gold", None);
        assert!(!metrics.encode().contains("calls_per_second{"));
    }
}
