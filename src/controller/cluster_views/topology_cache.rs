//! Watches of Nodes and CSINodes for the topology decisions, kept as small as what those read.
//!
//! Only a driver that reports VOLUME_ACCESSIBILITY_CONSTRAINTS (with the Topology gate on)
//! makes the sidecar watch them, as upstream starts its Node and CSINode listers only then. A
//! Node's status (images, conditions, addresses) is most of its size and never read: the cache
//! keeps the name and the labels, and of a CSINode the drivers' names and topology keys.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures::Stream;
use futures::future::{BoxFuture, Shared};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::CSINode;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client, Resource};
use serde::Deserialize;
use tokio::sync::Notify;

use crate::controller::runtime::cache::{InitialList, listed, watch_signalling};
use crate::provision::storage_capacity::{Segment, cluster_segments};
use crate::provision::{ClusterTopology, SingleNode};

/// A Node as cached: its name (in `metadata`) and its labels.
#[derive(Clone, Debug, Deserialize, Resource)]
#[resource(inherit = Node)]
#[serde(from = "WireNode")]
pub struct CachedNode {
    pub metadata: ObjectMeta,
}

#[derive(Deserialize)]
struct WireNode {
    metadata: WireMeta,
}

impl From<WireNode> for CachedNode {
    fn from(wire: WireNode) -> Self {
        CachedNode {
            metadata: wire.metadata.into_meta(),
        }
    }
}

/// A CSINode as cached: its name and, per driver registered on the node, the topology keys.
#[derive(Clone, Debug, Deserialize, Resource)]
#[resource(inherit = CSINode)]
#[serde(from = "WireCsiNode")]
pub struct CachedCsiNode {
    pub metadata: ObjectMeta,
    drivers: Box<[DriverKeys]>,
}

/// A driver registered on a node and its topology keys.
type DriverKeys = (Box<str>, Box<[String]>);

impl CachedCsiNode {
    /// The topology keys `driver` registered on this node; empty when it registered none or
    /// is not registered here.
    fn keys_of(&self, driver: &str) -> &[String] {
        self.registered_keys(driver).unwrap_or_default()
    }

    /// The topology keys `driver` registered on this node (empty if none), `None` when it is
    /// not registered here.
    fn registered_keys(&self, driver: &str) -> Option<&[String]> {
        self.drivers
            .iter()
            .find(|(name, _)| &**name == driver)
            .map(|(_, keys)| &**keys)
    }
}

#[derive(Deserialize)]
struct WireCsiNode {
    metadata: WireMeta,
    #[serde(default)]
    spec: Option<WireCsiNodeSpec>,
}

#[derive(Deserialize)]
struct WireCsiNodeSpec {
    #[serde(default)]
    drivers: Vec<WireCsiNodeDriver>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireCsiNodeDriver {
    name: String,
    #[serde(default)]
    topology_keys: Option<Vec<String>>,
}

impl From<WireCsiNode> for CachedCsiNode {
    fn from(wire: WireCsiNode) -> Self {
        let drivers = wire
            .spec
            .map(|spec| spec.drivers)
            .unwrap_or_default()
            .into_iter()
            .map(|driver| {
                let keys = driver.topology_keys.unwrap_or_default();
                (driver.name.into_boxed_str(), keys.into_boxed_slice())
            })
            .collect();
        CachedCsiNode {
            metadata: wire.metadata.into_meta(),
            drivers,
        }
    }
}

/// The metadata the reflector needs (name, UID, resourceVersion) and the labels; the rest,
/// `managedFields` above all, is skipped without being allocated.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireMeta {
    name: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
}

impl WireMeta {
    fn into_meta(self) -> ObjectMeta {
        ObjectMeta {
            name: self.name,
            uid: self.uid,
            resource_version: self.resource_version,
            labels: self.labels,
            ..ObjectMeta::default()
        }
    }
}

/// The cluster's topology as the claim reconciler reads it: the two stores and our driver's
/// name.
#[derive(Clone)]
pub struct TopologyCache {
    nodes: Store<CachedNode>,
    csinodes: Store<CachedCsiNode>,
    driver: Arc<str>,
    /// Both stores' readiness, awaited by every reconcile that reads them, concurrently.
    nodes_listed: Shared<BoxFuture<'static, bool>>,
    csinodes_listed: Shared<BoxFuture<'static, bool>>,
}

impl TopologyCache {
    fn new(nodes: Store<CachedNode>, csinodes: Store<CachedCsiNode>, driver: &str) -> Self {
        TopologyCache {
            nodes_listed: listed(&nodes),
            csinodes_listed: listed(&csinodes),
            nodes,
            csinodes,
            driver: driver.into(),
        }
    }
}

/// Starts watching Nodes and CSINodes: the cache to read and the streams that fill it (they
/// must be polled). An event that may change the capacity segments signals `changes` if
/// given: a Node that appears, goes or changes its labels, a CSINode whose keys for our
/// driver change (not the Node status updates every kubelet sends every few seconds).
pub fn watch_topology(
    client: &Client,
    initial_list: InitialList,
    driver: &str,
    changes: Option<&Arc<Notify>>,
) -> (
    TopologyCache,
    impl Stream<Item = Result<CachedNode, watcher::Error>> + Send + 'static,
    impl Stream<Item = Result<CachedCsiNode, watcher::Error>> + Send + 'static,
) {
    let (nodes, node_stream) = watch_signalling(
        Api::<CachedNode>::all(client.clone()),
        initial_list,
        changes,
        node_labels_changed,
    );
    let ours: Arc<str> = driver.into();
    let (csinodes, csinode_stream) = watch_signalling(
        Api::<CachedCsiNode>::all(client.clone()),
        initial_list,
        changes,
        move |old: Option<&CachedCsiNode>, new: Option<&CachedCsiNode>| {
            driver_keys_changed(&ours, old, new)
        },
    );
    (
        TopologyCache::new(nodes, csinodes, driver),
        node_stream,
        csinode_stream,
    )
}

/// Whether a Node event (`None`: absent before, or deleted) changes what the segments read:
/// its presence or its labels (no labels ≡ empty labels).
fn node_labels_changed(old: Option<&CachedNode>, new: Option<&CachedNode>) -> bool {
    let labels = |node: &CachedNode| {
        node.metadata
            .labels
            .clone()
            .filter(|labels| !labels.is_empty())
    };
    match (old, new) {
        (Some(old), Some(new)) => labels(old) != labels(new),
        _ => true,
    }
}

/// Whether a CSINode event changes whether `driver` is registered there or its keys.
fn driver_keys_changed(
    driver: &str,
    old: Option<&CachedCsiNode>,
    new: Option<&CachedCsiNode>,
) -> bool {
    let keys = |csinode: Option<&CachedCsiNode>| {
        csinode
            .and_then(|csinode| csinode.registered_keys(driver))
            .map(<[String]>::to_vec)
    };
    keys(old) != keys(new)
}

impl TopologyCache {
    /// Waits until both stores have listed once, so a decision never reads a half-filled
    /// view (a missing CSINode means "reschedule"). `false` if a watch ended before.
    pub async fn wait_until_ready(&self) -> bool {
        self.nodes_listed.clone().await && self.csinodes_listed.clone().await
    }

    /// The capacity segments of a central provisioner (`provision::storage_capacity::cluster_segments`):
    /// one per distinct set of our keys' values among the nodes whose CSINode lists our driver.
    pub fn capacity_segments(&self) -> BTreeSet<Segment> {
        let csinodes = self.csinodes.state();
        let registrations = csinodes.iter().filter_map(|csinode| {
            let keys = csinode.registered_keys(&self.driver)?;
            Some((csinode.metadata.name.as_deref()?, keys))
        });
        cluster_segments(registrations, |node| self.node_labels(node))
    }

    #[cfg(test)]
    pub fn from_stores(
        nodes: Store<CachedNode>,
        csinodes: Store<CachedCsiNode>,
        driver: &str,
    ) -> Self {
        TopologyCache::new(nodes, csinodes, driver)
    }
}

impl ClusterTopology for TopologyCache {
    fn csinode_keys(&self, node: &str) -> Option<Vec<String>> {
        let csinode = self.csinodes.get(&ObjectRef::new(node))?;
        Some(csinode.keys_of(&self.driver).to_vec())
    }

    fn any_csinode_keys(&self) -> Option<Vec<String>> {
        self.csinodes
            .state()
            .iter()
            .filter(|csinode| !csinode.keys_of(&self.driver).is_empty())
            .min_by(|a, b| a.metadata.name.cmp(&b.metadata.name))
            .map(|csinode| csinode.keys_of(&self.driver).to_vec())
    }

    fn node_labels(&self, node: &str) -> Option<BTreeMap<String, String>> {
        let node = self.nodes.get(&ObjectRef::new(node))?;
        Some(node.metadata.labels.clone().unwrap_or_default())
    }

    fn node_segments(&self, keys: &[String]) -> Vec<BTreeMap<String, String>> {
        self.nodes
            .state()
            .iter()
            .filter_map(|node| {
                let labels = node.metadata.labels.as_ref()?;
                keys.iter()
                    .map(|key| Some((key.clone(), labels.get(key)?.clone())))
                    .collect()
            })
            .collect()
    }
}

/// What the claim reconciler reads the topology from: the watched Nodes and CSINodes, or in
/// node mode (`--node-deployment`) this node alone, as NodeGetInfo described it (upstream's
/// static listers: no Node or CSINode is watched).
#[derive(Clone)]
pub enum TopologyView {
    Watched(TopologyCache),
    Node(SingleNode),
}

impl TopologyView {
    /// See [`TopologyCache::wait_until_ready`]; this node's view is ready from the start.
    pub async fn wait_until_ready(&self) -> bool {
        match self {
            TopologyView::Watched(cache) => cache.wait_until_ready().await,
            TopologyView::Node(_) => true,
        }
    }

    fn view(&self) -> &dyn ClusterTopology {
        match self {
            TopologyView::Watched(cache) => cache,
            TopologyView::Node(node) => node,
        }
    }
}

impl ClusterTopology for TopologyView {
    fn csinode_keys(&self, node: &str) -> Option<Vec<String>> {
        self.view().csinode_keys(node)
    }

    fn any_csinode_keys(&self) -> Option<Vec<String>> {
        self.view().any_csinode_keys()
    }

    fn node_labels(&self, node: &str) -> Option<BTreeMap<String, String>> {
        self.view().node_labels(node)
    }

    fn node_segments(&self, keys: &[String]) -> Vec<BTreeMap<String, String>> {
        self.view().node_segments(keys)
    }
}

#[cfg(test)]
mod tests;
