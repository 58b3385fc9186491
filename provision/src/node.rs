//! Node deployment (`--node-deployment`): one sidecar per node, next to that node's driver.
//! Which claims and PVs are this node's, how long a node waits before it competes for an
//! Immediate claim, what it asks the driver before it does, and the write that makes it the
//! owner. All pure; `controller::ownership` acts on it.
//!
//! Upstream's rules (`checkNode`, `becomeOwner`, the affinity check before `Delete`) with
//! three fixes: the capacity check has no side effect on a node that does not become the owner
//! (A3), a driver without topology is asked for capacity once, without a segment (A13), and a
//! PV without node affinity is deleted only by the node that created it (A14, see
//! [`volume_on_node`]).

use std::collections::BTreeMap;
use std::ops::Deref;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    NodeSelectorRequirement, NodeSelectorTerm, PersistentVolume, PersistentVolumeClaim,
};
use k8s_openapi::api::storage::v1::StorageClass;
use serde_json::{Value, json};

use crate::csi;

use super::accessibility::{ClusterTopology, TopologyError};
use super::claim::{ClaimWork, NotOwner, SkipReason, annotation};
use super::plan::ProvisionPlan;
use super::well_known::{ANN_SELECTED_NODE, PROVISIONER_IDENTITY_KEY};

const IMMEDIATE: &str = "Immediate";

/// This sidecar's node, as `NODE_NAME` names it and NodeGetInfo describes it.
#[derive(Debug, Clone, Copy)]
pub struct NodeScope<'a> {
    /// `NODE_NAME`.
    pub name: &'a str,
    /// NodeGetInfo's `accessible_topology` segments; empty when the driver reports none.
    pub segment: &'a BTreeMap<String, String>,
    /// `--node-deployment-immediate-binding`.
    pub immediate_binding: bool,
}

/// Upstream's `checkNode` (the GA selected-node key only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ownership {
    /// The claim's selected node is this node: provision it.
    Owner,
    NotOwner(NotOwner),
    /// An Immediate claim no node owns yet: compete for it ([`ownership_delay`]).
    Compete,
}

/// Whether this node owns the claim, may compete for it, or must leave it alone.
pub fn check_node(
    pvc: &PersistentVolumeClaim,
    class: &StorageClass,
    node: &NodeScope<'_>,
) -> Ownership {
    match annotation(&pvc.metadata, ANN_SELECTED_NODE).filter(|n| !n.is_empty()) {
        Some(selected) if selected == node.name => Ownership::Owner,
        Some(selected) => Ownership::NotOwner(NotOwner::OtherNode(selected.to_owned())),
        None if class.volume_binding_mode.as_deref() != Some(IMMEDIATE) => {
            Ownership::NotOwner(NotOwner::NotScheduled)
        }
        None if !node.immediate_binding => Ownership::NotOwner(NotOwner::ImmediateBindingOff),
        None => Ownership::Compete,
    }
}

/// The work of a claim in node mode, from the work [`super::claim_work`] found: only this
/// node's claims are provisioned, refused or released; an Immediate claim nobody owns is
/// competed for. A claim whose operation is in this node's journal stays this node's whatever
/// its annotation says now: the recorded request must be finished here (docs/journal.md).
///
/// The consistency finalizer comes off on the owner, which alone may have an operation in
/// flight; or, on any node, from a claim being deleted that nothing can be in flight for
/// anywhere: one no node was ever selected for (a node records an operation only for a claim
/// selected to it, and gives the node back only once nothing is in flight), or one already
/// bound (its PV holds the volume, so its operation's outcome is safe). So a claim whose
/// owner node is gone for good does not stay Terminating. Other nodes leave a live claim to
/// its owner, so that they do not all race to remove the same finalizer.
pub fn node_claim_work<C: Deref<Target = StorageClass>>(
    work: ClaimWork<C>,
    pvc: &PersistentVolumeClaim,
    node: &NodeScope<'_>,
    in_flight: bool,
) -> ClaimWork<C> {
    let selected = annotation(&pvc.metadata, ANN_SELECTED_NODE).filter(|n| !n.is_empty());
    if in_flight {
        // Moved to another node: this node's operation is its reaper's now, which deletes the
        // volume here ([`claim_left_node`]); the other node provisions the claim.
        if let Some(other) = selected.filter(|selected| *selected != node.name) {
            return ClaimWork::Nothing(Some(SkipReason::NotThisNode(NotOwner::OtherNode(
                other.to_owned(),
            ))));
        }
        return work;
    }
    let not_ours = |selected: Option<&str>| {
        let reason = match selected {
            Some(other) => NotOwner::OtherNode(other.to_owned()),
            None => NotOwner::NotScheduled,
        };
        ClaimWork::Nothing(Some(SkipReason::NotThisNode(reason)))
    };
    match work {
        ClaimWork::Provision(class) => match check_node(pvc, &class, node) {
            Ownership::Owner => ClaimWork::Provision(class),
            Ownership::NotOwner(reason) => {
                ClaimWork::Nothing(Some(SkipReason::NotThisNode(reason)))
            }
            Ownership::Compete => ClaimWork::BecomeOwner(class),
        },
        ClaimWork::Refuse(error) if selected == Some(node.name) => ClaimWork::Refuse(error),
        ClaimWork::ReleaseFinalizer
            if selected == Some(node.name)
                || (pvc.metadata.deletion_timestamp.is_some()
                    && (selected.is_none() || is_bound(pvc))) =>
        {
            ClaimWork::ReleaseFinalizer
        }
        ClaimWork::Refuse(_) | ClaimWork::ReleaseFinalizer | ClaimWork::BecomeOwner(_) => {
            not_ours(selected)
        }
        nothing @ ClaimWork::Nothing(_) => nothing,
    }
}

/// Node mode: whether the claim now selects another node (its pod moved there), so that
/// an operation of this node for it is an orphan: the volume it may have made here is not the
/// one the claim will get. A claim that selects no node may come back: it has not left.
pub fn claim_left_node(pvc: &PersistentVolumeClaim, node: &NodeScope<'_>) -> bool {
    annotation(&pvc.metadata, ANN_SELECTED_NODE)
        .is_some_and(|selected| !selected.is_empty() && selected != node.name)
}

/// Whether the claim names its PV (`spec.volumeName`).
fn is_bound(pvc: &PersistentVolumeClaim) -> bool {
    pvc.spec
        .as_ref()
        .and_then(|spec| spec.volume_name.as_deref())
        .is_some_and(|name| !name.is_empty())
}

/// How long a node waits before its `attempt`-th try (0 first) to own an Immediate claim:
/// `min(base·2^attempt, max)` less `jitter·base` (jitter uniform in [0, 1)), never below zero.
/// With base 20 s and max 60 s: the first try waits (0, 20] s, the second (20, 40], every
/// later one (40, 60]. The jitter spreads the nodes, so that usually one writes first and the
/// others see its node before their own turn.
pub fn ownership_delay(attempt: u32, base: Duration, max: Duration, jitter: f64) -> Duration {
    let raw = base
        .checked_mul(1u32.checked_shl(attempt).unwrap_or(u32::MAX))
        .unwrap_or(max)
        .min(max);
    let jitter = base.mul_f64(jitter.clamp(0.0, 1.0));
    let delay = raw.saturating_sub(jitter);
    if attempt == 0 {
        delay
    } else {
        delay.max(OWNERSHIP_RETRY_FLOOR)
    }
}

/// The least wait before a node tries again to own a claim it lost or had no room for:
/// `--node-deployment-base-delay=0s` (or a zero max delay) would otherwise retry, with a
/// GetCapacity and a claim patch each time, as fast as the loop turns. The first try may still
/// be immediate.
pub const OWNERSHIP_RETRY_FLOOR: Duration = Duration::from_secs(1);

/// Upstream's check before the first delay: a class with allowedTopologies whose
/// requirements, computed as if this node were selected, fail (they leave this node out)
/// makes this node no owner. Without allowedTopologies a topology error does not: the node
/// competes and, once the owner, reports the error as an event on the claim.
pub fn left_out(
    class: &StorageClass,
    requirements: &Result<Option<csi::TopologyRequirement>, TopologyError>,
) -> bool {
    requirements.is_err()
        && class
            .allowed_topologies
            .as_ref()
            .is_some_and(|terms| !terms.is_empty())
}

/// The GetCapacity calls a node makes before it claims an Immediate claim, and the bytes one
/// answer must have room for.
#[derive(Debug, Clone, PartialEq)]
pub enum CapacityCheck {
    /// No call, and room: the claim requests no size, or cannot be planned or placed here
    /// (the owner reports that, as upstream, which proceeds on a failed check).
    Skip,
    Ask {
        needed: i64,
        requests: Vec<csi::GetCapacityRequest>,
    },
}

/// Upstream asks once per requisite topology (or once without topology) with the claim's
/// parameters and capabilities and no secrets; built from the pure plan only, so a node that
/// does not become the owner leaves nothing behind (no source finalizer, A3).
pub fn capacity_check<P, T>(
    plan: Result<&ProvisionPlan, P>,
    requirements: Result<Option<&csi::TopologyRequirement>, T>,
) -> CapacityCheck {
    let (Ok(plan), Ok(requirements)) = (plan, requirements) else {
        return CapacityCheck::Skip;
    };
    if plan.required_bytes <= 0 {
        return CapacityCheck::Skip;
    }
    let request = |topology: Option<csi::Topology>| csi::GetCapacityRequest {
        volume_capabilities: plan.volume_capabilities.clone(),
        parameters: plan.parameters.clone(),
        accessible_topology: topology,
    };
    let requests = match requirements.filter(|r| !r.requisite.is_empty()) {
        Some(requirements) => requirements
            .requisite
            .iter()
            .cloned()
            .map(|topology| request(Some(topology)))
            .collect(),
        None => vec![request(None)],
    };
    CapacityCheck::Ask {
        needed: plan.required_bytes,
        requests,
    }
}

/// Whether the volume fits here after the calls of [`CapacityCheck::Ask`]: one answer's
/// `available_capacity` holds the request. A failed call counts as room (upstream proceeds,
/// so that the owner surfaces the driver's error as an event).
pub fn has_room<E>(needed: i64, answers: &[Result<i64, E>]) -> bool {
    answers.iter().any(Result::is_err)
        || answers
            .iter()
            .any(|answer| answer.as_ref().is_ok_and(|bytes| needed <= *bytes))
}

/// The merge patch that makes this node the claim's owner: the selected-node annotation, with
/// the claim's resourceVersion so that the API server refuses it (409) if the claim changed
/// since it was read (another node may have written its name first). `None` for a claim
/// without a resourceVersion: without it the patch would overwrite whatever node another
/// node wrote meanwhile, so nothing may be written.
pub fn select_node_patch(pvc: &PersistentVolumeClaim, node: &str) -> Option<Value> {
    let version = pvc.metadata.resource_version.as_deref()?;
    Some(json!({
        "metadata": {
            "resourceVersion": version,
            "annotations": { ANN_SELECTED_NODE: node },
        }
    }))
}

/// The topology a node-mode sidecar sees: only its own node, with NodeGetInfo's segment as
/// the Node's labels and its keys as the CSINode's. So requirements computed for a claim name
/// this node alone (no Node or CSINode of the cluster is watched).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SingleNode {
    pub name: String,
    pub segment: BTreeMap<String, String>,
}

impl ClusterTopology for SingleNode {
    fn csinode_keys(&self, node: &str) -> Option<Vec<String>> {
        (node == self.name).then(|| self.segment.keys().cloned().collect())
    }

    fn any_csinode_keys(&self) -> Option<Vec<String>> {
        (!self.segment.is_empty()).then(|| self.segment.keys().cloned().collect())
    }

    fn node_labels(&self, node: &str) -> Option<BTreeMap<String, String>> {
        (node == self.name).then(|| self.segment.clone())
    }

    fn node_segments(&self, keys: &[String]) -> Vec<BTreeMap<String, String>> {
        let values: Option<BTreeMap<String, String>> = keys
            .iter()
            .map(|key| Some((key.clone(), self.segment.get(key)?.clone())))
            .collect();
        values.into_iter().collect()
    }
}

/// Where a PV's volume lives, as far as a node can tell from the PV.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VolumePlace {
    ThisNode,
    OtherNode,
    /// The PV names no node, and its affinity (if any) cannot be checked against this node's
    /// segment: a central provisioner's PV, or one made by hand.
    Unknown,
}

/// Where a PV's volume is. First by the provisioner identity the node that created it
/// recorded in the PV (`<ms>-<rand>-<driver>-<node>`): only that node's driver holds the
/// volume. Node affinity alone is not enough: a driver whose segments span several nodes (a
/// zone, a rack) gives all of them a PV's affinity, and the first whose driver answered
/// NotFound to DeleteVolume (success) would drop the PV and leave the volume on its real node.
/// Only a PV whose identity names no node falls back to upstream's rule: its affinity must
/// accept a node labelled with this node's segment (named `node.name`).
pub fn volume_place(pv: &PersistentVolume, driver: &str, node: &NodeScope<'_>) -> VolumePlace {
    let spec = pv.spec.as_ref();
    let recorded = spec
        .and_then(|spec| spec.csi.as_ref())
        .and_then(|csi| {
            csi.volume_attributes
                .as_ref()?
                .get(PROVISIONER_IDENTITY_KEY)
        })
        .and_then(|identity| identity_node(identity, driver));
    let here = |yes: bool| {
        if yes {
            VolumePlace::ThisNode
        } else {
            VolumePlace::OtherNode
        }
    };
    if let Some(creator) = recorded {
        return here(creator == node.name);
    }
    let terms = spec
        .and_then(|spec| spec.node_affinity.as_ref())
        .and_then(|affinity| affinity.required.as_ref())
        .map(|selector| selector.node_selector_terms.as_slice())
        .filter(|terms| !terms.is_empty());
    match terms {
        Some(terms) if !node.segment.is_empty() => {
            here(terms.iter().any(|term| term_matches(term, node)))
        }
        _ => VolumePlace::Unknown,
    }
}

/// Whether a PV is this node's to delete (and to keep its finalizer on): its volume is known
/// to be here ([`volume_place`]). A PV whose place is unknown is no node's: upstream lets
/// every node delete it (A14).
pub fn volume_on_node(pv: &PersistentVolume, driver: &str, node: &NodeScope<'_>) -> bool {
    volume_place(pv, driver, node) == VolumePlace::ThisNode
}

/// The node of a node-mode provisioner identity `<ms>-<rand>-<driver>-<node>`.
fn identity_node<'a>(identity: &'a str, driver: &str) -> Option<&'a str> {
    let (millis, rest) = identity.split_once('-')?;
    let (random, rest) = rest.split_once('-')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(millis) || !digits(random) {
        return None;
    }
    rest.strip_prefix(driver)?
        .strip_prefix('-')
        .filter(|node| !node.is_empty())
}

/// A node selector term against a node named `node.name` whose labels are the segment, as
/// the scheduler evaluates it (an empty term matches nothing).
fn term_matches(term: &NodeSelectorTerm, node: &NodeScope<'_>) -> bool {
    let expressions = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if expressions.is_empty() && fields.is_empty() {
        return false;
    }
    let name_field = BTreeMap::from([("metadata.name".to_owned(), node.name.to_owned())]);
    expressions
        .iter()
        .all(|requirement| requirement_matches(requirement, node.segment))
        && fields
            .iter()
            .all(|requirement| requirement_matches(requirement, &name_field))
}

fn requirement_matches(
    requirement: &NodeSelectorRequirement,
    labels: &BTreeMap<String, String>,
) -> bool {
    let value = labels.get(&requirement.key);
    let values = requirement.values.as_deref().unwrap_or_default();
    let number = |s: &str| s.parse::<i64>().ok();
    let compare = |wanted: std::cmp::Ordering| {
        let (Some(have), [bound]) = (value.and_then(|v| number(v)), values) else {
            return false;
        };
        number(bound).is_some_and(|bound| have.cmp(&bound) == wanted)
    };
    match requirement.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => compare(std::cmp::Ordering::Greater),
        "Lt" => compare(std::cmp::Ordering::Less),
        _ => false,
    }
}

#[cfg(test)]
mod tests;
