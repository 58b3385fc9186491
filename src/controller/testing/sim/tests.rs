//! `seeds`: N seeds per profile (`SIM_SEEDS`), failing with the trace of the first failing
//! seed. `replay`: the seed `SIM_SEED` (profile `SIM_PROFILE`, else each), trace printed.
//! `holes`: with `SIM_EXPECT_HOLES=1`, asserts that each of the five known holes of issue #31
//! is found within `SIM_HOLE_SEEDS` seeds of its profile, and prints the smallest seed and
//! its trace.

use std::collections::BTreeMap;
use std::time::Instant;

use super::findings::Hole;
use super::profiles;
use super::world::{Failure, Profile, World};

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs one seed on a runtime of its own (current thread, paused clock): whatever the
/// crashed processes left pending dies with it.
pub fn run_seed(profile: &Profile, seed: u64) -> Result<String, Failure> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime");
    let profile = profile.clone();
    runtime.block_on(async move { World::new(seed, profile).await.run().await })
}

#[test]
fn seeds() {
    let seeds = env_number("SIM_SEEDS", 25);
    let only = std::env::var("SIM_PROFILE").ok();
    // SIM_TALLY=1: run every seed and count the findings by hole, instead of failing at the
    // first.
    let tally = std::env::var_os("SIM_TALLY").is_some();
    let started = Instant::now();
    let mut runs = 0;
    let mut found: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for profile in profiles::all() {
        if only.as_deref().is_some_and(|name| name != profile.name) {
            continue;
        }
        for seed in 0..seeds {
            runs += 1;
            match run_seed(&profile, seed) {
                Ok(_) => {}
                Err(failure) if tally => {
                    let key = format!("{} {:?} {:?}", profile.name, failure.hole, failure.kind);
                    found.entry(key).or_default().push(seed);
                }
                Err(failure) => panic!("{failure}"),
            }
        }
    }
    let elapsed = started.elapsed();
    println!(
        "{runs} seeds in {elapsed:?} ({:.1} seeds/s)",
        runs as f64 / elapsed.as_secs_f64()
    );
    for (key, seeds) in &found {
        println!(
            "{key}: {} seeds, first {:?}",
            seeds.len(),
            &seeds[..seeds.len().min(8)]
        );
    }
}

#[test]
fn replay() {
    let Ok(seed) = std::env::var("SIM_SEED") else {
        return;
    };
    let seed: u64 = seed.parse().expect("SIM_SEED is a number");
    let only = std::env::var("SIM_PROFILE").ok();
    let mut failed = Vec::new();
    for profile in profiles::all() {
        if only.as_deref().is_some_and(|name| name != profile.name) {
            continue;
        }
        match run_seed(&profile, seed) {
            Ok(trace) => println!(
                "{trace}\nseed {seed} profile {}: all invariants hold",
                profile.name
            ),
            Err(failure) => {
                println!("{failure}");
                failed.push(profile.name);
            }
        }
    }
    assert!(failed.is_empty(), "seed {seed} fails in {failed:?}");
}

/// Each known hole of issue #31 and the profile that makes it reachable.
fn holes() -> Vec<(Hole, Profile)> {
    vec![
        (Hole::NodeMove, profiles::node_moves()),
        (Hole::LazyRemoval, profiles::final_errors()),
        (Hole::InTreeBlocks, profiles::in_tree()),
        (Hole::SharedSnapshot, profiles::restores()),
        (Hole::ReaperRace, profiles::races()),
    ]
}

#[test]
fn expected_holes() {
    if std::env::var_os("SIM_EXPECT_HOLES").is_none() {
        return;
    }
    let budget = env_number("SIM_HOLE_SEEDS", 300);
    let mut missing = Vec::new();
    for (hole, profile) in holes() {
        let mut others = Vec::new();
        let found = (0..budget).find_map(|seed| match run_seed(&profile, seed) {
            Err(failure) if failure.hole == hole => Some(failure),
            Err(failure) => {
                others.push(format!("{}:{:?}", failure.seed, failure.hole));
                None
            }
            Ok(_) => None,
        });
        println!(
            "=== {hole:?} ({}): seeds failing otherwise before it: {others:?}",
            profile.name
        );
        match found {
            Some(failure) => println!(
                "=== {hole:?}: found by seed {} ===\n{failure}\n",
                failure.seed
            ),
            None => {
                println!("=== {hole:?}: not found within {budget} seeds ===");
                missing.push(hole);
            }
        }
    }
    assert!(missing.is_empty(), "holes not found: {missing:?}");
}

/// The same seed gives the same trace (every set the scheduler picks from is sorted, the
/// runtime is single-threaded with a paused clock).
#[test]
fn same_seed_same_trace() {
    let render = |result: Result<String, Failure>| match result {
        Ok(trace) => trace,
        Err(failure) => failure.to_string(),
    };
    for profile in [profiles::node_moves(), profiles::failover()] {
        let first = render(run_seed(&profile, 3));
        let second = render(run_seed(&profile, 3));
        assert!(
            first == second,
            "seed 3 of {} is not deterministic",
            profile.name
        );
    }
}
