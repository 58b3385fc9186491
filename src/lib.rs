//! A CSI provisioner sidecar that never leaks a volume: a drop-in replacement for
//! kubernetes-csi/external-provisioner. See docs/design.md for the architecture.

/// The CSI messages, clients and servers (the csi-spec crate, shared with the reference driver).
pub use csi_spec as csi;

/// The pure decision layer: the csi-provision crate, a crate of its own so that the compiler
/// keeps it free of IO (it cannot reach tokio or the kube client).
pub use csi_provision as provision;

/// The API types k8s-openapi lacks; they live in csi-provision, whose decisions read them.
pub use csi_provision::api;

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
pub mod shutdown;

/// The work tree under test, for unit tests that read its files (deploy/, src/). `cargo test`
/// names it at run time; the path compiled in goes stale when the work tree moves, since cargo
/// does not rebuild for that alone.
#[cfg(test)]
fn work_tree() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .unwrap_or_else(|| env!("CARGO_MANIFEST_DIR").into())
        .into()
}
