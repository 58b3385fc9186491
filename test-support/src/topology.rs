//! Nodes, CSINodes and pods for the real WaitForFirstConsumer flow: kube-scheduler (started by
//! `support::control_plane_with_scheduler`) picks one of a test's Nodes for a pod and writes
//! `volume.kubernetes.io/selected-node` on its claims. No kubelet runs: Nodes are plain API
//! objects that stay schedulable because the testbed runs no node-lifecycle controller, and pods
//! are never started.
//!
//! Isolation: Nodes and CSINodes are cluster-wide and the scheduler sees every test's Nodes, so
//! each test's objects carry the label [`TEST_LABEL`]`=<namespace>` and every pod made here
//! selects it (`nodeSelector`): a pod can only land on its own test's Nodes. Node names start
//! with the namespace. Dropping the [`Topology`] deletes the test's Nodes, CSINodes and pods.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, Node, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimVolumeSource,
    Pod, PodSpec, Volume,
};
use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver, CSINodeSpec, StorageClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};

use super::cluster::{Cluster, create_class};
use super::peers::TIMEOUT;
use super::{control_plane, control_plane_with_scheduler, eventually};
use csi_testbed::nodes::create_schedulable_node;

/// Label on every Node, CSINode and pod of a test; its value is the test's namespace.
pub const TEST_LABEL: &str = "testbed.csi.example/test";
/// Written by kube-scheduler's VolumeBinding plugin in PreBind.
pub const ANN_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// Written by the PV controller once a WaitForFirstConsumer claim has a selected node.
pub const ANN_STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";

/// A test's namespace plus its Nodes on the scheduler's control plane. Dropping it deletes the
/// test's Nodes, CSINodes and pods.
pub struct Topology {
    client: Client,
    namespace: String,
    nodes: Api<Node>,
    csi_nodes: Api<CSINode>,
    pods: Api<Pod>,
    claims: Api<PersistentVolumeClaim>,
}

/// The shared control plane with kube-scheduler, a fresh namespace (the [`Cluster`]) and the
/// test's [`Topology`] in it. Call this first in every test of a scheduling test binary.
pub async fn scheduling_cluster(prefix: &str) -> (Cluster, Topology) {
    control_plane_with_scheduler();
    let cluster = Cluster::new(prefix).await;
    let topology = Topology {
        nodes: Api::all(cluster.client.clone()),
        csi_nodes: Api::all(cluster.client.clone()),
        pods: Api::namespaced(cluster.client.clone(), cluster.ns()),
        claims: cluster.claims.clone(),
        client: cluster.client.clone(),
        namespace: cluster.ns().to_owned(),
    };
    (cluster, topology)
}

impl Topology {
    /// `<namespace>-<suffix>`: the cluster-wide name of this test's node `suffix`.
    pub fn node_name(&self, suffix: &str) -> String {
        format!("{}-{suffix}", self.namespace)
    }

    /// Creates a Ready, untainted Node `<namespace>-<suffix>` with `labels` (plus
    /// `kubernetes.io/hostname` and [`TEST_LABEL`]) and room for pods; returns its name.
    pub async fn create_node(&self, suffix: &str, labels: &[(&str, &str)]) -> String {
        let name = self.node_name(suffix);
        let labels = [&[(TEST_LABEL, self.namespace.as_str())], labels].concat();
        create_schedulable_node(&self.nodes, &name, &labels)
            .await
            .unwrap_or_else(|e| panic!("creating Node {name}: {e}"));
        name
    }

    pub async fn delete_node(&self, name: &str) {
        self.nodes
            .delete(name, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("deleting Node {name}: {e}"));
    }

    /// Marks the Node unschedulable (`kubectl cordon`): the scheduler places no new pod there.
    pub async fn cordon(&self, name: &str) {
        self.nodes
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"spec": {"unschedulable": true}})),
            )
            .await
            .unwrap_or_else(|e| panic!("cordoning Node {name}: {e}"));
    }

    pub async fn get_node(&self, name: &str) -> Node {
        self.nodes
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("reading Node {name}: {e}"))
    }

    /// Creates the CSINode of Node `node_name` (a kubelet would) with one driver entry, owned by
    /// the Node like the kubelet's, so it also goes when the Node is deleted.
    pub async fn create_csi_node(
        &self,
        node_name: &str,
        driver: &str,
        node_id: &str,
        topology_keys: &[&str],
    ) {
        let node = self.get_node(node_name).await;
        let csi_node = CSINode {
            metadata: ObjectMeta {
                name: Some(node_name.to_owned()),
                labels: Some(self.labels(&[])),
                owner_references: Some(vec![OwnerReference {
                    api_version: "v1".to_owned(),
                    kind: "Node".to_owned(),
                    name: node_name.to_owned(),
                    uid: node.metadata.uid.unwrap_or_default(),
                    ..OwnerReference::default()
                }]),
                ..ObjectMeta::default()
            },
            spec: CSINodeSpec {
                drivers: vec![CSINodeDriver {
                    name: driver.to_owned(),
                    node_id: node_id.to_owned(),
                    topology_keys: Some(topology_keys.iter().map(|k| (*k).to_owned()).collect()),
                    allocatable: None,
                }],
            },
        };
        self.csi_nodes
            .create(&PostParams::default(), &csi_node)
            .await
            .unwrap_or_else(|e| panic!("creating CSINode {node_name}: {e}"));
    }

    pub async fn delete_csi_node(&self, name: &str) {
        self.csi_nodes
            .delete(name, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("deleting CSINode {name}: {e}"));
    }

    /// Creates a pod that mounts `claims` and selects this test's Nodes, plus `node_selector`
    /// (e.g. a zone). Its image is never pulled: no kubelet runs.
    pub async fn create_pod(&self, name: &str, claims: &[&str], node_selector: &[(&str, &str)]) {
        let mut selector = BTreeMap::from([(TEST_LABEL.to_owned(), self.namespace.clone())]);
        selector.extend(
            node_selector
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        );
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                labels: Some(self.labels(&[])),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "app".to_owned(),
                    image: Some("registry.invalid/never-runs".to_owned()),
                    ..Container::default()
                }],
                node_selector: Some(selector),
                volumes: Some(
                    claims
                        .iter()
                        .enumerate()
                        .map(|(i, claim)| Volume {
                            name: format!("volume-{i}"),
                            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                                claim_name: (*claim).to_owned(),
                                read_only: None,
                            }),
                            ..Volume::default()
                        })
                        .collect(),
                ),
                termination_grace_period_seconds: Some(0),
                ..PodSpec::default()
            }),
            ..Pod::default()
        };
        self.pods
            .create(&PostParams::default(), &pod)
            .await
            .unwrap_or_else(|e| panic!("creating pod {name}: {e}"));
    }

    /// Deletes the pod at once: no kubelet would confirm a graceful deletion.
    pub async fn delete_pod(&self, name: &str) {
        let now = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        };
        self.pods
            .delete(name, &now)
            .await
            .unwrap_or_else(|e| panic!("deleting pod {name}: {e}"));
    }

    /// Waits until kube-scheduler bound the pod and returns its node. With WaitForFirstConsumer
    /// claims that happens only after they are Bound (VolumeBinding waits in PreBind).
    pub async fn wait_pod_scheduled(&self, name: &str) -> String {
        eventually(
            &format!("pod {name} to be bound to a node"),
            TIMEOUT,
            || async {
                let pod = self.pods.get(name).await.map_err(|e| e.to_string())?;
                pod.spec
                    .as_ref()
                    .and_then(|spec| spec.node_name.clone())
                    .ok_or_else(|| format!("unbound; status {:?}", pod.status))
            },
        )
        .await
    }

    /// The selected-node annotation of `claim` in this test's namespace, if set.
    pub async fn selected_node(&self, claim: &str) -> Option<String> {
        let pvc = self
            .claims
            .get(claim)
            .await
            .unwrap_or_else(|e| panic!("reading PVC {claim}: {e}"));
        selected_node(&pvc)
    }

    /// Waits until the scheduler wrote the selected-node annotation on `claim`; returns it.
    pub async fn wait_selected_node(&self, claim: &str) -> String {
        eventually(
            &format!("kube-scheduler to select a node for PVC {claim}"),
            TIMEOUT,
            || async {
                let pvc = self.claims.get(claim).await.map_err(|e| e.to_string())?;
                selected_node(&pvc)
                    .ok_or_else(|| format!("annotations {:?}", pvc.metadata.annotations))
            },
        )
        .await
    }

    /// Creates a WaitForFirstConsumer class `<namespace>-<suffix>` of `provisioner` (reclaim
    /// policy Delete) and returns its name.
    pub async fn wffc_class(&self, suffix: &str, provisioner: &str) -> String {
        let name = format!("{}-{suffix}", self.namespace);
        let class = StorageClass {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..ObjectMeta::default()
            },
            provisioner: provisioner.to_owned(),
            reclaim_policy: Some("Delete".to_owned()),
            volume_binding_mode: Some("WaitForFirstConsumer".to_owned()),
            ..StorageClass::default()
        };
        create_class(&self.client, &class).await;
        name
    }

    fn labels(&self, extra: &[(&str, &str)]) -> BTreeMap<String, String> {
        let mut labels = BTreeMap::from([(TEST_LABEL.to_owned(), self.namespace.clone())]);
        labels.extend(
            extra
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        );
        labels
    }
}

/// The PV's node affinity as segment maps, one per required term (key -> the single `In`
/// value the provisioner writes); empty without node affinity.
pub fn pv_segments(pv: &PersistentVolume) -> Vec<BTreeMap<String, String>> {
    let terms = pv
        .spec
        .as_ref()
        .and_then(|spec| spec.node_affinity.as_ref())
        .and_then(|affinity| affinity.required.as_ref())
        .map(|required| required.node_selector_terms.clone())
        .unwrap_or_default();
    terms
        .iter()
        .map(|term| {
            term.match_expressions
                .iter()
                .flatten()
                .map(|e| {
                    let values = e.values.clone().unwrap_or_default();
                    assert_eq!(e.operator, "In", "{e:?}");
                    assert_eq!(values.len(), 1, "{e:?}");
                    (e.key.clone(), values[0].clone())
                })
                .collect()
        })
        .collect()
}

/// The claim's selected-node annotation, if set.
pub fn selected_node(pvc: &PersistentVolumeClaim) -> Option<String> {
    pvc.metadata
        .annotations
        .as_ref()?
        .get(ANN_SELECTED_NODE)
        .cloned()
}

impl Drop for Topology {
    /// Deletes the test's pods (at once: no kubelet would confirm a graceful deletion), Nodes
    /// and CSINodes on a thread of its own: the test's runtime may be the one dropping this.
    fn drop(&mut self) {
        let namespace = self.namespace.clone();
        let cleanup = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("building a runtime: {e}"))?;
            runtime.block_on(delete_test_objects(&namespace))
        });
        match cleanup.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("cleaning up the test's Nodes and pods: {e}"),
            Err(_) => eprintln!("cleaning up the test's Nodes and pods: the thread panicked"),
        }
    }
}

async fn delete_test_objects(namespace: &str) -> Result<(), String> {
    let client = control_plane().client().await.map_err(|e| e.to_string())?;
    let selected = ListParams::default().labels(&format!("{TEST_LABEL}={namespace}"));
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    Api::<Pod>::namespaced(client.clone(), namespace)
        .delete_collection(&now, &selected)
        .await
        .map_err(|e| format!("deleting pods: {e}"))?;
    Api::<CSINode>::all(client.clone())
        .delete_collection(&DeleteParams::default(), &selected)
        .await
        .map_err(|e| format!("deleting CSINodes: {e}"))?;
    Api::<Node>::all(client)
        .delete_collection(&DeleteParams::default(), &selected)
        .await
        .map_err(|e| format!("deleting Nodes: {e}"))?;
    Ok(())
}
