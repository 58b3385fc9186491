//! What the reconcilers and the orphan reaper share: the API client, the driver, the caches,
//! the journal, the event recorder, the call limits and the [`Settings`]. Each controller
//! keeps its own per-object state (backoff and the like) in its own struct.

use std::sync::Arc;
use std::time::Duration;

use futures::future::{BoxFuture, Shared};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Client;
use kube::runtime::reflector::Store;

use crate::controller::capacity::capacity_publisher::{CapacityRefresh, CapacitySettings};
use crate::controller::cluster_views::grants::GrantCache;
use crate::controller::cluster_views::topology_cache::TopologyView;
use crate::controller::runtime::cache::{
    CachedAttachment, CachedClaim, CachedVolume, Listed, listed,
};
use crate::controller::runtime::events::EventRecorder;
use crate::controller::runtime::limits::CallLimits;
use crate::csi_client::CsiController;
use crate::fence::LeaseFence;
use crate::journal::{Journal, JournalScope};
use crate::metrics::Metrics;
use crate::provision::storage_capacity::RefreshCause;
use crate::provision::{DriverCapabilities, NodeScope, ProvisionerConfig};

/// Settings of `controller::run` that come from flags.
pub struct Settings {
    pub config: ProvisionerConfig,
    pub caps: DriverCapabilities,
    pub retry_interval_start: Duration,
    pub retry_interval_max: Duration,
    pub worker_threads: usize,
    pub max_concurrent_per_class: usize,
    /// `--adaptive-call-rate`: halve a class's call rate when its driver is overloaded.
    pub adaptive_call_rate: bool,
    /// `--audit-volumes-interval`; zero: no audit.
    pub audit_volumes_interval: Duration,
    /// `--audit-delete-after`; `None`: the audit only reports.
    pub audit_delete_after: Option<Duration>,
    /// `--cloning-protection-threads`: concurrent reconciles of the cloning-protection
    /// controller (only with CLONE_VOLUME).
    pub cloning_protection_threads: usize,
    /// `--snapshot-orphan-sweep-interval`; zero disables the sweeper.
    pub snapshot_orphan_sweep_interval: Duration,
    /// Source component of events: `<driver>_<hostname>_<uuid>` as upstream's library writes.
    pub event_component: String,
    pub hostname: String,
    pub consistency_by_default: bool,
    /// Where the journal shards live (the sidecar's namespace), and which are this sidecar's
    /// (its driver's; in node mode, its node's only).
    pub journal_namespace: String,
    pub journal_scope: JournalScope,
    /// How long a journal write may take before CreateVolume is given up for this attempt.
    pub journal_timeout: Duration,
    /// `--drain`: hand over to another provisioner (see `provision::drain_claim_work`).
    pub draining: bool,
    /// `--strict-topology` and `--immediate-topology`.
    pub topology: TopologyFlags,
    /// `--node-deployment`: this sidecar serves one node only.
    pub node: Option<NodeDeployment>,
    /// `--enable-capacity`.
    pub capacity: Option<CapacitySettings>,
}

/// `--node-deployment`: the node this sidecar runs on, as `NODE_NAME` names it and the
/// driver's NodeGetInfo describes it, and how it competes for Immediate claims.
#[derive(Debug, Clone)]
pub struct NodeDeployment {
    /// `NODE_NAME`.
    pub name: String,
    /// NodeGetInfo's `accessible_topology` segments; empty when the driver reports none.
    pub segment: std::collections::BTreeMap<String, String>,
    /// `--node-deployment-immediate-binding`.
    pub immediate_binding: bool,
    /// `--node-deployment-base-delay` and `--node-deployment-max-delay`.
    pub base_delay: Duration,
    pub max_delay: Duration,
}

impl NodeDeployment {
    pub fn scope(&self) -> NodeScope<'_> {
        NodeScope {
            name: &self.name,
            segment: &self.segment,
            immediate_binding: self.immediate_binding,
        }
    }
}

/// `--strict-topology` and `--immediate-topology`; they act only when `caps.topology`.
#[derive(Debug, Clone, Copy)]
pub struct TopologyFlags {
    pub strict: bool,
    pub immediate: bool,
}

/// What the reconcilers share: handles and settings, no per-object state.
pub struct Context {
    pub client: Client,
    pub driver: FencedDriver,
    /// Takes the claims of its first list as they arrive: a claim's absence is a fact only once
    /// `claims_listed` has resolved (see `cache::watch_claims`).
    pub claims: Store<CachedClaim>,
    pub claims_listed: Listed,
    pub volumes: Store<CachedVolume>,
    /// Whether the PV store has listed: until then a PV's absence from it says nothing.
    pub volumes_listed: Listed,
    pub classes: Store<StorageClass>,
    /// Nodes and CSINodes, watched only when the driver reports topology; this node alone in
    /// node mode.
    pub topology: Option<TopologyView>,
    /// ReferenceGrants, watched only with the CrossNamespaceVolumeDataSource gate on.
    pub grants: Option<GrantCache>,
    /// Only for a driver with PUBLISH_UNPUBLISH_VOLUME.
    pub attachments: Option<Attachments>,
    pub events: EventRecorder,
    pub metrics: Arc<Metrics>,
    pub limits: CallLimits,
    pub journal: Journal,
    /// With `--enable-capacity`: where provisionings and deletions ask for a refresh.
    pub capacity_refresh: Option<CapacityRefresh>,
    /// The flags, as `controller::run` got them.
    pub settings: Settings,
}

/// The CSI driver as the controllers reach it: through a fence that is closed while this
/// replica cannot prove it leads (see `crate::fence`); `actions` checks it before each call.
pub struct FencedDriver {
    pub csi: Arc<dyn CsiController>,
    pub fence: LeaseFence,
}

/// The watched objects, as cached by [`crate::controller::runtime::cache`].
pub struct Stores {
    pub claims: Store<CachedClaim>,
    /// When the claim store's first list is whole (`cache::watch_claims`).
    pub claims_listed: Listed,
    pub volumes: Store<CachedVolume>,
    pub classes: Store<StorageClass>,
    pub topology: Option<TopologyView>,
    pub grants: Option<GrantCache>,
    pub attachments: Option<Store<CachedAttachment>>,
}

/// The VolumeAttachment store and whether it has listed once.
pub struct Attachments {
    store: Store<CachedAttachment>,
    /// Awaited by every reconcile that reads the store (see `cache::listed`).
    listed: Shared<BoxFuture<'static, bool>>,
}

impl Attachments {
    fn new(store: Store<CachedAttachment>) -> Self {
        Attachments {
            listed: listed(&store),
            store,
        }
    }

    /// The cached attachments, once the watch has listed them; `None` if it has not within
    /// `wait` (the volume watch may list first at start-up). Bounded so that a watch that can
    /// never list (no RBAC) does not hold a reconcile, and with it a graceful shutdown.
    pub async fn listed(&self, wait: Duration) -> Option<Vec<Arc<CachedAttachment>>> {
        let listed = tokio::time::timeout(wait, self.listed.clone()).await;
        listed.unwrap_or(false).then(|| self.store.state())
    }
}

impl Context {
    pub fn new(
        client: Client,
        driver: FencedDriver,
        stores: Stores,
        events: EventRecorder,
        metrics: Arc<Metrics>,
        journal: Journal,
        settings: Settings,
    ) -> Self {
        let limits = CallLimits::new(
            settings.worker_threads,
            settings.max_concurrent_per_class,
            settings.adaptive_call_rate,
            Arc::clone(&metrics),
        );
        Context {
            client,
            driver,
            claims: stores.claims,
            claims_listed: stores.claims_listed,
            volumes_listed: listed(&stores.volumes),
            volumes: stores.volumes,
            classes: stores.classes,
            topology: stores.topology,
            grants: stores.grants,
            attachments: stores.attachments.map(Attachments::new),
            events,
            metrics,
            limits,
            journal,
            capacity_refresh: None,
            settings,
        }
    }

    /// Sends the refresh requests to the capacity controller.
    pub fn with_capacity_refresh(mut self, refresh: CapacityRefresh) -> Self {
        self.capacity_refresh = Some(refresh);
        self
    }

    /// Asks the capacity controller (if any) to query what `cause` may have changed.
    pub(in crate::controller) fn refresh_capacity(&self, cause: impl FnOnce() -> RefreshCause) {
        if let Some(refresh) = &self.capacity_refresh {
            refresh.request(cause());
        }
    }

    /// Node mode: this node as the decisions take it.
    pub(in crate::controller) fn node_scope(&self) -> Option<NodeScope<'_>> {
        self.settings.node.as_ref().map(NodeDeployment::scope)
    }
}
