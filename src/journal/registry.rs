//! Operations in flight: every CreateVolume the sidecar has issued and not yet seen through to
//! a PV (or to a final "no volume" answer). An operation is recorded *before* the first
//! CreateVolume call and dropped only when the outcome is safe:
//! - the PV exists with the volume handle, or
//! - the claim is gone and the orphan's DeleteVolume succeeded, or
//! - CreateVolume answered with a final error, so no volume exists.
//!
//! This registry is the in-memory side of the journal (`super`), which makes every record
//! durable in the API server before it is added here.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

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
}

#[derive(Debug, Default)]
pub struct Registry {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<String, Operation>,
    /// Operations a claim reconcile is working on right now; the orphan reaper leaves them be.
    busy: HashSet<String>,
}

/// Marks an operation as being worked on by a claim reconcile until dropped.
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
    /// Records an operation before its CreateVolume (idempotent: a retry re-records the same).
    pub fn record(&self, operation: Operation) -> Busy<'_> {
        let volume_name = operation.volume_name.clone();
        let mut state = self.lock();
        state.busy.insert(volume_name.clone());
        state.entries.insert(volume_name.clone(), operation);
        Busy {
            registry: self,
            volume_name,
        }
    }

    /// Restores an operation read back from the journal at start-up.
    pub fn restore(&self, operation: Operation) {
        self.lock()
            .entries
            .insert(operation.volume_name.clone(), operation);
    }

    /// Operations nobody is working on: candidates for the orphan reaper.
    pub fn idle(&self) -> Vec<Operation> {
        let state = self.lock();
        state
            .entries
            .values()
            .filter(|operation| !state.busy.contains(&operation.volume_name))
            .cloned()
            .collect()
    }

    pub fn complete(&self, volume_name: &str) {
        self.lock().entries.remove(volume_name);
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
