//! Test-only code, compiled only for `cargo test`: the scripted reconcile fixtures the unit
//! tests of every folder use (`fixtures`) and the deterministic simulation of the whole
//! sidecar (`sim`, run by `hack/simulate.sh`).

pub(super) mod fixtures;
mod sim;
