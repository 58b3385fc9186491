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
    if in_flight {
        return work;
    }
    let selected = annotation(&pvc.metadata, ANN_SELECTED_NODE).filter(|n| !n.is_empty());
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
    raw.saturating_sub(jitter)
}

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
mod tests {
    use super::*;
    use crate::fixtures::{ClassBuilder, DRIVER, PvBuilder, PvcBuilder, caps, config};
    use crate::{
        DecisionError, TopologyInputs, accessibility_requirements, claim_work, plan_provision,
    };
    use k8s_openapi::api::core::v1::{NodeSelector, VolumeNodeAffinity};

    const NODE: &str = "node-b";

    fn segment() -> BTreeMap<String, String> {
        BTreeMap::from([("example.com/node".to_owned(), NODE.to_owned())])
    }

    fn scope(segment: &BTreeMap<String, String>) -> NodeScope<'_> {
        NodeScope {
            name: NODE,
            segment,
            immediate_binding: true,
        }
    }

    fn immediate() -> StorageClass {
        ClassBuilder::new().binding_mode(IMMEDIATE).build()
    }

    fn wffc() -> StorageClass {
        ClassBuilder::new()
            .binding_mode("WaitForFirstConsumer")
            .build()
    }

    fn claim() -> PvcBuilder {
        PvcBuilder::new()
    }

    fn on(node: &str) -> PersistentVolumeClaim {
        claim().annotation(ANN_SELECTED_NODE, node).build()
    }

    #[test]
    fn check_node_follows_upstreams_table() {
        let segment = segment();
        let node = scope(&segment);
        for class in [immediate(), wffc(), ClassBuilder::new().build()] {
            assert_eq!(check_node(&on(NODE), &class, &node), Ownership::Owner);
            assert_eq!(
                check_node(&on("node-a"), &class, &node),
                Ownership::NotOwner(NotOwner::OtherNode("node-a".into()))
            );
        }
        let unselected = claim().annotation(ANN_SELECTED_NODE, "").build();
        assert_eq!(
            check_node(&unselected, &wffc(), &node),
            Ownership::NotOwner(NotOwner::NotScheduled)
        );
        // A class without a binding mode is not Immediate here (upstream's nil check).
        assert_eq!(
            check_node(&claim().build(), &ClassBuilder::new().build(), &node),
            Ownership::NotOwner(NotOwner::NotScheduled)
        );
        assert_eq!(
            check_node(&unselected, &immediate(), &node),
            Ownership::Compete
        );
        let off = NodeScope {
            immediate_binding: false,
            ..node
        };
        assert_eq!(
            check_node(&claim().build(), &immediate(), &off),
            Ownership::NotOwner(NotOwner::ImmediateBindingOff)
        );
    }

    #[test]
    fn only_the_ga_key_selects_a_node() {
        let segment = segment();
        let alpha = claim()
            .annotation(crate::ANN_ALPHA_SELECTED_NODE, NODE)
            .build();
        assert_eq!(
            check_node(&alpha, &immediate(), &scope(&segment)),
            Ownership::Compete
        );
    }

    fn node_work(pvc: &PersistentVolumeClaim, class: &StorageClass, in_flight: bool) -> String {
        let segment = segment();
        let work = claim_work(pvc, Some(class), &config(), false, |_| in_flight);
        match node_claim_work(work, pvc, &scope(&segment), in_flight) {
            ClaimWork::Nothing(reason) => format!("nothing {reason:?}"),
            ClaimWork::ReleaseFinalizer => "release".into(),
            ClaimWork::Provision(_) => "provision".into(),
            ClaimWork::BecomeOwner(_) => "compete".into(),
            ClaimWork::Refuse(error) => format!("refuse {error}"),
        }
    }

    fn ours() -> PvcBuilder {
        claim().annotation(crate::ANN_STORAGE_PROVISIONER, DRIVER)
    }

    #[test]
    fn only_this_nodes_claims_are_provisioned_and_immediate_ones_competed_for() {
        let selected = |node: &str| ours().annotation(ANN_SELECTED_NODE, node).build();
        assert_eq!(node_work(&selected(NODE), &wffc(), false), "provision");
        assert!(node_work(&selected("node-a"), &wffc(), false).starts_with("nothing"));
        assert_eq!(node_work(&ours().build(), &immediate(), false), "compete");
        assert!(node_work(&ours().build(), &wffc(), false).starts_with("nothing"));
        // What this node recorded is finished here, whatever the annotation says now.
        assert_eq!(node_work(&selected("node-a"), &wffc(), true), "provision");
    }

    #[test]
    fn refusals_are_reported_by_the_owner_only() {
        let selector = |pvc: PvcBuilder| pvc.selector().build();
        let refused = node_work(
            &selector(ours().annotation(ANN_SELECTED_NODE, NODE)),
            &immediate(),
            false,
        );
        assert_eq!(refused, "provision", "a selector is refused by the plan");
        let no_class = ours()
            .class("gone")
            .annotation(ANN_SELECTED_NODE, NODE)
            .build();
        let segment = segment();
        let work = claim_work(&no_class, None::<&StorageClass>, &config(), false, |_| {
            false
        });
        assert!(matches!(
            node_claim_work(work, &no_class, &scope(&segment), false),
            ClaimWork::Refuse(DecisionError::StorageClassNotFound(_))
        ));
        let elsewhere = ours()
            .class("gone")
            .annotation(ANN_SELECTED_NODE, "node-a")
            .build();
        let work = claim_work(&elsewhere, None::<&StorageClass>, &config(), false, |_| {
            false
        });
        assert!(matches!(
            node_claim_work(work, &elsewhere, &scope(&segment), false),
            ClaimWork::Nothing(_)
        ));
    }

    #[test]
    fn the_finalizer_comes_off_on_the_owner_or_from_a_deleted_claim_never_selected_or_bound() {
        let finalized = || ours().finalizer(crate::PROVISIONING_FINALIZER);
        let bound = || finalized().volume_name("pvc-x");
        let mine = bound().annotation(ANN_SELECTED_NODE, NODE).build();
        assert_eq!(node_work(&mine, &wffc(), false), "release");
        let theirs = bound().annotation(ANN_SELECTED_NODE, "node-a").build();
        assert!(node_work(&theirs, &wffc(), false).starts_with("nothing"));
        let deleted_unselected = finalized().deleting().build();
        assert_eq!(node_work(&deleted_unselected, &wffc(), false), "release");
        // Bound: nothing in flight anywhere, so any node may let it go (its owner may be gone).
        let deleted_bound_theirs = bound()
            .annotation(ANN_SELECTED_NODE, "node-a")
            .deleting()
            .build();
        assert_eq!(node_work(&deleted_bound_theirs, &wffc(), false), "release");
        // Not bound: the owner may still have its operation in flight.
        let deleted_unbound_theirs = finalized()
            .annotation(ANN_SELECTED_NODE, "node-a")
            .deleting()
            .build();
        assert!(node_work(&deleted_unbound_theirs, &wffc(), false).starts_with("nothing"));
    }

    #[test]
    fn ownership_delay_has_upstreams_numbers() {
        let (base, max) = (Duration::from_secs(20), Duration::from_secs(60));
        let delay = |attempt, jitter| ownership_delay(attempt, base, max, jitter);
        // First try: (0, 20] s.
        assert_eq!(delay(0, 0.0), Duration::from_secs(20));
        assert_eq!(delay(0, 0.5), Duration::from_secs(10));
        assert!(delay(0, 0.999_999) > Duration::ZERO);
        // Second: (20, 40].
        assert_eq!(delay(1, 0.0), Duration::from_secs(40));
        assert!(delay(1, 0.999_999) > Duration::from_secs(20));
        // Third and later: capped at 60, less up to 20 of jitter.
        assert_eq!(delay(2, 0.0), Duration::from_secs(60));
        assert_eq!(delay(2, 0.25), Duration::from_secs(55));
        assert_eq!(delay(40, 0.0), Duration::from_secs(60));
        assert!(delay(40, 0.999_999) > Duration::from_secs(40));
        // A base larger than the cap never goes below zero.
        let odd = ownership_delay(0, Duration::from_secs(5), Duration::from_secs(1), 0.9);
        assert_eq!(odd, Duration::ZERO);
    }

    fn plan_for(pvc: &PersistentVolumeClaim, class: &StorageClass) -> ProvisionPlan {
        let caps = crate::DriverCapabilities {
            topology: true,
            ..caps()
        };
        plan_provision(pvc, class, &config(), &caps, &[]).expect("a plan")
    }

    fn requirements(
        class: &StorageClass,
        strict: bool,
    ) -> Result<Option<csi::TopologyRequirement>, crate::TopologyError> {
        let view = SingleNode {
            name: NODE.into(),
            segment: segment(),
        };
        let inputs = TopologyInputs {
            claim_name: "data",
            selected_node: Some(NODE),
            allowed_topologies: class.allowed_topologies.as_deref().unwrap_or_default(),
            strict,
            immediate: true,
        };
        accessibility_requirements(&inputs, &view)
    }

    #[test]
    fn capacity_is_asked_per_requisite_segment_of_this_node() {
        let class = immediate();
        let pvc = ours().build();
        let plan = plan_for(&pvc, &class);
        let requirements = requirements(&class, false).unwrap();
        let CapacityCheck::Ask { needed, requests } =
            capacity_check(Ok::<_, ()>(&plan), Ok::<_, ()>(requirements.as_ref()))
        else {
            panic!("a claim with a size asks");
        };
        assert_eq!(needed, 1 << 30);
        assert_eq!(requests.len(), 1);
        let topology = requests[0].accessible_topology.as_ref().unwrap();
        assert_eq!(
            topology.segments,
            std::collections::HashMap::from([("example.com/node".into(), NODE.into())])
        );
        assert_eq!(requests[0].volume_capabilities, plan.volume_capabilities);
        assert_eq!(requests[0].parameters, plan.parameters);
    }

    #[test]
    fn a_driver_without_topology_is_asked_once_without_a_segment() {
        let pvc = ours().build();
        let plan = plan_for(&pvc, &immediate());
        let CapacityCheck::Ask { requests, .. } =
            capacity_check(Ok::<_, ()>(&plan), Ok::<_, ()>(None))
        else {
            panic!("asks");
        };
        assert_eq!(requests.len(), 1);
        assert_eq!(requests[0].accessible_topology, None);
        let sizeless = ours().no_storage().build();
        assert_eq!(
            capacity_check(
                Ok::<_, ()>(&plan_for(&sizeless, &immediate())),
                Ok::<_, ()>(None)
            ),
            CapacityCheck::Skip
        );
        // A claim that cannot be planned or placed here is not asked about: the owner reports it.
        assert_eq!(
            capacity_check(Err::<&ProvisionPlan, _>("no plan"), Ok::<_, ()>(None)),
            CapacityCheck::Skip
        );
        assert_eq!(
            capacity_check(
                Ok::<_, ()>(&plan),
                Err::<Option<&csi::TopologyRequirement>, _>("no topology")
            ),
            CapacityCheck::Skip
        );
    }

    fn allowed(values: &[&str]) -> StorageClass {
        let mut class = immediate();
        class.allowed_topologies = Some(vec![k8s_openapi::api::core::v1::TopologySelectorTerm {
            match_label_expressions: Some(vec![
                k8s_openapi::api::core::v1::TopologySelectorLabelRequirement {
                    key: "example.com/node".into(),
                    values: values.iter().map(|v| (*v).to_owned()).collect(),
                },
            ]),
        }]);
        class
    }

    #[test]
    fn allowed_topologies_without_this_node_make_it_no_owner() {
        let elsewhere = allowed(&["node-a"]);
        for strict in [false, true] {
            let requirements = requirements(&elsewhere, strict);
            assert!(requirements.is_err());
            assert!(left_out(&elsewhere, &requirements));
        }
        let here = allowed(&["node-a", NODE]);
        let requirements = requirements(&here, false);
        assert!(requirements.is_ok());
        assert!(!left_out(&here, &requirements));
    }

    #[test]
    fn a_topology_error_without_allowed_topologies_leaves_the_node_in_the_race() {
        let failed = Err(TopologyError::NoAvailableTopology);
        assert!(!left_out(&immediate(), &failed));
        let mut empty = immediate();
        empty.allowed_topologies = Some(Vec::new());
        assert!(!left_out(&empty, &failed));
        assert!(left_out(&allowed(&["node-a"]), &failed));
    }

    #[test]
    fn there_is_room_when_one_answer_holds_the_request_or_a_call_failed() {
        let ok = |bytes: &[i64]| bytes.iter().map(|b| Ok::<_, ()>(*b)).collect::<Vec<_>>();
        assert!(has_room(10, &ok(&[5, 10])));
        assert!(!has_room(10, &ok(&[5, 9])));
        assert!(!has_room(10, &ok(&[])));
        assert!(has_room(10, &[Ok(5), Err("unavailable")]));
    }

    #[test]
    fn the_select_patch_carries_the_resource_version() {
        let pvc = claim().resource_version("42").build();
        assert_eq!(
            select_node_patch(&pvc, NODE),
            Some(json!({"metadata": {"resourceVersion": "42",
                "annotations": {"volume.kubernetes.io/selected-node": NODE}}}))
        );
        let mut unversioned = claim().build();
        unversioned.metadata.resource_version = None;
        assert_eq!(select_node_patch(&unversioned, NODE), None);
    }

    #[test]
    fn the_single_node_view_holds_this_node_only() {
        let view = SingleNode {
            name: NODE.into(),
            segment: segment(),
        };
        assert_eq!(
            view.csinode_keys(NODE),
            Some(vec!["example.com/node".into()])
        );
        assert_eq!(view.csinode_keys("node-a"), None);
        assert_eq!(view.node_labels(NODE), Some(segment()));
        assert_eq!(view.node_labels("node-a"), None);
        assert_eq!(
            view.node_segments(&["example.com/node".into()]),
            vec![segment()]
        );
        assert!(view.node_segments(&["zone".into()]).is_empty());
        let bare = SingleNode {
            name: NODE.into(),
            segment: BTreeMap::new(),
        };
        assert_eq!(bare.any_csinode_keys(), None);
    }

    fn pv_on(operator: &str, key: &str, values: &[&str]) -> PersistentVolume {
        let mut pv = PvBuilder::new().build();
        if let Some(spec) = pv.spec.as_mut() {
            spec.node_affinity = Some(VolumeNodeAffinity {
                required: Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_expressions: Some(vec![NodeSelectorRequirement {
                            key: key.into(),
                            operator: operator.into(),
                            values: Some(values.iter().map(|v| (*v).to_owned()).collect()),
                        }]),
                        match_fields: None,
                    }],
                }),
            });
        }
        pv
    }

    fn with_identity(mut pv: PersistentVolume, identity: &str) -> PersistentVolume {
        if let Some(csi) = pv.spec.as_mut().and_then(|spec| spec.csi.as_mut()) {
            csi.volume_attributes = Some(BTreeMap::from([(
                PROVISIONER_IDENTITY_KEY.to_owned(),
                identity.to_owned(),
            )]));
        }
        pv
    }

    #[test]
    fn a_pv_naming_no_node_is_deleted_by_the_node_its_affinity_names() {
        let segment = segment();
        let node = scope(&segment);
        assert!(volume_on_node(
            &pv_on("In", "example.com/node", &[NODE]),
            DRIVER,
            &node
        ));
        assert!(!volume_on_node(
            &pv_on("In", "example.com/node", &["node-a"]),
            DRIVER,
            &node
        ));
        assert!(volume_on_node(
            &pv_on("NotIn", "example.com/node", &["node-a"]),
            DRIVER,
            &node
        ));
        assert!(!volume_on_node(
            &pv_on("In", "zone", &["z1"]),
            DRIVER,
            &node
        ));
        assert!(volume_on_node(
            &pv_on("Exists", "example.com/node", &[]),
            DRIVER,
            &node
        ));
        // An identity naming a node wins over the affinity: a segment may span nodes.
        let mislabelled = with_identity(
            pv_on("In", "example.com/node", &["node-a"]),
            &format!("1-2-{DRIVER}-{NODE}"),
        );
        assert!(volume_on_node(&mislabelled, DRIVER, &node));
        let shared_segment = with_identity(
            pv_on("In", "example.com/node", &[NODE]),
            &format!("1-2-{DRIVER}-node-a"),
        );
        assert!(!volume_on_node(&shared_segment, DRIVER, &node));
        // An identity naming no node (a central provisioner's) leaves it to the affinity.
        let central = with_identity(
            pv_on("In", "example.com/node", &[NODE]),
            &format!("1-2-{DRIVER}"),
        );
        assert!(volume_on_node(&central, DRIVER, &node));
    }

    #[test]
    fn a_pv_without_affinity_is_deleted_only_by_the_node_that_created_it() {
        let segment = segment();
        let node = scope(&segment);
        let bare = || PvBuilder::new().build();
        assert!(
            !volume_on_node(&bare(), DRIVER, &node),
            "no identity: no node's"
        );
        let mine = with_identity(bare(), &format!("1700000000000-42-{DRIVER}-{NODE}"));
        assert!(volume_on_node(&mine, DRIVER, &node));
        let theirs = with_identity(bare(), &format!("1700000000000-42-{DRIVER}-node-a"));
        assert!(!volume_on_node(&theirs, DRIVER, &node));
        let central = with_identity(bare(), &format!("1700000000000-42-{DRIVER}"));
        assert!(!volume_on_node(&central, DRIVER, &node));
        let suffix = with_identity(bare(), &format!("1-2-{DRIVER}-x-{NODE}"));
        assert!(!volume_on_node(&suffix, DRIVER, &node), "node x-node-b");
        // Without a segment (a driver without topology), the identity decides too.
        let empty = BTreeMap::new();
        let no_topology = scope(&empty);
        assert!(volume_on_node(&mine, DRIVER, &no_topology));
        assert!(!volume_on_node(
            &pv_on("In", "example.com/node", &[NODE]),
            DRIVER,
            &no_topology
        ));
    }

    #[test]
    fn a_pv_naming_no_node_without_a_checkable_affinity_is_of_unknown_place() {
        let segment = segment();
        let node = scope(&segment);
        let empty = BTreeMap::new();
        let no_topology = scope(&empty);
        let bare = PvBuilder::new().build();
        assert_eq!(volume_place(&bare, DRIVER, &node), VolumePlace::Unknown);
        let affine = pv_on("In", "example.com/node", &[NODE]);
        assert_eq!(volume_place(&affine, DRIVER, &node), VolumePlace::ThisNode);
        assert_eq!(
            volume_place(&affine, DRIVER, &no_topology),
            VolumePlace::Unknown
        );
        let theirs = with_identity(bare, &format!("1-2-{DRIVER}-node-a"));
        assert_eq!(
            volume_place(&theirs, DRIVER, &no_topology),
            VolumePlace::OtherNode
        );
    }

    #[test]
    fn identity_node_reads_the_node_after_the_driver() {
        assert_eq!(identity_node("1-2-d-n", "d"), Some("n"));
        assert_eq!(identity_node("1-2-d-n-1", "d"), Some("n-1"));
        assert_eq!(identity_node("1-2-d", "d"), None);
        assert_eq!(identity_node("1-2-d-", "d"), None);
        assert_eq!(identity_node("x-2-d-n", "d"), None);
        assert_eq!(identity_node("1-2-e-n", "d"), None);
    }
}
