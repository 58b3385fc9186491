//! A deterministic, seeded simulation of the whole sidecar (issue #31): the real reconcilers,
//! the orphan reaper's reap, the snapshot sweeper and the real journal run against an
//! in-memory API server and in-memory CSI drivers, on one seeded scheduler that interleaves
//! their calls, injects faults and checks the invariants after every step. See
//! `hack/simulate.sh` and the module docs of each file.

mod apiserver;
mod driver;
mod findings;
mod gate;
mod invariants;
mod profiles;
mod rng;
mod trace;
mod world;

mod tests;
