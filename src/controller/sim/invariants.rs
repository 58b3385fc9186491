//! The invariants, checked after every step, and those of quiescence.
//!
//! 1. No leak: every volume a driver holds is the handle of a PV, or the name of a record
//!    durable in that driver's journal shards (its node's, in node mode).
//! 2. No unsafe delete: DeleteVolume is never called for a volume that a PV not Released
//!    references (checked by the driver as the call happens).
//! 3. No source released while read: a VolumeSnapshot keeps the protection finalizer while a
//!    durable record whose volume has no PV yet restores from its content.
//! 4. Quiescence: every claim Bound or gone, no record left, no provisioner finalizer on a
//!    deleted claim or snapshot, no driver volume without a PV.

use std::collections::BTreeSet;

use serde_json::Value;

use super::apiserver::text;
use super::world::World;
use crate::csi;
use crate::journal::{NODE_LABEL, ProvisioningJournal};
use crate::provision::{PROVISIONING_FINALIZER, SNAPSHOT_PROTECTION_FINALIZER};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Invariant 1.
    Leak,
    /// Invariant 2.
    UnsafeDelete,
    /// Invariant 3.
    SourceReleased,
    /// Invariant 4.
    NotQuiescent,
}

/// A record durable in the API server: the shard's node (None: central) and the operation.
pub struct Durable {
    pub node: Option<String>,
    pub volume_name: String,
    pub source: Option<csi::VolumeContentSource>,
}

pub fn durable_records(world: &World) -> Vec<Durable> {
    let mut records = Vec::new();
    for shard in world.server.list("provisioningjournals") {
        let node = shard["metadata"]["labels"][NODE_LABEL]
            .as_str()
            .map(str::to_owned);
        let Ok(shard) = serde_json::from_value::<ProvisioningJournal>(shard) else {
            continue;
        };
        for record in &shard.spec.operations {
            let source = record
                .to_operation()
                .ok()
                .and_then(|operation| operation.request.volume_content_source);
            records.push(Durable {
                node: node.clone(),
                volume_name: record.volume_name.clone(),
                source,
            });
        }
    }
    records
}

fn has_finalizer(object: &Value, finalizer: &str) -> bool {
    object["metadata"]["finalizers"]
        .as_array()
        .is_some_and(|list| list.iter().any(|f| f.as_str() == Some(finalizer)))
}

pub fn check(world: &World, quiescent: bool) -> Vec<(Kind, String)> {
    let mut found = Vec::new();
    for driver in world.drivers.values() {
        for violation in std::mem::take(&mut driver.lock().violations) {
            found.push((Kind::UnsafeDelete, violation));
        }
    }
    let pvs = world.server.list("persistentvolumes");
    let handles: BTreeSet<&str> = pvs
        .iter()
        .map(|pv| text(&pv["spec"]["csi"]["volumeHandle"]))
        .collect();
    let pv_names: BTreeSet<&str> = pvs.iter().map(|pv| text(&pv["metadata"]["name"])).collect();
    let records = durable_records(world);
    for driver in world.drivers.values() {
        let state = driver.lock();
        for (name, volume) in &state.volumes {
            if handles.contains(volume.id.as_str()) {
                continue;
            }
            let recorded = records
                .iter()
                .any(|r| r.node == driver.node && &r.volume_name == name);
            if !recorded {
                found.push((
                    Kind::Leak,
                    format!("leak: driver {} holds volume {} ({name}) that no PV references and no durable record names", driver.label(), volume.id),
                ));
            } else if quiescent {
                found.push((
                    Kind::NotQuiescent,
                    format!("at quiescence driver {} still holds volume {} without a PV (its record stays)", driver.label(), volume.id),
                ));
            }
        }
    }
    // Invariant 3.
    let snapshots = world.server.list("volumesnapshots");
    let contents = world.server.list("volumesnapshotcontents");
    for record in &records {
        let Some(csi::volume_content_source::Type::Snapshot(source)) =
            record.source.as_ref().and_then(|s| s.r#type.as_ref())
        else {
            continue;
        };
        if pv_names.contains(record.volume_name.as_str()) {
            continue;
        }
        for content in contents
            .iter()
            .filter(|c| text(&c["status"]["snapshotHandle"]) == source.snapshot_id)
        {
            let reference = &content["spec"]["volumeSnapshotRef"];
            for snapshot in snapshots
                .iter()
                .filter(|s| s["metadata"]["uid"] == reference["uid"])
            {
                if !has_finalizer(snapshot, SNAPSHOT_PROTECTION_FINALIZER) {
                    found.push((
                        Kind::SourceReleased,
                        format!(
                            "snapshot {}/{} lost its protection finalizer while the durable record of {} (no PV yet) restores from its content {}",
                            text(&snapshot["metadata"]["namespace"]),
                            text(&snapshot["metadata"]["name"]),
                            record.volume_name,
                            text(&content["metadata"]["name"]),
                        ),
                    ));
                }
            }
        }
    }
    if quiescent {
        for claim in world.server.list("persistentvolumeclaims") {
            let name = text(&claim["metadata"]["name"]);
            let deleting = !claim["metadata"]["deletionTimestamp"].is_null();
            if deleting && has_finalizer(&claim, PROVISIONING_FINALIZER) {
                found.push((
                    Kind::NotQuiescent,
                    format!("at quiescence deleted claim {name} keeps the provisioning finalizer"),
                ));
            } else if !deleting && text(&claim["status"]["phase"]) != "Bound" {
                found.push((
                    Kind::NotQuiescent,
                    format!("at quiescence claim {name} is not Bound"),
                ));
            }
        }
        for record in &records {
            found.push((
                Kind::NotQuiescent,
                format!(
                    "at quiescence the record of {} is left in the journal ({})",
                    record.volume_name,
                    record.node.as_deref().unwrap_or("central")
                ),
            ));
        }
        for snapshot in &snapshots {
            if !snapshot["metadata"]["deletionTimestamp"].is_null()
                && has_finalizer(snapshot, SNAPSHOT_PROTECTION_FINALIZER)
            {
                found.push((
                    Kind::NotQuiescent,
                    format!(
                        "at quiescence deleted snapshot {} keeps the protection finalizer",
                        text(&snapshot["metadata"]["name"])
                    ),
                ));
            }
        }
    }
    found
}
