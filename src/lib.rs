//! A CSI provisioner sidecar that never leaks a volume: a drop-in replacement for
//! kubernetes-csi/external-provisioner. See docs/design.md for the architecture.

pub mod csi;
pub mod controller;
