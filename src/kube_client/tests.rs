use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use tower::ServiceExt;
use tower_test::mock;

use super::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn spare_capacity_means_a_full_bucket() {
    let t0 = Instant::now();
    let mut bucket = TokenBucket::new(2.0, 1, t0);
    assert!(bucket.has_spare(t0));
    assert_eq!(bucket.take(t0), None);
    assert!(!bucket.has_spare(t0), "the only token is gone");
    assert!(bucket.take(t0).is_some(), "this request now waits");
    assert!(
        !bucket.has_spare(t0 + Duration::from_millis(500)),
        "the refill is owed to the waiter"
    );
    assert!(bucket.has_spare(t0 + Duration::from_secs(1)));

    let mut bucket = TokenBucket::new(5.0, 10, t0);
    assert_eq!(bucket.take(t0), None);
    assert!(
        !bucket.has_spare(t0),
        "nine tokens are left, but they belong to a burst in progress"
    );
    assert!(!bucket.has_spare(t0 + ms(199)));
    assert!(
        bucket.has_spare(t0 + ms(200)),
        "the spent token is earned back"
    );
}

#[test]
fn bucket_starts_full_then_refills_at_qps() {
    let t0 = Instant::now();
    let mut b = TokenBucket::new(2.0, 3, t0);
    assert_eq!(b.take(t0), None);
    assert_eq!(b.take(t0), None);
    assert_eq!(b.take(t0), None);
    // Empty: the 4th waits one refill interval (1/qps), the 5th (reserved behind it) two.
    assert_eq!(b.take(t0), Some(ms(500)));
    assert_eq!(b.take(t0), Some(ms(1000)));
    // After 1 s both reservations are paid off and the bucket is at 0.
    assert_eq!(b.take(t0 + ms(1000)), Some(ms(500)));
    // Long idle: refills, capped at burst.
    let later = t0 + Duration::from_secs(60);
    for _ in 0..3 {
        assert_eq!(b.take(later), None);
    }
    assert_eq!(b.take(later), Some(ms(500)));
}

#[test]
fn bucket_ignores_time_going_backwards_and_caps_waits() {
    let t0 = Instant::now() + Duration::from_secs(10);
    let mut b = TokenBucket::new(1.0, 1, t0);
    assert_eq!(b.take(t0), None);
    assert_eq!(b.take(t0 - ms(5000)), Some(ms(1000)));
    let mut slow = TokenBucket::new(1e-12, 1, t0);
    assert_eq!(slow.take(t0), None);
    assert_eq!(slow.take(t0), Some(MAX_WAIT));
}

#[test]
fn flag_defaults_follow_client_go() {
    assert!(RateLimitLayer::from_flags(-1.0, 10).bucket.is_none());
    assert!(RateLimitLayer::from_flags(f64::NAN, 10).bucket.is_none());
    let qps_and_burst = |l: RateLimitLayer| {
        let b = l.bucket.expect("limited");
        let b = b.lock().expect("not poisoned");
        (b.qps, b.burst)
    };
    assert_eq!(
        qps_and_burst(RateLimitLayer::from_flags(0.0, 0)),
        (5.0, 10.0)
    );
    assert_eq!(
        qps_and_burst(RateLimitLayer::from_flags(20.0, 40)),
        (20.0, 40.0)
    );
}

#[test]
fn token_interval_is_one_over_qps() {
    assert_eq!(
        RateLimitLayer::from_flags(0.0, 0).token_interval(),
        Some(ms(200))
    );
    assert_eq!(
        RateLimitLayer::from_flags(500.0, 1000).token_interval(),
        Some(ms(2))
    );
    assert_eq!(
        RateLimitLayer::from_flags(1e-12, 1).token_interval(),
        Some(MAX_WAIT)
    );
    assert_eq!(RateLimitLayer::unlimited().token_interval(), None);
}

#[test]
fn config_source_rules() {
    use ConfigSource::*;
    assert_eq!(ConfigSource::decide("", "", None), InCluster);
    assert_eq!(ConfigSource::decide("", "", Some("")), InCluster);
    assert_eq!(
        ConfigSource::decide("/flag", "", Some("/env")),
        Explicit {
            kubeconfig: Some("/env".into()),
            master: None
        }
    );
    assert_eq!(
        ConfigSource::decide("/flag", "https://m", None),
        Explicit {
            kubeconfig: Some("/flag".into()),
            master: Some("https://m".into())
        }
    );
    assert_eq!(
        ConfigSource::decide("", "http://m:8080", None),
        Explicit {
            kubeconfig: None,
            master: Some("http://m:8080".into())
        }
    );
}

#[tokio::test]
async fn master_only_config_and_bad_inputs() {
    let src = ConfigSource::decide("", "http://127.0.0.1:8080", None);
    let config = src.load().await.expect("loads");
    assert_eq!(config.cluster_url.to_string(), "http://127.0.0.1:8080/");
    let bad = ConfigSource::decide("", "http://bad url", None)
        .load()
        .await;
    assert!(matches!(bad, Err(KubeClientError::Master { .. })));
    let missing = ConfigSource::decide("/nonexistent/kubeconfig", "", None)
        .load()
        .await;
    assert!(matches!(missing, Err(KubeClientError::Kubeconfig { .. })));
}

#[tokio::test]
async fn kubeconfig_with_master_override() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("kubeconfig");
    std::fs::write(
        &path,
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
             clusters: [{name: k, cluster: {server: 'https://from-file:6443'}}]\n\
             users: [{name: u, user: {token: t}}]\n\
             contexts: [{name: c, context: {cluster: k, user: u}}]\n",
    )
    .expect("write");
    let path = path.to_str().expect("utf-8 path");
    let file_only = ConfigSource::decide(path, "", None)
        .load()
        .await
        .expect("loads");
    assert_eq!(file_only.cluster_url.to_string(), "https://from-file:6443/");
    let overridden = ConfigSource::decide(path, "https://flag:6443", None)
        .load()
        .await
        .expect("loads");
    assert_eq!(overridden.cluster_url.to_string(), "https://flag:6443/");
}

/// Answers every request on `handle` with the request itself.
fn echo(mut handle: mock::Handle<u32, u32>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while let Some((req, send)) = handle.next_request().await {
            send.send_response(req);
        }
    })
}

#[tokio::test(start_paused = true)]
async fn layer_delays_requests_beyond_the_burst() {
    let (mock, handle) = mock::pair::<u32, u32>();
    let mut svc = RateLimitLayer::from_flags(2.0, 3).layer(mock);
    let responder = echo(handle);
    let start = Instant::now();
    let mut sent_at = Vec::new();
    for i in 0..5 {
        let resp = svc
            .ready()
            .await
            .expect("ready")
            .call(i)
            .await
            .expect("response");
        assert_eq!(resp, i);
        sent_at.push(start.elapsed());
    }
    assert_eq!(sent_at, vec![ms(0), ms(0), ms(0), ms(500), ms(1000)]);
    drop(svc);
    responder.await.expect("responder");
}

#[tokio::test(start_paused = true)]
async fn acquired_tokens_come_out_of_the_layers_bucket() {
    let limit = RateLimitLayer::from_flags(2.0, 2);
    let (mock, handle) = mock::pair::<u32, u32>();
    let mut svc = limit.layer(mock);
    let responder = echo(handle);
    let start = Instant::now();
    limit.acquire().await;
    limit.acquire().await;
    assert_eq!(start.elapsed(), ms(0), "the burst");
    svc.ready()
        .await
        .expect("ready")
        .call(1)
        .await
        .expect("response");
    assert_eq!(
        start.elapsed(),
        ms(500),
        "the layer waits for what acquire took"
    );
    limit.acquire().await;
    assert_eq!(start.elapsed(), ms(1000));
    RateLimitLayer::unlimited().acquire().await;
    assert_eq!(start.elapsed(), ms(1000), "no limit, no wait");
    drop(svc);
    responder.await.expect("responder");
}

#[tokio::test(start_paused = true)]
async fn clones_share_one_bucket() {
    let (mock, handle) = mock::pair::<u32, u32>();
    let layer = RateLimitLayer::from_flags(1.0, 1);
    let mut a = layer.layer(mock.clone());
    let mut b = layer.layer(mock);
    echo(handle);
    let start = Instant::now();
    a.ready()
        .await
        .expect("ready")
        .call(1)
        .await
        .expect("response");
    b.ready()
        .await
        .expect("ready")
        .call(2)
        .await
        .expect("response");
    assert_eq!(start.elapsed(), ms(1000));
}

#[tokio::test(start_paused = true)]
async fn unlimited_layer_never_waits() {
    let (mock, handle) = mock::pair::<u32, u32>();
    let mut svc = RateLimitLayer::unlimited().layer(mock);
    echo(handle);
    let start = Instant::now();
    for i in 0..50 {
        svc.ready()
            .await
            .expect("ready")
            .call(i)
            .await
            .expect("response");
    }
    assert_eq!(start.elapsed(), Duration::ZERO);
}

#[derive(clap::Parser)]
struct LimitFlags {
    #[command(flatten)]
    client: ClientArgs,
    #[command(flatten)]
    capacity: CapacityArgs,
}

/// Each client's limiter follows its own flags: the capacity client's the capacity
/// qps/burst, the main client's `--kube-api-qps`/`--kube-api-burst`, and draining one
/// bucket does not slow the other.
#[tokio::test(start_paused = true)]
async fn the_capacity_client_is_limited_by_its_own_flags() {
    use clap::Parser as _;
    let flags = LimitFlags::try_parse_from([
        "csi-provisioner",
        "--kube-api-qps=1",
        "--kube-api-burst=2",
        "--kube-api-capacity-qps=4",
        "--kube-api-capacity-burst=3",
    ])
    .expect("flags parse");
    let limits = Limits::from_flags(&flags.client, Some(&flags.capacity));
    let capacity = limits.capacity.expect("a capacity limiter");
    let start = Instant::now();
    for _ in 0..3 {
        capacity.acquire().await;
    }
    assert_eq!(start.elapsed(), ms(0), "the capacity burst is 3");
    capacity.acquire().await;
    assert_eq!(start.elapsed(), ms(250), "the capacity qps is 4");
    limits.main.acquire().await;
    limits.main.acquire().await;
    assert_eq!(start.elapsed(), ms(250), "the main burst is 2, untouched");
    limits.main.acquire().await;
    assert_eq!(start.elapsed(), ms(1250), "the main qps is 1");
    assert!(
        Limits::from_flags(&flags.client, None).capacity.is_none(),
        "no capacity client without --enable-capacity"
    );
}

/// The layer sits under a real `kube::Client`: every API call is throttled.
#[tokio::test(start_paused = true)]
async fn kube_client_requests_are_throttled() {
    let (mock, mut handle) =
        mock::pair::<http::Request<kube::client::Body>, http::Response<kube::client::Body>>();
    let client = ClientBuilder::new(mock, "default")
        .with_layer(&RateLimitLayer::from_flags(1.0, 1))
        .build();
    let apiserver = tokio::spawn(async move {
        let mut paths = Vec::new();
        while let Some((req, send)) = handle.next_request().await {
            paths.push(req.uri().path().to_owned());
            let cm = serde_json::json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "x", "namespace": "default"}
            });
            let body = serde_json::to_vec(&cm).expect("json");
            send.send_response(
                http::Response::builder()
                    .body(kube::client::Body::from(body))
                    .expect("response"),
            );
        }
        paths
    });
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    let start = Instant::now();
    for _ in 0..3 {
        api.get("x").await.expect("get");
    }
    assert_eq!(start.elapsed(), ms(2000));
    drop(api);
    let paths = apiserver.await.expect("apiserver task");
    assert_eq!(paths, vec!["/api/v1/namespaces/default/configmaps/x"; 3]);
}
