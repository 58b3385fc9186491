//! What the journal holds in memory: the registry of operations and the shard of each. Shared
//! by the journal and its shard writers, which take in (adopt) the records they find in a shard
//! that this process did not write: a previous leader's, an admin's, or another replica's
//! while two believed they led.

use std::sync::{Mutex, MutexGuard, PoisonError};

use tracing::{debug, warn};

use super::placement::Placement;
use super::record::OperationRecord;
use super::registry::Registry;

#[derive(Debug, Default)]
pub(super) struct Holdings {
    pub registry: Registry,
    placement: Mutex<Placement>,
}

impl Holdings {
    /// A record found in `shard` that the shard's writer does not hold: whether the shard
    /// keeps it. A replayable record nobody here knows is adopted, to be seen through like any
    /// recovered operation (replaying one is always safe: see docs/journal.md). One already
    /// known stays only in the shard it is placed in: a copy elsewhere goes with the next
    /// write. A record this build cannot replay is kept untouched, for a newer build or a
    /// human.
    pub fn adopt(&self, record: &OperationRecord, shard: usize) -> bool {
        match record.to_operation() {
            Ok(operation) => {
                if self.registry.adopt(operation) {
                    debug!(
                        volume = record.volume_name,
                        claim = record.claim,
                        shard,
                        "operation taken in from the journal"
                    );
                    self.placement()
                        .restore(&record.volume_name, shard, record.stored_size());
                    true
                } else {
                    self.placement().locate(&record.volume_name) == Some(shard)
                }
            }
            Err(error) => {
                warn!(shard, %error, "journal record kept but not replayable");
                true
            }
        }
    }

    /// A record found in a shard for an operation held here with a later request (see
    /// [`OperationRecord::recorded_before`]): whether the earlier one now replaces it.
    pub fn prefer_earlier(&self, record: &OperationRecord) -> bool {
        match record.to_operation() {
            Ok(operation) => {
                let taken = self.registry.prefer_earlier(operation);
                if taken {
                    warn!(
                        volume = record.volume_name,
                        claim = record.claim,
                        "two leaders recorded this volume with different requests; replaying the one recorded first"
                    );
                }
                taken
            }
            Err(_) => false,
        }
    }

    pub fn placement(&self) -> MutexGuard<'_, Placement> {
        // The placement is plain data, consistent even if a holder panicked.
        self.placement
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::csi;
    use crate::journal::Operation;
    use k8s_openapi::jiff::Timestamp;

    fn record(volume: &str, claim_uid: &str) -> OperationRecord {
        let operation = Operation {
            volume_name: volume.to_owned(),
            claim_namespace: "ns".to_owned(),
            claim_name: "data".to_owned(),
            claim_uid: claim_uid.to_owned(),
            class_name: "fast".to_owned(),
            request: csi::CreateVolumeRequest {
                name: volume.to_owned(),
                ..Default::default()
            },
            provisioner_secret: None,
            attributes_class: None,
            known_volume_id: None,
        };
        OperationRecord::from_operation(&operation, Timestamp::UNIX_EPOCH)
    }

    #[test]
    fn a_record_nobody_here_knows_is_adopted_where_it_was_found() {
        let holdings = Holdings::default();
        assert!(holdings.adopt(&record("pvc-1", "a"), 3));
        assert!(holdings.registry.contains("pvc-1"));
        assert_eq!(holdings.placement().locate("pvc-1"), Some(3));
    }

    #[test]
    fn a_known_operation_stays_only_in_the_shard_it_is_placed_in() {
        let holdings = Holdings::default();
        assert!(holdings.adopt(&record("pvc-1", "a"), 0));
        assert!(
            holdings.adopt(&record("pvc-1", "a"), 0),
            "where it is placed"
        );
        assert!(
            !holdings.adopt(&record("pvc-1", "b"), 2),
            "a copy elsewhere"
        );
    }

    #[test]
    fn a_record_this_build_cannot_replay_is_kept_but_not_adopted() {
        let holdings = Holdings::default();
        let mut unreadable = record("pvc-1", "a");
        unreadable.request = "not base64!".to_owned();
        assert!(holdings.adopt(&unreadable, 0));
        assert!(!holdings.registry.contains("pvc-1"));
    }
}
