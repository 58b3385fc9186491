//! Topology and WaitForFirstConsumer end to end, on the real control plane with kube-scheduler:
//! the accessibility requirements of each CreateVolume the driver received (upstream v6.3's
//! rules, docs/flags.md "Topology and WaitForFirstConsumer"), the PV's node affinity from the
//! segment the driver chose, the reschedule after ResourceExhausted, the node kept when a volume
//! may exist (docs/journal.md, rule 11), and the events for input no request can be made from.
//!
//! Isolation: the sidecar builds an Immediate claim's requisite from every Node carrying the
//! driver's topology keys, whatever test made it, so each test uses keys of its own
//! ([`zone_key`]) and a driver of its own; its Nodes and pods are its own (support::topology).

use csi_test_support as support;

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    PersistentVolume, PersistentVolumeClaim, TopologySelectorLabelRequirement, TopologySelectorTerm,
};
use kube::api::ObjectMeta;

use support::cluster::{
    Cluster, claim, create_claim, create_class, events_of, journal_operations, pv_name,
    storage_class, summarize, wait_bound, wait_event,
};
use support::mock_driver::{MockDriver, MockDriverOptions};
use support::peers::{
    CreateRequest, CsiEndpoint, Driver, Requirements, Segments, Sidecar, TIMEOUT,
};
use support::topology::{ANN_SELECTED_NODE, Topology, pv_segments, scheduling_cluster};

const RETRIES: [&str; 2] = ["--retry-interval-start=200ms", "--retry-interval-max=2s"];
const ZONES: [&str; 3] = ["z1", "z2", "z3"];

// ------------------------------------------------------------------------------ helpers

/// This test's zone key. The namespace is unique within the test binary and short enough for a
/// key prefix (at most 63 characters).
fn zone_key(cluster: &Cluster) -> String {
    format!("{}.example/zone", cluster.ns())
}

fn segment(key: &str, value: &str) -> Segments {
    BTreeMap::from([(key.to_owned(), value.to_owned())])
}

fn segments(key: &str, zones: &[&str]) -> Vec<Segments> {
    zones.iter().map(|zone| segment(key, zone)).collect()
}

/// `--segment <key>=<zone>` for each zone, in this order of preference, each of the driver's
/// default capacity.
fn segment_flags(key: &str, zones: &[&str]) -> Vec<String> {
    zones
        .iter()
        .flat_map(|zone| ["--segment".to_owned(), format!("{key}={zone}")])
        .collect()
}

fn strs(flags: &[String]) -> Vec<&str> {
    flags.iter().map(String::as_str).collect()
}

/// A reference driver serving one segment per zone.
async fn zone_driver(key: &str, zones: &[&str], extra: &[&str]) -> Driver {
    let mut flags = segment_flags(key, zones);
    flags.extend(extra.iter().map(|flag| (*flag).to_owned()));
    Driver::start(&strs(&flags)).await
}

/// A sidecar with quick retries and `extra` flags. Claims are created while it starts on
/// purpose: claims reconciled before the Node and CSINode stores listed once waited on the
/// stores' readiness, which woke only the last waiter, and never reached the driver
/// (`controller::cache::listed` wakes them all).
async fn sidecar(driver: &impl CsiEndpoint, extra: &[&str]) -> Sidecar {
    Sidecar::start(driver, &[&RETRIES[..], extra].concat())
}

/// One Node `node-<zone>` per zone, labelled `key=<zone>`, with its CSINode registering
/// `driver` with the topology key `key`; returns the zone of each Node, by name.
async fn zone_nodes(
    topology: &Topology,
    driver: &str,
    key: &str,
    zones: &[&str],
) -> BTreeMap<String, String> {
    let mut nodes = BTreeMap::new();
    for zone in zones {
        let node = topology
            .create_node(&format!("node-{zone}"), &[(key, zone)])
            .await;
        topology
            .create_csi_node(&node, driver, &format!("id-{node}"), &[key])
            .await;
        nodes.insert(node, (*zone).to_owned());
    }
    nodes
}

/// A class of `driver` with `allowedTopologies` of one term (`key` in `values` for each pair).
async fn class_allowing(
    cluster: &Cluster,
    suffix: &str,
    driver: &impl CsiEndpoint,
    binding_mode: &str,
    allowed: &[(&str, &[&str])],
) -> String {
    let name = format!("{}-{suffix}", cluster.ns());
    let mut class = storage_class(&name, driver, "Delete", &[]);
    class.volume_binding_mode = Some(binding_mode.to_owned());
    class.allowed_topologies = Some(vec![TopologySelectorTerm {
        match_label_expressions: Some(
            allowed
                .iter()
                .map(|(key, values)| TopologySelectorLabelRequirement {
                    key: (*key).to_owned(),
                    values: values.iter().map(|v| (*v).to_owned()).collect(),
                })
                .collect(),
        ),
    }]);
    create_class(&cluster.client, &class).await;
    name
}

/// A claim whose selected node is set by hand (as the scheduler would, for a node it could not
/// choose itself).
async fn claim_on_node(cluster: &Cluster, name: &str, class: &str, node: &str) {
    let mut pvc = claim(name, class, "1Gi", None);
    pvc.metadata = ObjectMeta {
        annotations: Some(BTreeMap::from([(
            ANN_SELECTED_NODE.to_owned(),
            node.to_owned(),
        )])),
        ..pvc.metadata
    };
    create_claim(&cluster.claims, &pvc).await;
}

/// Waits until the claim is Bound; returns its PV.
async fn bound_pv(cluster: &Cluster, name: &str) -> (PersistentVolumeClaim, PersistentVolume) {
    let pvc = wait_bound(&cluster.claims, name).await;
    let pv = cluster.pv(&pv_name(&pvc)).await;
    (pvc, pv)
}

/// The CreateVolume requests the driver received for `volume`, oldest first.
fn requests_for(driver: &Driver, volume: &str) -> Vec<CreateRequest> {
    driver
        .create_requests()
        .into_iter()
        .filter(|request| request.name == volume)
        .collect()
}

/// The requirements of the one CreateVolume sent for `volume`.
fn only_requirements(driver: &Driver, volume: &str) -> Option<Requirements> {
    let requests = requests_for(driver, volume);
    assert_eq!(requests.len(), 1, "CreateVolume for {volume}: {requests:?}");
    requests[0].requirements.clone()
}

/// `terms` rotated left by `by`.
fn rotated(terms: &[Segments], by: usize) -> Vec<Segments> {
    let mut rotated = terms.to_vec();
    rotated.rotate_left(by % terms.len());
    rotated
}

/// FNV-1 (not 1a), 32 bits: the StatefulSet rule's hash (upstream-advanced.md §1.5).
fn fnv1_32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(2_166_136_261_u32, |hash, byte| {
        hash.wrapping_mul(16_777_619) ^ u32::from(*byte)
    })
}

/// The driver received no CreateVolume and holds no volume; the sidecar still runs.
fn assert_nothing_created(driver: &Driver, sidecar: &mut Sidecar) {
    assert_eq!(driver.create_requests(), Vec::new());
    assert_eq!(driver.volume_count(), 0);
    sidecar.assert_running();
}

/// Waits for a ProvisioningFailed event on `claim` containing `text`; returns its message.
async fn failed_with(cluster: &Cluster, claim: &str, text: &str) -> String {
    wait_event(
        &cluster.client,
        cluster.ns(),
        claim,
        "ProvisioningFailed",
        |message| message.contains(text),
    )
    .await
    .message
    .unwrap_or_default()
}

// ------------------------------------------------------------------------------ Immediate

#[tokio::test]
async fn immediate_claims_require_every_zone_and_prefer_by_the_statefulset_rule() {
    let (cluster, topology) = scheduling_cluster("topo-imm").await;
    let key = zone_key(&cluster);
    let driver = zone_driver(&key, &ZONES, &[]).await;
    zone_nodes(&topology, driver.name(), &key, &ZONES).await;
    let _sidecar = sidecar(&driver, &[]).await;
    let class = cluster.class("imm", &driver, "Delete", &[]).await;

    let claims = cluster.claims_named("data-web", &class, 3).await;

    // §1.5: `data-web-<i>` hashes "web" and adds the ordinal i.
    let hash = fnv1_32(b"web");
    assert_eq!(hash, 1_181_096_325, "the reference's FNV-1 of \"web\"");
    let all = segments(&key, &ZONES);
    let mut first_preferred = BTreeSet::new();
    for (ordinal, name) in claims.iter().enumerate() {
        let (pvc, pv) = bound_pv(&cluster, name).await;
        let offset = (hash.wrapping_add(ordinal as u32) % 3) as usize;
        let preferred = rotated(&all, offset);
        assert_eq!(
            only_requirements(&driver, &pv_name(&pvc)),
            Some(Requirements {
                requisite: all.clone(),
                preferred: preferred.clone(),
            }),
            "claim {name}"
        );
        // The driver takes the first preferred segment with room; the PV says where it is.
        assert_eq!(pv_segments(&pv), vec![preferred[0].clone()], "PV of {name}");
        first_preferred.insert(preferred[0].clone());
    }
    assert_eq!(first_preferred.len(), 3, "{first_preferred:?}");
}

#[tokio::test]
async fn immediate_topology_off_sends_no_requirements() {
    let (cluster, topology) = scheduling_cluster("topo-imm-off").await;
    let key = zone_key(&cluster);
    let driver = zone_driver(&key, &ZONES, &[]).await;
    zone_nodes(&topology, driver.name(), &key, &ZONES).await;
    let _sidecar = sidecar(&driver, &["--immediate-topology=false"]).await;
    let class = cluster.class("imm", &driver, "Delete", &[]).await;

    cluster.claim("data", &class).await;

    let (pvc, pv) = bound_pv(&cluster, "data").await;
    assert_eq!(only_requirements(&driver, &pv_name(&pvc)), None);
    // Without requirements the driver uses its first segment, and reports it.
    assert_eq!(pv_segments(&pv), vec![segment(&key, "z1")]);
}

#[tokio::test]
async fn allowed_topologies_confine_an_immediate_claim_to_their_zone() {
    let (cluster, topology) = scheduling_cluster("topo-allowed").await;
    let key = zone_key(&cluster);
    let driver = zone_driver(&key, &ZONES, &[]).await;
    zone_nodes(&topology, driver.name(), &key, &ZONES).await;
    let _sidecar = sidecar(&driver, &[]).await;
    let class = class_allowing(&cluster, "z2", &driver, "Immediate", &[(&key, &["z2"])]).await;

    cluster.claim("data", &class).await;

    let (pvc, pv) = bound_pv(&cluster, "data").await;
    let z2 = segments(&key, &["z2"]);
    assert_eq!(
        only_requirements(&driver, &pv_name(&pvc)),
        Some(Requirements {
            requisite: z2.clone(),
            preferred: z2.clone(),
        })
    );
    assert_eq!(pv_segments(&pv), z2);
    assert_eq!(driver.volumes()[0].topology, z2[0]);
}

// ------------------------------------------------------------------------------ WaitForFirstConsumer

/// A pod with a WaitForFirstConsumer claim, three Nodes in three zones: the volume is made in
/// the zone of the node kube-scheduler chose, and the pod is bound there.
async fn scheduled_claim_case(prefix: &str, strict: bool) {
    let (cluster, topology) = scheduling_cluster(prefix).await;
    let key = zone_key(&cluster);
    let driver = zone_driver(&key, &ZONES, &[]).await;
    let nodes = zone_nodes(&topology, driver.name(), &key, &ZONES).await;
    let flags: &[&str] = if strict { &["--strict-topology"] } else { &[] };
    let _sidecar = sidecar(&driver, flags).await;
    let class = topology.wffc_class("wffc", driver.name()).await;
    cluster.claim("data", &class).await;

    topology.create_pod("app", &["data"], &[]).await;

    let node = topology.wait_selected_node("data").await;
    let zone = nodes
        .get(&node)
        .unwrap_or_else(|| panic!("selected node {node} is not one of {nodes:?}"));
    let (pvc, pv) = bound_pv(&cluster, "data").await;
    let expected = if strict {
        Requirements {
            requisite: segments(&key, &[zone]),
            preferred: segments(&key, &[zone]),
        }
    } else {
        // Every zone, sorted; preferred rotated to start at the selected node's zone.
        let all = segments(&key, &ZONES);
        let position = ZONES.iter().position(|z| z == zone).expect("a known zone");
        Requirements {
            preferred: rotated(&all, position),
            requisite: all,
        }
    };
    assert_eq!(
        only_requirements(&driver, &pv_name(&pvc)),
        Some(expected),
        "selected node {node}"
    );
    assert_eq!(pv_segments(&pv), segments(&key, &[zone]));
    assert_eq!(topology.wait_pod_scheduled("app").await, node);
}

#[tokio::test]
async fn wffc_prefers_the_zone_of_the_node_the_scheduler_chose() {
    scheduled_claim_case("topo-wffc", false).await;
}

#[tokio::test]
async fn wffc_strict_topology_requires_only_the_chosen_nodes_zone() {
    scheduled_claim_case("topo-strict", true).await;
}

#[tokio::test]
async fn a_full_zone_gives_the_node_back_and_the_pod_lands_in_another() {
    let (cluster, topology) = scheduling_cluster("topo-resched").await;
    let key = zone_key(&cluster);
    // Zone a cannot hold a 1Gi volume.
    let driver = Driver::start(&strs(&[
        "--segment".to_owned(),
        format!("{key}=za:1Ki"),
        "--segment".to_owned(),
        format!("{key}=zb"),
    ]))
    .await;
    let first = zone_nodes(&topology, driver.name(), &key, &["za"]).await;
    let first = first.keys().next().expect("one node").clone();
    let _sidecar = sidecar(&driver, &[]).await;
    let class = topology.wffc_class("wffc", driver.name()).await;
    cluster.claim("data", &class).await;

    topology.create_pod("app", &["data"], &[]).await;
    assert_eq!(topology.wait_selected_node("data").await, first);
    // The pod is held on that node until its claim is provisioned; from now on the scheduler
    // can choose no other node than one made below, so the claim's node can only go away if
    // the sidecar removes it.
    topology.cordon(&first).await;

    let message = failed_with(&cluster, "data", "ResourceExhausted").await;
    support::eventually(
        "the sidecar to remove the selected node",
        TIMEOUT,
        || async {
            match topology.selected_node("data").await {
                None => Ok(()),
                Some(node) => Err(format!("still {node}")),
            }
        },
    )
    .await;
    let second = zone_nodes(&topology, driver.name(), &key, &["zb"]).await;
    let second = second.keys().next().expect("one node").clone();

    let (pvc, pv) = bound_pv(&cluster, "data").await;
    assert_eq!(topology.wait_pod_scheduled("app").await, second);
    assert_eq!(pv_segments(&pv), segments(&key, &["zb"]));
    let requests = requests_for(&driver, &pv_name(&pvc));
    let first_request = requests[0].requirements.clone().expect("requirements");
    assert_eq!(
        first_request.requisite,
        segments(&key, &["za"]),
        "{message}"
    );
    let last_request = requests
        .last()
        .and_then(|request| request.requirements.clone())
        .expect("requirements");
    assert_eq!(last_request.preferred[0], segment(&key, "zb"));
    let volumes = driver.volumes();
    assert_eq!(volumes.len(), 1, "{volumes:?}");
    assert_eq!(volumes[0].topology, segment(&key, "zb"));
}

// ------------------------------------------------------------------------------ journal, rule 11

#[tokio::test]
async fn a_node_whose_volume_may_exist_is_kept_after_resource_exhausted() {
    let (cluster, topology) = scheduling_cluster("topo-kept").await;
    let key = zone_key(&cluster);
    // The first call creates the volume but reports a timeout; the retry (which finds the
    // volume) is told ResourceExhausted; the third succeeds.
    let driver = zone_driver(
        &key,
        &["za", "zb"],
        &[
            "--fault",
            "CreateVolume=after:deadline-exceeded:1",
            "--fault",
            "CreateVolume=after:resource-exhausted:1",
        ],
    )
    .await;
    let nodes = zone_nodes(&topology, driver.name(), &key, &["za", "zb"]).await;
    let mut sidecar = sidecar(&driver, &[]).await;
    let class = topology.wffc_class("wffc", driver.name()).await;
    cluster.claim("data", &class).await;

    topology.create_pod("app", &["data"], &[]).await;
    let node = topology.wait_selected_node("data").await;
    let zone = &nodes[&node];

    let message = failed_with(&cluster, "data", "keeps that node").await;
    assert!(message.contains("ResourceExhausted"), "{message}");
    assert_eq!(
        topology.selected_node("data").await.as_deref(),
        Some(node.as_str()),
        "the selected node was removed"
    );

    let (pvc, pv) = bound_pv(&cluster, "data").await;
    assert_eq!(topology.wait_pod_scheduled("app").await, node);
    assert_eq!(pv_segments(&pv), segments(&key, &[zone]));
    let codes: Vec<String> = driver
        .calls("CreateVolume")
        .into_iter()
        .map(|call| call.code)
        .collect();
    assert_eq!(codes, ["DeadlineExceeded", "ResourceExhausted", "Ok"]);
    let requests = driver.create_requests();
    assert!(
        requests.iter().all(|request| request == &requests[0]),
        "the request changed: {requests:?}"
    );
    assert_eq!(requests[0].name, pv_name(&pvc));
    let volumes = driver.volumes();
    assert_eq!(volumes.len(), 1, "{volumes:?}");
    assert_eq!(volumes[0].topology, segment(&key, zone));
    sidecar.assert_running();
}

#[tokio::test]
async fn a_claim_whose_pod_is_deleted_during_create_volume_is_still_provisioned() {
    let (cluster, topology) = scheduling_cluster("topo-pod-gone").await;
    let key = zone_key(&cluster);
    let driver = zone_driver(&key, &["za"], &["--delay", "CreateVolume=5s"]).await;
    zone_nodes(&topology, driver.name(), &key, &["za"]).await;
    let _sidecar = sidecar(&driver, &[]).await;
    let class = topology.wffc_class("wffc", driver.name()).await;
    let volume = pv_name(&cluster.claim("data", &class).await);

    topology.create_pod("app", &["data"], &[]).await;
    driver.wait_create_received(&volume).await;
    topology.delete_pod("app").await;
    assert!(
        driver.calls("CreateVolume").is_empty(),
        "CreateVolume finished before the pod was deleted"
    );

    let (_, pv) = bound_pv(&cluster, "data").await;
    assert_eq!(pv_segments(&pv), segments(&key, &["za"]));
    assert_eq!(driver.volume_count(), 1);

    cluster.delete_claim("data").await;
    cluster.wait_pv_gone(&volume).await;
    support::eventually("the driver to delete the volume", TIMEOUT, || async {
        match driver.volumes() {
            volumes if volumes.is_empty() => Ok(()),
            volumes => Err(format!("{volumes:?}")),
        }
    })
    .await;
}

// ------------------------------------------------------------------------------ bad input

#[tokio::test]
async fn bad_input_allowed_topology_on_a_key_the_driver_lacks() {
    let (cluster, topology) = scheduling_cluster("topo-bad-key").await;
    let key = zone_key(&cluster);
    let rack = format!("{}.example/rack", cluster.ns());
    let driver = zone_driver(&key, &["za"], &[]).await;
    // The Node has the rack label, so the scheduler may choose it; the driver registered only
    // the zone key.
    let node = topology
        .create_node("node-za", &[(&key, "za"), (&rack, "r1")])
        .await;
    topology
        .create_csi_node(&node, driver.name(), "id", &[&key])
        .await;
    let mut sidecar = sidecar(&driver, &[]).await;
    let class = class_allowing(
        &cluster,
        "rack",
        &driver,
        "WaitForFirstConsumer",
        &[(&rack, &["r1"])],
    )
    .await;
    cluster.claim("data", &class).await;

    topology.create_pod("app", &["data"], &[]).await;
    assert_eq!(topology.wait_selected_node("data").await, node);

    let message = failed_with(&cluster, "data", "is not in requisite").await;
    assert!(
        message.contains(&format!("from selected node {node:?}")) && message.contains(&rack),
        "{message}"
    );
    assert_eq!(topology.selected_node("data").await, Some(node));
    assert_nothing_created(&driver, &mut sidecar);
}

#[tokio::test]
async fn bad_input_a_selected_node_without_csinode_is_given_back() {
    let (cluster, topology) = scheduling_cluster("topo-bad-ghost").await;
    let key = zone_key(&cluster);
    let driver = zone_driver(&key, &["za"], &[]).await;
    let mut sidecar = sidecar(&driver, &[]).await;
    let class = topology.wffc_class("wffc", driver.name()).await;
    let ghost = topology.node_name("ghost");

    claim_on_node(&cluster, "data", &class, &ghost).await;

    let message = failed_with(&cluster, "data", "failed to get selected CSINode").await;
    assert!(message.contains(&ghost), "{message}");
    support::eventually(
        "the sidecar to remove the selected node",
        TIMEOUT,
        || async {
            match topology.selected_node("data").await {
                None => Ok(()),
                Some(node) => Err(format!("still {node}")),
            }
        },
    )
    .await;
    assert_nothing_created(&driver, &mut sidecar);
}

#[tokio::test]
async fn bad_input_a_node_without_one_of_the_csinode_keys() {
    let (cluster, topology) = scheduling_cluster("topo-bad-labels").await;
    let key = zone_key(&cluster);
    let rack = format!("{}.example/rack", cluster.ns());
    let driver = zone_driver(&key, &["za"], &[]).await;
    let node = topology.create_node("node-za", &[(&key, "za")]).await;
    topology
        .create_csi_node(&node, driver.name(), "id", &[&key, &rack])
        .await;
    let mut sidecar = sidecar(&driver, &[]).await;
    let class = topology.wffc_class("wffc", driver.name()).await;

    claim_on_node(&cluster, "data", &class, &node).await;

    let message = failed_with(
        &cluster,
        "data",
        "does not match topology keys from CSINode",
    )
    .await;
    assert!(message.contains(&rack), "{message}");
    assert_eq!(topology.selected_node("data").await, Some(node));
    assert_nothing_created(&driver, &mut sidecar);
}

#[tokio::test]
async fn bad_input_strict_topology_and_a_node_outside_the_allowed_topologies() {
    let (cluster, topology) = scheduling_cluster("topo-bad-strict").await;
    let key = zone_key(&cluster);
    let driver = zone_driver(&key, &ZONES, &[]).await;
    let nodes = zone_nodes(&topology, driver.name(), &key, &["z1"]).await;
    let node = nodes.keys().next().expect("one node").clone();
    let mut sidecar = sidecar(&driver, &["--strict-topology"]).await;
    let class = class_allowing(
        &cluster,
        "z2",
        &driver,
        "WaitForFirstConsumer",
        &[(&key, &["z2"])],
    )
    .await;

    // The scheduler would not choose a node outside the allowed topologies.
    claim_on_node(&cluster, "data", &class, &node).await;

    let message = failed_with(&cluster, "data", "is not in allowed topologies").await;
    assert!(message.contains(&node), "{message}");
    assert_nothing_created(&driver, &mut sidecar);
}

#[tokio::test]
async fn bad_input_a_driver_that_returns_no_accessible_topology() {
    let (cluster, topology) = scheduling_cluster("topo-bad-none").await;
    let key = zone_key(&cluster);
    let mut driver = zone_driver(&key, &["z1"], &[]).await;
    zone_nodes(&topology, driver.name(), &key, &["z1"]).await;
    let mut sidecar = sidecar(&driver, &[]).await;
    // Once the sidecar has learned that the driver has topology (it asks at start, before it
    // loads the journal), the driver runs without any: it ignores the requirements and returns
    // volumes without accessible topology.
    support::eventually("the sidecar to load its journal", TIMEOUT, || async {
        sidecar
            .has_loaded_journal()
            .then_some(())
            .ok_or_else(|| "journal not loaded".to_owned())
    })
    .await;
    driver.restart_with(&[]).await;
    let class = cluster.class("imm", &driver, "Delete", &[]).await;

    cluster.claim("data", &class).await;

    let event = wait_event(
        &cluster.client,
        cluster.ns(),
        "data",
        "NoAccessibleTopology",
        |_| true,
    )
    .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    let (pvc, pv) = bound_pv(&cluster, "data").await;
    assert!(
        event
            .message
            .as_deref()
            .is_some_and(|m| m.contains(&pv_name(&pvc))),
        "{event:?}"
    );
    assert_eq!(
        only_requirements(&driver, &pv_name(&pvc)).map(|r| r.requisite),
        Some(segments(&key, &["z1"]))
    );
    assert_eq!(pv.spec.and_then(|spec| spec.node_affinity), None);
    sidecar.assert_running();
}

#[tokio::test]
async fn bad_input_a_node_label_value_the_csi_spec_forbids() {
    let (cluster, topology) = scheduling_cluster("topo-bad-value").await;
    let key = zone_key(&cluster);
    let driver = zone_driver(&key, &["za"], &[]).await;
    // Kubernetes takes an empty label value; the CSI spec wants 1 to 63 characters. (A value
    // of 64 characters is refused by the API server already.)
    let node = topology.create_node("node-empty", &[(&key, "")]).await;
    topology
        .create_csi_node(&node, driver.name(), "id", &[&key])
        .await;
    let mut sidecar = sidecar(&driver, &[]).await;
    let class = topology.wffc_class("wffc", driver.name()).await;
    cluster.claim("data", &class).await;

    topology.create_pod("app", &["data"], &[]).await;
    assert_eq!(topology.wait_selected_node("data").await, node);

    let message = failed_with(
        &cluster,
        "data",
        &format!("topology value \"\" of key {key:?}"),
    )
    .await;
    assert!(message.contains("CSI spec"), "{message}");
    assert_nothing_created(&driver, &mut sidecar);
}

// ------------------------------------------------------------------------------ mock driver

/// The Kubernetes e2e mock's one fixed segment.
const MOCK_KEY: &str = "io.kubernetes.storage.mock/node";
const MOCK_VALUE: &str = "some-mock-node";

/// `{requisite, preferred}` of a CreateVolume request the mock logged (protojson).
fn mock_requirements(request: &serde_json::Value) -> Option<Requirements> {
    let requirements = request.get("accessibility_requirements")?;
    let terms = |field: &str| -> Vec<Segments> {
        requirements
            .get(field)
            .and_then(serde_json::Value::as_array)
            .into_iter()
            .flatten()
            .map(|term| {
                term.get("segments")
                    .and_then(serde_json::Value::as_object)
                    .into_iter()
                    .flatten()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                    .collect()
            })
            .collect()
    };
    Some(Requirements {
        requisite: terms("requisite"),
        preferred: terms("preferred"),
    })
}

#[tokio::test]
async fn mock_driver_immediate_and_wffc_claims_get_its_segment() {
    let (cluster, topology) = scheduling_cluster("topo-mock").await;
    let driver = MockDriver::start(MockDriverOptions {
        topology: true,
        attach_required: false,
        ..MockDriverOptions::default()
    })
    .await;
    // The only Node of the binary with the mock's key: an Immediate claim's requisite is built
    // from every such Node.
    let node = topology
        .create_node("mock", &[(MOCK_KEY, MOCK_VALUE)])
        .await;
    topology
        .create_csi_node(&node, driver.name(), "mock-node-id", &[MOCK_KEY])
        .await;
    let mut sidecar = sidecar(&driver, &[]).await;
    let immediate = cluster.class("imm", &driver, "Delete", &[]).await;
    let wffc = topology.wffc_class("wffc", driver.name()).await;

    cluster.claim("fast", &immediate).await;
    cluster.claim("slow", &wffc).await;
    topology.create_pod("app", &["slow"], &[]).await;

    let mock_segment = vec![segment(MOCK_KEY, MOCK_VALUE)];
    for name in ["fast", "slow"] {
        let (pvc, pv) = bound_pv(&cluster, name).await;
        let volume = pv_name(&pvc);
        let requests: Vec<serde_json::Value> = driver
            .create_volume_requests()
            .into_iter()
            .filter(|request| request.get("name").and_then(|n| n.as_str()) == Some(&volume))
            .collect();
        assert_eq!(requests.len(), 1, "{requests:?}");
        assert_eq!(
            mock_requirements(&requests[0]),
            Some(Requirements {
                requisite: mock_segment.clone(),
                preferred: mock_segment.clone(),
            }),
            "claim {name}"
        );
        assert_eq!(pv_segments(&pv), mock_segment, "PV of {name}");
    }
    assert_eq!(topology.wait_pod_scheduled("app").await, node);
    let events = events_of(&cluster.client, cluster.ns(), "slow")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        !events
            .iter()
            .any(|e| e.reason.as_deref() == Some("ProvisioningFailed")),
        "{}",
        summarize(&events)
    );
    sidecar.assert_running();
}

// ------------------------------------------------------------------------------ journal, rule 15

/// Issue #31, hole 2: a first CreateVolume the driver refuses with ResourceExhausted created
/// nothing, so its operation ends and the node goes back to the scheduler, in that order: the
/// record's removal is stored before the node is given back. A removal still held back then
/// (the journal writes removals lazily) would be lost to a crash, and the record reloaded as
/// "may exist" would pin the claim to the full zone forever.
#[tokio::test]
async fn a_full_zone_is_given_back_only_once_the_operations_end_is_stored() {
    let (cluster, topology) = scheduling_cluster("topo-settled").await;
    let key = zone_key(&cluster);
    let driver = zone_driver(
        &key,
        &["za"],
        &["--fault", "CreateVolume=before:resource-exhausted"],
    )
    .await;
    let nodes = zone_nodes(&topology, driver.name(), &key, &["za"]).await;
    let node = nodes.keys().next().expect("one node").clone();
    let namespace = format!("--leader-election-namespace={}", cluster.ns());
    let mut sidecar = sidecar(&driver, &[&namespace]).await;
    let class = topology.wffc_class("wffc", driver.name()).await;
    claim_on_node(&cluster, "data", &class, &node).await;

    support::eventually("the node to be given back", TIMEOUT, || async {
        match topology.selected_node("data").await {
            None => Ok(()),
            Some(node) => Err(format!("still {node}")),
        }
    })
    .await;
    // At once: the journal's lazy flush would come within seconds.
    let operations = journal_operations(&cluster.client, cluster.ns(), &driver)
        .await
        .expect("the journal lists");
    assert!(
        operations.is_empty(),
        "still recorded: {operations:?}\n{}",
        sidecar.log()
    );
    assert_eq!(driver.calls("CreateVolume").len(), 1);
    sidecar.assert_running();
}
