//! Wiring of the sidecar: from validated flags to running controllers, and the two-stage
//! shutdown. `main.rs` only parses and checks flags and calls [`run`].
//!
//! Tasks never end the process themselves: the HTTP server and the other background tasks
//! report their failure here, which drains (the first shutdown stage) and then exits 1.

mod capacity_start;
mod driver;
mod error;
mod lease;
mod node;
mod server;
mod settings;

use std::future::Future;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use tokio::task::JoinSet;
use tracing::{error, info, warn};

use error::AppError;

use crate::config::Args;
use crate::controller;
use crate::csi_client::CsiController;
use crate::fence::LeaseFence;
use crate::kube_client;
use crate::leader::{Elector, LeaderConfig, LeaderWatch};
use crate::metrics::Metrics;
use crate::shutdown::{self, Shutdown};

type Work = Pin<Box<dyn Future<Output = Result<(), AppError>> + Send>>;

/// Runs the sidecar until it is told to stop; the exit code says how it ended.
pub async fn run(args: Args) -> ExitCode {
    let shutdown = Shutdown::new();
    if let Err(error) = shutdown::spawn_signal_listener(shutdown.clone()) {
        return fatal(&AppError::Signals(error));
    }
    tokio::select! {
        result = serve(args, shutdown.clone()) => match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => fatal(&error),
        },
        () = shutdown.aborted() => {
            warn!("second signal: aborting without waiting for calls in flight");
            ExitCode::from(u8::try_from(shutdown::ABORT_EXIT_CODE).unwrap_or(1))
        }
    }
}

async fn serve(args: Args, shutdown: Shutdown) -> Result<(), AppError> {
    let mut metrics = Metrics::new();
    if args.capacity.enable_capacity {
        metrics.register_capacity();
    }
    if !args.controller.audit_volumes_interval.is_zero() {
        metrics.register_audit();
    }
    let metrics = Arc::new(metrics);
    let (driver, info) = driver::connect(&args.driver, Arc::clone(&metrics)).await?;
    let capacity_args = args.capacity.enable_capacity.then_some(&args.capacity);
    let clients = kube_client::client_from_args(&args.client, capacity_args)
        .await
        .map_err(AppError::KubeClient)?;

    // Tasks that run beside the controllers; each reports how it ended.
    let mut tasks = JoinSet::new();
    let leader_watch: Arc<OnceLock<LeaderWatch>> = Arc::default();
    let leader_election = args.leader.leader_election;
    server::start(
        &args.http,
        leader_election,
        &metrics,
        &leader_watch,
        &mut tasks,
    )
    .await?;

    let node = node::node_deployment(&args.node_deployment, &driver, &clients.client).await?;
    let mut settings = settings::settings(&args, &info, node)?;
    settings::check_attributes_classes_served(&mut settings, &args, &clients.client).await;
    // The capacity client exists exactly with --enable-capacity.
    if let Some(client) = clients.capacity.as_ref() {
        let capacity = capacity_start::capacity_settings(
            &args.capacity,
            &info,
            settings.caps.topology,
            settings.node.as_ref(),
            client,
        )
        .await
        .map_err(|error| AppError::Capacity(Box::new(error)))?;
        settings.capacity = Some(capacity);
    }
    let driver: Arc<dyn CsiController> = Arc::new(driver);
    let elector = if leader_election {
        let config = LeaderConfig::from_args(&args.leader, &info.name).map_err(AppError::Leader)?;
        let (elector, watch) = Elector::new(clients.client.clone(), config, Arc::clone(&metrics));
        let _ = leader_watch.set(watch.clone());
        Some((elector, watch))
    } else {
        None
    };
    // Storage calls go out only while this replica can prove it leads (see `fence`).
    let fence = elector
        .as_ref()
        .map_or_else(LeaseFence::open, |(_, watch)| watch.fence());
    // `--drain` exits 0 only once the hand-over is complete; a signal, or a Lease never won,
    // ends it before.
    let draining = args.controller.drain;
    let handed_over = Arc::new(AtomicBool::new(false));
    let controllers = {
        let clients = clients.clone();
        let metrics = Arc::clone(&metrics);
        let drain = shutdown.drain_started();
        let handed_over = Arc::clone(&handed_over);
        move || async move {
            let ended = controller::run(clients, driver, metrics, settings, fence, drain)
                .await
                .map_err(AppError::Controllers)?;
            handed_over.store(ended == controller::Ended::HandedOver, Ordering::SeqCst);
            Ok(())
        }
    };

    let work: Work = match elector {
        Some((elector, watch)) => Box::pin(lease::run_while_leading(
            elector,
            watch,
            shutdown.drain_started(),
            controllers,
        )),
        None => Box::pin(async move {
            controllers().await?;
            info!("drained, exiting");
            Ok(())
        }),
    };

    supervise(work, &mut tasks, &shutdown).await?;
    if draining && !handed_over.load(Ordering::SeqCst) {
        return Err(AppError::DrainIncomplete);
    }
    Ok(())
}

/// Runs `work` to its end, unless a task of `tasks` fails first: then the drain starts (the
/// first shutdown stage), `work` finishes what is in flight, and the task's error is returned.
/// Dropping `tasks` afterwards stops the ones still running.
async fn supervise(
    mut work: Work,
    tasks: &mut JoinSet<Result<(), AppError>>,
    shutdown: &Shutdown,
) -> Result<(), AppError> {
    tokio::select! {
        result = &mut work => result,
        error = first_failure(tasks) => {
            error!(%error, "shutting down: draining before exit");
            shutdown.start_drain();
            if let Err(drain_error) = work.await {
                error!(error = %drain_error, "while draining");
            }
            Err(error)
        }
    }
}

/// The first task of `tasks` that fails; pending while none does (tasks may end well).
async fn first_failure(tasks: &mut JoinSet<Result<(), AppError>>) -> AppError {
    loop {
        match tasks.join_next().await {
            Some(Ok(Ok(()))) => {}
            Some(Ok(Err(error))) => return error,
            Some(Err(join_error)) => return AppError::Task(join_error),
            None => std::future::pending::<()>().await,
        }
    }
}

fn fatal(error: &AppError) -> ExitCode {
    error!("{error}");
    eprintln!("csi-provisioner: {error}");
    ExitCode::FAILURE
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    fn failing_task(tasks: &mut JoinSet<Result<(), AppError>>) {
        tasks.spawn(async { Err(AppError::LeadershipLost) });
    }

    /// Work that only ends after the drain started, and says whether it got there.
    fn draining_work(shutdown: &Shutdown, drained: &Arc<AtomicBool>) -> Work {
        let drain = shutdown.drain_started();
        let drained = Arc::clone(drained);
        Box::pin(async move {
            drain.await;
            drained.store(true, Ordering::SeqCst);
            Ok(())
        })
    }

    #[tokio::test]
    async fn a_failed_task_drains_the_work_then_reports_its_error() {
        let shutdown = Shutdown::new();
        let drained = Arc::new(AtomicBool::new(false));
        let mut tasks = JoinSet::new();
        tasks.spawn(async { Ok(()) });
        failing_task(&mut tasks);
        let result = supervise(draining_work(&shutdown, &drained), &mut tasks, &shutdown).await;
        assert!(
            matches!(result, Err(AppError::LeadershipLost)),
            "{result:?}"
        );
        assert!(shutdown.is_draining());
        assert!(
            drained.load(Ordering::SeqCst),
            "the work finished its drain"
        );
        assert!(!matches!(shutdown.stage(), crate::shutdown::Stage::Aborted));
    }

    #[tokio::test]
    async fn tasks_that_end_well_let_the_work_run() {
        let shutdown = Shutdown::new();
        let drained = Arc::new(AtomicBool::new(false));
        let mut tasks = JoinSet::new();
        tasks.spawn(async { Ok(()) });
        let stopper = shutdown.clone();
        tokio::spawn(async move { stopper.start_drain() });
        let result = supervise(draining_work(&shutdown, &drained), &mut tasks, &shutdown).await;
        assert!(result.is_ok(), "{result:?}");
        assert!(drained.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn a_panicked_task_is_a_failure() {
        let shutdown = Shutdown::new();
        let drained = Arc::new(AtomicBool::new(false));
        let mut tasks = JoinSet::new();
        tasks.spawn(async { panic!("boom") });
        let result = supervise(draining_work(&shutdown, &drained), &mut tasks, &shutdown).await;
        assert!(matches!(result, Err(AppError::Task(_))), "{result:?}");
        assert!(drained.load(Ordering::SeqCst));
    }
}
