//! The executors: watch PVCs, PVs and StorageClasses, and act on the decisions of
//! `crate::provision` by calling the driver and the Kubernetes API.

pub mod backoff;
pub mod cache;
pub mod events;
pub mod limits;
