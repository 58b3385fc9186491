//! VolumeSnapshot and VolumeSnapshotContent, `snapshot.storage.k8s.io/v1` (external-snapshotter
//! v8): what a restore reads.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::{ClusterResourceScope, NamespaceResourceScope};
use serde::{Deserialize, Serialize};

use super::api_resource;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct VolumeSnapshot {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: VolumeSnapshotSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<VolumeSnapshotStatus>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotSpec {
    #[serde(default)]
    pub source: VolumeSnapshotSource,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_snapshot_class_name: Option<String>,
}

/// Exactly one is set: the claim to snapshot, or a pre-provisioned content.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotSource {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent_volume_claim_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_snapshot_content_name: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bound_volume_snapshot_content_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_to_use: Option<bool>,
    /// The minimum size of a volume restored from the snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_size: Option<Quantity>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct VolumeSnapshotContent {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: VolumeSnapshotContentSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<VolumeSnapshotContentStatus>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotContentSpec {
    #[serde(default)]
    pub driver: String,
    #[serde(default)]
    pub deletion_policy: String,
    #[serde(default)]
    pub source: VolumeSnapshotContentSource,
    /// The VolumeSnapshot this content is bound to (uid, namespace, name).
    #[serde(default)]
    pub volume_snapshot_ref: ObjectReference,
    /// The volume mode of the snapshotted volume, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_volume_mode: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_snapshot_class_name: Option<String>,
}

/// Exactly one is set: the volume to snapshot, or an existing snapshot's handle.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotContentSource {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_handle: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_handle: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotContentStatus {
    /// The driver's snapshot id: CreateVolume's `volume_content_source.snapshot.snapshot_id`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_handle: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_to_use: Option<bool>,
    /// Bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_size: Option<i64>,
}

api_resource!(
    VolumeSnapshot,
    "snapshot.storage.k8s.io",
    "v1",
    "VolumeSnapshot",
    "volumesnapshots",
    NamespaceResourceScope
);
api_resource!(
    VolumeSnapshotContent,
    "snapshot.storage.k8s.io",
    "v1",
    "VolumeSnapshotContent",
    "volumesnapshotcontents",
    ClusterResourceScope
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ready_snapshot_and_its_content_parse_as_the_snapshot_controller_writes_them() {
        let snapshot: VolumeSnapshot = serde_json::from_value(serde_json::json!({
            "apiVersion": "snapshot.storage.k8s.io/v1",
            "kind": "VolumeSnapshot",
            "metadata": {"name": "snap", "namespace": "apps", "uid": "u1"},
            "spec": {"source": {"persistentVolumeClaimName": "data"}, "volumeSnapshotClassName": "c"},
            "status": {"boundVolumeSnapshotContentName": "snapcontent-u1", "readyToUse": true,
                       "restoreSize": "1Gi", "creationTime": "2026-01-01T00:00:00Z"}
        }))
        .expect("snapshot");
        let status = snapshot.status.expect("status");
        assert_eq!(
            status.bound_volume_snapshot_content_name.as_deref(),
            Some("snapcontent-u1")
        );
        assert_eq!(status.ready_to_use, Some(true));
        assert_eq!(status.restore_size, Some(Quantity("1Gi".into())));

        let content: VolumeSnapshotContent = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "snapcontent-u1"},
            "spec": {"driver": "d", "deletionPolicy": "Delete", "source": {"volumeHandle": "v1"},
                     "sourceVolumeMode": "Filesystem",
                     "volumeSnapshotRef": {"name": "snap", "namespace": "apps", "uid": "u1"}},
            "status": {"snapshotHandle": "s1", "readyToUse": true, "restoreSize": 1073741824}
        }))
        .expect("content");
        assert_eq!(content.spec.volume_snapshot_ref.uid.as_deref(), Some("u1"));
        assert_eq!(
            content.spec.source_volume_mode.as_deref(),
            Some("Filesystem")
        );
        let status = content.status.expect("status");
        assert_eq!(status.snapshot_handle.as_deref(), Some("s1"));
        assert_eq!(status.restore_size, Some(1 << 30));
    }
}
