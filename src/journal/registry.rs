//! Operations in flight: every CreateVolume the sidecar is about to send or has sent and not
//! yet seen through to a PV or a deletion. An operation is reserved here, made durable in the
//! API server (`super`), and only then sent; it is dropped only when the outcome is safe:
//! - a PV holds the volume, or
//! - the claim is gone and the orphan's DeleteVolume succeeded, or
//! - CreateVolume answered a final error and no earlier attempt may have created the volume.
//!
//! Once recorded, an operation is replayed as it was recorded: a later plan (a StorageClass
//! re-created with other parameters) never replaces it, since the driver may hold a volume
//! created from the first request.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use thiserror::Error;

use crate::csi;
use crate::provision::SecretRef;

/// Everything needed to replay CreateVolume compatibly and then delete what it returns.
/// Secret *values* are never kept: only the reference, read again when needed.
#[derive(Clone, Debug, PartialEq)]
pub struct Operation {
    pub volume_name: String,
    pub claim_namespace: String,
    pub claim_name: String,
    pub claim_uid: String,
    pub class_name: String,
    /// The CreateVolume request with its `secrets` emptied.
    pub request: csi::CreateVolumeRequest,
    pub provisioner_secret: Option<SecretRef>,
    /// The VolumeAttributesClass whose parameters are the request's `mutable_parameters`: the
    /// PV names it, whatever the claim names by the time the volume exists.
    pub attributes_class: Option<String>,
    /// Ours: the id of a volume to delete that is known without a CreateVolume: one the audit
    /// found referenced by nothing (`--audit-delete-after`). Its claim is gone (namespace and
    /// name empty, `claim_uid` what the volume's name holds of the UID) and `request` carries
    /// only the name: it is never sent.
    pub known_volume_id: Option<String>,
}

/// Why [`Registry::reserve`] gives a claim reconcile no operation.
#[derive(Debug, Error, PartialEq)]
pub enum Refusal {
    #[error(transparent)]
    NameTaken(#[from] NameTaken),
    /// The orphan reaper holds the operation ([`Registry::take_idle`]): the claim retries once
    /// it is done, so that no CreateVolume or PV of the claim runs beside its cleanup.
    #[error(
        "the operation of volume {volume_name} is being finished by the orphan reaper; the claim is retried once it is done"
    )]
    Busy { volume_name: String },
}

/// Two claims whose volume names collide (a short `--volume-name-uuid-length`): they must not
/// share an operation, or one claim's cleanup would delete the other's volume.
#[derive(Debug, Error, PartialEq)]
#[error(
    "volume name {volume_name} is already taken by an operation of claim {claim} (uid {claim_uid}); \
     no volume is created for this claim"
)]
pub struct NameTaken {
    pub volume_name: String,
    pub claim: String,
    pub claim_uid: String,
}

#[derive(Debug, Default)]
pub struct Registry {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<String, Entry>,
    /// Operations a claim reconcile or the orphan reaper is working on right now; whoever marked
    /// one busy has it alone until its mark is dropped.
    busy: HashSet<String>,
}

#[derive(Debug)]
struct Entry {
    operation: Operation,
    stage: Stage,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Stage {
    /// Being written to the journal: no CreateVolume has been sent for it.
    Reserved,
    /// Durable. `may_exist`: an attempt may have created the volume (its answer was lost or
    /// in progress, or ALREADY_EXISTS), or the operation was recovered after a restart, when
    /// nobody knows what the last process sent.
    Recorded { may_exist: bool },
}

/// The outcome of [`Registry::reserve`]; holding it marks the operation busy.
#[must_use]
pub enum Reservation<'a> {
    /// New: write it to the journal, then [`Registry::confirm`] it (or [`Registry::abandon`]).
    Fresh(Busy<'a>),
    /// Already durable: replay this operation, not the caller's.
    Recorded(Busy<'a>, Box<Operation>),
}

/// Marks an operation as being worked on, by a claim reconcile or the reaper, until dropped.
#[must_use]
pub struct Busy<'a> {
    registry: &'a Registry,
    volume_name: String,
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.registry.lock().busy.remove(&self.volume_name);
    }
}

impl Registry {
    /// Reserves `operation`'s volume name for its claim. A name already recorded for the same
    /// claim gives back the recorded operation; one recorded for another claim is refused, and
    /// so is one the reaper is working on.
    pub fn reserve(&self, operation: Operation) -> Result<Reservation<'_>, Refusal> {
        let volume_name = operation.volume_name.clone();
        let mut state = self.lock();
        let taken = state
            .entries
            .get(&volume_name)
            .is_some_and(|entry| entry.operation.claim_uid != operation.claim_uid);
        if !taken && state.busy.contains(&volume_name) {
            return Err(Refusal::Busy { volume_name });
        }
        let recorded = match state.entries.get(&volume_name) {
            Some(entry) if entry.operation.claim_uid != operation.claim_uid => {
                return Err(Refusal::NameTaken(NameTaken {
                    volume_name,
                    claim: format!(
                        "{}/{}",
                        entry.operation.claim_namespace, entry.operation.claim_name
                    ),
                    claim_uid: entry.operation.claim_uid.clone(),
                }));
            }
            Some(entry) if entry.stage != Stage::Reserved => Some(entry.operation.clone()),
            // Reserved by an attempt whose write failed: nothing was sent, write this one.
            Some(_) | None => None,
        };
        if recorded.is_none() {
            let entry = Entry {
                operation,
                stage: Stage::Reserved,
            };
            state.entries.insert(volume_name.clone(), entry);
        }
        state.busy.insert(volume_name.clone());
        let busy = Busy {
            registry: self,
            volume_name,
        };
        Ok(match recorded {
            Some(operation) => Reservation::Recorded(busy, Box::new(operation)),
            None => Reservation::Fresh(busy),
        })
    }

    /// The reserved operation is durable: CreateVolume may be sent.
    pub fn confirm(&self, volume_name: &str) {
        if let Some(entry) = self.lock().entries.get_mut(volume_name) {
            entry.stage = Stage::Recorded { may_exist: false };
        }
    }

    /// The reserved operation could not be made durable; nothing was sent for it.
    pub fn abandon(&self, volume_name: &str) {
        let mut state = self.lock();
        if state
            .entries
            .get(volume_name)
            .is_some_and(|entry| entry.stage == Stage::Reserved)
        {
            state.entries.remove(volume_name);
        }
    }

    /// Takes in an operation read from the journal that this process did not record: at
    /// start-up, or written by someone else since (a previous leader, an admin). Whoever
    /// recorded it may have sent CreateVolume, so its volume may exist. An operation already
    /// known is left as it is; returns whether this one was taken in.
    pub fn adopt(&self, operation: Operation) -> bool {
        let mut state = self.lock();
        if state.entries.contains_key(&operation.volume_name) {
            return false;
        }
        let entry = Entry {
            operation,
            stage: Stage::Recorded { may_exist: true },
        };
        state
            .entries
            .insert(entry.operation.volume_name.clone(), entry);
        true
    }

    /// The same claim's operation, recorded before the one held here (by another leader,
    /// whose record was lost to this one): replay that one from now on, as every retry replays
    /// the request recorded first. Returns whether it was taken.
    pub fn prefer_earlier(&self, operation: Operation) -> bool {
        let mut state = self.lock();
        let Some(entry) = state.entries.get_mut(&operation.volume_name) else {
            return false;
        };
        if entry.operation.claim_uid != operation.claim_uid {
            return false;
        }
        entry.operation = operation;
        entry.stage = Stage::Recorded { may_exist: true };
        true
    }

    /// After a failed CreateVolume or replay: whether the operation must stay recorded. It
    /// must once any attempt `may_have_created` the volume, whatever later attempts answer:
    /// only a PV holding the volume or a successful DeleteVolume ends it then.
    pub fn keep_after_failure(&self, volume_name: &str, may_have_created: bool) -> bool {
        let mut state = self.lock();
        let Some(entry) = state.entries.get_mut(volume_name) else {
            return false;
        };
        match &mut entry.stage {
            Stage::Recorded { may_exist } => {
                *may_exist |= may_have_created;
                *may_exist
            }
            Stage::Reserved => false,
        }
    }

    /// Recorded operations nobody is working on: candidates for the orphan reaper.
    pub fn idle(&self) -> Vec<Operation> {
        let state = self.lock();
        state
            .entries
            .values()
            .filter(|entry| entry.stage != Stage::Reserved)
            .filter(|entry| !state.busy.contains(&entry.operation.volume_name))
            .map(|entry| entry.operation.clone())
            .collect()
    }

    /// Marks a recorded operation nobody is working on busy for the orphan reaper; `None` if a
    /// claim reconcile holds it (or it is gone) by now. While the reaper holds it, a claim
    /// reconcile is refused the operation ([`Refusal::Busy`]; docs/journal.md, rule 16).
    pub fn take_idle(&self, volume_name: &str) -> Option<Busy<'_>> {
        let mut state = self.lock();
        let recorded = state
            .entries
            .get(volume_name)
            .is_some_and(|entry| entry.stage != Stage::Reserved);
        if !recorded || !state.busy.insert(volume_name.to_owned()) {
            return None;
        }
        Some(Busy {
            registry: self,
            volume_name: volume_name.to_owned(),
        })
    }

    /// The content sources (clone or restore) of every operation known, reserved or recorded:
    /// the driver may read each again while its operation is replayed, so the protection
    /// controllers keep those sources' finalizers (docs/journal.md, rule 12).
    pub fn content_sources(&self) -> Vec<csi::VolumeContentSource> {
        self.lock()
            .entries
            .values()
            .filter_map(|entry| entry.operation.request.volume_content_source.clone())
            .collect()
    }

    pub fn complete(&self, volume_name: &str) {
        self.lock().entries.remove(volume_name);
    }

    /// The volume names of every operation known, reserved or recorded.
    pub fn volume_names(&self) -> Vec<String> {
        self.lock().entries.keys().cloned().collect()
    }

    pub fn contains(&self, volume_name: &str) -> bool {
        self.lock().entries.contains_key(volume_name)
    }

    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lock().entries.is_empty()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn operation(volume: &str, uid: &str, parameter: &str) -> Operation {
        Operation {
            volume_name: volume.to_owned(),
            claim_namespace: "ns".to_owned(),
            claim_name: format!("claim-{uid}"),
            claim_uid: uid.to_owned(),
            class_name: "fast".to_owned(),
            request: csi::CreateVolumeRequest {
                name: volume.to_owned(),
                parameters: [("type".to_owned(), parameter.to_owned())].into(),
                ..Default::default()
            },
            provisioner_secret: None,
            attributes_class: None,
            known_volume_id: None,
        }
    }

    fn recorded(registry: &Registry, operation: Operation) {
        let name = operation.volume_name.clone();
        let Ok(Reservation::Fresh(_busy)) = registry.reserve(operation) else {
            panic!("a new name is fresh");
        };
        registry.confirm(&name);
    }

    #[test]
    fn a_recorded_operation_is_replayed_as_recorded_not_as_planned_again() {
        let registry = Registry::default();
        recorded(&registry, operation("pvc-1", "a", "first"));
        match registry.reserve(operation("pvc-1", "a", "second")) {
            Ok(Reservation::Recorded(_, replay)) => {
                assert_eq!(replay.request.parameters["type"], "first");
            }
            _ => panic!("the recorded operation is given back"),
        }
    }

    #[test]
    fn another_claim_with_the_same_volume_name_shares_no_operation() {
        let registry = Registry::default();
        recorded(&registry, operation("pvc-1", "a", "x"));
        let Err(Refusal::NameTaken(error)) = registry.reserve(operation("pvc-1", "b", "x")) else {
            panic!("the name is taken");
        };
        assert_eq!(error.claim_uid, "a");
        assert!(error.to_string().contains("ns/claim-a"), "{error}");
    }

    #[test]
    fn a_reservation_whose_write_failed_is_replaced_by_the_next_plan() {
        let registry = Registry::default();
        let Ok(Reservation::Fresh(busy)) = registry.reserve(operation("pvc-1", "a", "first"))
        else {
            panic!("fresh");
        };
        drop(busy);
        assert!(
            registry.idle().is_empty(),
            "the reaper never sees a reservation"
        );
        registry.abandon("pvc-1");
        assert!(!registry.contains("pvc-1"));
        assert!(matches!(
            registry.reserve(operation("pvc-1", "a", "second")),
            Ok(Reservation::Fresh(_))
        ));
    }

    #[test]
    fn a_final_error_ends_an_operation_only_if_no_attempt_may_have_created_the_volume() {
        let registry = Registry::default();
        recorded(&registry, operation("pvc-1", "a", "x"));
        assert!(
            !registry.keep_after_failure("pvc-1", false),
            "first answer final"
        );

        recorded(&registry, operation("pvc-2", "a", "x"));
        assert!(registry.keep_after_failure("pvc-2", true), "timed out");
        assert!(
            registry.keep_after_failure("pvc-2", false),
            "a final error after a timeout proves nothing"
        );

        assert!(registry.adopt(operation("pvc-3", "a", "x")));
        assert!(
            registry.keep_after_failure("pvc-3", false),
            "a recovered operation may have been sent by the last process"
        );
    }

    #[test]
    fn an_adopted_operation_never_replaces_one_already_known() {
        let registry = Registry::default();
        recorded(&registry, operation("pvc-1", "a", "mine"));
        assert!(!registry.adopt(operation("pvc-1", "b", "theirs")));
        match registry.reserve(operation("pvc-1", "a", "again")) {
            Ok(Reservation::Recorded(_, kept)) => {
                assert_eq!(kept.request.parameters["type"], "mine")
            }
            _ => panic!("the operation recorded here is kept"),
        }
    }

    #[test]
    fn an_operation_recorded_earlier_elsewhere_is_replayed_from_then_on() {
        let registry = Registry::default();
        recorded(&registry, operation("pvc-1", "a", "second"));
        assert!(registry.prefer_earlier(operation("pvc-1", "a", "first")));
        assert!(!registry.prefer_earlier(operation("pvc-1", "b", "other claim")));
        match registry.reserve(operation("pvc-1", "a", "third")) {
            Ok(Reservation::Recorded(_, replay)) => {
                assert_eq!(replay.request.parameters["type"], "first");
            }
            _ => panic!("the earlier operation is replayed"),
        }
        assert!(registry.keep_after_failure("pvc-1", false), "it may exist");
    }

    #[test]
    fn the_content_sources_of_reserved_and_recorded_operations_are_listed() {
        let registry = Registry::default();
        let cloning = |volume: &str, uid: &str, source: &str| Operation {
            request: csi::CreateVolumeRequest {
                name: volume.to_owned(),
                volume_content_source: Some(csi::VolumeContentSource {
                    r#type: Some(csi::volume_content_source::Type::Volume(
                        csi::volume_content_source::VolumeSource {
                            volume_id: source.to_owned(),
                        },
                    )),
                }),
                ..Default::default()
            },
            ..operation(volume, uid, "x")
        };
        recorded(&registry, cloning("pvc-1", "a", "vol-a"));
        let Ok(Reservation::Fresh(_busy)) = registry.reserve(cloning("pvc-2", "b", "vol-b")) else {
            panic!("fresh");
        };
        recorded(&registry, operation("pvc-3", "c", "no source"));
        let mut ids: Vec<_> = registry
            .content_sources()
            .into_iter()
            .filter_map(|source| match source.r#type {
                Some(csi::volume_content_source::Type::Volume(volume)) => Some(volume.volume_id),
                _ => None,
            })
            .collect();
        ids.sort();
        assert_eq!(ids, ["vol-a", "vol-b"]);
    }

    #[test]
    fn an_operation_has_one_worker_at_a_time_the_claim_reconcile_or_the_reaper() {
        let registry = Registry::default();
        recorded(&registry, operation("pvc-1", "a", "x"));
        let reaping = registry.take_idle("pvc-1").expect("idle");
        assert!(registry.idle().is_empty());
        assert!(registry.take_idle("pvc-1").is_none(), "one reap at a time");
        assert_eq!(
            registry.reserve(operation("pvc-1", "a", "x")).err(),
            Some(Refusal::Busy {
                volume_name: "pvc-1".to_owned()
            }),
            "no claim attempt beside the reap"
        );
        assert!(
            matches!(
                registry.reserve(operation("pvc-1", "b", "x")),
                Err(Refusal::NameTaken(_))
            ),
            "another claim of a colliding name is told whose name it is, busy or not"
        );
        drop(reaping);
        let Ok(Reservation::Recorded(claiming, _)) = registry.reserve(operation("pvc-1", "a", "x"))
        else {
            panic!("the claim gets it back once the reap is over");
        };
        assert!(
            registry.take_idle("pvc-1").is_none(),
            "no reap beside the claim"
        );
        drop(claiming);
        assert!(registry.take_idle("pvc-1").is_some());
        assert!(registry.take_idle("pvc-2").is_none(), "unknown");
    }

    #[test]
    fn abandon_leaves_a_recorded_operation_alone() {
        let registry = Registry::default();
        recorded(&registry, operation("pvc-1", "a", "x"));
        registry.abandon("pvc-1");
        assert!(registry.contains("pvc-1"));
        assert_eq!(registry.idle().len(), 1);
    }
}
