//! Per-object in-flight guard: a second RPC on a volume (or name, or snapshot) that is still being
//! worked on gets ABORTED, as the CSI spec allows, instead of queueing behind it. Only the keys a
//! call names are held, so unrelated calls never wait for each other, even across injected delays.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::state::CsiError;

/// Key of a volume name in CreateVolume.
pub fn volume_name(name: &str) -> String {
    format!("volume-name/{name}")
}

pub fn volume_id(id: &str) -> String {
    format!("volume/{id}")
}

pub fn snapshot_name(name: &str) -> String {
    format!("snapshot-name/{name}")
}

pub fn snapshot_id(id: &str) -> String {
    format!("snapshot/{id}")
}

#[derive(Clone, Default)]
pub struct InFlight {
    busy: Arc<Mutex<HashSet<String>>>,
}

impl InFlight {
    /// Marks `key` busy until the returned guard is dropped.
    pub fn acquire(&self, key: String) -> Result<Held, CsiError> {
        let mut held = Held {
            owner: self.clone(),
            keys: Vec::new(),
        };
        held.add(key)?;
        Ok(held)
    }

    fn lock(&self) -> MutexGuard<'_, HashSet<String>> {
        // Insert and remove are single operations, so a poisoned set is still consistent.
        self.busy.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Keys held by one call; released on drop, including when a cancelled call's future is dropped.
pub struct Held {
    owner: InFlight,
    keys: Vec<String>,
}

impl Held {
    /// Also holds `key`, e.g. the id of a volume found by name.
    pub fn add(&mut self, key: String) -> Result<(), CsiError> {
        if self.keys.contains(&key) {
            return Ok(());
        }
        if !self.owner.lock().insert(key.clone()) {
            return Err(CsiError::Aborted(format!(
                "an operation on {key} is already in progress"
            )));
        }
        self.keys.push(key);
        Ok(())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut busy = self.owner.lock();
        for key in &self.keys {
            busy.remove(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_holder_is_aborted_until_release() {
        let inflight = InFlight::default();
        let mut first = inflight.acquire(volume_name("a")).unwrap();
        assert!(matches!(
            inflight.acquire(volume_name("a")),
            Err(CsiError::Aborted(_))
        ));
        assert!(
            inflight.acquire(volume_name("b")).is_ok(),
            "other names are independent"
        );
        first.add(volume_id("vol-1")).unwrap();
        first.add(volume_id("vol-1")).unwrap();
        assert!(matches!(
            inflight.acquire(volume_id("vol-1")),
            Err(CsiError::Aborted(_))
        ));
        drop(first);
        assert!(inflight.acquire(volume_name("a")).is_ok());
        assert!(inflight.acquire(volume_id("vol-1")).is_ok());
    }
}
