//! The integration tests that share one plain control plane (etcd, kube-apiserver and
//! kube-controller-manager, with the journal CRD; no kube-scheduler, no snapshot CRDs), started
//! by the first test that needs it. Each file tests/<name>.rs below is a module, so its tests
//! are `<name>::<test>`: `cargo test --test cluster journal::` runs those of tests/journal.rs.
//!
//! The tests of one binary run side by side on its control plane: each has its own namespace
//! and its own driver name (csi-test-support), and names the cluster-wide objects it makes
//! after its namespace. A test that needs the cluster otherwise than the others lives in
//! another binary: kube-scheduler and the snapshot machinery (tests/scheduler/main.rs), other
//! kube-apiserver flags (tests/cross_namespace.rs, tests/initial_list.rs), no journal CRD
//! (tests/journal_crd_missing.rs), 10,000 claims (tests/journal_scale.rs).

#[path = "../attach.rs"]
mod attach;
#[path = "../audit.rs"]
mod audit;
#[path = "../call_rate.rs"]
mod call_rate;
#[path = "../chaos.rs"]
mod chaos;
#[path = "../control_plane_smoke.rs"]
mod control_plane_smoke;
#[path = "../events.rs"]
mod events;
#[path = "../handover.rs"]
mod handover;
#[path = "../journal.rs"]
mod journal;
#[path = "../leader_election.rs"]
mod leader_election;
#[path = "../logging.rs"]
mod logging;
#[path = "../metadata.rs"]
mod metadata;
#[path = "../migration.rs"]
mod migration;
#[path = "../mock_driver.rs"]
mod mock_driver;
#[path = "../protobuf.rs"]
mod protobuf;
#[path = "../provisioning.rs"]
mod provisioning;
#[path = "../rbac.rs"]
mod rbac;
#[path = "../startup_flags.rs"]
mod startup_flags;
#[path = "../upgrade.rs"]
mod upgrade;
#[path = "../vac.rs"]
mod vac;
