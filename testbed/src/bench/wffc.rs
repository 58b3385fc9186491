//! (h): WaitForFirstConsumer. kube-scheduler places pods that each use one claim of a
//! WaitForFirstConsumer class onto Nodes spread over zones; the sidecar provisions each claim in
//! its selected node's zone (the reference driver serves one segment per zone), and the scheduler
//! binds the pod once its claim is Bound. No kubelet runs: Nodes are API objects made schedulable
//! as docs/control-plane.md ("kube-scheduler and Nodes") describes, and pods never start.
//!
//! Figures of wrong behaviour are worth nothing, so every run ends with a check that each PV's
//! node affinity admits the node its pod was bound to; a mismatch fails the run.

use std::collections::{BTreeMap, HashMap};
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use csi_testbed::nodes::create_schedulable_node;
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::{
    Container, Node, NodeSelectorRequirement, PersistentVolume, PersistentVolumeClaim,
    PersistentVolumeClaimVolumeSource, Pod, PodSpec, Volume,
};
use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver, CSINodeSpec, StorageClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Client, ResourceExt};

use csi_testbed::{ControlPlane, StartOptions};

use super::api::{
    self, ClaimWatch, Cluster, DRIVER_NAME, NAMESPACE, VolumeWatch, WARMUP_NAMESPACE,
};
use super::report::Results;
use super::scenarios::{
    Driver, Extra, QUIET, prepare_cluster, request_rows, spawn_sidecar, wait_for,
};
use super::stats::{self, Impl};
use super::{Bench, BenchError};

/// Nodes of every run, spread evenly over [`ZONES`] zones.
pub const NODES: usize = 20;
pub const ZONES: usize = 4;
/// The driver's topology key: on the Nodes' labels, in their CSINodes and in the segments.
const ZONE_KEY: &str = "topology.reference.csi.example.com/zone";
const WFFC_CLASS: &str = "csi-bench-wffc";

/// The `q` quantile of sorted `values` (nearest rank), NaN if there are none.
fn quantile(values: &[f64], q: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    let rank = ((values.len() as f64 * q).ceil() as usize).clamp(1, values.len());
    values[rank - 1]
}

fn zone(i: usize) -> String {
    format!("zone-{}", i % ZONES + 1)
}

fn node_name(i: usize) -> String {
    format!("node-{:02}", i + 1)
}

/// (h): one run with `n` pods (one claim each) over [`NODES`] Nodes.
pub async fn wait_for_first_consumer(
    b: &Bench,
    imp: Impl,
    round: u32,
    results: &mut Results,
) -> Result<(), BenchError> {
    let n = b.sizes.wffc_pods;
    let tag = format!("(h) {imp} round {round}");
    b.say(format!(
        "{tag}: starting a control plane with kube-scheduler"
    ));
    let cp = ControlPlane::start_with(StartOptions {
        apiserver_flags: &[],
        scheduler: true,
        node: None,
    })
    .await
    .map_err(|e| BenchError::Step {
        step: "starting the control plane with kube-scheduler".into(),
        detail: e.to_string(),
    })?;
    let cluster = prepare_cluster(b, &cp).await?;
    create_topology(&cluster).await?;
    let name = format!("h-{imp}-r{round}");
    let segments: Vec<String> = (0..ZONES)
        .map(|i| format!("--segment={ZONE_KEY}={}", zone(i)))
        .collect();
    let mut driver = Driver::start_with(b, &name, &segments).await?;
    let qps = [
        "--kube-api-qps=500".to_owned(),
        "--kube-api-burst=1000".to_owned(),
    ];
    let mut sidecar = spawn_sidecar(
        b,
        imp,
        &driver,
        &cp,
        &Extra {
            flags: &qps,
            ..Extra::default()
        },
        &name,
    )?;
    let say = |m: String| b.say(format!("{tag}: {m}"));

    // Warm-up through the whole flow (scheduler, binder, sidecar, driver); the pair stays.
    let warm_claims = ClaimWatch::start(&cluster.client, WARMUP_NAMESPACE).await?;
    let warm_pods = PodWatch::start(&cluster.client, WARMUP_NAMESPACE).await?;
    let warm = ["warm-up".to_owned()];
    create_claims(&cluster, WARMUP_NAMESPACE, &warm, WFFC_CLASS).await?;
    create_pods(&cluster, WARMUP_NAMESPACE, &warm, &warm).await?;
    wait_for(
        b,
        &tag,
        &mut [&mut sidecar, &mut driver.proc],
        Duration::from_secs(180),
        || {
            Ok((
                warm_claims.is_bound("warm-up") && warm_pods.scheduled() == 1,
                "warm-up claim not Bound or its pod not scheduled yet".into(),
            ))
        },
    )
    .await?;

    let claim_names = api::numbered("claim", n);
    let pod_names = api::numbered("pod", n);
    let claims = ClaimWatch::start(&cluster.client, NAMESPACE).await?;
    let pods = PodWatch::start(&cluster.client, NAMESPACE).await?;
    let volumes = VolumeWatch::start(&cluster.client, WFFC_CLASS).await?;
    b.say(format!(
        "{tag}: creating {n} claims (they wait for a consumer)"
    ));
    create_claims(&cluster, NAMESPACE, &claim_names, WFFC_CLASS).await?;
    cluster
        .wait_quiet(QUIET, Duration::from_secs(60), say)
        .await?;
    if claims.bound_count() > 0 {
        return Err(BenchError::Step {
            step: format!("{tag}: before the pods"),
            detail: format!("{} claims Bound without a consumer", claims.bound_count()),
        });
    }
    let before = cluster.snapshot().await?;
    let cpu_before = sidecar.now(b.ticks).cpu_secs;

    b.say(format!("{tag}: creating {n} pods over {NODES} Nodes"));
    let t0 = Instant::now();
    create_pods(&cluster, NAMESPACE, &pod_names, &claim_names).await?;
    b.say(format!(
        "{tag}: {n} pods created in {:.1}s",
        t0.elapsed().as_secs_f64()
    ));
    let limit = Duration::from_secs_f64(180.0 + n as f64 * 0.5);
    wait_for(
        b,
        &tag,
        &mut [&mut sidecar, &mut driver.proc],
        limit,
        || {
            let (k, s) = (claims.bound_count(), pods.scheduled());
            Ok((
                k >= n && s >= n,
                format!("{k}/{n} claims Bound, {s}/{n} pods scheduled"),
            ))
        },
    )
    .await?;
    let last = |times: Vec<f64>| times.last().copied().unwrap_or(f64::NAN);
    let to_bound = last(claims.bound_after(t0));
    let to_scheduled = last(pods.scheduled_after(t0));
    let peak = sidecar.now(b.ticks).hwm_mib();
    cluster.wait_quiet(QUIET, limit, say).await?;
    let after = cluster.snapshot().await?;
    let cpu = sidecar.now(b.ticks).cpu_secs - cpu_before;
    sidecar.stop().await;
    driver.stop().await;

    let placements = pods.placements();
    let used = placements
        .values()
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    check_placement(&cluster, &placements, ZONE_KEY)
        .await
        .map_err(|detail| BenchError::Step {
            step: format!("{tag}: PV node affinity against the pods' Nodes"),
            detail,
        })?;
    let imp_ = Some(imp);
    results.sample(stats::H_BOUND, imp_, round, to_bound);
    results.sample(stats::H_SCHEDULED, imp_, round, to_scheduled);
    results.sample(stats::H_CPU, imp_, round, cpu);
    results.sample(stats::H_PEAK_RSS, imp_, round, peak);
    let (sidecar_part, binder_part) = claims.stages(&volumes.appeared_at());
    results.sample(
        stats::H_ACTIONABLE,
        imp_,
        round,
        last(claims.actionable_after(t0)),
    );
    results.sample(
        stats::H_SIDECAR_MEDIAN,
        imp_,
        round,
        quantile(&sidecar_part, 0.5),
    );
    results.sample(
        stats::H_SIDECAR_P90,
        imp_,
        round,
        quantile(&sidecar_part, 0.9),
    );
    results.sample(
        stats::H_BINDER_MEDIAN,
        imp_,
        round,
        quantile(&binder_part, 0.5),
    );
    results.requests.extend(request_rows(
        &after.since(&before),
        "h",
        imp,
        round,
        "provision",
        n,
    ));
    b.say(format!(
        "{tag}: done: all claims Bound {to_bound:.1}s, all pods scheduled {to_scheduled:.1}s \
         (on {used} Nodes, every PV in its pod's zone), CPU {cpu:.2}s, peak RSS {peak:.0} MiB"
    ));
    Ok(())
}

/// The WaitForFirstConsumer class, and [`NODES`] schedulable Nodes with their CSINodes.
async fn create_topology(cluster: &Cluster) -> Result<(), BenchError> {
    let class = StorageClass {
        metadata: ObjectMeta {
            name: Some(WFFC_CLASS.into()),
            ..ObjectMeta::default()
        },
        provisioner: DRIVER_NAME.into(),
        reclaim_policy: Some("Delete".into()),
        volume_binding_mode: Some("WaitForFirstConsumer".into()),
        ..StorageClass::default()
    };
    cluster
        .create(&Api::<StorageClass>::all(cluster.client.clone()), &class)
        .await?;
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    let csi_nodes: Api<CSINode> = Api::all(cluster.client.clone());
    for i in 0..NODES {
        let name = node_name(i);
        create_schedulable_node(&nodes, &name, &[(ZONE_KEY, &zone(i))])
            .await
            .map_err(|e| BenchError::Step {
                step: format!("creating Node {name}"),
                detail: e.to_string(),
            })?;
        cluster
            .create(&csi_nodes, &csi_node(&name, ZONE_KEY))
            .await?;
    }
    Ok(())
}

/// What a kubelet with the driver registered would publish: the driver's topology key.
pub(super) fn csi_node(name: &str, key: &str) -> CSINode {
    CSINode {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        spec: CSINodeSpec {
            drivers: vec![CSINodeDriver {
                name: DRIVER_NAME.to_owned(),
                node_id: name.to_owned(),
                topology_keys: Some(vec![key.to_owned()]),
                allocatable: None,
            }],
        },
    }
}

/// Claims of `class` (1 GiB each).
pub(super) async fn create_claims(
    cluster: &Cluster,
    ns: &str,
    names: &[String],
    class: &str,
) -> Result<(), BenchError> {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(cluster.client.clone(), ns);
    stream::iter(names)
        .map(|name| {
            let api = api.clone();
            async move {
                let mut claim = api::claim(name, None);
                if let Some(spec) = claim.spec.as_mut() {
                    spec.storage_class_name = Some(class.to_owned());
                }
                cluster.create(&api, &claim).await
            }
        })
        .buffer_unordered(api::CONCURRENCY)
        .try_collect::<()>()
        .await
}

/// Pod `names[i]` mounts claim `claims[i]`.
pub(super) async fn create_pods(
    cluster: &Cluster,
    ns: &str,
    names: &[String],
    claims: &[String],
) -> Result<(), BenchError> {
    let api: Api<Pod> = Api::namespaced(cluster.client.clone(), ns);
    stream::iter(names.iter().zip(claims))
        .map(|(name, claim)| {
            let api = api.clone();
            async move { cluster.create(&api, &pod(name, claim)).await }
        })
        .buffer_unordered(api::CONCURRENCY)
        .try_collect::<()>()
        .await
}

/// A pod that only mounts `claim`; its image is never pulled (no kubelet runs).
pub(super) fn pod(name: &str, claim: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "app".to_owned(),
                image: Some("registry.invalid/never-runs".to_owned()),
                ..Container::default()
            }],
            volumes: Some(vec![Volume {
                name: "data".to_owned(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: claim.to_owned(),
                    read_only: None,
                }),
                ..Volume::default()
            }]),
            termination_grace_period_seconds: Some(0),
            ..PodSpec::default()
        }),
        ..Pod::default()
    }
}

/// Every pod's claim is bound to a PV whose node affinity admits the pod's Node; `key` is the
/// topology key a mismatch is explained by.
pub(super) async fn check_placement(
    cluster: &Cluster,
    placements: &HashMap<String, String>,
    key: &str,
) -> Result<(), String> {
    let list = |e: kube::Error| e.to_string();
    let lp = ListParams::default();
    let nodes: HashMap<String, BTreeMap<String, String>> = Api::<Node>::all(cluster.client.clone())
        .list(&lp)
        .await
        .map_err(list)?
        .into_iter()
        .map(|n| (n.name_any(), n.metadata.labels.unwrap_or_default()))
        .collect();
    let volumes: HashMap<String, PersistentVolume> =
        Api::<PersistentVolume>::all(cluster.client.clone())
            .list(&lp)
            .await
            .map_err(list)?
            .into_iter()
            .map(|pv| (pv.name_any(), pv))
            .collect();
    let pods = Api::<Pod>::namespaced(cluster.client.clone(), NAMESPACE)
        .list(&lp)
        .await
        .map_err(list)?;
    let claims: HashMap<String, String> =
        Api::<PersistentVolumeClaim>::namespaced(cluster.client.clone(), NAMESPACE)
            .list(&lp)
            .await
            .map_err(list)?
            .into_iter()
            .filter_map(|c| {
                let volume = c.spec.as_ref()?.volume_name.clone()?;
                Some((c.name_any(), volume))
            })
            .collect();
    let mut wrong = Vec::new();
    for pod in &pods.items {
        let pod_name = pod.name_any();
        let Some(node) = placements.get(&pod_name) else {
            wrong.push(format!("{pod_name}: not scheduled"));
            continue;
        };
        let claim = pod
            .spec
            .as_ref()
            .and_then(|s| s.volumes.as_ref())
            .and_then(|v| v.first())
            .and_then(|v| v.persistent_volume_claim.as_ref())
            .map(|c| c.claim_name.clone())
            .unwrap_or_default();
        let verdict = claims
            .get(&claim)
            .ok_or_else(|| format!("claim {claim} is not bound"))
            .and_then(|volume| {
                volumes
                    .get(volume)
                    .ok_or_else(|| format!("PV {volume} is missing"))
            })
            .and_then(|pv| {
                let terms = affinity_terms(pv);
                let labels = nodes.get(node).cloned().unwrap_or_default();
                if terms.is_empty() {
                    Err(format!("PV {} has no node affinity", pv.name_any()))
                } else if terms.iter().any(|t| term_admits(t, &labels)) {
                    Ok(())
                } else {
                    Err(format!(
                        "PV {} (affinity {terms:?}) does not admit its pod's Node {node} ({key}={})",
                        pv.name_any(),
                        labels.get(key).map_or("none", String::as_str)
                    ))
                }
            });
        if let Err(e) = verdict {
            wrong.push(format!("{pod_name}: {e}"));
        }
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} of {} pods wrongly placed, e.g. {}",
            wrong.len(),
            pods.items.len(),
            wrong.iter().take(3).cloned().collect::<Vec<_>>().join("; ")
        ))
    }
}

/// The required node-selector terms of a PV's node affinity (empty when it has none).
pub(super) fn affinity_terms(pv: &PersistentVolume) -> Vec<Vec<NodeSelectorRequirement>> {
    pv.spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
        .map(|r| {
            r.node_selector_terms
                .iter()
                .map(|t| t.match_expressions.clone().unwrap_or_default())
                .collect()
        })
        .unwrap_or_default()
}

/// Pure: whether a node with `labels` satisfies every requirement of one term. Operators beyond
/// In, NotIn, Exists and DoesNotExist (Gt, Lt) are not what a sidecar writes: they do not admit.
fn term_admits(term: &[NodeSelectorRequirement], labels: &BTreeMap<String, String>) -> bool {
    term.iter().all(|r| {
        let value = labels.get(&r.key);
        let values = r.values.as_deref().unwrap_or_default();
        match r.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    })
}

/// Time-stamps the moment each pod of a namespace is first seen bound to a Node.
pub(super) struct PodWatch {
    bound: Arc<Mutex<HashMap<String, (Instant, String)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl PodWatch {
    /// Returns once the watch has listed the namespace.
    pub(super) async fn start(client: &Client, ns: &str) -> Result<PodWatch, BenchError> {
        let api: Api<Pod> = Api::namespaced(client.clone(), ns);
        let bound: Arc<Mutex<HashMap<String, (Instant, String)>>> = Arc::default();
        let sink = Arc::clone(&bound);
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let mut ready = Some(ready_tx);
            let mut events = pin!(watcher(api, watcher::Config::default()).default_backoff());
            while let Some(event) = events.next().await {
                match event {
                    Ok(Event::Apply(pod) | Event::InitApply(pod)) => {
                        if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) {
                            lock(&sink)
                                .entry(pod.name_any())
                                .or_insert_with(|| (Instant::now(), node));
                        }
                    }
                    Ok(Event::InitDone) => {
                        if let Some(tx) = ready.take() {
                            let _ = tx.send(());
                        }
                    }
                    Ok(_) => {}
                    Err(e) => eprintln!("[bench] pod watch: {e} (it restarts)"),
                }
            }
        });
        match tokio::time::timeout(Duration::from_secs(60), ready_rx).await {
            Ok(Ok(())) => Ok(PodWatch { bound, task }),
            _ => Err(BenchError::Step {
                step: "starting the watch of pods".into(),
                detail: "no initial list within 60s".into(),
            }),
        }
    }

    pub(super) fn scheduled(&self) -> usize {
        lock(&self.bound).len()
    }

    /// Seconds from `t0` to each pod's binding, sorted.
    pub(super) fn scheduled_after(&self, t0: Instant) -> Vec<f64> {
        let mut times: Vec<f64> = lock(&self.bound)
            .values()
            .map(|(t, _)| t.saturating_duration_since(t0).as_secs_f64())
            .collect();
        times.sort_by(f64::total_cmp);
        times
    }

    /// Pod name → Node name.
    pub(super) fn placements(&self) -> HashMap<String, String> {
        lock(&self.bound)
            .iter()
            .map(|(pod, (_, node))| (pod.clone(), node.clone()))
            .collect()
    }
}

impl Drop for PodWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn requirement(key: &str, operator: &str, values: &[&str]) -> NodeSelectorRequirement {
        NodeSelectorRequirement {
            key: key.to_owned(),
            operator: operator.to_owned(),
            values: Some(values.iter().map(|v| (*v).to_owned()).collect()),
        }
    }

    #[test]
    fn a_term_admits_a_node_only_when_every_requirement_holds() {
        let labels = BTreeMap::from([(ZONE_KEY.to_owned(), "zone-2".to_owned())]);
        assert!(term_admits(
            &[requirement(ZONE_KEY, "In", &["zone-2"])],
            &labels
        ));
        assert!(!term_admits(
            &[requirement(ZONE_KEY, "In", &["zone-1"])],
            &labels
        ));
        assert!(!term_admits(
            &[
                requirement(ZONE_KEY, "In", &["zone-2"]),
                requirement("rack", "In", &["r1"])
            ],
            &labels
        ));
        assert!(term_admits(
            &[requirement("rack", "DoesNotExist", &[])],
            &labels
        ));
        assert!(!term_admits(
            &[requirement(ZONE_KEY, "Gt", &["1"])],
            &labels
        ));
    }

    #[test]
    fn quantiles_take_the_nearest_rank() {
        let values = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0];
        assert_eq!(quantile(&values, 0.5), 5.0);
        assert_eq!(quantile(&values, 0.9), 9.0);
        assert_eq!(quantile(&values[..1], 0.9), 1.0);
        assert!(quantile(&[], 0.5).is_nan());
    }

    #[test]
    fn nodes_spread_evenly_over_the_zones() {
        let per_zone = (0..NODES).filter(|&i| zone(i) == "zone-1").count();
        assert_eq!(per_zone, NODES / ZONES);
    }
}
