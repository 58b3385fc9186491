//! `--request-log FILE`: every CreateVolume request as one JSON line, so that a test can compare
//! two provisioners' requests field by field. The request's `Debug` text cannot serve: its maps
//! are `HashMap`s, printed in a different order every time.
//!
//! The conversion is written out by hand (the generated messages have no serde support) and
//! keeps the CSI spec's field names. Maps become JSON objects (sorted keys), topology segments
//! objects of their labels, enums their spec names; secret values are replaced by
//! [`csi_spec::STRIPPED`], keys stay visible. Absent messages are `null`.

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

    /// Appends the request as one line.
    pub fn write(&self, request: &csi::CreateVolumeRequest) -> io::Result<()> {
        let mut line = create_volume_json(request).to_string();
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
        "secrets": request
            .secrets
            .keys()
            .map(|key| (key.clone(), csi::STRIPPED))
            .collect::<BTreeMap<_, _>>(),
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
        log.write(&request).unwrap();
        log.write(&request).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<Value> = text
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
        assert_eq!(lines, [converted.clone(), converted]);
    }
}
