//! The journal's persisted format and the pure operations on it.
//!
//! Operations are kept in a few shard objects (`ProvisioningJournal`, namespaced, in the
//! sidecar's namespace) rather than one object per operation: a shard write carries every
//! change queued while the previous write was in flight, so with many claims at once the
//! journal costs a small fraction of a write per volume (see docs/journal.md).

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use k8s_openapi::jiff::Timestamp;
use kube::CustomResource;
use prost::Message;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::registry::Operation;
use crate::csi;
use crate::provision::SecretRef;

/// The newest version of [`OperationRecord`] this build reads. Older records are still read:
/// every field added since version 1 has a default.
pub const RECORD_FORMAT: i32 = 2;
/// The version of a record of a CreateVolume, which every build since the first replays.
const CREATE_FORMAT: i32 = 1;
/// The version of a record of a DeleteVolume of a volume known by its id (`volume_id`, the
/// audit's deletions): a build before it would replay its empty request as a CreateVolume, so
/// it must leave such a record alone (`RecordError::NewerFormat`).
const DELETE_FORMAT: i32 = 2;
/// Where a record of [`DELETE_FORMAT`] also keeps its volume id: in its request, which the CRD
/// stores as an opaque string, so a `volumeId` pruned by a CRD not re-applied since, or dropped
/// by an older build rewriting the shard, is not lost with it. The request is never sent.
const DELETE_VOLUME_ID_PARAMETER: &str = "provisioner.csi-rs.dev/delete-volume-id";

/// One shard of the journal of operations in flight.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "provisioner.csi-rs.dev",
    version = "v1alpha1",
    kind = "ProvisioningJournal",
    namespaced,
    printcolumn = r#"{"name":"Driver","type":"string","jsonPath":".spec.driver"}"#,
    printcolumn = r#"{"name":"In flight","type":"integer","jsonPath":".spec.summary.inFlight"}"#,
    printcolumn = r#"{"name":"Orphaned","type":"integer","jsonPath":".spec.summary.orphaned"}"#,
    printcolumn = r#"{"name":"Oldest claim","type":"string","jsonPath":".spec.summary.oldestClaim"}"#,
    printcolumn = r#"{"name":"Attempts","type":"integer","jsonPath":".spec.summary.maxAttempts"}"#,
    printcolumn = r#"{"name":"Last error","type":"string","jsonPath":".spec.summary.lastError","priority":0}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct ProvisioningJournalSpec {
    /// The CSI driver whose operations this shard holds.
    pub driver: String,
    #[serde(default)]
    pub operations: Vec<OperationRecord>,
    /// Derived from `operations` on every write, for `kubectl get`.
    #[serde(default)]
    pub summary: Summary,
}

/// One CreateVolume that was sent (or is about to be) and not yet seen through.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OperationRecord {
    #[serde(default = "first_format")]
    pub format_version: i32,
    /// CreateVolume `name`, also the PV name.
    pub volume_name: String,
    /// `<namespace>/<name>` of the claim.
    pub claim: String,
    pub claim_uid: String,
    pub storage_class: String,
    /// The CreateVolume request, protobuf-encoded then base64, with `secrets` emptied.
    pub request: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioner_secret: Option<SecretReference>,
    /// The VolumeAttributesClass the request's `mutable_parameters` come from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_attributes_class: Option<String>,
    #[serde(default)]
    pub phase: Phase,
    #[serde(default)]
    pub attempts: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// When the operation was first recorded (RFC 3339).
    #[serde(default)]
    pub since: String,
    /// Format 2: the volume to delete, known by its id (a volume the audit found referenced by
    /// nothing, `--audit-delete-after`); `request` then holds only the name, and no
    /// CreateVolume is ever replayed for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_id: Option<String>,
}

fn first_format() -> i32 {
    1
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct SecretReference {
    pub name: String,
    pub namespace: String,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum Phase {
    /// The claim exists; the claim reconciler owns the operation.
    #[default]
    Provisioning,
    /// The claim is gone; the orphan reaper replays CreateVolume and deletes the volume.
    Orphaned,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub in_flight: i32,
    pub orphaned: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oldest_claim: Option<String>,
    pub max_attempts: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// A change to a shard, queued by the controllers and applied by the shard's writer.
#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    Upsert(Box<OperationRecord>),
    Remove {
        volume_name: String,
    },
    /// A failed attempt: bump `attempts`, keep the error, set the phase.
    Failure {
        volume_name: String,
        phase: Phase,
        error: String,
    },
    /// No change: the writer stores what it holds now, lazy changes included (at exit).
    Flush,
}

#[derive(Debug, Error, PartialEq)]
pub enum RecordError {
    #[error("journal record {volume}: request is not valid base64: {reason}")]
    Base64 { volume: String, reason: String },
    #[error("journal record {volume}: request is not a CreateVolumeRequest: {reason}")]
    Protobuf { volume: String, reason: String },
    #[error("journal record {volume}: claim {claim:?} is not <namespace>/<name>")]
    Claim { volume: String, claim: String },
    #[error(
        "journal record {volume} has format {found}, newer than this build understands ({RECORD_FORMAT})"
    )]
    NewerFormat { volume: String, found: i32 },
}

/// Longest error text kept per operation; the full text is in the sidecar's log and events.
const MAX_ERROR_LEN: usize = 512;

impl OperationRecord {
    pub fn from_operation(operation: &Operation, since: Timestamp) -> Self {
        let mut request = csi::CreateVolumeRequest {
            secrets: Default::default(),
            ..operation.request.clone()
        };
        if let Some(volume_id) = &operation.known_volume_id {
            request
                .parameters
                .insert(DELETE_VOLUME_ID_PARAMETER.to_owned(), volume_id.clone());
        }
        OperationRecord {
            format_version: if operation.known_volume_id.is_some() {
                DELETE_FORMAT
            } else {
                CREATE_FORMAT
            },
            volume_name: operation.volume_name.clone(),
            claim: if operation.claim_name.is_empty() {
                String::new()
            } else {
                format!("{}/{}", operation.claim_namespace, operation.claim_name)
            },
            claim_uid: operation.claim_uid.clone(),
            storage_class: operation.class_name.clone(),
            request: STANDARD.encode(request.encode_to_vec()),
            provisioner_secret: operation.provisioner_secret.as_ref().map(
                |SecretRef { name, namespace }| SecretReference {
                    name: name.clone(),
                    namespace: namespace.clone(),
                },
            ),
            volume_attributes_class: operation.attributes_class.clone(),
            phase: Phase::Provisioning,
            attempts: 0,
            last_error: None,
            since: since.to_string(),
            volume_id: operation.known_volume_id.clone(),
        }
    }

    /// Whether this record is the same claim's operation as `other`, recorded earlier with
    /// another request: two leaders planned the same volume, one after the shards holding the
    /// other's record were lost. The first request is the one the driver may have acted on.
    pub fn recorded_before(&self, other: &OperationRecord) -> bool {
        let (Ok(mine), Ok(theirs)) = (
            self.since.parse::<Timestamp>(),
            other.since.parse::<Timestamp>(),
        ) else {
            return false;
        };
        self.volume_name == other.volume_name
            && self.claim_uid == other.claim_uid
            && self.request != other.request
            && mine < theirs
    }

    /// The room the record takes in a shard: its JSON, plus a last error it may gain later.
    pub fn stored_size(&self) -> usize {
        let json = serde_json::to_vec(self).map_or(0, |json| json.len());
        let error_room =
            MAX_ERROR_LEN.saturating_sub(self.last_error.as_ref().map_or(0, String::len));
        json + error_room
    }

    /// The operation as the controllers use it. Fails on a record this build cannot replay
    /// exactly (such a record is kept untouched for a newer build or a human).
    pub fn to_operation(&self) -> Result<Operation, RecordError> {
        let volume = || self.volume_name.clone();
        if self.format_version > RECORD_FORMAT {
            return Err(RecordError::NewerFormat {
                volume: volume(),
                found: self.format_version,
            });
        }
        let bytes = STANDARD
            .decode(&self.request)
            .map_err(|error| RecordError::Base64 {
                volume: volume(),
                reason: error.to_string(),
            })?;
        let request = csi::CreateVolumeRequest::decode(bytes.as_slice()).map_err(|error| {
            RecordError::Protobuf {
                volume: volume(),
                reason: error.to_string(),
            }
        })?;
        let known_volume_id = self.volume_id.clone().or_else(|| {
            (self.format_version >= DELETE_FORMAT)
                .then(|| request.parameters.get(DELETE_VOLUME_ID_PARAMETER).cloned())
                .flatten()
        });
        let claim = match &known_volume_id {
            // A deletion of the audit's: no claim exists any more.
            Some(_) if self.claim.is_empty() => Some(("", "")),
            _ => self
                .claim
                .split_once('/')
                .filter(|(ns, name)| !ns.is_empty() && !name.is_empty()),
        };
        let Some((namespace, name)) = claim else {
            return Err(RecordError::Claim {
                volume: volume(),
                claim: self.claim.clone(),
            });
        };
        Ok(Operation {
            volume_name: self.volume_name.clone(),
            claim_namespace: namespace.to_owned(),
            claim_name: name.to_owned(),
            claim_uid: self.claim_uid.clone(),
            class_name: self.storage_class.clone(),
            request,
            provisioner_secret: self.provisioner_secret.as_ref().map(
                |SecretReference { name, namespace }| SecretRef {
                    name: name.clone(),
                    namespace: namespace.clone(),
                },
            ),
            attributes_class: self.volume_attributes_class.clone(),
            known_volume_id,
        })
    }
}

/// The content sources the operations recorded in `shards` read: their requests'
/// `volume_content_source`. Fails on the first record this build cannot read: what it reads
/// is unknown, so nothing may be released on the strength of this answer.
pub fn recorded_sources(
    shards: &[ProvisioningJournal],
) -> Result<Vec<csi::VolumeContentSource>, RecordError> {
    let mut sources = Vec::new();
    for record in shards.iter().flat_map(|shard| &shard.spec.operations) {
        if let Some(source) = record.to_operation()?.request.volume_content_source {
            sources.push(source);
        }
    }
    Ok(sources)
}

/// Applies queued changes to a shard's operations, in order. Returns whether anything changed
/// (an unchanged shard needs no write). Upserting an operation that is already recorded keeps
/// its history (since, attempts, last error).
pub fn apply(spec: &mut ProvisioningJournalSpec, changes: &[Change]) -> bool {
    let mut operations: BTreeMap<String, OperationRecord> = spec
        .operations
        .drain(..)
        .map(|record| (record.volume_name.clone(), record))
        .collect();
    let before = operations.clone();
    for change in changes {
        match change {
            Change::Upsert(record) => match operations.get_mut(&record.volume_name) {
                Some(existing) => {
                    existing.request.clone_from(&record.request);
                    existing
                        .provisioner_secret
                        .clone_from(&record.provisioner_secret);
                    existing
                        .volume_attributes_class
                        .clone_from(&record.volume_attributes_class);
                    existing.format_version = record.format_version;
                    existing.volume_id.clone_from(&record.volume_id);
                    existing.phase = Phase::Provisioning;
                }
                None => {
                    operations.insert(record.volume_name.clone(), (**record).clone());
                }
            },
            Change::Remove { volume_name } => {
                operations.remove(volume_name);
            }
            Change::Failure {
                volume_name,
                phase,
                error,
            } => {
                if let Some(existing) = operations.get_mut(volume_name) {
                    existing.attempts = existing.attempts.saturating_add(1);
                    existing.phase = *phase;
                    existing.last_error = Some(truncate(error));
                }
            }
            Change::Flush => {}
        }
    }
    let changed = operations != before;
    spec.operations = operations.into_values().collect();
    spec.summary = summarize(&spec.operations);
    changed
}

pub fn summarize(operations: &[OperationRecord]) -> Summary {
    let oldest = operations.iter().min_by(|a, b| a.since.cmp(&b.since));
    let latest_error = operations
        .iter()
        .filter(|record| record.last_error.is_some())
        .max_by_key(|record| record.attempts)
        .and_then(|record| record.last_error.clone());
    Summary {
        in_flight: i32::try_from(operations.len()).unwrap_or(i32::MAX),
        orphaned: i32::try_from(
            operations
                .iter()
                .filter(|record| record.phase == Phase::Orphaned)
                .count(),
        )
        .unwrap_or(i32::MAX),
        oldest_claim: oldest.map(|record| record.claim.clone()),
        max_attempts: operations
            .iter()
            .map(|record| record.attempts)
            .max()
            .unwrap_or(0),
        last_error: latest_error,
    }
}

fn truncate(text: &str) -> String {
    if text.len() <= MAX_ERROR_LEN {
        return text.to_owned();
    }
    let mut end = MAX_ERROR_LEN;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn operation(name: &str) -> Operation {
        Operation {
            volume_name: name.to_owned(),
            claim_namespace: "ns".into(),
            claim_name: "claim".into(),
            claim_uid: "uid-1".into(),
            class_name: "fast".into(),
            request: csi::CreateVolumeRequest {
                name: name.to_owned(),
                capacity_range: Some(csi::CapacityRange {
                    required_bytes: 1 << 30,
                    limit_bytes: 0,
                }),
                parameters: [("type".to_string(), "ssd".to_string())].into(),
                secrets: [("password".to_string(), "s3cr3t".to_string())].into(),
                // A claim's VolumeAttributesClass: replayed as recorded, like the rest.
                mutable_parameters: [("iops".to_string(), "3000".to_string())].into(),
                ..Default::default()
            },
            provisioner_secret: Some(SecretRef {
                name: "creds".into(),
                namespace: "ns".into(),
            }),
            attributes_class: Some("gold".into()),
            known_volume_id: None,
        }
    }

    fn record(name: &str) -> OperationRecord {
        OperationRecord::from_operation(&operation(name), Timestamp::UNIX_EPOCH)
    }

    #[test]
    fn a_record_round_trips_without_its_secret_values() {
        let record = record("pvc-1");
        let json = serde_json::to_string(&record).expect("serializable");
        assert!(!json.contains("s3cr3t"), "secret value persisted: {json}");
        let back = record.to_operation().expect("decodes");
        let mut expected = operation("pvc-1");
        expected.request.secrets = HashMap::new();
        assert_eq!(back, expected);
    }

    #[test]
    fn an_audit_deletion_keeps_its_volume_id_even_when_the_field_is_dropped() {
        let deletion = Operation {
            volume_name: "pvc-1".into(),
            claim_namespace: String::new(),
            claim_name: String::new(),
            claim_uid: "uid-1".into(),
            class_name: String::new(),
            request: csi::CreateVolumeRequest {
                name: "pvc-1".into(),
                ..Default::default()
            },
            provisioner_secret: None,
            attributes_class: None,
            known_volume_id: Some("vol-7".into()),
        };
        let record = OperationRecord::from_operation(&deletion, Timestamp::UNIX_EPOCH);
        assert_eq!(record.format_version, 2);
        assert_eq!(record.claim, "");
        let back = record.to_operation().expect("decodes");
        assert_eq!(back.known_volume_id.as_deref(), Some("vol-7"));
        assert_eq!(
            (back.claim_namespace.as_str(), back.claim_name.as_str()),
            ("", "")
        );
        // A CRD not re-applied prunes `volumeId`; the request still holds it.
        let pruned = OperationRecord {
            volume_id: None,
            ..record
        };
        let back = pruned.to_operation().expect("decodes");
        assert_eq!(back.known_volume_id.as_deref(), Some("vol-7"));
        // A record of a build that predates the format is refused by it, not replayed.
        assert_eq!(self::record("pvc-2").format_version, 1);
    }

    #[test]
    fn a_record_of_the_first_format_without_later_fields_is_recovered() {
        // What format 1 writers minimally stored: no phase, attempts, error, or since.
        let request = STANDARD.encode(
            csi::CreateVolumeRequest {
                name: "pvc-9".into(),
                ..Default::default()
            }
            .encode_to_vec(),
        );
        let json = serde_json::json!({
            "volumeName": "pvc-9", "claim": "ns/claim", "claimUid": "u", "storageClass": "c", "request": request
        });
        let record: OperationRecord = serde_json::from_value(json).expect("old record parses");
        assert_eq!(record.format_version, 1);
        assert_eq!(record.phase, Phase::Provisioning);
        let operation = record.to_operation().expect("old record is usable");
        assert_eq!(operation.request.name, "pvc-9");
        assert_eq!(
            (
                operation.claim_namespace.as_str(),
                operation.claim_name.as_str()
            ),
            ("ns", "claim")
        );
    }

    #[test]
    fn a_record_from_a_newer_build_is_refused_not_misread() {
        let mut record = record("pvc-1");
        record.format_version = RECORD_FORMAT + 1;
        assert!(matches!(
            record.to_operation(),
            Err(RecordError::NewerFormat { .. })
        ));
    }

    #[test]
    fn corrupt_records_give_typed_errors() {
        let mut bad_base64 = record("a");
        bad_base64.request = "%%%".into();
        assert!(matches!(
            bad_base64.to_operation(),
            Err(RecordError::Base64 { .. })
        ));
        let mut bad_proto = record("b");
        bad_proto.request = STANDARD.encode([0xff, 0xff, 0xff]);
        assert!(matches!(
            bad_proto.to_operation(),
            Err(RecordError::Protobuf { .. })
        ));
        let mut bad_claim = record("c");
        bad_claim.claim = "no-slash".into();
        assert!(matches!(
            bad_claim.to_operation(),
            Err(RecordError::Claim { .. })
        ));
    }

    #[test]
    fn apply_upserts_removes_and_counts_failures() {
        let mut spec = ProvisioningJournalSpec::default();
        assert!(apply(
            &mut spec,
            &[
                Change::Upsert(Box::new(record("a"))),
                Change::Upsert(Box::new(record("b")))
            ]
        ));
        assert_eq!(spec.summary.in_flight, 2);
        assert!(apply(
            &mut spec,
            &[Change::Failure {
                volume_name: "a".into(),
                phase: Phase::Orphaned,
                error: "boom".into()
            }]
        ));
        assert_eq!(spec.summary.orphaned, 1);
        assert_eq!(spec.summary.max_attempts, 1);
        assert_eq!(spec.summary.last_error.as_deref(), Some("boom"));
        assert!(apply(
            &mut spec,
            &[Change::Remove {
                volume_name: "a".into()
            }]
        ));
        assert_eq!(spec.operations.len(), 1);
        assert_eq!(spec.summary.orphaned, 0);
    }

    #[test]
    fn re_recording_an_operation_keeps_its_history_and_needs_no_write() {
        let mut spec = ProvisioningJournalSpec::default();
        apply(&mut spec, &[Change::Upsert(Box::new(record("a")))]);
        apply(
            &mut spec,
            &[Change::Failure {
                volume_name: "a".into(),
                phase: Phase::Provisioning,
                error: "x".into(),
            }],
        );
        let mut again = record("a");
        again.since = "2099-01-01T00:00:00Z".into();
        assert!(
            !apply(&mut spec, &[Change::Upsert(Box::new(again))]),
            "identical inputs: nothing to write"
        );
        assert_eq!(spec.operations[0].attempts, 1);
        assert_eq!(spec.operations[0].since, Timestamp::UNIX_EPOCH.to_string());
    }

    #[test]
    fn changes_to_unknown_operations_are_no_ops() {
        let mut spec = ProvisioningJournalSpec::default();
        assert!(!apply(
            &mut spec,
            &[Change::Remove {
                volume_name: "x".into()
            }]
        ));
        assert!(!apply(
            &mut spec,
            &[Change::Failure {
                volume_name: "x".into(),
                phase: Phase::Orphaned,
                error: "e".into()
            }]
        ));
    }

    #[test]
    fn long_errors_are_truncated_on_a_char_boundary() {
        let text = "é".repeat(MAX_ERROR_LEN);
        let kept = truncate(&text);
        assert!(kept.len() <= MAX_ERROR_LEN + '…'.len_utf8());
        assert!(kept.ends_with('…'));
    }

    #[test]
    fn the_sources_of_every_shard_are_read_and_an_unreadable_record_fails_the_read() {
        use csi::volume_content_source::{SnapshotSource, Type, VolumeSource};
        let reading = |name: &str, source: Type| {
            let mut operation = operation(name);
            operation.request.volume_content_source = Some(csi::VolumeContentSource {
                r#type: Some(source),
            });
            OperationRecord::from_operation(&operation, Timestamp::UNIX_EPOCH)
        };
        let shard = |records: Vec<OperationRecord>| {
            ProvisioningJournal::new(
                "d.node-0",
                ProvisioningJournalSpec {
                    driver: "d".into(),
                    operations: records,
                    ..ProvisioningJournalSpec::default()
                },
            )
        };
        let clone = Type::Volume(VolumeSource {
            volume_id: "vol-a".into(),
        });
        let restore = Type::Snapshot(SnapshotSource {
            snapshot_id: "snap-b".into(),
        });
        let shards = [
            shard(vec![reading("pvc-1", clone.clone()), record("pvc-2")]),
            shard(vec![reading("pvc-3", restore.clone())]),
        ];
        let sources = recorded_sources(&shards).expect("readable");
        let types: Vec<_> = sources.into_iter().filter_map(|s| s.r#type).collect();
        assert_eq!(types, [clone, restore]);
        let mut newer = record("pvc-4");
        newer.format_version = RECORD_FORMAT + 1;
        let unreadable = [shards[0].clone(), shard(vec![newer])];
        assert!(matches!(
            recorded_sources(&unreadable),
            Err(RecordError::NewerFormat { .. })
        ));
    }
}
