//! The one error type of the testbed: every variant names the start-up step that failed, so a
//! test failure or the `testbed` binary's exit message says where to look.

use std::path::PathBuf;
use std::time::Duration;

/// Which child process a message or error is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Component {
    Etcd,
    ApiServer,
    ControllerManager,
    /// Started only on request (`StartOptions::scheduler`).
    Scheduler,
    /// The volume snapshot machinery (crate::snapshots), started by a test that asks for it.
    SnapshotController,
    /// One per CSI driver (crate::snapshots).
    CsiSnapshotter,
    /// The container runtime of a real node (crate::node).
    Containerd,
    /// The kubelet of a real node (crate::node).
    Kubelet,
}

impl Component {
    /// The binary's file name, also used for its log file and in messages.
    pub fn binary(self) -> &'static str {
        match self {
            Component::Etcd => "etcd",
            Component::ApiServer => "kube-apiserver",
            Component::ControllerManager => "kube-controller-manager",
            Component::Scheduler => "kube-scheduler",
            Component::SnapshotController => "snapshot-controller",
            Component::CsiSnapshotter => "csi-snapshotter",
            Component::Containerd => "containerd",
            Component::Kubelet => "kubelet",
        }
    }
}

impl std::fmt::Display for Component {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.binary())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "locating the control-plane binaries (CSI_TESTBED_BIN_DIR=<dir with etcd, kube-apiserver, kube-controller-manager> skips the build): {0}"
    )]
    LocateBinaries(String),

    #[error("creating the temporary directory: {0}")]
    TempDir(#[source] std::io::Error),

    #[error("generating certificates: {0}")]
    Certificates(#[from] rcgen::Error),

    #[error("writing {}: {source}", path.display())]
    WriteFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("choosing free loopback ports: {0}")]
    FreePorts(#[source] std::io::Error),

    #[error("a real node cannot run here: {0}")]
    NodeUnavailable(String),

    #[error("starting the process supervisor: {0}")]
    Supervisor(String),

    #[error("preparing the readiness probe: {0}")]
    Probe(String),

    #[error("starting {component}: {source}")]
    Spawn {
        component: Component,
        #[source]
        source: std::io::Error,
    },

    #[error("starting {component}: it exited during start-up ({status}); last log lines of {}:\n{log_tail}", log.display())]
    Exited {
        component: Component,
        status: String,
        log: PathBuf,
        log_tail: String,
    },

    #[error(
        "starting {component}: its listening port was taken {attempts} times in a row by another process"
    )]
    PortsExhausted { component: Component, attempts: u32 },

    #[error("waiting for {component} to become ready: not ready after {waited:?} (last probe error: {last_error}); last log lines of {}:\n{log_tail}", log.display())]
    NotReady {
        component: Component,
        waited: Duration,
        last_error: String,
        log: PathBuf,
        log_tail: String,
    },

    #[error("building a Kubernetes client from {}: {source}", path.display())]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },

    #[error("building a Kubernetes client: {0}")]
    Client(#[from] kube::Error),

    #[error("reading the CRDs in {}: {source}", path.display())]
    ReadCrd {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("parsing the CRD {}: {reason}", path.display())]
    ParseCrd { path: PathBuf, reason: String },

    #[error("applying the CRD {name}: {source}")]
    ApplyCrd {
        name: String,
        #[source]
        source: kube::Error,
    },

    #[error(
        "waiting for the CRD {name} to be established and served: not after {waited:?} ({last_error})"
    )]
    CrdNotServed {
        name: String,
        waited: Duration,
        last_error: String,
    },

    #[error("{component} exited ({status}); last log lines of {}:\n{log_tail}", log.display())]
    Stopped {
        component: Component,
        status: String,
        log: PathBuf,
        log_tail: String,
    },
}
