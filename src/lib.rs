//! A CSI provisioner sidecar that never leaks a volume: a drop-in replacement for
//! kubernetes-csi/external-provisioner. See docs/design.md for the architecture.

/// The CSI messages, clients and servers (the csi-spec crate, shared with the reference driver).
pub use csi_spec as csi;

pub mod api;
pub mod app;
pub mod config;
pub mod controller;
pub mod csi_client;
pub mod fence;
pub mod http;
pub mod journal;
pub mod kube_client;
pub mod leader;
pub mod logging;
pub mod memory;
pub mod metrics;
pub mod profiling;
pub mod provision;
pub mod shutdown;
