//! `--enable-pprof`: profiling endpoints under Go's path prefix `/debug/pprof/`, on the
//! metrics server. What a Rust process can offer of Go's set: a CPU profile in pprof's
//! format (`profile`), heap statistics as text (`heap`), the command line (`cmdline`) and an
//! index. Go's runtime profiles (goroutine, allocs, block, mutex, threadcreate, trace,
//! symbol) have no counterpart and answer 404.

pub mod cpu;
pub mod heap;

use std::time::Duration;

use axum::Router;
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

/// Go's path prefix.
pub const PREFIX: &str = "/debug/pprof";

/// Go's default length of a CPU profile.
const DEFAULT_SECONDS: u64 = 30;

const INDEX: &str = "<html><head><title>/debug/pprof/</title></head><body>\n\
/debug/pprof/ of csi-provisioner (Rust): the profiles a Rust process can offer.<br>\n\
<a href=\"profile?seconds=30\">profile</a>: CPU profile in pprof format (gzip'd profile.proto), ?seconds=N (default 30)<br>\n\
<a href=\"heap\">heap</a>: heap statistics (text, not a pprof profile)<br>\n\
<a href=\"cmdline\">cmdline</a>: the command line<br>\n\
</body></html>\n";

/// The routes, to merge into the metrics server's router.
pub fn routes() -> Router {
    Router::new()
        .route(&format!("{PREFIX}/"), get(index))
        .route(&format!("{PREFIX}/profile"), get(cpu_profile))
        .route(&format!("{PREFIX}/heap"), get(heap_statistics))
        .route(&format!("{PREFIX}/cmdline"), get(cmdline))
}

async fn index() -> Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], INDEX).into_response()
}

/// `seconds=N` of the query; as Go, a missing, unparsable or zero value means 30.
fn seconds(query: Option<&str>) -> u64 {
    query
        .unwrap_or_default()
        .split('&')
        .find_map(|pair| pair.strip_prefix("seconds="))
        .and_then(|s| s.parse().ok())
        .filter(|&s| s > 0)
        .unwrap_or(DEFAULT_SECONDS)
}

async fn cpu_profile(uri: Uri) -> Response {
    let duration = Duration::from_secs(seconds(uri.query()));
    // Sampling sleeps and symbolizing is CPU work: neither belongs on the runtime's threads.
    match tokio::task::spawn_blocking(move || cpu::profile(duration)).await {
        Ok(Ok(profile)) => (
            [
                (header::CONTENT_TYPE, "application/octet-stream"),
                (
                    header::CONTENT_DISPOSITION,
                    "attachment; filename=\"profile\"",
                ),
            ],
            profile,
        )
            .into_response(),
        Ok(Err(error)) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{error}\n")).into_response(),
        Err(error) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("CPU profile failed: {error}\n"),
        )
            .into_response(),
    }
}

async fn heap_statistics() -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        heap::statistics(),
    )
        .into_response()
}

/// Go's format: the arguments separated by NUL bytes.
async fn cmdline() -> Response {
    let args: Vec<String> = std::env::args().collect();
    (
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        args.join("\0"),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_default_as_gos() {
        assert_eq!(seconds(None), 30);
        assert_eq!(seconds(Some("seconds=5")), 5);
        assert_eq!(seconds(Some("debug=1&seconds=7")), 7);
        assert_eq!(seconds(Some("seconds=0")), 30);
        assert_eq!(seconds(Some("seconds=-3")), 30);
        assert_eq!(seconds(Some("seconds=x")), 30);
    }
}
