//! Node mode (`--node-deployment`): competing for an Immediate claim no node owns yet, as
//! upstream's `becomeOwner`, decided by `provision::node`. Each node waits its own
//! exponential, jittered delay, asks its driver whether the volume fits here, then writes its
//! name into the claim's selected-node annotation with the claim's resourceVersion: the first
//! write wins, the others get 409 and try again later, by when they see the winner's name and
//! stop. The claim update carrying this node's name is what starts provisioning.
//!
//! Unlike upstream, waiting holds no claim worker: the wait is a requeue of the claim, and the
//! claim cache is read again when it fires (a claim gone, replaced or given to another node in
//! the meantime ends the race). The capacity check has no side effects (A3), is bounded by
//! `--timeout` (A12) and works for a driver without topology (A13).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use tracing::{debug, info, warn};

use crate::controller::runtime::cache::has_listed;
use crate::controller::runtime::runner::lock;
use crate::controller::shared::actions::claim_key;
use crate::controller::shared::context::{Context, NodeDeployment};
use crate::csi;
use crate::provision::{
    CapacityCheck, TopologyError, TopologyInputs, accessibility_requirements, capacity_check,
    has_room, left_out, ownership_delay, plan_provision, select_node_patch,
};

/// This node's race for each Immediate claim it competes for, by claim UID.
#[derive(Debug, Default)]
pub struct Races {
    by_uid: HashMap<String, Race>,
}

#[derive(Debug)]
struct Race {
    namespace: String,
    name: String,
    /// Tries so far; the next wait is `ownership_delay(attempts, ..)`.
    attempts: u32,
    ready_at: Instant,
}

impl Races {
    /// How long the claim must still wait before this node may try; starts the first wait of
    /// a claim seen for the first time. `None`: try now.
    fn wait(
        &mut self,
        pvc: &PersistentVolumeClaim,
        now: Instant,
        delay: impl Fn(u32) -> Duration,
    ) -> Option<Duration> {
        let uid = pvc.uid().unwrap_or_default();
        let race = self.by_uid.entry(uid).or_insert_with(|| Race {
            namespace: pvc.namespace().unwrap_or_default(),
            name: pvc.name_any(),
            attempts: 1,
            ready_at: now + delay(0),
        });
        let left = race.ready_at.saturating_duration_since(now);
        (!left.is_zero()).then_some(left)
    }

    /// This try did not make the node the owner: the next waits longer.
    fn lost(&mut self, uid: &str, now: Instant, delay: impl Fn(u32) -> Duration) -> Duration {
        let Some(race) = self.by_uid.get_mut(uid) else {
            return delay(0);
        };
        let wait = delay(race.attempts);
        race.attempts = race.attempts.saturating_add(1);
        race.ready_at = now + wait;
        wait
    }

    /// The race is over (won, lost to another node, or the claim is no longer competed for).
    pub fn forget(&mut self, uid: &str) {
        self.by_uid.remove(uid);
    }

    /// Drops the races of claims that are gone or were replaced (upstream resets the backoff
    /// of a deleted claim): `alive(namespace, name, uid)`.
    fn prune(&mut self, alive: impl Fn(&str, &str, &str) -> bool) {
        self.by_uid
            .retain(|uid, race| alive(&race.namespace, &race.name, uid));
    }

    #[cfg(test)]
    pub fn attempts(&self, uid: &str) -> Option<u32> {
        self.by_uid.get(uid).map(|race| race.attempts)
    }
}

/// One step of this node's race for `pvc`: wait, or check the room and write this node's
/// name. Returns when to look at the claim again (`None`: when it changes). `races` is the
/// claim reconciler's, which also ends a race when the claim's work changes.
pub(super) async fn compete(
    pvc: &PersistentVolumeClaim,
    class: &StorageClass,
    ctx: &Context,
    races: &Mutex<Races>,
) -> Option<Duration> {
    let node = ctx.settings.node.as_ref()?;
    let uid = pvc.uid().unwrap_or_default();
    let requirements = requirements_here(pvc, class, ctx, node);
    if left_out(class, &requirements) {
        lock(races).forget(&uid);
        debug!(claim = %claim_key(pvc), "the claim's allowed topologies leave this node out");
        return None;
    }
    let delay = |attempt| ownership_delay(attempt, node.base_delay, node.max_delay, jitter());
    {
        let mut races = lock(races);
        // A claim missing from a store still filling may yet arrive: prune once it has listed.
        if has_listed(&ctx.claims_listed) {
            races.prune(|namespace, name, uid| {
                ctx.claims
                    .get(&ObjectRef::new(name).within(namespace))
                    .is_some_and(|claim| claim.meta().uid.as_deref() == Some(uid))
            });
        }
        if let Some(left) = races.wait(pvc, Instant::now(), delay) {
            debug!(claim = %claim_key(pvc), wait = ?left, "waiting before trying to own the claim");
            return Some(left);
        }
    }
    if !room_here(pvc, class, ctx, &requirements).await {
        let wait = lock(races).lost(&uid, Instant::now(), delay);
        debug!(claim = %claim_key(pvc), retry_in = ?wait, "not enough capacity on this node");
        return Some(wait);
    }
    let Some(patch) = select_node_patch(pvc, &node.name) else {
        let wait = lock(races).lost(&uid, Instant::now(), delay);
        warn!(claim = %claim_key(pvc), retry_in = ?wait, "the claim has no resourceVersion; not selecting this node");
        return Some(wait);
    };
    let api: Api<PersistentVolumeClaim> =
        Api::namespaced(ctx.client.clone(), &pvc.namespace().unwrap_or_default());
    let patch = Patch::Merge(patch);
    match api
        .patch(&pvc.name_any(), &PatchParams::default(), &patch)
        .await
    {
        Ok(_) => {
            lock(races).forget(&uid);
            info!(claim = %claim_key(pvc), node = node.name, "selected this node for the claim");
            None
        }
        Err(error) => {
            let wait = lock(races).lost(&uid, Instant::now(), delay);
            if matches!(&error, kube::Error::Api(status) if status.code == 409) {
                debug!(claim = %claim_key(pvc), retry_in = ?wait, "the claim changed first (another node?)");
            } else {
                warn!(claim = %claim_key(pvc), retry_in = ?wait, "selecting node {:?} for PVC failed: {error}", node.name);
            }
            Some(wait)
        }
    }
}

/// The claim's accessibility requirements as if this node were selected (`Ok(None)` for a
/// driver without topology).
fn requirements_here(
    pvc: &PersistentVolumeClaim,
    class: &StorageClass,
    ctx: &Context,
    node: &NodeDeployment,
) -> Result<Option<csi::TopologyRequirement>, TopologyError> {
    let Some(view) = &ctx.topology else {
        return Ok(None);
    };
    let name = pvc.name_any();
    let inputs = TopologyInputs {
        claim_name: &name,
        selected_node: Some(&node.name),
        allowed_topologies: class.allowed_topologies.as_deref().unwrap_or_default(),
        strict: ctx.settings.topology.strict,
        immediate: ctx.settings.topology.immediate,
    };
    accessibility_requirements(&inputs, view)
}

/// Upstream's capacity check, from the pure plan only (nothing is written, A3): the calls
/// `provision::capacity_check` lists, each bounded by `--timeout` like every driver call
/// (A12), judged by `provision::has_room`.
async fn room_here(
    pvc: &PersistentVolumeClaim,
    class: &StorageClass,
    ctx: &Context,
    requirements: &Result<Option<csi::TopologyRequirement>, TopologyError>,
) -> bool {
    let plan = plan_provision(pvc, class, &ctx.settings.config, &ctx.settings.caps, &[]);
    if let Err(error) = &plan {
        debug!(claim = %claim_key(pvc), %error, "capacity not checked: the owner reports this");
    }
    if let Err(error) = requirements {
        debug!(claim = %claim_key(pvc), %error, "capacity not checked: the owner reports this");
    }
    let requirements = requirements.as_ref().map(Option::as_ref);
    let CapacityCheck::Ask { needed, requests } = capacity_check(plan.as_ref(), requirements)
    else {
        return true;
    };
    let mut answers = Vec::with_capacity(requests.len());
    for request in requests {
        let answer = ctx.driver.csi.get_capacity(request).await;
        if let Err(error) = &answer {
            warn!(claim = %claim_key(pvc), %error, "capacity check failed; trying to own the claim anyway");
        }
        let failed = answer.is_err();
        answers.push(answer.map(|answer| answer.available_capacity));
        if failed {
            break;
        }
    }
    has_room(needed, &answers)
}

/// Uniform in [0, 1).
fn jitter() -> f64 {
    // The low 53 bits of a v4 UUID are all random (its version and variant bits are higher).
    const BITS: u32 = 53;
    let random = uuid::Uuid::new_v4().as_u128() & ((1 << BITS) - 1);
    random as f64 / (1u64 << BITS) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provision::fixtures::PvcBuilder;

    fn fixed(attempt: u32) -> Duration {
        Duration::from_secs(10 * u64::from(attempt + 1))
    }

    #[test]
    fn a_race_waits_then_each_lost_try_waits_longer_and_forget_resets_it() {
        let pvc = PvcBuilder::new().build();
        let uid = pvc.uid().unwrap();
        let mut races = Races::default();
        let start = Instant::now();
        assert_eq!(
            races.wait(&pvc, start, fixed),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            races.wait(&pvc, start + Duration::from_secs(4), fixed),
            Some(Duration::from_secs(6))
        );
        let due = start + Duration::from_secs(10);
        assert_eq!(races.wait(&pvc, due, fixed), None);
        assert_eq!(races.lost(&uid, due, fixed), Duration::from_secs(20));
        assert_eq!(races.attempts(&uid), Some(2));
        assert_eq!(races.wait(&pvc, due, fixed), Some(Duration::from_secs(20)));
        races.forget(&uid);
        assert_eq!(races.attempts(&uid), None);
        assert_eq!(races.wait(&pvc, due, fixed), Some(Duration::from_secs(10)));
    }

    #[test]
    fn races_of_claims_gone_or_replaced_are_dropped() {
        let pvc = PvcBuilder::new().build();
        let mut races = Races::default();
        races.wait(&pvc, Instant::now(), fixed);
        races.prune(|_, _, _| true);
        assert!(races.attempts(&pvc.uid().unwrap()).is_some());
        races.prune(|_, _, uid| uid == "another");
        assert!(races.attempts(&pvc.uid().unwrap()).is_none());
    }

    #[test]
    fn jitter_stays_in_its_range() {
        for _ in 0..1000 {
            let j = jitter();
            assert!((0.0..1.0).contains(&j), "{j}");
        }
    }
}
