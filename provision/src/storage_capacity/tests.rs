use super::*;
use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::json;

const DRIVER: &str = "d.example.com";

fn segment(pairs: &[(&str, &str)]) -> Segment {
    pairs
        .iter()
        .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
        .collect()
}

fn item(zone: &str, class: &str) -> WorkItem {
    WorkItem {
        segment: segment(&[("zone", zone)]),
        class: class.to_owned(),
    }
}

fn class(name: &str, provisioner: &str, mode: Option<&str>) -> StorageClass {
    StorageClass {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        provisioner: provisioner.to_owned(),
        volume_binding_mode: mode.map(str::to_owned),
        ..StorageClass::default()
    }
}

fn owner(uid: &str, kind: &str) -> OwnerReference {
    OwnerReference {
        api_version: "apps/v1".to_owned(),
        kind: kind.to_owned(),
        name: format!("{kind}-name").to_lowercase(),
        uid: uid.to_owned(),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

fn template(owner: Option<OwnerReference>) -> ObjectTemplate {
    ObjectTemplate {
        namespace: "csi".to_owned(),
        driver: DRIVER.to_owned(),
        managed_by: MANAGED_BY.to_owned(),
        owner,
    }
}

/// An object as the API server returns it.
fn stored(name: &str, created: i64, value: serde_json::Value) -> Arc<CSIStorageCapacity> {
    let mut object: CSIStorageCapacity = serde_json::from_value(value).expect("object");
    object.metadata.name = Some(name.to_owned());
    object.metadata.uid = Some(format!("uid-{name}"));
    object.metadata.creation_timestamp = Some(Time(
        k8s_openapi::jiff::Timestamp::from_second(created).expect("time"),
    ));
    Arc::new(object)
}

#[test]
fn managed_by_is_the_constant_centrally_and_names_the_node_otherwise() {
    assert_eq!(managed_by(None), "external-provisioner");
    assert_eq!(managed_by(Some("node-1")), "external-provisioner-node-1");
    // 21 + 42 = 63: still whole.
    let node42 = "n".repeat(42);
    assert_eq!(
        managed_by(Some(&node42)),
        format!("external-provisioner-{node42}")
    );
}

#[test]
fn the_hash_of_the_constant_is_upstreams() {
    assert_eq!(fnv1a32(b"external-provisioner"), 0x53f4_0b57);
}

#[test]
fn a_node_name_of_43_to_52_characters_keeps_the_name_and_part_of_the_base() {
    let node = "n".repeat(50);
    let id = managed_by(Some(&node));
    assert_eq!(id, format!("ext-53f40b57-{node}"));
    assert_eq!(id.len(), 63);
    let node43 = "m".repeat(43);
    assert_eq!(
        managed_by(Some(&node43)),
        format!("external-p-53f40b57-{node43}")
    );
}

#[test]
fn a_60_character_node_name_becomes_a_hash_of_the_whole_id() {
    let node = "a".repeat(60);
    let id = managed_by(Some(&node));
    let hash = fnv1a32(format!("external-provisioner-{node}").as_bytes());
    assert_eq!(id, format!("external-provisioner-{hash:08x}"));
    assert_eq!(id.len(), 29);
    assert!(id.len() <= 63);
}

#[test]
fn cluster_segments_come_from_registered_nodes_with_every_key() {
    let z1 = ["zone".to_owned(), "rack".to_owned()];
    let zone = ["zone".to_owned()];
    let labels = |node: &str| match node {
        "n1" => Some(segment(&[("zone", "z1"), ("rack", "r1"), ("os", "linux")])),
        "n2" => Some(segment(&[("zone", "z2")])),
        "n3" => Some(segment(&[("zone", "z2")])),
        _ => None,
    };
    let segments = cluster_segments(
        [
            ("n1", &z1[..]),
            ("n2", &z1[..]), // lacks rack: skipped
            ("n3", &zone[..]),
            ("n4", &zone[..]), // no Node: skipped
            ("n5", &zone[..]),
        ],
        labels,
    );
    assert_eq!(
        segments,
        BTreeSet::from([
            segment(&[("rack", "r1"), ("zone", "z1")]),
            segment(&[("zone", "z2")]),
        ])
    );
}

#[test]
fn a_node_registered_without_keys_gives_the_nil_segment_once() {
    let none: [String; 0] = [];
    let labels = |_: &str| Some(segment(&[("zone", "z1")]));
    let segments = cluster_segments([("n1", &none[..]), ("n2", &none[..])], labels);
    assert_eq!(segments, BTreeSet::from([Segment::new()]));
}

#[test]
fn desired_items_are_our_classes_in_every_segment_immediate_only_on_request() {
    let segments = BTreeSet::from([segment(&[("zone", "z1")]), segment(&[("zone", "z2")])]);
    let classes = [
        class("wffc", DRIVER, Some("WaitForFirstConsumer")),
        class("unset", DRIVER, None),
        class("immediate", DRIVER, Some("Immediate")),
        class("theirs", "other.example.com", Some("WaitForFirstConsumer")),
    ];
    let items = desired_items(&segments, &classes, DRIVER, false);
    assert_eq!(
        items,
        BTreeSet::from([
            item("z1", "unset"),
            item("z1", "wffc"),
            item("z2", "unset"),
            item("z2", "wffc"),
        ])
    );
    let items = desired_items(&segments, &classes, DRIVER, true);
    assert_eq!(items.len(), 6);
    assert!(items.contains(&item("z2", "immediate")));
}

#[test]
fn get_capacity_sends_raw_parameters_and_the_segment() {
    let mut fast = class("fast", DRIVER, None);
    fast.parameters = Some(BTreeMap::from([
        ("type".to_owned(), "ssd".to_owned()),
        (
            "csi.storage.k8s.io/provisioner-secret-name".to_owned(),
            "s".to_owned(),
        ),
    ]));
    let request = get_capacity_request(&item("z1", "fast"), &fast);
    assert!(request.volume_capabilities.is_empty());
    assert_eq!(request.parameters.len(), 2);
    assert_eq!(
        request.accessible_topology.expect("topology").segments,
        [("zone".to_owned(), "z1".to_owned())].into()
    );
    let nil = WorkItem {
        segment: Segment::new(),
        class: "fast".to_owned(),
    };
    let request = get_capacity_request(&nil, &fast);
    assert!(
        request
            .accessible_topology
            .expect("present")
            .segments
            .is_empty()
    );
}

#[test]
fn a_new_object_carries_upstreams_fields() {
    let object = template(Some(owner("uid-ss", "StatefulSet"))).new_object(
        &item("z1", "fast"),
        Capacity {
            available: 100 << 30,
            maximum_volume_size: Some(10 << 30),
        },
    );
    let json = serde_json::to_value(&object).expect("json");
    assert_eq!(
        json,
        json!({
            "apiVersion": "storage.k8s.io/v1",
            "kind": "CSIStorageCapacity",
            "metadata": {
                "generateName": "csisc-",
                "namespace": "csi",
                "labels": {
                    "csi.storage.k8s.io/drivername": DRIVER,
                    "csi.storage.k8s.io/managed-by": "external-provisioner",
                },
                "ownerReferences": [{
                    "apiVersion": "apps/v1", "kind": "StatefulSet",
                    "name": "statefulset-name", "uid": "uid-ss", "controller": true,
                }],
            },
            "storageClassName": "fast",
            "nodeTopology": {"matchLabels": {"zone": "z1"}},
            "capacity": "100Gi",
            "maximumVolumeSize": "10Gi",
        })
    );
}

#[test]
fn zero_capacity_is_published_and_no_maximum_is_absent() {
    let object = template(None).new_object(
        &item("z1", "fast"),
        Capacity {
            available: 0,
            maximum_volume_size: None,
        },
    );
    assert_eq!(object.capacity, Some(Quantity("0".to_owned())));
    assert_eq!(object.maximum_volume_size, None);
    assert_eq!(object.metadata.owner_references, None);
}

#[test]
fn the_nil_segments_object_has_an_empty_selector() {
    let nil = WorkItem {
        segment: Segment::new(),
        class: "fast".to_owned(),
    };
    let object = template(None).new_object(
        &nil,
        Capacity {
            available: 1,
            maximum_volume_size: None,
        },
    );
    assert_eq!(
        serde_json::to_value(&object.node_topology).expect("json"),
        json!({})
    );
}

/// A10: an object of the nil segment as read back (`{}`, or `matchLabels: {}`) is the
/// item's object, not obsolete; a missing selector is not (it selects no node).
#[test]
fn selectors_are_compared_by_what_they_select() {
    let nil = WorkItem {
        segment: Segment::new(),
        class: "fast".to_owned(),
    };
    let desired = BTreeSet::from([nil.clone()]);
    for selector in [
        json!({}),
        json!({"matchLabels": {}}),
        json!({"matchExpressions": []}),
    ] {
        let object = stored(
            "a",
            1,
            json!({"storageClassName": "fast", "nodeTopology": selector}),
        );
        let matching = match_objects(&desired, [object]);
        assert!(matching.linked.contains_key(&nil), "{selector}");
        assert!(matching.obsolete.is_empty());
    }
    let unselected = stored("b", 1, json!({"storageClassName": "fast"}));
    let expressions = stored(
        "c",
        1,
        json!({"storageClassName": "fast", "nodeTopology": {"matchExpressions": [
            {"key": "zone", "operator": "Exists"}]}}),
    );
    let matching = match_objects(&desired, [unselected, expressions]);
    assert!(matching.linked.is_empty());
    assert_eq!(matching.obsolete.len(), 2);
}

#[test]
fn existing_objects_are_adopted_once_and_the_rest_are_obsolete() {
    let desired = BTreeSet::from([item("z1", "fast"), item("z2", "fast")]);
    let z1 = |name, created| {
        stored(
            name,
            created,
            json!({"storageClassName": "fast", "nodeTopology": {"matchLabels": {"zone": "z1"}}}),
        )
    };
    let gone_class = stored(
        "old-class",
        1,
        json!({"storageClassName": "slow", "nodeTopology": {"matchLabels": {"zone": "z1"}}}),
    );
    let matching = match_objects(
        &desired,
        [
            z1("younger", 20),
            gone_class,
            z1("older", 10),
            z1("same-age", 10),
        ],
    );
    assert_eq!(matching.linked.len(), 1);
    assert_eq!(
        matching.linked[&item("z1", "fast")]
            .metadata
            .name
            .as_deref(),
        Some("older")
    );
    let obsolete: Vec<&str> = matching.obsolete.iter().map(|o| o.name.as_str()).collect();
    assert_eq!(obsolete, ["old-class", "same-age", "younger"]);
    assert_eq!(matching.obsolete[0].uid, "uid-old-class");
}

/// An object being deleted is left to finish: neither its item's object nor obsolete.
#[test]
fn an_object_being_deleted_is_neither_linked_nor_obsolete() {
    let desired = BTreeSet::from([item("z1", "fast")]);
    let deleting = stored(
        "deleting",
        1,
        json!({
            "metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"},
            "storageClassName": "fast",
            "nodeTopology": {"matchLabels": {"zone": "z1"}},
        }),
    );
    let gone_class = stored(
        "deleting-gone-class",
        1,
        json!({
            "metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"},
            "storageClassName": "slow",
        }),
    );
    assert_eq!(
        match_objects(&desired, [deleting, gone_class]),
        Matching::default()
    );
}

#[test]
fn the_object_of_an_item_is_the_one_match_objects_links() {
    let fast = item("z1", "fast");
    let desired = BTreeSet::from([fast.clone(), item("z2", "fast")]);
    let z1 = |name, created| {
        stored(
            name,
            created,
            json!({"storageClassName": "fast", "nodeTopology": {"matchLabels": {"zone": "z1"}}}),
        )
    };
    let deleting = stored(
        "deleting",
        1,
        json!({
            "metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"},
            "storageClassName": "fast",
            "nodeTopology": {"matchLabels": {"zone": "z1"}},
        }),
    );
    let other_class = stored(
        "other",
        1,
        json!({"storageClassName": "slow", "nodeTopology": {"matchLabels": {"zone": "z1"}}}),
    );
    let objects = vec![
        z1("younger", 20),
        deleting,
        other_class.clone(),
        z1("same-age-b", 10),
        z1("same-age-a", 10),
    ];
    let linked = object_of(&fast, objects.clone()).expect("an object");
    assert_eq!(linked.metadata.name.as_deref(), Some("same-age-a"));
    assert_eq!(
        match_objects(&desired, objects.clone()).linked.get(&fast),
        Some(&linked)
    );
    assert_eq!(object_of(&item("z2", "fast"), objects.clone()), None);

    assert!(!still_obsolete(&linked, &desired, objects.clone()));
    assert!(
        still_obsolete(&objects[0], &desired, objects.clone()),
        "duplicate"
    );
    assert!(
        still_obsolete(&other_class, &desired, objects.clone()),
        "class not wanted"
    );
    assert!(
        !still_obsolete(&objects[1], &desired, objects.clone()),
        "being deleted"
    );
}

#[test]
fn an_item_with_a_pending_create_is_not_created_again_until_settled() {
    let fast = item("z1", "fast");
    let mut pending = PendingCreates::default();
    assert_eq!(pending.target(&fast, None), SyncTarget::Create);
    pending.created(fast.clone(), "csisc-a".to_owned());
    assert!(pending.pending(&fast));
    // The watch lags: read the created one, do not create another.
    assert_eq!(
        pending.target(&fast, None),
        SyncTarget::Created("csisc-a".to_owned())
    );
    // Other objects reported: still pending.
    pending.settle(&BTreeSet::from([fast.clone()]), |name| name == "csisc-x");
    assert!(pending.pending(&fast));
    // The watch reports it: settled.
    pending.settle(&BTreeSet::from([fast.clone()]), |name| name == "csisc-a");
    assert!(!pending.pending(&fast));
    assert_eq!(pending.target(&fast, None), SyncTarget::Create);
}

#[test]
fn an_object_or_an_unwanted_item_settles_a_pending_create() {
    let fast = item("z1", "fast");
    let object = stored("csisc-old", 1, json!({"storageClassName": "fast"}));
    let mut pending = PendingCreates::default();
    pending.created(fast.clone(), "csisc-a".to_owned());
    assert_eq!(
        pending.target(&fast, Some(Arc::clone(&object))),
        SyncTarget::Update(object)
    );
    assert!(!pending.pending(&fast));
    pending.created(fast.clone(), "csisc-a".to_owned());
    pending.settle(&BTreeSet::new(), |_| false);
    assert_eq!(pending, PendingCreates::default());
    pending.created(fast.clone(), "csisc-b".to_owned());
    pending.forget(&fast);
    assert_eq!(pending.target(&fast, None), SyncTarget::Create);
}

fn existing(
    capacity: &str,
    maximum: Option<&str>,
    owners: serde_json::Value,
) -> CSIStorageCapacity {
    let object = stored(
        "a",
        1,
        json!({
            "metadata": {"ownerReferences": owners},
            "storageClassName": "fast",
            "nodeTopology": {"matchLabels": {"zone": "z1"}},
            "capacity": capacity,
            "maximumVolumeSize": maximum,
        }),
    );
    (*object).clone()
}

fn gib(available: i64, maximum: Option<i64>) -> Capacity {
    Capacity {
        available: available << 30,
        maximum_volume_size: maximum.map(|m| m << 30),
    }
}

#[test]
fn an_object_is_updated_only_when_something_differs() {
    let ours = owner("uid-ss", "StatefulSet");
    let with_owner = json!([ours]);
    let template = template(Some(ours));
    // Same values, written differently: no update.
    let object = existing("1Gi", None, with_owner.clone());
    assert_eq!(template.updated_object(&object, gib(1, None)), None);
    let object = existing("1073741824", Some("1Gi"), with_owner.clone());
    assert_eq!(template.updated_object(&object, gib(1, Some(1))), None);

    let updated = template
        .updated_object(&existing("1Gi", None, with_owner.clone()), gib(2, None))
        .expect("capacity changed");
    assert_eq!(updated.capacity, Some(Quantity("2Gi".to_owned())));
    assert_eq!(
        updated.metadata.resource_version,
        object.metadata.resource_version
    );
    let updated = template
        .updated_object(&existing("1Gi", None, with_owner.clone()), gib(1, Some(1)))
        .expect("maximum appeared");
    assert_eq!(
        updated.maximum_volume_size,
        Some(Quantity("1Gi".to_owned()))
    );
    let updated = template
        .updated_object(&existing("1Gi", Some("1Gi"), with_owner), gib(1, None))
        .expect("maximum gone");
    assert_eq!(updated.maximum_volume_size, None);
}

#[test]
fn a_missing_owner_is_added_beside_non_controller_references() {
    let template = template(Some(owner("uid-ss", "StatefulSet")));
    let other = OwnerReference {
        controller: None,
        ..owner("uid-cm", "ConfigMap")
    };
    let updated = template
        .updated_object(&existing("1Gi", None, json!([other])), gib(1, None))
        .expect("owner missing");
    let uids: Vec<&str> = updated
        .metadata
        .owner_references
        .iter()
        .flatten()
        .map(|o| o.uid.as_str())
        .collect();
    assert_eq!(uids, ["uid-cm", "uid-ss"]);
}

/// A9: upstream appends a second controller reference, which the API server refuses.
#[test]
fn another_controller_owner_is_replaced_not_joined() {
    let template = template(Some(owner("uid-ss", "StatefulSet")));
    let previous = owner("uid-rs", "ReplicaSet");
    let updated = template
        .updated_object(&existing("1Gi", None, json!([previous])), gib(1, None))
        .expect("owner changed");
    let references = updated.metadata.owner_references.expect("owners");
    assert_eq!(references.len(), 1);
    assert_eq!(references[0].uid, "uid-ss");
}

#[test]
fn without_an_owner_the_references_are_left_alone() {
    let object = existing("1Gi", None, json!([owner("uid-rs", "ReplicaSet")]));
    assert_eq!(template(None).updated_object(&object, gib(1, None)), None);
}

fn affinity(terms: serde_json::Value) -> VolumeNodeAffinity {
    serde_json::from_value(json!({"required": {"nodeSelectorTerms": terms}})).expect("affinity")
}

fn desired() -> BTreeSet<WorkItem> {
    BTreeSet::from([
        item("z1", "fast"),
        item("z1", "slow"),
        item("z2", "fast"),
        item("z2", "slow"),
    ])
}

#[test]
fn a_provisioned_volume_refreshes_its_segments_in_every_class() {
    let cause = RefreshCause::Provisioned {
        class: "fast".to_owned(),
        affinity: Some(affinity(json!([
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z2"]}]},
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1", "z2"]}]},
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n"]}]},
        ]))),
    };
    let refresh = refreshed_items(&desired(), &cause);
    assert_eq!(refresh.items, [item("z2", "fast"), item("z2", "slow")]);
    assert_eq!(refresh.skipped_terms, 2);
}

#[test]
fn without_affinity_a_provisioning_refreshes_its_class_and_a_deletion_nothing() {
    let provisioned = RefreshCause::Provisioned {
        class: "slow".to_owned(),
        affinity: None,
    };
    assert_eq!(
        refreshed_items(&desired(), &provisioned).items,
        [item("z1", "slow"), item("z2", "slow")]
    );
    let failed = RefreshCause::ProvisionFailed {
        class: "fast".to_owned(),
    };
    assert_eq!(
        refreshed_items(&desired(), &failed).items,
        [item("z1", "fast"), item("z2", "fast")]
    );
    let orphan = RefreshCause::OrphanDeleted {
        class: "slow".to_owned(),
    };
    assert_eq!(
        refreshed_items(&desired(), &orphan).items,
        [item("z1", "slow"), item("z2", "slow")]
    );
    let deleted = RefreshCause::Deleted { affinity: None };
    assert_eq!(refreshed_items(&desired(), &deleted), Refresh::default());
    let deleted = RefreshCause::Deleted {
        affinity: Some(affinity(json!([
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]},
        ]))),
    };
    assert_eq!(
        refreshed_items(&desired(), &deleted).items,
        [item("z1", "fast"), item("z1", "slow")]
    );
}

/// A11: a node segment with two keys equals the segment of a PV's affinity whatever the
/// order the driver or the PV lists the keys in.
#[test]
fn a_two_key_node_segment_matches_the_affinity_of_its_volumes() {
    let node: Segment = [("zone", "z1"), ("rack", "r1")]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let desired = BTreeSet::from([WorkItem {
        segment: node,
        class: "fast".to_owned(),
    }]);
    let term = NodeSelectorTerm {
        match_expressions: Some(vec![
            NodeSelectorRequirement {
                key: "zone".to_owned(),
                operator: "In".to_owned(),
                values: Some(vec!["z1".to_owned()]),
            },
            NodeSelectorRequirement {
                key: "rack".to_owned(),
                operator: "In".to_owned(),
                values: Some(vec!["r1".to_owned()]),
            },
        ]),
        match_fields: None,
    };
    let cause = RefreshCause::Deleted {
        affinity: Some(VolumeNodeAffinity {
            required: Some(NodeSelector {
                node_selector_terms: vec![term],
            }),
        }),
    };
    assert_eq!(refreshed_items(&desired, &cause).items.len(), 1);
}

#[test]
fn an_item_prints_its_segment_and_class() {
    let item = WorkItem {
        segment: segment(&[("zone", "z1"), ("rack", "r1")]),
        class: "fast".to_owned(),
    };
    assert_eq!(
        item.to_string(),
        r#"{segment: [rack=r1 zone=z1], storageClassName: "fast"}"#
    );
}
