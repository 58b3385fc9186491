//! The diagnostics HTTP server on `--http-endpoint` (or the deprecated `--metrics-address`):
//! metrics on `--metrics-path` and, with `--http-endpoint` and `--leader-election`,
//! `/healthz/leader-election`, and with `--enable-pprof` the profiling endpoints under
//! `/debug/pprof/` (`crate::profiling`). It starts before leader election, so every replica
//! serves. There is no generic `/healthz` or `/readyz`, as upstream.

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;

use crate::config::{HttpArgs, LEADER_HEALTH_PATH};
use crate::profiling;

/// Renders the metrics exposition on each scrape.
pub type MetricsEncoder = Arc<dyn Fn() -> String + Send + Sync>;

/// `Err(reason)` makes the health path answer 500.
pub type HealthCheck = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("cannot listen on {address:?}: {source}")]
    Listen {
        address: String,
        #[source]
        source: std::io::Error,
    },
    #[error("HTTP server failed: {0}")]
    Serve(#[source] std::io::Error),
}

/// Whether and where to serve, decided from the flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerPlan {
    pub address: String,
    pub metrics_path: String,
    /// Serve `/healthz/leader-election` (only with `--http-endpoint` and leader election).
    pub leader_health: bool,
    /// Serve `/debug/pprof/` (`--enable-pprof`).
    pub pprof: bool,
}

impl ServerPlan {
    /// `None` when neither `--http-endpoint` nor `--metrics-address` is set.
    /// `leader_election`: whether `--leader-election` is on.
    pub fn from_args(args: &HttpArgs, leader_election: bool) -> Option<Self> {
        let (address, leader_health) = if !args.http_endpoint.is_empty() {
            (args.http_endpoint.clone(), leader_election)
        } else if !args.metrics_address.is_empty() {
            (args.metrics_address.clone(), false)
        } else {
            return None;
        };
        Some(Self {
            address,
            metrics_path: args.metrics_path.clone(),
            leader_health,
            pprof: args.enable_pprof,
        })
    }
}

/// The routes. `leader_health` is only consulted when the plan asks for the path; main
/// passes a check that reports healthy until the elector exists, as upstream.
pub fn router(
    plan: &ServerPlan,
    metrics: MetricsEncoder,
    content_type: &'static str,
    leader_health: HealthCheck,
) -> Router {
    let mut router = Router::new().route(
        &plan.metrics_path,
        get(move || {
            let metrics = metrics.clone();
            async move { ([(header::CONTENT_TYPE, content_type)], metrics()) }
        }),
    );
    if plan.pprof {
        router = router.merge(profiling::routes());
    }
    if plan.leader_health {
        router = router.route(
            LEADER_HEALTH_PATH,
            get(move || {
                let check = leader_health.clone();
                async move { health_response(check()) }
            }),
        );
    }
    router
}

fn health_response(result: Result<(), String>) -> Response {
    let text = [(header::CONTENT_TYPE, "text/plain; charset=utf-8")];
    match result {
        Ok(()) => (StatusCode::OK, text, "ok").into_response(),
        Err(reason) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            text,
            format!("internal server error: {reason}\n"),
        )
            .into_response(),
    }
}

/// Binds like Go's `net.Listen("tcp", addr)`: `:port` means every interface (IPv6 and IPv4
/// when available, else IPv4), `host:port` resolves the host.
pub async fn bind(address: &str) -> Result<TcpListener, HttpError> {
    let err = |source| HttpError::Listen {
        address: address.to_owned(),
        source,
    };
    match address.strip_prefix(':') {
        Some(port) => match TcpListener::bind(format!("[::]:{port}")).await {
            Ok(l) => Ok(l),
            Err(_) => TcpListener::bind(format!("0.0.0.0:{port}"))
                .await
                .map_err(err),
        },
        None => TcpListener::bind(address).await.map_err(err),
    }
}

/// Serves until `shutdown` resolves (main usually passes a future that never does: the
/// server lives as long as the process).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), HttpError> {
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(HttpError::Serve)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::*;

    fn args(http_endpoint: &str, metrics_address: &str) -> HttpArgs {
        HttpArgs {
            http_endpoint: http_endpoint.into(),
            metrics_address: metrics_address.into(),
            metrics_path: "/metrics".into(),
            enable_pprof: false,
        }
    }

    #[test]
    fn plan_follows_upstream_rules() {
        assert_eq!(ServerPlan::from_args(&args("", ""), true), None);
        let p = ServerPlan::from_args(&args(":8080", ""), true).expect("plan");
        assert_eq!(p.address, ":8080");
        assert!(p.leader_health);
        let p = ServerPlan::from_args(&args(":8080", ""), false).expect("plan");
        assert!(!p.leader_health);
        // The deprecated flag never gets the health path.
        let p = ServerPlan::from_args(&args("", ":9090"), true).expect("plan");
        assert_eq!(p.address, ":9090");
        assert!(!p.leader_health);
        assert_eq!(p.metrics_path, "/metrics");
        assert!(!p.pprof);
        let mut with_pprof = args("", ":9090");
        with_pprof.enable_pprof = true;
        assert!(
            ServerPlan::from_args(&with_pprof, false)
                .expect("plan")
                .pprof
        );
        with_pprof.metrics_address.clear();
        assert_eq!(ServerPlan::from_args(&with_pprof, false), None);
    }

    async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String, String) {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        let req = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
        stream.write_all(req.as_bytes()).await.expect("write");
        let mut raw = String::new();
        stream.read_to_string(&mut raw).await.expect("read");
        let (head, body) = raw.split_once("\r\n\r\n").expect("http response");
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .expect("status code");
        (status, head.to_ascii_lowercase(), body.to_owned())
    }

    /// The content type the sidecar serves its metrics with (`Metrics::CONTENT_TYPE`).
    const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

    async fn start(plan: &ServerPlan, healthy: Arc<AtomicBool>) -> std::net::SocketAddr {
        let metrics: MetricsEncoder = Arc::new(|| "# TYPE up gauge\nup 1\n".to_owned());
        let check: HealthCheck = Arc::new(move || {
            if healthy.load(Ordering::SeqCst) {
                Ok(())
            } else {
                Err("leader has not renewed lease ns/l for 40s".into())
            }
        });
        let listener = bind(&plan.address).await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let app = router(plan, metrics, PROMETHEUS_TEXT, check);
        tokio::spawn(serve(listener, app, std::future::pending()));
        addr
    }

    #[tokio::test]
    async fn serves_metrics_and_leader_health() {
        let plan = ServerPlan {
            address: "127.0.0.1:0".into(),
            metrics_path: "/custom-metrics".into(),
            leader_health: true,
            pprof: false,
        };
        let healthy = Arc::new(AtomicBool::new(true));
        let addr = start(&plan, healthy.clone()).await;

        let (status, head, body) = get(addr, "/custom-metrics").await;
        assert_eq!(status, 200);
        assert!(
            head.contains("content-type: text/plain; version=0.0.4"),
            "{head}"
        );
        assert_eq!(body, "# TYPE up gauge\nup 1\n");

        assert_eq!(get(addr, LEADER_HEALTH_PATH).await.0, 200);
        assert_eq!(get(addr, LEADER_HEALTH_PATH).await.2, "ok");
        healthy.store(false, Ordering::SeqCst);
        let (status, _, body) = get(addr, LEADER_HEALTH_PATH).await;
        assert_eq!(status, 500);
        assert_eq!(
            body,
            "internal server error: leader has not renewed lease ns/l for 40s\n"
        );

        // No other paths, as upstream.
        assert_eq!(get(addr, "/metrics").await.0, 404);
        assert_eq!(get(addr, "/healthz").await.0, 404);
        for path in ["/debug/pprof/", "/debug/pprof/heap", "/debug/pprof/profile"] {
            assert_eq!(
                get(addr, path).await.0,
                404,
                "{path} without --enable-pprof"
            );
        }
    }

    #[tokio::test]
    async fn enable_pprof_serves_the_profiling_index_heap_and_cmdline() {
        let plan = ServerPlan {
            address: "127.0.0.1:0".into(),
            metrics_path: "/metrics".into(),
            leader_health: false,
            pprof: true,
        };
        let addr = start(&plan, Arc::new(AtomicBool::new(true))).await;
        let (status, head, body) = get(addr, "/debug/pprof/").await;
        assert_eq!(status, 200);
        assert!(head.contains("content-type: text/html"), "{head}");
        assert!(body.contains("profile?seconds=30"), "{body}");
        let (status, _, body) = get(addr, "/debug/pprof/heap").await;
        assert_eq!(status, 200);
        assert!(body.contains("# VmRSS: "), "{body}");
        assert_eq!(get(addr, "/debug/pprof/cmdline").await.0, 200);
        // Go-runtime profiles have no counterpart.
        assert_eq!(get(addr, "/debug/pprof/goroutine").await.0, 404);
        assert_eq!(get(addr, "/metrics").await.0, 200);
    }

    #[tokio::test]
    async fn no_health_path_without_leader_health() {
        let plan = ServerPlan {
            address: "127.0.0.1:0".into(),
            metrics_path: "/metrics".into(),
            leader_health: false,
            pprof: false,
        };
        let addr = start(&plan, Arc::new(AtomicBool::new(false))).await;
        assert_eq!(get(addr, "/metrics").await.0, 200);
        assert_eq!(get(addr, LEADER_HEALTH_PATH).await.0, 404);
    }

    #[tokio::test]
    async fn listen_failure_is_a_typed_error() {
        let taken = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = taken.local_addr().expect("addr").to_string();
        match bind(&addr).await {
            Err(HttpError::Listen { address, .. }) => assert_eq!(address, addr),
            other => panic!("expected a listen error, got {other:?}"),
        }
        assert!(matches!(
            bind("no-such-host.invalid:80").await,
            Err(HttpError::Listen { .. })
        ));
    }

    #[tokio::test]
    async fn colon_port_listens_on_all_interfaces() {
        let listener = bind(":0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        assert!(TcpStream::connect(("127.0.0.1", port)).await.is_ok());
    }
}
