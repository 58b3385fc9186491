//! Nodes that kube-scheduler places pods on although no kubelet runs: for the tests and the
//! benchmark of the WaitForFirstConsumer flow (see docs/control-plane.md, "kube-scheduler and
//! Nodes").

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeSpec, NodeStatus};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};

/// Creates a Ready Node `name` with `labels` (plus `kubernetes.io/hostname`) and room for 110
/// pods, and lifts the not-ready taint the API server's TaintNodesByCondition admission puts
/// on every new Node (a kubelet reporting Ready would have the node-lifecycle controller lift
/// it; the testbed runs neither). A Node keeps the status given at creation.
pub async fn create_schedulable_node(
    nodes: &Api<Node>,
    name: &str,
    labels: &[(&str, &str)],
) -> kube::Result<()> {
    nodes
        .create(&PostParams::default(), &schedulable_node(name, labels))
        .await?;
    let untainted = serde_json::json!({"spec": {"taints": null}});
    nodes
        .patch(name, &PatchParams::default(), &Patch::Merge(untainted))
        .await?;
    Ok(())
}

fn schedulable_node(name: &str, labels: &[(&str, &str)]) -> Node {
    let resources = BTreeMap::from([
        ("cpu".to_owned(), Quantity("8".to_owned())),
        ("memory".to_owned(), Quantity("32Gi".to_owned())),
        ("pods".to_owned(), Quantity("110".to_owned())),
    ]);
    let labels = std::iter::once(("kubernetes.io/hostname", name))
        .chain(labels.iter().copied())
        .map(|(key, value)| (key.to_owned(), value.to_owned()))
        .collect();
    Node {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec::default()),
        status: Some(NodeStatus {
            allocatable: Some(resources.clone()),
            capacity: Some(resources),
            conditions: Some(vec![NodeCondition {
                type_: "Ready".to_owned(),
                status: "True".to_owned(),
                reason: Some("KubeletReady".to_owned()),
                message: Some("a testbed Node: no kubelet runs".to_owned()),
                ..NodeCondition::default()
            }]),
            ..NodeStatus::default()
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_is_ready_with_room_and_its_hostname_label() {
        let node = schedulable_node("n1", &[("zone", "z1")]);
        let labels = node.metadata.labels.unwrap_or_default();
        assert_eq!(
            labels.get("kubernetes.io/hostname").map(String::as_str),
            Some("n1")
        );
        assert_eq!(labels.get("zone").map(String::as_str), Some("z1"));
        let status = node.status.unwrap_or_default();
        assert!(status.allocatable.is_some_and(|a| a.contains_key("pods")));
        assert!(
            status
                .conditions
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        );
    }
}
