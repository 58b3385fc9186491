//! OpenStack Cinder (`kubernetes.io/cinder` → `cinder.csi.openstack.org`). The handle is the
//! Cinder volume id. Zone parameters are the driver's own (`availability`): only `fstype` and
//! allowedTopologies are translated.

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, CinderPersistentVolumeSource, PersistentVolume,
};
use k8s_openapi::api::storage::v1::StorageClass;

use super::topology::{affinity_to_in_tree, with_parameters_and_zone_keys};
use super::{MigrationError, insert_renamed};

pub const ZONE_KEY: &str = "topology.cinder.csi.openstack.org/zone";

pub fn translate_class(class: &StorageClass) -> Result<StorageClass, MigrationError> {
    let mut parameters = std::collections::BTreeMap::new();
    for (key, value) in class.parameters.iter().flatten() {
        insert_renamed(&mut parameters, key, value);
    }
    Ok(with_parameters_and_zone_keys(class, parameters, ZONE_KEY))
}

/// Zone key and label only: Cinder has no region parser.
pub fn to_in_tree(mut pv: PersistentVolume, csi: CSIPersistentVolumeSource) -> PersistentVolume {
    let source = CinderPersistentVolumeSource {
        volume_id: csi.volume_handle.clone(),
        fs_type: csi.fs_type.clone(),
        read_only: csi.read_only,
        secret_ref: None,
    };
    // Without a region parser nothing can fail.
    let _ = affinity_to_in_tree(&mut pv, ZONE_KEY, None);
    if let Some(spec) = pv.spec.as_mut() {
        spec.csi = None;
        spec.cinder = Some(source);
    }
    pv
}
