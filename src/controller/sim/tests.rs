//! `seeds`: N seeds per profile (`SIM_SEEDS`), failing with the trace of the first failing
//! seed. `replay`: the seed `SIM_SEED` (profile `SIM_PROFILE`, else each), trace printed.
//! `holes`: with `SIM_EXPECT_HOLES=1`, asserts that each of the five known holes of issue #31
//! is found within `SIM_HOLE_SEEDS` seeds of its profile, and prints the smallest seed and
//! its trace.

use std::time::Instant;

use super::invariants::Kind;
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
    let seeds = env_number("SIM_SEEDS", 4);
    let only = std::env::var("SIM_PROFILE").ok();
    let started = Instant::now();
    let mut runs = 0;
    for profile in profiles::all() {
        if only.as_deref().is_some_and(|name| name != profile.name) {
            continue;
        }
        for seed in 0..seeds {
            runs += 1;
            if let Err(failure) = run_seed(&profile, seed) {
                panic!("{failure}");
            }
        }
    }
    let elapsed = started.elapsed();
    println!(
        "{runs} seeds in {elapsed:?} ({:.1} seeds/s)",
        runs as f64 / elapsed.as_secs_f64()
    );
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

/// Each known hole: its profile and the invariants that show it.
fn holes() -> Vec<(&'static str, Profile, Vec<Kind>)> {
    vec![
        (
            "1: node move, other node's PV taken as ours",
            profiles::node_moves(),
            vec![Kind::Leak],
        ),
        (
            "2: lazy removal after a first-attempt final error",
            profiles::final_errors(),
            vec![Kind::NotQuiescent, Kind::Leak],
        ),
        (
            "3: an untranslatable in-tree PV blocks every reap",
            profiles::in_tree(),
            vec![Kind::NotQuiescent],
        ),
        (
            "4: a restore releases the snapshot another still reads",
            profiles::restores(),
            vec![Kind::SourceReleased],
        ),
        (
            "5: the reaper beside a claim retry",
            profiles::races(),
            vec![Kind::Leak, Kind::UnsafeDelete],
        ),
    ]
}

#[test]
fn expected_holes() {
    if std::env::var_os("SIM_EXPECT_HOLES").is_none() {
        return;
    }
    let budget = env_number("SIM_HOLE_SEEDS", 300);
    let mut missing = Vec::new();
    for (hole, profile, kinds) in holes() {
        let found = (0..budget).find_map(|seed| match run_seed(&profile, seed) {
            Err(failure) if kinds.contains(&failure.kind) => Some(failure),
            _ => None,
        });
        match found {
            Some(failure) => println!(
                "=== hole {hole}: found by seed {} ===\n{failure}\n",
                failure.seed
            ),
            None => {
                println!("=== hole {hole}: not found within {budget} seeds ===");
                missing.push(hole);
            }
        }
    }
    assert!(missing.is_empty(), "holes not found: {missing:?}");
}
