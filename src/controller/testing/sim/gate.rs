//! The gate every API request and driver call of a sidecar process passes. A call made by an
//! actor (a reconcile, a reap, a sweep the scheduler started: its task runs inside
//! [`ACTOR`]'s scope) waits until the scheduler releases it, so that the actors interleave
//! call by call in the seeded order. A call of a background task (journal writer, event
//! recorder) passes at once. Every call of a crashed process waits forever: its orphaned
//! tasks can never act again.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::oneshot;

/// A sidecar process (each incarnation has its own).
pub type ProcId = usize;

tokio::task_local! {
    /// The actor whose task this is: `<process>/<what it does>`.
    pub static ACTOR: String;
}

#[derive(Clone, Default)]
pub struct Gate {
    state: Arc<Mutex<GateState>>,
}

#[derive(Default)]
struct GateState {
    next: u64,
    pending: BTreeMap<u64, Pending>,
    dead: BTreeSet<ProcId>,
    /// Bumped whenever a call arrives or is let through: the scheduler runs the tasks until
    /// it stops moving.
    activity: u64,
}

struct Pending {
    proc: ProcId,
    actor: String,
    what: String,
    go: oneshot::Sender<()>,
}

/// A call waiting at the gate, as the scheduler sees it.
#[derive(Clone, Debug)]
pub struct Waiting {
    pub id: u64,
    pub proc: ProcId,
    pub actor: String,
    pub what: String,
}

impl Gate {
    fn lock(&self) -> MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until the call may go; returns the actor that makes it (`None`: a background
    /// task).
    pub async fn pass(&self, proc: ProcId, what: &str) -> Option<String> {
        let Ok(actor) = ACTOR.try_with(Clone::clone) else {
            return self.pass_ungated(proc).await;
        };
        let go = self.register(proc, actor.clone(), what);
        let Some(go) = go else {
            return std::future::pending().await;
        };
        if go.await.is_err() || self.is_dead(proc) {
            return std::future::pending().await;
        }
        Some(actor)
    }

    /// Registers a gated call; `None` if the process is dead.
    fn register(&self, proc: ProcId, actor: String, what: &str) -> Option<oneshot::Receiver<()>> {
        let mut state = self.lock();
        if state.dead.contains(&proc) {
            return None;
        }
        let (go, wait) = oneshot::channel();
        let id = state.next;
        state.next += 1;
        state.activity += 1;
        state.pending.insert(
            id,
            Pending {
                proc,
                actor,
                what: what.to_owned(),
                go,
            },
        );
        Some(wait)
    }

    /// A background task's call: at once, unless its process crashed.
    pub async fn pass_ungated(&self, proc: ProcId) -> Option<String> {
        if self.note_ungated(proc) {
            return None;
        }
        std::future::pending().await
    }

    /// Whether a background call of `proc` may go (its process is alive).
    fn note_ungated(&self, proc: ProcId) -> bool {
        let mut state = self.lock();
        if state.dead.contains(&proc) {
            return false;
        }
        state.activity += 1;
        true
    }

    pub fn is_dead(&self, proc: ProcId) -> bool {
        self.lock().dead.contains(&proc)
    }

    /// The calls waiting, oldest first.
    pub fn waiting(&self) -> Vec<Waiting> {
        self.lock()
            .pending
            .iter()
            .map(|(id, pending)| Waiting {
                id: *id,
                proc: pending.proc,
                actor: pending.actor.clone(),
                what: pending.what.clone(),
            })
            .collect()
    }

    pub fn release(&self, id: u64) {
        let mut state = self.lock();
        if let Some(pending) = state.pending.remove(&id) {
            state.activity += 1;
            let _ = pending.go.send(());
        }
    }

    /// The process crashed: none of its calls is ever answered.
    pub fn kill(&self, proc: ProcId) {
        let mut state = self.lock();
        state.dead.insert(proc);
        state.pending.retain(|_, pending| pending.proc != proc);
        state.activity += 1;
    }

    pub fn activity(&self) -> u64 {
        self.lock().activity
    }
}
