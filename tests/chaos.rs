//! The chaos test: many claims against two sidecar replicas with leader election, while the
//! driver delays and fails calls (sometimes after creating the volume, or never answering),
//! claims are deleted at random moments (some with every finalizer removed by hand), the
//! leader is SIGKILLed and restarted, and one SIGTERM hands leadership over to the other
//! replica. Afterwards not a single volume may be leaked and nothing may be left behind.
//!
//! ```sh
//! cargo test --test chaos -- --nocapture                                 # 200 claims, as CI runs it
//! CHAOS_CLAIMS=1000 cargo test --release --test chaos -- --nocapture     # the larger run
//! CHAOS_SEED=12345 cargo test --release --test chaos -- --nocapture      # replay a plan
//! ```
//!
//! If the system does not settle, the full logs of the driver and both replicas are kept under
//! `target/tmp/chaos-logs-<pid>/`.
//!
//! The seed fixes the plan (which claims, when they are deleted, the fault rules, when the
//! leader is killed); the interleaving with the processes still varies. Timing is never
//! asserted: the waits are only generous bounds against a hang.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use nix::sys::signal::Signal;

use csi_testbed::Rng;
use csi_testbed::chaos::driver_fault_rules;
use support::cluster::{
    Cluster, claim, consistent_claim, create_claim, driver_pvs, journal_operations, lease_holder,
};
use support::peers::{Driver, Sidecar, SidecarOptions};

const DEFAULT_CLAIMS: usize = 200;
const REPLICAS: [&str; 2] = ["chaos-replica-a", "chaos-replica-b"];
const SIGKILLS: usize = 3;
/// Mean gap between two claim creations.
const CREATION_GAP_MS: u64 = 60;
/// A deleted claim is deleted this long after its creation, at most.
const DELETE_WITHIN_MS: u64 = 5_000;
/// Chaos (faults, kills) goes on this long after the last claim was created.
const CHAOS_TAIL: Duration = Duration::from_secs(5);
/// Bound of each wait for the system to settle; generous, never an assertion on speed.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(300);
const POLL: Duration = Duration::from_millis(500);
const ORPHAN_LOG_LINE: &str = "deleted the volume of a claim that is gone";

fn env_number(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    Some(
        value
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{name}={value:?} is not a number: {e}")),
    )
}

/// One claim of the plan.
#[derive(Debug, Clone)]
struct PlannedClaim {
    name: String,
    /// Annotated `volume.kubernetes.io/provisioning-consistency: enable`.
    consistency: bool,
    /// Deleted this long after creation, if at all.
    delete_after: Option<Duration>,
    /// After the delete, every finalizer removed by hand.
    force: bool,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Disruption {
    /// SIGKILL the leader, start it again after the pause.
    Kill { restart_after: Duration },
    /// SIGTERM the leader: it drains and releases the Lease, the other replica takes over.
    Failover,
}

struct Plan {
    claims: Vec<PlannedClaim>,
    /// Gap before each creation.
    gaps: Vec<Duration>,
    /// Offsets from the start of the chaos, ordered.
    disruptions: Vec<(Duration, Disruption)>,
    /// Offsets and control-file contents, ordered.
    fault_rules: Vec<(Duration, String)>,
    chaos_window: Duration,
}

fn plan(rng: &mut Rng, claims: usize) -> Plan {
    let claims_plan: Vec<PlannedClaim> = (0..claims)
        .map(|i| {
            let delete = rng.chance(30);
            PlannedClaim {
                name: format!("claim-{i:05}"),
                consistency: rng.chance(50),
                delete_after: delete
                    .then(|| Duration::from_millis(rng.between(0, DELETE_WITHIN_MS))),
                force: delete && rng.chance(20),
            }
        })
        .collect();
    let gaps: Vec<Duration> = (0..claims)
        .map(|_| Duration::from_millis(rng.between(0, 2 * CREATION_GAP_MS)))
        .collect();
    let creation: Duration = gaps.iter().sum();
    let chaos_window = creation + CHAOS_TAIL;
    let window_ms = u64::try_from(chaos_window.as_millis()).unwrap_or(u64::MAX);

    let mut disruptions: Vec<(Duration, Disruption)> = Vec::new();
    for index in 0..=SIGKILLS {
        let disruption = if index < SIGKILLS {
            Disruption::Kill {
                restart_after: Duration::from_millis(rng.between(0, 3_000)),
            }
        } else {
            Disruption::Failover
        };
        let at = Duration::from_millis(rng.between(1_000, window_ms));
        disruptions.push((at, disruption));
    }
    disruptions.sort_by_key(|(at, _)| *at);

    let mut fault_rules = Vec::new();
    let mut at = 0;
    while at < window_ms {
        at += rng.between(500, 1_500);
        let rules = driver_fault_rules(rng, "300ms");
        fault_rules.push((Duration::from_millis(at), rules));
    }
    Plan {
        claims: claims_plan,
        gaps,
        disruptions,
        fault_rules,
        chaos_window,
    }
}

/// What happened during the run, printed at the end.
#[derive(Debug, Default)]
struct Tally {
    created: usize,
    deleted_mid_flight: usize,
    force_deleted: usize,
    sigkills: usize,
    failover: Option<Duration>,
    unplanned_exits: usize,
    fault_rule_sets: usize,
    volume_ids_seen: BTreeSet<String>,
}

struct Replicas {
    sidecars: Vec<Sidecar>,
}

impl Replicas {
    fn start(driver: &Driver, ns: &str) -> Replicas {
        let sidecars = REPLICAS
            .iter()
            .map(|host| {
                Sidecar::start_with(
                    driver,
                    SidecarOptions {
                        args: [
                            "--leader-election".to_owned(),
                            format!("--leader-election-namespace={ns}"),
                            "--leader-election-lease-duration=6s".to_owned(),
                            "--leader-election-renew-deadline=4s".to_owned(),
                            "--leader-election-retry-period=1s".to_owned(),
                            "--retry-interval-start=200ms".to_owned(),
                            "--retry-interval-max=5s".to_owned(),
                            "--timeout=3s".to_owned(),
                            "--kube-api-qps=200".to_owned(),
                            "--kube-api-burst=400".to_owned(),
                        ]
                        .into(),
                        metrics: false,
                        hostname: Some((*host).to_owned()),
                    },
                )
            })
            .collect();
        Replicas { sidecars }
    }

    /// Restarts a replica that exited on its own (as the kubelet would restart the
    /// container), e.g. after losing the Lease while the machine was starved.
    async fn revive(&mut self, tally: &mut Tally) {
        for (index, sidecar) in self.sidecars.iter_mut().enumerate() {
            if !sidecar.is_running() {
                println!(
                    "[chaos] {} exited on its own; restarting it",
                    REPLICAS[index]
                );
                tally.unplanned_exits += 1;
                sidecar.restart().await;
            }
        }
    }

    fn logs(&self) -> String {
        self.sidecars.iter().map(Sidecar::log).collect()
    }
}

/// The index of the replica holding the Lease, once one of ours holds it and is running.
async fn wait_leader(
    client: &Client,
    ns: &str,
    driver: &Driver,
    replicas: &mut Replicas,
    tally: &mut Tally,
) -> usize {
    let started = Instant::now();
    loop {
        let holder = lease_holder(client, ns, driver).await.unwrap_or_default();
        if let Some(index) = REPLICAS.iter().position(|r| *r == holder)
            && replicas.sidecars[index].is_running()
        {
            return index;
        }
        assert!(
            started.elapsed() < SETTLE_TIMEOUT,
            "no running replica leads (holder {holder:?})"
        );
        replicas.revive(tally).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Creates the claims of the plan in order; each planned deletion runs as its own task.
async fn create_claims(
    claims: &Api<PersistentVolumeClaim>,
    class: &str,
    plan: &[PlannedClaim],
    gaps: &[Duration],
) -> Vec<tokio::task::JoinHandle<bool>> {
    let mut deletions = Vec::new();
    for (planned, gap) in plan.iter().zip(gaps) {
        tokio::time::sleep(*gap).await;
        let pvc = if planned.consistency {
            consistent_claim(&planned.name, class, "enable")
        } else {
            claim(&planned.name, class, "1Gi", None)
        };
        create_claim(claims, &pvc).await;
        if let Some(after) = planned.delete_after {
            let claims = claims.clone();
            let name = planned.name.clone();
            let force = planned.force;
            deletions.push(tokio::spawn(async move {
                tokio::time::sleep(after).await;
                claims
                    .delete(&name, &DeleteParams::default())
                    .await
                    .unwrap_or_else(|e| panic!("deleting PVC {name}: {e}"));
                if force {
                    // Gone already is fine: nothing held it.
                    let patch = serde_json::json!({"metadata": {"finalizers": null}});
                    let _ = claims
                        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await;
                }
                force
            }));
        }
    }
    deletions
}

/// Rewrites the driver's fault rules and disrupts the leader, following the plan; samples the
/// driver's volumes meanwhile.
async fn run_chaos(
    client: &Client,
    ns: &str,
    driver: &Driver,
    replicas: &mut Replicas,
    plan: &Plan,
    tally: &mut Tally,
) {
    let started = Instant::now();
    let mut rules = plan.fault_rules.iter().peekable();
    let mut disruptions = plan.disruptions.iter().peekable();
    while started.elapsed() < plan.chaos_window || disruptions.peek().is_some() {
        let now = started.elapsed();
        while let Some((_, text)) = rules.next_if(|(at, _)| *at <= now) {
            driver.set_faults(text);
            tally.fault_rule_sets += 1;
        }
        if let Some((_, disruption)) = disruptions.next_if(|(at, _)| *at <= now) {
            disrupt(client, ns, driver, replicas, *disruption, tally).await;
        }
        tally
            .volume_ids_seen
            .extend(driver.volumes().into_iter().map(|v| v.id));
        replicas.revive(tally).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    driver.clear_faults();
}

async fn disrupt(
    client: &Client,
    ns: &str,
    driver: &Driver,
    replicas: &mut Replicas,
    disruption: Disruption,
    tally: &mut Tally,
) {
    let leader = wait_leader(client, ns, driver, replicas, tally).await;
    match disruption {
        Disruption::Kill { restart_after } => {
            println!(
                "[chaos] SIGKILL {} (leader), restart in {restart_after:?}",
                REPLICAS[leader]
            );
            replicas.sidecars[leader].kill().await;
            tally.sigkills += 1;
            tokio::time::sleep(restart_after).await;
            replicas.sidecars[leader].restart().await;
        }
        Disruption::Failover => {
            let successor = REPLICAS[1 - leader];
            println!(
                "[chaos] SIGTERM {} (leader); {successor} should take over",
                REPLICAS[leader]
            );
            let since = Instant::now();
            replicas.sidecars[leader].signal(Signal::SIGTERM);
            support::eventually(
                &format!("{successor} to take the Lease"),
                SETTLE_TIMEOUT,
                || async {
                    let holder = lease_holder(client, ns, driver).await?;
                    if holder == successor {
                        Ok(())
                    } else {
                        Err(format!("holder {holder:?}"))
                    }
                },
            )
            .await;
            let took = since.elapsed();
            tally.failover = Some(took);
            println!("[chaos] failover to {successor} took {took:?}");
            let status = replicas.sidecars[leader].wait_exit(SETTLE_TIMEOUT).await;
            println!(
                "[chaos] {} exited: {}",
                REPLICAS[leader],
                support::peers::describe(status)
            );
            replicas.sidecars[leader].restart().await;
        }
    }
}

/// The state of everything the test created, from one set of reads.
struct Snapshot {
    claims: BTreeMap<String, PersistentVolumeClaim>,
    pvs: Vec<PersistentVolume>,
    /// Volume id → name, on the driver.
    volumes: BTreeMap<String, String>,
    journal: Vec<String>,
}

impl Snapshot {
    async fn take(client: &Client, ns: &str, driver: &Driver) -> Result<Snapshot, String> {
        let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
            .list(&ListParams::default())
            .await
            .map_err(|e| format!("listing PVCs: {e}"))?
            .items
            .into_iter()
            .map(|pvc| (pvc.metadata.name.clone().unwrap_or_default(), pvc))
            .collect();
        let pvs = driver_pvs(client, driver).await?;
        let journal = journal_operations(client, ns, driver)
            .await?
            .into_iter()
            .map(|op| {
                format!(
                    "{} ({}, {:?}, {} attempts)",
                    op.volume_name, op.claim, op.phase, op.attempts
                )
            })
            .collect();
        let volumes = driver
            .volumes()
            .into_iter()
            .map(|v| (v.id, v.name))
            .collect();
        Ok(Snapshot {
            claims,
            pvs,
            volumes,
            journal,
        })
    }

    fn handle(pv: &PersistentVolume) -> &str {
        pv.spec
            .as_ref()
            .and_then(|s| s.csi.as_ref())
            .map_or("", |csi| csi.volume_handle.as_str())
    }

    /// Driver volumes referenced by no PV, or by more than one.
    fn unreferenced_or_shared(&self) -> Vec<String> {
        self.volumes
            .iter()
            .filter_map(|(id, name)| {
                let refs = self.pvs.iter().filter(|pv| Self::handle(pv) == id).count();
                (refs != 1).then(|| format!("{id} ({name}) referenced by {refs} PVs"))
            })
            .collect()
    }

    /// PVs whose handle does not exist on the driver.
    fn dangling_pvs(&self) -> Vec<String> {
        self.pvs
            .iter()
            .filter(|pv| !self.volumes.contains_key(Self::handle(pv)))
            .map(|pv| format!("{:?} → {}", pv.metadata.name, Self::handle(pv)))
            .collect()
    }

    fn terminating(&self) -> Vec<String> {
        self.claims
            .values()
            .filter(|pvc| pvc.metadata.deletion_timestamp.is_some())
            .map(|pvc| {
                format!(
                    "{:?} finalizers {:?}",
                    pvc.metadata.name, pvc.metadata.finalizers
                )
            })
            .collect()
    }

    fn summary(&self) -> String {
        let bound = self
            .claims
            .values()
            .filter(|pvc| pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
            .count();
        format!(
            "{} claims ({bound} Bound, {} terminating), {} PVs, {} driver volumes, {} journal operations",
            self.claims.len(),
            self.terminating().len(),
            self.pvs.len(),
            self.volumes.len(),
            self.journal.len()
        )
    }
}

/// Polls until `settled` accepts a snapshot; revives replicas that exited on their own and
/// prints progress every few seconds.
async fn wait_settled(
    what: &str,
    client: &Client,
    ns: &str,
    driver: &Driver,
    replicas: &mut Replicas,
    tally: &mut Tally,
    settled: impl Fn(&Snapshot) -> Result<(), String>,
) -> Snapshot {
    let started = Instant::now();
    let mut last_print = Instant::now();
    loop {
        replicas.revive(tally).await;
        let verdict = match Snapshot::take(client, ns, driver).await {
            Ok(snapshot) => match settled(&snapshot) {
                Ok(()) => return snapshot,
                Err(why) => format!("{}; {why}", snapshot.summary()),
            },
            Err(error) => error,
        };
        if started.elapsed() > SETTLE_TIMEOUT {
            let kept = save_logs(driver, replicas);
            panic!("not settled after {SETTLE_TIMEOUT:?} ({what}): {verdict}; full logs in {kept}");
        }
        if last_print.elapsed() > Duration::from_secs(10) {
            println!("[chaos] waiting for {what}: {verdict}");
            last_print = Instant::now();
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Copies the full logs of the driver and both replicas (every start) where they survive the
/// test, and says where.
fn save_logs(driver: &Driver, replicas: &Replicas) -> String {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("chaos-logs-{}", std::process::id()));
    let saved = std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(dir.join("driver.log"), driver.log()))
        .and_then(|()| {
            replicas
                .sidecars
                .iter()
                .zip(REPLICAS)
                .try_for_each(|(sidecar, name)| {
                    std::fs::write(dir.join(format!("{name}.log")), sidecar.log())
                })
        });
    match saved {
        Ok(()) => dir.display().to_string(),
        Err(e) => format!("(not saved: {e})"),
    }
}

fn first_few(items: &[String]) -> String {
    let shown: Vec<&String> = items.iter().take(5).collect();
    format!("{} e.g. {shown:?}", items.len())
}

#[tokio::test]
async fn no_volume_leaks_under_chaos() {
    let claims_wanted = env_number("CHAOS_CLAIMS").map_or(DEFAULT_CLAIMS, |n| {
        usize::try_from(n).unwrap_or(DEFAULT_CLAIMS)
    });
    let seed = env_number("CHAOS_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| {
                u64::try_from(d.as_nanos() % u128::from(u64::MAX)).unwrap_or(1)
            })
    });
    println!("[chaos] CHAOS_SEED={seed} CHAOS_CLAIMS={claims_wanted}");
    let mut rng = Rng::new(seed);
    let plan = plan(&mut rng, claims_wanted);

    let cluster = Cluster::new("chaos").await;
    let (client, ns_name) = (&cluster.client, cluster.ns());
    let driver = Driver::start(&["--delay", "CreateVolume=300ms"]).await;
    let class = cluster.class("chaos", &driver, "Delete", &[]).await;
    let mut replicas = Replicas::start(&driver, ns_name);
    let mut tally = Tally::default();
    let first = wait_leader(client, ns_name, &driver, &mut replicas, &mut tally).await;
    println!("[chaos] {} leads; starting", REPLICAS[first]);

    let started = Instant::now();
    let (deletions, ()) = tokio::join!(
        create_claims(&cluster.claims, &class, &plan.claims, &plan.gaps),
        run_chaos(client, ns_name, &driver, &mut replicas, &plan, &mut tally),
    );
    tally.created = plan.claims.len();
    for deletion in deletions {
        let forced = deletion
            .await
            .unwrap_or_else(|e| panic!("a deletion task failed: {e}"));
        tally.deleted_mid_flight += 1;
        tally.force_deleted += usize::from(forced);
    }
    let chaos_took = started.elapsed();
    println!("[chaos] chaos over after {chaos_took:?}; waiting for quiescence");

    let kept: BTreeSet<String> = plan
        .claims
        .iter()
        .filter(|c| c.delete_after.is_none())
        .map(|c| c.name.clone())
        .collect();
    let settling = Instant::now();
    let quiet = wait_settled(
        "kept claims Bound, deleted claims gone, orphans deleted, journal empty",
        client,
        ns_name,
        &driver,
        &mut replicas,
        &mut tally,
        |s| {
            let unbound: Vec<String> = kept
                .iter()
                .filter(|name| {
                    s.claims.get(*name).and_then(|pvc| pvc.status.as_ref()?.phase.as_deref())
                        != Some("Bound")
                })
                .cloned()
                .collect();
            let lingering: Vec<String> =
                s.claims.keys().filter(|name| !kept.contains(*name)).cloned().collect();
            let extra = s.unreferenced_or_shared();
            let dangling = s.dangling_pvs();
            if unbound.is_empty()
                && lingering.is_empty()
                && extra.is_empty()
                && dangling.is_empty()
                && s.pvs.len() == kept.len()
                && s.journal.is_empty()
            {
                Ok(())
            } else {
                Err(format!(
                    "unbound {}, deleted but present {}, driver volumes without exactly one PV {}, PVs without a volume {}, journal {}",
                    first_few(&unbound),
                    first_few(&lingering),
                    first_few(&extra),
                    first_few(&dangling),
                    first_few(&s.journal)
                ))
            }
        },
    )
    .await;
    let settle_took = settling.elapsed();

    // The invariant at quiescence, stated once more on the settled snapshot.
    assert!(
        quiet.unreferenced_or_shared().is_empty(),
        "leaked or shared volumes"
    );
    assert!(quiet.dangling_pvs().is_empty(), "PVs without a volume");
    assert!(
        quiet.journal.is_empty(),
        "journal entries left: {:?}",
        quiet.journal
    );
    assert!(
        quiet.terminating().is_empty(),
        "PVCs stuck Terminating: {:?}",
        quiet.terminating()
    );
    for name in &kept {
        let pvc = &quiet.claims[name];
        let expected = format!("pvc-{}", pvc.metadata.uid.as_deref().unwrap_or_default());
        assert_eq!(
            pvc.spec.as_ref().and_then(|s| s.volume_name.as_deref()),
            Some(expected.as_str()),
            "{name} is bound to its own PV"
        );
    }
    let volumes_at_quiescence = quiet.volumes.len();
    // What the driver says over CSI agrees with its durable state.
    assert_eq!(
        support::csi_wire::list_volume_ids(driver.socket()).await,
        quiet.volumes.keys().cloned().collect::<BTreeSet<_>>(),
        "ListVolumes at quiescence"
    );

    // Everything goes.
    for name in quiet.claims.keys() {
        cluster.delete_claim(name).await;
    }
    let cleaning = Instant::now();
    let end = wait_settled(
        "every claim, PV, volume and journal entry gone",
        client,
        ns_name,
        &driver,
        &mut replicas,
        &mut tally,
        |s| {
            if s.claims.is_empty()
                && s.pvs.is_empty()
                && s.volumes.is_empty()
                && s.journal.is_empty()
            {
                Ok(())
            } else {
                Err(format!(
                    "claims {:?}, driver volumes {:?}, journal {}",
                    s.claims.keys().take(5).collect::<Vec<_>>(),
                    s.volumes.values().take(5).collect::<Vec<_>>(),
                    first_few(&s.journal)
                ))
            }
        },
    )
    .await;
    let clean_took = cleaning.elapsed();
    let leaked = support::csi_wire::list_volume_ids(driver.socket()).await;

    let logs = replicas.logs();
    let orphans_deleted = logs.matches(ORPHAN_LOG_LINE).count();
    let creates = driver.calls("CreateVolume");
    let deletes = driver.calls("DeleteVolume");
    let ok = |calls: &[support::peers::Call]| calls.iter().filter(|c| c.code == "Ok").count();
    println!("[chaos] ---------------- results (seed {seed}) ----------------");
    println!(
        "[chaos] claims created {} ({} with the consistency finalizer), deleted mid-flight {} (of which every finalizer removed by hand: {}), kept {}",
        tally.created,
        plan.claims.iter().filter(|c| c.consistency).count(),
        tally.deleted_mid_flight,
        tally.force_deleted,
        kept.len()
    );
    println!(
        "[chaos] SIGKILLs of the leader {}, failover (SIGTERM) took {:?}, replicas that exited on their own {}, fault rule sets {}",
        tally.sigkills, tally.failover, tally.unplanned_exits, tally.fault_rule_sets
    );
    println!(
        "[chaos] driver: CreateVolume calls {} ({} Ok), DeleteVolume calls {} ({} Ok), volume ids seen while sampling {}",
        creates.len(),
        ok(&creates),
        deletes.len(),
        ok(&deletes),
        tally.volume_ids_seen.len()
    );
    println!(
        "[chaos] orphans deleted by the journal {orphans_deleted}, volumes at quiescence {volumes_at_quiescence} (= PVs), leaks {} (ListVolumes after every claim was deleted)",
        leaked.len()
    );
    println!(
        "[chaos] wall: chaos {chaos_took:?}, quiescence {settle_took:?}, final deletion {clean_took:?}"
    );
    assert_eq!(tally.sigkills, SIGKILLS);
    assert!(tally.failover.is_some(), "the failover happened");
    assert!(end.volumes.is_empty(), "leaked volumes");
    assert!(
        leaked.is_empty(),
        "ListVolumes reports leaked volumes: {leaked:?}"
    );
}
