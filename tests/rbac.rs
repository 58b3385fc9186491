//! The shipped RBAC (deploy/, rendered by `kubectl kustomize`) is exactly what the sidecar
//! needs. The rendered objects are applied to the local control plane in a test namespace, and
//! the sidecar (support::peers) runs as the deploy/ ServiceAccount with a TokenRequest token.
//! It provisions, deletes and leads with those rights. Every API request it sends is read from
//! its log and compared with the rules, so a missing rule fails (403) and so does a rule nothing
//! uses. A second test removes one verb and shows that provisioning then fails as forbidden.

use csi_test_support as support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

use csi_provisioner::journal::Phase;
use k8s_openapi::api::core::v1::{
    ConfigMap, Node, PersistentVolume, PersistentVolumeClaim, Pod, Secret,
};
use k8s_openapi::api::storage::v1::{CSINode, CSIStorageCapacity, StorageClass};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};
use nix::sys::signal::Signal;
use serde_json::Value;

use support::cluster::{
    attributes_class_claim, claim, consistent_claim, create_attributes_class, create_claim,
    create_class, delete_attributes_class, events_of, journal_operations, lease_holder, pv_name,
    storage_class, summarize, wait_bound, wait_event,
};
use support::manifests::{
    Permission, adapt, apply, granted, kind, permission, render, service_account_kubeconfig,
};
use support::peers::{Driver, Sidecar, SidecarOptions, TIMEOUT, describe};

/// deploy/ of the work tree under test (found at run time: `csi_testbed::workspace::root`).
fn deploy_dir() -> PathBuf {
    csi_testbed::workspace::root().join("deploy")
}
const SERVICE_ACCOUNT: &str = "csi-provisioner";
/// Files of deploy/ holding RBAC rules; each rule must say why it exists.
const RULE_FILES: [&str; 5] = [
    "base/clusterrole.yaml",
    "base/role.yaml",
    "node/clusterrole.yaml",
    "node/role.yaml",
    "upgrade/rbac.yaml",
];
/// Kinds the tests create for real; the rest of deploy/ is only validated (dry run).
const APPLIED_KINDS: [&str; 7] = [
    "CustomResourceDefinition",
    "Namespace",
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
];
/// Granted permissions the end-to-end run cannot exercise cheaply, each with the reason it is
/// still needed. Everything else granted must show up in the sidecar's requests.
/// Why the capacity grants are not exercised here.
const NOT_EXERCISED: [(&str, &str, &str, &str); 14] = [
    (
        "provisioner.csi-rs.dev",
        "provisioningjournals",
        "get",
        "journal/writer.rs re-reads a shard only after a conflicting or failed write, or a change \
         seen by the watch that is not its own write (a previous leader or an admin wrote it); \
         tests/journal.rs deletes and edits shards under a running sidecar",
    ),
    (
        "coordination.k8s.io",
        "leases",
        "watch",
        "leader.rs watches the Lease only while another replica holds it; this test runs one \
         replica (tests/leader_election.rs runs two)",
    ),
    ("", "persistentvolumeclaims", "list", LISTED_ONLY),
    ("", "persistentvolumes", "list", LISTED_ONLY),
    ("storage.k8s.io", "storageclasses", "list", LISTED_ONLY),
    ("storage.k8s.io", "volumeattachments", "list", LISTED_ONLY),
    ("", "nodes", "list", LISTED_ONLY),
    ("storage.k8s.io", "csinodes", "list", LISTED_ONLY),
    (SNAPSHOTS, "volumesnapshots", "get", NO_SNAPSHOT_CRDS),
    (SNAPSHOTS, "volumesnapshots", "list", NO_SNAPSHOT_CRDS),
    (SNAPSHOTS, "volumesnapshots", "patch", NO_SNAPSHOT_CRDS),
    (SNAPSHOTS, "volumesnapshotcontents", "get", NO_SNAPSHOT_CRDS),
    (
        SNAPSHOTS,
        "volumesnapshotcontents",
        "list",
        NO_SNAPSHOT_CRDS,
    ),
    (
        "gateway.networking.k8s.io",
        "referencegrants",
        "list",
        LISTED_ONLY,
    ),
];

const SNAPSHOTS: &str = "snapshot.storage.k8s.io";

/// Why the snapshot grants are not sent here.
const NO_SNAPSHOT_CRDS: &str = "restores (controller/provisioning/sources.rs) and the snapshot \
     orphan sweeper (controller/source_protection/snapshot_sweeper.rs) need the \
     snapshot.storage.k8s.io/v1 CRDs, which this test does not install: the sweeper finds the \
     API not served and does not run";

/// Why the watched kinds' `list` is not sent here.
const LISTED_ONLY: &str = "controller/runtime/cache.rs lists only where the API server does not \
     stream initial lists; this one does (tests/initial_list.rs runs one that does not)";

/// Removes `verb` on `resource` from every rule (the negative test's broken RBAC); a rule left
/// without verbs goes (the API server refuses one).
fn without_verb(objects: &[Value], resource: &str, verb: &str) -> Vec<Value> {
    let mut objects = objects.to_vec();
    for object in &mut objects {
        let Some(rules) = object.get_mut("rules").and_then(Value::as_array_mut) else {
            continue;
        };
        for rule in rules.iter_mut() {
            let names = |key: &str| rule[key].as_array().cloned().unwrap_or_default();
            if names("resources").iter().any(|r| r == resource) {
                let verbs: Vec<Value> = names("verbs").into_iter().filter(|v| v != verb).collect();
                rule["verbs"] = Value::from(verbs);
            }
        }
        rules.retain(|rule| {
            rule["verbs"]
                .as_array()
                .is_none_or(|verbs| !verbs.is_empty())
        });
    }
    objects
}

// ---------------------------------------------------------------------------------------------
// API requests seen in the sidecar's log.

/// The RBAC attributes of one request (`None` for non-resource URLs such as /version).
fn rbac_attributes(method: &str, url: &str) -> Option<Permission> {
    let (path, query) = url.split_once('?').unwrap_or((url, ""));
    let path = path.find("/api").map(|at| &path[at..])?;
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, rest) = match parts.as_slice() {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => return None,
    };
    let rest = match rest {
        ["namespaces", _ns, resource, tail @ ..] => [&[*resource][..], tail].concat(),
        _ => rest.to_vec(),
    };
    let (resource, named) = match rest.as_slice() {
        [resource] => (resource.to_string(), false),
        [resource, _name] => (resource.to_string(), true),
        [resource, _name, sub] => (format!("{resource}/{sub}"), true),
        _ => return None,
    };
    let watch = query
        .split('&')
        .any(|pair| pair == "watch=true" || pair == "watch=1");
    let verb = match (method, named) {
        ("GET", _) if watch => "watch",
        ("GET", true) => "get",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => return None,
    };
    Some(permission(group, &resource, verb))
}

/// Every request the sidecar logged (kube-client's "requesting" line inside its HTTP span).
fn requests_in_log(log: &str) -> BTreeSet<Permission> {
    log.lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|line| line["fields"]["message"] == "requesting")
        .filter_map(|line| {
            let span = &line["span"];
            rbac_attributes(span["http.method"].as_str()?, span["http.url"].as_str()?)
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Tests.

/// The sidecar as the ServiceAccount (a later `--kubeconfig` wins over the admin one peers
/// passes), with JSON logs at -v=4: one line per API request.
fn start_sidecar(driver: &Driver, kubeconfig: &Path, ns: &str, extra: &[&str]) -> Sidecar {
    let mut args = vec![
        format!("--kubeconfig={}", kubeconfig.display()),
        // Where the Lease and the journal live; the Deployment sets POD_NAMESPACE instead,
        // which resolves the same way.
        format!("--leader-election-namespace={ns}"),
        "--logging-format=json".to_owned(),
        "-v=4".to_owned(),
    ];
    args.extend(extra.iter().map(|arg| (*arg).to_owned()));
    Sidecar::start_with(
        driver,
        SidecarOptions {
            args,
            ..SidecarOptions::default()
        },
    )
}

/// Everything deploy/ sets up for the sidecar in a fresh namespace (`broken` edits the rendered
/// objects first), and a kubeconfig of its ServiceAccount in `dir`.
async fn deployed(
    prefix: &str,
    broken: impl Fn(Vec<Value>) -> Vec<Value>,
    dir: &Path,
) -> (Client, support::TestNamespace, Vec<Value>, PathBuf) {
    deployed_from(&deploy_dir(), prefix, broken, dir).await
}

/// [`deployed`] from the kustomization in `kustomization` (deploy/ or an overlay).
async fn deployed_from(
    kustomization: &Path,
    prefix: &str,
    broken: impl Fn(Vec<Value>) -> Vec<Value>,
    dir: &Path,
) -> (Client, support::TestNamespace, Vec<Value>, PathBuf) {
    let (client, ns) = support::test_namespace(prefix).await;
    let objects = broken(adapt(&render(kustomization), ns.name()));
    apply(&client, &objects, &APPLIED_KINDS, "rbac-test").await;
    let kubeconfig = service_account_kubeconfig(&client, ns.name(), SERVICE_ACCOUNT, dir).await;
    (client, ns, objects, kubeconfig)
}

/// SIGTERM: the sidecar exits 0 and the Lease is left unheld.
async fn exits_on_sigterm_releasing_the_lease(
    sidecar: &mut Sidecar,
    client: &Client,
    ns: &str,
    driver: &Driver,
) {
    sidecar.signal(Signal::SIGTERM);
    let status = sidecar.wait_exit(TIMEOUT).await;
    assert!(
        status.success(),
        "the sidecar ended with {}",
        describe(status)
    );
    let holder = lease_holder(client, ns, driver)
        .await
        .expect("reading the Lease");
    assert!(holder.is_empty(), "the Lease is still held by {holder:?}");
}

/// [`deployed`] with one core-group permission taken out of the role.
async fn deployed_without(
    prefix: &str,
    resource: &str,
    verb: &str,
    dir: &Path,
) -> (Client, support::TestNamespace, PathBuf) {
    let (client, ns, objects, kubeconfig) =
        deployed(prefix, |o| without_verb(&o, resource, verb), dir).await;
    assert!(!granted(&objects).contains(&permission("", resource, verb)));
    (client, ns, kubeconfig)
}

/// The end-to-end run as the ServiceAccount. A claim first fails for a missing provisioner
/// secret (events created, then aggregated by patch), then provisions once the secret exists,
/// with the provisioning-consistency finalizer (claim patches) and the journal (shard create
/// and update); deleting it deletes the PV and the backend volume. A second claim is deleted
/// while its volume is in flight, and the orphan reaper deletes that volume. The sidecar leads
/// with a Lease in its namespace and releases it on SIGTERM. The driver reports
/// PUBLISH_UNPUBLISH_VOLUME, so the sidecar also watches VolumeAttachments, and MODIFY_VOLUME:
/// a claim naming a VolumeAttributesClass has it read. No request is forbidden, and every
/// granted permission is used (except `NOT_EXERCISED`).
#[tokio::test]
async fn the_deploy_rbac_is_enough_and_every_rule_is_used() {
    let started = Instant::now();
    let dir = test_dir();
    let (client, ns, objects, kubeconfig) = deployed("rbac-e2e", |o| o, dir.path()).await;
    let ns = ns.name();
    // A driver that attaches volumes and reports topology: the sidecar watches
    // VolumeAttachments, Nodes and CSINodes too. The key is this test's own, so that the
    // Immediate claims' aggregation over Nodes sees only the Node made here.
    let zone_key = format!("{ns}.example/zone");
    let driver = Driver::start(&[
        "--attach-required",
        "--modify-volume",
        "--topology",
        &format!("{zone_key}=z1"),
    ])
    .await;
    let node = TopologyNode::create(&client, ns, &driver, &zone_key).await;
    let secret_name = "provisioner-secret";
    let class = format!("{ns}-class");
    create_class(
        &client,
        &storage_class(
            &class,
            &driver,
            "Delete",
            &[
                ("csi.storage.k8s.io/provisioner-secret-name", secret_name),
                ("csi.storage.k8s.io/provisioner-secret-namespace", ns),
            ],
        ),
    )
    .await;
    // The gate starts the ReferenceGrant watch (its CRD need not be installed: RBAC is
    // checked before the resource is looked up, and the other claims do not wait for it).
    let mut sidecar = start_sidecar(
        &driver,
        &kubeconfig,
        ns,
        &[
            "--leader-election",
            "--feature-gates=CrossNamespaceVolumeDataSource=true",
            // The claim's Namespace is read (its `get`).
            "--extra-create-metadata-namespace-labels=team",
            // The audit's report ConfigMap is created, then applied (its `create`, `patch`).
            "--audit-volumes-interval=1s",
        ],
    );

    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let data = create_claim(&claims, &consistent_claim("data", &class, "enable")).await;

    // The Lease: get (absent), create, then update on every renewal.
    support::eventually("the sidecar to hold the Lease", TIMEOUT, || async {
        assert_not_refused(&sidecar);
        let holder = lease_holder(&client, ns, &driver).await?;
        (!holder.is_empty())
            .then_some(())
            .ok_or("not held".to_owned())
    })
    .await;

    // Missing secret: the same ProvisioningFailed twice is one event with count 2 (patch).
    support::eventually(
        "an aggregated ProvisioningFailed event",
        TIMEOUT,
        || async {
            assert_not_refused(&sidecar);
            let events = events_of(&client, ns, "data").await?;
            events
                .iter()
                .any(|e| e.reason.as_deref() == Some("ProvisioningFailed") && e.count >= Some(2))
                .then_some(())
                .ok_or_else(|| summarize(&events))
        },
    )
    .await;
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(secret_name.to_owned()),
            ..ObjectMeta::default()
        },
        string_data: Some([("token".to_owned(), "not-a-real-secret".to_owned())].into()),
        ..Secret::default()
    };
    Api::<Secret>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &secret)
        .await
        .expect("creating the provisioner secret");

    wait_bound(&claims, "data").await;
    // Provisioned with topology: the Node's zone became the PV's node affinity.
    let affinity = Api::<PersistentVolume>::all(client.clone())
        .get(&pv_name(&data))
        .await
        .expect("reading the PV")
        .spec
        .and_then(|spec| spec.node_affinity);
    let affinity = serde_json::to_string(&affinity).unwrap_or_default();
    assert!(
        affinity.contains(&zone_key) && affinity.contains("z1"),
        "{affinity}"
    );
    wait_event(&client, ns, "data", "ProvisioningSucceeded", |_| true).await;
    // The operation was journaled before CreateVolume (shard create) and dropped once the PV
    // existed (shard update).
    support::eventually("an empty journal", TIMEOUT, || async {
        assert_not_refused(&sidecar);
        let operations = journal_operations(&client, ns, &driver).await?;
        operations
            .is_empty()
            .then_some(())
            .ok_or(format!("{operations:?}"))
    })
    .await;

    delete_claim_and_wait_pv_gone(&client, &claims, &data, &sidecar).await;
    wait_driver_empty(&driver).await;

    // A claim naming a VolumeAttributesClass: the class is read (get) at the attempt.
    let gold = format!("{ns}-gold");
    create_attributes_class(&client, &gold, driver.name(), &[("iops", "3000")]).await;
    let tuned = create_claim(&claims, &attributes_class_claim("tuned", &class, &gold)).await;
    wait_bound(&claims, "tuned").await;
    delete_claim_and_wait_pv_gone(&client, &claims, &tuned, &sidecar).await;
    delete_attributes_class(&client, &gold).await;
    wait_driver_empty(&driver).await;

    // An orphan: the driver creates the volume but answers DEADLINE_EXCEEDED, so the operation
    // stays in flight; the claim is deleted meanwhile. The orphan reaper reads the claim fresh
    // (claim get), finds no PV (PV get), replays CreateVolume and deletes the volume. The fault
    // stays on until the reaper has tried once: a retry of the claim started from a cache that
    // had not yet seen the deletion would otherwise create the PV, and no claim get is needed.
    driver.set_faults("fault CreateVolume=after:deadline-exceeded\n");
    create_claim(&claims, &consistent_claim("orphan", &class, "enable")).await;
    wait_event(&client, ns, "orphan", "ProvisioningFailed", |message| {
        message.contains("DeadlineExceeded") || message.contains("deadline")
    })
    .await;
    claims
        .delete("orphan", &DeleteParams::default())
        .await
        .expect("deleting the orphan's claim");
    support::eventually("the reaper's first try at the orphan", TIMEOUT, || async {
        assert_not_refused(&sidecar);
        let operations = journal_operations(&client, ns, &driver).await?;
        operations
            .iter()
            .any(|operation| operation.phase == Phase::Orphaned)
            .then_some(())
            .ok_or(format!("{operations:?}"))
    })
    .await;
    driver.clear_faults();
    support::eventually("the orphan's claim to be gone", TIMEOUT, || async {
        assert_not_refused(&sidecar);
        match claims.get_opt("orphan").await.map_err(|e| e.to_string())? {
            None => Ok(()),
            Some(claim) => Err(format!("finalizers {:?}", claim.metadata.finalizers)),
        }
    })
    .await;
    wait_driver_empty(&driver).await;
    audit_reports_a_leak(&client, ns, &driver, &sidecar).await;

    // SIGTERM: the Lease is released (an update), the sidecar exits 0.
    exits_on_sigterm_releasing_the_lease(&mut sidecar, &client, ns, &driver).await;

    assert_not_refused(&sidecar);
    let log = sidecar.log();
    let used = requests_in_log(&log);
    assert_rules_match(&used, &objects, &NOT_EXERCISED);
    node.delete().await;
    eprintln!("requests the sidecar sent: {used:?}");
    eprintln!(
        "the deploy/ RBAC end to end took {:.1}s",
        started.elapsed().as_secs_f64()
    );
}

/// Every request in `used` has a rule in `objects`, and every rule is used, except the
/// permissions `not_exercised` names (each of which must still be granted).
fn assert_rules_match(
    used: &BTreeSet<Permission>,
    objects: &[Value],
    not_exercised: &[(&str, &str, &str, &str)],
) {
    let granted = granted(objects);
    let excused: BTreeSet<Permission> = not_exercised
        .iter()
        .map(|(group, resource, verb, _why)| permission(group, resource, verb))
        .collect();
    let missing: Vec<_> = used.difference(&granted).collect();
    let unused: Vec<_> = granted
        .difference(used)
        .filter(|p| !excused.contains(*p))
        .collect();
    let stale: Vec<_> = excused.difference(&granted).collect();
    assert!(
        missing.is_empty(),
        "sent without a rule in deploy/: {missing:?}"
    );
    assert!(
        unused.is_empty(),
        "granted in deploy/ but never sent: {unused:?}; remove the rule, or exercise the code \
         path that needs it in this test"
    );
    assert!(
        stale.is_empty(),
        "the not-exercised list names permissions deploy/ no longer grants: {stale:?}"
    );
}

/// A Node carrying `zone_key=z1` and its CSINode registering `driver` with that key.
struct TopologyNode {
    client: Client,
    name: String,
}

impl TopologyNode {
    async fn create(client: &Client, ns: &str, driver: &Driver, zone_key: &str) -> TopologyNode {
        let name = format!("{ns}-node");
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {zone_key: "z1"}},
        }))
        .expect("a Node");
        Api::<Node>::all(client.clone())
            .create(&PostParams::default(), &node)
            .await
            .expect("creating the Node");
        let csinode: CSINode = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"drivers": [
                {"name": driver.name(), "nodeID": name, "topologyKeys": [zone_key]}
            ]},
        }))
        .expect("a CSINode");
        Api::<CSINode>::all(client.clone())
            .create(&PostParams::default(), &csinode)
            .await
            .expect("creating the CSINode");
        TopologyNode {
            client: client.clone(),
            name,
        }
    }
}

impl TopologyNode {
    /// Deletes the Node and its CSINode (cluster-wide objects outlive the test's namespace).
    async fn delete(self) {
        let params = DeleteParams::default();
        let _ = Api::<CSINode>::all(self.client.clone())
            .delete(&self.name, &params)
            .await;
        let _ = Api::<Node>::all(self.client)
            .delete(&self.name, &params)
            .await;
    }
}

/// Granted by deploy/node/ (which keeps the base's rules for the central Deployment) and not
/// sent by a node-mode sidecar, each with the reason.
const NOT_EXERCISED_IN_NODE_MODE: [(&str, &str, &str, &str); 27] = [
    (
        "storage.k8s.io",
        "csistoragecapacities",
        "get",
        "controller/capacity/capacity_publisher.rs reads an object it created only while the \
         watch has not reported it at the next sync (a lagging watch)",
    ),
    ("coordination.k8s.io", "leases", "get", NO_LEADER_ELECTION),
    ("coordination.k8s.io", "leases", "watch", NO_LEADER_ELECTION),
    (
        "coordination.k8s.io",
        "leases",
        "create",
        NO_LEADER_ELECTION,
    ),
    (
        "coordination.k8s.io",
        "leases",
        "update",
        NO_LEADER_ELECTION,
    ),
    ("", "nodes", "list", NODE_TOPOLOGY),
    ("", "nodes", "watch", NODE_TOPOLOGY),
    ("storage.k8s.io", "csinodes", "list", NODE_TOPOLOGY),
    ("storage.k8s.io", "csinodes", "watch", NODE_TOPOLOGY),
    ("", "persistentvolumeclaims", "list", LISTED_ONLY),
    ("", "persistentvolumes", "list", LISTED_ONLY),
    ("storage.k8s.io", "storageclasses", "list", LISTED_ONLY),
    (
        "provisioner.csi-rs.dev",
        "provisioningjournals",
        "get",
        "journal/writer.rs re-reads a shard only after a conflicting or failed write \
         (tests/journal.rs)",
    ),
    ("", "secrets", "get", IN_THE_BASE_TEST),
    ("", "persistentvolumeclaims", "get", IN_THE_BASE_TEST),
    ("", "persistentvolumes", "get", IN_THE_BASE_TEST),
    (
        "storage.k8s.io",
        "volumeattributesclasses",
        "get",
        IN_THE_BASE_TEST,
    ),
    (SNAPSHOTS, "volumesnapshots", "list", NO_SNAPSHOT_CRDS),
    (SNAPSHOTS, "volumesnapshots", "patch", NO_SNAPSHOT_CRDS),
    (
        SNAPSHOTS,
        "volumesnapshotcontents",
        "list",
        NO_SNAPSHOT_CRDS,
    ),
    (
        "gateway.networking.k8s.io",
        "referencegrants",
        "list",
        NO_GATE,
    ),
    ("", "events", "patch", IN_THE_BASE_TEST),
    (
        "storage.k8s.io",
        "volumeattachments",
        "list",
        IN_THE_BASE_TEST,
    ),
    (
        "storage.k8s.io",
        "volumeattachments",
        "watch",
        IN_THE_BASE_TEST,
    ),
    (SNAPSHOTS, "volumesnapshots", "get", NO_SNAPSHOT_CRDS),
    (SNAPSHOTS, "volumesnapshotcontents", "get", NO_SNAPSHOT_CRDS),
    (
        "gateway.networking.k8s.io",
        "referencegrants",
        "watch",
        NO_GATE,
    ),
];

const NO_GATE: &str =
    "only with the CrossNamespaceVolumeDataSource gate, which the DaemonSet leaves off";
const NO_LEADER_ELECTION: &str = "the DaemonSet runs without --leader-election: each instance \
     owns its node";
const NODE_TOPOLOGY: &str = "in node mode the topology is the driver's NodeGetInfo: no Node or \
     CSINode watch (the base's rule serves the central Deployment)";
const IN_THE_BASE_TEST: &str = "the same code path as in the central mode, which \
     the_deploy_rbac_is_enough_and_every_rule_is_used exercises";

/// The per-node overlay end to end: the DaemonSet's sidecar flags, run as the ServiceAccount
/// with NODE_NAME, NAMESPACE and POD_NAME (a Pod whose controller owns the capacity objects).
/// It checks its Node (nodes get), reads its Pod (pods get), publishes its node's
/// CSIStorageCapacity objects (watch, create), provisions a claim selected to its node and one
/// Immediate claim it wins (claim patch), refreshes its capacity after each (update), deletes a
/// volume, and deletes the object of a class that goes (delete). Every request has a rule and
/// every rule is used, except `NOT_EXERCISED_IN_NODE_MODE`.
#[tokio::test]
async fn the_node_overlay_rbac_is_enough_and_every_rule_is_used() {
    let dir = test_dir();
    // The per-node overlay (a DaemonSet with --node-deployment and --enable-capacity).
    let (client, ns, objects, kubeconfig) =
        deployed_from(&deploy_dir().join("node"), "rbac-node", |o| o, dir.path()).await;
    let ns = ns.name();
    let node_key = format!("{ns}.example/node");
    let driver = Driver::start(&["--topology", &format!("{node_key}=z1"), "--capacity=10Gi"]).await;
    let node = TopologyNode::create(&client, ns, &driver, &node_key).await;
    let pod = owned_pod(&client, ns).await;

    let daemonset = objects
        .iter()
        .find(|o| kind(o) == "DaemonSet")
        .expect("deploy/node/ renders a DaemonSet");
    let mut args: Vec<String> = daemonset["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .expect("the sidecar container has args")
        .iter()
        .filter_map(|arg| arg.as_str())
        // The socket and the metrics port are the test's own.
        .filter(|arg| !arg.starts_with("--csi-address") && !arg.starts_with("--http-endpoint"))
        .filter(|arg| !arg.starts_with("-v="))
        .map(str::to_owned)
        .collect();
    assert!(args.contains(&"--node-deployment".to_owned()), "{args:?}");
    args.extend([
        format!("--kubeconfig={}", kubeconfig.display()),
        format!("--leader-election-namespace={ns}"),
        "--logging-format=json".to_owned(),
        "-v=4".to_owned(),
        // The Immediate claim is won within a second, not twenty.
        "--node-deployment-base-delay=200ms".to_owned(),
        "--node-deployment-max-delay=1s".to_owned(),
        // The claim's Namespace is read (the base ClusterRole's `get` on namespaces).
        "--extra-create-metadata-namespace-labels=team".to_owned(),
        // The audit's report ConfigMap is created, then applied (the base Role's rule).
        "--audit-volumes-interval=1s".to_owned(),
    ]);
    let mut sidecar = Sidecar::start_with(
        &driver,
        SidecarOptions {
            args,
            env: vec![
                ("NODE_NAME", node.name.clone()),
                ("NAMESPACE", ns.to_owned()),
                ("POD_NAME", pod),
            ],
            ..SidecarOptions::default()
        },
    );

    let local = format!("{ns}-local");
    let mut wffc = storage_class(&local, &driver, "Delete", &[]);
    wffc.volume_binding_mode = Some("WaitForFirstConsumer".to_owned());
    create_class(&client, &wffc).await;
    let immediate = format!("{ns}-immediate");
    create_class(&client, &storage_class(&immediate, &driver, "Delete", &[])).await;

    let capacities: Api<CSIStorageCapacity> = Api::namespaced(client.clone(), ns);
    let capacity_of = |class: String| {
        let capacities = capacities.clone();
        async move {
            let listed = capacities
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let objects: Vec<_> = listed
                .items
                .into_iter()
                .filter(|c| c.storage_class_name == class)
                .collect();
            Ok::<_, String>(objects)
        }
    };
    support::eventually("the node's capacity object", TIMEOUT, || async {
        assert_not_refused(&sidecar);
        let objects = capacity_of(local.clone()).await?;
        match objects.as_slice() {
            [object] if object.capacity.as_ref().is_some_and(|c| c.0 == "10Gi") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;

    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let mut selected = claim("selected", &local, "1Gi", None);
    selected.metadata.annotations = Some([(SELECTED_NODE.to_owned(), node.name.clone())].into());
    let selected = create_claim(&claims, &selected).await;
    create_claim(&claims, &claim("raced", &immediate, "1Gi", None)).await;
    wait_bound(&claims, "selected").await;
    wait_bound(&claims, "raced").await;
    let raced = claims.get("raced").await.expect("reading the raced claim");
    assert_eq!(
        raced
            .metadata
            .annotations
            .unwrap_or_default()
            .get(SELECTED_NODE),
        Some(&node.name),
        "the Immediate claim went to the only node"
    );
    support::eventually(
        "the capacity refreshed after provisioning",
        TIMEOUT,
        || async {
            assert_not_refused(&sidecar);
            let objects = capacity_of(local.clone()).await?;
            match objects.as_slice() {
                [object] if object.capacity.as_ref().is_some_and(|c| c.0 == "8Gi") => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;

    delete_claim_and_wait_pv_gone(&client, &claims, &selected, &sidecar).await;

    Api::<StorageClass>::all(client.clone())
        .delete(&local, &DeleteParams::default())
        .await
        .expect("deleting the class");
    support::eventually("the class's capacity object to go", TIMEOUT, || async {
        assert_not_refused(&sidecar);
        let objects = capacity_of(local.clone()).await?;
        objects
            .is_empty()
            .then_some(())
            .ok_or(format!("{objects:?}"))
    })
    .await;
    audit_reports_a_leak(&client, ns, &driver, &sidecar).await;

    sidecar.signal(Signal::SIGTERM);
    let status = sidecar.wait_exit(TIMEOUT).await;
    assert!(
        status.success(),
        "the sidecar ended with {}",
        describe(status)
    );
    assert_not_refused(&sidecar);
    let used = requests_in_log(&sidecar.log());
    assert_rules_match(&used, &objects, &NOT_EXERCISED_IN_NODE_MODE);
    node.delete().await;
}

const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";

/// A volume made on the driver behind the sidecar's back is listed in the audit's report
/// ConfigMap: created at the first audit, applied again once the report changes.
async fn audit_reports_a_leak(client: &Client, ns: &str, driver: &Driver, sidecar: &Sidecar) {
    let leaked = driver
        .create_directly("leaked-behind-the-sidecars-back")
        .await;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    support::eventually("the audit report to list the leak", TIMEOUT, || async {
        assert_not_refused(sidecar);
        let listed = maps
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?
            .items
            .into_iter()
            .filter_map(|map| map.data?.get("volumes").cloned())
            .any(|table| table.contains(&leaked));
        listed.then_some(()).ok_or_else(|| "not listed".to_owned())
    })
    .await;
}

/// A Pod whose controlling owner is a ConfigMap: what `--capacity-ownerref-level=1` reads
/// (the owner reference as it is, without reading the owner), as a DaemonSet's pod would
/// carry. A ConfigMap, because nothing manages it: a DaemonSet or ReplicaSet would act on the
/// Pod. Returns its name.
async fn owned_pod(client: &Client, ns: &str) -> String {
    let owner = Api::<ConfigMap>::namespaced(client.clone(), ns)
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: ObjectMeta {
                    name: Some("owner".to_owned()),
                    ..ObjectMeta::default()
                },
                ..ConfigMap::default()
            },
        )
        .await
        .expect("creating the owner");
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": "csi-provisioner-node-pod",
            "ownerReferences": [{
                "apiVersion": "v1", "kind": "ConfigMap", "name": "owner",
                "uid": owner.metadata.uid, "controller": true,
            }],
        },
        "spec": {
            // Never scheduled, never run: only its metadata is read.
            "nodeName": format!("{ns}-nowhere"),
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65532,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "c", "image": "none",
                "securityContext": {"allowPrivilegeEscalation": false,
                                    "capabilities": {"drop": ["ALL"]}},
            }],
        },
    }))
    .expect("a Pod");
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await
        .expect("creating the owner's Pod");
    "csi-provisioner-node-pod".to_owned()
}

/// Without `create` on persistentvolumes the driver creates the volume but no PV appears, and
/// the claim's ProvisioningFailed event says "forbidden".
#[tokio::test]
async fn without_pv_create_provisioning_fails_as_forbidden() {
    let dir = test_dir();
    let (client, ns, kubeconfig) = deployed_without(
        "rbac-no-pv-create",
        "persistentvolumes",
        "create",
        dir.path(),
    )
    .await;
    let ns = ns.name();
    let driver = Driver::start(&[]).await;
    let class = format!("{ns}-class");
    create_class(&client, &storage_class(&class, &driver, "Delete", &[])).await;
    let sidecar = start_sidecar(&driver, &kubeconfig, ns, &[]);

    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let data = create_claim(&claims, &claim("data", &class, "1Gi", None)).await;
    wait_event(&client, ns, "data", "ProvisioningFailed", |message| {
        message.contains("forbidden")
    })
    .await;
    let pv = Api::<PersistentVolume>::all(client.clone())
        .get_opt(&pv_name(&data))
        .await
        .expect("reading the PV");
    assert!(
        pv.is_none(),
        "a PV appeared without the permission to create it"
    );
    assert!(
        sidecar.log().contains("is forbidden"),
        "the sidecar logged no 403"
    );
}

/// Without `get` on namespaces, a sidecar with `--extra-create-metadata-namespace-labels`
/// reports the Forbidden read on the claim (ProvisioningFailed) and retries: CreateVolume is
/// never sent without the parameters, and nothing is recorded.
#[tokio::test]
async fn without_namespace_get_the_namespace_flags_fail_as_forbidden_and_send_nothing() {
    let dir = test_dir();
    let (client, ns, kubeconfig) =
        deployed_without("rbac-no-ns-get", "namespaces", "get", dir.path()).await;
    let ns = ns.name();
    let driver = Driver::start(&[]).await;
    let class = format!("{ns}-class");
    create_class(&client, &storage_class(&class, &driver, "Delete", &[])).await;
    let _sidecar = start_sidecar(
        &driver,
        &kubeconfig,
        ns,
        &[
            "--extra-create-metadata-namespace-labels=team",
            "--retry-interval-max=1s",
        ],
    );

    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    create_claim(&claims, &claim("data", &class, "1Gi", None)).await;
    support::eventually(
        "two ProvisioningFailed events for the Forbidden namespace read",
        TIMEOUT,
        || async {
            let events = events_of(&client, ns, "data").await?;
            events
                .iter()
                .any(|event| {
                    let message = event.message.as_deref().unwrap_or_default();
                    event.reason.as_deref() == Some("ProvisioningFailed")
                        && message.starts_with(&format!("failed to read namespace \"{ns}\""))
                        && message.contains("forbidden")
                        && event.count.unwrap_or(1) >= 2
                })
                .then_some(())
                .ok_or_else(|| summarize(&events))
        },
    )
    .await;
    assert!(
        driver.create_volume_requests().is_empty(),
        "CreateVolume was sent: {:?}",
        driver.create_volume_requests()
    );
    let operations = journal_operations(&client, ns, &driver)
        .await
        .expect("listing the journal");
    assert!(operations.is_empty(), "recorded: {operations:?}");
}

/// A leader whose claim watch cannot start (so its controllers are still waiting for their
/// first list: on this API server, the claims streamed by that watch) still drains and exits
/// on SIGTERM, releasing the Lease. kube-runtime's graceful shutdown alone would wait for that
/// first list forever while the Lease kept being renewed.
#[tokio::test]
async fn a_sigterm_before_the_first_list_still_ends_the_leader() {
    let dir = test_dir();
    let (client, ns, kubeconfig) = deployed_without(
        "rbac-no-pvc-watch",
        "persistentvolumeclaims",
        "watch",
        dir.path(),
    )
    .await;
    let ns = ns.name();
    let driver = Driver::start(&[]).await;
    let mut sidecar = start_sidecar(&driver, &kubeconfig, ns, &["--leader-election"]);
    support::eventually(
        "the sidecar to lead and be refused the claim list",
        TIMEOUT,
        || async {
            let holder = lease_holder(&client, ns, &driver).await?;
            let refused = sidecar.log().contains("is forbidden");
            (!holder.is_empty() && refused)
                .then_some(())
                .ok_or(format!("holder {holder:?}, list refused: {refused}"))
        },
    )
    .await;

    exits_on_sigterm_releasing_the_lease(&mut sidecar, &client, ns, &driver).await;
}

/// Deletes `claim` and waits until its PV is gone (the sidecar deleted volume and PV), failing
/// at once if the sidecar was refused a request meanwhile.
async fn delete_claim_and_wait_pv_gone(
    client: &Client,
    claims: &Api<PersistentVolumeClaim>,
    claim: &PersistentVolumeClaim,
    sidecar: &Sidecar,
) {
    let name = claim.metadata.name.clone().unwrap_or_default();
    claims
        .delete(&name, &DeleteParams::default())
        .await
        .expect("deleting the claim");
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let volume_name = pv_name(claim);
    support::eventually("the PV to be gone", TIMEOUT, || async {
        assert_not_refused(sidecar);
        match volumes
            .get_opt(&volume_name)
            .await
            .map_err(|e| e.to_string())?
        {
            None => Ok(()),
            Some(pv) => Err(format!("phase {:?}", pv.status.and_then(|s| s.phase))),
        }
    })
    .await;
}

async fn wait_driver_empty(driver: &Driver) {
    support::eventually("the driver to hold no volume", TIMEOUT, || async {
        let count = driver.volume_count();
        (count == 0).then_some(()).ok_or(format!("{count} volumes"))
    })
    .await;
}

/// Fails at once (rather than at a wait's timeout) when the API server refused a request.
fn assert_not_refused(sidecar: &Sidecar) {
    let log = sidecar.log();
    let refused: Vec<&str> = log.lines().filter(|l| l.contains("is forbidden")).collect();
    assert!(
        refused.is_empty(),
        "the API server refused the sidecar a request:\n{}",
        refused.join("\n")
    );
}

fn test_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("csi-rbac-")
        .tempdir()
        .expect("creating a temp dir")
}

/// Each rule in deploy/ carries a comment saying which code path needs it.
#[test]
fn every_rule_says_why() {
    for file in RULE_FILES {
        let text = std::fs::read_to_string(deploy_dir().join(file)).expect("reading deploy/");
        let lines: Vec<&str> = text.lines().collect();
        for (at, line) in lines.iter().enumerate() {
            if line.trim_start().starts_with("- apiGroups:") {
                let above = at.checked_sub(1).map(|i| lines[i].trim_start());
                assert!(
                    above.is_some_and(|l| l.starts_with('#')),
                    "deploy/{file}:{}: a rule without a comment saying why",
                    at + 1
                );
            }
        }
    }
}

#[test]
fn requests_map_to_rbac_attributes() {
    let server = "https://127.0.0.1:6443";
    let cases = [
        (
            "GET",
            "/api/v1/persistentvolumeclaims?resourceVersion=0",
            ("", "persistentvolumeclaims", "list"),
        ),
        (
            "GET",
            "/api/v1/persistentvolumes?&watch=true&timeoutSeconds=290",
            ("", "persistentvolumes", "watch"),
        ),
        (
            "GET",
            "/api/v1/namespaces/a/persistentvolumeclaims/b",
            ("", "persistentvolumeclaims", "get"),
        ),
        (
            "POST",
            "/api/v1/namespaces/a/events?",
            ("", "events", "create"),
        ),
        (
            "PATCH",
            "/api/v1/namespaces/a/events/e.1",
            ("", "events", "patch"),
        ),
        (
            "PUT",
            "/apis/coordination.k8s.io/v1/namespaces/a/leases/l",
            ("coordination.k8s.io", "leases", "update"),
        ),
        (
            "DELETE",
            "/api/v1/persistentvolumes/pvc-1",
            ("", "persistentvolumes", "delete"),
        ),
        (
            "POST",
            "/api/v1/namespaces/a/serviceaccounts/s/token",
            ("", "serviceaccounts/token", "create"),
        ),
        (
            "GET",
            "/apis/storage.k8s.io/v1/storageclasses?watch=1",
            ("storage.k8s.io", "storageclasses", "watch"),
        ),
    ];
    for (method, path, (group, resource, verb)) in cases {
        assert_eq!(
            rbac_attributes(method, &format!("{server}{path}")),
            Some(permission(group, resource, verb)),
            "{method} {path}"
        );
    }
    assert_eq!(rbac_attributes("GET", &format!("{server}/version")), None);
}

#[test]
fn adapting_moves_everything_into_the_test_namespace() {
    let rendered = vec![
        serde_json::json!({"kind": "Namespace", "metadata": {"name": "csi-provisioner"}}),
        serde_json::json!({"kind": "ClusterRoleBinding", "metadata": {"name": "csi-provisioner"},
            "roleRef": {"kind": "ClusterRole", "name": "csi-provisioner"},
            "subjects": [{"kind": "ServiceAccount", "name": "csi-provisioner", "namespace": "csi-provisioner"}]}),
        serde_json::json!({"kind": "RoleBinding", "metadata": {"name": "csi-provisioner", "namespace": "csi-provisioner"},
            "roleRef": {"kind": "Role", "name": "csi-provisioner"},
            "subjects": [{"kind": "ServiceAccount", "name": "csi-provisioner", "namespace": "csi-provisioner"}]}),
    ];
    let adapted = adapt(&rendered, "t");
    assert_eq!(adapted[0]["metadata"]["name"], "t");
    assert_eq!(adapted[1]["metadata"]["name"], "t-csi-provisioner");
    assert_eq!(adapted[1]["roleRef"]["name"], "t-csi-provisioner");
    assert_eq!(adapted[1]["subjects"][0]["namespace"], "t");
    assert_eq!(adapted[2]["metadata"]["namespace"], "t");
    assert_eq!(adapted[2]["roleRef"]["name"], "csi-provisioner");
    assert_eq!(adapted[2]["subjects"][0]["namespace"], "t");
}
