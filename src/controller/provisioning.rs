//! From a claim to a bound volume, and what happens to an operation whose claim goes away: the
//! claim controller (`claims`, with its scripted tests by topic in `claims/tests/`), node
//! mode's race for a claim (`ownership`), clones and restores (`sources`), the orphan reaper
//! that finishes the operations in flight whose claim is gone or being deleted (`orphans`),
//! and the drain that waits for the provisioning in flight to end (`drain`).

pub(super) mod claims;
pub(super) mod drain;
pub(super) mod orphans;
mod ownership;
mod sources;
