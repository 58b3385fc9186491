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

fn answer(send: tower_test::mock::SendResponse<http::Response<Body>>, status: u16, body: String) {
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
        known_volume_id: None,
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
