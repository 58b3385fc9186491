//! The persistent journal of operations in flight: what makes "never leak a volume" survive a
//! SIGKILL, a restart or a leader failover. An operation is durable in the API server before
//! its first CreateVolume and is removed only once its outcome is safe (see [`registry`]
//! for the rules and `docs/journal.md` for the proof).
//!
//! In memory the journal is the [`Registry`]; on disk it is a few
//! `ProvisioningJournal` shard objects in the sidecar's namespace, written by one task per
//! shard. Only the leader runs controllers, so only the leader writes.

mod placement;
mod record;
mod registry;
mod writer;

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use kube::{Client, Resource, ResourceExt};
use thiserror::Error;
use tokio::sync::{mpsc, oneshot};
use tracing::{info, warn};

use crate::kube_client::RateLimitLayer;
use placement::Placement;
pub use placement::SHARD_CAPACITY;
pub use record::{
    Change, OperationRecord, Phase, ProvisioningJournal, ProvisioningJournalSpec, RECORD_FORMAT,
    RecordError, SecretReference, Summary, apply,
};
pub use registry::{Busy, NameTaken, Operation, Registry, Reservation};
use writer::{Queued, ShardWriter, WriteSlots};

/// Shards per driver, filled one after the other (see `placement`): the first holds up to
/// [`SHARD_CAPACITY`] operations, the others take the overflow.
pub const SHARDS: usize = 8;
/// Label naming the driver on every shard.
pub const DRIVER_LABEL: &str = "provisioner.csi-rs.dev/driver";

#[derive(Debug, Error)]
pub enum JournalError {
    #[error(
        "the ProvisioningJournal CRD is not installed (apply deploy/crd.yaml), or the sidecar may not list provisioningjournals in namespace {namespace}: {source}"
    )]
    Load {
        namespace: String,
        source: kube::Error,
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
    NameTaken(#[from] NameTaken),
}

pub struct Journal {
    registry: Registry,
    shards: Vec<mpsc::UnboundedSender<Queued>>,
    shard_names: Vec<String>,
    placement: Mutex<Placement>,
    namespace: String,
    record_timeout: Duration,
}

impl Journal {
    /// Loads every recorded operation of `driver` from `namespace` and starts the shard
    /// writers. `base_name` is the sanitised driver name (as the Lease uses).
    /// `client` has no rate limiter: every request takes its token from `rate_limit` first.
    pub async fn load(
        client: Client,
        rate_limit: RateLimitLayer,
        namespace: &str,
        base_name: &str,
        driver: &str,
        record_timeout: Duration,
    ) -> Result<Self, JournalError> {
        let api: Api<ProvisioningJournal> = Api::namespaced(client, namespace);
        let selector = format!("{DRIVER_LABEL}={base_name}");
        rate_limit.acquire().await;
        let existing = api
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(|source| JournalError::Load {
                namespace: namespace.to_owned(),
                source,
            })?;
        let registry = Registry::default();
        let mut placement = Placement::new(SHARDS);
        let mut by_name: BTreeMap<String, ProvisioningJournal> = BTreeMap::new();
        let shard_prefix = format!("{base_name}-");
        for shard in existing.items {
            let index = shard
                .name_any()
                .strip_prefix(&shard_prefix)
                .and_then(|index| index.parse::<usize>().ok())
                .unwrap_or(usize::MAX);
            for record in &shard.spec.operations {
                match record.to_operation() {
                    Ok(operation) => {
                        placement.restore(&operation.volume_name, index);
                        registry.restore(operation);
                    }
                    Err(error) => {
                        warn!(shard = shard.name_any(), %error, "journal record kept but not replayable")
                    }
                }
            }
            by_name.insert(shard.name_any(), shard);
        }
        if !registry.is_empty() {
            info!(
                operations = registry.len(),
                "recovered operations in flight from the journal"
            );
        }
        let labels: BTreeMap<String, String> =
            [(DRIVER_LABEL.to_owned(), base_name.to_owned())].into();
        let slots = WriteSlots::new(writer::write_spacing(rate_limit.token_interval()));
        let mut shards = Vec::with_capacity(SHARDS);
        let mut shard_names = Vec::with_capacity(SHARDS);
        for index in 0..SHARDS {
            let name = format!("{base_name}-{index}");
            let (sender, queue) = mpsc::unbounded_channel();
            let writer = ShardWriter {
                api: api.clone(),
                rate_limit: rate_limit.clone(),
                name: name.clone(),
                driver: driver.to_owned(),
                labels: labels.clone(),
                current: by_name.remove(&name),
                slots: slots.clone(),
            };
            tokio::spawn(writer.run(queue));
            shards.push(sender);
            shard_names.push(name);
        }
        Ok(Journal {
            registry,
            shards,
            shard_names,
            placement: Mutex::new(placement),
            namespace: namespace.to_owned(),
            record_timeout,
        })
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
        let busy = match self.registry.reserve(operation.clone())? {
            Reservation::Recorded(busy, recorded) => return Ok((busy, *recorded)),
            Reservation::Fresh(busy) => busy,
        };
        let (durable, stored) = oneshot::channel();
        let shard = self.placement().place(&volume_name);
        let written = match self.queue(shard, Change::Upsert(record), Some(durable)) {
            Ok(()) => match tokio::time::timeout(self.record_timeout, stored).await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(_)) => Err(JournalError::WriterGone),
                Err(_) => Err(JournalError::NotDurable(self.record_timeout)),
            },
            Err(error) => Err(error),
        };
        match written {
            Ok(()) => {
                self.registry.confirm(&volume_name);
                Ok((busy, operation))
            }
            // Nothing was sent. Should the write still land, the next attempt's write replaces
            // it, or recovery after a restart finds it and replays it (idempotent).
            Err(error) => {
                self.registry.abandon(&volume_name);
                Err(error)
            }
        }
    }

    /// The outcome is safe: forget the operation. Not waited for: if the process dies before
    /// the removal is stored, recovery finds the PV (or the final answer) again.
    pub fn complete(&self, volume_name: &str) {
        self.registry.complete(volume_name);
        if let Some(shard) = self.placement().release(volume_name) {
            let change = Change::Remove {
                volume_name: volume_name.to_owned(),
            };
            let _ = self.queue(shard, change, None);
        }
    }

    /// After a failed CreateVolume (or its replay): the operation stays, with the failure
    /// noted, once any attempt `may_have_created` the volume; otherwise nothing exists under
    /// its name and it is forgotten. Returns whether it stays.
    pub fn settle_failure(
        &self,
        volume_name: &str,
        phase: Phase,
        may_have_created: bool,
        error: &str,
    ) -> bool {
        let keep = self
            .registry
            .keep_after_failure(volume_name, may_have_created);
        if keep {
            self.note_failure(volume_name, phase, error);
        } else {
            self.complete(volume_name);
        }
        keep
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
        let mut stored = Vec::with_capacity(self.shards.len());
        for shard in 0..self.shards.len() {
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
        &self.registry
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The shard object holding a volume's operation: what events about orphans regard.
    pub fn shard_reference(&self, volume_name: &str) -> ObjectReference {
        ObjectReference {
            api_version: Some(ProvisioningJournal::api_version(&()).into_owned()),
            kind: Some(ProvisioningJournal::kind(&()).into_owned()),
            namespace: Some(self.namespace.clone()),
            name: Some(self.shard_names[self.placement().locate(volume_name).unwrap_or(0)].clone()),
            ..ObjectReference::default()
        }
    }

    fn queue(
        &self,
        shard: usize,
        change: Change,
        durable: Option<oneshot::Sender<()>>,
    ) -> Result<(), JournalError> {
        self.shards[shard]
            .send(Queued { change, durable })
            .map_err(|_| JournalError::WriterGone)
    }

    fn placement(&self) -> MutexGuard<'_, Placement> {
        // The placement is plain data, consistent even if a holder panicked.
        self.placement
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;

    const SHIPPED_CRD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/crd.yaml");

    /// deploy/crd.yaml is generated from the Rust type; regenerate it with
    /// `UPDATE_CRD=1 cargo test --lib journal`.
    #[test]
    fn the_shipped_crd_is_the_one_the_code_defines() {
        let yaml =
            serde_saphyr::to_string(&ProvisioningJournal::crd()).expect("the CRD serializes");
        let generated =
            format!("# Generated from src/journal/record.rs; do not edit by hand.\n{yaml}");
        if std::env::var_os("UPDATE_CRD").is_some() {
            std::fs::write(SHIPPED_CRD, &generated).expect("deploy/crd.yaml is writable");
        }
        let shipped = std::fs::read_to_string(SHIPPED_CRD).unwrap_or_default();
        assert!(
            shipped == generated,
            "deploy/crd.yaml is stale: run UPDATE_CRD=1 cargo test --lib journal"
        );
    }
}
