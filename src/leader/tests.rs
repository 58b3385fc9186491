use http::{Method, Request, Response, StatusCode};
use kube::client::Body;
use tower_test::mock;

use super::*;

fn wall(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).expect("valid")
}

fn record(holder: &str, secs: i32, transitions: i32) -> LeaseRecord {
    LeaseRecord {
        holder: holder.into(),
        lease_duration_seconds: secs,
        acquire_time: Some(wall(0)),
        renew_time: Some(wall(1)),
        transitions,
    }
}

#[test]
fn names_are_sanitized_like_csi_lib_utils() {
    assert_eq!(lease_name("hostpath.csi.k8s.io"), "hostpath-csi-k8s-io");
    assert_eq!(lease_name("example.com/driver"), "example-com-driver");
    assert_eq!(lease_name("drv."), "drv-X");
    assert_eq!(sanitize_name("node_1.example"), "node-1-example");
    assert_eq!(sanitize_name("ünï"), "-n-X");
    assert_eq!(sanitize_name("Pod-0"), "Pod-0");
    assert_eq!(sanitize_name(""), "X");
}

#[test]
fn namespace_resolution_order() {
    assert_eq!(resolve_namespace("flag", Some("env"), Some("sa")), "flag");
    assert_eq!(resolve_namespace("", Some("env"), Some("sa")), "env");
    assert_eq!(resolve_namespace("", Some(""), Some("sa\n")), "sa");
    assert_eq!(resolve_namespace("", None, Some(" \n")), "default");
    assert_eq!(resolve_namespace("", None, None), "default");
}

#[test]
fn free_lease_is_taken_with_a_new_transition() {
    let t0 = Instant::now();
    let obs = Observed {
        record: record("", 1, 4),
        at: t0,
    };
    let Decision::Take(r) = decide(&obs, t0, wall(10), "me", 15) else {
        panic!("free lease must be taken")
    };
    assert_eq!(r.holder, "me");
    assert_eq!(r.lease_duration_seconds, 15);
    assert_eq!(r.transitions, 5);
    assert_eq!(r.acquire_time, Some(wall(10)));
    assert_eq!(r.renew_time, Some(wall(10)));
}

#[test]
fn foreign_lease_waits_until_unchanged_for_its_duration() {
    let t0 = Instant::now();
    let obs = Observed {
        record: record("other", 15, 2),
        at: t0,
    };
    let wait = Decision::Wait {
        holder: "other".into(),
    };
    assert_eq!(decide(&obs, t0, wall(0), "me", 15), wait);
    assert_eq!(
        decide(&obs, t0 + Duration::from_secs(14), wall(14), "me", 15),
        wait
    );
    let Decision::Take(r) = decide(&obs, t0 + Duration::from_secs(15), wall(15), "me", 15) else {
        panic!("expired lease must be taken")
    };
    assert_eq!((r.holder.as_str(), r.transitions), ("me", 3));
    assert_eq!(r.acquire_time, Some(wall(15)));
}

#[test]
fn own_lease_is_renewed_keeping_acquire_time_and_transitions() {
    let t0 = Instant::now();
    let obs = Observed {
        record: record("me", 15, 7),
        at: t0,
    };
    let Decision::Take(r) = decide(&obs, t0, wall(5), "me", 15) else {
        panic!("own lease must be renewed")
    };
    assert_eq!(r.transitions, 7);
    assert_eq!(r.acquire_time, Some(wall(0)));
    assert_eq!(r.renew_time, Some(wall(5)));
}

#[test]
fn released_lease_is_free_after_one_second() {
    let t0 = Instant::now();
    let released = released_record(&record("other", 15, 3), wall(9));
    assert_eq!(released.holder, "");
    assert_eq!(released.lease_duration_seconds, 1);
    assert_eq!(released.transitions, 3);
    // Empty holder: taken at once, whatever the duration.
    let obs = Observed {
        record: released,
        at: t0,
    };
    assert!(matches!(
        decide(&obs, t0, wall(9), "me", 15),
        Decision::Take(_)
    ));
}

#[test]
fn observation_time_moves_only_when_the_record_changes() {
    let t0 = Instant::now();
    let t1 = t0 + Duration::from_secs(3);
    let first = Observed::update(None, record("other", 15, 1), t0);
    let same = Observed::update(Some(first.clone()), record("other", 15, 1), t1);
    assert_eq!(same.at, t0);
    let mut renewed = record("other", 15, 1);
    renewed.renew_time = Some(wall(2));
    let changed = Observed::update(Some(first), renewed, t1);
    assert_eq!(changed.at, t1);
}

#[test]
fn apply_record_sets_spec_and_merges_labels() {
    let mut lease = Lease::default();
    lease.metadata.labels = Some(BTreeMap::from([("keep".into(), "1".into())]));
    let labels = BTreeMap::from([("team".into(), "storage".into())]);
    let rec = record("me", 15, 2);
    apply_record(&mut lease, &rec, &labels);
    assert_eq!(LeaseRecord::of(&lease), rec);
    assert_eq!(
        lease.metadata.labels,
        Some(BTreeMap::from([
            ("keep".into(), "1".into()),
            ("team".into(), "storage".into())
        ]))
    );
}

#[test]
fn health_fails_only_for_a_stale_leader() {
    let t0 = Instant::now();
    let d = Duration::from_secs(15);
    let later = t0 + Duration::from_secs(36);
    assert_eq!(health(None, later, d, HEALTH_TOLERANCE, "ns/l"), Ok(()));
    assert_eq!(
        health(
            Some(t0),
            t0 + Duration::from_secs(35),
            d,
            HEALTH_TOLERANCE,
            "ns/l"
        ),
        Ok(())
    );
    let err = health(Some(t0), later, d, HEALTH_TOLERANCE, "ns/l").expect_err("stale");
    assert!(err.contains("ns/l"), "{err}");
}

fn test_config() -> LeaderConfig {
    LeaderConfig {
        lease_name: "hostpath-csi-k8s-io".into(),
        namespace: "kube-system".into(),
        identity: "pod-a".into(),
        lease_duration: Duration::from_secs(15),
        renew_deadline: Duration::from_secs(10),
        retry_period: Duration::from_secs(2),
        labels: BTreeMap::from([("app".into(), "csi".into())]),
        event_component: event_component("hostpath.csi.k8s.io", "Pod_A.local"),
    }
}

type Handle = mock::Handle<Request<Body>, Response<Body>>;
type Send = tower_test::mock::SendResponse<Response<Body>>;

/// The next Lease request; Events posted before it are answered and kept in `events`.
async fn next_lease_request(
    handle: &mut Handle,
    events: &mut Vec<serde_json::Value>,
) -> (Request<Body>, Send) {
    loop {
        let (req, send) = handle.next_request().await.expect("a request");
        if req.uri().path() == "/api/v1/namespaces/kube-system/events" {
            assert_eq!(req.method(), Method::POST);
            let event = body_json(req).await;
            send.send_response(json_response(StatusCode::CREATED, &event));
            events.push(event);
        } else {
            return (req, send);
        }
    }
}

/// The slow-path counter's value.
fn slowpath(metrics: &Metrics) -> String {
    let text = metrics.encode();
    text.lines()
        .find_map(|l| l.strip_prefix("leader_election_slowpath_total{name=\"\"} "))
        .unwrap_or_else(|| panic!("no slowpath series in\n{text}"))
        .to_owned()
}

#[test]
fn event_component_keeps_the_raw_hostname() {
    assert_eq!(
        event_component("example.com/driver", "Node_1.example"),
        "example.com-driver/Node_1.example"
    );
}

fn json_response(status: StatusCode, value: &serde_json::Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .body(Body::from(serde_json::to_vec(value).expect("json")))
        .expect("response")
}

async fn body_json(req: Request<Body>) -> serde_json::Value {
    let bytes = req.into_body().collect_bytes().await.expect("body");
    serde_json::from_slice(&bytes).expect("json body")
}

const PATH: &str = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases";

/// Answers the GET with 404 and the POST with the created Lease (resourceVersion 1).
async fn acquire_by_create(handle: &mut Handle) {
    let (req, send) = handle.next_request().await.expect("get");
    assert_eq!(req.method(), Method::GET);
    assert_eq!(req.uri().path(), format!("{PATH}/hostpath-csi-k8s-io"));
    send.send_response(json_response(
        StatusCode::NOT_FOUND,
        &serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "reason": "NotFound", "code": 404, "message": "not found"}),
    ));
    let (req, send) = handle.next_request().await.expect("create");
    assert_eq!(req.method(), Method::POST);
    assert_eq!(req.uri().path(), PATH);
    let mut lease = body_json(req).await;
    assert_eq!(lease["spec"]["holderIdentity"], "pod-a");
    assert_eq!(lease["spec"]["leaseDurationSeconds"], 15);
    assert_eq!(lease["spec"]["leaseTransitions"], 0);
    assert_eq!(lease["metadata"]["labels"]["app"], "csi");
    lease["metadata"]["resourceVersion"] = "1".into();
    lease["metadata"]["uid"] = "lease-uid".into();
    send.send_response(json_response(StatusCode::CREATED, &lease));
}

/// Acquire by creating the Lease, renew via the fast path (no GET), release on stop.
#[tokio::test(start_paused = true)]
async fn create_renew_release_against_a_mock_apiserver() {
    let (mock, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(mock, "default");
    let metrics = Arc::new(Metrics::new());
    let (elector, view) = Elector::new(client, test_config(), Arc::clone(&metrics));
    assert!(
        metrics
            .encode()
            .contains("\nleader_election_master_status{name=\"\"} 0\n")
    );
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let mut leading = view.leading();
    let run = tokio::spawn(elector.run(async {
        let _ = stop_rx.await;
    }));
    let mut events = Vec::new();

    let apiserver = async {
        acquire_by_create(&mut handle).await;
        leading.wait_for(|l| *l).await.expect("became leader");
        assert!(
            metrics
                .encode()
                .contains("\nleader_election_master_status{name=\"\"} 1\n")
        );
        let first_renew = view.last_renew().expect("renewal time while leading");
        // One retry period later: a PUT carrying the resourceVersion we returned.
        let (req, send) = next_lease_request(&mut handle, &mut events).await;
        assert_eq!(req.method(), Method::PUT);
        let mut lease = body_json(req).await;
        assert_eq!(lease["metadata"]["resourceVersion"], "1");
        assert_eq!(lease["spec"]["holderIdentity"], "pod-a");
        assert_eq!(lease["spec"]["leaseTransitions"], 0);
        lease["metadata"]["resourceVersion"] = "2".into();
        send.send_response(json_response(StatusCode::OK, &lease));
        view.renewed
            .clone()
            .wait_for(|t| *t > Some(first_renew))
            .await
            .expect("renewed");
        let renewed = view.last_renew().expect("renewal time while leading");
        assert_eq!(
            renewed - first_renew,
            test_config().retry_period,
            "--leader-election-retry-period apart"
        );
        // Stop: the elector releases with the resourceVersion it wrote last.
        stop_tx.send(()).expect("elector running");
        let (req, send) = next_lease_request(&mut handle, &mut events).await;
        assert_eq!(req.method(), Method::PUT);
        let mut lease = body_json(req).await;
        assert_eq!(lease["metadata"]["resourceVersion"], "2");
        assert_eq!(lease["spec"]["holderIdentity"], "");
        assert_eq!(lease["spec"]["leaseDurationSeconds"], 1);
        lease["metadata"]["resourceVersion"] = "3".into();
        send.send_response(json_response(StatusCode::OK, &lease));
    };
    tokio::time::timeout(Duration::from_secs(5), apiserver)
        .await
        .expect("scenario finishes");
    let outcome = tokio::time::timeout(Duration::from_secs(5), run)
        .await
        .expect("run ends")
        .expect("task");
    assert_eq!(outcome, Outcome::Released);
    assert!(!view.is_leading());
    assert_eq!(view.last_renew(), None);
    assert_eq!(slowpath(&metrics), "0", "every renewal took the fast path");
    assert!(
        metrics
            .encode()
            .contains("\nleader_election_master_status{name=\"\"} 0\n")
    );

    // client-go's LeaderElection events, on the Lease as last written.
    let shown: Vec<(&str, &str)> = events
        .iter()
        .map(|e| {
            (
                e["reason"].as_str().unwrap_or_default(),
                e["message"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        shown,
        [
            ("LeaderElection", "pod-a became leader"),
            ("LeaderElection", "pod-a stopped leading")
        ]
    );
    for event in &events {
        assert_eq!(event["type"], "Normal");
        assert_eq!(event["metadata"]["namespace"], "kube-system");
        let object = &event["involvedObject"];
        assert_eq!(object["apiVersion"], "coordination.k8s.io/v1");
        assert_eq!(object["kind"], "Lease");
        assert_eq!(object["name"], "hostpath-csi-k8s-io");
        assert_eq!(object["namespace"], "kube-system");
        assert_eq!(object["uid"], "lease-uid");
        assert_eq!(
            event["source"],
            serde_json::json!({"component": "hostpath.csi.k8s.io/Pod_A.local"})
        );
    }
}

/// The optimistic renewal fails (someone else wrote the Lease, still naming us): the
/// elector reads the Lease and renews it after all, which client-go counts as its slow path.
#[tokio::test(start_paused = true)]
async fn a_failed_optimistic_renewal_takes_the_slow_path() {
    let (mock, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
    let metrics = Arc::new(Metrics::new());
    let (elector, view) = Elector::new(
        Client::new(mock, "default"),
        test_config(),
        Arc::clone(&metrics),
    );
    let mut leading = view.leading();
    let _run = tokio::spawn(elector.run(std::future::pending()));
    let mut events = Vec::new();
    acquire_by_create(&mut handle).await;
    leading.wait_for(|l| *l).await.expect("became leader");
    assert_eq!(slowpath(&metrics), "0");

    let (req, send) = next_lease_request(&mut handle, &mut events).await;
    assert_eq!(req.method(), Method::PUT, "optimistic renewal");
    let mut lease = body_json(req).await;
    send.send_response(json_response(
        StatusCode::CONFLICT,
        &serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "reason": "Conflict", "code": 409, "message": "the object has been modified"}),
    ));
    let (req, send) = next_lease_request(&mut handle, &mut events).await;
    assert_eq!(req.method(), Method::GET, "the slow path reads first");
    lease["metadata"]["resourceVersion"] = "5".into();
    send.send_response(json_response(StatusCode::OK, &lease));
    let (req, send) = next_lease_request(&mut handle, &mut events).await;
    assert_eq!(req.method(), Method::PUT);
    let mut renewed = body_json(req).await;
    assert_eq!(renewed["metadata"]["resourceVersion"], "5");
    renewed["metadata"]["resourceVersion"] = "6".into();
    send.send_response(json_response(StatusCode::OK, &renewed));
    let renewed_at = view.last_renew();
    view.renewed
        .clone()
        .wait_for(|t| *t > renewed_at)
        .await
        .expect("renewed");
    assert_eq!(slowpath(&metrics), "1");
    assert!(view.is_leading());
}

/// Every renewal fails: leadership is lost once the renew deadline has passed.
#[tokio::test(start_paused = true)]
async fn renewal_failures_past_the_deadline_lose_leadership() {
    let (mock, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
    let (elector, view) = Elector::new(
        Client::new(mock, "default"),
        test_config(),
        Arc::new(Metrics::new()),
    );
    let mut leading = view.leading();
    let run = tokio::spawn(elector.run(std::future::pending()));
    acquire_by_create(&mut handle).await;
    leading.wait_for(|l| *l).await.expect("became leader");
    let led_at = Instant::now();
    let apiserver = tokio::spawn(async move {
        let mut requests = 0;
        while let Some((_, send)) = handle.next_request().await {
            requests += 1;
            send.send_response(json_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                &serde_json::json!({"kind": "Status", "apiVersion": "v1",
                    "status": "Failure", "code": 500, "message": "etcd down"}),
            ));
        }
        requests
    });
    let outcome = run.await.expect("task");
    assert_eq!(outcome, Outcome::Lost);
    // First renewal after one retry period, then retries until the 10 s deadline.
    assert_eq!(led_at.elapsed(), Duration::from_secs(12));
    assert!(!view.is_leading());
    assert_eq!(view.health_check(Instant::now()), Ok(()));
    // Fast-path PUT + GET per attempt, attempts at 2, 4, ..., 12 s.
    assert!(apiserver.await.expect("apiserver") >= 6);
}

/// A Lease held by another replica is not touched; stop while campaigning releases nothing.
#[tokio::test]
async fn foreign_lease_is_left_alone() {
    let (mock, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
    let (elector, view) = Elector::new(
        Client::new(mock, "default"),
        test_config(),
        Arc::new(Metrics::new()),
    );
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(elector.run(async {
        let _ = stop_rx.await;
    }));
    let (req, send) = handle.next_request().await.expect("get");
    assert_eq!(req.method(), Method::GET);
    send.send_response(json_response(
        StatusCode::OK,
        &serde_json::json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "hostpath-csi-k8s-io", "namespace": "kube-system",
                         "resourceVersion": "7"},
            "spec": {"holderIdentity": "pod-b", "leaseDurationSeconds": 15,
                     "renewTime": "2026-01-01T00:00:00.000000Z", "leaseTransitions": 1}
        }),
    ));
    tokio::task::yield_now().await;
    stop_tx.send(()).expect("elector running");
    let outcome = tokio::time::timeout(Duration::from_secs(5), run)
        .await
        .expect("run ends")
        .expect("task");
    assert_eq!(outcome, Outcome::StoppedBeforeLeading);
    assert!(!view.is_leading());
}
