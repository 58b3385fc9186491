//! Which known hole a violation shows, from the violation and the driver's history of the
//! volume. The holes are those of issue #31 (1 to 5) and the one the simulation found
//! besides (6); anything else is `Unknown`.

use super::apiserver::text;
use super::driver::Touch;
use super::invariants::{Kind, Violation};
use super::world::World;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hole {
    /// 1: node mode, the claim's selected node moves: another node's PV of the same name is
    /// taken as this node's and its record dropped without DeleteVolume.
    NodeMove,
    /// 2: the lazy removal after a first-attempt final error is lost in a crash: the record
    /// comes back as may-exist and can never be settled.
    LazyRemoval,
    /// 3: an in-tree PV whose source cannot be translated blocks the reap of every orphan.
    InTreeBlocks,
    /// 4: a restore releases the snapshot another restore's record still reads.
    SharedSnapshot,
    /// 5: the reaper works on an operation a claim reconcile works on too.
    ReaperRace,
    /// 6: a replay (the reaper's, or a claim retry's from a stale cache) creates again a
    /// volume the volume reconciler already deleted with its PV, and a PV that is gone or
    /// going (a stale cached one, or one being deleted) is taken to hold it.
    StaleReplay,
    /// 7: a deposed leader (resumed after a pause, its fence closed) settles its fenced
    /// attempt by removing the record, and its journal writer erases from the shared shard a
    /// record the new leader adopted and replays.
    DeposedLeader,
    /// 8 (the root of 2, reached without a lost removal): a record recovered after a crash is
    /// "may exist" for good, so a replay answered with a final error (the recorded request is
    /// refused: written before the crash from a stale class) can never settle it. Documented
    /// (docs/journal.md rule 3b and "Limits"): the world accepts it rather than failing.
    RecoveredFinalError,
    Unknown,
}

fn by(touch: &Touch, what: &str) -> bool {
    touch.actor.contains(what)
}

pub fn classify(world: &World, violation: &Violation) -> Hole {
    let history = |name: &str| -> Vec<Touch> {
        let mut all = Vec::new();
        for driver in world.drivers.values() {
            let relevant = violation
                .driver
                .as_deref()
                .is_none_or(|d| d == driver.label() || violation.kind != Kind::Leak);
            if relevant && let Some(touches) = driver.lock().history.get(name) {
                all.extend(touches.iter().cloned());
            }
        }
        all
    };
    match violation.kind {
        Kind::SourceReleased => Hole::SharedSnapshot,
        Kind::UnsafeDelete if violation.message.contains(" reap ") => Hole::ReaperRace,
        Kind::UnsafeDelete => Hole::Unknown,
        Kind::Leak => {
            let Some(name) = violation.volume.as_deref() else {
                return Hole::Unknown;
            };
            let driver = violation.driver.clone().unwrap_or_default();
            let id = format!("{driver}:{name}");
            if let Some(pv) = world.server.get("persistentvolumes", "", name) {
                let handle = text(&pv["spec"]["csi"]["volumeHandle"]);
                if !handle.is_empty() && handle != id {
                    return Hole::NodeMove;
                }
            }
            // Another node's driver made a volume of the same name: both nodes provisioned
            // the claim, and one took the other's PV for its own.
            let elsewhere = world.drivers.values().any(|other| {
                other.label() != driver
                    && other
                        .lock()
                        .history
                        .get(name)
                        .is_some_and(|touches| touches.iter().any(|t| !t.delete && t.changed))
            });
            if elsewhere {
                return Hole::NodeMove;
            }
            let touches = history(name);
            let Some(last_create) = touches.iter().rposition(|t| !t.delete && t.changed) else {
                return Hole::Unknown;
            };
            let creator = &touches[last_create];
            let deleted_by_pv = touches[..last_create]
                .iter()
                .any(|t| t.delete && t.changed && by(t, " pv "));
            if deleted_by_pv {
                return Hole::StaleReplay;
            }
            if by(creator, " claim ") && touches.iter().any(|t| by(t, " reap ")) {
                return Hole::ReaperRace;
            }
            if world.deposed_any() {
                return Hole::DeposedLeader;
            }
            Hole::Unknown
        }
        Kind::NotQuiescent => {
            let Some(name) = violation.volume.as_deref() else {
                return Hole::Unknown;
            };
            let touches = history(name);
            let creates: Vec<&Touch> = touches.iter().filter(|t| !t.delete).collect();
            let final_error = |t: &&Touch| {
                t.outcome.starts_with("INVALID_ARGUMENT")
                    || t.outcome.starts_with("RESOURCE_EXHAUSTED")
            };
            let stuck = creates.len() > 1
                && creates
                    .last()
                    .is_some_and(|t| final_error(t) || t.outcome.starts_with("ALREADY_EXISTS"));
            if stuck {
                return if lost_removal(world, name, &touches) {
                    Hole::LazyRemoval
                } else {
                    Hole::RecoveredFinalError
                };
            }
            let in_tree = world
                .server
                .list("persistentvolumes")
                .iter()
                .any(|pv| !pv["spec"]["azureFile"].is_null());
            let reaped_not_deleted = creates
                .last()
                .is_some_and(|t| by(t, " reap ") && t.outcome.starts_with("OK"))
                && touches.last().is_some_and(|t| !t.delete);
            if in_tree && reaped_not_deleted {
                return Hole::InTreeBlocks;
            }
            Hole::Unknown
        }
    }
}

/// Whether a process whose first attempt of `name` (a record it made itself, not one it
/// recovered) got a final error (nothing created) gave the claim's node back and crashed
/// before any journal write of its own without the record: an action rested on a removal
/// that was lost.
fn lost_removal(world: &World, name: &str, touches: &[Touch]) -> bool {
    let final_error = |t: &Touch| {
        t.outcome.starts_with("INVALID_ARGUMENT") || t.outcome.starts_with("RESOURCE_EXHAUSTED")
    };
    let store = world.server.lock();
    touches
        .iter()
        .filter(|t| !t.delete && !t.changed && final_error(t) && t.actor.contains(" claim "))
        .filter_map(|t| t.actor.split_whitespace().next())
        .any(|process| {
            let Some(proc) = world.proc_id(process) else {
                return false;
            };
            if !world.crashed(proc) || world.recovered(proc, name) {
                return false;
            }
            // Rule 15: the harm is an action resting on the removal (here: the node given
            // back) while the removal was not stored. Without one, a crash before the removal
            // is stored leaves the documented limit (`RecoveredFinalError`).
            let acted = store
                .given_back
                .iter()
                .any(|(giver, volume)| *giver == proc && volume == name);
            acted
                && store
                    .journal_writes
                    .iter()
                    .rev()
                    .find(|(writer, _)| *writer == proc)
                    .is_some_and(|(_, names)| names.iter().any(|n| n == name))
        })
}
