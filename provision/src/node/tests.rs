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
    // What this node recorded is finished here while the claim is still this node's (or no
    // node's); once it selects another node, this node's reaper deletes what it made here.
    assert_eq!(node_work(&selected(NODE), &wffc(), true), "provision");
    assert_eq!(node_work(&ours().build(), &immediate(), true), "provision");
    assert!(node_work(&selected("node-a"), &wffc(), true).starts_with("nothing"));
    let segment = segment();
    assert!(claim_left_node(&selected("node-a"), &scope(&segment)));
    assert!(!claim_left_node(&selected(NODE), &scope(&segment)));
    assert!(!claim_left_node(&ours().build(), &scope(&segment)));
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

/// Issue #31: `--node-deployment-base-delay=0s` tries at once, but never retries in a hot loop.
#[test]
fn a_zero_base_delay_tries_at_once_and_retries_no_faster_than_the_floor() {
    let zero = |attempt| ownership_delay(attempt, Duration::ZERO, Duration::ZERO, 0.5);
    assert_eq!(zero(0), Duration::ZERO);
    for attempt in [1, 2, 30] {
        assert_eq!(zero(attempt), OWNERSHIP_RETRY_FLOOR);
    }
    let short = ownership_delay(1, Duration::from_millis(10), Duration::from_secs(60), 0.0);
    assert_eq!(short, OWNERSHIP_RETRY_FLOOR);
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
    let CapacityCheck::Ask { requests, .. } = capacity_check(Ok::<_, ()>(&plan), Ok::<_, ()>(None))
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
