//! Azure Disk (`kubernetes.io/azure-disk` → `disk.csi.azure.com`). The handle is the disk URI.

use k8s_openapi::api::core::v1::{
    AzureDiskVolumeSource, CSIPersistentVolumeSource, PersistentVolume,
};
use k8s_openapi::api::storage::v1::StorageClass;

use super::MigrationError;
use super::topology::zonal_class;

pub const ZONE_KEY: &str = "topology.disk.csi.azure.com/zone";
const MANAGED: &str = "Managed";
const MANAGED_DISK_PATH: (&str, &str, &str) = (
    "/subscriptions/",
    "/resourceGroups/",
    "/providers/Microsoft.Compute/disks/",
);

/// Zones as GCE's, but `fstype` is not renamed (the driver reads the bare key), and zone
/// values that are all digits (Azure's unzoned fault domains) become "".
pub fn translate_class(class: &StorageClass) -> Result<StorageClass, MigrationError> {
    let mut translated = zonal_class(class, ZONE_KEY, |key, value, parameters| {
        parameters.insert(key.to_owned(), value.to_owned());
    })?;
    for term in translated.allowed_topologies.iter_mut().flatten() {
        for expression in term.match_label_expressions.iter_mut().flatten() {
            if expression.key != ZONE_KEY {
                continue;
            }
            for value in &mut expression.values {
                if !value.is_empty() && value.bytes().all(|byte| byte.is_ascii_digit()) {
                    value.clear();
                }
            }
        }
    }
    Ok(translated)
}

/// No topology translation: the node affinity keeps the CSI key, as upstream's.
pub fn to_in_tree(
    mut pv: PersistentVolume,
    csi: CSIPersistentVolumeSource,
) -> Result<PersistentVolume, MigrationError> {
    let disk_name = disk_name(&csi.volume_handle)?;
    let attribute = |name: &str| {
        csi.volume_attributes
            .iter()
            .flatten()
            .find_map(|(key, value)| {
                (key.eq_ignore_ascii_case(name) && !value.is_empty()).then(|| value.clone())
            })
    };
    let source = AzureDiskVolumeSource {
        disk_name,
        disk_uri: csi.volume_handle.clone(),
        fs_type: attribute("fstype").or_else(|| Some(csi.fs_type.clone().unwrap_or_default())),
        read_only: Some(csi.read_only.unwrap_or_default()),
        kind: Some(MANAGED.to_owned()),
        caching_mode: attribute("cachingmode"),
    };
    if let Some(spec) = pv.spec.as_mut() {
        spec.csi = None;
        spec.azure_disk = Some(source);
    }
    Ok(pv)
}

/// The handle of an in-tree PV: its disk URI. Only managed disks are migrated.
pub fn csi_handle(pv: &PersistentVolume) -> Result<String, MigrationError> {
    let source = pv
        .spec
        .as_ref()
        .and_then(|spec| spec.azure_disk.as_ref())
        .ok_or(MigrationError::NoInTreeSource("azureDisk"))?;
    match source.kind.as_deref() {
        Some(kind) if !kind.eq_ignore_ascii_case(MANAGED) => {
            Err(MigrationError::AzureDiskKind(kind.to_owned()))
        }
        _ => Ok(source.disk_uri.clone()),
    }
}

/// The disk name of a URI: what follows `/providers/Microsoft.Compute/disks/` (managed) or
/// `/vhds/` (unmanaged, `http…`).
fn disk_name(uri: &str) -> Result<String, MigrationError> {
    let error = || MigrationError::AzureDiskUri(uri.to_owned());
    // The driver's handle may be anything: byte 4 need not be a char boundary.
    let unmanaged = uri.len() > 4
        && uri
            .get(..4)
            .is_some_and(|scheme| scheme.eq_ignore_ascii_case("http"));
    let name = if unmanaged {
        let after_scheme = uri.find("://").map(|at| &uri[at + 3..]).ok_or_else(error)?;
        after_scheme.rsplit_once("/vhds/").map(|(_, name)| name)
    } else {
        let (subscriptions, groups, disks) = MANAGED_DISK_PATH;
        let after = uri
            .find(subscriptions)
            .map(|at| &uri[at + subscriptions.len()..])
            .and_then(|rest| rest.find(groups).map(|at| &rest[at + groups.len()..]));
        after.and_then(|rest| rest.rsplit_once(disks).map(|(_, name)| name))
    };
    name.filter(|name| !name.is_empty())
        .map(str::to_owned)
        .ok_or_else(error)
}
