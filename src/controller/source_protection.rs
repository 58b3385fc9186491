//! Taking the protection finalizers off the data sources of clones and restores once nothing
//! reads them: source claims (`clone_protection`) and VolumeSnapshots (`snapshot_sweeper`).
//! The claim controller puts them on (`provisioning::sources`).

pub(super) mod clone_protection;
pub(super) mod snapshot_sweeper;
