//! Why the sidecar stopped with a failure; `app::run` prints it and exits 1.

use crate::csi_client;
use crate::http::HttpError;
use crate::journal::JournalError;
use crate::kube_client::KubeClientError;
use crate::leader::LeaderError;
use crate::shutdown::ShutdownError;

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error(transparent)]
    Signals(#[from] ShutdownError),
    #[error("--csi-address: {0}")]
    CsiAddress(#[source] csi_client::Error),
    #[error(transparent)]
    Driver(csi_client::Error),
    // Upstream starts anyway and fails every operation; a provisioner for a driver that cannot
    // provision is a deployment mistake, so we say so and stop.
    #[error(
        "the CSI driver {driver:?} does not report the CONTROLLER_SERVICE plugin capability, so it cannot provision volumes (is --csi-address the node plugin's socket?)"
    )]
    NoControllerService { driver: String },
    #[error(
        "the CSI driver {driver:?} does not report the CREATE_DELETE_VOLUME controller capability, so it cannot provision volumes"
    )]
    NoCreateDelete { driver: String },
    #[error(
        "--audit-volumes-interval: the CSI driver {driver:?} does not report the LIST_VOLUMES controller capability, so its volumes cannot be audited"
    )]
    NoListVolumes { driver: String },
    #[error(transparent)]
    KubeClient(KubeClientError),
    #[error(transparent)]
    NodeName(crate::config::ConfigError),
    #[error("Failed to get node info from CSI driver: {0}")]
    NodeInfo(#[source] csi_client::CallError),
    /// Ours: upstream starts and serves a node that does not exist (nothing is ever selected
    /// for it, and its PVs' affinity names a node no pod can run on).
    #[error(
        "--node-deployment: NODE_NAME is {node:?}, but the cluster has no Node of that name (set NODE_NAME from the pod's spec.nodeName)"
    )]
    NodeNotFound { node: String },
    #[error(transparent)]
    Http(HttpError),
    #[error("--volume-name-uuid-length: out of range")]
    UuidLength,
    #[error(transparent)]
    Leader(LeaderError),
    /// Renewal failed for the whole renew deadline; upstream exits 1 too.
    #[error("Stopped leading")]
    LeadershipLost,
    #[error(transparent)]
    Controllers(JournalError),
    /// `--drain` stopped (a signal, or the Lease never won) before the hand-over was complete.
    #[error(
        "--drain stopped before it was complete: operations may still be in flight or claims carry the provisioning-protection finalizer; run it again (kubectl get provisioningjournals shows what is left)"
    )]
    DrainIncomplete,
    #[error(transparent)]
    Capacity(Box<super::capacity_start::CapacityStartError>),
    #[error("a task of the sidecar ended abnormally: {0}")]
    Task(#[source] tokio::task::JoinError),
}
