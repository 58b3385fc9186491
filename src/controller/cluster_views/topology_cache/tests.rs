use super::*;
use kube::runtime::watcher::Event;
use serde_json::json;

fn store<K>(objects: Vec<serde_json::Value>) -> Store<K>
where
    K: Resource<DynamicType = ()> + Clone + for<'de> Deserialize<'de> + 'static,
{
    let (reader, mut writer) = kube::runtime::reflector::store();
    writer.apply_watcher_event(&Event::Init);
    for object in objects {
        let object: K = serde_json::from_value(object).expect("test object");
        writer.apply_watcher_event(&Event::InitApply(object));
    }
    writer.apply_watcher_event(&Event::InitDone);
    reader
}

fn node(name: &str, labels: serde_json::Value) -> serde_json::Value {
    json!({
        "metadata": {
            "name": name, "uid": format!("uid-{name}"), "resourceVersion": "1",
            "labels": labels,
            "managedFields": [{"manager": "kubelet", "fieldsV1": {"f:status": {}}}],
        },
        "status": {"images": [{"names": ["registry/huge:1"], "sizeBytes": 1}]},
    })
}

fn csinode(name: &str, drivers: serde_json::Value) -> serde_json::Value {
    json!({"metadata": {"name": name, "uid": format!("uid-{name}")}, "spec": {"drivers": drivers}})
}

fn parsed<K: for<'de> Deserialize<'de>>(value: serde_json::Value) -> K {
    serde_json::from_value(value).expect("test object")
}

/// Status updates (a new resourceVersion, other images) do not wake the capacity
/// controller; label changes, appearance and removal do.
#[test]
fn only_label_changes_and_presence_of_a_node_count_for_capacity() {
    let before: CachedNode = parsed(node("n1", json!({"zone": "z1"})));
    let mut status_update = node("n1", json!({"zone": "z1"}));
    status_update["metadata"]["resourceVersion"] = json!("2");
    status_update["status"] = json!({"images": []});
    let status_update: CachedNode = parsed(status_update);
    let relabelled: CachedNode = parsed(node("n1", json!({"zone": "z2"})));
    assert!(!node_labels_changed(Some(&before), Some(&status_update)));
    assert!(node_labels_changed(Some(&before), Some(&relabelled)));
    assert!(node_labels_changed(None, Some(&before)));
    assert!(node_labels_changed(Some(&before), None));
    let unlabelled: CachedNode = parsed(json!({"metadata": {"name": "n1"}}));
    let empty: CachedNode = parsed(node("n1", json!({})));
    assert!(!node_labels_changed(Some(&unlabelled), Some(&empty)));
}

#[test]
fn only_our_drivers_registration_and_keys_of_a_csinode_count_for_capacity() {
    let ours = |keys: serde_json::Value| {
        parsed::<CachedCsiNode>(csinode(
            "n1",
            json!([{"name": "d", "topologyKeys": keys}, {"name": "other", "topologyKeys": ["x"]}]),
        ))
    };
    let theirs = |keys: serde_json::Value| {
        parsed::<CachedCsiNode>(csinode(
            "n1",
            json!([{"name": "other", "topologyKeys": keys}]),
        ))
    };
    let zone = ours(json!(["zone"]));
    assert!(!driver_keys_changed(
        "d",
        Some(&zone),
        Some(&ours(json!(["zone"])))
    ));
    assert!(driver_keys_changed(
        "d",
        Some(&zone),
        Some(&ours(json!(["zone", "rack"])))
    ));
    assert!(driver_keys_changed(
        "d",
        Some(&zone),
        Some(&ours(json!(null)))
    ));
    assert!(driver_keys_changed("d", Some(&zone), None));
    assert!(driver_keys_changed("d", None, Some(&zone)));
    assert!(driver_keys_changed(
        "d",
        Some(&theirs(json!(["x"]))),
        Some(&zone)
    ));
    assert!(!driver_keys_changed(
        "d",
        Some(&theirs(json!(["x"]))),
        Some(&theirs(json!(["y"])))
    ));
    assert!(!driver_keys_changed("d", None, Some(&theirs(json!(["x"])))));
}

fn cache() -> TopologyCache {
    let nodes = store(vec![
        node("n1", json!({"zone": "z1", "rack": "r1", "other": "x"})),
        node("n2", json!({"zone": "z2"})),
        node("n3", json!({})),
    ]);
    let csinodes = store(vec![
        csinode(
            "n2",
            json!([{"name": "d", "nodeID": "n2", "topologyKeys": ["zone"]}]),
        ),
        csinode(
            "n1",
            json!([
                {"name": "other", "nodeID": "n1", "topologyKeys": ["x"]},
                {"name": "d", "nodeID": "n1", "topologyKeys": ["zone", "rack"]},
            ]),
        ),
        csinode("n3", json!([{"name": "other", "nodeID": "n3"}])),
    ]);
    TopologyCache::from_stores(nodes, csinodes, "d")
}

#[test]
fn csinode_keys_are_our_drivers_and_none_only_without_the_object() {
    let cache = cache();
    assert_eq!(
        cache.csinode_keys("n1"),
        Some(vec!["zone".into(), "rack".into()])
    );
    assert_eq!(cache.csinode_keys("n3"), Some(vec![]));
    assert_eq!(cache.csinode_keys("gone"), None);
}

#[test]
fn any_csinode_keys_is_the_first_by_name_with_keys() {
    assert_eq!(
        cache().any_csinode_keys(),
        Some(vec!["zone".into(), "rack".into()])
    );
}

#[test]
fn node_labels_are_kept_whole_and_nothing_else() {
    let cache = cache();
    let labels = cache.node_labels("n1").unwrap();
    assert_eq!(labels.len(), 3);
    assert_eq!(cache.node_labels("n3"), Some(BTreeMap::new()));
    assert_eq!(cache.node_labels("gone"), None);
    let cached = cache.nodes.get(&ObjectRef::new("n1")).unwrap();
    assert!(cached.metadata.managed_fields.is_none());
}

#[test]
fn node_segments_are_the_nodes_carrying_every_key() {
    let cache = cache();
    let mut segments = cache.node_segments(&["zone".into()]);
    segments.sort();
    assert_eq!(
        segments,
        vec![
            BTreeMap::from([("zone".into(), "z1".into())]),
            BTreeMap::from([("zone".into(), "z2".into())]),
        ]
    );
    assert_eq!(
        cache.node_segments(&["zone".into(), "rack".into()]),
        vec![BTreeMap::from([
            ("rack".into(), "r1".into()),
            ("zone".into(), "z1".into())
        ])]
    );
}

/// Every reconcile of a claim with topology waits for the stores; before they listed, all
/// of them must go on once they have (kube-runtime's readiness alone woke only the last).
#[tokio::test]
async fn every_concurrent_waiter_goes_on_once_both_stores_listed() {
    let (nodes, mut node_writer) = kube::runtime::reflector::store();
    let (csinodes, mut csinode_writer) = kube::runtime::reflector::store();
    let cache = TopologyCache::from_stores(nodes, csinodes, "d.example.com");
    let waiters: Vec<_> = (0..4)
        .map(|_| {
            let cache = cache.clone();
            tokio::spawn(async move { cache.wait_until_ready().await })
        })
        .collect();
    // Each waiter polls once and waits.
    tokio::task::yield_now().await;
    node_writer.apply_watcher_event(&Event::InitDone);
    csinode_writer.apply_watcher_event(&Event::InitDone);
    for waiter in waiters {
        let ready = tokio::time::timeout(std::time::Duration::from_secs(10), waiter)
            .await
            .expect("a waiter was never woken")
            .expect("waiter task");
        assert!(ready);
    }
}
