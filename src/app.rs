//! Wiring of the sidecar: from validated flags to running controllers, and the two-stage
//! shutdown. `main.rs` only parses flags and calls [`run`].

use std::process::ExitCode;
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use tracing::{error, info, warn};

use crate::config::{Args, ConsistencyDefault, Gate};
use crate::controller::{self, Settings};
use crate::csi_client::{ClientOptions, CsiClient, DriverInfo, parse_csi_address};
use crate::http;
use crate::kube_client;
use crate::leader::{self, Elector, LeaderConfig, LeaderWatch};
use crate::metrics::Metrics;
use crate::provision::{DriverCapabilities, ProvisionerConfig, provisioner_identity};
use crate::shutdown::{self, Shutdown};

const SERVICE_ACCOUNT_NAMESPACE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// Runs the sidecar until it is told to stop; the exit code says how it ended.
pub async fn run(args: Args) -> ExitCode {
    let shutdown = Shutdown::new();
    if let Err(error) = shutdown::spawn_signal_listener(shutdown.clone()) {
        return fatal(&error);
    }
    tokio::select! {
        code = serve(args, shutdown.clone()) => code,
        () = shutdown.aborted() => {
            warn!("second signal: aborting without waiting for calls in flight");
            ExitCode::from(u8::try_from(shutdown::ABORT_EXIT_CODE).unwrap_or(1))
        }
    }
}

async fn serve(args: Args, shutdown: Shutdown) -> ExitCode {
    let metrics = Arc::new(Metrics::new());
    let socket = match parse_csi_address(&args.csi_address) {
        Ok(socket) => socket,
        Err(error) => return fatal(&format!("--csi-address: {error}")),
    };
    let options = ClientOptions {
        call_timeout: args.timeout,
        ..ClientOptions::default()
    };
    let (driver, info) = match CsiClient::start(&socket, options, Arc::clone(&metrics)).await {
        Ok(started) => started,
        Err(error) => return fatal(&error),
    };
    info!(
        driver = info.name,
        version = info.vendor_version,
        can_provision = info.can_provision(),
        "connected to the CSI driver"
    );
    // Upstream starts anyway and fails every operation; a provisioner for a driver that cannot
    // provision is a deployment mistake, so we say so and stop.
    if !info.supports_controller_service() {
        return fatal(&format!(
            "the CSI driver {:?} does not report the CONTROLLER_SERVICE plugin capability, so it cannot provision volumes (is --csi-address the node plugin's socket?)",
            info.name
        ));
    }
    if !info.supports_create_delete() {
        return fatal(&format!(
            "the CSI driver {:?} does not report the CREATE_DELETE_VOLUME controller capability, so it cannot provision volumes",
            info.name
        ));
    }
    let clients = match kube_client::client_from_args(&args).await {
        Ok(built) => built,
        Err(error) => return fatal(&error),
    };

    let leader_watch: Arc<OnceLock<LeaderWatch>> = Arc::default();
    if let Some(plan) = http::ServerPlan::from_args(&args) {
        let listener = match http::bind(&plan.address).await {
            Ok(listener) => listener,
            Err(error) => return fatal(&error),
        };
        let encoder_metrics = Arc::clone(&metrics);
        let health_watch = Arc::clone(&leader_watch);
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
        tokio::spawn(async move {
            if let Err(error) = http::serve(listener, router, std::future::pending()).await {
                error!(%error, "HTTP server stopped");
                std::process::exit(1);
            }
        });
    }

    let settings = match settings(&args, &info) {
        Ok(settings) => settings,
        Err(message) => return fatal(&message),
    };
    let driver: Arc<dyn crate::csi_client::CsiController> = Arc::new(driver);
    let controllers = {
        let clients = clients.clone();
        let metrics = Arc::clone(&metrics);
        let drain = shutdown.drain_started();
        move || async move {
            if let Err(error) = controller::run(clients, driver, metrics, settings, drain).await {
                error!("{error}");
                eprintln!("csi-provisioner: {error}");
                std::process::exit(1);
            }
        }
    };

    if !args.leader_election {
        controllers().await;
        info!("drained, exiting");
        return ExitCode::SUCCESS;
    }
    let config = match LeaderConfig::from_args(&args, &info.name) {
        Ok(config) => config,
        Err(error) => return fatal(&error),
    };
    let lease = config.lease_name.clone();
    let (elector, watch) = Elector::new(clients.client, config);
    let _ = leader_watch.set(watch.clone());
    let mut leading = watch.leading();
    tokio::spawn(async move {
        loop {
            let now = *leading.borrow_and_update();
            metrics.set_leading(&lease, now);
            if leading.changed().await.is_err() {
                return;
            }
        }
    });
    let (finished_tx, finished_rx) = tokio::sync::oneshot::channel::<()>();
    let drain = shutdown.drain_started();
    tokio::spawn(async move {
        let mut leading = watch.leading();
        let lead = tokio::select! {
            became = leading.wait_for(|leading| *leading) => became.is_ok(),
            () = drain => false,
        };
        if lead {
            info!("became leader, starting controllers");
            controllers().await;
        }
        let _ = finished_tx.send(());
    });
    // The elector keeps renewing while the controllers drain, then releases the Lease.
    match elector
        .run(async {
            let _ = finished_rx.await;
        })
        .await
    {
        leader::Outcome::Lost => {
            error!("Stopped leading");
            ExitCode::FAILURE
        }
        leader::Outcome::NotReleased(reason) => {
            warn!(%reason, "the lease was not released; the other replica takes over when it expires");
            ExitCode::SUCCESS
        }
        leader::Outcome::Released | leader::Outcome::StoppedBeforeLeading => ExitCode::SUCCESS,
    }
}

/// The reconcilers' settings from flags and what the driver reported.
fn settings(args: &Args, info: &DriverInfo) -> Result<Settings, String> {
    let gates = args.feature_gates();
    let caps = DriverCapabilities {
        controller_service: info.supports_controller_service(),
        create_delete_volume: info.supports_create_delete(),
        single_node_multi_writer: info.supports_single_node_multi_writer(),
        topology: info.supports_topology() && gates.enabled(Gate::Topology),
        clone: info.supports_clone(),
        snapshot: info.supports_snapshot(),
    };
    let uuid_length = i32::try_from(args.volume_name_uuid_length)
        .map_err(|_| "--volume-name-uuid-length: out of range".to_string())?;
    let hostname = leader::sanitize_name(&hostname());
    let identity = provisioner_identity(unix_millis(), random_below_10000(), &info.name, None);
    Ok(Settings {
        config: ProvisionerConfig {
            driver_name: info.name.clone(),
            volume_name_prefix: args.volume_name_prefix.clone(),
            volume_name_uuid_length: uuid_length,
            extra_create_metadata: args.extra_create_metadata,
            default_fstype: args.default_fstype.clone(),
            controller_publish_readonly: args.controller_publish_readonly,
            identity,
        },
        caps,
        retry_interval_start: args.retry_interval_start,
        retry_interval_max: args.retry_interval_max,
        worker_threads: usize::try_from(args.worker_threads).unwrap_or(usize::MAX),
        max_concurrent_per_class: usize::try_from(args.max_concurrent_per_storage_class)
            .unwrap_or(usize::MAX),
        event_component: format!("{}_{}_{}", info.name, hostname, uuid::Uuid::new_v4()),
        hostname,
        consistency_by_default: args.provisioning_consistency_default == ConsistencyDefault::Enable,
        journal_namespace: leader::resolve_namespace(
            &args.leader_election_namespace,
            std::env::var("POD_NAMESPACE").ok().as_deref(),
            std::fs::read_to_string(SERVICE_ACCOUNT_NAMESPACE)
                .ok()
                .as_deref(),
        ),
        journal_base_name: leader::lease_name(&info.name),
        journal_timeout: args.timeout,
    })
}

fn hostname() -> String {
    hostname::get()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "unknown".into())
}

fn unix_millis() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis())
}

fn random_below_10000() -> u16 {
    (uuid::Uuid::new_v4().as_u128() % 10_000) as u16
}

fn fatal(error: &dyn std::fmt::Display) -> ExitCode {
    error!("{error}");
    eprintln!("csi-provisioner: {error}");
    ExitCode::FAILURE
}
