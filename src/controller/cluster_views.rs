//! Cluster-wide facts the claim controller decides with, each watched into a small cache on
//! top of `runtime::cache`: Nodes and CSINodes for topology (`topology_cache`, only for a
//! driver with topology) and the ReferenceGrants of cross-namespace data sources (`grants`,
//! only with the CrossNamespaceVolumeDataSource gate).

pub(super) mod grants;
pub(super) mod topology_cache;
