//! The real WaitForFirstConsumer flow up to the sidecar, with kube-scheduler and no sidecar:
//! the scheduler picks one of the test's Nodes for a pod and writes the selected-node annotation
//! on its claim, the PV controller then hands the claim to the class's provisioner, and the claim
//! stays Pending. A pod that fits no Node gets no selected node. The helpers keep a test's pods
//! on its own Nodes and clean them up.

use csi_test_support as support;

use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::CSINode;
use kube::api::{Api, ListParams};
use support::cluster::{summarize, wait_event};
use support::peers::TIMEOUT;
use support::topology::{ANN_STORAGE_PROVISIONER, TEST_LABEL, scheduling_cluster};

/// No driver or sidecar serves it: the flow must stop at the hand-over.
const PROVISIONER: &str = "scheduling.example.com";
const ZONE_KEY: &str = "topology.example/zone";

#[tokio::test]
async fn scheduler_selects_a_test_node_and_the_binder_hands_the_claim_over() {
    let (cluster, topology) = scheduling_cluster("wffc-selected").await;
    let class = topology.wffc_class("wffc", PROVISIONER).await;
    cluster.claim("data", &class).await;
    let mut nodes = Vec::new();
    for zone in ["z1", "z2", "z3"] {
        let node = topology
            .create_node(&format!("node-{zone}"), &[(ZONE_KEY, zone)])
            .await;
        topology
            .create_csi_node(&node, PROVISIONER, &format!("id-{node}"), &[ZONE_KEY])
            .await;
        nodes.push(node);
    }
    assert_eq!(topology.selected_node("data").await, None);

    topology.create_pod("app", &["data"], &[]).await;

    let selected = topology.wait_selected_node("data").await;
    assert!(
        nodes.contains(&selected),
        "selected node {selected} is not one of this test's {nodes:?}"
    );
    // No node-lifecycle controller runs: the Node a kubelet never heartbeats stays untainted.
    let taints = topology
        .get_node(&selected)
        .await
        .spec
        .and_then(|spec| spec.taints)
        .unwrap_or_default();
    assert!(taints.is_empty(), "Node {selected} got taints {taints:?}");

    let provisioner = support::eventually(
        "the PV controller to set volume.kubernetes.io/storage-provisioner",
        TIMEOUT,
        || async {
            let pvc = cluster.get_claim("data").await.ok_or("PVC gone")?;
            storage_provisioner(&pvc)
                .ok_or_else(|| format!("annotations {:?}", pvc.metadata.annotations))
        },
    )
    .await;
    assert_eq!(provisioner, PROVISIONER);
    // The binder announces the hand-over after writing the annotation; nothing provisions.
    wait_event(
        &cluster.client,
        cluster.ns(),
        "data",
        "ExternalProvisioning",
        |message| message.contains(PROVISIONER),
    )
    .await;
    let pvc = cluster.get_claim("data").await.expect("PVC exists");
    let phase = pvc.status.and_then(|s| s.phase);
    assert_eq!(phase.as_deref(), Some("Pending"));
    assert_eq!(
        topology.selected_node("data").await.as_deref(),
        Some(selected.as_str()),
        "the selected node changed"
    );
}

#[tokio::test]
async fn a_pod_that_fits_no_node_selects_none() {
    let (cluster, topology) = scheduling_cluster("wffc-unschedulable").await;
    let class = topology.wffc_class("wffc", PROVISIONER).await;
    cluster.claim("data", &class).await;
    for zone in ["z1", "z2"] {
        topology
            .create_node(&format!("node-{zone}"), &[(ZONE_KEY, zone)])
            .await;
    }

    topology
        .create_pod("app", &["data"], &[(ZONE_KEY, "nowhere")])
        .await;

    let event = wait_event(
        &cluster.client,
        cluster.ns(),
        "app",
        "FailedScheduling",
        |_| true,
    )
    .await;
    let events = summarize(std::slice::from_ref(&event));
    assert!(
        event
            .message
            .as_deref()
            .is_some_and(|m| m.contains("node affinity/selector")),
        "{events}"
    );
    let pvc = cluster.get_claim("data").await.expect("PVC exists");
    assert_eq!(
        support::topology::selected_node(&pvc),
        None,
        "a node was selected for an unschedulable pod ({events})"
    );
    assert_eq!(storage_provisioner(&pvc), None);
}

#[tokio::test]
async fn a_pod_lands_on_its_tests_node_and_dropping_the_topology_deletes_them() {
    let (cluster, topology) = scheduling_cluster("topology-cleanup").await;
    let kept = topology.create_node("kept", &[]).await;
    topology
        .create_csi_node(&kept, PROVISIONER, "id-kept", &[ZONE_KEY])
        .await;

    // No claims: nothing holds the pod in PreBind, so it is bound.
    topology.create_pod("app", &[], &[]).await;
    assert_eq!(topology.wait_pod_scheduled("app").await, kept);
    // A Node the test deleted itself is skipped by the clean-up. It is made after the pod is
    // placed: kube-scheduler's Node watch could still offer it to a pod created right after.
    let deleted = topology.create_node("deleted", &[]).await;
    topology.delete_node(&deleted).await;

    drop(topology);
    let selected = ListParams::default().labels(&format!("{TEST_LABEL}={}", cluster.ns()));
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    let csi_nodes: Api<CSINode> = Api::all(cluster.client.clone());
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), cluster.ns());
    support::eventually(
        "the test's Nodes, CSINodes and pods to be gone",
        TIMEOUT,
        || async {
            let left = (
                nodes
                    .list_metadata(&selected)
                    .await
                    .map_err(|e| e.to_string())?
                    .items
                    .len(),
                csi_nodes
                    .list_metadata(&selected)
                    .await
                    .map_err(|e| e.to_string())?
                    .items
                    .len(),
                pods.list_metadata(&selected)
                    .await
                    .map_err(|e| e.to_string())?
                    .items
                    .len(),
            );
            if left == (0, 0, 0) {
                Ok(())
            } else {
                Err(format!("(Nodes, CSINodes, pods) left: {left:?}"))
            }
        },
    )
    .await;
}

fn storage_provisioner(pvc: &PersistentVolumeClaim) -> Option<String> {
    pvc.metadata
        .annotations
        .as_ref()?
        .get(ANN_STORAGE_PROVISIONER)
        .cloned()
}
