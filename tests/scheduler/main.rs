//! The integration tests that share one control plane with kube-scheduler (the real
//! WaitForFirstConsumer flow, Nodes and CSINodes) and the Kubernetes snapshot machinery (the
//! snapshot CRDs and snapshot-controller, installed and started by the first test that needs
//! them). Each file tests/<name>.rs below is a module, so its tests are `<name>::<test>`:
//! `cargo test --test scheduler topology::` runs those of tests/topology.rs.
//!
//! Whichever test touches the cluster first starts it, so every test here calls
//! `support::control_plane_with_scheduler()` (or `support::topology::scheduling_cluster`)
//! before anything else. Nodes are cluster-wide and kube-scheduler sees all of them: each test
//! labels its own and its pods select them (support::topology), and uses topology keys of its
//! own. tests/provisioning.rs needs a cluster without the snapshot CRDs, so it is a module of
//! the other binary (tests/cluster/main.rs).

#[path = "../capacity.rs"]
mod capacity;
#[path = "../data_sources.rs"]
mod data_sources;
#[path = "../differential.rs"]
mod differential;
#[path = "../node_deployment.rs"]
mod node_deployment;
#[path = "../scheduling.rs"]
mod scheduling;
#[path = "../snapshots.rs"]
mod snapshots;
#[path = "../topology.rs"]
mod topology;
