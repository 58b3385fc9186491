//! What one shard writer knows of its shard, and the rules that keep the shard whole whoever
//! else touches it. The writer holds every record of the shard in memory and writes all of
//! them each time, so a shard deleted behind its back (`kubectl delete provisioningjournals
//! --all`, the CRD re-installed) is rebuilt whole by the next write, never from the last
//! batch alone. What it finds in the API server that it did not write is adopted, not
//! overwritten.

use std::collections::{BTreeMap, HashSet, VecDeque};

use kube::api::ObjectMeta;

use super::record::{Change, OperationRecord, ProvisioningJournal, ProvisioningJournalSpec, apply};

/// How many of our own writes' resourceVersions are remembered, to tell the watch's echo of
/// them (which needs no re-read) from someone else's change. The echo of a write arrives
/// within milliseconds, while writes are at least 20 ms apart.
const OWN_VERSIONS: usize = 32;

#[derive(Debug)]
pub(super) struct ShardState {
    /// Every record this shard holds: what each write stores.
    held: ProvisioningJournalSpec,
    /// The object's metadata as last read or written (its resourceVersion guards the next
    /// replace); `None` while it is not known to exist.
    stored: Option<ObjectMeta>,
    /// Records removed from `held` whose removal is not stored yet: a re-read that still
    /// finds them takes nothing back.
    removals_not_stored: HashSet<String>,
    own_versions: VecDeque<String>,
}

/// What a re-read of the shard found.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Reconciled {
    /// Records the API server has and this writer does not: someone else wrote them.
    pub found: Vec<OperationRecord>,
    /// Records of operations held here that someone else recorded earlier with another
    /// request: the first request wins (see [`OperationRecord::recorded_before`]).
    pub earlier: Vec<OperationRecord>,
}

impl ShardState {
    /// The state of a shard as loaded at start-up (`None`: it does not exist).
    pub fn new(driver: &str, loaded: Option<ProvisioningJournal>) -> Self {
        let (stored, held) = match loaded {
            Some(shard) => (Some(shard.metadata), shard.spec),
            None => (
                None,
                ProvisioningJournalSpec {
                    driver: driver.to_owned(),
                    ..ProvisioningJournalSpec::default()
                },
            ),
        };
        ShardState {
            held,
            stored,
            removals_not_stored: HashSet::new(),
            own_versions: VecDeque::new(),
        }
    }

    /// Applies queued changes to what the shard holds; returns whether anything changed.
    pub fn apply(&mut self, changes: &[Change]) -> bool {
        for change in changes {
            match change {
                Change::Remove { volume_name } => {
                    self.removals_not_stored.insert(volume_name.clone());
                }
                Change::Upsert(record) => {
                    self.removals_not_stored.remove(&record.volume_name);
                }
                Change::Failure { .. } | Change::Flush => {}
            }
        }
        apply(&mut self.held, changes)
    }

    /// The object a write stores: every record held, under the metadata last seen, so that a
    /// replace fails with a conflict if anyone else wrote since. `None` metadata: create it.
    pub fn to_write(&self, name: &str, labels: &BTreeMap<String, String>) -> ProvisioningJournal {
        let metadata = self.stored.clone().unwrap_or_else(|| ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(labels.clone()),
            ..ObjectMeta::default()
        });
        ProvisioningJournal {
            metadata,
            spec: self.held.clone(),
        }
    }

    pub fn exists(&self) -> bool {
        self.stored.is_some()
    }

    /// The API server acknowledged a write of everything held.
    pub fn written(&mut self, stored: ProvisioningJournal) {
        if let Some(version) = stored.metadata.resource_version.clone() {
            if self.own_versions.len() == OWN_VERSIONS {
                self.own_versions.pop_front();
            }
            self.own_versions.push_back(version);
        }
        self.stored = Some(stored.metadata);
        self.removals_not_stored.clear();
    }

    /// A replace found no object: the shard was deleted. The next write creates it again.
    pub fn lost(&mut self) {
        self.stored = None;
    }

    /// Whether the watch's news of the shard at `version` needs a re-read: not for our own
    /// writes, nor for a shard that does not exist and holds nothing.
    pub fn needs_reread(&self, version: Option<&str>) -> bool {
        match version {
            Some(version) => {
                !self.own_versions.iter().any(|own| own == version)
                    && self
                        .stored
                        .as_ref()
                        .and_then(|meta| meta.resource_version.as_deref())
                        != Some(version)
            }
            None => self.stored.is_some() || !self.held.operations.is_empty(),
        }
    }

    /// Takes in what a re-read found (`None`: no such object). Returns the records someone
    /// else wrote; the caller adopts them with [`ShardState::keep`].
    pub fn reread(&mut self, found: Option<ProvisioningJournal>) -> Reconciled {
        let Some(found) = found else {
            self.stored = None;
            return Reconciled::default();
        };
        self.stored = Some(found.metadata);
        let mut reconciled = Reconciled::default();
        for record in found.spec.operations {
            match self.held(&record.volume_name) {
                Some(held) if record.recorded_before(held) => reconciled.earlier.push(record),
                Some(_) => {}
                None if self.removals_not_stored.contains(&record.volume_name) => {}
                None => reconciled.found.push(record),
            }
        }
        reconciled
    }

    /// Holds a record recorded earlier than the one held for its operation (from
    /// [`ShardState::reread`]), in its place.
    pub fn replace(&mut self, record: OperationRecord) {
        self.held
            .operations
            .retain(|held| held.volume_name != record.volume_name);
        self.keep(record);
    }

    /// Holds a record someone else wrote (from [`ShardState::reread`]).
    pub fn keep(&mut self, record: OperationRecord) {
        apply(&mut self.held, &[Change::Upsert(Box::new(record))]);
    }

    /// Whether the API server lacks an operation held, or still has one removed here: after a
    /// re-read, compared with what it returned; a shard not known to exist lacks everything
    /// held. Attempts and errors noted by another writer are not worth a write: two writers
    /// that both rewrote them would answer each other for ever.
    pub fn differs_from(&self, found: Option<&ProvisioningJournalSpec>) -> bool {
        let names = |operations: &[OperationRecord]| -> Vec<String> {
            operations.iter().map(|op| op.volume_name.clone()).collect()
        };
        match found {
            Some(spec) => names(&spec.operations) != names(&self.held.operations),
            None => !self.held.operations.is_empty(),
        }
    }

    fn held(&self, volume_name: &str) -> Option<&OperationRecord> {
        self.held
            .operations
            .iter()
            .find(|record| record.volume_name == volume_name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(volume: &str) -> OperationRecord {
        OperationRecord {
            volume_name: volume.to_owned(),
            ..OperationRecord::default()
        }
    }

    fn stored(version: &str, volumes: &[&str]) -> ProvisioningJournal {
        ProvisioningJournal {
            metadata: ObjectMeta {
                name: Some("d-0".to_owned()),
                resource_version: Some(version.to_owned()),
                ..ObjectMeta::default()
            },
            spec: ProvisioningJournalSpec {
                driver: "d".to_owned(),
                operations: volumes.iter().map(|volume| record(volume)).collect(),
                ..ProvisioningJournalSpec::default()
            },
        }
    }

    fn held_names(state: &ShardState) -> Vec<String> {
        let written = state.to_write("d-0", &BTreeMap::new());
        written
            .spec
            .operations
            .into_iter()
            .map(|record| record.volume_name)
            .collect()
    }

    #[test]
    fn a_deleted_shard_is_written_again_with_everything_held() {
        let mut state = ShardState::new("d", Some(stored("1", &["pvc-a", "pvc-b"])));
        state.apply(&[Change::Upsert(Box::new(record("pvc-c")))]);
        state.lost();
        let rebuilt = state.to_write("d-0", &BTreeMap::new());
        assert_eq!(rebuilt.metadata.resource_version, None, "created anew");
        assert_eq!(held_names(&state), ["pvc-a", "pvc-b", "pvc-c"]);
    }

    #[test]
    fn a_reread_finds_what_someone_else_wrote_and_not_what_we_removed() {
        let mut state = ShardState::new("d", Some(stored("1", &["pvc-a", "pvc-b"])));
        state.apply(&[Change::Remove {
            volume_name: "pvc-b".to_owned(),
        }]);
        let found = state.reread(Some(stored("2", &["pvc-a", "pvc-b", "pvc-x"])));
        assert_eq!(found.found, [record("pvc-x")]);
        state.keep(record("pvc-x"));
        assert_eq!(held_names(&state), ["pvc-a", "pvc-x"]);
        assert!(
            state.differs_from(Some(&stored("2", &["pvc-a", "pvc-b", "pvc-x"]).spec)),
            "the removal of pvc-b is still to be written"
        );
    }

    #[test]
    fn once_stored_a_removal_no_longer_hides_a_record_written_again_by_someone_else() {
        let mut state = ShardState::new("d", Some(stored("1", &["pvc-a"])));
        state.apply(&[Change::Remove {
            volume_name: "pvc-a".to_owned(),
        }]);
        state.written(stored("2", &[]));
        let found = state.reread(Some(stored("3", &["pvc-a"])));
        assert_eq!(found.found, [record("pvc-a")]);
    }

    #[test]
    fn the_request_recorded_first_wins_over_a_later_plan_of_the_same_claim() {
        let planned = |since: &str, parameter: &str| OperationRecord {
            volume_name: "pvc-a".to_owned(),
            claim_uid: "uid-a".to_owned(),
            request: parameter.to_owned(),
            since: since.to_owned(),
            ..OperationRecord::default()
        };
        let later = planned("2026-12-04T15:00:02Z", "second");
        let earlier = planned("2026-12-04T15:00:01Z", "first");
        let mut state = ShardState::new("d", None);
        state.apply(&[Change::Upsert(Box::new(later.clone()))]);

        let mut found = stored("2", &[]);
        found.spec.operations = vec![earlier.clone()];
        assert_eq!(
            state.reread(Some(found.clone())).earlier,
            vec![earlier.clone()]
        );
        state.replace(earlier.clone());
        assert_eq!(
            state.to_write("d-0", &BTreeMap::new()).spec.operations,
            vec![earlier]
        );

        found.spec.operations = vec![later];
        assert_eq!(
            state.reread(Some(found)),
            Reconciled::default(),
            "a later request never replaces the first"
        );
    }

    #[test]
    fn notes_of_another_writer_on_the_same_operations_need_no_write() {
        let mut state = ShardState::new("d", Some(stored("1", &["pvc-a"])));
        let mut theirs = stored("2", &["pvc-a"]);
        theirs.spec.operations[0].attempts = 3;
        assert_eq!(state.reread(Some(theirs.clone())), Reconciled::default());
        assert!(!state.differs_from(Some(&theirs.spec)));
        assert!(state.differs_from(Some(&stored("3", &["pvc-a", "pvc-b"]).spec)));
    }

    #[test]
    fn the_echo_of_our_own_writes_needs_no_reread() {
        let mut state = ShardState::new("d", None);
        assert!(!state.needs_reread(None), "no shard and nothing held");
        state.apply(&[Change::Upsert(Box::new(record("pvc-a")))]);
        assert!(
            state.needs_reread(None),
            "a shard holding records is missing"
        );
        state.written(stored("5", &["pvc-a"]));
        state.written(stored("6", &["pvc-a"]));
        assert!(!state.needs_reread(Some("5")), "a late echo of our write");
        assert!(!state.needs_reread(Some("6")));
        assert!(state.needs_reread(Some("7")), "someone else wrote");
        assert!(state.needs_reread(None), "deleted");
    }

    #[test]
    fn a_reread_that_finds_no_shard_means_everything_held_must_be_written() {
        let mut state = ShardState::new("d", Some(stored("1", &["pvc-a"])));
        assert_eq!(state.reread(None), Reconciled::default());
        assert!(!state.exists());
        assert!(state.differs_from(None));
    }
}
