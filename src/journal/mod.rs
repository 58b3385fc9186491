//! The persistent journal of operations in flight: what makes "never leak a volume" survive a
//! SIGKILL, a restart or a leader failover. An operation is durable in the API server before
//! its first CreateVolume and is removed only once its outcome is safe (see [`registry`]
//! for the rules and `docs/journal.md` for the proof).
//!
//! In memory the journal is the [`Registry`]; on disk it is a few
//! `ProvisioningJournal` shard objects in the sidecar's namespace, written by one task per
//! shard. Only the leader runs controllers, so only the leader writes.

mod holdings;
mod placement;
mod record;
mod registry;
mod scope;
mod shard;
mod watch;
mod writer;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, MutexGuard};
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use kube::{Client, Resource, ResourceExt};
use thiserror::Error;
use tokio::sync::oneshot;
use tracing::{info, warn};

use crate::csi;
use crate::kube_client::RateLimitLayer;
use crate::provision::audit::InFlight;
use holdings::Holdings;
use placement::Placement;
pub use placement::{SHARD_BYTES, SHARD_CAPACITY};
pub use record::{
    Change, OperationRecord, Phase, ProvisioningJournal, ProvisioningJournalSpec, RECORD_FORMAT,
    RecordError, SecretReference, Summary, apply, recorded_sources,
};
pub use registry::{Busy, NameTaken, Operation, Refusal, Registry, Reservation};
use writer::{Queued, Writers, shard_index};

pub use scope::{DRIVER_LABEL, JournalScope, NODE_LABEL, node_key};

#[derive(Debug, Error)]
pub enum JournalError {
    /// The first list of the shards failed: the sidecar cannot start (see `load_message`).
    #[error("{}", load_message(.namespace, .source))]
    Load {
        namespace: String,
        source: kube::Error,
    },
    /// The deployment switched between central and node mode while the other mode's shards
    /// still hold operations: their volumes would be neither finished nor deleted.
    #[error(
        "the journal shards {shards:?} of this driver's {} deployment still hold {operations} operations in flight, which this {} sidecar would never finish or clean up; run the {} deployment until they are gone (kubectl get provisioningjournals shows them), then switch",
        if *.node_mode { "central" } else { "node (--node-deployment)" },
        if *.node_mode { "node-mode" } else { "central" },
        if *.node_mode { "central" } else { "node" }
    )]
    OtherMode {
        operations: usize,
        shards: Vec<String>,
        node_mode: bool,
    },
    #[error(
        "the journal did not store the operation within {0:?}; CreateVolume is not sent until it does"
    )]
    NotDurable(Duration),
    #[error("the journal was not flushed within {0:?}")]
    NotFlushed(Duration),
    #[error("the journal writer stopped")]
    WriterGone,
    #[error(transparent)]
    Refused(#[from] Refusal),
    #[error("failed to list the driver's journal shards (in node mode every node's): {0}")]
    EveryNode(kube::Error),
    #[error("another node's journal holds a record this build cannot read: {0}")]
    Unreadable(RecordError),
}

/// One line saying why the shards could not be listed at start and what to do: a missing CRD
/// (the API server answers 404 with a plain-text body, which kube reports as "Failed to parse
/// error data" with the whole status) names the CRD and the command that installs it; missing
/// RBAC names the grant; anything else gives the API server's message.
pub fn load_message(namespace: &str, error: &kube::Error) -> String {
    let crd = <ProvisioningJournal as kube::CustomResourceExt>::crd_name();
    let one_line = |text: &str| text.split_whitespace().collect::<Vec<_>>().join(" ");
    match error {
        kube::Error::Api(status) if status.code == 404 => format!(
            "the CRD {crd} is not installed; install it with `kubectl apply -f deploy/base/crd.yaml` \
             (the sidecar keeps its operations in flight there)"
        ),
        // The CRD is there but the role is not: the usual state of a deployment that switched
        // from upstream's image without our RBAC (upstream's example grants nothing on it).
        kube::Error::Api(status) if status.code == 403 => format!(
            "the sidecar may not list provisioningjournals in namespace {namespace}, where it keeps \
             its journal: grant get, list, watch, create and update on them there \
             (deploy/base/role.yaml; on top of upstream's RBAC example: deploy/upgrade/rbac.yaml, \
             see docs/deploy.md \"Upgrade from upstream\"); the API server says: {}",
            one_line(&status.message)
        ),
        kube::Error::Api(status) => format!(
            "cannot list provisioningjournals in namespace {namespace}: HTTP {}: {}",
            status.code,
            one_line(&status.message)
        ),
        other => format!(
            "cannot list provisioningjournals in namespace {namespace}: {}",
            one_line(&other.to_string())
        ),
    }
}

pub struct Journal {
    holdings: Arc<Holdings>,
    writers: Arc<Writers>,
    api: Api<ProvisioningJournal>,
    selector: String,
    /// This sidecar's shards are `<base_name>-<index>`.
    base_name: String,
    /// Node mode: every node's shards of this driver (`JournalScope::every_node_selector`).
    every_node_selector: Option<String>,
    rate_limit: RateLimitLayer,
    namespace: String,
    record_timeout: Duration,
}

impl Journal {
    /// Loads every recorded operation of `driver` from `namespace` (the shards of `scope`:
    /// this driver's, and in node mode this node's only) and starts the shard writers.
    /// `client` has no rate limiter: every request takes its token from `rate_limit` first.
    pub async fn load(
        client: Client,
        rate_limit: RateLimitLayer,
        namespace: &str,
        scope: &JournalScope,
        driver: &str,
        record_timeout: Duration,
    ) -> Result<Self, JournalError> {
        let api: Api<ProvisioningJournal> = Api::namespaced(client, namespace);
        let base_name = scope.base_name.as_str();
        let selector = scope.selector.clone();
        rate_limit.acquire().await;
        let existing = api
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|source| JournalError::Load {
                namespace: namespace.to_owned(),
                source,
            })?;
        rate_limit.acquire().await;
        let other_mode = api
            .list(&ListParams::default().labels(&scope.other_mode_selector))
            .await
            .map_err(|source| JournalError::Load {
                namespace: namespace.to_owned(),
                source,
            })?;
        let stranded: usize = other_mode
            .items
            .iter()
            .map(|shard| shard.spec.operations.len())
            .sum();
        if stranded > 0 {
            return Err(JournalError::OtherMode {
                operations: stranded,
                shards: other_mode.items.iter().map(ResourceExt::name_any).collect(),
                node_mode: scope.every_node_selector.is_some(),
            });
        }
        let holdings = Arc::new(Holdings::default());
        let writers = Arc::new(Writers::new(
            api.clone(),
            rate_limit.clone(),
            base_name,
            driver,
            scope.labels.clone(),
            holdings.clone(),
        ));
        let mut shards = Vec::with_capacity(existing.items.len());
        for shard in existing.items {
            match shard_index(&shard.name_any(), base_name) {
                Some(index) => shards.push((index, shard)),
                None => warn!(
                    shard = shard.name_any(),
                    "not a shard name this build writes (<driver>-<index>); its records are left alone"
                ),
            }
        }
        // A name in two shards is taken from the one `first_copies` picks, never by the order
        // the API server lists shards in (by name: `-10` before `-2`).
        shards.sort_by_key(|(index, _)| *index);
        let first = first_copies(&shards);
        for (index, mut shard) in shards {
            // A copy of a record kept in another shard stays there only: this one goes with
            // the shard's next write.
            shard.spec.operations.retain(|record| {
                first
                    .get(record.volume_name.as_str())
                    .is_none_or(|kept| *kept == index)
                    && holdings.adopt(record, index)
            });
            holdings.placement().know(index);
            writers.start(index, shard);
        }
        info!(
            operations = holdings.registry.len(),
            shards = holdings.placement().shards(),
            "journal loaded: operations in flight recovered"
        );
        Ok(Journal {
            holdings,
            writers,
            api,
            selector,
            base_name: base_name.to_owned(),
            every_node_selector: scope.every_node_selector.clone(),
            rate_limit,
            namespace: namespace.to_owned(),
            record_timeout,
        })
    }

    /// Watches the shards until the process ends, so that each writer learns at once that its
    /// shard was deleted (and writes it again whole) or that someone else wrote it (and adopts
    /// what they added). Without it both are found at the shard's next conflicting write.
    pub fn watch_shards(&self) {
        tokio::spawn(watch::watch_shards(
            self.api.clone(),
            self.selector.clone(),
            self.writers.clone(),
        ));
    }

    /// Makes the operation durable and marks it busy for the caller; CreateVolume may be sent
    /// only after this returns `Ok`, and only with the operation it returns: the one recorded
    /// first for this volume name, which a later plan never replaces.
    pub async fn record(
        &self,
        operation: Operation,
    ) -> Result<(Busy<'_>, Operation), JournalError> {
        let volume_name = operation.volume_name.clone();
        let record = OperationRecord::from_operation(&operation, Timestamp::now());
        let busy = match self.holdings.registry.reserve(operation.clone())? {
            Reservation::Recorded(busy, recorded) => return Ok((busy, *recorded)),
            Reservation::Fresh(busy) => busy,
        };
        let (durable, stored) = oneshot::channel();
        let shard = self.placement().place(&volume_name, record.stored_size());
        let written = match self.queue(shard, Change::Upsert(Box::new(record)), Some(durable)) {
            Ok(()) => match tokio::time::timeout(self.record_timeout, stored).await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(_)) => Err(JournalError::WriterGone),
                Err(_) => Err(JournalError::NotDurable(self.record_timeout)),
            },
            Err(error) => Err(error),
        };
        match written {
            Ok(()) => {
                self.holdings.registry.confirm(&volume_name);
                Ok((busy, operation))
            }
            // Nothing was sent. Should the write still land, the next attempt's write replaces
            // it, or recovery after a restart finds it and replays it (idempotent).
            Err(error) => {
                self.holdings.registry.abandon(&volume_name);
                Err(error)
            }
        }
    }

    /// The outcome is safe: forget the operation. Not waited for: if the process dies before
    /// the removal is stored, recovery finds the PV (or the final answer) again.
    pub fn complete(&self, volume_name: &str) {
        self.holdings.registry.complete(volume_name);
        if let Some(shard) = self.placement().release(volume_name) {
            let change = Change::Remove {
                volume_name: volume_name.to_owned(),
            };
            let _ = self.queue(shard, change, None);
        }
    }

    /// After a failed CreateVolume (or its replay): the operation stays, with the failure
    /// noted, once any attempt `may_have_created` the volume; otherwise nothing exists under
    /// its name and it is forgotten, durably (see [`Self::forget_durably`]). Returns whether
    /// it stays; `Err` if it was to go but the writer stopped before storing its removal.
    pub async fn settle_failure(
        &self,
        volume_name: &str,
        phase: Phase,
        may_have_created: bool,
        error: &str,
    ) -> Result<bool, JournalError> {
        let keep = self
            .holdings
            .registry
            .keep_after_failure(volume_name, may_have_created);
        if keep {
            self.note_failure(volume_name, phase, error);
            return Ok(true);
        }
        self.forget_durably(volume_name).await?;
        Ok(false)
    }

    /// Forgets an operation once its removal is stored, for an outcome that leaves nothing on
    /// the backend to find again (a final error, no attempt that may have created the volume).
    /// A removal written lazily would not do: whatever the sidecar does next (give the node
    /// back, send another request for the name, release the claim) rests on it, and a record
    /// reloaded after a crash may exist as far as anyone can tell, so no final error could
    /// ever settle it again (docs/journal.md, rule 15). Until the removal is stored the
    /// operation stays known here. No timeout: a removal given up on would still be written
    /// later by the shard's writer, and a retry that trusted the record in memory would send
    /// CreateVolume with none on disk (rule 1); the writer retries until the API server takes
    /// it. `Err` only if the writer stopped (the process is exiting).
    pub async fn forget_durably(&self, volume_name: &str) -> Result<(), JournalError> {
        let placed = self.placement().locate(volume_name);
        if let Some(shard) = placed {
            let (durable, stored) = oneshot::channel();
            let change = Change::Remove {
                volume_name: volume_name.to_owned(),
            };
            self.queue(shard, change, Some(durable))?;
            stored.await.map_err(|_| JournalError::WriterGone)?;
            self.placement().release(volume_name);
        }
        self.holdings.registry.complete(volume_name);
        Ok(())
    }

    /// Records a failed attempt so `kubectl get provisioningjournals` shows it.
    pub fn note_failure(&self, volume_name: &str, phase: Phase, error: &str) {
        let Some(shard) = self.placement().locate(volume_name) else {
            return;
        };
        let change = Change::Failure {
            volume_name: volume_name.to_owned(),
            phase,
            error: error.to_owned(),
        };
        let _ = self.queue(shard, change, None);
    }

    /// Stores every change still queued, removals included, waiting at most `timeout`: at a
    /// graceful exit, so the next leader replays no operation that is already over.
    pub async fn flush(&self, timeout: Duration) -> Result<(), JournalError> {
        let shards = self.writers.started();
        let mut stored = Vec::with_capacity(shards.len());
        for shard in shards {
            let (durable, done) = oneshot::channel();
            self.queue(shard, Change::Flush, Some(durable))?;
            stored.push(done);
        }
        let answers = tokio::time::timeout(timeout, futures::future::join_all(stored))
            .await
            .map_err(|_| JournalError::NotFlushed(timeout))?;
        // A writer that stopped drops its answer unsent.
        if answers.iter().any(Result::is_err) {
            return Err(JournalError::WriterGone);
        }
        Ok(())
    }

    pub fn registry(&self) -> &Registry {
        &self.holdings.registry
    }

    /// The content sources that operations in flight read, which must stay protected
    /// (docs/journal.md rule 12): this sidecar's, reserved ones included, and in node mode
    /// also every other node's as stored now, since another node's reaper may replay a clone
    /// or restore of a claim that is gone. An `Err` means they are unknown: release nothing.
    pub async fn sources_in_flight(&self) -> Result<Vec<csi::VolumeContentSource>, JournalError> {
        let mut sources = self.registry().content_sources();
        if let Some(selector) = &self.every_node_selector {
            let shards = self.shards_as_stored(selector).await?;
            // This node's own operations are the registry's, which is ahead of its shards
            // (a removal written lazily would keep a source protected for nothing).
            let others: Vec<ProvisioningJournal> = shards
                .into_iter()
                .filter(|shard| shard_index(&shard.name_any(), &self.base_name).is_none())
                .collect();
            sources.extend(recorded_sources(&others).map_err(JournalError::Unreadable)?);
        }
        Ok(sources)
    }

    /// Node mode: the node whose journal holds an operation for `volume_name`, as stored now.
    /// A node must not start an operation another node holds: that node sees its own through
    /// (it lets go once the claim has left it: `provision::claim_left_node`). Two nodes that
    /// start at once both create their PV; the second meets the first's and deletes its own
    /// volume (`provision::existing_pv`). `None` in central mode.
    pub async fn other_node_holding(
        &self,
        volume_name: &str,
    ) -> Result<Option<String>, JournalError> {
        let Some(selector) = &self.every_node_selector else {
            return Ok(None);
        };
        let shards = self.shards_as_stored(selector).await?;
        Ok(shards
            .iter()
            .filter(|shard| shard_index(&shard.name_any(), &self.base_name).is_none())
            .find(|shard| {
                shard
                    .spec
                    .operations
                    .iter()
                    .any(|record| record.volume_name == volume_name)
            })
            .map(|shard| {
                shard
                    .labels()
                    .get(NODE_LABEL)
                    .cloned()
                    .unwrap_or_else(|| shard.name_any())
            }))
    }

    /// Every operation in flight of the driver, as the audit needs them (`provision::audit`):
    /// this sidecar's, reserved ones included (their `since` is now), and what every shard of
    /// the driver holds as stored now: in node mode every node's. An `Err` means they are
    /// unknown: the audit reports nothing on the strength of it.
    pub async fn operations_everywhere(&self) -> Result<Vec<InFlight>, JournalError> {
        let selector = self.every_node_selector.as_ref().unwrap_or(&self.selector);
        let shards = self.shards_as_stored(selector).await?;
        let now = Timestamp::now();
        let mut in_flight: HashMap<String, InFlight> = HashMap::new();
        for record in shards.iter().flat_map(|shard| &shard.spec.operations) {
            // An unreadable time counts as the earliest: such a record holds back every report
            // an operation of unknown volume may hold back.
            let since = record.since.parse().unwrap_or(Timestamp::MIN);
            in_flight.insert(
                record.volume_name.clone(),
                InFlight {
                    volume_name: record.volume_name.clone(),
                    since,
                    volume_id: record.volume_id.clone(),
                },
            );
        }
        for volume_name in self.registry().volume_names() {
            in_flight.entry(volume_name.clone()).or_insert(InFlight {
                volume_name,
                since: now,
                volume_id: None,
            });
        }
        Ok(in_flight.into_values().collect())
    }

    /// The shards `selector` picks, read from the API server now (not this sidecar's memory).
    async fn shards_as_stored(
        &self,
        selector: &str,
    ) -> Result<Vec<ProvisioningJournal>, JournalError> {
        self.rate_limit.acquire().await;
        self.api
            .list(&ListParams::default().labels(selector))
            .await
            .map(|list| list.items)
            .map_err(JournalError::EveryNode)
    }

    /// This sidecar's shards are `<base name>-<index>`; its audit report is named after it.
    pub fn base_name(&self) -> &str {
        &self.base_name
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The shard object holding a volume's operation: what events about orphans regard.
    pub fn shard_reference(&self, volume_name: &str) -> ObjectReference {
        let shard = self.placement().locate(volume_name).unwrap_or(0);
        ObjectReference {
            api_version: Some(ProvisioningJournal::api_version(&()).into_owned()),
            kind: Some(ProvisioningJournal::kind(&()).into_owned()),
            namespace: Some(self.namespace.clone()),
            name: Some(self.writers.name(shard)),
            ..ObjectReference::default()
        }
    }

    fn queue(
        &self,
        shard: usize,
        change: Change,
        durable: Option<oneshot::Sender<()>>,
    ) -> Result<(), JournalError> {
        if self.writers.queue(shard, Queued { change, durable }) {
            Ok(())
        } else {
            Err(JournalError::WriterGone)
        }
    }

    fn placement(&self) -> MutexGuard<'_, Placement> {
        self.holdings.placement()
    }
}

/// For every volume name recorded in more than one of `shards` (sorted by index): the shard
/// whose copy is kept at load. The same claim's copies keep the one recorded first (every
/// retry replays the request recorded first; see `OperationRecord::recorded_before`); copies
/// of different claims, or recorded at the same time, keep the lowest shard's. Names found
/// once are not listed.
fn first_copies(shards: &[(usize, ProvisioningJournal)]) -> HashMap<String, usize> {
    let mut seen: HashMap<&str, (usize, &OperationRecord)> = HashMap::new();
    let mut duplicated = HashSet::new();
    for (index, shard) in shards {
        // A copy this build cannot replay is kept untouched wherever it is (`Holdings::adopt`)
        // and never chosen over a readable one.
        for record in shard
            .spec
            .operations
            .iter()
            .filter(|record| record.to_operation().is_ok())
        {
            match seen.get(record.volume_name.as_str()) {
                None => {
                    seen.insert(&record.volume_name, (*index, record));
                }
                Some((_, kept)) => {
                    duplicated.insert(record.volume_name.as_str());
                    if record.recorded_before(kept) {
                        seen.insert(&record.volume_name, (*index, record));
                    }
                }
            }
        }
    }
    seen.into_iter()
        .filter(|(name, _)| duplicated.contains(name))
        .map(|(name, (index, _))| (name.to_owned(), index))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;

    fn shipped_crd() -> std::path::PathBuf {
        crate::work_tree().join("deploy/base/crd.yaml")
    }

    fn api_error(code: u16, message: &str, reason: &str) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure(message, reason)
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn a_failed_first_list_is_one_line_saying_what_to_do() {
        // What kube reports when the API server does not serve the resource at all.
        let missing = api_error(404, "404 page not found", "Failed to parse error data");
        assert_eq!(
            JournalError::Load {
                namespace: "csi".into(),
                source: missing
            }
            .to_string(),
            "the CRD provisioningjournals.provisioner.csi-rs.dev is not installed; install it with \
             `kubectl apply -f deploy/base/crd.yaml` (the sidecar keeps its operations in flight \
             there)"
        );
        let forbidden = api_error(
            403,
            "provisioningjournals.provisioner.csi-rs.dev is forbidden: User \"system:serviceaccount:csi:p\"\ncannot list resource",
            "Forbidden",
        );
        assert_eq!(
            load_message("csi", &forbidden),
            "the sidecar may not list provisioningjournals in namespace csi, where it keeps its \
             journal: grant get, list, watch, create and update on them there \
             (deploy/base/role.yaml; on top of upstream's RBAC example: deploy/upgrade/rbac.yaml, \
             see docs/deploy.md \"Upgrade from upstream\"); the API server says: \
             provisioningjournals.provisioner.csi-rs.dev is forbidden: User \
             \"system:serviceaccount:csi:p\" cannot list resource"
        );
        assert_eq!(
            load_message(
                "csi",
                &api_error(500, "etcdserver:\n timeout", "InternalError")
            ),
            "cannot list provisioningjournals in namespace csi: HTTP 500: etcdserver: timeout"
        );
        for error in [
            load_message("csi", &api_error(404, "404 page not found", "x")),
            load_message("csi", &forbidden),
        ] {
            assert!(!error.contains('\n'), "{error}");
            assert!(!error.contains("Status {"), "{error}");
        }
    }

    /// deploy/base/crd.yaml is generated from the Rust type; regenerate it with
    /// `UPDATE_CRD=1 cargo test --lib journal`.
    #[test]
    fn the_shipped_crd_is_the_one_the_code_defines() {
        let yaml =
            serde_saphyr::to_string(&ProvisioningJournal::crd()).expect("the CRD serializes");
        let generated =
            format!("# Generated from src/journal/record.rs; do not edit by hand.\n{yaml}");
        if std::env::var_os("UPDATE_CRD").is_some() {
            std::fs::write(shipped_crd(), &generated).expect("deploy/base/crd.yaml is writable");
        }
        let shipped = std::fs::read_to_string(shipped_crd()).unwrap_or_default();
        assert!(
            shipped == generated,
            "deploy/base/crd.yaml is stale: run UPDATE_CRD=1 cargo test --lib journal"
        );
    }
}
