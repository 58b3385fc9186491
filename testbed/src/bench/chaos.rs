//! The chaos scenario, the same plan against both sidecars: claims are created while the
//! driver answers CreateVolume slowly and sometimes not at all after creating the volume
//! (DEADLINE_EXCEEDED with the volume made, or a reply that never comes), a share of the claims is deleted while its
//! volume is being created, and the sidecar is SIGKILLed and restarted a few times. Once the
//! faults stop and everything had time to settle, a leaked volume is one the driver holds and
//! no PV points at: nothing will ever delete it. This is upstream's issue #486 in numbers.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use csi_testbed::Rng;
use csi_testbed::chaos::driver_fault_rules;
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::{Api, ListParams};

use super::api::{self, ClaimWatch, Cluster, NAMESPACE};
use super::proc;
use super::report::Results;
use super::scenarios::{
    Driver, Extra, prepare_cluster, spawn_sidecar, start_control_plane, warm_up,
};
use super::stats::{self, Impl};
use super::{Bench, BenchError};

/// Flags both sidecars get: a short call timeout so the driver's slow answers turn into
/// retries, and quick retries so the run settles in seconds.
const FLAGS: [&str; 5] = [
    "--timeout=3s",
    "--retry-interval-start=200ms",
    "--retry-interval-max=5s",
    "--kube-api-qps=200",
    "--kube-api-burst=400",
];
pub const SIGKILLS: usize = 3;
/// Mean gap between two claim creations, in ms.
const CREATION_GAP_MS: u64 = 50;
/// A deleted claim is deleted at most this long after its creation, in ms: while its
/// CreateVolume (delayed 1.5 s or more) is still running.
const DELETE_WITHIN_MS: u64 = 3_000;
/// Faults and kills go on this long after the last creation.
const CHAOS_TAIL: Duration = Duration::from_secs(5);
/// After the chaos, how long either sidecar gets to clean up. Ours needs a few seconds (the
/// orphan reaper looks every 2 s); a volume still unaccounted for after this is leaked.
pub const SETTLE: Duration = Duration::from_secs(60);
/// Settled means nothing leaked and every kept claim Bound for this long in a row: a call
/// still in flight at the first such look could create one more volume.
pub const SETTLED_FOR: Duration = Duration::from_secs(10);

#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    Create(String),
    Delete(String),
    Faults(String),
    Kill,
    Restart,
}

/// What happens when, from a seed: the same for ours and upstream in one round.
pub fn plan(seed: u64, claims: usize) -> Vec<(Duration, Step)> {
    let mut rng = Rng::new(seed);
    let ms = Duration::from_millis;
    let mut steps = Vec::new();
    let mut at = 0;
    for name in api::numbered("chaos", claims) {
        at += rng.between(0, 2 * CREATION_GAP_MS);
        steps.push((ms(at), Step::Create(name.clone())));
        if rng.chance(30) {
            steps.push((
                ms(at + rng.between(0, DELETE_WITHIN_MS)),
                Step::Delete(name),
            ));
        }
    }
    let window = at + u64::try_from(CHAOS_TAIL.as_millis()).unwrap_or(u64::MAX);
    for _ in 0..SIGKILLS {
        let kill = rng.between(1_000, window);
        steps.push((ms(kill), Step::Kill));
        steps.push((ms(kill + rng.between(0, 2_000)), Step::Restart));
    }
    let mut change = 0;
    while change < window {
        let rules = driver_fault_rules(&mut rng, "1500ms");
        steps.push((ms(change), Step::Faults(rules)));
        change += rng.between(500, 1_500);
    }
    steps.push((ms(window), Step::Faults(String::new())));
    // Stable: a kill and its restart keep their order when they fall on the same instant.
    steps.sort_by_key(|(at, _)| *at);
    steps
}

/// The claims still wanted at the end of a plan.
fn kept_claims(steps: &[(Duration, Step)]) -> BTreeSet<String> {
    let mut kept = BTreeSet::new();
    for (_, step) in steps {
        match step {
            Step::Create(name) => {
                kept.insert(name.clone());
            }
            Step::Delete(name) => {
                kept.remove(name);
            }
            _ => {}
        }
    }
    kept
}

pub async fn chaos(
    b: &Bench,
    imp: Impl,
    round: u32,
    results: &mut Results,
) -> Result<(), BenchError> {
    let tag = format!("(chaos) {imp} round {round}");
    let steps = plan(u64::from(round), b.sizes.chaos);
    let kept = kept_claims(&steps);
    let cp = start_control_plane(b, &tag).await?;
    let cluster = prepare_cluster(b, &cp).await?;
    let name = format!("chaos-{imp}-r{round}");
    let mut driver = Driver::start(b, &name).await?;
    let mut starts = 0;
    let mut start = |driver: &Driver| {
        starts += 1;
        let flags: Vec<String> = FLAGS.iter().map(|f| (*f).to_owned()).collect();
        spawn_sidecar(
            b,
            imp,
            driver,
            &cp,
            &Extra {
                flags: &flags,
                ..Extra::default()
            },
            &format!("{name}-{starts}"),
        )
    };
    let mut sidecar = start(&driver)?;
    warm_up(b, &tag, &cluster, &mut sidecar, &mut driver).await?;
    let claims = ClaimWatch::start(&cluster.client, NAMESPACE).await?;

    let deletions = steps
        .iter()
        .filter(|(_, s)| matches!(s, Step::Delete(_)))
        .count();
    b.say(format!(
        "{tag}: {} claims, {deletions} deleted mid-flight, {SIGKILLS} SIGKILLs",
        b.sizes.chaos
    ));
    let t0 = Instant::now();
    let mut running = Some(sidecar);
    for (at, step) in &steps {
        tokio::time::sleep_until((t0 + *at).into()).await;
        match step {
            Step::Create(claim) => {
                cluster
                    .create_claims(NAMESPACE, std::slice::from_ref(claim), false)
                    .await?
            }
            Step::Delete(claim) => {
                cluster
                    .delete_claims(NAMESPACE, std::slice::from_ref(claim))
                    .await?
            }
            Step::Faults(rules) => driver.set_faults(rules)?,
            Step::Kill => {
                if let Some(victim) = running.take() {
                    victim.signal(nix::sys::signal::Signal::SIGKILL);
                    victim.stop().await;
                }
            }
            Step::Restart => {
                if running.is_none() {
                    running = Some(start(&driver)?);
                }
            }
        }
    }
    let mut sidecar = match running {
        Some(sidecar) => sidecar,
        None => start(&driver)?,
    };

    b.say(format!(
        "{tag}: chaos over; up to {}s to settle",
        SETTLE.as_secs()
    ));
    let settle_from = Instant::now();
    let mut settled_since: Option<Instant> = None;
    let outcome = loop {
        sidecar.check_alive()?;
        let outcome = Outcome::read(&cluster, &driver, &claims, &kept).await?;
        settled_since = match settled_since {
            Some(since) if outcome.settled() => Some(since),
            None if outcome.settled() => Some(Instant::now()),
            _ => None,
        };
        if settled_since.is_some_and(|since| since.elapsed() >= SETTLED_FOR)
            || settle_from.elapsed() > SETTLE
        {
            break outcome;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let imp_ = Some(imp);
    results.sample(stats::CHAOS_LEAKS, imp_, round, outcome.leaked as f64);
    results.sample(stats::CHAOS_UNBOUND, imp_, round, outcome.unbound as f64);
    b.say(format!(
        "{tag}: {} volume(s) leaked, {} of {} kept claims not Bound (looked for {:.0}s)",
        outcome.leaked,
        outcome.unbound,
        kept.len(),
        settle_from.elapsed().as_secs_f64()
    ));
    sidecar.stop().await;
    driver.stop().await;
    Ok(())
}

struct Outcome {
    /// Driver volumes no PV points at.
    leaked: usize,
    /// Kept claims not Bound.
    unbound: usize,
}

impl Outcome {
    async fn read(
        cluster: &Cluster,
        driver: &Driver,
        claims: &ClaimWatch,
        kept: &BTreeSet<String>,
    ) -> Result<Outcome, BenchError> {
        let handles: BTreeSet<String> = Api::<PersistentVolume>::all(cluster.client.clone())
            .list(&ListParams::default())
            .await
            .map_err(|e| BenchError::Step {
                step: "listing PVs".into(),
                detail: e.to_string(),
            })?
            .items
            .into_iter()
            .filter_map(|pv| pv.spec?.csi.map(|csi| csi.volume_handle))
            .collect();
        let volumes = proc::driver_volume_ids(driver.state_dir())?;
        Ok(Outcome {
            leaked: volumes.difference(&handles).count(),
            unbound: kept.iter().filter(|name| !claims.is_bound(name)).count(),
        })
    }

    fn settled(&self) -> bool {
        self.leaked == 0 && self.unbound == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_fixes_the_plan() {
        assert_eq!(plan(3, 40), plan(3, 40));
        assert_ne!(plan(3, 40), plan(4, 40));
    }

    #[test]
    fn the_plan_is_ordered_and_complete() {
        let steps = plan(1, 100);
        assert!(steps.windows(2).all(|w| w[0].0 <= w[1].0));
        let count = |f: fn(&Step) -> bool| steps.iter().filter(|(_, s)| f(s)).count();
        assert_eq!(count(|s| matches!(s, Step::Create(_))), 100);
        assert_eq!(count(|s| matches!(s, Step::Kill)), SIGKILLS);
        assert_eq!(count(|s| matches!(s, Step::Restart)), SIGKILLS);
        // Every deletion follows its creation, and the faults end cleared.
        for (at, step) in &steps {
            if let Step::Delete(name) = step {
                let created = steps
                    .iter()
                    .find(|(_, s)| *s == Step::Create(name.clone()))
                    .map(|(t, _)| *t);
                assert!(created.is_some_and(|c| c <= *at), "{name}");
            }
        }
        assert_eq!(
            steps
                .iter()
                .rev()
                .find(|(_, s)| matches!(s, Step::Faults(_))),
            steps
                .iter()
                .rev()
                .find(|(_, s)| *s == Step::Faults(String::new()))
        );
        let deleted = count(|s| matches!(s, Step::Delete(_)));
        assert_eq!(kept_claims(&steps).len(), 100 - deleted);
    }
}
