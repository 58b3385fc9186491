//! Node deployment (`--node-deployment`) end to end, on the real control plane with
//! kube-scheduler: three simulated Nodes, each with its own reference driver instance (own
//! socket and state, `--node-id`, segment `example.com/node=<node>`) and its own sidecar
//! process in node mode (`NODE_NAME=<node>`), as a DaemonSet would run them.
//!
//! Isolation: every test has its own driver name (the three drivers of a test are twins of
//! one name), its own Nodes and namespace (support::topology).

use csi_test_support as support;

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim};
use kube::api::{Api, ListParams};

use support::cluster::{Cluster, journal_operations, pv_name, wait_bound};
use support::peers::{Driver, Sidecar, SidecarOptions, TIMEOUT};
use support::topology::{ANN_SELECTED_NODE, Topology, pv_segments, scheduling_cluster};

const NODE_KEY: &str = "example.com/node";

/// One simulated node: its name, its driver and its node-mode sidecar.
struct Node {
    name: String,
    driver: Driver,
    sidecar: Sidecar,
}

/// Three Nodes `a`, `b`, `c` with their drivers and sidecars. `driver_extra` gives each
/// node's driver its extra flags (by index), `sidecar_extra` every sidecar's.
async fn three_nodes(
    cluster: &Cluster,
    topology: &Topology,
    driver_extra: [&[&str]; 3],
    sidecar_extra: &[&str],
) -> Vec<Node> {
    let mut nodes = Vec::new();
    for (suffix, extra) in ["a", "b", "c"].into_iter().zip(driver_extra) {
        let name = topology.node_name(suffix);
        topology.create_node(suffix, &[(NODE_KEY, &name)]).await;
        let segment = format!("{NODE_KEY}={name}");
        let mut flags = vec!["--node-id", &name, "--topology", &segment];
        flags.extend(extra);
        let driver = match nodes.first() {
            None => Driver::start(&flags).await,
            Some(Node { driver, .. }) => driver.twin(&flags).await,
        };
        let sidecar = node_sidecar(cluster, &driver, &name, sidecar_extra);
        nodes.push(Node {
            name,
            driver,
            sidecar,
        });
    }
    nodes
}

fn node_sidecar(cluster: &Cluster, driver: &Driver, node: &str, extra: &[&str]) -> Sidecar {
    let mut args = vec![
        "--node-deployment".to_owned(),
        format!("--leader-election-namespace={}", cluster.ns()),
        "--retry-interval-start=200ms".to_owned(),
        "--retry-interval-max=2s".to_owned(),
    ];
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    Sidecar::start_with(
        driver,
        SidecarOptions {
            args,
            env: vec![("NODE_NAME", node.to_owned())],
            ..SidecarOptions::default()
        },
    )
}

/// The volume names the node's driver got CreateVolume (or DeleteVolume) for.
fn created(node: &Node) -> BTreeSet<String> {
    node.driver
        .create_requests()
        .into_iter()
        .map(|request| request.name)
        .collect()
}

fn deleted(node: &Node) -> Vec<String> {
    node.driver
        .volume_requests("DeleteVolume")
        .into_iter()
        .map(|request| request.volume_id)
        .collect()
}

fn selected(pvc: &PersistentVolumeClaim) -> Option<String> {
    pvc.metadata
        .annotations
        .as_ref()?
        .get(ANN_SELECTED_NODE)
        .cloned()
}

#[tokio::test]
async fn a_pod_on_node_b_gets_its_volume_from_node_bs_driver_only_and_b_deletes_it() {
    let (cluster, topology) = scheduling_cluster("node-wffc").await;
    let nodes = three_nodes(&cluster, &topology, [&[], &[], &[]], &[]).await;
    let class = topology.wffc_class("wffc", nodes[0].driver.name()).await;
    cluster.claim("data", &class).await;
    let b = &nodes[1];
    topology
        .create_pod("app", &["data"], &[("kubernetes.io/hostname", &b.name)])
        .await;
    let bound = wait_bound(&cluster.claims, "data").await;
    let volume = pv_name(&bound);
    assert_eq!(selected(&bound).as_deref(), Some(b.name.as_str()));
    assert_eq!(created(b), BTreeSet::from([volume.clone()]));
    for other in [&nodes[0], &nodes[2]] {
        assert!(
            created(other).is_empty(),
            "{} got a CreateVolume",
            other.name
        );
    }
    let pv = cluster.pv(&volume).await;
    assert_eq!(
        pv_segments(&pv),
        vec![[(NODE_KEY.to_owned(), b.name.clone())].into()]
    );

    topology.delete_pod("app").await;
    cluster.delete_claim("data").await;
    cluster.wait_pv_gone(&volume).await;
    assert!(
        b.driver.volumes().is_empty(),
        "B's driver deleted the volume"
    );
    assert_eq!(deleted(b).len(), 1);
    for other in [&nodes[0], &nodes[2]] {
        assert!(
            deleted(other).is_empty(),
            "{} got a DeleteVolume",
            other.name
        );
    }
    for mut node in nodes {
        node.sidecar.assert_running();
    }
}

/// Nodes a and b have room for four 1Gi volumes each, c for none: eight Immediate claims end
/// four on a, four on b. A node that wins a claim its driver no longer has room for (its check
/// passed before another of its claims took the room) gets ResourceExhausted and gives the
/// claim back (its own name only), so the split does not depend on who wins the races.
#[tokio::test]
async fn immediate_claims_get_one_node_each_and_fill_the_nodes_with_room_exactly() {
    let (cluster, topology) = scheduling_cluster("node-immediate").await;
    let delays = [
        "--node-deployment-base-delay=1s",
        "--node-deployment-max-delay=2s",
    ];
    let room: &[&str] = &["--capacity", "4Gi"];
    let nodes = three_nodes(
        &cluster,
        &topology,
        [room, room, &["--capacity", "0"]],
        &delays,
    )
    .await;
    let class = cluster.class("now", &nodes[0].driver, "Delete", &[]).await;
    let claims = cluster.claims_named("data", &class, 8).await;
    let mut per_node = std::collections::BTreeMap::<String, usize>::new();
    for claim in &claims {
        let bound = wait_bound(&cluster.claims, claim).await;
        let node = selected(&bound).unwrap_or_else(|| panic!("{claim} has no selected node"));
        let volume = pv_name(&bound);
        let owner = nodes
            .iter()
            .find(|n| n.name == node)
            .unwrap_or_else(|| panic!("{claim} selected {node}, not a node of this test"));
        assert!(
            owner
                .driver
                .volumes()
                .iter()
                .any(|held| held.name == volume),
            "{node}'s driver holds {volume}"
        );
        assert_eq!(
            pv_segments(&cluster.pv(&volume).await),
            vec![[(NODE_KEY.to_owned(), node.clone())].into()]
        );
        *per_node.entry(node).or_default() += 1;
    }
    let held: Vec<usize> = nodes.iter().map(|n| n.driver.volume_count()).collect();
    assert_eq!(held, [4, 4, 0], "volumes held by a, b, c");
    assert_eq!(
        per_node,
        std::collections::BTreeMap::from([(nodes[0].name.clone(), 4), (nodes[1].name.clone(), 4)]),
        "bound claims per selected node"
    );
    assert!(created(&nodes[2]).is_empty(), "a node without room won");
}

#[tokio::test]
async fn a_node_killed_mid_create_reaps_its_orphan_and_no_other_node_touches_it() {
    let (cluster, topology) = scheduling_cluster("node-orphan").await;
    let mut nodes = three_nodes(&cluster, &topology, [&[], &[], &[]], &[]).await;
    let class = topology.wffc_class("wffc", nodes[0].driver.name()).await;
    let a = 0;
    // Node a's driver makes the volume and never answers: a reply lost in flight.
    nodes[a]
        .driver
        .set_faults("fault CreateVolume=after:hang\n");
    let claim = cluster.claim("data", &class).await;
    let volume = pv_name(&claim);
    let node_a = nodes[a].name.clone();
    topology
        .create_pod("app", &["data"], &[("kubernetes.io/hostname", &node_a)])
        .await;
    nodes[a].driver.wait_create_received(&volume).await;
    support::eventually("node a's driver to hold the volume", TIMEOUT, || async {
        let held = nodes[a].driver.volume_count();
        if held == 1 {
            Ok(())
        } else {
            Err(format!("{held} volumes"))
        }
    })
    .await;
    // The operation is in node a's shards, labelled with its node.
    let shards = node_shards(&cluster, nodes[a].driver.name()).await;
    assert_eq!(shards.len(), 1, "{shards:?}");
    assert_eq!(shards[0].0, support_node_key(&node_a));
    nodes[a].sidecar.kill().await;

    topology.delete_pod("app").await;
    cluster.delete_claim("data").await;
    cluster.wait_claim_gone("data").await;
    nodes[a].driver.clear_faults();
    nodes[a].sidecar.restart().await;
    support::eventually("node a to reap its orphan", TIMEOUT, || async {
        let held = nodes[a].driver.volume_count();
        let operations =
            journal_operations(&cluster.client, cluster.ns(), &nodes[a].driver).await?;
        if held == 0 && operations.is_empty() {
            Ok(())
        } else {
            Err(format!("{held} volumes, journal {operations:?}"))
        }
    })
    .await;
    assert_eq!(deleted(&nodes[a]).len(), 1);
    for other in &nodes[1..] {
        assert!(
            created(other).is_empty(),
            "{} got a CreateVolume",
            other.name
        );
        assert!(
            deleted(other).is_empty(),
            "{} got a DeleteVolume",
            other.name
        );
    }
}

/// The node label of each shard of `driver` in the test namespace.
async fn node_shards(cluster: &Cluster, driver: &str) -> Vec<(String, String)> {
    use kube::api::{Api, ListParams};
    let selector = format!(
        "{}={}",
        csi_provisioner::journal::DRIVER_LABEL,
        csi_provisioner::leader::lease_name(driver)
    );
    Api::<csi_provisioner::journal::ProvisioningJournal>::namespaced(
        cluster.client.clone(),
        cluster.ns(),
    )
    .list(&ListParams::default().labels(&selector))
    .await
    .unwrap_or_else(|e| panic!("listing shards: {e}"))
    .items
    .into_iter()
    .map(|shard| {
        let labels = shard.metadata.labels.unwrap_or_default();
        let node = labels
            .get(csi_provisioner::journal::NODE_LABEL)
            .cloned()
            .unwrap_or_default();
        (node, shard.metadata.name.unwrap_or_default())
    })
    .collect()
}

fn support_node_key(node: &str) -> String {
    csi_provisioner::journal::node_key(node)
}

// ------------------------------------------------------------------------------ bad input

/// Runs a node-mode sidecar for `driver` with `NODE_NAME` set to `node` (unset: `None`) and
/// returns its exit code and stderr; it must exit on its own.
async fn exits(driver: &Driver, node: Option<&str>) -> (Option<i32>, String) {
    let mut command = tokio::process::Command::new(support::peers::sidecar_program());
    command
        .arg("--node-deployment")
        .arg("--csi-address")
        .arg(driver.socket())
        .arg("--kubeconfig")
        .arg(support::control_plane_with_scheduler().kubeconfig_path())
        .env_remove("NODE_NAME")
        .env_remove("RUST_LOG");
    if let Some(node) = node {
        command.env("NODE_NAME", node);
    }
    let output = tokio::time::timeout(TIMEOUT, command.output())
        .await
        .expect("the sidecar exits on its own")
        .expect("running csi-provisioner");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test]
async fn node_name_missing_or_naming_no_node_stops_the_sidecar_with_a_message() {
    let (cluster, _topology) = scheduling_cluster("node-bad").await;
    let driver =
        Driver::start(&["--node-id", "ghost", "--topology", "example.com/node=ghost"]).await;
    let (code, stderr) = exits(&driver, None).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "csi-provisioner: The NODE_NAME environment variable must be set when using --enable-node-deployment."
        ),
        "{stderr}"
    );
    let ghost = format!("{}-ghost", cluster.ns());
    let (code, stderr) = exits(&driver, Some(&ghost)).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "csi-provisioner: --node-deployment: NODE_NAME is {ghost:?}, but the cluster has no Node of that name"
        )),
        "{stderr}"
    );
    assert!(driver.volumes().is_empty());
}

/// Issue #31, hole 1: the claim's selected node moves from A to B while A's CreateVolume may
/// have created the volume (its answer timed out). A must not take B's PV for its own and drop
/// its record: its reaper deletes what it made on A, and B, which waits while A's journal holds
/// the name, provisions on B. Nothing is left on A.
#[tokio::test]
async fn a_claim_moved_to_another_node_leaves_nothing_on_the_first() {
    let (cluster, topology) = scheduling_cluster("node-moved").await;
    let timeout: &[&str] = &["--fault", "CreateVolume=after:deadline-exceeded"];
    let mut nodes = three_nodes(&cluster, &topology, [timeout, &[], &[]], &[]).await;
    let class = topology.wffc_class("wffc", nodes[0].driver.name()).await;
    let (a, b) = (&nodes[0], &nodes[1]);
    let mut pvc = support::cluster::claim("data", &class, "1Gi", None);
    pvc.metadata.annotations = Some([(ANN_SELECTED_NODE.to_owned(), a.name.clone())].into());
    let created_pvc = support::cluster::create_claim(&cluster.claims, &pvc).await;
    let volume = format!("pvc-{}", created_pvc.metadata.uid.clone().expect("uid"));
    a.driver.wait_holds(&volume).await;

    // The pod moves to B. Once A's reaper works on the operation (its cache saw the move, so
    // its claim reconciles stopped), A's driver answers again.
    cluster
        .patch_claim(
            "data",
            serde_json::json!({"metadata": {"annotations": {ANN_SELECTED_NODE: b.name}}}),
        )
        .await;
    support::eventually("A's reaper to take the operation", TIMEOUT, || async {
        if a.sidecar
            .log()
            .contains("orphaned volume not cleaned up yet")
        {
            Ok(())
        } else {
            Err("not yet".to_owned())
        }
    })
    .await;
    a.driver.clear_faults();

    let bound = wait_bound(&cluster.claims, "data").await;
    assert_eq!(pv_name(&bound), volume);
    assert_eq!(
        pv_segments(&cluster.pv(&volume).await),
        vec![[(NODE_KEY.to_owned(), b.name.clone())].into()]
    );
    support::eventually("A's volume to be deleted", TIMEOUT, || async {
        let left = a.driver.volumes();
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        }
    })
    .await;
    assert_eq!(deleted(a).len(), 1, "A deleted its volume once");
    assert_eq!(b.driver.volumes().len(), 1, "B holds the claim's volume");
    support::eventually("every journal to be empty", TIMEOUT, || async {
        let operations = journal_operations(&cluster.client, cluster.ns(), &a.driver).await?;
        if operations.is_empty() {
            Ok(())
        } else {
            Err(format!("{operations:?}"))
        }
    })
    .await;

    cluster.delete_claim("data").await;
    cluster.wait_pv_gone(&volume).await;
    assert!(b.driver.volumes().is_empty(), "B deleted the volume");
    for node in &mut nodes {
        node.sidecar.assert_running();
    }
}

/// Issue #31: chaos in node mode. Three nodes, each with its own driver (delays and faults
/// drawn from the seed as in tests/chaos.rs: timeouts after creating, hangs, unavailable,
/// DeleteVolume timeouts after deleting) and its node-mode sidecar. Claims are selected to
/// random nodes, then, one disruption after the other: a Pending claim moved to another node,
/// a claim deleted, a node's sidecar SIGKILLed and restarted. Once the faults are cleared:
/// every claim left is Bound to a PV whose node's driver still holds its volume (none was
/// deleted while in use); no driver holds a volume that no PV of its node
/// references (none leaked); no journal holds an operation (none stuck). Then every claim is
/// deleted and every driver ends empty. `CHAOS_SEED=<n>` replays a plan.
#[tokio::test]
async fn node_mode_chaos_leaks_nothing() {
    const CLAIMS: usize = 18;
    const DISRUPTIONS: usize = 14;
    let seed = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |elapsed| elapsed.as_nanos() as u64)
        });
    eprintln!("[node chaos] seed {seed} (CHAOS_SEED={seed} replays this plan)");
    let mut rng = csi_testbed::Rng::new(seed);
    let (cluster, topology) = scheduling_cluster("node-chaos").await;
    let mut nodes = three_nodes(&cluster, &topology, [&[], &[], &[]], &[]).await;
    for node in &nodes {
        let rules = csi_testbed::chaos::driver_fault_rules(&mut rng, "50ms");
        eprintln!("[node chaos] faults of {}:\n{rules}", node.name);
        node.driver.set_faults(&rules);
    }
    let class = topology.wffc_class("wffc", nodes[0].driver.name()).await;
    let node_names: Vec<String> = nodes.iter().map(|node| node.name.clone()).collect();
    let pick = |rng: &mut csi_testbed::Rng, len: usize| (rng.next_u64() % len as u64) as usize;

    let mut live = Vec::new();
    for index in 0..CLAIMS {
        let name = format!("c-{index}");
        let node = &node_names[pick(&mut rng, node_names.len())];
        let mut pvc = support::cluster::claim(&name, &class, "1Gi", None);
        pvc.metadata.annotations = Some([(ANN_SELECTED_NODE.to_owned(), node.clone())].into());
        support::cluster::create_claim(&cluster.claims, &pvc).await;
        live.push(name);
    }
    // The disruptions start once the drivers are at work.
    support::eventually("a first CreateVolume", TIMEOUT, || async {
        if nodes.iter().any(|node| !created(node).is_empty()) {
            Ok(())
        } else {
            Err("none yet".to_owned())
        }
    })
    .await;

    let (mut moved, mut deleted, mut killed) = (0, 0, 0);
    for _ in 0..DISRUPTIONS {
        match pick(&mut rng, 3) {
            0 => {
                let name = live[pick(&mut rng, live.len())].clone();
                let Some(pvc) = cluster.get_claim(&name).await else {
                    continue;
                };
                if pvc
                    .spec
                    .as_ref()
                    .and_then(|s| s.volume_name.as_deref())
                    .is_some()
                {
                    continue;
                }
                let from = selected(&pvc).unwrap_or_default();
                let others: Vec<&String> = node_names.iter().filter(|n| **n != from).collect();
                let to = others[pick(&mut rng, others.len())];
                eprintln!("[node chaos] claim {name} moved from {from} to {to}");
                cluster
                    .patch_claim(
                        &name,
                        serde_json::json!({"metadata": {"annotations": {ANN_SELECTED_NODE: to}}}),
                    )
                    .await;
                moved += 1;
            }
            1 if live.len() > CLAIMS / 2 => {
                let name = live.swap_remove(pick(&mut rng, live.len()));
                eprintln!("[node chaos] claim {name} deleted");
                cluster.delete_claim(&name).await;
                deleted += 1;
            }
            _ => {
                let node = &mut nodes[pick(&mut rng, 3)];
                eprintln!("[node chaos] sidecar of {} SIGKILLed", node.name);
                node.sidecar.kill().await;
                node.sidecar.restart().await;
                killed += 1;
            }
        }
    }
    for node in &nodes {
        node.driver.clear_faults();
    }

    let settle = std::time::Duration::from_secs(240);
    support::eventually("node-mode chaos to settle", settle, || async {
        for name in &live {
            let pvc = cluster
                .get_claim(name)
                .await
                .ok_or_else(|| format!("claim {name} is gone"))?;
            let Some(volume) = pvc.spec.as_ref().and_then(|s| s.volume_name.clone()) else {
                return Err(format!("claim {name} is not bound"));
            };
            // The PV's node: the one the claim selected when it was provisioned (a claim moved
            // while its PV was being saved stays with that PV).
            let pv = cluster.pv(&volume).await;
            let Some(holder) = nodes
                .iter()
                .find(|n| pv_segments(&pv) == vec![[(NODE_KEY.to_owned(), n.name.clone())].into()])
            else {
                return Err(format!("PV {volume} is on no test node"));
            };
            if !holder.driver.volumes().iter().any(|v| v.name == volume) {
                return Err(format!(
                    "{}'s driver lost {volume}, which PV {volume} holds",
                    holder.name
                ));
            }
        }
        for node in &nodes {
            for volume in node.driver.volumes() {
                let held = cluster.pv_exists(&volume.name).await
                    && pv_segments(&cluster.pv(&volume.name).await)
                        == vec![[(NODE_KEY.to_owned(), node.name.clone())].into()];
                if !held {
                    return Err(format!(
                        "{} holds {} without its PV",
                        node.name, volume.name
                    ));
                }
            }
        }
        let operations =
            journal_operations(&cluster.client, cluster.ns(), &nodes[0].driver).await?;
        if !operations.is_empty() {
            return Err(format!("journal: {operations:?}"));
        }
        Ok(())
    })
    .await;

    for name in &live {
        cluster.delete_claim(name).await;
    }
    support::eventually("every node's driver to be empty", settle, || async {
        let left: Vec<String> = nodes
            .iter()
            .flat_map(|node| node.driver.volumes().into_iter().map(|v| v.name))
            .collect();
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        }
    })
    .await;
    eprintln!(
        "[node chaos] seed {seed}: {CLAIMS} claims, {moved} moved, {deleted} deleted mid-flight, {killed} sidecars SIGKILLed; leaked 0, volumes in use deleted 0, stuck 0"
    );
    for node in &mut nodes {
        node.sidecar.assert_running();
    }
}

/// The backend audit in node mode: each node audits its own driver. A volume of our name that
/// nothing references on node c's backend is reported and deleted by node c alone; node a's
/// bound volume and node b's volume in flight (created, the answer never coming) are never
/// reported by any node, and no other node deletes anything.
#[tokio::test]
async fn each_node_audits_its_own_backend_and_deletes_only_its_unreferenced_volume() {
    let (cluster, topology) = scheduling_cluster("node-audit").await;
    let ids: &[&str] = &["--volume-id-prefix", "ref-"];
    let nodes = three_nodes(
        &cluster,
        &topology,
        [ids, ids, ids],
        &["--audit-volumes-interval=1s", "--audit-delete-after=2s"],
    )
    .await;
    let class = topology.wffc_class("wffc", nodes[0].driver.name()).await;
    let (a, b, c) = (0, 1, 2);
    cluster.claim("bound", &class).await;
    topology
        .create_pod(
            "app-a",
            &["bound"],
            &[("kubernetes.io/hostname", &nodes[a].name)],
        )
        .await;
    wait_bound(&cluster.claims, "bound").await;
    nodes[b]
        .driver
        .set_faults("fault CreateVolume=after:hang\n");
    let in_flight = cluster.claim("in-flight", &class).await;
    topology
        .create_pod(
            "app-b",
            &["in-flight"],
            &[("kubernetes.io/hostname", &nodes[b].name)],
        )
        .await;
    nodes[b].driver.wait_holds(&pv_name(&in_flight)).await;

    let leaked = nodes[c]
        .driver
        .create_directly(&format!("pvc-{}", uuid::Uuid::new_v4()))
        .await;
    support::eventually("node c to delete the leaked volume", TIMEOUT, || async {
        match nodes[c].driver.volume_count() {
            0 => Ok(()),
            held => Err(format!("{held} volumes")),
        }
    })
    .await;
    assert_eq!(deleted(&nodes[c]), std::slice::from_ref(&leaked));
    assert!(deleted(&nodes[a]).is_empty() && deleted(&nodes[b]).is_empty());
    let events = Api::<Event>::namespaced(cluster.client.clone(), cluster.ns())
        .list(&ListParams::default())
        .await
        .unwrap_or_else(|e| panic!("listing events: {e}"));
    let reported: Vec<String> = events
        .items
        .iter()
        .filter(|event| event.reason.as_deref() == Some("UnreferencedVolume"))
        .filter_map(|event| event.message.clone())
        .collect();
    assert!(
        reported.iter().all(|message| message.contains(&leaked)),
        "only the leaked volume is reported: {reported:?}"
    );

    nodes[b].driver.clear_faults();
    wait_bound(&cluster.claims, "in-flight").await;
    for node in &nodes[..2] {
        assert_eq!(node.driver.volume_count(), 1, "{}", node.name);
    }
}
