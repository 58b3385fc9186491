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

use std::sync::{Arc, Mutex, PoisonError};
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
    /// Shared by every shard of the journal.
    pub slots: WriteSlots,
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
            self.commit_all(batch, &mut queue).await;
        }
    }

    async fn lazy_flush_due(&self, deadline: Instant) {
        tokio::time::sleep_until(deadline).await;
        self.rate_limit.yield_since(deadline).await;
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
            self.slots.next().await;
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

#[cfg(test)]
mod tests {
    use kube::client::{Body, ClientBuilder};
    use tower_test::mock;

    use super::*;
    use crate::journal::OperationRecord;

    /// One record per entry of `shards`, on that shard, arriving `gap` apart, each waited for
    /// (as before CreateVolume), written by shard writers sharing `spacing` and one rate limit
    /// against an API server that answers at once; returns how many writes it took.
    async fn writes_for(shards: &[usize], gap: Duration, spacing: Duration) -> usize {
        let (service, mut handle) = mock::pair::<http::Request<Body>, http::Response<Body>>();
        let apiserver = tokio::spawn(async move {
            let mut writes = 0;
            while let Some((request, send)) = handle.next_request().await {
                writes += 1;
                // The shard as written is the shard as stored.
                let body = request
                    .into_body()
                    .collect_bytes()
                    .await
                    .expect("request body");
                send.send_response(http::Response::new(Body::from(body.to_vec())));
            }
            writes
        });
        let api = Api::namespaced(ClientBuilder::new(service, "default").build(), "default");
        let rate_limit = RateLimitLayer::from_flags(5.0, 10);
        let slots = WriteSlots::new(spacing);
        let shard_count = shards.iter().max().map_or(1, |highest| highest + 1);
        let mut queues = Vec::new();
        let mut writers = Vec::new();
        for index in 0..shard_count {
            let writer = ShardWriter {
                api: api.clone(),
                rate_limit: rate_limit.clone(),
                name: format!("journal-{index}"),
                driver: "d".to_owned(),
                labels: std::collections::BTreeMap::new(),
                current: None,
                slots: slots.clone(),
            };
            let (queue, receiver) = mpsc::unbounded_channel();
            writers.push(tokio::spawn(writer.run(receiver)));
            queues.push(queue);
        }
        drop(api);
        let mut durable = Vec::new();
        for (index, &shard) in shards.iter().enumerate() {
            let (sender, stored) = oneshot::channel();
            let record = OperationRecord {
                volume_name: format!("pvc-{index}"),
                ..OperationRecord::default()
            };
            let queued = Queued {
                change: Change::Upsert(record),
                durable: Some(sender),
            };
            queues[shard].send(queued).expect("shard writer running");
            durable.push(stored);
            tokio::time::sleep(gap).await;
        }
        for stored in durable {
            stored.await.expect("record stored");
        }
        drop(queues);
        for writer in writers {
            writer.await.expect("shard writer");
        }
        apiserver.await.expect("API server")
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_of_records_shares_spaced_writes() {
        let ms = Duration::from_millis;
        // 11 claims over 100 ms at the default QPS: the first alone, then the other ten.
        assert_eq!(writes_for(&[0; 11], ms(10), ms(200)).await, 2);
        // The same burst at the lower bound (QPS 50 and above): one write per 20 ms.
        assert_eq!(writes_for(&[0; 11], ms(10), ms(20)).await, 6);
    }

    #[tokio::test(start_paused = true)]
    async fn a_shard_that_starts_filling_waits_for_the_last_write_of_another() {
        let ms = Duration::from_millis;
        // One record on shard 0, then ten on shard 1 over 100 ms, as when shard 0 fills up.
        // Shard 1 has never written, yet its first write waits for the spacing of shard 0's
        // and takes all ten: two writes, not three.
        let mut shards = vec![0];
        shards.extend([1; 10]);
        assert_eq!(writes_for(&shards, ms(10), ms(200)).await, 2);
    }

    /// A writer of shard `journal-0` against an API server that answers nothing: any request
    /// it sends hangs, so a test that finishes proves none was sent.
    fn silent_writer(
        slots: WriteSlots,
    ) -> (
        ShardWriter,
        mock::Handle<http::Request<Body>, http::Response<Body>>,
    ) {
        let (service, handle) = mock::pair::<http::Request<Body>, http::Response<Body>>();
        let writer = ShardWriter {
            api: Api::namespaced(ClientBuilder::new(service, "default").build(), "default"),
            rate_limit: RateLimitLayer::from_flags(5.0, 10),
            name: "journal-0".to_owned(),
            driver: "driver".to_owned(),
            labels: Default::default(),
            current: None,
            slots,
        };
        (writer, handle)
    }

    #[tokio::test(start_paused = true)]
    async fn a_flush_with_nothing_held_back_is_answered_at_once_without_a_write() {
        // Another shard has just written: a write of this one would wait for the spacing.
        let slots = WriteSlots::new(Duration::from_millis(200));
        slots.next().await;
        let (writer, _apiserver) = silent_writer(slots);
        let (queue, receiver) = mpsc::unbounded_channel();
        tokio::spawn(writer.run(receiver));
        let (durable, stored) = oneshot::channel();
        let flush = Queued {
            change: Change::Flush,
            durable: Some(durable),
        };
        queue.send(flush).expect("writer running");
        tokio::time::timeout(Duration::from_millis(1), stored)
            .await
            .expect("answered without waiting for a write slot or a request")
            .expect("answered");
    }

    #[test]
    fn writes_are_spaced_by_one_token_within_bounds() {
        let ms = Duration::from_millis;
        // --kube-api-qps 5 (the default), 50, 500, and no limit at all.
        assert_eq!(write_spacing(Some(ms(200))), ms(200));
        assert_eq!(write_spacing(Some(ms(20))), ms(20));
        assert_eq!(write_spacing(Some(ms(2))), MIN_WRITE_SPACING);
        assert_eq!(write_spacing(None), MIN_WRITE_SPACING);
        // --kube-api-qps 0.1: a token every 10 s, but a claim must not wait that long.
        assert_eq!(
            write_spacing(Some(Duration::from_secs(10))),
            MAX_WRITE_SPACING
        );
    }
}
