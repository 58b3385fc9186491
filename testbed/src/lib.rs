//! A real, throwaway Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager,
//! and kube-scheduler on request) on loopback, for integration tests, benchmarks and the demo.
//! See docs/control-plane.md.
//!
//! ```no_run
//! # async fn demo() -> Result<(), csi_testbed::Error> {
//! let cp = csi_testbed::ControlPlane::start().await?;
//! let client = cp.client().await?;
//! # drop(client);
//! // ... dropping `cp` stops every process and removes its directory.
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]

mod args;
mod binaries;
pub mod chaos;
mod error;
mod kubeconfig;
pub mod node;
mod node_identity;
pub mod nodes;
mod pki;
mod ports;
mod process;
mod readiness;
mod rng;
pub mod snapshots;
pub mod workspace;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub use binaries::BIN_DIR_ENV;
pub use error::{Component, Error};
pub use rng::Rng;

use args::Layout;
use binaries::Binaries;
use pki::{Pki, PkiFiles};
use process::Supervisor;
use readiness::Probe;

/// Set to `1` to keep the run's directory (logs, etcd data, kubeconfig) after teardown.
pub const KEEP_ENV: &str = "CSI_TESTBED_KEEP";

/// How often a component is restarted on fresh ports after losing a port race.
const PORT_ATTEMPTS: u32 = 3;
const ETCD_READY_TIMEOUT: Duration = Duration::from_secs(30);
/// The apiserver bootstraps its RBAC roles and API groups first; slow on 2 shared cores.
const APISERVER_READY_TIMEOUT: Duration = Duration::from_secs(90);
const CONTROLLER_MANAGER_READY_TIMEOUT: Duration = Duration::from_secs(60);
const SCHEDULER_READY_TIMEOUT: Duration = Duration::from_secs(60);
const READY_POLL: Duration = Duration::from_millis(250);
const FAILURE_LOG_LINES: usize = 30;

/// A running control plane. Dropping it stops all processes (SIGTERM, then SIGKILL) and removes
/// its temporary directory unless `CSI_TESTBED_KEEP=1`.
pub struct ControlPlane {
    // Held only for their `Drop`. Field order is teardown order: the node's pods, kubelet and
    // runtime stop while the apiserver still answers, and the processes die before their
    // directory is removed.
    node: Option<node::Node>,
    _supervisor: Supervisor,
    workdir: tempfile::TempDir,
    keep: bool,
    kubeconfig: PathBuf,
    apiserver_url: String,
    controller_manager_url: String,
    scheduler_url: Option<String>,
    logs: Vec<(Component, PathBuf)>,
    startup: Duration,
    bin_dir: PathBuf,
}

/// What [`ControlPlane::start_with`] starts beyond etcd, kube-apiserver and
/// kube-controller-manager.
#[derive(Clone, Copy, Debug, Default)]
pub struct StartOptions<'a> {
    /// Extra kube-apiserver flags, e.g. a feature gate turned off to stand in for an older
    /// cluster.
    pub apiserver_flags: &'a [&'a str],
    /// Also run kube-scheduler, for the real WaitForFirstConsumer flow (its VolumeBinding
    /// plugin writes `volume.kubernetes.io/selected-node`). It schedules onto Node objects that
    /// tests create; no kubelet runs.
    pub scheduler: bool,
    /// Also run a real node ([`node`]: containerd and a kubelet registered as
    /// [`node::NODE_NAME`]), with these `docker-archive` images imported into its runtime.
    /// Implies the scheduler. The apiserver then serves on [`node::SERVICE_IP`] port
    /// [`node::APISERVER_PORT`], with ServiceAccount tokens and the Node authorizer.
    pub node: Option<&'a [PathBuf]>,
}

impl ControlPlane {
    /// Builds or finds the binaries, generates this run's certificates, starts etcd,
    /// kube-apiserver and kube-controller-manager on free loopback ports and waits until each is
    /// ready. On error nothing is left running and the directory is removed.
    pub async fn start() -> Result<Self, Error> {
        Self::start_with_apiserver_flags(&[]).await
    }

    /// [`ControlPlane::start`] with extra kube-apiserver flags, e.g. a feature gate turned off
    /// to stand in for an older cluster.
    pub async fn start_with_apiserver_flags(apiserver_flags: &[&str]) -> Result<Self, Error> {
        Self::start_with(StartOptions {
            apiserver_flags,
            scheduler: false,
            node: None,
        })
        .await
    }

    /// [`ControlPlane::start`] with the given options; kube-scheduler, when asked for, starts
    /// last (and so stops first).
    pub async fn start_with(options: StartOptions<'_>) -> Result<Self, Error> {
        let StartOptions {
            apiserver_flags,
            scheduler,
            node: node_images,
        } = options;
        let with_node = node_images.is_some();
        let scheduler = scheduler || with_node;
        let started = Instant::now();
        // Before the apiserver, which listens on the address this puts on loopback.
        let host = if with_node {
            Some(
                tokio::task::spawn_blocking(node::Host::prepare)
                    .await
                    .map_err(|e| {
                        Error::NodeUnavailable(format!("preparing the host failed: {e}"))
                    })??,
            )
        } else {
            None
        };
        let binaries = tokio::task::spawn_blocking(move || binaries::locate(scheduler))
            .await
            .map_err(|e| Error::LocateBinaries(format!("locating task failed: {e}")))??;
        eprintln!("[testbed] binaries: {}", binaries.dir().display());

        let keep = keep_requested();
        let workdir = tempfile::Builder::new()
            .prefix("csi-testbed-")
            .disable_cleanup(keep)
            .tempdir()
            .map_err(Error::TempDir)?;
        let layout = Layout {
            root: workdir.path().to_owned(),
        };
        // etcd creates its own data directory, with the 0700 mode it insists on.
        for dir in [
            layout.apiserver_certs(),
            layout.controller_manager_certs(),
            layout.logs(),
        ] {
            std::fs::create_dir_all(&dir)
                .map_err(|source| Error::WriteFile { path: dir, source })?;
        }
        let pki = Pki::generate()?;
        let pki_files = pki.write(&layout.pki())?;
        // Declared after `workdir`, so on an early return its processes die before the
        // directory is removed.
        let mut supervisor = Supervisor::new(&layout.root, keep)?;
        let mut run = Run {
            supervisor: &mut supervisor,
            binaries: &binaries,
            layout: &layout,
        };

        let etcd_port = run
            .launch(Component::Etcd, 2, ETCD_READY_TIMEOUT, |ports| {
                let args = args::etcd(&layout.etcd_data(), ports[0], ports[1]);
                std::future::ready(Ok((args, Probe::EtcdHealth { port: ports[0] })))
            })
            .await?[0];

        let apiserver_url = if with_node {
            // A fixed address and port: the ones pods are told.
            let url = format!("https://{}:{}", node::SERVICE_IP, node::APISERVER_PORT);
            run.launch(Component::ApiServer, 0, APISERVER_READY_TIMEOUT, |_| {
                apiserver_attempt(
                    &layout,
                    &pki_files,
                    etcd_port,
                    (url.clone(), node::APISERVER_PORT),
                    apiserver_flags,
                    true,
                )
            })
            .await?;
            url
        } else {
            let port = run
                .launch(Component::ApiServer, 1, APISERVER_READY_TIMEOUT, |ports| {
                    apiserver_attempt(
                        &layout,
                        &pki_files,
                        etcd_port,
                        (https_url(ports[0]), ports[0]),
                        apiserver_flags,
                        false,
                    )
                })
                .await?[0];
            https_url(port)
        };

        let kubeconfig = layout.kubeconfig();
        let controller_manager_port = run
            .launch(
                Component::ControllerManager,
                1,
                CONTROLLER_MANAGER_READY_TIMEOUT,
                |ports| {
                    let args = args::controller_manager(&args::ControllerManager {
                        kubeconfig: &kubeconfig,
                        port: ports[0],
                        cert_dir: &layout.controller_manager_certs(),
                        pki: &pki_files,
                        node: with_node,
                    });
                    let probe =
                        health_client(ports[0], pki.serving_ca_der()).map(|client| Probe::Https {
                            client,
                            path: "/healthz",
                        });
                    std::future::ready(probe.map(|probe| (args, probe)))
                },
            )
            .await?[0];

        let scheduler_port = if scheduler {
            let port = run
                .launch(Component::Scheduler, 1, SCHEDULER_READY_TIMEOUT, |ports| {
                    let args = args::scheduler(&args::Scheduler {
                        kubeconfig: &kubeconfig,
                        port: ports[0],
                        pki: &pki_files,
                    });
                    // /readyz includes the sync of its informers' handlers: from then on a new
                    // pod is seen and scheduled.
                    let probe =
                        health_client(ports[0], pki.serving_ca_der()).map(|client| Probe::Https {
                            client,
                            path: "/readyz",
                        });
                    std::future::ready(probe.map(|probe| (args, probe)))
                })
                .await?[0];
            Some(port)
        } else {
            None
        };

        let node = match (host, node_images) {
            (Some(host), Some(images)) => Some(
                node::Node::start(node::NodeStart {
                    host,
                    layout: &layout,
                    apiserver_url: &apiserver_url,
                    pki: &pki_files,
                    images,
                    admin: kube::Client::try_from(kubeconfig::config(&kubeconfig).await?)?,
                })
                .await?,
            ),
            _ => None,
        };

        let startup = started.elapsed();
        eprintln!(
            "[testbed] control plane ready in {:.1}s: {apiserver_url}, KUBECONFIG={}",
            startup.as_secs_f64(),
            kubeconfig.display()
        );
        let logs = [
            Component::Etcd,
            Component::ApiServer,
            Component::ControllerManager,
        ]
        .into_iter()
        .chain(scheduler.then_some(Component::Scheduler))
        .map(|c| (c, layout.log(c)))
        .chain(node.iter().flat_map(|n| n.log_paths().iter().cloned()))
        .collect();
        Ok(ControlPlane {
            node,
            _supervisor: supervisor,
            workdir,
            keep,
            kubeconfig,
            apiserver_url,
            controller_manager_url: https_url(controller_manager_port),
            scheduler_url: scheduler_port.map(https_url),
            logs,
            startup,
            bin_dir: binaries.dir().to_owned(),
        })
    }

    /// The admin kubeconfig (CN=admin, O=system:masters); also usable with kubectl.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// A fresh admin client. Create one per tokio runtime (e.g. per `#[tokio::test]`): a client's
    /// connection pool belongs to the runtime it was created on.
    pub async fn client(&self) -> Result<kube::Client, Error> {
        kube::Client::try_from(kubeconfig::config(&self.kubeconfig).await?).map_err(Error::from)
    }

    pub fn apiserver_url(&self) -> &str {
        &self.apiserver_url
    }

    /// The controller manager's HTTPS endpoint (serving certificate from this run's CA);
    /// `/healthz` and `/metrics` answer without credentials.
    pub fn controller_manager_url(&self) -> &str {
        &self.controller_manager_url
    }

    /// kube-scheduler's HTTPS endpoint (serving certificate from this run's CA; `/healthz` and
    /// `/readyz` answer without credentials), if it was started.
    pub fn scheduler_url(&self) -> Option<&str> {
        self.scheduler_url.as_deref()
    }

    /// The kubectl built with the control plane (for `kubectl apply -k`, as users deploy).
    pub fn kubectl(&self) -> PathBuf {
        self.bin_dir.join("kubectl")
    }

    /// The real node, if one was asked for ([`StartOptions::node`]).
    pub fn node(&self) -> Option<&node::Node> {
        self.node.as_ref()
    }

    /// Log file of each component (its stdout and stderr).
    pub fn log_paths(&self) -> &[(Component, PathBuf)] {
        &self.logs
    }

    /// The run's temporary directory.
    pub fn dir(&self) -> &Path {
        self.workdir.path()
    }

    /// Time from [`ControlPlane::start`] until every component was ready.
    pub fn startup_time(&self) -> Duration {
        self.startup
    }

    /// Prints the last `lines` lines of each component's log to stderr (for failing tests).
    pub fn dump_logs_tail(&self, lines: usize) {
        for (component, path) in &self.logs {
            eprintln!(
                "----- last {lines} lines of {component} ({}) -----\n{}",
                path.display(),
                process::log_tail(path, lines)
            );
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        eprintln!("[testbed] stopping the control plane ...");
        if self.keep {
            eprintln!(
                "[testbed] {KEEP_ENV}=1: keeping {}",
                self.workdir.path().display()
            );
        }
    }
}

fn https_url(port: u16) -> String {
    format!("https://127.0.0.1:{port}")
}

fn keep_requested() -> bool {
    std::env::var(KEEP_ENV).is_ok_and(|v| v == "1")
}

/// Writes the kubeconfig for this attempt's URL; the probe is an admin client built from it.
async fn apiserver_attempt(
    layout: &Layout,
    pki: &PkiFiles,
    etcd_port: u16,
    (url, port): (String, u16),
    extra_flags: &[&str],
    node: bool,
) -> Result<(Vec<String>, Probe), Error> {
    let mut args = args::apiserver(&args::ApiServer {
        etcd_port,
        port,
        cert_dir: &layout.apiserver_certs(),
        pki,
        node,
    });
    args.extend(extra_flags.iter().map(|flag| (*flag).to_owned()));
    let path = layout.kubeconfig();
    pki::write_file(&path, &kubeconfig::render(&url, pki))?;
    let mut config = kubeconfig::config(&path).await?;
    // The poll loop retries (and watches the process meanwhile); the client must not.
    config.default_retry = false;
    let client = kube::Client::try_from(config)?;
    Ok((
        args,
        Probe::Https {
            client,
            path: "/readyz",
        },
    ))
}

/// A client that trusts only this run's CA and presents no credentials: health endpoints are
/// open to anyone.
fn health_client(port: u16, ca_der: &[u8]) -> Result<kube::Client, Error> {
    let url = https_url(port)
        .parse::<http::Uri>()
        .map_err(|e| Error::Probe(format!("bad URL: {e}")))?;
    let mut config = kube::Config::new(url);
    config.root_cert = Some(vec![ca_der.to_vec()]);
    config.default_retry = false;
    Ok(kube::Client::try_from(config)?)
}

/// Borrowed state of one `start()` call (of the control plane, or of its node).
pub(crate) struct Run<'a> {
    pub(crate) supervisor: &'a mut Supervisor,
    pub(crate) binaries: &'a Binaries,
    pub(crate) layout: &'a Layout,
}

enum Outcome {
    Ready,
    PortTaken,
}

impl Run<'_> {
    /// Starts `component` on `n_ports` fresh ports (`prepare` turns them into its arguments and
    /// readiness probe) and restarts it on new ports when another process took one in the
    /// meantime. Returns the ports in use.
    pub(crate) async fn launch<F, Fut>(
        &mut self,
        component: Component,
        n_ports: usize,
        timeout: Duration,
        mut prepare: F,
    ) -> Result<Vec<u16>, Error>
    where
        F: FnMut(&[u16]) -> Fut,
        Fut: Future<Output = Result<(Vec<String>, Probe), Error>>,
    {
        for attempt in 1..=PORT_ATTEMPTS {
            let ports = ports::free_ports(n_ports)?;
            let (args, probe) = prepare(&ports).await?;
            match self
                .run_once(component, &ports, &args, &probe, timeout)
                .await?
            {
                Outcome::Ready => return Ok(ports),
                Outcome::PortTaken => {
                    eprintln!(
                        "[testbed] {component}: a port was taken by another process (attempt {attempt}/{PORT_ATTEMPTS}); retrying on fresh ports"
                    );
                    self.supervisor.stop(component);
                }
            }
        }
        Err(Error::PortsExhausted {
            component,
            attempts: PORT_ATTEMPTS,
        })
    }

    async fn run_once(
        &mut self,
        component: Component,
        ports: &[u16],
        args: &[String],
        probe: &Probe,
        timeout: Duration,
    ) -> Result<Outcome, Error> {
        let log = self.layout.log(component);
        if ports.is_empty() {
            eprintln!("[testbed] starting {component} ...");
        } else {
            eprintln!("[testbed] starting {component} on 127.0.0.1 port(s) {ports:?} ...");
        }
        let started = Instant::now();
        self.supervisor
            .spawn(component, &self.binaries.path(component), args, &log)?;
        loop {
            if let Some(status) = self.supervisor.exit_status(component) {
                let tail = process::log_tail(&log, FAILURE_LOG_LINES);
                if ports::log_says_port_taken(&tail) {
                    return Ok(Outcome::PortTaken);
                }
                return Err(Error::Exited {
                    component,
                    status: status.to_string(),
                    log,
                    log_tail: tail,
                });
            }
            let last_error = match probe.check().await {
                Ok(()) => {
                    eprintln!(
                        "[testbed] {component} ready in {:.1}s",
                        started.elapsed().as_secs_f64()
                    );
                    return Ok(Outcome::Ready);
                }
                Err(e) => e,
            };
            if started.elapsed() > timeout {
                return Err(Error::NotReady {
                    component,
                    waited: started.elapsed(),
                    last_error,
                    log_tail: process::log_tail(&log, FAILURE_LOG_LINES),
                    log,
                });
            }
            tokio::time::sleep(READY_POLL).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A run whose "etcd" is the given shell script.
    fn fake_run(script: &str) -> (tempfile::TempDir, Binaries, Layout) {
        let dir = tempfile::tempdir().expect("temp dir");
        let bin = dir.path().join("bin");
        std::fs::create_dir_all(&bin).expect("mkdir bin");
        let etcd = bin.join("etcd");
        std::fs::write(&etcd, format!("#!/bin/sh\n{script}\n")).expect("write fake etcd");
        std::fs::set_permissions(&etcd, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let layout = Layout {
            root: dir.path().to_owned(),
        };
        std::fs::create_dir_all(layout.logs()).expect("mkdir logs");
        (dir, Binaries::at(&bin), layout)
    }

    async fn launch_fake_etcd(
        binaries: &Binaries,
        layout: &Layout,
        supervisor: &mut Supervisor,
        timeout: Duration,
    ) -> Result<Vec<u16>, Error> {
        let mut run = Run {
            supervisor,
            binaries,
            layout,
        };
        run.launch(Component::Etcd, 1, timeout, |ports| {
            std::future::ready(Ok((Vec::new(), Probe::EtcdHealth { port: ports[0] })))
        })
        .await
    }

    #[tokio::test]
    async fn losing_the_port_race_every_time_is_retried_then_reported() {
        let (_dir, binaries, layout) =
            fake_run("echo 'listen tcp 127.0.0.1:1: bind: address already in use' >&2; exit 1");
        let mut supervisor = Supervisor::new(&layout.root, true).expect("supervisor");
        let err = launch_fake_etcd(&binaries, &layout, &mut supervisor, Duration::from_secs(5))
            .await
            .expect_err("must fail");
        assert!(
            matches!(err, Error::PortsExhausted { attempts: 3, .. }),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_crash_at_start_up_names_the_component_and_shows_its_log() {
        let (_dir, binaries, layout) =
            fake_run("echo 'flag provided but not defined: -bogus' >&2; exit 2");
        let mut supervisor = Supervisor::new(&layout.root, true).expect("supervisor");
        let err = launch_fake_etcd(&binaries, &layout, &mut supervisor, Duration::from_secs(5))
            .await
            .expect_err("must fail");
        let message = err.to_string();
        assert!(message.starts_with("starting etcd: it exited"), "{message}");
        assert!(message.contains("-bogus"), "{message}");
    }

    #[tokio::test]
    async fn a_component_that_never_answers_times_out_and_is_stopped() {
        let (_dir, binaries, layout) = fake_run("exec sleep 120");
        let mut supervisor = Supervisor::new(&layout.root, true).expect("supervisor");
        let err = launch_fake_etcd(
            &binaries,
            &layout,
            &mut supervisor,
            Duration::from_millis(600),
        )
        .await
        .expect_err("must time out");
        assert!(
            err.to_string()
                .starts_with("waiting for etcd to become ready"),
            "{err}"
        );
        // Still running until the caller gives up: dropping the supervisor stops it.
        let pid = supervisor
            .pid(Component::Etcd)
            .expect("fake etcd still running");
        drop(supervisor);
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "fake etcd {pid} survived"
        );
    }
}
