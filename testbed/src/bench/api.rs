//! The benchmark client's side of the API: the objects it creates (a StorageClass, claims, and
//! for (d) and (g) volumes of its own), watches that time-stamp every claim's binding and every
//! volume's removal, and the request counters of the apiserver and the controller manager.
//!
//! This client has no rate limit and keeps many requests in flight, so it never is the
//! bottleneck; it counts its own writes so that they can be taken out of the apiserver's totals.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Range;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, Namespace, ObjectReference, PersistentVolume, PersistentVolumeClaim,
    PersistentVolumeClaimSpec, PersistentVolumeSpec, VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Client, Resource, ResourceExt};

use super::BenchError;
use super::metrics::{self, ApiCounts, ClientCounts};

/// The reference driver's default name, which the StorageClass names as provisioner.
pub const DRIVER_NAME: &str = "reference.csi.example.com";
pub const CLASS: &str = "csi-bench";
pub const NAMESPACE: &str = "bench";
pub const WARMUP_NAMESPACE: &str = "bench-warmup";
/// Leases of both sidecars live here (`--leader-election-namespace`).
pub const LEASE_NAMESPACE: &str = "default";
/// Finalizer and annotation both sidecars put on the PVs they provision.
const PV_FINALIZER: &str = "external-provisioner.volume.kubernetes.io/finalizer";
const ANN_PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
const ANN_STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
/// What the binder puts on a claim it has bound.
const ANN_BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";
const ANN_BOUND_BY_CONTROLLER: &str = "pv.kubernetes.io/bound-by-controller";

/// Requests the benchmark keeps in flight when it creates or deletes many objects.
pub const CONCURRENCY: usize = 64;
/// Pairs in flight while (d) fills its cluster: each is four sequential writes.
const BOUND_PAIR_CONCURRENCY: usize = 2 * CONCURRENCY;
const ATTEMPTS: u32 = 6;

/// Admin clients for the apiserver and the controller manager's metrics endpoint.
pub struct Cluster {
    pub client: Client,
    kcm: Client,
    bench_writes: AtomicU64,
}

/// Both request counters, and the benchmark's own writes, at one moment.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub api: ApiCounts,
    pub kcm: ClientCounts,
    pub bench_writes: f64,
}

/// What happened between two snapshots.
#[derive(Clone, Debug, Default)]
pub struct Delta {
    pub api: ApiCounts,
    pub kcm: ClientCounts,
    pub bench_writes: f64,
}

impl Delta {
    pub fn sidecar_writes(&self) -> f64 {
        metrics::sidecar_writes(&self.api, &self.kcm, self.bench_writes)
    }
}

impl Snapshot {
    pub fn since(&self, before: &Snapshot) -> Delta {
        Delta {
            api: self.api.since(&before.api),
            kcm: self.kcm.since(&before.kcm),
            bench_writes: self.bench_writes - before.bench_writes,
        }
    }
}

impl Cluster {
    pub async fn connect(cp: &csi_testbed::ControlPlane) -> Result<Cluster, BenchError> {
        let client = cp.client().await.map_err(|e| BenchError::Step {
            step: "connecting to the apiserver".into(),
            detail: e.to_string(),
        })?;
        let kcm = kcm_client(cp).await?;
        Ok(Cluster {
            client,
            kcm,
            bench_writes: AtomicU64::new(0),
        })
    }

    fn count_write(&self) {
        self.bench_writes.fetch_add(1, Ordering::Relaxed);
    }

    pub async fn snapshot(&self) -> Result<Snapshot, BenchError> {
        let api = metrics::parse_apiserver(&self.metrics_text(&self.client, "apiserver").await?);
        let kcm = metrics::parse_client(&self.metrics_text(&self.kcm, "controller manager").await?);
        Ok(Snapshot {
            api,
            kcm,
            bench_writes: self.bench_writes.load(Ordering::Relaxed) as f64,
        })
    }

    async fn metrics_text(&self, client: &Client, whose: &str) -> Result<String, BenchError> {
        let request = http::Request::get("/metrics")
            .body(Vec::new())
            .map_err(|e| BenchError::Step {
                step: format!("building the {whose} /metrics request"),
                detail: e.to_string(),
            })?;
        client
            .request_text(request)
            .await
            .map_err(|e| BenchError::Step {
                step: format!("reading the {whose} /metrics"),
                detail: e.to_string(),
            })
    }

    /// Waits until no write (Leases aside) has reached the apiserver for `quiet`, at most
    /// `cap`; returns how long it waited. Queued event writes of a rate-limited sidecar land
    /// here, so a phase's request count includes everything the phase caused. `progress` gets
    /// a status line every few seconds.
    pub async fn wait_quiet(
        &self,
        quiet: Duration,
        cap: Duration,
        progress: impl Fn(String),
    ) -> Result<Duration, BenchError> {
        let started = Instant::now();
        let mut last = self.snapshot().await?.api.writes();
        let mut still_since = Instant::now();
        let mut reported = (Instant::now(), last);
        while started.elapsed() < cap {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let now = self.snapshot().await?.api.writes();
            if now != last {
                last = now;
                still_since = Instant::now();
            } else if still_since.elapsed() >= quiet {
                break;
            }
            if reported.0.elapsed() >= Duration::from_secs(10) {
                progress(format!(
                    "waiting for the API writes to stop: {:.0} in the last {:.0}s",
                    now - reported.1,
                    reported.0.elapsed().as_secs_f64()
                ));
                reported = (Instant::now(), now);
            }
        }
        Ok(started.elapsed())
    }

    pub async fn setup(&self) -> Result<(), BenchError> {
        for ns in [NAMESPACE, WARMUP_NAMESPACE] {
            let namespace = Namespace {
                metadata: ObjectMeta {
                    name: Some(ns.into()),
                    ..ObjectMeta::default()
                },
                ..Namespace::default()
            };
            self.create(&Api::<Namespace>::all(self.client.clone()), &namespace)
                .await?;
        }
        let class = StorageClass {
            metadata: ObjectMeta {
                name: Some(CLASS.into()),
                ..ObjectMeta::default()
            },
            provisioner: DRIVER_NAME.into(),
            reclaim_policy: Some("Delete".into()),
            volume_binding_mode: Some("Immediate".into()),
            ..StorageClass::default()
        };
        self.create(&Api::<StorageClass>::all(self.client.clone()), &class)
            .await
    }

    /// Creates with retries; AlreadyExists counts as done (an earlier attempt got through).
    pub(super) async fn create<K>(&self, api: &Api<K>, object: &K) -> Result<(), BenchError>
    where
        K: Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
    {
        self.create_stored(api, object).await.map(drop)
    }

    /// [`Cluster::create`], returning the object as stored (read back after AlreadyExists).
    async fn create_stored<K>(&self, api: &Api<K>, object: &K) -> Result<K, BenchError>
    where
        K: Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
    {
        let name = object.meta().name.as_deref().unwrap_or("?");
        let failed = |e: kube::Error| BenchError::Step {
            step: format!("creating {name}"),
            detail: e.to_string(),
        };
        let mut delay = Duration::from_millis(100);
        let mut attempt = 1;
        loop {
            self.count_write();
            match api.create(&PostParams::default(), object).await {
                Ok(stored) => return Ok(stored),
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    return api.get(name).await.map_err(failed);
                }
                Err(e) if attempt == ATTEMPTS => return Err(failed(e)),
                Err(_) => {
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                    attempt += 1;
                }
            }
        }
    }

    /// Merge-patches the status subresource, with retries.
    async fn patch_status<K>(
        &self,
        api: &Api<K>,
        name: &str,
        status: serde_json::Value,
    ) -> Result<(), BenchError>
    where
        K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        let patch = Patch::Merge(serde_json::json!({ "status": status }));
        let mut delay = Duration::from_millis(100);
        let mut attempt = 1;
        loop {
            self.count_write();
            match api
                .patch_status(name, &PatchParams::default(), &patch)
                .await
            {
                Ok(_) => return Ok(()),
                Err(e) if attempt == ATTEMPTS => {
                    return Err(BenchError::Step {
                        step: format!("writing the status of {name}"),
                        detail: e.to_string(),
                    });
                }
                Err(_) => {
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                    attempt += 1;
                }
            }
        }
    }

    async fn delete<K>(&self, api: &Api<K>, name: &str) -> Result<(), BenchError>
    where
        K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        let mut delay = Duration::from_millis(100);
        for attempt in 1..=ATTEMPTS {
            self.count_write();
            match api.delete(name, &DeleteParams::default()).await {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(status)) if status.code == 404 => return Ok(()),
                Err(e) if attempt == ATTEMPTS => {
                    return Err(BenchError::Step {
                        step: format!("deleting {name}"),
                        detail: e.to_string(),
                    });
                }
                Err(_) => {
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
            }
        }
        Ok(())
    }

    /// `annotated` claims carry the storage-provisioner annotation from the start, so the
    /// sidecar need not wait for the controller manager's binder to add it.
    pub async fn create_claims(
        &self,
        ns: &str,
        names: &[String],
        annotated: bool,
    ) -> Result<(), BenchError> {
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), ns);
        stream::iter(names)
            .map(|name| {
                let api = api.clone();
                async move { self.create(&api, &new_claim(name, annotated)).await }
            })
            .buffer_unordered(CONCURRENCY)
            .try_collect::<()>()
            .await
    }

    /// One annotated claim (see [`Cluster::create_claims`]) in [`NAMESPACE`]; returns the name
    /// of the PV both sidecars give it (`pvc-<uid>`, their default `--volume-name-prefix`).
    pub async fn create_claim_for_pv_name(&self, name: &str) -> Result<String, BenchError> {
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), NAMESPACE);
        let stored = self.create_stored(&api, &new_claim(name, true)).await?;
        let uid = stored.metadata.uid.ok_or_else(|| BenchError::Step {
            step: format!("creating claim {name}"),
            detail: "the stored claim has no uid".into(),
        })?;
        Ok(format!("pvc-{uid}"))
    }

    pub async fn delete_claims(&self, ns: &str, names: &[String]) -> Result<(), BenchError> {
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), ns);
        stream::iter(names)
            .map(|name| {
                let api = api.clone();
                async move { self.delete(&api, name).await }
            })
            .buffer_unordered(CONCURRENCY)
            .try_collect::<()>()
            .await
    }

    /// (d), (j): the claims `pairs` (0-based, named as by [`numbered`]) bound to as many
    /// volumes that look as if a sidecar had provisioned them (annotation, finalizer, CSI
    /// source); `binding` says who binds them. `shape(i, pv)` may add to the `i`-th volume (e.g.
    /// node affinity) before it is created.
    pub async fn create_bound_pairs(
        &self,
        pairs: Range<usize>,
        binding: Binding,
        shape: impl Fn(usize, &mut PersistentVolume),
    ) -> Result<(), BenchError> {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), NAMESPACE);
        let volumes: Api<PersistentVolume> = Api::all(self.client.clone());
        let shape = &shape;
        stream::iter(pairs)
            .map(|i| {
                let (claims, volumes) = (claims.clone(), volumes.clone());
                async move {
                    let name = numbered_name("idle", i + 1);
                    let pv_name = format!("pv-{name}");
                    let mut pv = volume(&pv_name, Some(&name), true);
                    shape(i, &mut pv);
                    match binding {
                        Binding::ByBinder => {
                            self.create(&volumes, &pv).await?;
                            self.create(&claims, &claim(&name, Some(&pv_name))).await
                        }
                        Binding::Written => {
                            self.write_bound(&claims, &volumes, bound_claim(&name, &pv_name), pv)
                                .await
                        }
                    }
                }
            })
            .buffer_unordered(BOUND_PAIR_CONCURRENCY)
            .try_collect::<()>()
            .await
    }

    /// One pair as the binder leaves it: the claim first (its uid goes into the volume's
    /// claimRef), then the volume, then both statuses Bound.
    async fn write_bound(
        &self,
        claims: &Api<PersistentVolumeClaim>,
        volumes: &Api<PersistentVolume>,
        claim: PersistentVolumeClaim,
        mut pv: PersistentVolume,
    ) -> Result<(), BenchError> {
        let stored = self.create_stored(claims, &claim).await?;
        if let Some(claim_ref) = pv.spec.as_mut().and_then(|s| s.claim_ref.as_mut()) {
            claim_ref.uid = stored.metadata.uid.clone();
        }
        self.create(volumes, &pv).await?;
        self.patch_status(
            volumes,
            &pv.name_any(),
            serde_json::json!({ "phase": "Bound" }),
        )
        .await?;
        self.patch_status(
            claims,
            &claim.name_any(),
            serde_json::json!({
                "phase": "Bound",
                "accessModes": ["ReadWriteOnce"],
                "capacity": { "storage": "1Gi" },
            }),
        )
        .await
    }

    /// (g): creates `n` plain PVs as fast as the apiserver takes them; returns the elapsed time.
    pub async fn create_raw_volumes(&self, prefix: &str, n: usize) -> Result<Duration, BenchError> {
        let volumes: Api<PersistentVolume> = Api::all(self.client.clone());
        let names = numbered(prefix, n);
        let started = Instant::now();
        stream::iter(&names)
            .map(|name| {
                let volumes = volumes.clone();
                async move { self.create(&volumes, &volume(name, None, false)).await }
            })
            .buffer_unordered(CONCURRENCY)
            .try_collect::<()>()
            .await?;
        Ok(started.elapsed())
    }

    /// Holder of the first Lease in [`LEASE_NAMESPACE`] held by one of `identities`.
    pub async fn lease_holder(&self, identities: &[&str]) -> Result<Option<String>, BenchError> {
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), LEASE_NAMESPACE);
        let list = leases
            .list(&ListParams::default())
            .await
            .map_err(|e| BenchError::Step {
                step: "listing Leases".into(),
                detail: e.to_string(),
            })?;
        Ok(list
            .items
            .into_iter()
            .filter_map(|lease| lease.spec.and_then(|s| s.holder_identity))
            .find(|holder| identities.contains(&holder.as_str())))
    }

    /// (d): claims in [`NAMESPACE`] and PVs whose phase is not Bound, read in pages.
    pub async fn count_not_bound(&self) -> Result<(usize, usize), BenchError> {
        let claims = not_bound(
            Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), NAMESPACE),
            |c| c.status.as_ref().and_then(|s| s.phase.clone()),
        );
        let volumes = not_bound(Api::<PersistentVolume>::all(self.client.clone()), |v| {
            v.status.as_ref().and_then(|s| s.phase.clone())
        });
        futures::try_join!(claims, volumes)
    }

    pub async fn has_volume(&self, name: &str) -> Result<bool, BenchError> {
        let volumes: Api<PersistentVolume> = Api::all(self.client.clone());
        volumes
            .get_opt(name)
            .await
            .map(|pv| pv.is_some())
            .map_err(|e| BenchError::Step {
                step: format!("reading PV {name}"),
                detail: e.to_string(),
            })
    }

    pub async fn count_volumes(&self) -> Result<usize, BenchError> {
        let volumes: Api<PersistentVolume> = Api::all(self.client.clone());
        let list = volumes
            .list_metadata(&ListParams::default())
            .await
            .map_err(|e| BenchError::Step {
                step: "listing PVs".into(),
                detail: e.to_string(),
            })?;
        Ok(list.items.len())
    }
}

/// Objects of `api` whose `phase` is not Bound, listed 5,000 at a time.
async fn not_bound<K>(
    api: Api<K>,
    phase: impl Fn(&K) -> Option<String>,
) -> Result<usize, BenchError>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut params = ListParams::default().limit(5_000);
    let mut count = 0;
    loop {
        let page = api.list(&params).await.map_err(|e| BenchError::Step {
            step: "listing claims or PVs".into(),
            detail: e.to_string(),
        })?;
        count += page
            .items
            .iter()
            .filter(|o| phase(o).as_deref() != Some("Bound"))
            .count();
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(count),
        }
    }
}

async fn kcm_client(cp: &csi_testbed::ControlPlane) -> Result<Client, BenchError> {
    let err = |detail: String| BenchError::Step {
        step: "connecting to the controller manager's metrics".into(),
        detail,
    };
    let kubeconfig = Kubeconfig::read_from(cp.kubeconfig_path()).map_err(|e| err(e.to_string()))?;
    let mut config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|e| err(e.to_string()))?;
    // Same CA: the controller manager serves this run's serving certificate.
    config.cluster_url = cp
        .controller_manager_url()
        .parse()
        .map_err(|e: http::uri::InvalidUri| err(e.to_string()))?;
    Client::try_from(config).map_err(|e| err(e.to_string()))
}

pub fn numbered(prefix: &str, n: usize) -> Vec<String> {
    (1..=n).map(|i| numbered_name(prefix, i)).collect()
}

fn numbered_name(prefix: &str, i: usize) -> String {
    format!("{prefix}-{i:05}")
}

/// Who completes the binding of the pairs [`Cluster::create_bound_pairs`] writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Binding {
    /// The controller manager's binder, as for volumes a sidecar provisioned.
    ByBinder,
    /// The benchmark writes both objects as the binder leaves them (claim with the binder's
    /// annotations, claimRef with the claim's uid, both statuses Bound), so the binder has
    /// nothing to do: fast enough for 100,000 pairs on 2 cores.
    Written,
}

/// A claim to be provisioned; `annotated` ones carry the storage-provisioner annotation.
fn new_claim(name: &str, annotated: bool) -> PersistentVolumeClaim {
    let mut claim = claim(name, None);
    if annotated {
        claim.metadata.annotations = Some(BTreeMap::from([(
            ANN_STORAGE_PROVISIONER.to_owned(),
            DRIVER_NAME.to_owned(),
        )]));
    }
    claim
}

/// A claim as the binder leaves it bound to `volume` (its status is written separately).
fn bound_claim(name: &str, volume: &str) -> PersistentVolumeClaim {
    let mut claim = claim(name, Some(volume));
    claim.metadata.annotations = Some(BTreeMap::from([
        (ANN_BIND_COMPLETED.to_owned(), "yes".to_owned()),
        (ANN_BOUND_BY_CONTROLLER.to_owned(), "yes".to_owned()),
    ]));
    claim
}

/// A 1 GiB ReadWriteOnce claim of the bench class, optionally pre-bound to a volume.
pub fn claim(name: &str, volume_name: Option<&str>) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            storage_class_name: Some(CLASS.into()),
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([("storage".into(), Quantity("1Gi".into()))])),
                ..VolumeResourceRequirements::default()
            }),
            volume_name: volume_name.map(str::to_owned),
            ..PersistentVolumeClaimSpec::default()
        }),
        ..PersistentVolumeClaim::default()
    }
}

/// A CSI volume of the reference driver; `claim` pre-binds it to that claim in [`NAMESPACE`]
/// and, with `provisioned`, it carries what a sidecar puts on the PVs it creates.
pub fn volume(name: &str, claim: Option<&str>, provisioned: bool) -> PersistentVolume {
    let mut metadata = ObjectMeta {
        name: Some(name.into()),
        ..ObjectMeta::default()
    };
    if provisioned {
        metadata.annotations = Some(BTreeMap::from([(
            ANN_PROVISIONED_BY.into(),
            DRIVER_NAME.into(),
        )]));
        metadata.finalizers = Some(vec![PV_FINALIZER.into()]);
    }
    PersistentVolume {
        metadata,
        spec: Some(PersistentVolumeSpec {
            capacity: Some(BTreeMap::from([("storage".into(), Quantity("1Gi".into()))])),
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            persistent_volume_reclaim_policy: Some(
                if provisioned { "Delete" } else { "Retain" }.into(),
            ),
            storage_class_name: Some(CLASS.into()),
            volume_mode: Some("Filesystem".into()),
            csi: Some(CSIPersistentVolumeSource {
                driver: DRIVER_NAME.into(),
                volume_handle: format!("vol-{name}"),
                ..CSIPersistentVolumeSource::default()
            }),
            claim_ref: claim.map(|claim| ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("PersistentVolumeClaim".into()),
                namespace: Some(NAMESPACE.into()),
                name: Some(claim.into()),
                ..ObjectReference::default()
            }),
            ..PersistentVolumeSpec::default()
        }),
        ..PersistentVolume::default()
    }
}

fn is_bound(pvc: &PersistentVolumeClaim) -> bool {
    pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
}

/// Whether the sidecar may act on a WaitForFirstConsumer claim: the scheduler chose its node
/// and the PV controller named the external provisioner.
fn actionable(pvc: &PersistentVolumeClaim) -> bool {
    let annotations = pvc.metadata.annotations.as_ref();
    let has = |key: &str| annotations.is_some_and(|a| a.contains_key(key));
    has("volume.kubernetes.io/selected-node") && has("volume.kubernetes.io/storage-provisioner")
}

/// When each claim of a namespace was first seen actionable (see [`actionable`]) and Bound, and
/// the PV it is bound to.
#[derive(Default)]
struct ClaimTimes {
    bound: HashMap<String, Instant>,
    actionable: HashMap<String, Instant>,
    volume: HashMap<String, String>,
}

/// Time-stamps the first moment each claim of a namespace is seen Bound (and actionable).
pub struct ClaimWatch {
    times: Arc<Mutex<ClaimTimes>>,
    task: tokio::task::JoinHandle<()>,
}

impl ClaimWatch {
    /// Returns once the watch has listed the namespace, so no binding is missed.
    pub async fn start(client: &Client, ns: &str) -> Result<ClaimWatch, BenchError> {
        let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
        let times: Arc<Mutex<ClaimTimes>> = Arc::default();
        let sink = Arc::clone(&times);
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let mut ready = Some(ready_tx);
            let mut events = pin!(watcher(api, watcher::Config::default()).default_backoff());
            while let Some(event) = events.next().await {
                match event {
                    Ok(Event::Apply(pvc) | Event::InitApply(pvc)) => {
                        let now = Instant::now();
                        let mut times = lock(&sink);
                        if actionable(&pvc) {
                            times.actionable.entry(pvc.name_any()).or_insert(now);
                        }
                        if is_bound(&pvc) {
                            times.bound.entry(pvc.name_any()).or_insert(now);
                            let volume = pvc.spec.as_ref().and_then(|s| s.volume_name.clone());
                            if let Some(volume) = volume {
                                times.volume.insert(pvc.name_any(), volume);
                            }
                        }
                    }
                    Ok(Event::InitDone) => {
                        if let Some(tx) = ready.take() {
                            let _ = tx.send(());
                        }
                    }
                    Ok(_) => {}
                    Err(e) => eprintln!("[bench] claim watch: {e} (it restarts)"),
                }
            }
        });
        wait_ready(ready_rx, "claims").await?;
        Ok(ClaimWatch { times, task })
    }

    /// Seconds from each claim's first actionable sight to its PV's appearance (`appeared`),
    /// and from that to the claim's binding, sorted each.
    pub fn stages(&self, appeared: &HashMap<String, Instant>) -> (Vec<f64>, Vec<f64>) {
        let times = lock(&self.times);
        let mut to_pv = Vec::new();
        let mut to_bound = Vec::new();
        for (claim, bound) in &times.bound {
            let (Some(actionable), Some(pv)) = (
                times.actionable.get(claim),
                times.volume.get(claim).and_then(|v| appeared.get(v)),
            ) else {
                continue;
            };
            to_pv.push(pv.saturating_duration_since(*actionable).as_secs_f64());
            to_bound.push(bound.saturating_duration_since(*pv).as_secs_f64());
        }
        to_pv.sort_by(f64::total_cmp);
        to_bound.sort_by(f64::total_cmp);
        (to_pv, to_bound)
    }

    /// Seconds from `t0` to each claim's first actionable sight, sorted.
    pub fn actionable_after(&self, t0: Instant) -> Vec<f64> {
        let mut times: Vec<f64> = lock(&self.times)
            .actionable
            .values()
            .map(|t| t.saturating_duration_since(t0).as_secs_f64())
            .collect();
        times.sort_by(f64::total_cmp);
        times
    }

    pub fn bound_count(&self) -> usize {
        lock(&self.times).bound.len()
    }

    pub fn is_bound(&self, name: &str) -> bool {
        lock(&self.times).bound.contains_key(name)
    }

    /// Seconds from `t0` to each binding, sorted.
    pub fn bound_after(&self, t0: Instant) -> Vec<f64> {
        let mut times: Vec<f64> = lock(&self.times)
            .bound
            .values()
            .map(|t| t.saturating_duration_since(t0).as_secs_f64())
            .collect();
        times.sort_by(f64::total_cmp);
        times
    }
}

impl Drop for ClaimWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Default)]
struct VolumeState {
    live: HashSet<String>,
    appeared: HashMap<String, Instant>,
    relisting: Option<HashSet<String>>,
    gone: Vec<Instant>,
}

/// Tracks the PVs of the bench class, and when each disappears.
pub struct VolumeWatch {
    state: Arc<Mutex<VolumeState>>,
    task: tokio::task::JoinHandle<()>,
}

impl VolumeWatch {
    /// The PVs of `class`.
    pub async fn start(client: &Client, class: &'static str) -> Result<VolumeWatch, BenchError> {
        let api: Api<PersistentVolume> = Api::all(client.clone());
        let state: Arc<Mutex<VolumeState>> = Arc::default();
        let sink = Arc::clone(&state);
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let ours = move |pv: &PersistentVolume| {
            pv.spec
                .as_ref()
                .and_then(|s| s.storage_class_name.as_deref())
                == Some(class)
        };
        let task = tokio::spawn(async move {
            let mut ready = Some(ready_tx);
            let mut events = pin!(watcher(api, watcher::Config::default()).default_backoff());
            while let Some(event) = events.next().await {
                let mut s = lock(&sink);
                match event {
                    Ok(Event::Apply(pv)) if ours(&pv) => {
                        s.appeared.entry(pv.name_any()).or_insert_with(Instant::now);
                        s.live.insert(pv.name_any());
                    }
                    Ok(Event::Delete(pv)) => {
                        if s.live.remove(&pv.name_any()) {
                            s.gone.push(Instant::now());
                        }
                    }
                    Ok(Event::Init) => s.relisting = Some(HashSet::new()),
                    Ok(Event::InitApply(pv)) if ours(&pv) => {
                        if let Some(set) = s.relisting.as_mut() {
                            set.insert(pv.name_any());
                        }
                    }
                    Ok(Event::InitDone) => {
                        let listed = s.relisting.take().unwrap_or_default();
                        let vanished = s.live.difference(&listed).count();
                        s.gone.extend(std::iter::repeat_n(Instant::now(), vanished));
                        s.live = listed;
                        drop(s);
                        if let Some(tx) = ready.take() {
                            let _ = tx.send(());
                        }
                    }
                    Ok(_) => {}
                    Err(e) => eprintln!("[bench] volume watch: {e} (it restarts)"),
                }
            }
        });
        wait_ready(ready_rx, "volumes").await?;
        Ok(VolumeWatch { state, task })
    }

    pub fn live(&self) -> usize {
        lock(&self.state).live.len()
    }

    /// PVs seen since the watch started (deleted ones included).
    pub fn appeared(&self) -> usize {
        lock(&self.state).appeared.len()
    }

    /// When each PV appeared, by name.
    pub fn appeared_at(&self) -> HashMap<String, Instant> {
        lock(&self.state).appeared.clone()
    }

    /// Seconds from `t0` to the last PV's appearance.
    pub fn last_appeared_after(&self, t0: Instant) -> Option<f64> {
        lock(&self.state)
            .appeared
            .values()
            .max()
            .map(|t| t.saturating_duration_since(t0).as_secs_f64())
    }

    /// Seconds from `t0` to each removal, sorted.
    pub fn gone_after(&self, t0: Instant) -> Vec<f64> {
        let mut times: Vec<f64> = lock(&self.state)
            .gone
            .iter()
            .map(|t| t.saturating_duration_since(t0).as_secs_f64())
            .collect();
        times.sort_by(f64::total_cmp);
        times
    }
}

impl Drop for VolumeWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// When a watch of one PV name first saw that PV, with a claimRef, appear.
pub struct FirstVolume {
    seen: Arc<Mutex<Option<Instant>>>,
    task: tokio::task::JoinHandle<()>,
}

impl FirstVolume {
    /// Watches only `name` (a field selector), so the cluster's other PVs cost nothing.
    pub async fn watch(cluster: &Cluster, name: &str) -> Result<FirstVolume, BenchError> {
        let seen: Arc<Mutex<Option<Instant>>> = Arc::default();
        let sink = Arc::clone(&seen);
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let task = watch_applied(
            Api::<PersistentVolume>::all(cluster.client.clone()),
            config,
            "the new claim's PV",
            move |pv: PersistentVolume| {
                if pv.spec.as_ref().is_some_and(|s| s.claim_ref.is_some()) {
                    lock(&sink).get_or_insert_with(Instant::now);
                }
            },
        )
        .await?;
        Ok(FirstVolume { seen, task })
    }

    /// Seconds from `t0` until the PV was seen, if it was.
    pub fn after(&self, t0: Instant) -> Option<f64> {
        lock(&self.seen).map(|t| t.saturating_duration_since(t0).as_secs_f64())
    }
}

impl Drop for FirstVolume {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Watches `api` and hands every object it lists or sees added or changed to `on_applied`
/// (deletions are not reported); returns once the initial list is done, so nothing present is
/// missed. The task runs until the handle is aborted.
pub(super) async fn watch_applied<K>(
    api: Api<K>,
    config: watcher::Config,
    what: &str,
    mut on_applied: impl FnMut(K) + Send + 'static,
) -> Result<tokio::task::JoinHandle<()>, BenchError>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send,
{
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let label = what.to_owned();
    let task = tokio::spawn(async move {
        let mut ready = Some(ready_tx);
        let mut events = pin!(watcher(api, config).default_backoff());
        while let Some(event) = events.next().await {
            match event {
                Ok(Event::Apply(object) | Event::InitApply(object)) => on_applied(object),
                Ok(Event::InitDone) => {
                    if let Some(tx) = ready.take() {
                        let _ = tx.send(());
                    }
                }
                Ok(_) => {}
                Err(e) => eprintln!("[bench] {label} watch: {e} (it restarts)"),
            }
        }
    });
    match wait_ready(ready_rx, what).await {
        Ok(()) => Ok(task),
        Err(e) => {
            task.abort();
            Err(e)
        }
    }
}

async fn wait_ready(
    ready: tokio::sync::oneshot::Receiver<()>,
    what: &str,
) -> Result<(), BenchError> {
    match tokio::time::timeout(Duration::from_secs(60), ready).await {
        Ok(Ok(())) => Ok(()),
        _ => Err(BenchError::Step {
            step: format!("starting the watch of {what}"),
            detail: "no initial list within 60s".into(),
        }),
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_sort_in_creation_order() {
        assert_eq!(numbered("c", 2), vec!["c-00001", "c-00002"]);
    }

    #[test]
    fn idle_volumes_look_provisioned_and_pre_bound() {
        let pv = volume("pv-idle-00001", Some("idle-00001"), true);
        assert_eq!(pv.metadata.finalizers, Some(vec![PV_FINALIZER.to_owned()]));
        let spec = pv.spec.expect("spec");
        assert_eq!(
            spec.persistent_volume_reclaim_policy.as_deref(),
            Some("Delete")
        );
        let claim_ref = spec.claim_ref.expect("claimRef");
        assert_eq!(claim_ref.name.as_deref(), Some("idle-00001"));
        assert_eq!(claim_ref.uid, None);
        let raw = volume("raw-00001", None, false).spec.expect("spec");
        assert_eq!(
            raw.persistent_volume_reclaim_policy.as_deref(),
            Some("Retain")
        );
    }
}
