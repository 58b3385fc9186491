//! One run of each scenario: start what it needs, measure, record into [`Results`], stop
//! everything. docs/benchmarks.md ("Method") describes each; the issue names them (a) to (g).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use csi_testbed::ControlPlane;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::Api;
use nix::sys::signal::Signal;

use super::api::{
    self, Binding, ClaimWatch, Cluster, Delta, FirstVolume, LEASE_NAMESPACE, NAMESPACE, VolumeWatch,
};
use super::proc::{self, CpuWindow, Proc, Spawn};
use super::report::{Curve, RequestRow, Results};
use super::stats::{self, Impl, median};
use super::{Bench, BenchError};

/// No write for this long ends a phase's request count.
pub(super) const QUIET: Duration = Duration::from_secs(3);
/// How often a waiting loop prints where it stands.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);
/// The most points of one run's series kept for the plots.
const MAX_POINTS: usize = 1500;
/// (d): the sidecar is idle when it used less than this share of a core over `IDLE_WINDOW`.
pub(super) const IDLE_CPU_SHARE: f64 = 0.03;
pub(super) const IDLE_WINDOW: Duration = Duration::from_secs(3);
const SETTLE_CAP: Duration = Duration::from_secs(300);
/// (f): identities (hostnames) of the two replicas.
const REPLICAS: [&str; 2] = ["replica-a", "replica-b"];

pub async fn start_control_plane(b: &Bench, tag: &str) -> Result<ControlPlane, BenchError> {
    b.say(format!("{tag}: starting a control plane"));
    ControlPlane::start().await.map_err(|e| BenchError::Step {
        step: "starting the control plane".into(),
        detail: e.to_string(),
    })
}

/// The same cluster for both sidecars: our CRDs (the journal) are installed for upstream too,
/// plus the namespaces and the StorageClass.
pub(super) async fn prepare_cluster(b: &Bench, cp: &ControlPlane) -> Result<Cluster, BenchError> {
    let crds = csi_testbed::workspace::root()
        .join("deploy")
        .join("base")
        .join("crd.yaml");
    let kubeconfig = format!("--kubeconfig={}", cp.kubeconfig_path().display());
    for args in [
        vec!["apply", "-f"],
        vec!["wait", "--for=condition=Established", "--timeout=60s", "-f"],
    ] {
        let out = tokio::process::Command::new(&b.programs.kubectl)
            .arg(&kubeconfig)
            .args(args)
            .arg(&crds)
            .output()
            .await
            .map_err(|source| BenchError::Io {
                what: format!("running {}", b.programs.kubectl.display()),
                source,
            })?;
        if !out.status.success() {
            return Err(BenchError::Step {
                step: format!("installing {}", crds.display()),
                detail: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
    }
    let cluster = Cluster::connect(cp).await?;
    cluster.setup().await?;
    Ok(cluster)
}

/// The reference driver with fresh state on scratch space.
pub struct Driver {
    pub(super) proc: Proc,
    state: PathBuf,
    socket: PathBuf,
    // Removed on drop, after the process has stopped.
    _dir: tempfile::TempDir,
}

impl Driver {
    pub async fn start(b: &Bench, name: &str) -> Result<Driver, BenchError> {
        Driver::start_with(b, name, &[]).await
    }

    /// [`Driver::start`] with more flags, e.g. topology segments.
    pub async fn start_with(b: &Bench, name: &str, extra: &[String]) -> Result<Driver, BenchError> {
        let dir = tempfile::Builder::new()
            .prefix("csi-bench-driver-")
            .tempdir_in(&b.scratch)
            .map_err(|source| BenchError::Io {
                what: format!("creating a driver directory in {}", b.scratch.display()),
                source,
            })?;
        let socket = dir.path().join("csi.sock");
        let mut args = vec![
            format!("--endpoint={}", socket.display()),
            format!("--state-dir={}", dir.path().join("state").display()),
        ];
        args.extend_from_slice(extra);
        let mut proc = Proc::spawn(
            &Spawn {
                name: "csi-reference-driver",
                program: &b.programs.driver,
                args: &args,
                log: &b.logs.join(format!("{name}-driver.log")),
                // Every RPC is logged at info; both sidecars would pay for that alike, but it
                // is the driver's cost, not theirs.
                env: &[("RUST_LOG", "warn")],
                hostname: None,
            },
            b.ticks,
        )?;
        let started = Instant::now();
        while !socket.exists() {
            proc.check_alive()?;
            if started.elapsed() > Duration::from_secs(15) {
                return Err(BenchError::Step {
                    step: "starting the reference driver".into(),
                    detail: format!("no socket at {} after 15s", socket.display()),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(Driver {
            proc,
            state: dir.path().join("state"),
            socket,
            _dir: dir,
        })
    }

    pub fn volumes(&self) -> Result<usize, BenchError> {
        proc::driver_volume_count(&self.state)
    }

    pub fn state_dir(&self) -> &std::path::Path {
        &self.state
    }

    /// Its CSI socket, for a peer such as csi-snapshotter.
    pub fn socket(&self) -> &std::path::Path {
        &self.socket
    }

    /// Replaces the driver's fault rules through its control file (docs/reference-driver.md),
    /// written to a temporary file and renamed so the driver never reads half of it.
    pub fn set_faults(&self, rules: &str) -> Result<(), BenchError> {
        let path = self.state.join("faults.txt");
        let temporary = self.state.join("faults.txt.tmp");
        std::fs::write(&temporary, rules)
            .and_then(|()| std::fs::rename(&temporary, &path))
            .map_err(|source| BenchError::Io {
                what: format!("writing {}", path.display()),
                source,
            })
    }

    pub async fn stop(self) {
        self.proc.stop().await;
    }
}

/// What one sidecar gets beyond the flags every sidecar gets; the same for ours and upstream's.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Extra<'a> {
    pub flags: &'a [String],
    /// Added to the environment (node mode's `NODE_NAME`); `--ours-env` is added to ours' only.
    pub env: &'a [(&'a str, &'a str)],
    /// See [`Spawn::hostname`].
    pub hostname: Option<&'a str>,
}

/// Ours or upstream's, with the flags both get.
pub(super) fn spawn_sidecar(
    b: &Bench,
    imp: Impl,
    driver: &Driver,
    cp: &ControlPlane,
    extra: &Extra<'_>,
    log: &str,
) -> Result<Proc, BenchError> {
    let mut args = vec![
        format!("--csi-address={}", driver.socket.display()),
        format!("--kubeconfig={}", cp.kubeconfig_path().display()),
        "--v=0".to_owned(),
    ];
    args.extend_from_slice(extra.flags);
    let mut env = extra.env.to_vec();
    let program = match imp {
        Impl::Ours => {
            env.extend(b.ours_env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
            &b.programs.ours
        }
        Impl::Upstream => &b.programs.upstream,
    };
    Proc::spawn(
        &Spawn {
            name: &format!("{imp} csi-provisioner"),
            program,
            args: &args,
            log: &b.logs.join(format!("{log}.log")),
            env: &env,
            hostname: extra.hostname,
        },
        b.ticks,
    )
}

/// Polls `check` every 100 ms until it says done, failing if a process dies or `limit`
/// passes; prints the status it returns every few seconds.
pub(super) async fn wait_for(
    b: &Bench,
    tag: &str,
    alive: &mut [&mut Proc],
    limit: Duration,
    mut check: impl FnMut() -> Result<(bool, String), BenchError>,
) -> Result<Duration, BenchError> {
    let started = Instant::now();
    let mut last_report = Instant::now();
    loop {
        let (done, status) = check()?;
        if done {
            return Ok(started.elapsed());
        }
        for p in alive.iter_mut() {
            p.check_alive()?;
        }
        if started.elapsed() > limit {
            return Err(BenchError::Step {
                step: format!("{tag}: waiting"),
                detail: format!("gave up after {}s: {status}", limit.as_secs()),
            });
        }
        if last_report.elapsed() >= PROGRESS_EVERY {
            b.say(format!(
                "{tag}: {status} ({:.0}s)",
                started.elapsed().as_secs_f64()
            ));
            last_report = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One claim provisioned and deleted before anything is counted: caches are synced and
/// connections open, for both sidecars alike.
pub(super) async fn warm_up(
    b: &Bench,
    tag: &str,
    cluster: &Cluster,
    sidecar: &mut Proc,
    driver: &mut Driver,
) -> Result<(), BenchError> {
    let name = "warm-up".to_owned();
    let watch = ClaimWatch::start(&cluster.client, api::WARMUP_NAMESPACE).await?;
    cluster
        .create_claims(api::WARMUP_NAMESPACE, std::slice::from_ref(&name), false)
        .await?;
    let limit = Duration::from_secs(120);
    wait_for(
        b,
        tag,
        &mut [&mut *sidecar, &mut driver.proc],
        limit,
        || Ok((watch.is_bound(&name), "warm-up claim not Bound yet".into())),
    )
    .await?;
    cluster
        .delete_claims(api::WARMUP_NAMESPACE, std::slice::from_ref(&name))
        .await?;
    let deadline = Instant::now() + limit;
    loop {
        let left = cluster.count_volumes().await? + driver.volumes()?;
        if left == 0 {
            return Ok(());
        }
        sidecar.check_alive()?;
        if Instant::now() > deadline {
            return Err(BenchError::Step {
                step: format!("{tag}: deleting the warm-up claim"),
                detail: format!("{left} PV(s) or driver volume(s) still there after 120s"),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub(super) fn thin(points: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
    let step = points.len().div_ceil(MAX_POINTS).max(1);
    let last = points.last().copied();
    let mut kept: Vec<(f64, f64)> = points.into_iter().step_by(step).collect();
    if let Some(last) = last
        && kept.last() != Some(&last)
    {
        kept.push(last);
    }
    kept
}

pub(super) fn rss_points(sidecar: &Proc, t0: Instant) -> Vec<(f64, f64)> {
    thin(
        sidecar
            .samples()
            .iter()
            .map(|(t, s)| (t.saturating_duration_since(t0).as_secs_f64(), s.rss_mib()))
            .collect(),
    )
}

pub(super) fn request_rows(
    delta: &Delta,
    scenario: &'static str,
    imp: Impl,
    round: u32,
    phase: &'static str,
    n: usize,
) -> Vec<RequestRow> {
    delta
        .api
        .0
        .iter()
        .filter(|((verb, resource, _), _)| {
            verb != "WATCH" && !resource.is_empty() && resource != "leases"
        })
        .map(|((verb, resource, sub), count)| RequestRow {
            scenario,
            imp,
            round,
            phase,
            verb: verb.clone(),
            resource: resource.clone(),
            subresource: sub.clone(),
            per_volume: count / n as f64,
        })
        .collect()
}

/// Which run of a claim's life cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lifecycle {
    /// (a), then (c) and (e): default QPS.
    Default,
    /// (b), then (c) and (e): `--kube-api-qps 500 --kube-api-burst 1000`.
    Fast,
    /// (b) with claims that carry the storage-provisioner annotation from the start: the
    /// sidecar's own provisioning rate, without waiting for the binder. No deletion phase.
    FastPreAnnotated,
}

impl Lifecycle {
    pub fn scenario(self) -> &'static str {
        match self {
            Lifecycle::Default => "a",
            Lifecycle::Fast => "b",
            Lifecycle::FastPreAnnotated => "b (pre-annotated)",
        }
    }

    fn file_tag(self) -> &'static str {
        match self {
            Lifecycle::Default => "a",
            Lifecycle::Fast => "b",
            Lifecycle::FastPreAnnotated => "b-pre",
        }
    }
}

/// (a) or (b), then (c) in the same run, with (e) counted over both phases.
pub async fn lifecycle(
    b: &Bench,
    imp: Impl,
    round: u32,
    kind: Lifecycle,
    results: &mut Results,
) -> Result<(), BenchError> {
    let fast = kind != Lifecycle::Default;
    let tag = format!("({}) {imp} round {round}", kind.scenario());
    let n = if fast {
        b.sizes.claims_b
    } else {
        b.sizes.claims_a
    };
    let cp = start_control_plane(b, &tag).await?;
    let cluster = prepare_cluster(b, &cp).await?;
    let name = format!("{}-{imp}-r{round}", kind.file_tag());
    let mut driver = Driver::start(b, &name).await?;
    let qps: Vec<String> = if fast {
        vec!["--kube-api-qps=500".into(), "--kube-api-burst=1000".into()]
    } else {
        Vec::new()
    };
    let started = Instant::now();
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
    let claims = ClaimWatch::start(&cluster.client, NAMESPACE).await?;
    let volumes = VolumeWatch::start(&cluster.client, api::CLASS).await?;
    let say = |m: String| b.say(format!("{tag}: {m}"));
    cluster
        .wait_quiet(QUIET, Duration::from_secs(60), say)
        .await?;
    let before = cluster.snapshot().await?;
    let cpu_before = sidecar.now(b.ticks).cpu_secs;
    let apiserver = apiserver_pid(&cp);
    let apiserver_cpu = || {
        apiserver
            .and_then(|pid| proc::read_proc(pid, b.ticks))
            .map_or(f64::NAN, |stat| stat.cpu_secs)
    };
    let apiserver_before = apiserver_cpu();

    // Default QPS 5 and about three writes per claim: 0.6 s per claim; allow far more.
    let per_claim = if fast { 0.5 } else { 3.0 };
    let limit = Duration::from_secs_f64(180.0 + n as f64 * per_claim);
    let names = api::numbered("claim", n);
    b.say(format!("{tag}: creating {n} claims"));
    let t0 = Instant::now();
    cluster
        .create_claims(NAMESPACE, &names, kind == Lifecycle::FastPreAnnotated)
        .await?;
    b.say(format!(
        "{tag}: {n} claims created in {:.1}s",
        t0.elapsed().as_secs_f64()
    ));
    let to_bound = t0.elapsed()
        + wait_for(
            b,
            &tag,
            &mut [&mut sidecar, &mut driver.proc],
            limit,
            || {
                let k = claims.bound_count();
                let pvs = volumes.appeared();
                Ok((
                    k >= n,
                    format!("{pvs}/{n} PVs created, {k}/{n} claims Bound"),
                ))
            },
        )
        .await?;
    let to_pvs = volumes.last_appeared_after(t0).unwrap_or(f64::NAN);
    let bound_at = claims.bound_after(t0);
    let peak = sidecar.now(b.ticks).hwm_mib();
    b.say(format!(
        "{tag}: all {n} PVs created after {to_pvs:.1}s, all claims Bound after {:.1}s",
        to_bound.as_secs_f64()
    ));
    let imp_ = Some(imp);
    if kind == Lifecycle::FastPreAnnotated {
        results.sample(stats::B_PRE_PVS, imp_, round, to_pvs);
        results.sample(stats::B_PRE_RATE, imp_, round, n as f64 / to_pvs);
        sidecar.stop().await;
        driver.stop().await;
        return Ok(());
    }
    cluster.wait_quiet(QUIET, limit, say).await?;
    let provisioned = cluster.snapshot().await?;
    let cpu_provisioned = sidecar.now(b.ticks).cpu_secs;
    let apiserver_provisioned = apiserver_cpu();

    let (m_bound, m_pvs, m_rate, m_rss, m_cpu, m_gone, curve_bound, curve_gone, curve_rss) = if fast
    {
        (
            stats::B_BOUND,
            stats::B_PVS,
            stats::B_RATE,
            stats::B_PEAK_RSS,
            stats::B_CPU,
            stats::C_GONE_FAST,
            "b_bound",
            "c_remaining_fast",
            "b_rss",
        )
    } else {
        (
            stats::A_BOUND,
            stats::A_PVS,
            stats::A_RATE,
            stats::A_PEAK_RSS,
            stats::A_CPU,
            stats::C_GONE,
            "a_bound",
            "c_remaining",
            "a_rss",
        )
    };
    results.sample(m_bound, imp_, round, to_bound.as_secs_f64());
    results.sample(m_pvs, imp_, round, to_pvs);
    results.sample(m_rate, imp_, round, n as f64 / to_bound.as_secs_f64());
    results.sample(m_rss, imp_, round, peak);
    results.sample(m_cpu, imp_, round, cpu_provisioned - cpu_before);
    let mut points = vec![(0.0, 0.0)];
    points.extend(
        bound_at
            .iter()
            .enumerate()
            .map(|(i, t)| (*t, (i + 1) as f64)),
    );
    results.curves.push(Curve {
        name: curve_bound,
        imp,
        round,
        points: thin(points),
    });

    // Upstream needs about 2.5 writes per deleted volume: 0.5 s each at QPS 5.
    let limit = Duration::from_secs_f64(180.0 + n as f64 * if fast { 0.2 } else { 1.2 });
    b.say(format!("{tag}: deleting the {n} claims"));
    let t1 = Instant::now();
    cluster.delete_claims(NAMESPACE, &names).await?;
    let state = driver.state.clone();
    let to_gone = t1.elapsed()
        + wait_for(
            b,
            &tag,
            &mut [&mut sidecar, &mut driver.proc],
            limit,
            || {
                let pvs = volumes.live();
                let backend = proc::driver_volume_count(&state)?;
                Ok((
                    pvs == 0 && backend == 0,
                    format!("{pvs} PVs and {backend} driver volumes left"),
                ))
            },
        )
        .await?;
    let gone_at = volumes.gone_after(t1);
    b.say(format!(
        "{tag}: every PV and volume gone after {:.1}s",
        to_gone.as_secs_f64()
    ));
    cluster.wait_quiet(QUIET, limit, say).await?;
    let deleted = cluster.snapshot().await?;
    let cpu_deleted = sidecar.now(b.ticks).cpu_secs;
    let apiserver_deleted = apiserver_cpu();

    results.sample(m_gone, imp_, round, to_gone.as_secs_f64());
    if fast {
        results.sample(
            stats::C_CPU_FAST,
            imp_,
            round,
            cpu_deleted - cpu_provisioned,
        );
        results.sample(stats::BC_CPU, imp_, round, cpu_deleted - cpu_before);
        let per_volume = |secs: f64| secs * 1000.0 / n as f64;
        results.sample(
            stats::B_APISERVER_CPU,
            imp_,
            round,
            per_volume(apiserver_provisioned - apiserver_before),
        );
        results.sample(
            stats::C_APISERVER_CPU,
            imp_,
            round,
            per_volume(apiserver_deleted - apiserver_provisioned),
        );
    } else {
        results.sample(stats::C_CPU, imp_, round, cpu_deleted - cpu_provisioned);
    }
    let mut points = vec![(0.0, n as f64)];
    points.extend(
        gone_at
            .iter()
            .enumerate()
            .map(|(i, t)| (*t, n.saturating_sub(i + 1) as f64)),
    );
    results.curves.push(Curve {
        name: curve_gone,
        imp,
        round,
        points: thin(points),
    });

    let provision = provisioned.since(&before);
    let deletion = deleted.since(&provisioned);
    let per = |x: f64| x / n as f64;
    let writes = per(provision.sidecar_writes() + deletion.sidecar_writes());
    let e_scenario = if fast {
        results.sample(stats::E_WRITES_FAST, imp_, round, writes);
        "e_fast"
    } else {
        results.sample(stats::E_WRITES, imp_, round, writes);
        results.sample(
            stats::E_WRITES_PROVISION,
            imp_,
            round,
            per(provision.sidecar_writes()),
        );
        results.sample(
            stats::E_WRITES_DELETE,
            imp_,
            round,
            per(deletion.sidecar_writes()),
        );
        results.sample(
            stats::E_GETS,
            imp_,
            round,
            per(provision.api.gets() + deletion.api.gets()),
        );
        results.sample(
            stats::E_ALL,
            imp_,
            round,
            per(provision.api.all() + deletion.api.all()),
        );
        "e"
    };
    results.requests.extend(request_rows(
        &provision,
        e_scenario,
        imp,
        round,
        "provision",
        n,
    ));
    results
        .requests
        .extend(request_rows(&deletion, e_scenario, imp, round, "delete", n));
    results.curves.push(Curve {
        name: curve_rss,
        imp,
        round,
        points: rss_points(&sidecar, started),
    });
    b.say(format!(
        "{tag}: done: Bound {:.1}s, deleted {:.1}s, {writes:.2} sidecar writes per volume, peak RSS {peak:.0} MiB",
        to_bound.as_secs_f64(),
        to_gone.as_secs_f64()
    ));
    sidecar.stop().await;
    driver.stop().await;
    Ok(())
}

/// (d)'s control plane, shared by all its runs and grown size by size: the sidecars only read
/// its pairs.
pub struct ScaleCluster {
    cp: ControlPlane,
    cluster: Cluster,
    pairs: usize,
}

impl ScaleCluster {
    pub async fn start(b: &Bench) -> Result<ScaleCluster, BenchError> {
        let cp = start_control_plane(b, "(d) setup").await?;
        let cluster = prepare_cluster(b, &cp).await?;
        Ok(ScaleCluster {
            cp,
            cluster,
            pairs: 0,
        })
    }

    /// Writes pairs, Bound, until there are `pairs`; records how long that took and how many
    /// claim and PV writes the controller manager made meanwhile (0 when its binder found
    /// nothing to change).
    pub async fn grow(
        &mut self,
        b: &Bench,
        pairs: usize,
        results: &mut Results,
    ) -> Result<(), BenchError> {
        let tag = format!("(d) setup {}", stats::thousands(pairs));
        let before = self.cluster.snapshot().await?;
        let took = fill_bound_pairs(
            b,
            &tag,
            &self.cluster,
            self.pairs..pairs,
            Binding::Written,
            |_, _| {},
        )
        .await?;
        self.pairs = pairs;
        self.cluster
            .wait_quiet(QUIET, SETTLE_CAP, |m| b.say(format!("{tag}: {m}")))
            .await?;
        let delta = self.cluster.snapshot().await?.since(&before);
        let others = (delta.api.volume_writes() - delta.bench_writes).max(0.0);
        let requests: Vec<String> = delta
            .api
            .volume_writes_by_request()
            .iter()
            .map(|(request, n)| format!("{request} {n:.0}"))
            .collect();
        b.say(format!(
            "{tag}: {:.0}s; claim and PV writes by others than the benchmark meanwhile: \
             {others:.0} (all clients' by request, the benchmark's are 4 per pair: {})",
            took.as_secs_f64(),
            requests.join(", ")
        ));
        // The binder's racing writes (see the method) must leave every pair Bound.
        let (claims, volumes) = self.cluster.count_not_bound().await?;
        if claims + volumes > 0 {
            return Err(BenchError::Step {
                step: format!("{tag}: checking the pairs"),
                detail: format!("{claims} claim(s) and {volumes} PV(s) are not Bound"),
            });
        }
        results.sample(
            stats::scale_metric(stats::D_SETUP, pairs),
            None,
            1,
            took.as_secs_f64(),
        );
        results.sample(
            stats::scale_metric(stats::D_SETUP_KCM, pairs),
            None,
            1,
            others,
        );
        Ok(())
    }
}

/// Claims `pairs` (0-based) in [`NAMESPACE`] bound to as many PVs that look provisioned
/// (shaped by `shape`, see [`Cluster::create_bound_pairs`]); returns, with the time taken, once
/// a watch sees every claim so far Bound.
pub(super) async fn fill_bound_pairs(
    b: &Bench,
    tag: &str,
    cluster: &Cluster,
    pairs: std::ops::Range<usize>,
    binding: Binding,
    shape: impl Fn(usize, &mut PersistentVolume),
) -> Result<Duration, BenchError> {
    let claims = ClaimWatch::start(&cluster.client, NAMESPACE).await?;
    let (n, total) = (pairs.len(), pairs.end);
    b.say(format!(
        "{tag}: creating {n} PVs and {n} claims bound to them ({binding:?})"
    ));
    let t0 = Instant::now();
    let create = cluster.create_bound_pairs(pairs, binding, shape);
    let progress = async {
        loop {
            tokio::time::sleep(PROGRESS_EVERY).await;
            b.say(format!(
                "{tag}: {}/{total} claims Bound ({:.0}s)",
                claims.bound_count(),
                t0.elapsed().as_secs_f64()
            ));
        }
    };
    tokio::select! {
        created = create => { created?; }
        () = progress => {}
    }
    let deadline = Instant::now() + Duration::from_secs_f64(300.0 + n as f64 * 0.05);
    while claims.bound_count() < total {
        if Instant::now() > deadline {
            return Err(BenchError::Step {
                step: format!("{tag}: waiting for the claims to be Bound"),
                detail: format!("{}/{total} claims Bound", claims.bound_count()),
            });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let took = t0.elapsed();
    b.say(format!(
        "{tag}: {total} bound pairs ready after {:.0}s",
        took.as_secs_f64()
    ));
    Ok(took)
}

/// The control plane's kube-apiserver, found by its port.
fn apiserver_pid(cp: &ControlPlane) -> Option<u32> {
    let port = cp.apiserver_url().rsplit(':').next()?;
    proc::find_pid(&["kube-apiserver", &format!("--secure-port={port}")])
}

/// (d) at the cluster's current size: one new claim, pre-annotated so that no binder is
/// needed, waits when the sidecar starts; then start-up with the pairs present, then idle.
pub async fn idle(
    b: &Bench,
    scale: &ScaleCluster,
    imp: Impl,
    round: u32,
    results: &mut Results,
) -> Result<(), BenchError> {
    let pairs = scale.pairs;
    let size = stats::thousands(pairs);
    let tag = format!("(d) {size} {imp} round {round}");
    let name = format!("d-{pairs}-{imp}-r{round}");
    let driver = Driver::start(b, &name).await?;
    // Two new claims: the API server streams claims in key order, so "new-…" comes after
    // every "claim-…" and "a-new-…" before them.
    let probe = format!("new-{name}");
    let pv_name = scale.cluster.create_claim_for_pv_name(&probe).await?;
    let provisioned = FirstVolume::watch(&scale.cluster, &pv_name).await?;
    let early_probe = format!("a-new-{name}");
    let early_pv_name = scale.cluster.create_claim_for_pv_name(&early_probe).await?;
    let provisioned_early = FirstVolume::watch(&scale.cluster, &early_pv_name).await?;
    b.say(format!(
        "{tag}: starting the sidecar with {size} claims and PVs present and two new claims"
    ));
    let apiserver = apiserver_pid(&scale.cp);
    let apiserver_cpu = || apiserver.and_then(|pid| proc::read_proc(pid, b.ticks));
    let apiserver_before = apiserver_cpu();
    let t0 = Instant::now();
    let mut sidecar = spawn_sidecar(b, imp, &driver, &scale.cp, &Extra::default(), &name)?;
    let mut window = CpuWindow::new(IDLE_WINDOW);
    let mut last_report = Instant::now();
    let settled = loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        sidecar.check_alive()?;
        let busy = window.push(Instant::now(), sidecar.now(b.ticks).cpu_secs);
        if busy < IDLE_CPU_SHARE && t0.elapsed() >= Duration::from_secs(5) {
            break true;
        }
        if t0.elapsed() > SETTLE_CAP {
            break false;
        }
        if last_report.elapsed() >= PROGRESS_EVERY {
            let s = sidecar.now(b.ticks);
            b.say(format!(
                "{tag}: starting up: {:.0}% of a core, RSS {:.0} MiB ({:.0}s)",
                busy * 100.0,
                s.rss_mib(),
                t0.elapsed().as_secs_f64()
            ));
            last_report = Instant::now();
        }
    };
    let settle = t0.elapsed();
    let startup_cpu = sidecar.now(b.ticks).cpu_secs;
    let apiserver_startup = apiserver_before
        .zip(apiserver_cpu())
        .map(|(before, after)| after.cpu_secs - before.cpu_secs);
    if !settled {
        b.say(format!(
            "{tag}: still busy after {}s; measuring anyway",
            SETTLE_CAP.as_secs()
        ));
    }
    b.say(format!(
        "{tag}: idle after {:.1}s; measuring for {}s",
        settle.as_secs_f64(),
        b.sizes.steady_window.as_secs()
    ));
    let window_start = Instant::now();
    tokio::time::sleep(b.sizes.steady_window).await;
    sidecar.check_alive()?;
    let end = sidecar.now(b.ticks);
    let steady: Vec<f64> = sidecar
        .samples()
        .iter()
        .filter(|(t, _)| *t >= window_start)
        .map(|(_, s)| s.rss_mib())
        .collect();
    let steady = median(&steady).unwrap_or(end.rss_mib());
    let first = provisioned.after(t0);
    let imp_ = Some(imp);
    let metric = |base| stats::scale_metric(base, pairs);
    results.sample(metric(stats::D_PEAK_RSS), imp_, round, end.hwm_mib());
    results.sample(metric(stats::D_STEADY_RSS), imp_, round, steady);
    results.sample(metric(stats::D_CPU), imp_, round, startup_cpu);
    if let Some(first) = first {
        results.sample(metric(stats::D_FIRST), imp_, round, first);
    }
    if let Some(early) = provisioned_early.after(t0) {
        results.sample(metric(stats::D_FIRST_EARLY), imp_, round, early);
    }
    if settled {
        results.sample(metric(stats::D_SETTLE), imp_, round, settle.as_secs_f64());
    }
    match apiserver_startup {
        Some(cpu) => results.sample(metric(stats::D_APISERVER_CPU), imp_, round, cpu),
        None => b.say(format!("{tag}: the API server's process was not found")),
    }
    if b.sizes.scale.last() == Some(&pairs) {
        results.curves.push(Curve {
            name: "d_rss",
            imp,
            round,
            points: rss_points(&sidecar, t0),
        });
    }
    b.say(format!(
        "{tag}: PV of the claim streamed last {}, of the one streamed first {}, peak {:.0} MiB, \
         steady {steady:.0} MiB, start-up CPU {startup_cpu:.2}s",
        first.map_or("never".to_owned(), |s| format!("after {s:.1}s")),
        provisioned_early
            .after(t0)
            .map_or("never".to_owned(), |s| format!("after {s:.1}s")),
        end.hwm_mib(),
    ));
    // The new claims and their volumes go, so that the next run starts from the same pairs.
    let cleaned = remove_claim(&scale.cluster, &probe, &pv_name, &mut sidecar).await;
    let cleaned_early =
        remove_claim(&scale.cluster, &early_probe, &early_pv_name, &mut sidecar).await;
    sidecar.stop().await;
    driver.stop().await;
    cleaned?;
    cleaned_early?;
    first.map(drop).ok_or_else(|| BenchError::Step {
        step: format!("{tag}: provisioning the new claim"),
        detail: format!("no PV {pv_name} within the run"),
    })
}

/// Deletes `claim` and waits until the sidecar has deleted its PV `pv_name`.
async fn remove_claim(
    cluster: &Cluster,
    claim: &str,
    pv_name: &str,
    sidecar: &mut Proc,
) -> Result<(), BenchError> {
    cluster
        .delete_claims(NAMESPACE, &[claim.to_owned()])
        .await?;
    let deadline = Instant::now() + Duration::from_secs(120);
    while cluster.has_volume(pv_name).await? {
        sidecar.check_alive()?;
        if Instant::now() > deadline {
            return Err(BenchError::Step {
                step: format!("deleting claim {claim}"),
                detail: format!("PV {pv_name} still there after 120s"),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// (f): two replicas; SIGTERM to the leader; how soon the other holds the Lease and
/// provisions a claim created at that moment. With `release_gate`, both sidecars get
/// `--feature-gates=ReleaseLeaderElectionOnExit=true` (upstream releases the Lease on exit only
/// with it; ours always does).
pub async fn failover(
    b: &Bench,
    imp: Impl,
    round: u32,
    release_gate: bool,
    results: &mut Results,
) -> Result<(), BenchError> {
    let variant = if release_gate { " (release gate)" } else { "" };
    let tag = format!("(f){variant} {imp} round {round}");
    let cp = start_control_plane(b, &tag).await?;
    let cluster = prepare_cluster(b, &cp).await?;
    let name = format!(
        "f{}-{imp}-r{round}",
        if release_gate { "-gate" } else { "" }
    );
    let mut driver = Driver::start(b, &name).await?;
    let mut le = vec![
        "--leader-election".to_owned(),
        format!("--leader-election-namespace={LEASE_NAMESPACE}"),
    ];
    if release_gate {
        le.push("--feature-gates=ReleaseLeaderElectionOnExit=true".to_owned());
    }
    let mut replicas = Vec::new();
    for id in REPLICAS {
        replicas.push(spawn_sidecar(
            b,
            imp,
            &driver,
            &cp,
            &Extra {
                flags: &le,
                hostname: Some(id),
                ..Extra::default()
            },
            &format!("{name}-{id}"),
        )?);
    }
    let deadline = Instant::now() + Duration::from_secs(90);
    let holder = loop {
        if let Some(holder) = cluster.lease_holder(&REPLICAS).await? {
            break holder;
        }
        for r in &mut replicas {
            r.check_alive()?;
        }
        if Instant::now() > deadline {
            return Err(BenchError::Step {
                step: format!("{tag}: waiting for a leader"),
                detail: "no replica holds a Lease after 90s".into(),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let leader_index = usize::from(holder != REPLICAS[0]);
    let other = REPLICAS[1 - leader_index];
    b.say(format!("{tag}: {holder} leads; warming up"));
    let mut follower = replicas.remove(1 - leader_index);
    let mut leader = replicas.remove(0);
    warm_up(b, &tag, &cluster, &mut leader, &mut driver).await?;
    let probe = ClaimWatch::start(&cluster.client, NAMESPACE).await?;
    // Let the leader renew at least once after the warm-up, as in a steady deployment.
    tokio::time::sleep(Duration::from_secs(2)).await;

    b.say(format!("{tag}: SIGTERM to {holder}"));
    let t0 = Instant::now();
    leader.signal(Signal::SIGTERM);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    claims
        .create(&Default::default(), &api::claim("probe", None))
        .await
        .map_err(|e| BenchError::Step {
            step: format!("{tag}: creating the probe claim"),
            detail: e.to_string(),
        })?;
    let (mut lease_at, mut probe_at, mut exit_at) = (None, None, None);
    let limit = Duration::from_secs(120);
    let mut last_report = Instant::now();
    while lease_at.is_none() || probe_at.is_none() || exit_at.is_none() {
        if lease_at.is_none() && cluster.lease_holder(&[other]).await?.is_some() {
            lease_at = Some(t0.elapsed());
        }
        if probe_at.is_none() && probe.is_bound("probe") {
            probe_at = Some(t0.elapsed());
        }
        if exit_at.is_none() && leader.exited().is_some() {
            exit_at = Some(t0.elapsed());
        }
        follower.check_alive()?;
        if t0.elapsed() > limit {
            break;
        }
        if last_report.elapsed() >= PROGRESS_EVERY {
            b.say(format!(
                "{tag}: Lease moved: {}, probe Bound: {}, old leader exited: {} ({:.0}s)",
                lease_at.is_some(),
                probe_at.is_some(),
                exit_at.is_some(),
                t0.elapsed().as_secs_f64()
            ));
            last_report = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let secs = |d: Option<Duration>| d.map(|d| d.as_secs_f64());
    let imp_ = Some(imp);
    let metrics = if release_gate {
        [stats::F_LEASE_GATE, stats::F_PROBE_GATE, stats::F_EXIT_GATE]
    } else {
        [stats::F_LEASE, stats::F_PROBE, stats::F_EXIT]
    };
    for (metric, value) in metrics
        .into_iter()
        .zip([secs(lease_at), secs(probe_at), secs(exit_at)])
    {
        if let Some(v) = value {
            results.sample(metric, imp_, round, v);
        }
    }
    b.say(format!(
        "{tag}: Lease to {other} after {:?}, probe Bound after {:?}, old leader exited after {:?}",
        secs(lease_at),
        secs(probe_at),
        secs(exit_at)
    ));
    leader.stop().await;
    follower.stop().await;
    driver.stop().await;
    if lease_at.is_none() || probe_at.is_none() {
        return Err(BenchError::Step {
            step: format!("{tag}: failover"),
            detail: format!("not complete after {}s", limit.as_secs()),
        });
    }
    Ok(())
}

/// (g): the apiserver's raw PV-create rate from a trivial client on this machine.
pub async fn raw_rate(b: &Bench, round: u32, results: &mut Results) -> Result<(), BenchError> {
    let tag = format!("(g) round {round}");
    let cp = start_control_plane(b, &tag).await?;
    let cluster = prepare_cluster(b, &cp).await?;
    let n = b.sizes.raw;
    // Connections and the apiserver's caches warm up on a first batch that is not timed.
    cluster.create_raw_volumes("warm", api::CONCURRENCY).await?;
    b.say(format!("{tag}: creating {n} PVs"));
    let elapsed = cluster.create_raw_volumes("raw", n).await?;
    let rate = n as f64 / elapsed.as_secs_f64();
    results.sample(stats::G_RATE, None, round, rate);
    b.say(format!(
        "{tag}: {n} PVs in {:.1}s: {rate:.0} per second",
        elapsed.as_secs_f64()
    ));
    Ok(())
}
