//! A CSI provisioner sidecar that never leaks a volume: a drop-in replacement for
//! kubernetes-csi/external-provisioner. See docs/design.md for the architecture.

pub mod app;
pub mod csi;
pub mod controller;
pub mod csi_client;
pub mod metrics;
pub mod driver;
pub mod config;
pub mod http;
pub mod kube_client;
pub mod leader;
pub mod logging;
pub mod shutdown;
pub mod provision;
