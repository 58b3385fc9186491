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

/// A violated invariant: which, the volume name it is about (if one), and what happened.
#[derive(Clone, Debug)]
pub struct Violation {
    pub kind: Kind,
    pub volume: Option<String>,
    /// The driver (node, or "central") whose volume it is.
    pub driver: Option<String>,
    pub message: String,
}

fn violation(
    kind: Kind,
    volume: Option<&str>,
    driver: Option<String>,
    message: String,
) -> Violation {
    Violation {
        kind,
        volume: volume.map(str::to_owned),
        driver,
        message,
    }
}

pub fn check(world: &World, quiescent: bool) -> Vec<Violation> {
    let mut found = Vec::new();
    for driver in world.drivers.values() {
        for (volume, message) in std::mem::take(&mut driver.lock().violations) {
            found.push(violation(
                Kind::UnsafeDelete,
                Some(&volume),
                Some(driver.label()),
                message,
            ));
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
                found.push(violation(
                    Kind::Leak,
                    Some(name),
                    Some(driver.label()),
                    format!("leak: driver {} holds volume {} ({name}) that no PV references and no durable record names", driver.label(), volume.id),
                ));
            } else if quiescent {
                found.push(violation(
                    Kind::NotQuiescent,
                    Some(name),
                    Some(driver.label()),
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
        // An operation reads its source from its first CreateVolume on: before that, the claim
        // puts the protection back after recording (`sources::reprotect_after_record`).
        let sent = world.drivers.values().any(|driver| {
            driver
                .lock()
                .history
                .get(&record.volume_name)
                .is_some_and(|touches| touches.iter().any(|touch| !touch.delete))
        });
        let slot = record.node.as_deref().unwrap_or("central");
        if pv_names.contains(record.volume_name.as_str())
            || !sent
            || world.settled_in_memory(slot, &record.volume_name)
        {
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
                    found.push(violation(
                        Kind::SourceReleased,
                        Some(&record.volume_name),
                        None,
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
            let volume = claim_volume(&claim);
            if deleting && has_finalizer(&claim, PROVISIONING_FINALIZER) {
                let message =
                    format!("at quiescence deleted claim {name} keeps the provisioning finalizer");
                found.push(violation(Kind::NotQuiescent, Some(&volume), None, message));
            } else if !deleting
                && text(&claim["status"]["phase"]) != "Bound"
                && !source_gone(&claim, &snapshots)
            {
                let message = format!("at quiescence claim {name} ({volume}) is not Bound");
                found.push(violation(Kind::NotQuiescent, Some(&volume), None, message));
            }
        }
        for record in &records {
            let driver = record.node.clone().unwrap_or_else(|| "central".to_owned());
            let message = format!(
                "at quiescence the record of {} is left in the journal ({driver})",
                record.volume_name
            );
            found.push(violation(
                Kind::NotQuiescent,
                Some(&record.volume_name),
                Some(driver),
                message,
            ));
        }
        for snapshot in &snapshots {
            if !snapshot["metadata"]["deletionTimestamp"].is_null()
                && has_finalizer(snapshot, SNAPSHOT_PROTECTION_FINALIZER)
            {
                let message = format!(
                    "at quiescence deleted snapshot {} keeps the protection finalizer",
                    text(&snapshot["metadata"]["name"])
                );
                found.push(violation(Kind::NotQuiescent, None, None, message));
            }
        }
    }
    found
}

/// The volume name of a claim (`pvc-<uid>`).
fn claim_volume(claim: &Value) -> String {
    format!("pvc-{}", text(&claim["metadata"]["uid"]))
}

/// Whether the claim restores from a snapshot that no longer exists (it waits for it, as
/// upstream: not a failure to settle).
fn source_gone(claim: &Value, snapshots: &[Value]) -> bool {
    let source = &claim["spec"]["dataSource"];
    text(&source["kind"]) == "VolumeSnapshot"
        && !snapshots.iter().any(|s| {
            text(&s["metadata"]["name"]) == text(&source["name"])
                && text(&s["metadata"]["namespace"]) == text(&claim["metadata"]["namespace"])
        })
}
