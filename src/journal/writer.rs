//! One task per shard applies queued changes to the shard object. A write first takes its
//! token from the client's rate limiter, then gathers every change queued by then (group
//! commit): the changes that arrive while it waits for the token, or while the previous
//! write is in flight, share one request, so the number of writes follows the API server's
//! latency and the QPS budget, not the number of operations. Only records a caller waits for
//! (before CreateVolume) trigger a write; removals and failure notes join the next write, or
//! are flushed a few seconds later.

use std::time::Duration;

use kube::api::{Api, ObjectMeta, PostParams};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tracing::{debug, warn};

use super::record::{Change, ProvisioningJournal, ProvisioningJournalSpec, apply};
use crate::kube_client::RateLimitLayer;

/// A change and, for writes the caller must wait for, where to say it is durable.
pub(super) struct Queued {
    pub change: Change,
    pub durable: Option<oneshot::Sender<()>>,
}

const RETRY_START: Duration = Duration::from_millis(100);
/// How long a change nobody waits for stays unwritten, then how much longer it may wait for
/// spare capacity under the rate limit (it yields to PV creates, as events do). A removal
/// not yet written is harmless: recovery finds the PV (or the final answer) and drops the
/// record again.
const LAZY_FLUSH: Duration = Duration::from_secs(5);
const LAZY_MAX_DEFERRAL: Duration = Duration::from_secs(30);
const RETRY_MAX: Duration = Duration::from_secs(5);

pub(super) struct ShardWriter {
    /// A client without a rate limiter: each request takes its token from `rate_limit`
    /// before the batch is gathered.
    pub api: Api<ProvisioningJournal>,
    pub rate_limit: RateLimitLayer,
    pub name: String,
    pub driver: String,
    pub labels: std::collections::BTreeMap<String, String>,
    /// The shard as last read or written; `None` if it does not exist yet.
    pub current: Option<ProvisioningJournal>,
}

impl ShardWriter {
    pub async fn run(mut self, mut queue: mpsc::UnboundedReceiver<Queued>) {
        // Changes nobody waits for (removals, failure notes) ride along with the next urgent
        // write, or are flushed after `LAZY_FLUSH` if none comes.
        let mut lazy: Vec<Queued> = Vec::new();
        let mut flush_at: Option<Instant> = None;
        loop {
            let next = match flush_at {
                Some(deadline) => tokio::select! {
                    next = queue.recv() => next,
                    () = self.lazy_flush_due(deadline) => {
                        self.commit_all(std::mem::take(&mut lazy), &mut queue).await;
                        flush_at = None;
                        continue;
                    }
                },
                None => queue.recv().await,
            };
            let Some(queued) = next else {
                self.commit_all(lazy, &mut queue).await;
                return;
            };
            if queued.durable.is_none() {
                lazy.push(queued);
                flush_at.get_or_insert_with(|| Instant::now() + LAZY_FLUSH);
                continue;
            }
            let mut batch = std::mem::take(&mut lazy);
            batch.push(queued);
            flush_at = None;
            self.commit_all(batch, &mut queue).await;
        }
    }

    async fn lazy_flush_due(&self, deadline: Instant) {
        tokio::time::sleep_until(deadline).await;
        self.rate_limit.spare_or(deadline + LAZY_MAX_DEFERRAL).await;
    }

    async fn commit_all(
        &mut self,
        mut batch: Vec<Queued>,
        queue: &mut mpsc::UnboundedReceiver<Queued>,
    ) {
        if batch.is_empty() {
            return;
        }
        self.commit(&mut batch, queue).await;
        for queued in batch {
            if let Some(durable) = queued.durable {
                let _ = durable.send(());
            }
        }
    }

    /// Writes the batch, retrying until it is stored. Changes queued until each attempt has
    /// its token join it.
    async fn commit(
        &mut self,
        batch: &mut Vec<Queued>,
        queue: &mut mpsc::UnboundedReceiver<Queued>,
    ) {
        let mut delay = RETRY_START;
        loop {
            self.rate_limit.acquire().await;
            while let Ok(more) = queue.try_recv() {
                batch.push(more);
            }
            let changes: Vec<Change> = batch.iter().map(|queued| queued.change.clone()).collect();
            let mut object = self.current.clone().unwrap_or_else(|| self.empty());
            if !apply(&mut object.spec, &changes) {
                return;
            }
            let result = match &self.current {
                Some(_) => {
                    self.api
                        .replace(&self.name, &PostParams::default(), &object)
                        .await
                }
                None => self.api.create(&PostParams::default(), &object).await,
            };
            match result {
                Ok(stored) => {
                    debug!(
                        shard = self.name,
                        changes = changes.len(),
                        "journal shard written"
                    );
                    self.current = Some(stored);
                    return;
                }
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    // Another writer (a previous leader) got there first: start from its state.
                    self.refresh().await;
                }
                Err(error) => {
                    warn!(shard = self.name, %error, retry_in = ?delay, "journal write failed");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(RETRY_MAX);
                    self.refresh().await;
                }
            }
        }
    }

    async fn refresh(&mut self) {
        self.rate_limit.acquire().await;
        match self.api.get_opt(&self.name).await {
            Ok(current) => self.current = current,
            Err(error) => warn!(shard = self.name, %error, "journal shard read failed"),
        }
    }

    fn empty(&self) -> ProvisioningJournal {
        ProvisioningJournal {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                labels: Some(self.labels.clone()),
                ..ObjectMeta::default()
            },
            spec: ProvisioningJournalSpec {
                driver: self.driver.clone(),
                ..ProvisioningJournalSpec::default()
            },
        }
    }
}
