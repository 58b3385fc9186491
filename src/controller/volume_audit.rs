//! `--audit-volumes-interval`: the audit of the driver's volumes that nothing references
//! (`audit`). It reports them and records the deletions `--audit-delete-after` allows in the
//! journal; the orphan reaper (`provisioning::orphans`) deletes them.

pub(super) mod audit;
