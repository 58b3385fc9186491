//! One task per shard applies queued changes to the shard object. Every change that arrives
//! while a write is in flight goes into the next write (group commit), so the number of
//! writes follows the API server's latency, not the number of operations.

use std::time::Duration;

use kube::api::{Api, ObjectMeta, PostParams};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, warn};

use super::record::{Change, ProvisioningJournal, ProvisioningJournalSpec, apply};

/// A change and, for writes the caller must wait for, where to say it is durable.
pub(super) struct Queued {
    pub change: Change,
    pub durable: Option<oneshot::Sender<()>>,
}

const RETRY_START: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);

pub(super) struct ShardWriter {
    pub api: Api<ProvisioningJournal>,
    pub name: String,
    pub driver: String,
    pub labels: std::collections::BTreeMap<String, String>,
    /// The shard as last read or written; `None` if it does not exist yet.
    pub current: Option<ProvisioningJournal>,
}

impl ShardWriter {
    pub async fn run(mut self, mut queue: mpsc::UnboundedReceiver<Queued>) {
        while let Some(first) = queue.recv().await {
            let mut batch = vec![first];
            while let Ok(more) = queue.try_recv() {
                batch.push(more);
            }
            self.commit(&mut batch, &mut queue).await;
            for queued in batch {
                if let Some(durable) = queued.durable {
                    let _ = durable.send(());
                }
            }
        }
    }

    /// Writes the batch, retrying until it is stored. Changes queued during retries join it.
    async fn commit(
        &mut self,
        batch: &mut Vec<Queued>,
        queue: &mut mpsc::UnboundedReceiver<Queued>,
    ) {
        let mut delay = RETRY_START;
        loop {
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
            while let Ok(more) = queue.try_recv() {
                batch.push(more);
            }
        }
    }

    async fn refresh(&mut self) {
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
