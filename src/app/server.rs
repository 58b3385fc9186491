//! The diagnostics HTTP server, started before leader election so every replica serves.

use std::sync::{Arc, OnceLock};

use tokio::task::JoinSet;

use super::error::AppError;
use crate::config::HttpArgs;
use crate::http;
use crate::leader::LeaderWatch;
use crate::metrics::Metrics;

/// Binds `--http-endpoint` (or `--metrics-address`) and serves in a task of `tasks`; the task
/// only ends when the server fails. A listen failure is an error at start, as upstream.
/// `leader_watch` is filled once the elector exists; until then the health path is healthy.
pub(super) async fn start(
    args: &HttpArgs,
    leader_election: bool,
    metrics: &Arc<Metrics>,
    leader_watch: &Arc<OnceLock<LeaderWatch>>,
    tasks: &mut JoinSet<Result<(), AppError>>,
) -> Result<(), AppError> {
    let Some(plan) = http::ServerPlan::from_args(args, leader_election) else {
        if args.enable_pprof {
            // Upstream ignores the flag silently then; an operator who asked for it is told.
            tracing::warn!(
                "--enable-pprof has no effect without --http-endpoint or --metrics-address"
            );
        }
        return Ok(());
    };
    let listener = http::bind(&plan.address).await.map_err(AppError::Http)?;
    let encoder_metrics = Arc::clone(metrics);
    let health_watch = Arc::clone(leader_watch);
    let router = http::router(
        &plan,
        Arc::new(move || encoder_metrics.encode()),
        Metrics::CONTENT_TYPE,
        Arc::new(move || {
            health_watch.get().map_or(Ok(()), |watch| {
                watch.health_check(tokio::time::Instant::now())
            })
        }),
    );
    tasks.spawn(async move {
        http::serve(listener, router, std::future::pending())
            .await
            .map_err(AppError::Http)
    });
    Ok(())
}
