//! `--enable-capacity`: the CSIStorageCapacity controller (`capacity_publisher`). It runs on
//! `runtime` and the topology view of `cluster_views`, not on the shared `Context`; the claim
//! and volume reconcilers reach it only through the refresh handle the `Context` carries.

pub(super) mod capacity_publisher;
