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
            let writer = writer(&api, &rate_limit, &slots, index, None);
            let (queue, receiver) = mpsc::unbounded_channel();
            writers.push(tokio::spawn(
                writer.run(receiver, mpsc::unbounded_channel().1),
            ));
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
                change: Change::Upsert(Box::new(record)),
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

    /// The writer of shard `journal-<index>` of driver `d`, holding `loaded`.
    fn writer(
        api: &Api<ProvisioningJournal>,
        rate_limit: &RateLimitLayer,
        slots: &WriteSlots,
        index: usize,
        loaded: Option<ProvisioningJournal>,
    ) -> ShardWriter {
        ShardWriter {
            api: api.clone(),
            rate_limit: rate_limit.clone(),
            name: format!("journal-{index}"),
            index,
            labels: BTreeMap::new(),
            state: ShardState::new("d", loaded),
            slots: slots.clone(),
            holdings: Arc::default(),
        }
    }

    type ApiServer = mock::Handle<http::Request<Body>, http::Response<Body>>;

    /// A writer of shard `journal-0`, holding `loaded`, and the API server it talks to, which
    /// answers only what a test tells it to (a request nobody answers hangs).
    fn writer_and_apiserver(
        slots: WriteSlots,
        loaded: Option<ProvisioningJournal>,
    ) -> (ShardWriter, ApiServer) {
        let (service, handle) = mock::pair::<http::Request<Body>, http::Response<Body>>();
        let api = Api::namespaced(ClientBuilder::new(service, "default").build(), "default");
        let rate_limit = RateLimitLayer::from_flags(5.0, 10);
        (writer(&api, &rate_limit, &slots, 0, loaded), handle)
    }

    /// The next request: its method and path, and its body as a shard (`None` without one).
    async fn next_request(
        apiserver: &mut ApiServer,
    ) -> (
        String,
        Option<ProvisioningJournal>,
        tower_test::mock::SendResponse<http::Response<Body>>,
    ) {
        let (request, send) = apiserver.next_request().await.expect("a request");
        let line = format!("{} {}", request.method(), request.uri().path());
        let body = request.into_body().collect_bytes().await.expect("body");
        (line, serde_json::from_slice(&body).ok(), send)
    }

    fn answer(
        send: tower_test::mock::SendResponse<http::Response<Body>>,
        status: u16,
        body: String,
    ) {
        let mut response = http::Response::new(Body::from(body.into_bytes()));
        *response.status_mut() = http::StatusCode::from_u16(status).expect("status");
        send.send_response(response);
    }

    fn not_found() -> String {
        serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "status": "Failure",
            "reason": "NotFound", "code": 404, "message": "not found",
        })
        .to_string()
    }

    /// Shard `journal-0` at `version`, holding `records`.
    fn shard(version: &str, records: Vec<OperationRecord>) -> ProvisioningJournal {
        let mut shard = ProvisioningJournal::new(
            "journal-0",
            super::super::record::ProvisioningJournalSpec {
                driver: "d".to_owned(),
                operations: records,
                ..Default::default()
            },
        );
        shard.metadata.resource_version = Some(version.to_owned());
        shard
    }

    fn record(volume: &str) -> OperationRecord {
        let operation = crate::journal::Operation {
            volume_name: volume.to_owned(),
            claim_namespace: "ns".to_owned(),
            claim_name: volume.to_owned(),
            claim_uid: format!("uid-{volume}"),
            class_name: "fast".to_owned(),
            request: crate::csi::CreateVolumeRequest {
                name: volume.to_owned(),
                ..Default::default()
            },
            provisioner_secret: None,
            attributes_class: None,
        };
        OperationRecord::from_operation(&operation, k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
    }

    fn volumes(shard: &ProvisioningJournal) -> Vec<&str> {
        shard
            .spec
            .operations
            .iter()
            .map(|record| record.volume_name.as_str())
            .collect()
    }

    fn durable(change: Change) -> (Queued, oneshot::Receiver<()>) {
        let (sender, stored) = oneshot::channel();
        let queued = Queued {
            change,
            durable: Some(sender),
        };
        (queued, stored)
    }

    #[tokio::test(start_paused = true)]
    async fn a_shard_deleted_behind_our_back_is_created_again_with_every_record_held() {
        let loaded = shard("1", vec![record("pvc-a"), record("pvc-b")]);
        let (writer, mut apiserver) =
            writer_and_apiserver(WriteSlots::new(MIN_WRITE_SPACING), Some(loaded));
        let (queue, receiver) = mpsc::unbounded_channel();
        tokio::spawn(writer.run(receiver, mpsc::unbounded_channel().1));
        let (upsert, mut stored) = durable(Change::Upsert(Box::new(record("pvc-c"))));
        queue.send(upsert).expect("writer running");

        let (line, _, send) = next_request(&mut apiserver).await;
        assert_eq!(
            line,
            "PUT /apis/provisioner.csi-rs.dev/v1alpha1/namespaces/default/provisioningjournals/journal-0"
        );
        answer(send, 404, not_found());
        let (line, body, send) = next_request(&mut apiserver).await;
        assert_eq!(
            line,
            "POST /apis/provisioner.csi-rs.dev/v1alpha1/namespaces/default/provisioningjournals"
        );
        let body = body.expect("a shard");
        assert_eq!(
            volumes(&body),
            ["pvc-a", "pvc-b", "pvc-c"],
            "rebuilt whole, not from the batch"
        );
        assert_eq!(body.metadata.resource_version, None);
        assert!(
            stored.try_recv().is_err(),
            "not durable before the API server answers"
        );
        answer(send, 201, serde_json::to_string(&body).expect("json"));
        stored.await.expect("durable once created");
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_waited_for_is_durable_only_once_written_even_if_it_changes_nothing_held() {
        let loaded = shard("1", vec![record("pvc-a")]);
        let (writer, mut apiserver) =
            writer_and_apiserver(WriteSlots::new(MIN_WRITE_SPACING), Some(loaded));
        let (queue, receiver) = mpsc::unbounded_channel();
        tokio::spawn(writer.run(receiver, mpsc::unbounded_channel().1));
        let (upsert, stored) = durable(Change::Upsert(Box::new(record("pvc-a"))));
        queue.send(upsert).expect("writer running");

        let (line, body, send) = next_request(&mut apiserver).await;
        assert!(line.starts_with("PUT "), "{line}");
        let body = body.expect("a shard");
        assert_eq!(body.metadata.resource_version.as_deref(), Some("1"));
        answer(send, 200, serde_json::to_string(&body).expect("json"));
        stored.await.expect("durable once acknowledged");
    }

    #[tokio::test(start_paused = true)]
    async fn a_record_someone_else_wrote_is_adopted_and_a_deleted_shard_rebuilt_at_once() {
        let loaded = shard("1", vec![record("pvc-a")]);
        let (writer, mut apiserver) =
            writer_and_apiserver(WriteSlots::new(MIN_WRITE_SPACING), Some(loaded));
        let holdings = writer.holdings.clone();
        let (_queue, receiver) = mpsc::unbounded_channel();
        let (observe, seen) = mpsc::unbounded_channel();
        tokio::spawn(writer.run(receiver, seen));

        observe
            .send(Observed::Version("1".to_owned()))
            .expect("running");
        observe
            .send(Observed::Version("2".to_owned()))
            .expect("running");
        let (line, _, send) = next_request(&mut apiserver).await;
        assert!(
            line.starts_with("GET "),
            "version 1 is ours, version 2 is read: {line}"
        );
        let theirs = shard("2", vec![record("pvc-a"), record("pvc-x")]);
        answer(send, 200, serde_json::to_string(&theirs).expect("json"));

        observe.send(Observed::Missing).expect("running");
        let (line, _, send) = next_request(&mut apiserver).await;
        assert!(line.starts_with("GET "), "{line}");
        assert!(holdings.registry.contains("pvc-x"), "adopted");
        answer(send, 404, not_found());
        let (line, body, _send) = next_request(&mut apiserver).await;
        assert!(line.starts_with("POST "), "{line}");
        assert_eq!(volumes(&body.expect("a shard")), ["pvc-a", "pvc-x"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_flush_with_nothing_held_back_is_answered_at_once_without_a_write() {
        // Another shard has just written: a write of this one would wait for the spacing.
        let slots = WriteSlots::new(Duration::from_millis(200));
        slots.next().await;
        let (writer, _apiserver) = writer_and_apiserver(slots, None);
        let (queue, receiver) = mpsc::unbounded_channel();
        tokio::spawn(writer.run(receiver, mpsc::unbounded_channel().1));
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
