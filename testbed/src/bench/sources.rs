//! (i): data sources. The real snapshot machinery (snapshot CRDs, snapshot-controller and the
//! driver's csi-snapshotter, `csi_testbed::snapshots`) runs beside the sidecar. One source claim
//! is provisioned and one VolumeSnapshot of it taken as a user takes it (a VolumeSnapshotClass
//! and a VolumeSnapshot through the API, never a content by hand); then many claims restore from
//! that snapshot at once, and after them many claims clone the source claim at once.
//!
//! Figures of wrong behaviour are worth nothing, so every run ends with a check, in the reference
//! driver's durable state, that each claim's volume was created from the right content source
//! and that there are exactly as many volumes and PVs as claims; a mismatch fails the run.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use csi_testbed::snapshots::{self, SnapshotBinaries, SnapshotPeer};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::{
    PersistentVolume, PersistentVolumeClaim, TypedLocalObjectReference,
};
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::core::GroupVersionKind;
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use super::api::{self, CLASS, ClaimWatch, Cluster, DRIVER_NAME, NAMESPACE};
use super::proc;
use super::report::Results;
use super::scenarios::{
    Driver, Extra, QUIET, prepare_cluster, request_rows, spawn_sidecar, start_control_plane,
    wait_for, warm_up,
};
use super::stats::{self, Impl};
use super::{Bench, BenchError};

const SNAPSHOT_GROUP: &str = "snapshot.storage.k8s.io";
const SNAPSHOT_CLASS: &str = "csi-bench-snapshots";
const SOURCE_CLAIM: &str = "source";
const SNAPSHOT: &str = "source-snapshot";
/// Both sidecars' default `--retry-interval-max`.
const RETRY_INTERVAL_MAX: Duration = Duration::from_secs(300);
/// Creating the snapshot and the content, and CreateSnapshot, take a few seconds on 2 shared
/// cores; this is far more.
const SNAPSHOT_READY_LIMIT: Duration = Duration::from_secs(120);

/// The snapshot programs and CRDs, built by `hack/build-snapshotter.sh` (cached after the first
/// time).
pub fn prepare() -> Result<SnapshotBinaries, BenchError> {
    Ok(SnapshotBinaries::at(&csi_testbed::workspace::snapshotter()?))
}

fn peer_error(what: &str, e: csi_testbed::Error) -> BenchError {
    BenchError::Step {
        step: what.to_owned(),
        detail: e.to_string(),
    }
}

/// (i): one run with `n` restores, then `n` clones.
pub async fn data_sources(
    b: &Bench,
    binaries: &SnapshotBinaries,
    imp: Impl,
    round: u32,
    results: &mut Results,
) -> Result<(), BenchError> {
    let n = b.sizes.sources;
    let tag = format!("(i) {imp} round {round}");
    let say = |m: String| b.say(format!("{tag}: {m}"));
    let cp = start_control_plane(b, &tag).await?;
    let crds = binaries
        .crd_files()
        .map_err(|e| peer_error("finding the snapshot CRDs", e))?;
    snapshots::install_crds(&cp, &crds)
        .await
        .map_err(|e| peer_error("installing the snapshot CRDs", e))?;
    let cluster = prepare_cluster(b, &cp).await?;
    let mut controller = SnapshotPeer::start_controller(&cp, binaries)
        .map_err(|e| peer_error("starting snapshot-controller", e))?;
    let name = format!("i-{imp}-r{round}");
    let mut driver = Driver::start(b, &name).await?;
    let mut snapshotter =
        SnapshotPeer::start_csi_snapshotter(&cp, binaries, DRIVER_NAME, driver.socket())
            .map_err(|e| peer_error("starting csi-snapshotter", e))?;
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
    warm_up(b, &tag, &cluster, &mut sidecar, &mut driver).await?;

    // The source claim and its snapshot, before anything is counted.
    let claims = ClaimWatch::start(&cluster.client, NAMESPACE).await?;
    create_claims(
        &cluster,
        std::slice::from_ref(&SOURCE_CLAIM.to_owned()),
        None,
    )
    .await?;
    wait_for(
        b,
        &tag,
        &mut [&mut sidecar, &mut driver.proc],
        Duration::from_secs(120),
        || {
            Ok((
                claims.is_bound(SOURCE_CLAIM),
                "source claim not Bound yet".into(),
            ))
        },
    )
    .await?;
    say("source claim Bound; taking its snapshot".into());
    create_snapshot(&cluster).await?;
    let snapshot_handle = wait_snapshot_ready(&cluster, &mut [&mut controller, &mut snapshotter])
        .await
        .map_err(|detail| BenchError::Step {
            step: format!("{tag}: waiting for VolumeSnapshot {SNAPSHOT} to be readyToUse"),
            detail,
        })?;
    say(format!("snapshot ready ({snapshot_handle})"));
    cluster
        .wait_quiet(QUIET, Duration::from_secs(60), say)
        .await?;

    // A claim whose source update keeps conflicting backs off up to both sidecars' default
    // `--retry-interval-max` (5 minutes) between attempts: a run must outlast one such wait.
    let limit = Duration::from_secs_f64(180.0 + n as f64 * 0.5) + RETRY_INTERVAL_MAX;
    // Recorded only once the check at the end has passed.
    let mut samples = Vec::new();
    let mut requests = Vec::new();
    let mut bound_before = 1;
    for phase in [Phase::Restore, Phase::Clone] {
        let names = api::numbered(phase.prefix(), n);
        let before = cluster.snapshot().await?;
        let cpu_before = sidecar.now(b.ticks).cpu_secs;
        say(format!("creating {n} claims that {}", phase.describe()));
        let t0 = Instant::now();
        create_claims(&cluster, &names, Some(phase.data_source())).await?;
        say(format!(
            "{n} claims created in {:.1}s",
            t0.elapsed().as_secs_f64()
        ));
        let want = bound_before + n;
        wait_for(
            b,
            &tag,
            &mut [&mut sidecar, &mut driver.proc],
            limit,
            || {
                for peer in [&mut controller, &mut snapshotter] {
                    peer.check_running()
                        .map_err(|e| peer_error("a snapshot program stopped", e))?;
                }
                let k = claims.bound_count().saturating_sub(bound_before);
                Ok((
                    claims.bound_count() >= want,
                    format!("{k}/{n} claims Bound"),
                ))
            },
        )
        .await?;
        // The watch's time stamps; claims Bound before `t0` count as 0.
        let to_bound = claims.bound_after(t0).last().copied().unwrap_or(f64::NAN);
        cluster.wait_quiet(QUIET, limit, say).await?;
        let delta = cluster.snapshot().await?.since(&before);
        let cpu = sidecar.now(b.ticks).cpu_secs - cpu_before;
        let writes = delta.sidecar_writes() / n as f64;
        let [m_bound, m_writes, m_cpu] = phase.metrics();
        samples.extend([(m_bound, to_bound), (m_writes, writes), (m_cpu, cpu)]);
        requests.extend(request_rows(&delta, "i", imp, round, phase.prefix(), n));
        say(format!(
            "{}: all Bound {to_bound:.1}s, {writes:.2} sidecar writes per volume, CPU {cpu:.2}s",
            phase.prefix()
        ));
        bound_before = want;
    }
    let peak = sidecar.now(b.ticks).hwm_mib();
    samples.push((stats::I_PEAK_RSS, peak));
    sidecar.stop().await;
    let sources = proc::driver_volume_sources(driver.state_dir())?;
    driver.stop().await;
    let observed = observe(&cluster.client)
        .await
        .map_err(|e| BenchError::Step {
            step: format!("{tag}: reading claims and PVs for the check"),
            detail: e.to_string(),
        })?;
    check_sources(&observed, &sources, &snapshot_handle, n).map_err(|detail| BenchError::Step {
        step: format!("{tag}: content sources of the volumes"),
        detail,
    })?;
    for (metric, value) in samples {
        results.sample(metric, Some(imp), round, value);
    }
    results.requests.extend(requests);
    say(format!(
        "done: every restore from {snapshot_handle}, every clone from the source's volume; \
         peak RSS {peak:.0} MiB"
    ));
    Ok(())
}

/// The two timed phases of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Restore,
    Clone,
}

impl Phase {
    /// Names the claims (`restore-00001`, ...) and the request rows.
    fn prefix(self) -> &'static str {
        match self {
            Phase::Restore => "restore",
            Phase::Clone => "clone",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Phase::Restore => "restore from the snapshot",
            Phase::Clone => "clone the source claim",
        }
    }

    fn data_source(self) -> TypedLocalObjectReference {
        match self {
            Phase::Restore => TypedLocalObjectReference {
                api_group: Some(SNAPSHOT_GROUP.to_owned()),
                kind: "VolumeSnapshot".to_owned(),
                name: SNAPSHOT.to_owned(),
            },
            Phase::Clone => TypedLocalObjectReference {
                api_group: None,
                kind: "PersistentVolumeClaim".to_owned(),
                name: SOURCE_CLAIM.to_owned(),
            },
        }
    }

    /// Time to all Bound, writes per volume, CPU.
    fn metrics(self) -> [stats::Metric; 3] {
        match self {
            Phase::Restore => [
                stats::I_RESTORE_BOUND,
                stats::I_RESTORE_WRITES,
                stats::I_RESTORE_CPU,
            ],
            Phase::Clone => [
                stats::I_CLONE_BOUND,
                stats::I_CLONE_WRITES,
                stats::I_CLONE_CPU,
            ],
        }
    }

    /// The phase whose claims are named like `claim`, if any.
    fn of_claim(claim: &str) -> Option<Phase> {
        [Phase::Restore, Phase::Clone].into_iter().find(|p| {
            claim
                .strip_prefix(p.prefix())
                .is_some_and(|rest| rest.starts_with('-'))
        })
    }
}

async fn create_claims(
    cluster: &Cluster,
    names: &[String],
    source: Option<TypedLocalObjectReference>,
) -> Result<(), BenchError> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    stream::iter(names)
        .map(|name| {
            let claims = claims.clone();
            let mut claim = api::claim(name, None);
            if let Some(spec) = claim.spec.as_mut() {
                spec.data_source.clone_from(&source);
            }
            async move { cluster.create(&claims, &claim).await }
        })
        .buffer_unordered(api::CONCURRENCY)
        .try_collect::<()>()
        .await
}

fn snapshot_api(client: &Client, kind: &str, plural: &str, namespaced: bool) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk(SNAPSHOT_GROUP, "v1", kind);
    let resource = ApiResource::from_gvk_with_plural(&gvk, plural);
    if namespaced {
        Api::namespaced_with(client.clone(), NAMESPACE, &resource)
    } else {
        Api::all_with(client.clone(), &resource)
    }
}

/// A VolumeSnapshotClass of the driver and a VolumeSnapshot of the source claim in it.
async fn create_snapshot(cluster: &Cluster) -> Result<(), BenchError> {
    let object = |value: Value| {
        serde_json::from_value::<DynamicObject>(value).map_err(|e| BenchError::Step {
            step: "building a snapshot object".into(),
            detail: e.to_string(),
        })
    };
    let class = object(json!({
        "apiVersion": format!("{SNAPSHOT_GROUP}/v1"),
        "kind": "VolumeSnapshotClass",
        "metadata": {"name": SNAPSHOT_CLASS},
        "driver": DRIVER_NAME,
        "deletionPolicy": "Delete",
    }))?;
    let snapshot = object(json!({
        "apiVersion": format!("{SNAPSHOT_GROUP}/v1"),
        "kind": "VolumeSnapshot",
        "metadata": {"name": SNAPSHOT, "namespace": NAMESPACE},
        "spec": {
            "source": {"persistentVolumeClaimName": SOURCE_CLAIM},
            "volumeSnapshotClassName": SNAPSHOT_CLASS,
        },
    }))?;
    let client = &cluster.client;
    cluster
        .create(
            &snapshot_api(
                client,
                "VolumeSnapshotClass",
                "volumesnapshotclasses",
                false,
            ),
            &class,
        )
        .await?;
    cluster
        .create(
            &snapshot_api(client, "VolumeSnapshot", "volumesnapshots", true),
            &snapshot,
        )
        .await
}

/// Waits until the snapshot is readyToUse; returns its content's `snapshotHandle` (the driver's
/// snapshot id, which every restore must name).
async fn wait_snapshot_ready(
    cluster: &Cluster,
    peers: &mut [&mut SnapshotPeer],
) -> Result<String, String> {
    let snapshots = snapshot_api(&cluster.client, "VolumeSnapshot", "volumesnapshots", true);
    let contents = snapshot_api(
        &cluster.client,
        "VolumeSnapshotContent",
        "volumesnapshotcontents",
        false,
    );
    let started = Instant::now();
    loop {
        for peer in peers.iter_mut() {
            peer.check_running().map_err(|e| e.to_string())?;
        }
        let status = match snapshots.get_opt(SNAPSHOT).await {
            Ok(found) => found.map(|s| s.data["status"].clone()).unwrap_or_default(),
            Err(e) => return Err(e.to_string()),
        };
        let content_name = status["boundVolumeSnapshotContentName"].as_str();
        if let (Some(true), Some(content_name)) = (status["readyToUse"].as_bool(), content_name) {
            let content = contents
                .get(content_name)
                .await
                .map_err(|e| e.to_string())?;
            if let Some(handle) = content.data["status"]["snapshotHandle"].as_str() {
                return Ok(handle.to_owned());
            }
        }
        if started.elapsed() > SNAPSHOT_READY_LIMIT {
            return Err(format!(
                "not ready after {}s: status {status}",
                SNAPSHOT_READY_LIMIT.as_secs()
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What the check needs from the API: each claim's PV, each PV's volume handle.
#[derive(Debug, Default)]
struct Observed {
    /// Claim name → the PV it is bound to (`None`: not bound).
    claims: BTreeMap<String, Option<String>>,
    /// PV name → CSI volume handle, for the PVs of the bench class.
    volumes: BTreeMap<String, String>,
}

async fn observe(client: &Client) -> Result<Observed, kube::Error> {
    let lp = ListParams::default();
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), NAMESPACE)
        .list(&lp)
        .await?
        .into_iter()
        .map(|c| {
            let volume = c.spec.as_ref().and_then(|s| s.volume_name.clone());
            (c.name_any(), volume)
        })
        .collect();
    let volumes = Api::<PersistentVolume>::all(client.clone())
        .list(&lp)
        .await?
        .into_iter()
        .filter_map(|pv| {
            let spec = pv.spec.as_ref()?;
            if spec.storage_class_name.as_deref() != Some(CLASS) {
                return None;
            }
            let handle = spec.csi.as_ref()?.volume_handle.clone();
            Some((pv.name_any(), handle))
        })
        .collect();
    Ok(Observed { claims, volumes })
}

/// Pure: every restore claim's volume was created from `snapshot_handle`, every clone's from the
/// source claim's volume, the source's from nothing; `n` claims of each phase, and exactly one
/// PV and one driver volume per claim. `Err` names what is wrong.
fn check_sources(
    observed: &Observed,
    driver: &BTreeMap<String, Option<Value>>,
    snapshot_handle: &str,
    n: usize,
) -> Result<(), String> {
    let handle_of = |claim: &str| -> Result<&str, String> {
        let pv = observed
            .claims
            .get(claim)
            .ok_or_else(|| format!("claim {claim} is missing"))?
            .as_deref()
            .ok_or_else(|| format!("claim {claim} is not bound"))?;
        observed
            .volumes
            .get(pv)
            .map(String::as_str)
            .ok_or_else(|| format!("PV {pv} of claim {claim} is missing"))
    };
    let source_handle = handle_of(SOURCE_CLAIM)?;
    let mut wrong = Vec::new();
    let mut per_phase = [0_usize; 2];
    for claim in observed.claims.keys() {
        let want = match Phase::of_claim(claim) {
            Some(phase) => {
                per_phase[usize::from(phase == Phase::Clone)] += 1;
                Some(match phase {
                    Phase::Restore => json!({"snapshot": snapshot_handle}),
                    Phase::Clone => json!({"volume": source_handle}),
                })
            }
            None if claim == SOURCE_CLAIM => None,
            None => {
                wrong.push(format!("{claim}: a claim the benchmark did not create"));
                continue;
            }
        };
        let verdict = handle_of(claim).and_then(|handle| match driver.get(handle) {
            None => Err(format!("volume {handle} is not in the driver")),
            Some(got) if *got != want => Err(format!(
                "volume {handle} was created from {}, expected {}",
                got.as_ref().map_or("nothing".into(), Value::to_string),
                want.as_ref().map_or("nothing".into(), Value::to_string),
            )),
            Some(_) => Ok(()),
        });
        if let Err(e) = verdict {
            wrong.push(format!("{claim}: {e}"));
        }
    }
    if per_phase != [n, n] {
        wrong.push(format!(
            "{} restore and {} clone claims, expected {n} of each",
            per_phase[0], per_phase[1]
        ));
    }
    let claims = observed.claims.len();
    if observed.volumes.len() != claims || driver.len() != claims {
        wrong.push(format!(
            "{claims} claims, {} PVs, {} driver volumes: expected one of each per claim",
            observed.volumes.len(),
            driver.len()
        ));
    }
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} problem(s), e.g. {}",
            wrong.len(),
            wrong.iter().take(3).cloned().collect::<Vec<_>>().join("; ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Source `vol-0`, snapshot `snap-1`; `n` restores `vol-r<i>` and clones `vol-c<i>`.
    fn world(n: usize) -> (Observed, BTreeMap<String, Option<Value>>) {
        let mut observed = Observed::default();
        let mut driver = BTreeMap::new();
        let mut add = |claim: String, handle: String, source: Option<Value>| {
            let pv = format!("pv-{claim}");
            observed.claims.insert(claim, Some(pv.clone()));
            observed.volumes.insert(pv, handle.clone());
            driver.insert(handle, source);
        };
        add(SOURCE_CLAIM.into(), "vol-0".into(), None);
        for (i, name) in api::numbered("restore", n).into_iter().enumerate() {
            add(
                name,
                format!("vol-r{i}"),
                Some(json!({"snapshot": "snap-1"})),
            );
        }
        for (i, name) in api::numbered("clone", n).into_iter().enumerate() {
            add(name, format!("vol-c{i}"), Some(json!({"volume": "vol-0"})));
        }
        (observed, driver)
    }

    #[test]
    fn right_sources_and_counts_pass() {
        let (observed, driver) = world(3);
        assert_eq!(check_sources(&observed, &driver, "snap-1", 3), Ok(()));
    }

    #[test]
    fn a_restore_from_nothing_or_a_clone_of_the_wrong_volume_fails() {
        let (observed, mut driver) = world(3);
        driver.insert("vol-r1".into(), None);
        driver.insert("vol-c2".into(), Some(json!({"volume": "vol-r0"})));
        let err = check_sources(&observed, &driver, "snap-1", 3).expect_err("wrong sources");
        assert!(err.starts_with("2 problem(s)"), "{err}");
        assert!(
            err.contains("restore-00002") && err.contains("clone-00003"),
            "{err}"
        );
    }

    #[test]
    fn missing_claims_unbound_claims_and_extra_volumes_fail() {
        let (mut observed, mut driver) = world(3);
        assert!(check_sources(&observed, &driver, "snap-1", 4).is_err());
        observed.claims.insert("clone-00002".into(), None);
        let err = check_sources(&observed, &driver, "snap-1", 3).expect_err("unbound");
        assert!(err.contains("not bound"), "{err}");
        let (observed, _) = world(3);
        driver.insert("vol-leaked".into(), None);
        let err = check_sources(&observed, &driver, "snap-1", 3).expect_err("extra volume");
        assert!(err.contains("driver volumes"), "{err}");
    }

    #[test]
    fn claims_map_to_their_phase_by_name() {
        assert_eq!(Phase::of_claim("restore-00001"), Some(Phase::Restore));
        assert_eq!(Phase::of_claim("clone-00200"), Some(Phase::Clone));
        assert_eq!(Phase::of_claim(SOURCE_CLAIM), None);
        assert_eq!(Phase::of_claim("cloned"), None);
    }
}
