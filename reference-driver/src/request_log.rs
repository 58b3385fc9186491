//! `--request-log FILE`: every CreateVolume, CreateSnapshot and DeleteSnapshot request as one
//! JSON line, so that a test can compare two provisioners' requests field by field and see what
//! a snapshotter asked for. The request's `Debug` text cannot serve: its maps are `HashMap`s,
//! printed in a different order every time.
//!
//! The conversion is written out by hand (the generated messages have no serde support) and
//! keeps the CSI spec's field names, plus `method` naming the RPC. Maps become JSON objects
//! (sorted keys), topology segments objects of their labels, enums their spec names; secret
//! values are replaced by [`csi_spec::STRIPPED`], keys stay visible. Absent messages are
//! `null`.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;
use std::sync::{Mutex, PoisonError};

use csi_spec as csi;
use csi_spec::volume_capability::AccessType;
use csi_spec::volume_content_source::Type as SourceType;
use serde_json::{Value, json};

/// The open log file; each request is written whole with one `write_all` under the lock, so
/// concurrent calls never interleave their lines.
pub struct RequestLog {
    file: Mutex<File>,
}

impl RequestLog {
    /// Opens `path` for appending (created if missing): a restarted driver keeps the earlier
    /// lines.
    pub fn open(path: &Path) -> io::Result<Self> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(Self {
            file: Mutex::new(file),
        })
    }

    /// Appends one request, as converted by a `*_json` function here, as one line.
    pub fn write(&self, request: &Value) -> io::Result<()> {
        let mut line = request.to_string();
        line.push('\n');
        // A writer that panicked mid-line cannot have left more than a torn line, which a
        // reader skips; later lines are whole.
        let mut file = self.file.lock().unwrap_or_else(PoisonError::into_inner);
        file.write_all(line.as_bytes())
    }
}

/// The request as JSON, secret values redacted.
pub fn create_volume_json(request: &csi::CreateVolumeRequest) -> Value {
    json!({
        "method": "CreateVolume",
        "name": request.name,
        "capacity_range": request.capacity_range.as_ref().map(|range| json!({
            "required_bytes": range.required_bytes,
            "limit_bytes": range.limit_bytes,
        })),
        "volume_capabilities": request
            .volume_capabilities
            .iter()
            .map(capability_json)
            .collect::<Vec<_>>(),
        "parameters": sorted(&request.parameters),
        "secrets": redacted(&request.secrets),
        "volume_content_source": request
            .volume_content_source
            .as_ref()
            .map(|source| match &source.r#type {
                Some(SourceType::Snapshot(s)) => json!({"snapshot": {"snapshot_id": s.snapshot_id}}),
                Some(SourceType::Volume(v)) => json!({"volume": {"volume_id": v.volume_id}}),
                None => json!({}),
            }),
        "accessibility_requirements": request.accessibility_requirements.as_ref().map(|t| json!({
            "requisite": t.requisite.iter().map(|s| sorted(&s.segments)).collect::<Vec<_>>(),
            "preferred": t.preferred.iter().map(|s| sorted(&s.segments)).collect::<Vec<_>>(),
        })),
        "mutable_parameters": sorted(&request.mutable_parameters),
    })
}

/// The request as JSON, secret values redacted.
pub fn create_snapshot_json(request: &csi::CreateSnapshotRequest) -> Value {
    json!({
        "method": "CreateSnapshot",
        "name": request.name,
        "source_volume_id": request.source_volume_id,
        "parameters": sorted(&request.parameters),
        "secrets": redacted(&request.secrets),
    })
}

/// The request as JSON, secret values redacted.
pub fn delete_snapshot_json(request: &csi::DeleteSnapshotRequest) -> Value {
    json!({
        "method": "DeleteSnapshot",
        "snapshot_id": request.snapshot_id,
        "secrets": redacted(&request.secrets),
    })
}

/// The keys, each with the value [`csi_spec::STRIPPED`].
fn redacted(secrets: &HashMap<String, String>) -> BTreeMap<&String, &'static str> {
    secrets.keys().map(|key| (key, csi::STRIPPED)).collect()
}

fn capability_json(capability: &csi::VolumeCapability) -> Value {
    let access_type = match &capability.access_type {
        Some(AccessType::Mount(mount)) => json!({"mount": {
            "fs_type": mount.fs_type,
            "mount_flags": mount.mount_flags,
            "volume_mount_group": mount.volume_mount_group,
        }}),
        Some(AccessType::Block(_)) => json!({"block": {}}),
        None => Value::Null,
    };
    let access_mode = capability.access_mode.as_ref().map(|mode| {
        let name = csi::volume_capability::access_mode::Mode::try_from(mode.mode)
            .map_or_else(|_| mode.mode.to_string(), |m| m.as_str_name().to_owned());
        json!({"mode": name})
    });
    json!({"access_type": access_type, "access_mode": access_mode})
}

fn sorted(map: &HashMap<String, String>) -> BTreeMap<&String, &String> {
    map.iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi::volume_capability::access_mode::Mode;

    fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn every_field_is_converted_and_secret_values_are_redacted() {
        let request = csi::CreateVolumeRequest {
            name: "pvc-1".to_owned(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: 1 << 30,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![
                csi::VolumeCapability {
                    access_type: Some(AccessType::Mount(csi::volume_capability::MountVolume {
                        fs_type: "ext4".to_owned(),
                        mount_flags: vec!["ro".to_owned()],
                        volume_mount_group: String::new(),
                    })),
                    access_mode: Some(csi::volume_capability::AccessMode {
                        mode: Mode::MultiNodeMultiWriter.into(),
                    }),
                },
                csi::VolumeCapability {
                    access_type: Some(AccessType::Block(csi::volume_capability::BlockVolume {})),
                    access_mode: None,
                },
            ],
            parameters: map(&[("type", "fast"), ("a", "1")]),
            secrets: map(&[("password", "hunter2")]),
            volume_content_source: Some(csi::VolumeContentSource {
                r#type: Some(SourceType::Snapshot(
                    csi::volume_content_source::SnapshotSource {
                        snapshot_id: "snap-1".to_owned(),
                    },
                )),
            }),
            accessibility_requirements: Some(csi::TopologyRequirement {
                requisite: vec![csi::Topology {
                    segments: map(&[("zone", "z1"), ("rack", "r1")]),
                }],
                preferred: vec![],
            }),
            mutable_parameters: map(&[("iops", "100")]),
        };

        let converted = create_volume_json(&request);

        assert_eq!(
            converted,
            json!({
                "method": "CreateVolume",
                "name": "pvc-1",
                "capacity_range": {"required_bytes": 1_i64 << 30, "limit_bytes": 0},
                "volume_capabilities": [
                    {
                        "access_type": {"mount": {
                            "fs_type": "ext4", "mount_flags": ["ro"], "volume_mount_group": ""
                        }},
                        "access_mode": {"mode": "MULTI_NODE_MULTI_WRITER"}
                    },
                    {"access_type": {"block": {}}, "access_mode": null}
                ],
                "parameters": {"a": "1", "type": "fast"},
                "secrets": {"password": csi::STRIPPED},
                "volume_content_source": {"snapshot": {"snapshot_id": "snap-1"}},
                "accessibility_requirements": {
                    "requisite": [{"rack": "r1", "zone": "z1"}],
                    "preferred": []
                },
                "mutable_parameters": {"iops": "100"}
            })
        );
        assert!(!converted.to_string().contains("hunter2"));
    }

    #[test]
    fn absent_messages_are_null_and_lines_are_appended() {
        let request = csi::CreateVolumeRequest {
            name: "pvc-2".to_owned(),
            ..csi::CreateVolumeRequest::default()
        };
        let converted = create_volume_json(&request);
        assert_eq!(converted["capacity_range"], Value::Null);
        assert_eq!(converted["volume_content_source"], Value::Null);
        assert_eq!(converted["accessibility_requirements"], Value::Null);

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("requests.jsonl");
        let log = RequestLog::open(&path).unwrap();
        log.write(&converted).unwrap();
        log.write(&converted).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<Value> = text
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
        assert_eq!(lines, [converted.clone(), converted]);
    }

    #[test]
    fn snapshot_requests_name_their_method_and_hide_secret_values() {
        let create = csi::CreateSnapshotRequest {
            source_volume_id: "vol-1".to_owned(),
            name: "snapshot-1".to_owned(),
            secrets: map(&[("token", "hunter2")]),
            parameters: map(&[("class", "gold")]),
        };
        let converted = create_snapshot_json(&create);
        assert_eq!(
            converted,
            json!({
                "method": "CreateSnapshot",
                "name": "snapshot-1",
                "source_volume_id": "vol-1",
                "parameters": {"class": "gold"},
                "secrets": {"token": csi::STRIPPED},
            })
        );
        let delete = csi::DeleteSnapshotRequest {
            snapshot_id: "snap-1".to_owned(),
            secrets: map(&[("token", "hunter2")]),
        };
        let converted_delete = delete_snapshot_json(&delete);
        assert_eq!(
            converted_delete,
            json!({
                "method": "DeleteSnapshot",
                "snapshot_id": "snap-1",
                "secrets": {"token": csi::STRIPPED},
            })
        );
        assert!(!converted.to_string().contains("hunter2"));
        assert!(!converted_delete.to_string().contains("hunter2"));
    }
}
