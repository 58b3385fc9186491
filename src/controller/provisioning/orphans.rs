//! The orphan reaper: operations in flight whose claim is gone (deleted, re-created with
//! another UID, or being deleted) are finished the only way CSI allows: CreateVolume is
//! replayed with the same name and inputs (idempotent) to learn the volume id, then the
//! volume is deleted, then the operation is dropped.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use thiserror::Error;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::controller::runtime::backoff::Backoff;
use crate::controller::runtime::events::EventType;
use crate::controller::shared::actions::{
    ClaimFinalizerError, SecretReadError, create_volume, delete_volume, read_secret,
    set_claim_finalizer,
};
use crate::controller::shared::context::{Context, NodeDeployment};
use crate::controller::volume_audit::audit::{AuditError, referenced_now};
use crate::csi_client::{CallError, ErrorClass};
use crate::journal::{JournalError, Operation, Phase};
use crate::provision::storage_capacity::RefreshCause;
use crate::provision::{
    Holding, NodeScope, PvOfOperation, claim_left_node, has_provisioning_finalizer,
    pv_holds_volume, pv_of_operation,
};

/// Why reaping one operation did not finish; it is retried with a backoff, and the text is
/// stored in its journal record.
#[derive(Debug, Error)]
pub(in crate::controller) enum ReapError {
    #[error("failed to read claim {claim}: {source}")]
    ClaimRead { claim: String, source: kube::Error },
    #[error("failed to read PersistentVolume {name}: {source}")]
    VolumeRead { name: String, source: kube::Error },
    #[error(transparent)]
    Secret(#[from] SecretReadError),
    #[error("{0}")]
    Driver(CallError),
    #[error(transparent)]
    ClaimFinalizer(#[from] ClaimFinalizerError),
    #[error(transparent)]
    Journal(JournalError),
    #[error("whether the volume is referenced now cannot be told: {0}")]
    Audit(Box<AuditError>),
    #[error(
        "the replayed CreateVolume succeeded without a volume id; the volume cannot be deleted"
    )]
    NoVolumeId,
    #[error(
        "volume {volume_id} is neither deleted nor forgotten: whether PersistentVolume {pv} references it cannot be told ({error}); fix or delete that PV"
    )]
    HolderUnknown {
        volume_id: String,
        pv: String,
        error: String,
    },
}

impl ReapError {
    /// The orphan's provisioner secret cannot be read (its namespace may be gone with the
    /// claim): the orphan waits for it, and does not hold the claim's consistency finalizer.
    fn waits_for_secret(&self) -> bool {
        matches!(self, Self::Secret(_))
    }
}

const ORPHAN_DELETED: &str = "OrphanedVolumeDeleted";
/// Ours: the audit's deletion of a volume nothing referenced (`--audit-delete-after`).
const UNREFERENCED_DELETED: &str = "UnreferencedVolumeDeleted";
const ORPHAN_WAITING_FOR_SECRET: &str = "OrphanWaitingForSecret";
/// Under `--drain`: an orphan that keeps failing keeps the drain from completing.
const DRAIN_BLOCKED: &str = "DrainBlocked";

/// How often the reaper looks for orphans when nothing is waiting on a backoff.
const SCAN_INTERVAL: Duration = Duration::from_secs(2);
/// How soon after a scan that left due orphans for want of room a finished reap starts the
/// next (each scan lists every operation in flight: not once per reap).
const RESCAN_FOR_ROOM: Duration = Duration::from_millis(100);

/// The reaper: finishes the operations in flight whose claim is gone, up to
/// `--worker-threads` at once, each failing one retried with its own backoff.
pub(in crate::controller) struct Reaper {
    ctx: Arc<Context>,
}

impl Reaper {
    pub(in crate::controller) fn new(ctx: &Arc<Context>) -> Self {
        Reaper {
            ctx: Arc::clone(ctx),
        }
    }

    /// Runs until `drained` resolves. Once it has, no new reap starts; those already running
    /// may finish within `--timeout` (cancelling one is safe, as every step is idempotent, but
    /// finishing it saves the next start a replay).
    ///
    /// Reaps run side by side, up to `--worker-threads`, and a scan never waits for those under
    /// way: it starts the due orphans that are not being reaped yet. An orphan whose class
    /// allows few calls a second (its DeleteVolume waits for a slot of the class's rate) holds
    /// back only itself, not the other classes' orphans, the audit's deletions or `--drain`.
    pub(in crate::controller) async fn run<D>(self, drained: impl Fn() -> D)
    where
        D: Future<Output = ()>,
    {
        let ctx = &self.ctx;
        let concurrency = ctx.settings.worker_threads.max(1);
        let stop = drained().shared();
        let mut outcomes = Outcomes {
            retries: Backoff::new(
                ctx.settings.retry_interval_start,
                ctx.settings.retry_interval_max,
            ),
            not_before: HashMap::new(),
            waiting_for_secret: HashSet::new(),
        };
        // Whether a PV holds an orphan's volume is read from the PV store: before it has
        // listed, a PV's absence from it says nothing (docs/journal.md, "Decisions on a store
        // still filling").
        tokio::select! {
            () = stop.clone() => return,
            listed = ctx.volumes_listed.clone() => if !listed { return },
        }
        let mut reaping = FuturesUnordered::new();
        let mut under_way: HashSet<String> = HashSet::new();
        let mut last_scan = Instant::now();
        let mut next_scan = last_scan + SCAN_INTERVAL;
        // The last scan had more due orphans than room: a finished reap makes room for them.
        let mut more_due = false;
        loop {
            tokio::select! {
                () = stop.clone() => break,
                Some((operation, outcome)) = reaping.next() => {
                    let operation: Operation = operation;
                    under_way.remove(&operation.volume_name);
                    outcomes.record(ctx, operation, outcome);
                    if more_due {
                        next_scan = next_scan.min(last_scan + RESCAN_FOR_ROOM);
                    }
                    continue;
                }
                () = tokio::time::sleep_until(next_scan) => {}
            }
            let now = Instant::now();
            last_scan = now;
            next_scan = now + SCAN_INTERVAL;
            let room = concurrency.saturating_sub(reaping.len());
            let due: Vec<Operation> = ctx
                .journal
                .registry()
                .idle()
                .into_iter()
                .filter(|operation| {
                    !under_way.contains(&operation.volume_name)
                        && outcomes
                            .not_before
                            .get(&operation.volume_name)
                            .is_none_or(|due| *due <= now)
                })
                .take(room + 1)
                .collect();
            more_due = due.len() > room;
            for operation in due.into_iter().take(room) {
                under_way.insert(operation.volume_name.clone());
                // The claim reconcile may take the operation before this reap marks it busy:
                // then it is not idle any more, and the reaper leaves it.
                reaping.push(async move {
                    let outcome = reap_idle(ctx, &operation).await;
                    (operation, outcome)
                });
            }
            outcomes.forget_finished(ctx);
        }
        // Stopped: no new reap starts. Those under way may finish within --timeout, by when a
        // call in progress has ended; one still waiting for its class's slot would hold the
        // exit up for as long, and is dropped (safe: every step is idempotent, and the record
        // stays for the next leader).
        let finish = async {
            while let Some((operation, outcome)) = reaping.next().await {
                outcomes.record(ctx, operation, outcome);
            }
        };
        if tokio::time::timeout(ctx.settings.journal_timeout, finish)
            .await
            .is_err()
        {
            info!("orphans still being reaped at exit are left to the next leader");
        }
        ctx.metrics.set_orphans_waiting_for_secret(0);
    }
}

/// What the reaper keeps of its reaps' outcomes: each failing orphan's backoff, and which
/// orphans wait for their secret (the gauge counts them).
struct Outcomes {
    retries: Backoff<String>,
    not_before: HashMap<String, Instant>,
    waiting_for_secret: HashSet<String>,
}

impl Outcomes {
    fn record(&mut self, ctx: &Context, operation: Operation, outcome: Result<Reaped, ReapError>) {
        let waits = match outcome {
            Ok(Reaped::NotAnOrphan) => false,
            Ok(Reaped::Done) => {
                self.retries.forget(&operation.volume_name);
                self.not_before.remove(&operation.volume_name);
                false
            }
            Err(error) => {
                let delay = self.retries.failure(operation.volume_name.clone());
                let due = Instant::now() + delay;
                self.not_before.insert(operation.volume_name.clone(), due);
                report_failure(ctx, &operation, &error, delay)
            }
        };
        if waits {
            self.waiting_for_secret.insert(operation.volume_name);
        } else {
            self.waiting_for_secret.remove(&operation.volume_name);
        }
        ctx.metrics
            .set_orphans_waiting_for_secret(self.waiting_for_secret.len());
    }

    /// Forgets the operations that are over (the claim reconcile finished them, or a reap).
    fn forget_finished(&mut self, ctx: &Context) {
        let registry = ctx.journal.registry();
        self.not_before.retain(|name, _| registry.contains(name));
        self.waiting_for_secret
            .retain(|name| registry.contains(name));
        ctx.metrics
            .set_orphans_waiting_for_secret(self.waiting_for_secret.len());
    }
}

/// The single mapping of reap failures to the journal's note, the log and events (and, under
/// `--drain`, the event saying what holds the drain up). Returns
/// whether the orphan waits for its secret (counted by the gauge until it stops waiting).
fn report_failure(
    ctx: &Context,
    operation: &Operation,
    error: &ReapError,
    retry_in: Duration,
) -> bool {
    ctx.journal
        .note_failure(&operation.volume_name, Phase::Orphaned, &error.to_string());
    warn!(volume = operation.volume_name, claim_uid = operation.claim_uid, %error, ?retry_in, "orphaned volume not cleaned up yet");
    if ctx.settings.draining {
        ctx.events.publish(
            &ctx.journal.shard_reference(&operation.volume_name),
            EventType::Warning,
            DRAIN_BLOCKED,
            &format!(
                "The drain cannot complete while volume {} of claim {}/{} (uid {}) is not cleaned up: {error}",
                operation.volume_name, operation.claim_namespace, operation.claim_name, operation.claim_uid
            ),
        );
    }
    let Some(message) = secret_wait_message(operation, error) else {
        return false;
    };
    ctx.events.publish(
        &ctx.journal.shard_reference(&operation.volume_name),
        EventType::Warning,
        ORPHAN_WAITING_FOR_SECRET,
        &message,
    );
    true
}

/// If the reap failed because the orphan's provisioner secret cannot be read, the event that
/// says so: which claim, which volume, which secret (never its data), and what an admin does.
fn secret_wait_message(operation: &Operation, error: &ReapError) -> Option<String> {
    if !error.waits_for_secret() {
        return None;
    }
    let secret = operation.provisioner_secret.as_ref().map_or_else(
        || "its provisioner secret".to_owned(),
        |secret| format!("provisioner secret {}/{}", secret.namespace, secret.name),
    );
    Some(format!(
        "Volume {} of claim {}/{} (uid {}), which no longer exists, is not deleted: {secret} cannot be read ({error}). It is deleted once the secret can be read again; see docs/journal.md to abandon it",
        operation.volume_name, operation.claim_namespace, operation.claim_name, operation.claim_uid
    ))
}

pub(in crate::controller) enum Reaped {
    NotAnOrphan,
    Done,
}

/// What the claim of an operation wants, from a quorum read.
enum ClaimState {
    /// It exists with the operation's UID and is not being deleted.
    WantsTheVolume,
    /// Deleted or replaced; `Some` while it is still being deleted (its consistency
    /// finalizer, if any, comes off once the orphan is gone).
    Gone(Option<Box<PersistentVolumeClaim>>),
    /// Node mode: it selects another node now (`provision::claim_left_node`); the volume this
    /// node may have made for it is unused.
    LeftThisNode,
}

/// The common case, told from the caches without marking the operation busy (which would
/// hold up the claim's own retry): its claim wants the volume and no PV of its name is known
/// yet, so there is nothing to reap (as [`reap`] would find).
fn still_wanted(ctx: &Context, operation: &Operation) -> bool {
    let node = ctx.settings.node.as_ref().map(NodeDeployment::scope);
    let wanted = ctx
        .claims
        .get(&ObjectRef::new(&operation.claim_name).within(&operation.claim_namespace))
        .and_then(|claim| claim.to_claim().ok())
        .is_some_and(|claim| {
            matches!(
                claim_state_of(&claim, operation, node.as_ref()),
                ClaimState::WantsTheVolume
            )
        });
    wanted
        && ctx
            .volumes
            .get(&ObjectRef::new(&operation.volume_name))
            .is_none()
}

/// Reaps one operation that was idle when the reaper listed them, unless a claim reconcile
/// has taken it since: marked busy for the whole reap (`Registry::take_idle`, docs/journal.md
/// rule 16), except in the common case of [`still_wanted`], where nothing is done.
pub(in crate::controller) async fn reap_idle(
    ctx: &Context,
    operation: &Operation,
) -> Result<Reaped, ReapError> {
    if still_wanted(ctx, operation) {
        return Ok(Reaped::NotAnOrphan);
    }
    match ctx.journal.registry().take_idle(&operation.volume_name) {
        Some(_reaping) => reap(ctx, operation).await,
        None => Ok(Reaped::NotAnOrphan),
    }
}

/// Reaps one operation the caller has marked busy (`Registry::take_idle`), so that no claim
/// reconcile works on it meanwhile.
async fn reap(ctx: &Context, operation: &Operation) -> Result<Reaped, ReapError> {
    if let Some(volume_id) = &operation.known_volume_id {
        return delete_unreferenced(ctx, operation, volume_id).await;
    }
    let deleting_claim = match claim_state(ctx, operation).await? {
        ClaimState::Gone(claim) => claim,
        ClaimState::LeftThisNode => None,
        // A PV of that name in the cache may hold the volume: then only the record's removal
        // was lost (a crash, or an exit before the journal's lazy flush). The cache keeps no
        // claim reference, so the PV is read to tell. In node mode it may be another node's
        // PV for the same claim: then this node's volume is unused.
        ClaimState::WantsTheVolume => {
            if ctx
                .volumes
                .get(&ObjectRef::new(&operation.volume_name))
                .is_none()
            {
                return Ok(Reaped::NotAnOrphan);
            }
            match read_pv(ctx, operation)
                .await?
                .map(|pv| of_operation(operation, ctx, &pv))
            {
                Some(PvOfOperation::Ends) => {
                    still_leading(ctx)?;
                    ctx.journal.complete(&operation.volume_name);
                    return Ok(Reaped::Done);
                }
                Some(PvOfOperation::ServesAnotherNode) => None,
                Some(PvOfOperation::Unrelated) | None => return Ok(Reaped::NotAnOrphan),
            }
        }
    };
    let pv = read_pv(ctx, operation).await?;
    let ended = pv.is_some_and(|pv| of_operation(operation, ctx, &pv) == PvOfOperation::Ends);
    if !ended && let Err(error) = delete_orphan(ctx, operation).await {
        // The secret lived in the claim's namespace, which is being deleted: waiting for it
        // would keep the namespace forever. The record, durable in our own namespace, keeps
        // the orphan; it is deleted once the secret can be read again (see journal.md).
        if let Some(claim) = &deleting_claim
            && error.waits_for_secret()
        {
            release_finalizer(ctx, claim).await?;
        }
        return Err(error);
    }
    // With a PV, the volume reconciler deletes the volume once the PV is Released.
    still_leading(ctx)?;
    ctx.journal.complete(&operation.volume_name);
    if let Some(claim) = &deleting_claim {
        release_finalizer(ctx, claim).await?;
    }
    Ok(Reaped::Done)
}

/// A record is dropped only by the leader: a deposed one (paused past its Lease) would write
/// its shard without a record the new leader took in and still replays (docs/journal.md rule
/// 9). Driver calls check the fence themselves; dropping a record calls no driver.
fn still_leading(ctx: &Context) -> Result<(), ReapError> {
    ctx.driver
        .fence
        .check()
        .map_err(|fenced| ReapError::Driver(CallError::Fenced(fenced)))
}

async fn release_finalizer(ctx: &Context, claim: &PersistentVolumeClaim) -> Result<(), ReapError> {
    if has_provisioning_finalizer(claim) {
        set_claim_finalizer(&ctx.client, claim, false).await?;
    }
    Ok(())
}

/// The PV named like the operation, from a quorum read.
async fn read_pv(
    ctx: &Context,
    operation: &Operation,
) -> Result<Option<PersistentVolume>, ReapError> {
    let volumes: Api<PersistentVolume> = Api::all(ctx.client.clone());
    volumes
        .get_opt(&operation.volume_name)
        .await
        .map_err(|source| ReapError::VolumeRead {
            name: operation.volume_name.clone(),
            source,
        })
}

/// What `pv`, named like the operation's volume, says of it (`provision::pv_of_operation`).
fn of_operation(operation: &Operation, ctx: &Context, pv: &PersistentVolume) -> PvOfOperation {
    let node = ctx.settings.node.as_ref().map(NodeDeployment::scope);
    pv_of_operation(
        pv,
        &ctx.settings.config.driver_name,
        &operation.claim_uid,
        node.as_ref(),
    )
}

/// Replays CreateVolume with the recorded name and inputs to learn the volume id, then
/// deletes the volume unless a PV references it. A final error on the replay ends the
/// operation only if no attempt may have created the volume (see `journal::Registry`).
async fn delete_orphan(ctx: &Context, operation: &Operation) -> Result<(), ReapError> {
    let secrets = read_secret(&ctx.client, operation.provisioner_secret.as_ref()).await?;
    let request = crate::csi::CreateVolumeRequest {
        secrets: secrets.clone(),
        ..operation.request.clone()
    };
    let volume_id = match create_volume(ctx, &operation.class_name, request).await {
        Ok(response) => response
            .volume
            .map(|volume| volume.volume_id)
            .filter(|id| !id.is_empty())
            .ok_or(ReapError::NoVolumeId)?,
        // Not the leader any more: the new leader's journal decides (see `claims::create`).
        Err(error @ CallError::Fenced(_)) => return Err(ReapError::Driver(error)),
        Err(error) => {
            let registry = ctx.journal.registry();
            if registry.keep_after_failure(&operation.volume_name, error.may_have_created()) {
                return Err(ReapError::Driver(error));
            }
            // Nothing exists under the name: the claim's finalizer may come off, but only once
            // the record's removal is stored (a reloaded record could never be settled again).
            return ctx
                .journal
                .forget_durably(&operation.volume_name)
                .await
                .map_err(ReapError::Journal);
        }
    };
    match confirmed_holder(ctx, &volume_id).await? {
        Holder::Pv(holder) => {
            info!(
                volume = operation.volume_name,
                volume_id,
                pv = holder,
                "the volume of a claim that is gone is referenced by a PV: not deleted"
            );
            return Ok(());
        }
        // Neither deleted nor forgotten: the record stays and the reap is retried.
        Holder::Unknown { pv, error } => {
            return Err(ReapError::HolderUnknown {
                volume_id,
                pv,
                error,
            });
        }
        Holder::None => {}
    }
    delete_volume(ctx, &operation.class_name, &volume_id, secrets)
        .await
        .map_err(ReapError::Driver)?;
    ctx.refresh_capacity(|| RefreshCause::OrphanDeleted {
        class: operation.class_name.clone(),
    });
    ctx.metrics.orphan_deleted();
    info!(
        volume = operation.volume_name,
        volume_id,
        claim_uid = operation.claim_uid,
        "deleted the volume of a claim that is gone"
    );
    ctx.events
        .publish(
            &ctx.journal.shard_reference(&operation.volume_name),
            EventType::Normal,
            ORPHAN_DELETED,
            &format!(
                "Deleted volume {volume_id} ({}) created for claim {}/{} (uid {}), which no longer exists",
                operation.volume_name, operation.claim_namespace, operation.claim_name, operation.claim_uid
            ),
        );
    Ok(())
}

/// Deletes a volume the audit found referenced by nothing (ours, `--audit-delete-after`; see
/// `controller::audit`), recorded by its id: no CreateVolume is replayed. A PV referencing it
/// now ends the operation without a deletion. A final error from the driver also ends it, once
/// that is stored: the volume stays and the audit reports it again (a driver that needs
/// secrets to delete cannot be given any here, and retrying forever would hold up a drain).
async fn delete_unreferenced(
    ctx: &Context,
    operation: &Operation,
    volume_id: &str,
) -> Result<Reaped, ReapError> {
    match confirmed_holder(ctx, volume_id).await? {
        Holder::Pv(holder) => {
            info!(
                volume = operation.volume_name,
                volume_id,
                pv = holder,
                "an unreferenced volume the audit was to delete is referenced by a PV now: not deleted"
            );
        }
        Holder::Unknown { pv, error } => {
            return Err(ReapError::HolderUnknown {
                volume_id: volume_id.to_owned(),
                pv,
                error,
            });
        }
        Holder::None
            if referenced_now(ctx, &operation.volume_name, volume_id)
                .await
                .map_err(|error| ReapError::Audit(Box::new(error)))? =>
        {
            info!(
                volume = operation.volume_name,
                volume_id,
                "an unreferenced volume the audit was to delete is referenced now: not deleted"
            );
        }
        Holder::None => match delete_volume(ctx, "", volume_id, HashMap::new()).await {
            Ok(()) => {
                ctx.metrics.unreferenced_volume_deleted();
                info!(
                    volume = operation.volume_name,
                    volume_id, "deleted a volume nothing references"
                );
                ctx.events.publish(
                    &ctx.journal.shard_reference(&operation.volume_name),
                    EventType::Normal,
                    UNREFERENCED_DELETED,
                    &format!(
                        "Deleted volume {volume_id} ({}), which no PV, VolumeSnapshotContent or operation in flight referenced and whose claim (uid {}) no longer exists",
                        operation.volume_name, operation.claim_uid
                    ),
                );
            }
            Err(error @ CallError::Fenced(_)) => return Err(ReapError::Driver(error)),
            Err(error) if error.class() == ErrorClass::Final => {
                warn!(volume = operation.volume_name, volume_id, %error, "the driver refused to delete a volume nothing references; it stays, and the audit reports it again");
                ctx.journal
                    .forget_durably(&operation.volume_name)
                    .await
                    .map_err(ReapError::Journal)?;
                return Err(ReapError::Driver(error));
            }
            Err(error) => return Err(ReapError::Driver(error)),
        },
    }
    still_leading(ctx)?;
    ctx.journal.complete(&operation.volume_name);
    Ok(Reaped::Done)
}

/// [`volume_holder`], with a PV found in the cache read again: the cache may still hold a PV
/// that is gone (its deletion deleted the volume a replay has just created again), and one
/// being deleted may have deleted the volume already. Either leaves the volume unheld: gone,
/// it is deleted here; being deleted, the operation waits for it to go.
async fn confirmed_holder(ctx: &Context, volume_id: &str) -> Result<Holder, ReapError> {
    let holder = volume_holder(ctx, volume_id);
    let Holder::Pv(name) = &holder else {
        return Ok(holder);
    };
    let volumes: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let fresh = volumes
        .get_opt(name)
        .await
        .map_err(|source| ReapError::VolumeRead {
            name: name.clone(),
            source,
        })?;
    let node = ctx.settings.node.as_ref().map(NodeDeployment::scope);
    Ok(match fresh {
        Some(pv) if pv.metadata.deletion_timestamp.is_some() => Holder::Unknown {
            pv: name.clone(),
            error: "it is being deleted".to_owned(),
        },
        Some(pv)
            if pv_holds_volume(
                &pv,
                &ctx.settings.config.driver_name,
                volume_id,
                node.as_ref(),
            ) == Holding::Holds =>
        {
            holder
        }
        // Gone, or no longer this volume's: the cache was stale; look at the others again
        // without it (a second stale holder waits for the next reap).
        _ => match volume_holder_except(ctx, volume_id, name) {
            Holder::Pv(other) => Holder::Unknown {
                pv: other,
                error: "the cache and the API server disagree about it".to_owned(),
            },
            other => other,
        },
    })
}

/// Who references a volume of our driver.
enum Holder {
    /// This PV, whatever its name.
    Pv(String),
    /// No PV is known to, but this one's in-tree source cannot be translated to tell.
    Unknown {
        pv: String,
        error: String,
    },
    None,
}

/// The PV that references `volume_id` of our driver. From the cache: a PV created in the last
/// moments may be missed, but one the sidecar created (the only kind a replay of our own
/// operation can return) is known before its operation is ever idle.
fn volume_holder(ctx: &Context, volume_id: &str) -> Holder {
    volume_holder_except(ctx, volume_id, "")
}

/// [`volume_holder`] among the cached PVs not named `skipped`.
fn volume_holder_except(ctx: &Context, volume_id: &str, skipped: &str) -> Holder {
    let node = ctx.settings.node.as_ref().map(NodeDeployment::scope);
    let mut holder = Holder::None;
    for cached in ctx.volumes.state() {
        if cached.name_any() == skipped {
            continue;
        }
        let holding = cached.to_volume().map(|pv| {
            pv_holds_volume(
                &pv,
                &ctx.settings.config.driver_name,
                volume_id,
                node.as_ref(),
            )
        });
        let unknown = match holding {
            Ok(Holding::Holds) => return Holder::Pv(cached.name_any()),
            Ok(Holding::DoesNotHold) => continue,
            Ok(Holding::Unknown(error)) => error.to_string(),
            Err(error) => error.to_string(),
        };
        holder = Holder::Unknown {
            pv: cached.name_any(),
            error: unknown,
        };
    }
    holder
}

/// The cache may answer "wants the volume"; only a quorum read may answer "gone" or "left
/// this node", since those answers lead to DeleteVolume.
async fn claim_state(ctx: &Context, operation: &Operation) -> Result<ClaimState, ReapError> {
    let node = ctx.settings.node.as_ref().map(NodeDeployment::scope);
    let cached = ctx
        .claims
        .get(&ObjectRef::new(&operation.claim_name).within(&operation.claim_namespace))
        .and_then(|claim| claim.to_claim().ok());
    if cached.is_some_and(|claim| {
        matches!(
            claim_state_of(&claim, operation, node.as_ref()),
            ClaimState::WantsTheVolume
        )
    }) {
        return Ok(ClaimState::WantsTheVolume);
    }
    let api: Api<PersistentVolumeClaim> =
        Api::namespaced(ctx.client.clone(), &operation.claim_namespace);
    let fresh =
        api.get_opt(&operation.claim_name)
            .await
            .map_err(|source| ReapError::ClaimRead {
                claim: format!("{}/{}", operation.claim_namespace, operation.claim_name),
                source,
            })?;
    Ok(fresh.map_or(ClaimState::Gone(None), |claim| {
        claim_state_of(&claim, operation, node.as_ref())
    }))
}

/// What `claim`, found under the operation's claim name, wants of the operation.
fn claim_state_of(
    claim: &PersistentVolumeClaim,
    operation: &Operation,
    node: Option<&NodeScope<'_>>,
) -> ClaimState {
    let meta = &claim.metadata;
    if meta.uid.as_deref() != Some(operation.claim_uid.as_str()) {
        ClaimState::Gone(None)
    } else if meta.deletion_timestamp.is_some() {
        ClaimState::Gone(Some(Box::new(claim.clone())))
    } else if node.is_some_and(|node| claim_left_node(claim, node)) {
        ClaimState::LeftThisNode
    } else {
        ClaimState::WantsTheVolume
    }
}

#[cfg(test)]
mod tests;
