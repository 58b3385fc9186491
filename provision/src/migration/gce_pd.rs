//! GCE PD (`kubernetes.io/gce-pd` → `pd.csi.storage.gke.io`). Handles are
//! `projects/<project>/zones/<zone>/disks/<name>` or `projects/<project>/regions/<region>/disks/<name>`.

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, GCEPersistentDiskVolumeSource, PersistentVolume,
};
use k8s_openapi::api::storage::v1::StorageClass;

use super::topology::{
    MULTI_ZONE_SEPARATOR, ZONE_BETA, ZONE_GA, affinity_to_in_tree, gce_region, zonal_class,
};
use super::{MigrationError, insert_renamed, partition};

pub const ZONE_KEY: &str = "topology.gke.io/zone";
/// What an in-tree PV cannot tell (its project, and its zone without a zone label).
const UNSPECIFIED: &str = "UNSPECIFIED";
/// A handle has at least these many `/`-separated parts; the disk name is the sixth.
const HANDLE_PARTS: usize = 6;

pub fn translate_class(class: &StorageClass) -> Result<StorageClass, MigrationError> {
    zonal_class(class, ZONE_KEY, |key, value, parameters| {
        insert_renamed(parameters, key, value);
    })
}

pub fn to_in_tree(
    mut pv: PersistentVolume,
    csi: CSIPersistentVolumeSource,
) -> Result<PersistentVolume, MigrationError> {
    let parts: Vec<&str> = csi.volume_handle.split('/').collect();
    if parts.len() < HANDLE_PARTS {
        return Err(MigrationError::HandleComponents {
            got: parts.len(),
            wanted: HANDLE_PARTS,
        });
    }
    let source = GCEPersistentDiskVolumeSource {
        pd_name: parts[HANDLE_PARTS - 1].to_owned(),
        fs_type: csi.fs_type.clone(),
        read_only: csi.read_only,
        partition: partition(csi.volume_attributes.as_ref())?,
    };
    affinity_to_in_tree(&mut pv, ZONE_KEY, Some(gce_region))?;
    if let Some(spec) = pv.spec.as_mut() {
        spec.csi = None;
        spec.gce_persistent_disk = Some(source);
    }
    Ok(pv)
}

/// The handle of an in-tree PV: its project is unknown; its zone is its zone label (beta
/// first), a region when the label names several zones, unknown without one.
pub fn csi_handle(pv: &PersistentVolume) -> Result<String, MigrationError> {
    let source = pv
        .spec
        .as_ref()
        .and_then(|spec| spec.gce_persistent_disk.as_ref())
        .ok_or(MigrationError::NoInTreeSource("gcePersistentDisk"))?;
    let labels = pv.metadata.labels.as_ref();
    let label = |key: &str| {
        labels
            .and_then(|labels| labels.get(key))
            .map(String::as_str)
            .filter(|value| !value.is_empty())
    };
    let zones: Vec<String> = label(ZONE_BETA)
        .or_else(|| label(ZONE_GA))
        .unwrap_or_default()
        .split(MULTI_ZONE_SEPARATOR)
        .map(str::to_owned)
        .collect();
    let name = &source.pd_name;
    Ok(match zones.as_slice() {
        [zone] if !zone.is_empty() => format!("projects/{UNSPECIFIED}/zones/{zone}/disks/{name}"),
        [_, _, ..] => {
            let region = gce_region(&zones).map_err(MigrationError::Region)?;
            format!("projects/{UNSPECIFIED}/regions/{region}/disks/{name}")
        }
        _ => format!("projects/{UNSPECIFIED}/zones/{UNSPECIFIED}/disks/{name}"),
    })
}

/// Whether the driver's `handle` names the disk of the handle `produced` from an in-tree PV
/// (`csi_handle`): the disk name where `to_in_tree` takes it, and the zone or region when the
/// PV's labels gave one. The project is never in-tree; nor are the labels in the cache.
pub fn same_handle(produced: &str, handle: &str) -> bool {
    let (ours, theirs): (Vec<&str>, Vec<&str>) =
        (produced.split('/').collect(), handle.split('/').collect());
    let (Some(ours), Some(theirs)) = (ours.get(..HANDLE_PARTS), theirs.get(..HANDLE_PARTS)) else {
        return false;
    };
    let location_known = ours[3] != UNSPECIFIED;
    ours[5] == theirs[5] && (!location_known || ours[2..4] == theirs[2..4])
}
