//! vSphere (`kubernetes.io/vsphere-volume` → `csi.vsphere.vmware.com`). The handle is the
//! volume path.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, PersistentVolume, VsphereVirtualDiskVolumeSource,
};
use k8s_openapi::api::storage::v1::StorageClass;

use super::topology::{
    affinity_values, kubernetes_keys, rename_affinity_key, set_label_if_absent,
    with_parameters_and_zone_keys,
};
use super::{CSI_FSTYPE_KEY, FSTYPE_KEY, MigrationError};

pub const ZONE_KEY: &str = "topology.csi.vmware.com/zone";
pub const REGION_KEY: &str = "topology.csi.vmware.com/region";
const STORAGE_POLICY_NAME: &str = "storagepolicyname";
/// In-tree parameters the driver reads as `<name>-migrationparam`.
const MIGRATION_PARAMETERS: [&str; 8] = [
    "datastore",
    "diskformat",
    "hostfailurestotolerate",
    "forceprovisioning",
    "cachereservation",
    "diskstripes",
    "objectspacereservation",
    "iopslimit",
];
/// The CSI attribute that holds the in-tree volume path.
const INITIAL_VOLUME_FILE_PATH: &str = "initialvolumefilepath";

/// `fstype` renamed, `storagepolicyname` kept, the eight in-tree parameters renamed to
/// `<name>-migrationparam`, every other parameter dropped, `csimigration: "true"` added.
pub fn translate_class(class: &StorageClass) -> Result<StorageClass, MigrationError> {
    let mut parameters = BTreeMap::new();
    for (key, value) in class.parameters.iter().flatten() {
        let lower = key.to_ascii_lowercase();
        let name = if lower == FSTYPE_KEY {
            CSI_FSTYPE_KEY.to_owned()
        } else if lower == STORAGE_POLICY_NAME {
            STORAGE_POLICY_NAME.to_owned()
        } else if MIGRATION_PARAMETERS.contains(&lower.as_str()) {
            format!("{lower}-migrationparam")
        } else {
            continue;
        };
        parameters.insert(name, value.clone());
    }
    parameters.insert("csimigration".to_owned(), "true".to_owned());
    Ok(with_parameters_and_zone_keys(class, parameters, ZONE_KEY))
}

/// The volume path from `initialvolumefilepath`; zone and region keys renamed, and their
/// first values as labels.
pub fn to_in_tree(mut pv: PersistentVolume, csi: CSIPersistentVolumeSource) -> PersistentVolume {
    let volume_path = csi
        .volume_attributes
        .as_ref()
        .and_then(|attributes| attributes.get(INITIAL_VOLUME_FILE_PATH))
        .cloned()
        .unwrap_or_default();
    let (zone_key, region_key) = kubernetes_keys(&pv);
    rename_affinity_key(&mut pv, ZONE_KEY, zone_key);
    rename_affinity_key(&mut pv, REGION_KEY, region_key);
    for key in [zone_key, region_key] {
        if let Some(first) = affinity_values(&pv, key).into_iter().next() {
            set_label_if_absent(&mut pv, key, first);
        }
    }
    if let Some(spec) = pv.spec.as_mut() {
        spec.csi = None;
        spec.vsphere_volume = Some(VsphereVirtualDiskVolumeSource {
            volume_path,
            fs_type: csi.fs_type,
            ..VsphereVirtualDiskVolumeSource::default()
        });
    }
    pv
}
