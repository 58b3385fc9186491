use k8s_openapi::api::core::v1::TopologySelectorLabelRequirement;

use super::super::fixtures::Cluster;
use super::*;

const ZONE: &str = "topology.example/zone";
const RACK: &str = "topology.example/rack";

fn inputs<'a>(
    claim_name: &'a str,
    selected_node: Option<&'a str>,
    allowed_topologies: &'a [TopologySelectorTerm],
) -> TopologyInputs<'a> {
    TopologyInputs {
        claim_name,
        selected_node,
        allowed_topologies,
        strict: false,
        immediate: true,
    }
}

/// A selector term: one expression per `(key, values)`.
fn selector(expressions: &[(&str, &[&str])]) -> TopologySelectorTerm {
    TopologySelectorTerm {
        match_label_expressions: Some(
            expressions
                .iter()
                .map(|(key, values)| TopologySelectorLabelRequirement {
                    key: (*key).to_owned(),
                    values: values.iter().map(|value| (*value).to_owned()).collect(),
                })
                .collect(),
        ),
    }
}

fn term(pairs: &[(&str, &str)]) -> TopologyTerm {
    TopologyTerm::new(
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    )
}

fn topologies(terms: &[&[(&str, &str)]]) -> Vec<csi::Topology> {
    terms.iter().map(|pairs| term(pairs).to_csi()).collect()
}

fn requirement(
    inputs: &TopologyInputs<'_>,
    cluster: &Cluster,
) -> (Vec<csi::Topology>, Vec<csi::Topology>) {
    match accessibility_requirements(inputs, cluster) {
        Ok(Some(requirement)) => (requirement.requisite, requirement.preferred),
        other => panic!("expected a requirement, got {other:?}"),
    }
}

fn error(inputs: &TopologyInputs<'_>, cluster: &Cluster) -> TopologyError {
    match accessibility_requirements(inputs, cluster) {
        Err(error) => error,
        Ok(other) => panic!("expected an error, got {other:?}"),
    }
}

/// §1.5a's worked example: n1 {zone a, rack 1}, n2 {zone a, rack 2}, n3 {zone b, rack 1}.
fn three_racks() -> Cluster {
    Cluster::new()
        .member("n1", &[ZONE, RACK], &[(ZONE, "a"), (RACK, "1")])
        .member("n2", &[ZONE, RACK], &[(ZONE, "a"), (RACK, "2")])
        .member("n3", &[ZONE, RACK], &[(ZONE, "b"), (RACK, "1")])
}

/// Three zones z1..z3, one node each.
fn three_zones() -> Cluster {
    Cluster::new()
        .member("n1", &[ZONE], &[(ZONE, "z1")])
        .member("n2", &[ZONE], &[(ZONE, "z2")])
        .member("n3", &[ZONE], &[(ZONE, "z3")])
}

#[test]
fn delayed_binding_aggregates_all_nodes_and_prefers_the_selected_one() {
    let (requisite, preferred) = requirement(&inputs("data", Some("n2"), &[]), &three_racks());
    let sorted: [&[(&str, &str)]; 3] = [
        &[(RACK, "1"), (ZONE, "a")],
        &[(RACK, "1"), (ZONE, "b")],
        &[(RACK, "2"), (ZONE, "a")],
    ];
    assert_eq!(requisite, topologies(&sorted));
    assert_eq!(
        preferred,
        topologies(&[sorted[2], sorted[0], sorted[1]]),
        "the selected node's term first, then the rest in sorted order"
    );
}

#[test]
fn delayed_aggregation_includes_nodes_where_the_driver_is_not_registered() {
    let cluster = three_zones().node("n4", &[(ZONE, "z4")]);
    let (requisite, preferred) = requirement(&inputs("data", Some("n1"), &[]), &cluster);
    assert_eq!(
        requisite,
        topologies(&[
            &[(ZONE, "z1")],
            &[(ZONE, "z2")],
            &[(ZONE, "z3")],
            &[(ZONE, "z4")]
        ])
    );
    assert_eq!(preferred[0], term(&[(ZONE, "z1")]).to_csi());
}

#[test]
fn fnv1_is_not_fnv1a() {
    assert_eq!(fnv1_32(b"web"), 1_181_096_325);
    assert_eq!(fnv1_32(b""), 2_166_136_261);
    // FNV-1a (xor, then multiply) would give 265927825.
}

#[test]
fn statefulset_claims_rotate_by_ordinal_from_the_set_name_hash() {
    // (1181096325 + 2) mod 3 = 2.
    assert_eq!(statefulset_offset("data-web-2", 3), 2);
    assert_eq!(
        statefulset_offset("web-2", 3),
        2,
        "`web-2` hashes `web` too"
    );
    assert_eq!(
        statefulset_offset("logs-web-2", 3),
        2,
        "claims of one pod agree"
    );
    for ordinal in 0..6u32 {
        let expected = (1_181_096_325 + ordinal as usize) % 3;
        assert_eq!(
            statefulset_offset(&format!("data-web-{ordinal}"), 3),
            expected
        );
    }
    assert_eq!(
        statefulset_offset("mydisk", 7),
        fnv1_32(b"mydisk") as usize % 7
    );
    // Leading zeros parse; a sign, a non-digit or a number over u32 do not, and then the
    // whole name is hashed with ordinal 0.
    assert_eq!(statefulset_offset("data-web-002", 3), 2);
    for whole in [
        "data-web-+2",
        "data-web-2a",
        "data-web-",
        "data-web-4294967296",
    ] {
        assert_eq!(
            statefulset_offset(whole, 5),
            fnv1_32(whole.as_bytes()) as usize % 5,
            "{whole}"
        );
    }
    // The sum wraps at 32 bits.
    let wrapped = fnv1_32(b"web").wrapping_add(u32::MAX) as usize % 7;
    assert_eq!(statefulset_offset("d-web-4294967295", 7), wrapped);
}

#[test]
fn immediate_binding_rotates_the_sorted_terms_per_statefulset_ordinal() {
    let cluster = three_zones();
    let (requisite, preferred) = requirement(&inputs("data-web-2", None, &[]), &cluster);
    let zones = topologies(&[&[(ZONE, "z1")], &[(ZONE, "z2")], &[(ZONE, "z3")]]);
    assert_eq!(requisite, zones);
    assert_eq!(
        preferred,
        vec![zones[2].clone(), zones[0].clone(), zones[1].clone()]
    );
    let (_, preferred) = requirement(&inputs("data-web-0", None, &[]), &cluster);
    assert_eq!(preferred, zones, "(1181096325 + 0) mod 3 = 0");
}

#[test]
fn immediate_topology_off_sends_nothing_without_node_or_allowed_topologies() {
    let mut immediate_off = inputs("data", None, &[]);
    immediate_off.immediate = false;
    assert_eq!(
        accessibility_requirements(&immediate_off, &three_zones()),
        Ok(None)
    );
    // allowedTopologies are still sent.
    let allowed = [selector(&[(ZONE, &["z2"])])];
    immediate_off.allowed_topologies = &allowed;
    let (requisite, preferred) = requirement(&immediate_off, &three_zones());
    assert_eq!(requisite, topologies(&[&[(ZONE, "z2")]]));
    assert_eq!(preferred, requisite);
    // A selected node is always aggregated.
    let mut delayed = inputs("data", Some("n1"), &[]);
    delayed.immediate = false;
    assert!(matches!(
        accessibility_requirements(&delayed, &three_zones()),
        Ok(Some(_))
    ));
}

#[test]
fn an_empty_selected_node_is_no_selected_node() {
    let mut empty = inputs("data", Some(""), &[]);
    empty.immediate = false;
    assert_eq!(accessibility_requirements(&empty, &three_zones()), Ok(None));
}

#[test]
fn allowed_topologies_flatten_to_the_cross_product_of_each_selector_term() {
    let allowed = [
        selector(&[(ZONE, &["z1", "z2"]), (RACK, &["rA", "rB"])]),
        selector(&[(ZONE, &["z3"])]),
    ];
    assert_eq!(
        flatten(&allowed),
        vec![
            term(&[(ZONE, "z1"), (RACK, "rA")]),
            term(&[(ZONE, "z2"), (RACK, "rA")]),
            term(&[(ZONE, "z1"), (RACK, "rB")]),
            term(&[(ZONE, "z2"), (RACK, "rB")]),
            term(&[(ZONE, "z3")]),
        ]
    );
    // Sorted: fewer pairs first, then by key (rack < zone), then value.
    let (requisite, _) = requirement(&inputs("data", None, &allowed), &Cluster::new());
    assert_eq!(
        requisite,
        topologies(&[
            &[(ZONE, "z3")],
            &[(RACK, "rA"), (ZONE, "z1")],
            &[(RACK, "rA"), (ZONE, "z2")],
            &[(RACK, "rB"), (ZONE, "z1")],
            &[(RACK, "rB"), (ZONE, "z2")],
        ])
    );
}

#[test]
fn allowed_topologies_are_not_intersected_with_nodes() {
    let allowed = [selector(&[(ZONE, &["z1", "z9"])])];
    let (requisite, preferred) = requirement(&inputs("data", Some("n1"), &allowed), &three_zones());
    assert_eq!(requisite, topologies(&[&[(ZONE, "z1")], &[(ZONE, "z9")]]));
    assert_eq!(preferred, requisite);
}

#[test]
fn an_expression_without_values_empties_the_product_so_far() {
    // Last: the selector term gives nothing.
    assert_eq!(
        flatten(&[selector(&[(ZONE, &["z1"]), (RACK, &[])])]),
        vec![]
    );
    // First: the next expression starts again (upstream's behaviour).
    assert_eq!(
        flatten(&[selector(&[(ZONE, &[]), (RACK, &["r1"])])]),
        vec![term(&[(RACK, "r1")])]
    );
    // Selector terms without expressions give nothing either.
    let nothing = [
        TopologySelectorTerm::default(),
        selector(&[]),
        selector(&[(ZONE, &[])]),
    ];
    assert_eq!(
        accessibility_requirements(&inputs("data", None, &nothing), &three_zones()),
        Ok(None),
        "allowedTopologies that flatten to nothing: no requirement"
    );
    assert_eq!(
        accessibility_requirements(&inputs("data", Some("n1"), &nothing), &three_zones()),
        Ok(None),
        "even with a selected node"
    );
}

#[test]
fn requisite_is_sorted_and_adjacent_duplicates_dropped() {
    let allowed = [
        selector(&[(ZONE, &["z2", "z1"])]),
        selector(&[(ZONE, &["z1"])]),
        selector(&[(ZONE, &["z1"]), (RACK, &["r1"])]),
    ];
    let (requisite, _) = requirement(&inputs("data", None, &allowed), &Cluster::new());
    assert_eq!(
        requisite,
        topologies(&[
            &[(ZONE, "z1")],
            &[(ZONE, "z2")],
            &[(RACK, "r1"), (ZONE, "z1")]
        ])
    );
}

#[test]
fn term_order_is_length_then_key_then_value_in_byte_order() {
    let mut terms = vec![
        term(&[("b", "1"), ("a", "2")]),
        term(&[("b", "0")]),
        term(&[("a", "2"), ("b", "0")]),
        term(&[("a", "Z")]),
        term(&[("a", "a")]),
        term(&[("B", "9")]),
    ];
    terms.sort();
    assert_eq!(
        terms,
        vec![
            term(&[("B", "9")]),
            term(&[("a", "Z")]),
            term(&[("a", "a")]),
            term(&[("b", "0")]),
            term(&[("a", "2"), ("b", "0")]),
            term(&[("a", "2"), ("b", "1")]),
        ]
    );
}

#[test]
fn subset_is_every_pair_present_with_the_same_value() {
    let node = term(&[(RACK, "1"), (ZONE, "a")]);
    assert!(term(&[]).is_subset_of(&node));
    assert!(term(&[]).is_subset_of(&term(&[])));
    assert!(term(&[(ZONE, "a")]).is_subset_of(&node));
    assert!(term(&[(RACK, "1")]).is_subset_of(&node));
    assert!(node.is_subset_of(&node));
    assert!(!term(&[(ZONE, "b")]).is_subset_of(&node));
    assert!(!term(&[("other", "a")]).is_subset_of(&node));
    assert!(!term(&[(RACK, "1"), ("x", "1"), (ZONE, "a")]).is_subset_of(&node));
    assert!(!node.is_subset_of(&term(&[(ZONE, "a")])));
}

#[test]
fn allowed_zones_match_a_node_term_with_more_keys() {
    let allowed = [selector(&[(ZONE, &["a", "b"])])];
    let (requisite, preferred) = requirement(&inputs("data", Some("n3"), &allowed), &three_racks());
    assert_eq!(requisite, topologies(&[&[(ZONE, "a")], &[(ZONE, "b")]]));
    assert_eq!(preferred, topologies(&[&[(ZONE, "b")], &[(ZONE, "a")]]));
}

#[test]
fn strict_topology_sends_only_the_selected_nodes_term() {
    let mut strict = inputs("data", Some("n2"), &[]);
    strict.strict = true;
    let only = topologies(&[&[(RACK, "2"), (ZONE, "a")]]);
    assert_eq!(
        requirement(&strict, &three_racks()),
        (only.clone(), only.clone())
    );

    let allowed = [selector(&[(ZONE, &["a"])])];
    strict.allowed_topologies = &allowed;
    assert_eq!(requirement(&strict, &three_racks()), (only.clone(), only));
}

#[test]
fn strict_topology_refuses_a_node_outside_the_allowed_topologies() {
    let allowed = [
        selector(&[(ZONE, &["b"])]),
        selector(&[(ZONE, &["a"]), (RACK, &["1"])]),
    ];
    let mut strict = inputs("data", Some("n2"), &allowed);
    strict.strict = true;
    let error = error(&strict, &three_racks());
    assert_eq!(
        error.to_string(),
        "error generating accessibility requirements: selected node '\"n2\"' topology \
             '[{topology.example/rack 2} {topology.example/zone a}]' is not in allowed \
             topologies: [[{topology.example/zone b}] [{topology.example/rack 1} \
             {topology.example/zone a}]]"
    );
    assert!(!error.reschedules());

    // Nothing allowed at all (an expression without values) is refused too.
    let nothing = [selector(&[(ZONE, &[])])];
    strict.allowed_topologies = &nothing;
    assert_eq!(
        error_text(&strict, &three_racks()),
        "error generating accessibility requirements: selected node '\"n2\"' topology \
             '[{topology.example/rack 2} {topology.example/zone a}]' is not in allowed \
             topologies: []"
    );
}

fn error_text(inputs: &TopologyInputs<'_>, cluster: &Cluster) -> String {
    error(inputs, cluster).to_string()
}

#[test]
fn a_selected_node_without_csinode_reschedules() {
    let cluster = three_zones().node("gone", &[(ZONE, "z1")]);
    let error = error(&inputs("data", Some("gone"), &[]), &cluster);
    assert_eq!(
        error,
        TopologyError::CsiNodeNotFound {
            node: "gone".to_owned()
        }
    );
    assert!(error.reschedules());
    assert_eq!(
        error.to_string(),
        "failed to get selected CSINode gone: csinode.storage.k8s.io \"gone\" not found"
    );
}

#[test]
fn a_selected_node_without_keys_is_retried() {
    let cluster = three_zones()
        .csinode("bare", &[])
        .node("bare", &[(ZONE, "z1")]);
    let error = error(&inputs("data", Some("bare"), &[]), &cluster);
    assert!(!error.reschedules());
    assert_eq!(
        error.to_string(),
        "error generating accessibility requirements: no topology key found for node bare"
    );
}

#[test]
fn a_selected_node_gone_or_lacking_a_key_is_retried_with_its_labels() {
    let cluster = Cluster::new().csinode("n1", &[ZONE, RACK]);
    let error = error(&inputs("data", Some("n1"), &[]), &cluster);
    assert!(!error.reschedules());
    assert_eq!(
        error.to_string(),
        "error generating accessibility requirements: topology labels from selected node \
             map[] does not match topology keys from CSINode [topology.example/zone \
             topology.example/rack]"
    );

    let cluster = cluster.node("n1", &[(ZONE, "a"), ("kubernetes.io/hostname", "n1")]);
    assert_eq!(
        error_text(&inputs("data", Some("n1"), &[]), &cluster),
        "error generating accessibility requirements: topology labels from selected node \
             map[kubernetes.io/hostname:n1 topology.example/zone:a] does not match topology \
             keys from CSINode [topology.example/zone topology.example/rack]"
    );
}

#[test]
fn immediate_binding_needs_a_csinode_with_keys() {
    let cluster = Cluster::new()
        .node("n1", &[(ZONE, "z1")])
        .csinode("n1", &[]);
    let error = error(&inputs("data", None, &[]), &cluster);
    assert_eq!(error, TopologyError::NoAvailableTopology);
    assert_eq!(
        error.to_string(),
        "error generating accessibility requirements: no available topology found"
    );
    assert_eq!(
        error_text(&inputs("data", None, &[]), &Cluster::new()),
        "error generating accessibility requirements: no available topology found"
    );
}

#[test]
fn keys_found_on_no_node_are_an_error() {
    let cluster = Cluster::new()
        .csinode("n1", &[ZONE, RACK])
        .node("n1", &[(ZONE, "z1")]);
    let expected = "error generating accessibility requirements: topologyKeys \
                        [topology.example/zone topology.example/rack] were not found on any \
                        nodes";
    assert_eq!(error_text(&inputs("data", None, &[]), &cluster), expected);

    // With a selected node that has the keys, its own Node always matches; without it...
    let cluster = cluster.node("n1", &[(ZONE, "z1"), (RACK, "r1")]);
    assert!(accessibility_requirements(&inputs("data", Some("n1"), &[]), &cluster).is_ok());
}

#[test]
fn a_selected_node_outside_the_allowed_topologies_is_an_error() {
    let allowed = [selector(&[(ZONE, &["b"])])];
    let error = error(&inputs("data", Some("n2"), &allowed), &three_racks());
    assert!(!error.reschedules());
    assert_eq!(
        error.to_string(),
        "error generating accessibility requirements: topology [{topology.example/rack 2} \
             {topology.example/zone a}] from selected node \"n2\" is not in requisite: \
             [[{topology.example/zone b}]]"
    );
}

#[test]
fn go_formatting_of_maps_and_lists() {
    let mut map = BTreeMap::new();
    assert_eq!(go_map(&map), "map[]");
    map.insert("b".to_owned(), "2".to_owned());
    map.insert("a".to_owned(), "1".to_owned());
    assert_eq!(go_map(&map), "map[a:1 b:2]");
    assert_eq!(go_list::<String>(&[]), "[]");
    assert_eq!(go_list(&["k1".to_owned(), "k2".to_owned()]), "[k1 k2]");
    assert_eq!(term(&[]).to_string(), "[]");
    assert_eq!(term(&[("z", "1"), ("a", "2")]).to_string(), "[{a 2} {z 1}]");
}

#[test]
fn a_repeated_key_keeps_its_largest_value_in_the_segment_map() {
    let allowed = [selector(&[(ZONE, &["z2"]), (ZONE, &["z1"])])];
    let (requisite, _) = requirement(&inputs("data", None, &allowed), &Cluster::new());
    assert_eq!(requisite, topologies(&[&[(ZONE, "z2")]]));
}

#[test]
fn keys_outside_the_csi_grammar_are_refused() {
    let long_prefix = format!("{}/zone", "a".repeat(64));
    let cases = [
        (
            long_prefix.as_str(),
            "a key prefix of at most 63 characters",
        ),
        ("Example.com/zone", "a key prefix in DNS notation"),
        ("/zone", "a key prefix in DNS notation"),
        ("example.com/", "a key name of 1 to 63 characters"),
        ("my zone", "a key name of 1 to 63 characters"),
        ("a/b/c", "a key name of 1 to 63 characters"),
    ];
    for (key, problem) in cases {
        let allowed = [selector(&[(key, &["z1"])])];
        let error = error_text(&inputs("data", None, &allowed), &Cluster::new());
        assert!(
            error.starts_with(&format!(
                "error generating accessibility requirements: topology key {key:?} cannot \
                     be sent to the CSI driver: the CSI spec requires {problem}"
            )),
            "{error}"
        );
    }
    for key in [
        "zone",
        "Zone_1.a",
        "topology.kubernetes.io/zone",
        &format!("{}/{}", "a".repeat(63), "B".repeat(63)),
    ] {
        let allowed = [selector(&[(key, &["z1"])])];
        assert!(
            accessibility_requirements(&inputs("data", None, &allowed), &Cluster::new()).is_ok(),
            "{key}"
        );
    }
}

#[test]
fn values_outside_the_csi_grammar_are_refused() {
    // An empty label value is valid in Kubernetes, not in CSI.
    let cluster = Cluster::new().member("n1", &[ZONE], &[(ZONE, "")]);
    assert_eq!(
        error_text(&inputs("data", Some("n1"), &[]), &cluster),
        "error generating accessibility requirements: topology value \"\" of key \
             \"topology.example/zone\" cannot be sent to the CSI driver: the CSI spec requires \
             1 to 63 characters, alphanumerics, '-', '_' or '.', beginning and ending with an \
             alphanumeric"
    );
    let too_long = "a".repeat(64);
    for value in ["zone 1", "-z", "z.", too_long.as_str(), "zöne"] {
        let allowed = [selector(&[(ZONE, &[value])])];
        assert!(
            matches!(
                accessibility_requirements(&inputs("data", None, &allowed), &Cluster::new()),
                Err(TopologyError::InvalidValue { .. })
            ),
            "{value}"
        );
    }
}

#[test]
fn keys_differing_only_in_case_are_refused() {
    let allowed = [
        selector(&[("Zone", &["z1"])]),
        selector(&[("zone", &["z2"])]),
    ];
    assert_eq!(
        error_text(&inputs("data", None, &allowed), &Cluster::new()),
        "error generating accessibility requirements: topology keys \"Zone\" and \"zone\" \
             cannot both be sent to the CSI driver: the CSI spec makes keys case-insensitive"
    );
}

#[test]
fn segment_maps_over_4_kib_are_refused() {
    let keys: Vec<String> = (0..40).map(|i| format!("example.com/key-{i:02}")).collect();
    let value = "v".repeat(63);
    let values = [value.as_str()];
    let pairs: Vec<(&str, &[&str])> = keys.iter().map(|key| (key.as_str(), &values[..])).collect();
    // 40 × (18 + 63) = 3240 bytes: fine.
    let allowed = [selector(&pairs)];
    assert!(accessibility_requirements(&inputs("data", None, &allowed), &Cluster::new()).is_ok());
    let long_keys: Vec<String> = (0..40)
        .map(|i| format!("{}.com/key-{i:02}", "e".repeat(40)))
        .collect();
    let pairs: Vec<(&str, &[&str])> = long_keys
        .iter()
        .map(|key| (key.as_str(), &values[..]))
        .collect();
    let allowed = [selector(&pairs)];
    let error = error(&inputs("data", None, &allowed), &Cluster::new());
    // 40 × (51 + 63) = 4560 bytes.
    assert!(
        matches!(error, TopologyError::TermTooLarge { bytes: 4560, .. }),
        "{error}"
    );
    assert!(
        error
            .to_string()
            .ends_with("take 4560 bytes, the CSI spec allows 4096 for a map")
    );
}
