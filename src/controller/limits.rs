//! Bounds on concurrent driver calls: `--worker-threads` over all calls (as upstream), and our
//! optional per-StorageClass cap (`--max-concurrent-per-storage-class`), because storage
//! backends often fail under many parallel calls and upstream's only knob is global.
//!
//! A call first waits for its class's permit and only then for a global one, so claims queued
//! behind a saturated class never hold global permits that other classes could use.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

#[derive(Debug)]
pub struct CallLimits {
    global: Arc<Semaphore>,
    per_class: usize,
    classes: Mutex<HashMap<String, Arc<Semaphore>>>,
}

/// Held for the duration of one driver call.
#[derive(Debug)]
pub struct CallPermit {
    _class: Option<OwnedSemaphorePermit>,
    _global: OwnedSemaphorePermit,
}

impl CallLimits {
    /// `per_class == 0` means no per-class cap.
    pub fn new(global: usize, per_class: usize) -> Self {
        Self {
            global: Arc::new(Semaphore::new(global.max(1))),
            per_class,
            classes: Mutex::new(HashMap::new()),
        }
    }

    pub async fn acquire(&self, class: &str) -> CallPermit {
        let class_permit = match self.class_semaphore(class) {
            Some(semaphore) => semaphore.acquire_owned().await.ok(),
            None => None,
        };
        let global = Arc::clone(&self.global)
            .acquire_owned()
            .await
            .unwrap_or_else(|_| unreachable!("the global semaphore is never closed"));
        CallPermit {
            _class: class_permit,
            _global: global,
        }
    }

    fn class_semaphore(&self, class: &str) -> Option<Arc<Semaphore>> {
        if self.per_class == 0 {
            return None;
        }
        let mut classes = self
            .classes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let semaphore = classes
            .entry(class.to_string())
            .or_insert_with(|| Arc::new(Semaphore::new(self.per_class)));
        Some(Arc::clone(semaphore))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_saturated_class_does_not_block_another_class() {
        let limits = CallLimits::new(3, 1);
        let _a1 = limits.acquire("a").await;
        let second_a = tokio::time::timeout(Duration::from_millis(50), limits.acquire("a")).await;
        assert!(second_a.is_err(), "class a is capped at one call");
        let b = tokio::time::timeout(Duration::from_millis(50), limits.acquire("b")).await;
        assert!(b.is_ok(), "class b still gets a permit");
    }

    #[tokio::test]
    async fn the_global_bound_applies_across_classes() {
        let limits = CallLimits::new(2, 0);
        let _a = limits.acquire("a").await;
        let _b = limits.acquire("b").await;
        let third = tokio::time::timeout(Duration::from_millis(50), limits.acquire("c")).await;
        assert!(third.is_err());
        drop(_a);
        let fourth = tokio::time::timeout(Duration::from_millis(50), limits.acquire("c")).await;
        assert!(fourth.is_ok(), "a released permit is reused");
    }
}
