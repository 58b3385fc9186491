//! One task per shard applies queued changes to the shard object. A write first takes its
//! token from the client's rate limiter, then gathers every change queued by then (group
//! commit): the changes that arrive while it waits for the token, or while the previous
//! write is in flight, share one request, so the number of writes follows the API server's
//! latency and the QPS budget, not the number of operations. Only records a caller waits for
//! (before CreateVolume) trigger a write; removals and failure notes join the next write, or
//! are flushed once the rate limit has capacity to spare.
//!
//! Writes of the journal, whatever their shard, are also spaced by the time the bucket takes to
//! earn a token (20 to 200 ms, see [`write_spacing`] and [`WriteSlots`]). A lone claim after a
//! quiet spell is written at once; when claims arrive in a burst, while the bucket still has
//! tokens to give, each write would otherwise go out with the one or two claims seen so far
//! and spend burst tokens the claims' PV creates need: at the default QPS, 50 claims arriving
//! over half a second cost six writes, spaced they cost three. The spacing is shared because a
//! burst larger than a shard fills the shards one after the other, and each would otherwise
//! write its first record alone as soon as it got one.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use kube::api::{Api, PostParams};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::holdings::Holdings;
use super::placement::MAX_SHARDS;
use super::record::{Change, ProvisioningJournal};
use super::shard::ShardState;
use crate::kube_client::RateLimitLayer;

/// A change and, for writes the caller must wait for, where to say it is durable.
pub(super) struct Queued {
    pub change: Change,
    pub durable: Option<oneshot::Sender<()>>,
}

const RETRY_START: Duration = Duration::from_millis(100);
/// How long a change nobody waits for stays unwritten; then it waits for spare capacity under
/// the rate limit, at most 5 minutes (`kube_client::MAX_YIELD`; it yields to PV creates, as
/// events do). A removal not yet written is harmless: recovery finds the PV (or the final
/// answer) and drops the record again. Changes of the shard being filled ride along with its records sooner.
const LAZY_FLUSH: Duration = Duration::from_secs(5);
const RETRY_MAX: Duration = Duration::from_secs(5);
/// Bounds of the spacing between two writes of a shard. Below the lower one the write's own
/// round trip does the grouping; above the upper one a claim would wait noticeably longer.
const MIN_WRITE_SPACING: Duration = Duration::from_millis(20);
const MAX_WRITE_SPACING: Duration = Duration::from_millis(200);

/// The least time between the starts of two writes of one shard: one token's worth of the
/// rate limit (`token_interval`, `None` without a limit), within the bounds above.
pub(super) fn write_spacing(token_interval: Option<Duration>) -> Duration {
    token_interval
        .unwrap_or(MIN_WRITE_SPACING)
        .clamp(MIN_WRITE_SPACING, MAX_WRITE_SPACING)
}

/// The journal-wide schedule of writes: two writes, of any shards, start at least `spacing`
/// apart. Each write reserves the next free start before it waits for its token.
#[derive(Clone)]
pub(super) struct WriteSlots {
    spacing: Duration,
    last: Arc<Mutex<Option<Instant>>>,
}

impl WriteSlots {
    pub fn new(spacing: Duration) -> Self {
        Self {
            spacing,
            last: Arc::new(Mutex::new(None)),
        }
    }

    /// Reserves the next start and waits until it is due.
    async fn next(&self) {
        let slot = {
            // A plain timestamp: consistent even if a holder panicked.
            let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
            let now = Instant::now();
            let slot = last.map_or(now, |last| (last + self.spacing).max(now));
            *last = Some(slot);
            slot
        };
        tokio::time::sleep_until(slot).await;
    }
}

/// What the watch of the shards saw of one shard.
#[derive(Debug)]
pub(super) enum Observed {
    /// The shard at this resourceVersion.
    Version(String),
    /// The shard was deleted, or a fresh list of the shards did not have it.
    Missing,
}

pub(super) struct ShardWriter {
    /// A client without a rate limiter: each request takes its token from `rate_limit`
    /// before the batch is gathered.
    pub api: Api<ProvisioningJournal>,
    pub rate_limit: RateLimitLayer,
    pub name: String,
    pub index: usize,
    pub labels: BTreeMap<String, String>,
    pub state: ShardState,
    /// Shared by every shard of the journal.
    pub slots: WriteSlots,
    /// Where records written by someone else are adopted.
    pub holdings: Arc<Holdings>,
}

impl ShardWriter {
    pub async fn run(
        mut self,
        mut queue: mpsc::UnboundedReceiver<Queued>,
        mut observed: mpsc::UnboundedReceiver<Observed>,
    ) {
        // Changes nobody waits for (removals, failure notes) ride along with the next urgent
        // write, or are flushed after `LAZY_FLUSH` if none comes.
        let mut lazy: Vec<Queued> = Vec::new();
        let mut flush_at: Option<Instant> = None;
        loop {
            let lazy_due = async {
                match flush_at {
                    Some(deadline) => self.lazy_flush_due(deadline).await,
                    None => std::future::pending().await,
                }
            };
            let next = tokio::select! {
                next = queue.recv() => next,
                Some(seen) = observed.recv() => {
                    if self.reread_needed(&seen) && self.reread().await {
                        // The shard lacks what we hold (deleted, or overwritten): write it
                        // whole now, whatever is held back rides along.
                        self.commit_all(std::mem::take(&mut lazy), &mut queue, true).await;
                        flush_at = None;
                    }
                    continue;
                }
                () = lazy_due => {
                    self.commit_all(std::mem::take(&mut lazy), &mut queue, false).await;
                    flush_at = None;
                    continue;
                }
            };
            let Some(queued) = next else {
                self.commit_all(lazy, &mut queue, false).await;
                return;
            };
            if queued.change == Change::Flush && lazy.is_empty() {
                // Nothing held back: nothing to store, and an exit waits for this answer.
                if let Some(durable) = queued.durable {
                    let _ = durable.send(());
                }
                continue;
            }
            if queued.durable.is_none() {
                lazy.push(queued);
                flush_at.get_or_insert_with(|| Instant::now() + LAZY_FLUSH);
                continue;
            }
            let mut batch = std::mem::take(&mut lazy);
            batch.push(queued);
            flush_at = None;
            self.commit_all(batch, &mut queue, false).await;
        }
    }

    async fn lazy_flush_due(&self, deadline: Instant) {
        tokio::time::sleep_until(deadline).await;
        self.rate_limit.yield_since(deadline).await;
    }

    fn reread_needed(&self, seen: &Observed) -> bool {
        match seen {
            Observed::Version(version) => self.state.needs_reread(Some(version)),
            Observed::Missing => self.state.needs_reread(None),
        }
    }

    /// `force`: write even if the batch changes nothing (the shard lacks what is held).
    async fn commit_all(
        &mut self,
        mut batch: Vec<Queued>,
        queue: &mut mpsc::UnboundedReceiver<Queued>,
        force: bool,
    ) {
        if batch.is_empty() && !force {
            return;
        }
        self.commit(&mut batch, queue, force).await;
        for queued in batch {
            if let Some(durable) = queued.durable {
                let _ = durable.send(());
            }
        }
    }

    /// Writes everything held with the batch applied, retrying until the API server has
    /// acknowledged it: a change somebody waits for is durable only then, even if it changes
    /// nothing held (the shard may have been deleted since it was last written). Changes
    /// queued until each attempt has its token join it.
    async fn commit(
        &mut self,
        batch: &mut Vec<Queued>,
        queue: &mut mpsc::UnboundedReceiver<Queued>,
        force: bool,
    ) {
        let mut delay = RETRY_START;
        let mut applied = 0;
        let mut needed = force;
        loop {
            self.slots.next().await;
            self.rate_limit.acquire().await;
            while let Ok(more) = queue.try_recv() {
                batch.push(more);
            }
            let changes: Vec<Change> = batch[applied..]
                .iter()
                .map(|queued| queued.change.clone())
                .collect();
            applied = batch.len();
            needed |= self.state.apply(&changes);
            needed |= batch.iter().any(|queued| queued.durable.is_some());
            if !needed {
                return;
            }
            let object = self.state.to_write(&self.name, &self.labels);
            let result = if self.state.exists() {
                self.api
                    .replace(&self.name, &PostParams::default(), &object)
                    .await
            } else {
                self.api.create(&PostParams::default(), &object).await
            };
            match result {
                Ok(stored) => {
                    debug!(
                        shard = self.name,
                        changes = batch.len(),
                        "journal shard written"
                    );
                    self.state.written(stored);
                    return;
                }
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    // Someone else wrote it (a previous leader, an admin): take in what they
                    // added, then write again.
                    self.reread().await;
                }
                Err(kube::Error::Api(status)) if status.code == 404 && self.state.exists() => {
                    warn!(
                        shard = self.name,
                        "journal shard deleted behind our back; writing it again whole"
                    );
                    self.state.lost();
                }
                Err(error) => {
                    warn!(shard = self.name, %error, retry_in = ?delay, "journal write failed");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(RETRY_MAX);
                    self.reread().await;
                }
            }
        }
    }

    /// Reads the shard back and adopts what someone else wrote. Returns whether the API
    /// server lacks something held, so that a write is due.
    async fn reread(&mut self) -> bool {
        self.rate_limit.acquire().await;
        let found = match self.api.get_opt(&self.name).await {
            Ok(found) => found,
            Err(error) => {
                warn!(shard = self.name, %error, "journal shard read failed");
                return false;
            }
        };
        let spec = found.as_ref().map(|shard| shard.spec.clone());
        let reconciled = self.state.reread(found);
        for record in reconciled.earlier {
            if self.holdings.prefer_earlier(&record) {
                self.state.replace(record);
            }
        }
        let found = reconciled.found;
        if !found.is_empty() {
            info!(
                shard = self.name,
                operations = found.len(),
                "the journal shard holds operations written by someone else; taking them in"
            );
        }
        for record in found {
            if self.holdings.adopt(&record, self.index) {
                self.state.keep(record);
            }
        }
        self.state.differs_from(spec.as_ref())
    }
}

/// The shard writers of one journal, one task each, opened when a shard is first needed or
/// seen. Each is named `<base name>-<index>`.
pub(super) struct Writers {
    api: Api<ProvisioningJournal>,
    rate_limit: RateLimitLayer,
    base_name: String,
    driver: String,
    labels: BTreeMap<String, String>,
    slots: WriteSlots,
    holdings: Arc<Holdings>,
    open: Mutex<Vec<Option<WriterHandle>>>,
}

#[derive(Clone)]
struct WriterHandle {
    changes: mpsc::UnboundedSender<Queued>,
    observed: mpsc::UnboundedSender<Observed>,
}

/// The index of shard `name` of journal `base_name`, if it is one this build writes.
pub(super) fn shard_index(name: &str, base_name: &str) -> Option<usize> {
    name.strip_prefix(base_name)?
        .strip_prefix('-')?
        .parse::<usize>()
        .ok()
        .filter(|index| *index < MAX_SHARDS)
}

impl Writers {
    /// `labels` go on every shard created.
    pub fn new(
        api: Api<ProvisioningJournal>,
        rate_limit: RateLimitLayer,
        base_name: &str,
        driver: &str,
        labels: BTreeMap<String, String>,
        holdings: Arc<Holdings>,
    ) -> Self {
        let slots = WriteSlots::new(write_spacing(rate_limit.token_interval()));
        Writers {
            api,
            rate_limit,
            base_name: base_name.to_owned(),
            driver: driver.to_owned(),
            labels,
            slots,
            holdings,
            open: Mutex::new(Vec::new()),
        }
    }

    /// The index of shard `name`, if it is one of this journal's.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        shard_index(name, &self.base_name)
    }

    pub fn name(&self, index: usize) -> String {
        format!("{}-{index}", self.base_name)
    }

    /// Starts the writer of a shard found at start-up, holding what it holds.
    pub fn start(&self, index: usize, loaded: ProvisioningJournal) {
        self.handle(index, Some(loaded));
    }

    /// Whether the shard's writer took the change (it is gone only if its task panicked).
    pub fn queue(&self, index: usize, queued: Queued) -> bool {
        self.handle(index, None).changes.send(queued).is_ok()
    }

    pub fn observe(&self, index: usize, seen: Observed) {
        let _ = self.handle(index, None).observed.send(seen);
    }

    /// Indices of the shards that have a writer.
    pub fn started(&self) -> Vec<usize> {
        let open = self.lock();
        (0..open.len())
            .filter(|&index| open[index].is_some())
            .collect()
    }

    fn handle(&self, index: usize, loaded: Option<ProvisioningJournal>) -> WriterHandle {
        let mut open = self.lock();
        if open.len() <= index {
            open.resize(index + 1, None);
        }
        if let Some(handle) = &open[index] {
            return handle.clone();
        }
        let (changes, queue) = mpsc::unbounded_channel();
        let (observed, seen) = mpsc::unbounded_channel();
        let writer = ShardWriter {
            api: self.api.clone(),
            rate_limit: self.rate_limit.clone(),
            name: self.name(index),
            index,
            labels: self.labels.clone(),
            state: ShardState::new(&self.driver, loaded),
            slots: self.slots.clone(),
            holdings: self.holdings.clone(),
        };
        tokio::spawn(writer.run(queue, seen));
        let handle = WriterHandle { changes, observed };
        open[index] = Some(handle.clone());
        handle
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Option<WriterHandle>>> {
        // A list of channel ends, consistent even if a holder panicked.
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests;
