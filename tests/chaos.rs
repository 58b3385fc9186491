//! The chaos test: many claims against two sidecar replicas with leader election, while the
//! driver delays and fails calls (sometimes after creating the volume, or never answering, or
//! timing out after creating it and then failing the retries with a final error), claims are
//! deleted at random moments (some with every finalizer removed by hand), the StorageClass is
//! deleted and re-created with other parameters while claims of it are in flight, every journal
//! shard is deleted through the API under load, the leader is SIGKILLed and restarted, paused
//! (SIGSTOP) until the other replica took its Lease and then woken up, and one SIGTERM hands
//! leadership over to the other replica. The shards are deleted only while a running leader
//! has loaded them (see `Stage::leader_stable`). Afterwards not a single volume may be leaked,
//! no volume may have been deleted while a PV still held it, and nothing may be left behind or
//! stuck.
//!
//! ```sh
//! cargo test --test cluster chaos:: -- --nocapture                       # 200 claims, as CI runs it
//! CHAOS_CLAIMS=1000 cargo test --release --test cluster chaos:: -- --nocapture   # the larger run
//! CHAOS_SEED=12345 cargo test --release --test cluster chaos:: -- --nocapture    # replay a plan
//! CHAOS_FAULTS=all cargo test --test cluster chaos:: -- --nocapture      # every fault below
//! CHAOS_FAULTS=leader-paused,class-recreated cargo test --test cluster chaos::  # only these
//! ```
//!
//! `CHAOS_FAULTS` picks the faults beyond the base plan (driver faults, claims deleted
//! mid-flight, SIGKILLs, the failover), comma-separated: `final-error-after-timeout`,
//! `class-recreated`, `shards-deleted`, `leader-paused`, or `all` / `none`; unset means
//! all of them. Leaving one out keeps the rest of the plan of a seed unchanged.
//!
//! If the system does not settle, or a check fails, the full logs of the driver and both
//! replicas are kept under `target/tmp/chaos-logs-<pid>/`.
//!
//! The seed fixes the plan (printed at the start: which claims, when they are deleted, the fault
//! rules, when the leader is killed or paused, when the class is re-created and the shards
//! deleted); the interleaving with the processes still varies. Timing is never asserted: the
//! waits are only generous bounds against a hang.

use csi_test_support as support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use csi_provisioner::journal::ProvisioningJournal;
use csi_provisioner::provision::PROVISIONING_FINALIZER;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use nix::sys::signal::Signal;

use csi_testbed::Rng;
use csi_testbed::chaos::{driver_fault_rules, final_error_after_timeout_rules};
use support::cluster::{
    Cluster, claim, consistent_claim, create_claim, create_class, driver_pvs, journal_operations,
    lease_holder, storage_class,
};
use support::peers::{Driver, Sidecar, SidecarOptions};

const DEFAULT_CLAIMS: usize = 200;
const REPLICAS: [&str; 2] = ["chaos-replica-a", "chaos-replica-b"];
const SIGKILLS: usize = 3;
const PAUSES: usize = 1;
const CLASS_RECREATIONS: usize = 2;
const SHARD_DELETIONS: usize = 2;
/// "Final error after a timeout" episodes, each replacing one of the driver's rule changes.
const FINAL_ERROR_EPISODES: usize = 3;
/// Mean gap between two claim creations.
const CREATION_GAP_MS: u64 = 60;
/// A deleted claim is deleted this long after its creation, at most.
const DELETE_WITHIN_MS: u64 = 5_000;
/// Chaos (faults, kills) goes on this long after the last claim was created.
const CHAOS_TAIL: Duration = Duration::from_secs(5);
/// Bound of each wait for the system to settle; generous, never an assertion on speed.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(300);
/// How long a deletion of the shards waits for the leader to write them again before the
/// plan goes on (a bound against a hang, not an assertion: the final checks judge).
const REBUILD_BOUND: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(500);
/// During the chaos, the PVs are sampled every this many rounds of the 100 ms loop.
const PV_SAMPLE_EVERY: u32 = 5;
const ORPHAN_LOG_LINE: &str = "deleted the volume of a claim that is gone";

/// The faults beyond the base plan, each of which `CHAOS_FAULTS` can leave out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    /// CreateVolume creates the volume and times out, then its retries meet a final error.
    FinalErrorAfterTimeout,
    /// The StorageClass deleted and re-created with the same name and other parameters while
    /// claims of it are in flight.
    ClassRecreated,
    /// Every ProvisioningJournal in the sidecars' namespace deleted through the API.
    ShardsDeleted,
    /// The leader SIGSTOPped until the other replica holds the Lease, then SIGCONTed.
    LeaderPaused,
}

impl Fault {
    const ALL: [Fault; 4] = [
        Fault::FinalErrorAfterTimeout,
        Fault::ClassRecreated,
        Fault::ShardsDeleted,
        Fault::LeaderPaused,
    ];

    fn name(self) -> &'static str {
        match self {
            Fault::FinalErrorAfterTimeout => "final-error-after-timeout",
            Fault::ClassRecreated => "class-recreated",
            Fault::ShardsDeleted => "shards-deleted",
            Fault::LeaderPaused => "leader-paused",
        }
    }
}

/// The faults a run without `CHAOS_FAULTS` injects.
const DEFAULT_FAULTS: &[Fault] = &Fault::ALL;

/// The faults `CHAOS_FAULTS` asks for (see the module comment).
fn faults_wanted() -> BTreeSet<Fault> {
    let Ok(list) = std::env::var("CHAOS_FAULTS") else {
        return DEFAULT_FAULTS.iter().copied().collect();
    };
    list.split(',')
        .map(str::trim)
        .filter(|word| !word.is_empty())
        .flat_map(|word| match word {
            "all" => Fault::ALL.to_vec(),
            "none" => Vec::new(),
            name => vec![
                Fault::ALL
                    .into_iter()
                    .find(|f| f.name() == name)
                    .unwrap_or_else(|| {
                        let known: Vec<&str> = Fault::ALL.map(Fault::name).into();
                        panic!("CHAOS_FAULTS: unknown fault {name:?}; known: {known:?}, all, none")
                    }),
            ],
        })
        .collect()
}

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
    /// SIGSTOP the leader until the other replica holds the Lease, SIGCONT it this long later.
    Pause { past_takeover: Duration },
}

#[derive(Debug, Clone, PartialEq)]
enum Event {
    /// Replace the driver's rules with these (control-file contents).
    Faults(String),
    Disrupt(Disruption),
    /// Delete the StorageClass, re-create it `gap` later with `chaos-generation: <generation>`.
    RecreateClass {
        generation: usize,
        gap: Duration,
    },
    /// Delete every ProvisioningJournal in the sidecars' namespace.
    DeleteShards,
}

impl Event {
    fn describe(&self) -> String {
        match self {
            Event::Faults(rules) => format!(
                "driver rules: {}",
                rules.lines().collect::<Vec<_>>().join("; ")
            ),
            Event::Disrupt(Disruption::Kill { restart_after }) => {
                format!("SIGKILL the leader, restart it {restart_after:?} later")
            }
            Event::Disrupt(Disruption::Failover) => {
                "SIGTERM the leader: the other replica takes over".to_owned()
            }
            Event::Disrupt(Disruption::Pause { past_takeover }) => format!(
                "SIGSTOP the leader until the other replica holds the Lease, SIGCONT {past_takeover:?} later"
            ),
            Event::RecreateClass { generation, gap } => format!(
                "delete the StorageClass, re-create it {gap:?} later with chaos-generation={generation}"
            ),
            Event::DeleteShards => "delete every ProvisioningJournal shard".to_owned(),
        }
    }
}

struct Plan {
    claims: Vec<PlannedClaim>,
    /// Gap before each creation.
    gaps: Vec<Duration>,
    /// Offsets from the start of the chaos, ordered.
    events: Vec<(Duration, Event)>,
    chaos_window: Duration,
}

impl Plan {
    fn count(&self, wanted: impl Fn(&Event) -> bool) -> usize {
        self.events.iter().filter(|(_, e)| wanted(e)).count()
    }

    fn print(&self, seed: u64, faults: &BTreeSet<Fault>) {
        let deleted = self.claims.iter().filter(|c| c.delete_after.is_some());
        println!(
            "[chaos] plan of seed {seed}: {} claims ({} with the consistency finalizer, {} deleted mid-flight, {} of them with every finalizer removed by hand), chaos window {:?}, faults {:?}",
            self.claims.len(),
            self.claims.iter().filter(|c| c.consistency).count(),
            deleted.clone().count(),
            deleted.filter(|c| c.force).count(),
            self.chaos_window,
            faults.iter().map(|f| f.name()).collect::<Vec<_>>()
        );
        for (at, event) in &self.events {
            println!(
                "[chaos] plan +{:>7.3}s {}",
                at.as_secs_f64(),
                event.describe()
            );
        }
    }
}

/// The plan of a seed. Every fault is drawn whether it is wanted or not, so leaving one out
/// changes nothing else of the plan.
fn plan(rng: &mut Rng, claims: usize, faults: &BTreeSet<Fault>) -> Plan {
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
    let creation_ms = u64::try_from(creation.as_millis()).unwrap_or(u64::MAX);
    let ms = Duration::from_millis;

    let mut events: Vec<(Duration, Event)> = Vec::new();
    for index in 0..=SIGKILLS {
        let disruption = if index < SIGKILLS {
            Disruption::Kill {
                restart_after: ms(rng.between(0, 3_000)),
            }
        } else {
            Disruption::Failover
        };
        events.push((
            ms(rng.between(1_000, window_ms)),
            Event::Disrupt(disruption),
        ));
    }
    for _ in 0..PAUSES {
        let pause = Disruption::Pause {
            past_takeover: ms(rng.between(0, 2_000)),
        };
        let at = ms(rng.between(1_000, window_ms));
        if faults.contains(&Fault::LeaderPaused) {
            events.push((at, Event::Disrupt(pause)));
        }
    }
    // While claims are still being created, so that some of the class are in flight.
    for generation in 1..=CLASS_RECREATIONS {
        let recreate = Event::RecreateClass {
            generation,
            gap: ms(rng.between(0, 1_500)),
        };
        let at = ms(rng.between(1_000, creation_ms.max(1_000)));
        if faults.contains(&Fault::ClassRecreated) {
            events.push((at, recreate));
        }
    }
    for _ in 0..SHARD_DELETIONS {
        let at = ms(rng.between(1_000, window_ms));
        if faults.contains(&Fault::ShardsDeleted) {
            events.push((at, Event::DeleteShards));
        }
    }

    // While claims are still being created; each at the first rule change from then on.
    let mut episodes: Vec<u64> = (0..FINAL_ERROR_EPISODES)
        .map(|_| rng.between(1_000, creation_ms.max(1_000)))
        .collect();
    episodes.sort_unstable();
    let mut episodes = episodes.into_iter().peekable();
    let mut at = 0;
    while at < window_ms {
        at += rng.between(500, 1_500);
        let rules = driver_fault_rules(rng, "300ms");
        if episodes.next_if(|start| *start <= at).is_some() {
            // Timeouts (volumes made) long enough for calls to arrive, then final errors for
            // a few retries of those calls, long enough for some of their claims to be deleted
            // meanwhile (the leak of issue #15's first case).
            let [timing_out, final_error] = final_error_after_timeout_rules(rng, "300ms");
            let timing_out_for = rng.between(500, 1_500);
            let failing_for = rng.between(1_500, 3_000);
            if faults.contains(&Fault::FinalErrorAfterTimeout) {
                events.push((ms(at), Event::Faults(timing_out)));
                events.push((ms(at + timing_out_for), Event::Faults(final_error)));
            } else {
                events.push((ms(at), Event::Faults(rules)));
            }
            at += timing_out_for + failing_for;
        } else {
            events.push((ms(at), Event::Faults(rules)));
        }
    }
    // Stable: events of one instant keep the order they were drawn in.
    events.sort_by_key(|(at, _)| *at);
    Plan {
        claims: claims_plan,
        gaps,
        events,
        chaos_window,
    }
}

/// What happened during the run, printed at the end.
#[derive(Debug, Default)]
struct Tally {
    created: usize,
    deleted_mid_flight: usize,
    force_deleted: usize,
    leader: LeaderTally,
    world: WorldTally,
}

/// What was done to the replicas.
#[derive(Debug, Default)]
struct LeaderTally {
    sigkills: usize,
    failover: Option<Duration>,
    /// How long each paused leader was stopped.
    pauses: Vec<Duration>,
    unplanned_exits: usize,
}

/// What was done to the driver and the cluster, and what was seen there.
#[derive(Debug, Default)]
struct WorldTally {
    fault_rule_sets: usize,
    class_recreations: usize,
    /// Shards deleted and the operations they held, per deletion.
    /// Per deletion of the shards: how many there were, the operations they held, and whether
    /// the leader wrote the journal again within `REBUILD_BOUND`.
    shard_deletions: Vec<(usize, usize, bool)>,
    volume_ids_seen: BTreeSet<String>,
    /// Volume handle → the start of the last read that found a PV holding it (see
    /// [`holds_volume`]). A DeleteVolume of that handle received before then was sent while a
    /// PV held the volume.
    held_until: BTreeMap<String, Timestamp>,
}

impl WorldTally {
    /// Records the PVs of one read started at `read_at`.
    fn observe_pvs(&mut self, read_at: Timestamp, pvs: &[PersistentVolume]) {
        for pv in pvs.iter().filter(|pv| holds_volume(pv)) {
            let handle = Snapshot::handle(pv).to_owned();
            let last = self.held_until.entry(handle).or_insert(read_at);
            *last = (*last).max(read_at);
        }
    }
}

/// Whether a PV holds its volume: from its creation until its claim is gone and it is Released
/// (or Failed). Only then may the volume be deleted; PVs of this test's dynamic claims never go
/// back.
fn holds_volume(pv: &PersistentVolume) -> bool {
    !matches!(
        pv.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Released" | "Failed")
    )
}

/// What the chaos acts on.
struct Stage<'a> {
    client: &'a Client,
    ns: &'a str,
    driver: &'a Driver,
    class: &'a str,
    /// Held while the leader is disrupted (until a leader has loaded the journal again) and
    /// while the shards are deleted (until they are written again): records are held in the
    /// leader's memory alone in between, so deleting the shards while no running replica holds
    /// them would destroy the only copy, which no design can survive.
    leader_stable: &'a tokio::sync::Mutex<()>,
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
                        env: Vec::new(),
                    },
                )
            })
            .collect();
        Replicas { sidecars }
    }

    /// Restarts a replica that exited on its own (as the kubelet would restart the
    /// container), e.g. after losing the Lease while the machine was starved.
    async fn revive(&mut self, tally: &mut LeaderTally) {
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
async fn wait_leader(stage: &Stage<'_>, replicas: &mut Replicas, tally: &mut LeaderTally) -> usize {
    let started = Instant::now();
    loop {
        let holder = lease_holder(stage.client, stage.ns, stage.driver)
            .await
            .unwrap_or_default();
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

/// Waits until a running replica leads and has loaded the journal in its current term.
async fn wait_journal_loaded(stage: &Stage<'_>, replicas: &mut Replicas, tally: &mut LeaderTally) {
    let started = Instant::now();
    loop {
        let leader = wait_leader(stage, replicas, tally).await;
        // The Lease may still name a killed process's replica: its new process must lead.
        if replicas.sidecars[leader].has_loaded_journal() {
            return;
        }
        assert!(
            started.elapsed() < SETTLE_TIMEOUT,
            "{} leads but has not loaded the journal",
            REPLICAS[leader]
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until `successor` holds the Lease (a replica never exits while waiting to lead).
async fn wait_holder(stage: &Stage<'_>, successor: &str) {
    support::eventually(
        &format!("{successor} to take the Lease"),
        SETTLE_TIMEOUT,
        || async {
            let holder = lease_holder(stage.client, stage.ns, stage.driver).await?;
            if holder == successor {
                Ok(())
            } else {
                Err(format!("holder {holder:?}"))
            }
        },
    )
    .await;
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

/// Runs the plan: the disruptions of the leader on one timeline, and on another (so that a
/// long disruption does not bunch them up) the driver's rules, the class re-created and the
/// shards deleted, while sampling the driver's volumes and the PVs.
async fn run_chaos(stage: &Stage<'_>, replicas: &mut Replicas, plan: &Plan, tally: &mut Tally) {
    let started = Instant::now();
    tokio::join!(
        run_disruptions(stage, replicas, plan, started, &mut tally.leader),
        run_world_events(stage, plan, started, &mut tally.world),
    );
    stage.driver.clear_faults();
}

async fn run_disruptions(
    stage: &Stage<'_>,
    replicas: &mut Replicas,
    plan: &Plan,
    started: Instant,
    tally: &mut LeaderTally,
) {
    let mut disruptions = plan.events.iter().filter_map(|(at, event)| match event {
        Event::Disrupt(disruption) => Some((*at, *disruption)),
        _ => None,
    });
    let mut next = disruptions.next();
    {
        let _stable = stage.leader_stable.lock().await;
        wait_journal_loaded(stage, replicas, tally).await;
    }
    while started.elapsed() < plan.chaos_window || next.is_some() {
        if let Some((at, disruption)) = next
            && started.elapsed() >= at
        {
            let _stable = stage.leader_stable.lock().await;
            disrupt(stage, replicas, disruption, tally).await;
            wait_journal_loaded(stage, replicas, tally).await;
            next = disruptions.next();
        }
        replicas.revive(tally).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn run_world_events(
    stage: &Stage<'_>,
    plan: &Plan,
    started: Instant,
    tally: &mut WorldTally,
) {
    let mut events = plan
        .events
        .iter()
        .filter(|(_, event)| !matches!(event, Event::Disrupt(_)))
        .peekable();
    let mut round = 0;
    while started.elapsed() < plan.chaos_window || events.peek().is_some() {
        let now = started.elapsed();
        while let Some((_, event)) = events.next_if(|(at, _)| *at <= now) {
            match event {
                Event::Faults(text) => {
                    stage.driver.set_faults(text);
                    tally.fault_rule_sets += 1;
                }
                Event::RecreateClass { generation, gap } => {
                    recreate_class(stage, *generation, *gap).await;
                    tally.class_recreations += 1;
                }
                Event::DeleteShards => {
                    let _stable = stage.leader_stable.lock().await;
                    tally.shard_deletions.push(delete_shards(stage).await);
                }
                Event::Disrupt(_) => {}
            }
        }
        tally
            .volume_ids_seen
            .extend(stage.driver.volumes().into_iter().map(|v| v.id));
        if round % PV_SAMPLE_EVERY == 0 {
            let read_at = Timestamp::now();
            if let Ok(pvs) = driver_pvs(stage.client, stage.driver).await {
                tally.observe_pvs(read_at, &pvs);
            }
        }
        round += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn disrupt(
    stage: &Stage<'_>,
    replicas: &mut Replicas,
    disruption: Disruption,
    tally: &mut LeaderTally,
) {
    let leader = wait_leader(stage, replicas, tally).await;
    let successor = REPLICAS[1 - leader];
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
            println!(
                "[chaos] SIGTERM {} (leader); {successor} should take over",
                REPLICAS[leader]
            );
            let since = Instant::now();
            replicas.sidecars[leader].signal(Signal::SIGTERM);
            wait_holder(stage, successor).await;
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
        Disruption::Pause { past_takeover } => {
            // The successor must be up to take the Lease over.
            replicas.revive(tally).await;
            println!(
                "[chaos] SIGSTOP {} (leader) until {successor} takes over, SIGCONT {past_takeover:?} later",
                REPLICAS[leader]
            );
            let since = Instant::now();
            replicas.sidecars[leader].signal(Signal::SIGSTOP);
            wait_holder(stage, successor).await;
            tokio::time::sleep(past_takeover).await;
            replicas.sidecars[leader].signal(Signal::SIGCONT);
            let stopped = since.elapsed();
            tally.pauses.push(stopped);
            // Its renewals are refused now: it gives up at its renew deadline and exits
            // (tests/leader_election.rs), and is restarted as the kubelet would.
            let status = replicas.sidecars[leader].wait_exit(SETTLE_TIMEOUT).await;
            println!(
                "[chaos] {} was stopped for {stopped:?}; after SIGCONT it exited: {}",
                REPLICAS[leader],
                support::peers::describe(status)
            );
            replicas.sidecars[leader].restart().await;
        }
    }
}

/// Deletes the StorageClass and, `gap` later, creates it again with the same name and reclaim
/// policy but other parameters: a claim in flight may see either, or none.
async fn recreate_class(stage: &Stage<'_>, generation: usize, gap: Duration) {
    let classes = Api::<StorageClass>::all(stage.client.clone());
    classes
        .delete(stage.class, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("deleting StorageClass {}: {e}", stage.class));
    support::eventually(
        &format!("StorageClass {} to be gone", stage.class),
        SETTLE_TIMEOUT,
        || async {
            match classes.get_opt(stage.class).await {
                Ok(None) => Ok(()),
                Ok(Some(_)) => Err("still there".to_owned()),
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await;
    tokio::time::sleep(gap).await;
    let generation = generation.to_string();
    create_class(
        stage.client,
        &storage_class(
            stage.class,
            stage.driver,
            "Delete",
            &[("chaos-generation", &generation)],
        ),
    )
    .await;
    println!(
        "[chaos] StorageClass {} re-created {gap:?} after its deletion, with chaos-generation={generation}",
        stage.class
    );
}

/// `kubectl delete provisioningjournals --all` in the sidecars' namespace; returns how many
/// shards and operations were deleted.
async fn delete_shards(stage: &Stage<'_>) -> (usize, usize, bool) {
    let shards = Api::<ProvisioningJournal>::namespaced(stage.client.clone(), stage.ns);
    let held = shards
        .list(&ListParams::default())
        .await
        .unwrap_or_else(|e| panic!("listing journal shards: {e}"))
        .items;
    let operations = held.iter().map(|shard| shard.spec.operations.len()).sum();
    shards
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .unwrap_or_else(|e| panic!("deleting every journal shard: {e}"));
    println!(
        "[chaos] deleted every journal shard: {} holding {operations} operations",
        held.len()
    );
    // The leader writes again what it holds at once, each shard whole; no disruption before it
    // has: until then its memory holds the only copy. A shard is back once it exists again, or
    // needs no copy once a PV holds every volume it held (the leader then holds none of its
    // records, and writes no empty shard). If it is not back within the bound, the final checks
    // say what was lost (with the logs).
    let deleted: Vec<(String, Vec<String>)> = held
        .iter()
        .map(|shard| {
            let volumes = shard.spec.operations.iter();
            let volumes = volumes.map(|record| record.volume_name.clone()).collect();
            (shard.name_any(), volumes)
        })
        .collect();
    let since = Instant::now();
    let mut missing = shards_not_back(stage, &deleted).await;
    while !missing.is_empty() && since.elapsed() < REBUILD_BOUND {
        tokio::time::sleep(POLL).await;
        missing = shards_not_back(stage, &deleted).await;
    }
    let rebuilt = missing.is_empty();
    if rebuilt {
        println!(
            "[chaos] the leader wrote the journal again after {:?}",
            since.elapsed()
        );
    } else {
        println!("[chaos] shards not written again within {REBUILD_BOUND:?}: {missing:?}");
    }
    (held.len(), operations, rebuilt)
}

/// The deleted shards (name, the volumes of its records) that are not back yet and still
/// hold a volume no PV holds. A read that fails counts every shard as missing.
async fn shards_not_back(stage: &Stage<'_>, deleted: &[(String, Vec<String>)]) -> Vec<String> {
    let shards = Api::<ProvisioningJournal>::namespaced(stage.client.clone(), stage.ns);
    let (Ok(back), Ok(pvs)) = (
        shards.list(&ListParams::default()).await,
        driver_pvs(stage.client, stage.driver).await,
    ) else {
        return deleted.iter().map(|(name, _)| name.clone()).collect();
    };
    let back: BTreeSet<String> = back.items.iter().map(ResourceExt::name_any).collect();
    let with_pv: BTreeSet<String> = pvs.iter().map(ResourceExt::name_any).collect();
    deleted
        .iter()
        .filter(|(name, volumes)| {
            !back.contains(name) && volumes.iter().any(|volume| !with_pv.contains(volume))
        })
        .map(|(name, _)| name.clone())
        .collect()
}

/// The state of everything the test created, from one set of reads.
struct Snapshot {
    claims: BTreeMap<String, PersistentVolumeClaim>,
    pvs: Vec<PersistentVolume>,
    /// When the PV list was asked for: the PVs were as listed at this moment or later.
    pvs_read_at: Timestamp,
    /// Volume id → name, on the driver.
    volumes: BTreeMap<String, String>,
    journal: Vec<String>,
}

impl Snapshot {
    async fn take(stage: &Stage<'_>) -> Result<Snapshot, String> {
        let Stage {
            client, ns, driver, ..
        } = *stage;
        let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns)
            .list(&ListParams::default())
            .await
            .map_err(|e| format!("listing PVCs: {e}"))?
            .items
            .into_iter()
            .map(|pvc| (pvc.metadata.name.clone().unwrap_or_default(), pvc))
            .collect();
        let pvs_read_at = Timestamp::now();
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
            pvs_read_at,
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

    /// Claims and PVs being deleted, with what holds them (ours is the consistency finalizer).
    fn stuck(&self) -> Vec<String> {
        let claims = self.claims.values().map(|pvc| ("PVC", &pvc.metadata));
        let pvs = self.pvs.iter().map(|pv| ("PV", &pv.metadata));
        claims
            .chain(pvs)
            .filter(|(_, meta)| meta.deletion_timestamp.is_some())
            .map(|(kind, meta)| {
                let finalizers = meta.finalizers.clone().unwrap_or_default();
                let ours = if finalizers.iter().any(|f| f == PROVISIONING_FINALIZER) {
                    ", ours among them"
                } else {
                    ""
                };
                format!(
                    "{kind} {:?} Terminating, finalizers {finalizers:?}{ours}",
                    meta.name
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
            "{} claims ({bound} Bound), {} Terminating, {} PVs, {} driver volumes, {} journal operations",
            self.claims.len(),
            self.stuck().len(),
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
    stage: &Stage<'_>,
    replicas: &mut Replicas,
    tally: &mut Tally,
    settled: impl Fn(&Snapshot) -> Result<(), String>,
) -> Snapshot {
    let started = Instant::now();
    let mut last_print = Instant::now();
    loop {
        replicas.revive(&mut tally.leader).await;
        let verdict = match Snapshot::take(stage).await {
            Ok(snapshot) => {
                tally.world.observe_pvs(snapshot.pvs_read_at, &snapshot.pvs);
                match settled(&snapshot) {
                    Ok(()) => return snapshot,
                    Err(why) => format!("{}; {why}", snapshot.summary()),
                }
            }
            Err(error) => error,
        };
        if started.elapsed() > SETTLE_TIMEOUT {
            fail(
                stage.driver,
                replicas,
                &format!("not settled after {SETTLE_TIMEOUT:?} ({what}): {verdict}"),
            );
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

/// Fails the test with `why`, keeping the full logs.
fn fail(driver: &Driver, replicas: &Replicas, why: &str) -> ! {
    let kept = save_logs(driver, replicas);
    panic!("{why}; full logs in {kept}");
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
    let faults = faults_wanted();
    println!("[chaos] CHAOS_SEED={seed} CHAOS_CLAIMS={claims_wanted}");
    let mut rng = Rng::new(seed);
    let plan = plan(&mut rng, claims_wanted, &faults);
    plan.print(seed, &faults);

    let cluster = Cluster::new("chaos").await;
    let driver = Driver::start(&["--delay", "CreateVolume=300ms"]).await;
    let class = cluster.class("chaos", &driver, "Delete", &[]).await;
    let leader_stable = tokio::sync::Mutex::new(());
    let stage = Stage {
        client: &cluster.client,
        ns: cluster.ns(),
        driver: &driver,
        class: &class,
        leader_stable: &leader_stable,
    };
    let mut replicas = Replicas::start(&driver, stage.ns);
    let mut tally = Tally::default();
    let first = wait_leader(&stage, &mut replicas, &mut tally.leader).await;
    println!("[chaos] {} leads; starting", REPLICAS[first]);

    let started = Instant::now();
    let (deletions, ()) = tokio::join!(
        create_claims(&cluster.claims, &class, &plan.claims, &plan.gaps),
        run_chaos(&stage, &mut replicas, &plan, &mut tally),
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
        "kept claims Bound, deleted claims gone, nothing Terminating, orphans deleted, journal empty",
        &stage,
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
            let stuck = s.stuck();
            if unbound.is_empty()
                && lingering.is_empty()
                && extra.is_empty()
                && dangling.is_empty()
                && stuck.is_empty()
                && s.pvs.len() == kept.len()
                && s.journal.is_empty()
            {
                Ok(())
            } else {
                Err(format!(
                    "unbound {}, deleted but present {}, driver volumes without exactly one PV {}, PVs without a volume {}, Terminating {}, journal {}",
                    first_few(&unbound),
                    first_few(&lingering),
                    first_few(&extra),
                    first_few(&dangling),
                    first_few(&stuck),
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
        quiet.stuck().is_empty(),
        "stuck Terminating: {:?}",
        quiet.stuck()
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
        &stage,
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
                    "claims {:?}, driver volumes {:?}, Terminating {}, journal {}",
                    s.claims.keys().take(5).collect::<Vec<_>>(),
                    s.volumes.values().take(5).collect::<Vec<_>>(),
                    first_few(&s.stuck()),
                    first_few(&s.journal)
                ))
            }
        },
    )
    .await;
    let clean_took = cleaning.elapsed();
    let leaked = support::csi_wire::list_volume_ids(driver.socket()).await;

    // A DeleteVolume received before a read that still found a PV holding that volume was sent
    // while the PV held it (whether or not the call then deleted anything).
    let delete_requests = driver.volume_requests("DeleteVolume");
    assert_eq!(
        delete_requests.len(),
        driver.requests("DeleteVolume").len(),
        "every DeleteVolume request line names its volume id"
    );
    let checked = delete_requests
        .iter()
        .filter(|request| tally.world.held_until.contains_key(&request.volume_id))
        .count();
    let unsafe_deletes: Vec<String> = delete_requests
        .iter()
        .filter_map(|request| {
            let held = tally.world.held_until.get(&request.volume_id)?;
            (request.at < *held).then(|| {
                format!(
                    "{} received at {}, a PV held it at {held}",
                    request.volume_id, request.at
                )
            })
        })
        .collect();

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
        "[chaos] SIGKILLs of the leader {}, failover (SIGTERM) took {:?}, leader pauses {:?}, replicas that exited on their own {}",
        tally.leader.sigkills,
        tally.leader.failover,
        tally.leader.pauses,
        tally.leader.unplanned_exits
    );
    if tally
        .world
        .shard_deletions
        .iter()
        .any(|(_, _, rebuilt)| !rebuilt)
    {
        fail(
            &driver,
            &replicas,
            &format!(
                "the leader did not write the journal again within {REBUILD_BOUND:?} of a deletion: {:?}",
                tally.world.shard_deletions
            ),
        );
    }
    println!(
        "[chaos] fault rule sets {} (final error after a timeout: {} episodes), StorageClass re-created {} times, journal shards deleted (shards, operations) {:?}",
        tally.world.fault_rule_sets,
        plan.count(
            |e| matches!(e, Event::Faults(rules) if rules.contains("after:deadline-exceeded\n"))
        ),
        tally.world.class_recreations,
        tally.world.shard_deletions
    );
    println!(
        "[chaos] driver: CreateVolume calls {} ({} Ok), DeleteVolume calls {} ({} Ok), volume ids seen while sampling {}, volume handles seen held by a PV {}",
        creates.len(),
        ok(&creates),
        deletes.len(),
        ok(&deletes),
        tally.world.volume_ids_seen.len(),
        tally.world.held_until.len()
    );
    println!(
        "[chaos] orphans deleted by the journal {orphans_deleted}, volumes at quiescence {volumes_at_quiescence} (= PVs), leaks {} (ListVolumes after every claim was deleted), DeleteVolume requests {} ({checked} of a volume a PV held at some point; while it held it: {}), stuck objects 0",
        leaked.len(),
        delete_requests.len(),
        unsafe_deletes.len()
    );
    println!(
        "[chaos] wall: chaos {chaos_took:?}, quiescence {settle_took:?}, final deletion {clean_took:?}"
    );
    if !unsafe_deletes.is_empty() {
        fail(
            &driver,
            &replicas,
            &format!(
                "DeleteVolume sent while a PV held the volume: {}",
                first_few(&unsafe_deletes)
            ),
        );
    }
    // The final deletion deletes the volume of every kept claim, which its PV held: the check
    // above saw at least those.
    assert!(
        checked >= kept.len(),
        "only {checked} DeleteVolume requests of a volume a PV held, for {} kept claims",
        kept.len()
    );
    assert_eq!(tally.leader.sigkills, SIGKILLS);
    assert!(tally.leader.failover.is_some(), "the failover happened");
    let planned = |wanted: fn(&Event) -> bool| plan.count(wanted);
    assert_eq!(
        tally.leader.pauses.len(),
        planned(|e| matches!(e, Event::Disrupt(Disruption::Pause { .. })))
    );
    assert_eq!(
        tally.world.class_recreations,
        planned(|e| matches!(e, Event::RecreateClass { .. }))
    );
    assert_eq!(
        tally.world.shard_deletions.len(),
        planned(|e| matches!(e, Event::DeleteShards))
    );
    assert!(end.volumes.is_empty(), "leaked volumes");
    assert!(
        leaked.is_empty(),
        "ListVolumes reports leaked volumes: {leaked:?}"
    );
}
