//! The numbered trace of a run: each scheduler step, and under it the calls it let through
//! with their answers. A failing seed prints it.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::gate::ProcId;

#[derive(Clone, Default)]
pub struct Trace {
    state: Arc<Mutex<TraceState>>,
}

#[derive(Default)]
struct TraceState {
    step: usize,
    lines: Vec<String>,
    names: BTreeMap<ProcId, String>,
}

impl Trace {
    fn lock(&self) -> MutexGuard<'_, TraceState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn name(&self, proc: ProcId, name: &str) {
        self.lock().names.insert(proc, name.to_owned());
    }

    /// Starts step `n`, described by `what`.
    pub fn step(&self, n: usize, what: &str) {
        let mut state = self.lock();
        state.step = n;
        state.lines.push(format!("step {n}: {what}"));
    }

    /// A call of process `proc` (by `actor`, or a background task) and its answer.
    pub fn call(&self, proc: ProcId, actor: Option<&str>, what: &str) {
        let mut state = self.lock();
        let name = state
            .names
            .get(&proc)
            .cloned()
            .unwrap_or_else(|| format!("p{proc}"));
        let by = actor.map_or_else(|| format!("{name} (background)"), str::to_owned);
        state.lines.push(format!("    {by}: {what}"));
    }

    /// A note (an invariant's finding, a fault).
    pub fn note(&self, what: &str) {
        self.lock().lines.push(format!("    ! {what}"));
    }

    pub fn render(&self) -> String {
        let state = self.lock();
        let mut out = String::new();
        for line in &state.lines {
            let _ = writeln!(out, "{line}");
        }
        out
    }

    pub fn len(&self) -> usize {
        self.lock().lines.len()
    }
}
