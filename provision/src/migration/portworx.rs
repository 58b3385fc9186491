//! Portworx (`kubernetes.io/portworx-volume` → `pxd.portworx.com`). The handle is the volume id.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, PersistentVolume, PortworxVolumeSource,
};
use k8s_openapi::api::storage::v1::StorageClass;

const AUTH_SECRET_NAME: &str = "openstorage.io/auth-secret-name";
const AUTH_SECRET_NAMESPACE: &str = "openstorage.io/auth-secret-namespace";
/// The six secrets the auth secret stands for, as CSI class parameters (name, namespace).
const SECRET_KINDS: [&str; 6] = [
    "provisioner",
    "controller-publish",
    "node-publish",
    "node-stage",
    "controller-expand",
    "node-expand",
];

/// The auth secret parameters become the six CSI secret parameters; others are kept.
pub fn translate_class(class: &StorageClass) -> StorageClass {
    let mut parameters = BTreeMap::new();
    for (key, value) in class.parameters.iter().flatten() {
        let suffix = match key.to_ascii_lowercase().as_str() {
            AUTH_SECRET_NAME => "name",
            AUTH_SECRET_NAMESPACE => "namespace",
            _ => {
                parameters.insert(key.clone(), value.clone());
                continue;
            }
        };
        for kind in SECRET_KINDS {
            parameters.insert(
                format!("csi.storage.k8s.io/{kind}-secret-{suffix}"),
                value.clone(),
            );
        }
    }
    let mut translated = class.clone();
    if !parameters.is_empty() {
        translated.parameters = Some(parameters);
    }
    translated
}

pub fn to_in_tree(mut pv: PersistentVolume, csi: CSIPersistentVolumeSource) -> PersistentVolume {
    if let Some(spec) = pv.spec.as_mut() {
        spec.csi = None;
        spec.portworx_volume = Some(PortworxVolumeSource {
            volume_id: csi.volume_handle,
            fs_type: csi.fs_type,
            read_only: csi.read_only,
        });
    }
    pv
}
