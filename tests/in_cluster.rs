//! The product as users run it: deploy/ applied with `kubectl apply -k` (only the image names
//! set) to a cluster with a real node, the images the Dockerfile builds, the sidecar in the
//! driver's pod talking to the API server with its ServiceAccount token and to the driver over
//! the shared emptyDir socket, the reference driver's node plugin registered with the kubelet
//! and mounting volumes into pods. docs/deploy.md's steps are these.
//!
//! The tests share the machine's one node and deploy/'s fixed names, so they run one at a time.

use std::time::Duration;

use csi_test_support as support;
use csi_test_support::in_cluster::{
    self, BACKEND_DIR, Deployed, NAMESPACE, NODE_PLUGIN_APP, SIDECAR_APP,
};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSINode, CSIStorageCapacity};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams};
use support::eventually;

const DRIVER: &str = "reference.csi.example.com";
const WAIT: Duration = Duration::from_secs(120);

// Async: each test has its own runtime, and the guard is held across its awaits.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Holds the machine's node for one test, with nothing of deploy/ left from an earlier one.
async fn exclusive() -> tokio::sync::MutexGuard<'static, ()> {
    let guard = ONE_AT_A_TIME.lock().await;
    tokio::task::spawn_blocking(support::control_plane_with_node)
        .await
        .expect("starting the node");
    // An earlier test's `kubectl delete -k` may have given up: its pods would still use the
    // backend and its namespace still be terminating.
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(admin().await);
    eventually(
        "deploy/'s namespace of an earlier test gone",
        WAIT,
        || async {
            match namespaces.get_opt(NAMESPACE).await {
                Ok(None) => Ok(()),
                Ok(Some(_)) => Err("still there".to_owned()),
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await;
    // The backend outlives deployments (a host directory): each test starts with an empty one.
    match std::fs::remove_dir_all(BACKEND_DIR) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => panic!("emptying {BACKEND_DIR}: {e}"),
    }
    guard
}

async fn admin() -> Client {
    support::control_plane_with_node()
        .client()
        .await
        .expect("admin client")
}

/// The kubelet lists the driver on its CSINode once the node plugin registered.
async fn wait_registered(client: &Client) {
    let csi_nodes: Api<CSINode> = Api::all(client.clone());
    eventually("the kubelet to register the node plugin", WAIT, || async {
        let node = csi_nodes
            .get_opt(csi_testbed::node::NODE_NAME)
            .await
            .map_err(|e| e.to_string())?
            .ok_or("no CSINode yet")?;
        node.spec
            .drivers
            .iter()
            .find(|d| d.name == DRIVER)
            .map(|d| d.node_id.clone())
            .ok_or_else(|| format!("drivers: {:?}", node.spec.drivers))
    })
    .await;
}

async fn wait_bound(client: &Client, namespace: &str, claim: &str) -> PersistentVolume {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    let volume = eventually(&format!("claim {claim} Bound"), WAIT, || async {
        let c = claims.get(claim).await.map_err(|e| e.to_string())?;
        match (
            c.status.as_ref().and_then(|s| s.phase.as_deref()),
            c.spec.as_ref().and_then(|s| s.volume_name.clone()),
        ) {
            (Some("Bound"), Some(volume)) => Ok(volume),
            (phase, _) => Err(format!("{phase:?}")),
        }
    })
    .await;
    Api::<PersistentVolume>::all(client.clone())
        .get(&volume)
        .await
        .expect("the bound PV")
}

fn handle(pv: &PersistentVolume) -> String {
    pv.spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .map(|c| c.volume_handle.clone())
        .expect("a CSI PV")
}

/// Deletes the claim and waits until its PV is gone and the backend no longer holds the volume.
async fn delete_claim_and_wait_volume_gone(
    client: &Client,
    namespace: &str,
    claim: &str,
    pv: &PersistentVolume,
) {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    claims
        .delete(claim, &DeleteParams::default())
        .await
        .expect("delete claim");
    let pv_name = pv.metadata.name.clone().expect("pv name");
    let volume = handle(pv);
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    eventually("the PV and the backend volume gone", WAIT, || async {
        if pvs
            .get_opt(&pv_name)
            .await
            .map_err(|e| e.to_string())?
            .is_some()
        {
            return Err("the PV is still there".to_owned());
        }
        let held = in_cluster::backend_volumes();
        if held.contains(&volume) {
            Err(format!("the backend still holds {volume}"))
        } else {
            Ok(())
        }
    })
    .await;
}

fn restarts(pods: &[Pod]) -> Vec<(String, i32)> {
    pods.iter()
        .flat_map(|p| {
            let pod = p.metadata.name.clone().unwrap_or_default();
            p.status
                .iter()
                .flat_map(|s| s.container_statuses.iter().flatten())
                .map(move |c| (format!("{pod}/{}", c.name), c.restart_count))
        })
        .collect()
}

/// `kubectl apply -k deploy/`: the Deployment's two replicas and the node plugin become Ready
/// (their probes answer), the kubelet registers the driver; a claim is provisioned, a pod
/// writes a file on it, a second pod reads it back, the claim's deletion removes the volume;
/// then the Lease moves to the other replica when the leader's pod is deleted, and the new
/// leader provisions. No container restarted on the way (the liveness probes held).
#[tokio::test]
async fn deploy_provisions_a_volume_that_pods_write_and_read_and_the_lease_moves() {
    let _node = exclusive().await;
    let client = admin().await;
    let deployed = Deployed::apply("deploy");
    let sidecars = in_cluster::wait_pods_ready(&client, SIDECAR_APP, 2).await;
    in_cluster::wait_pods_ready(&client, NODE_PLUGIN_APP, 1).await;
    wait_registered(&client).await;

    let (_, ns) = support::test_namespace("in-cluster").await;
    let claim = in_cluster::create_claim(&client, ns.name(), "data").await;
    let claim_name = claim.metadata.name.clone().expect("name");
    let pv = wait_bound(&client, ns.name(), &claim_name).await;
    assert!(
        in_cluster::backend_volumes().contains(&handle(&pv)),
        "the backend holds the claim's volume"
    );

    in_cluster::run_pod(
        &client,
        ns.name(),
        "writer",
        &claim_name,
        "echo written-by-the-first-pod > /data/hello && sync",
    )
    .await;
    let read =
        in_cluster::run_pod(&client, ns.name(), "reader", &claim_name, "cat /data/hello").await;
    assert_eq!(read.trim(), "written-by-the-first-pod");
    delete_claim_and_wait_volume_gone(&client, ns.name(), &claim_name, &pv).await;

    // Probes held: nothing restarted.
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let now: Vec<Pod> = pods.list(&ListParams::default()).await.expect("pods").items;
    assert!(
        restarts(&now).iter().all(|(_, n)| *n == 0),
        "containers restarted: {:?}",
        restarts(&now)
    );
    // The Lease moves to the standby when the leader's pod goes (SIGTERM: it releases).
    let leader = eventually("a Lease holder", WAIT, || in_cluster::lease_holder(&client)).await;
    let standby = sidecars
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .find(|name| *name != leader)
        .expect("the standby replica");
    pods.delete(&leader, &DeleteParams::default())
        .await
        .expect("delete the leader's pod");
    let successor = eventually("the standby to lead", WAIT, || async {
        let holder = in_cluster::lease_holder(&client).await?;
        if holder == standby {
            Ok(holder)
        } else {
            Err(format!("held by {holder}"))
        }
    })
    .await;
    let claim = in_cluster::create_claim(&client, ns.name(), "after-handover").await;
    let claim_name = claim.metadata.name.clone().expect("name");
    let pv = wait_bound(&client, ns.name(), &claim_name).await;
    eprintln!("the Lease moved from {leader} to {successor}, which provisioned {claim_name}");
    delete_claim_and_wait_volume_gone(&client, ns.name(), &claim_name, &pv).await;
    drop(deployed);
}

/// The leading sidecar container is SIGKILLed by the runtime while CreateVolume is in flight
/// (the driver created the volume and holds the answer) and its claim is deleted meanwhile: the
/// kubelet restarts the container, and the journal's record makes the sidecar delete the volume
/// nobody owns. Nothing is left in the backend.
#[tokio::test]
async fn a_sidecar_killed_mid_create_volume_is_restarted_by_the_kubelet_and_leaks_nothing() {
    let _node = exclusive().await;
    let client = admin().await;
    let deployed = Deployed::apply("deploy");
    in_cluster::wait_pods_ready(&client, SIDECAR_APP, 2).await;
    let leader = eventually("a Lease holder", WAIT, || in_cluster::lease_holder(&client)).await;

    // The driver creates the next volume, then never answers (its control file, read by both
    // replicas' drivers; only the leader's is called).
    std::fs::write(
        std::path::Path::new(BACKEND_DIR).join("faults.txt"),
        "fault CreateVolume=after:hang:1\n",
    )
    .expect("write the driver's control file");
    let (_, ns) = support::test_namespace("in-cluster-kill").await;
    let claim = in_cluster::create_claim(&client, ns.name(), "orphan").await;
    let claim_name = claim.metadata.name.clone().expect("name");
    eventually("the backend to hold the new volume", WAIT, || async {
        let held = in_cluster::backend_volumes();
        if held.is_empty() {
            Err("no volume yet".to_owned())
        } else {
            Ok(held)
        }
    })
    .await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns.name());
    claims
        .delete(&claim_name, &DeleteParams::default())
        .await
        .expect("delete claim");

    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let pod = pods.get(&leader).await.expect("the leader's pod");
    let (restarts_before, container) =
        in_cluster::container_state(&pod, "csi-provisioner").expect("the sidecar container");
    in_cluster::kill_container(&container);
    eventually("the kubelet to restart the sidecar", WAIT, || async {
        let pod = pods.get(&leader).await.map_err(|e| e.to_string())?;
        match in_cluster::container_state(&pod, "csi-provisioner") {
            Some((n, _)) if n > restarts_before && in_cluster::pod_ready(&pod) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    eventually("the backend to hold no volume", WAIT, || async {
        let held = in_cluster::backend_volumes();
        if held.is_empty() {
            Ok(())
        } else {
            Err(format!("{held:?}"))
        }
    })
    .await;
    let claim_uid = claim.metadata.uid.clone().expect("uid");
    let pvs = Api::<PersistentVolume>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("PVs");
    let made: Vec<_> = pvs
        .items
        .iter()
        .filter(|pv| {
            pv.spec
                .as_ref()
                .and_then(|s| s.claim_ref.as_ref())
                .is_some_and(|r| r.uid.as_deref() == Some(claim_uid.as_str()))
        })
        .collect();
    assert!(
        made.is_empty(),
        "a PV was made for the deleted claim: {made:?}"
    );
    drop(deployed);
}

/// `kubectl apply -k deploy/node/`: the per-node sidecar publishes the node's
/// CSIStorageCapacity, a WaitForFirstConsumer claim used by a pod is provisioned on the node
/// and mounted, and its deletion removes the volume.
#[tokio::test]
async fn deploy_node_runs_node_mode_with_capacity_on_the_node() {
    let _node = exclusive().await;
    let client = admin().await;
    let deployed = Deployed::apply("deploy/node");
    in_cluster::wait_pods_ready(&client, SIDECAR_APP, 1).await;
    in_cluster::wait_pods_ready(&client, NODE_PLUGIN_APP, 1).await;
    wait_registered(&client).await;
    let capacities: Api<CSIStorageCapacity> = Api::namespaced(client.clone(), NAMESPACE);
    eventually("the node's CSIStorageCapacity", WAIT, || async {
        let list = capacities
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        list.items
            .iter()
            .find(|c| c.storage_class_name == "csi-reference" && c.capacity.is_some())
            .map(|_| ())
            .ok_or_else(|| format!("{} objects", list.items.len()))
    })
    .await;

    let (_, ns) = support::test_namespace("in-cluster-node").await;
    let claim = in_cluster::create_claim(&client, ns.name(), "local").await;
    let claim_name = claim.metadata.name.clone().expect("name");
    // WaitForFirstConsumer: the pod's scheduling selects the node, then the node's sidecar
    // provisions and the node plugin mounts.
    let read = in_cluster::run_pod(
        &client,
        ns.name(),
        "user",
        &claim_name,
        "echo local > /data/f && cat /data/f",
    )
    .await;
    assert_eq!(read.trim(), "local");
    let pv = wait_bound(&client, ns.name(), &claim_name).await;
    delete_claim_and_wait_volume_gone(&client, ns.name(), &claim_name, &pv).await;
    drop(deployed);
}
