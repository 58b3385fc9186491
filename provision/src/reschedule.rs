//! Giving a selected node back to the scheduler (upstream's "reschedule"): when the driver
//! cannot create the volume where the scheduler put the claim's pod, the sidecar removes the
//! claim's `volume.kubernetes.io/selected-node` so the scheduler picks another node.

use json_patch::jsonptr::PointerBuf;
use json_patch::{Patch, PatchOperation, RemoveOperation, TestOperation};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use serde_json::Value;

use super::claim::{annotation, selected_node};
use super::well_known::ANN_SELECTED_NODE;

/// Why an attempt may give up its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RescheduleCause {
    /// CreateVolume answered ResourceExhausted. `operation_kept`: an earlier attempt may have
    /// created the volume (the journal keeps the operation), see [`node_verdict`].
    DriverExhausted { operation_kept: bool },
    /// The selected node has no CSINode: no topology can be computed for it.
    NodeWithoutCsiNode,
}

/// What becomes of the claim's selected node after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeVerdict<'a> {
    /// Give the node back to the scheduler (remove the GA `selected-node` key).
    GiveBack(&'a str),
    /// Keep the node although the driver could not place the volume there, because an earlier
    /// attempt may have created it there: the claim's event says so.
    Keep(&'a str),
    /// An ordinary failure: retried on whatever the claim says.
    Unchanged,
}

/// What to do with the claim's selected node after a failure of `cause`.
///
/// As upstream: only with topology (the driver reports VOLUME_ACCESSIBILITY_CONSTRAINTS and
/// the gate is on), only for a claim with a selected node, and only through the GA key (a
/// claim selected by the alpha key alone keeps it and is retried).
///
/// Unlike upstream, a ResourceExhausted answer does not give up the node while an earlier
/// attempt for it may have created the volume (it timed out, or the sidecar restarted): the
/// journal replays that first request until the driver says what became of it, so the pod
/// must stay where that volume would be; a new node would get a volume made for the old one.
/// Upstream moves on and the first volume, if it appears, is leaked.
///
/// In node mode (`this_node`) a sidecar gives back or keeps its own node only: a claim it
/// still works on (its operation is in this node's journal) may name another node by now, and
/// that node's name is not this sidecar's to remove.
pub fn node_verdict<'a>(
    pvc: &'a PersistentVolumeClaim,
    topology: bool,
    this_node: Option<&str>,
    cause: RescheduleCause,
) -> NodeVerdict<'a> {
    let Some(node) = selected_node(pvc).filter(|_| topology) else {
        return NodeVerdict::Unchanged;
    };
    if this_node.is_some_and(|this| this != node) {
        return NodeVerdict::Unchanged;
    }
    if cause
        == (RescheduleCause::DriverExhausted {
            operation_kept: true,
        })
    {
        return NodeVerdict::Keep(node);
    }
    if annotation(&pvc.metadata, ANN_SELECTED_NODE).is_none() {
        return NodeVerdict::Unchanged;
    }
    NodeVerdict::GiveBack(node)
}

/// The JSON patch that removes the selected node `node`, only if the claim is still the same
/// object and still selects that node: a node the scheduler selected since is kept. Upstream
/// sends a full update of its cached claim instead (a conflict fails the reschedule).
pub fn reschedule_patch(pvc: &PersistentVolumeClaim, node: &str) -> Patch {
    let annotation = PointerBuf::from_tokens(["metadata", "annotations", ANN_SELECTED_NODE]);
    let uid = pvc.metadata.uid.clone().unwrap_or_default();
    Patch(vec![
        PatchOperation::Test(TestOperation {
            path: PointerBuf::from_tokens(["metadata", "uid"]),
            value: Value::String(uid),
        }),
        PatchOperation::Test(TestOperation {
            path: annotation.clone(),
            value: Value::String(node.to_owned()),
        }),
        PatchOperation::Remove(RemoveOperation { path: annotation }),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::PvcBuilder;
    use crate::well_known::ANN_ALPHA_SELECTED_NODE;

    const EXHAUSTED: RescheduleCause = RescheduleCause::DriverExhausted {
        operation_kept: false,
    };

    #[test]
    fn a_claim_on_a_node_gives_it_up_with_topology_only() {
        let pvc = PvcBuilder::new()
            .annotation(ANN_SELECTED_NODE, "n1")
            .build();
        assert_eq!(
            node_verdict(&pvc, true, None, EXHAUSTED),
            NodeVerdict::GiveBack("n1")
        );
        assert_eq!(
            node_verdict(&pvc, true, None, RescheduleCause::NodeWithoutCsiNode),
            NodeVerdict::GiveBack("n1")
        );
        assert_eq!(
            node_verdict(&pvc, false, None, EXHAUSTED),
            NodeVerdict::Unchanged
        );
    }

    #[test]
    fn a_node_whose_volume_may_exist_is_kept() {
        let pvc = PvcBuilder::new()
            .annotation(ANN_SELECTED_NODE, "n1")
            .build();
        let kept = RescheduleCause::DriverExhausted {
            operation_kept: true,
        };
        assert_eq!(
            node_verdict(&pvc, true, None, kept),
            NodeVerdict::Keep("n1")
        );
        assert_eq!(
            node_verdict(&pvc, false, None, kept),
            NodeVerdict::Unchanged
        );
    }

    #[test]
    fn only_the_ga_key_is_given_up() {
        let alpha = PvcBuilder::new()
            .annotation(ANN_ALPHA_SELECTED_NODE, "n1")
            .build();
        assert_eq!(
            node_verdict(&alpha, true, None, EXHAUSTED),
            NodeVerdict::Unchanged
        );
        let empty = PvcBuilder::new().annotation(ANN_SELECTED_NODE, "").build();
        assert_eq!(
            node_verdict(&empty, true, None, EXHAUSTED),
            NodeVerdict::Unchanged
        );
        assert_eq!(
            node_verdict(&PvcBuilder::new().build(), true, None, EXHAUSTED),
            NodeVerdict::Unchanged
        );
    }

    #[test]
    fn in_node_mode_only_this_nodes_name_is_given_back_or_kept() {
        let on = |node: &str| {
            PvcBuilder::new()
                .annotation(ANN_SELECTED_NODE, node)
                .build()
        };
        let kept = RescheduleCause::DriverExhausted {
            operation_kept: true,
        };
        let (mine, theirs) = (on("n1"), on("n2"));
        for cause in [EXHAUSTED, RescheduleCause::NodeWithoutCsiNode] {
            assert_eq!(
                node_verdict(&mine, true, Some("n1"), cause),
                NodeVerdict::GiveBack("n1")
            );
            assert_eq!(
                node_verdict(&theirs, true, Some("n1"), cause),
                NodeVerdict::Unchanged
            );
        }
        assert_eq!(
            node_verdict(&mine, true, Some("n1"), kept),
            NodeVerdict::Keep("n1")
        );
        assert_eq!(
            node_verdict(&theirs, true, Some("n1"), kept),
            NodeVerdict::Unchanged
        );
        // The alpha key is never given back, in node mode neither.
        let alpha = PvcBuilder::new()
            .annotation(ANN_ALPHA_SELECTED_NODE, "n1")
            .build();
        assert_eq!(
            node_verdict(&alpha, true, Some("n1"), EXHAUSTED),
            NodeVerdict::Unchanged
        );
    }

    #[test]
    fn the_patch_removes_the_key_only_from_the_same_claim_on_the_same_node() {
        let pvc = PvcBuilder::new()
            .uid("u-1")
            .annotation(ANN_SELECTED_NODE, "n1")
            .build();
        let path = "/metadata/annotations/volume.kubernetes.io~1selected-node";
        assert_eq!(
            serde_json::to_value(reschedule_patch(&pvc, "n1")).unwrap(),
            serde_json::json!([
                {"op": "test", "path": "/metadata/uid", "value": "u-1"},
                {"op": "test", "path": path, "value": "n1"},
                {"op": "remove", "path": path},
            ])
        );
    }
}
