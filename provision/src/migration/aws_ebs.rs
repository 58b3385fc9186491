//! AWS EBS (`kubernetes.io/aws-ebs` → `ebs.csi.aws.com`). The handle is the EBS volume id.

use k8s_openapi::api::core::v1::{
    AWSElasticBlockStoreVolumeSource, CSIPersistentVolumeSource, PersistentVolume,
};
use k8s_openapi::api::storage::v1::StorageClass;

use super::topology::{affinity_to_in_tree, aws_region, zonal_class};
use super::{MigrationError, insert_renamed, partition};

pub const ZONE_KEY: &str = "topology.ebs.csi.aws.com/zone";
const IOPS_PER_GB: &str = "iopspergb";
const ALLOW_IOPS_INCREASE: &str = "allowautoiopspergbincrease";

/// As GCE's, and `iopspergb` brings `allowautoiopspergbincrease: "true"`.
pub fn translate_class(class: &StorageClass) -> Result<StorageClass, MigrationError> {
    zonal_class(class, ZONE_KEY, |key, value, parameters| {
        insert_renamed(parameters, key, value);
        if key.eq_ignore_ascii_case(IOPS_PER_GB) {
            parameters.insert(ALLOW_IOPS_INCREASE.to_owned(), "true".to_owned());
        }
    })
}

pub fn to_in_tree(
    mut pv: PersistentVolume,
    csi: CSIPersistentVolumeSource,
) -> Result<PersistentVolume, MigrationError> {
    let source = AWSElasticBlockStoreVolumeSource {
        volume_id: csi.volume_handle.clone(),
        fs_type: csi.fs_type.clone(),
        read_only: csi.read_only,
        partition: partition(csi.volume_attributes.as_ref())?,
    };
    affinity_to_in_tree(&mut pv, ZONE_KEY, Some(aws_region))?;
    if let Some(spec) = pv.spec.as_mut() {
        spec.csi = None;
        spec.aws_elastic_block_store = Some(source);
    }
    Ok(pv)
}

/// The EBS volume id of an in-tree volume id: `aws://<zone>/vol-…` loses its prefix, any
/// other id is kept as it is.
pub fn ebs_volume_id(kubernetes_id: &str) -> Result<String, MigrationError> {
    let Some(rest) = kubernetes_id.strip_prefix("aws://") else {
        return Ok(kubernetes_id.to_owned());
    };
    let path = rest.split_once('/').map_or("", |(_, path)| path);
    let id = path.trim_matches('/');
    if id.starts_with("vol-") && !id.contains('/') {
        Ok(id.to_owned())
    } else {
        Err(MigrationError::AwsVolumeId(kubernetes_id.to_owned()))
    }
}
