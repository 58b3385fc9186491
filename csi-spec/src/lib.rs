//! Generated CSI v1.12 messages, clients and servers (package `csi.v1`), plus the redacting
//! `Debug` implementations of every message that carries secrets.

use std::collections::HashMap;
use std::fmt;

#[allow(clippy::all, clippy::pedantic, missing_docs)]
mod generated {
    tonic::include_proto!("csi.v1");
}
pub use generated::*;

/// What a secret value is replaced with in logs (the same marker as Go's protosanitizer).
pub const STRIPPED: &str = "***stripped***";

/// Formats a secrets map with its keys and every value replaced by [`STRIPPED`].
pub struct RedactedSecrets<'a>(pub &'a HashMap<String, String>);

impl fmt::Debug for RedactedSecrets<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut keys: Vec<&String> = self.0.keys().collect();
        keys.sort();
        f.debug_map()
            .entries(keys.into_iter().map(|k| (k, STRIPPED)))
            .finish()
    }
}

/// Implements `Debug` for a message: the listed fields as usual, `secrets` redacted.
macro_rules! debug_with_redacted_secrets {
    ($($message:ident { $($field:ident),* $(,)? })*) => {
        $(
            impl fmt::Debug for $message {
                fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.debug_struct(stringify!($message))
                        $(.field(stringify!($field), &self.$field))*
                        .field("secrets", &RedactedSecrets(&self.secrets))
                        .finish()
                }
            }
        )*
    };
}

debug_with_redacted_secrets! {
    CreateVolumeRequest { name, capacity_range, volume_capabilities, parameters,
        volume_content_source, accessibility_requirements, mutable_parameters }
    DeleteVolumeRequest { volume_id }
    ControllerPublishVolumeRequest { volume_id, node_id, volume_capability, readonly, volume_context }
    ControllerUnpublishVolumeRequest { volume_id, node_id }
    ValidateVolumeCapabilitiesRequest { volume_id, volume_context, volume_capabilities, parameters,
        mutable_parameters }
    ControllerModifyVolumeRequest { volume_id, mutable_parameters }
    CreateSnapshotRequest { source_volume_id, name, parameters }
    DeleteSnapshotRequest { snapshot_id }
    ListSnapshotsRequest { max_entries, starting_token, source_volume_id, snapshot_id }
    GetSnapshotRequest { snapshot_id }
    ControllerExpandVolumeRequest { volume_id, capacity_range, volume_capability }
    NodeStageVolumeRequest { volume_id, publish_context, staging_target_path, volume_capability,
        volume_context }
    NodePublishVolumeRequest { volume_id, publish_context, staging_target_path, target_path,
        volume_capability, readonly, volume_context }
    NodeExpandVolumeRequest { volume_id, volume_path, capacity_range, staging_target_path,
        volume_capability }
    CreateVolumeGroupSnapshotRequest { name, source_volume_ids, parameters }
    DeleteVolumeGroupSnapshotRequest { group_snapshot_id, snapshot_ids }
    GetVolumeGroupSnapshotRequest { group_snapshot_id, snapshot_ids }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_of_every_secret_bearing_request_hides_values() {
        let secrets: HashMap<String, String> =
            [("password".to_string(), "hunter2-value".to_string())].into();
        let printed = [
            format!(
                "{:?}",
                CreateVolumeRequest {
                    name: "v".into(),
                    secrets: secrets.clone(),
                    ..Default::default()
                }
            ),
            format!(
                "{:#?}",
                DeleteVolumeRequest {
                    volume_id: "v".into(),
                    secrets: secrets.clone()
                }
            ),
            format!(
                "{:?}",
                NodePublishVolumeRequest {
                    secrets: secrets.clone(),
                    ..Default::default()
                }
            ),
            format!(
                "{:?}",
                ListSnapshotsRequest {
                    secrets,
                    ..Default::default()
                }
            ),
        ];
        for text in printed {
            assert!(!text.contains("hunter2-value"), "secret leaked: {text}");
            assert!(text.contains("password"), "keys stay visible: {text}");
            assert!(text.contains(STRIPPED), "marker missing: {text}");
        }
    }
}
