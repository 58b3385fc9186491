//! Ours (not upstream): the backend audit (`--audit-volumes-interval`). Which of the volumes the
//! driver lists (ListVolumes) nothing references, and which of those may be deleted
//! (`--audit-delete-after`). Pure: the executor (`controller::audit`) lists, reads and acts.
//!
//! A volume is referenced by a PV of the driver (CSI, or in-tree through migration), by a
//! VolumeSnapshotContent taken from it, or by an operation in flight in any node's journal.
//! An operation in flight names its volume by its CreateVolume name, not its id; a volume whose
//! id holds that name is the operation's, and while any operation's volume is not known that
//! way, every volume whose id holds none of our names and that was first listed after that
//! operation began may be it, and is not reported.
//! A volume is reported once it was found unreferenced on passes at least the interval apart
//! (a PV saved between the listing and the reading of the PVs is found by the next pass), and
//! may be deleted once it has been for `--audit-delete-after`, its id holds a name our naming
//! could have produced (`--volume-name-prefix`, the UID's shape) and no claim has that UID.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use thiserror::Error;

use crate::migration::{Holding, InTreePlugin};

/// Records and volumes are stamped by different clocks (another node's, the API server's):
/// an operation counts as begun this much earlier than it says.
pub const CLOCK_MARGIN: Duration = Duration::from_secs(300);
/// The most ListVolumes pages one pass reads: a driver that pages on past it is paging in a
/// loop.
pub const MAX_PAGES: usize = 100_000;

/// A volume as ListVolumes gave it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListedVolume {
    pub id: String,
    pub capacity_bytes: i64,
    /// The driver says it is in use: published to a node (`published_node_ids`) or in an
    /// abnormal condition. Such a volume is never deleted.
    pub in_use: bool,
}

/// Why a pass's listing cannot be trusted. Such a pass reports nothing and deletes nothing.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ListingError {
    #[error("ListVolumes returned volume {0} twice")]
    Duplicate(String),
    #[error("ListVolumes returned an entry without a volume or with an empty volume id")]
    NoVolumeId,
    #[error("ListVolumes returned the page token {0:?} twice: its paging loops")]
    TokenRepeated(String),
    #[error("ListVolumes returned more than {MAX_PAGES} pages")]
    TooManyPages,
}

/// The pages of one ListVolumes pass, checked as they come.
#[derive(Debug, Default)]
pub struct Listing {
    volumes: Vec<ListedVolume>,
    ids: HashSet<String>,
    tokens: HashSet<String>,
}

impl Listing {
    /// Takes one page (its volumes, its `next_token`); returns the token of the next page to
    /// ask for, `None` at the end.
    pub fn add_page(
        &mut self,
        volumes: impl IntoIterator<Item = Option<ListedVolume>>,
        next_token: &str,
    ) -> Result<Option<String>, ListingError> {
        for volume in volumes {
            let volume = volume
                .filter(|volume| !volume.id.is_empty())
                .ok_or(ListingError::NoVolumeId)?;
            if !self.ids.insert(volume.id.clone()) {
                return Err(ListingError::Duplicate(volume.id));
            }
            self.volumes.push(volume);
        }
        if next_token.is_empty() {
            return Ok(None);
        }
        if self.tokens.len() >= MAX_PAGES {
            return Err(ListingError::TooManyPages);
        }
        if !self.tokens.insert(next_token.to_owned()) {
            return Err(ListingError::TokenRepeated(next_token.to_owned()));
        }
        Ok(Some(next_token.to_owned()))
    }

    pub fn volumes(&self) -> &[ListedVolume] {
        &self.volumes
    }
}

/// An operation in flight in some node's journal: its CreateVolume name and when it was
/// recorded, and the volume id of a deletion known by id (the audit's own).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InFlight {
    pub volume_name: String,
    pub since: Timestamp,
    pub volume_id: Option<String>,
}

/// What references volumes, read after the listing.
#[derive(Debug)]
pub struct References<'a> {
    pub driver: &'a str,
    /// The handles of the driver's CSI PVs.
    pub pv_handles: &'a HashSet<String>,
    /// The in-tree PVs of the plugin migrated to the driver, if it is a migration target.
    pub in_tree_pvs: &'a [PersistentVolume],
    /// `spec.source.volumeHandle` of the driver's VolumeSnapshotContents.
    pub snapshot_sources: &'a HashSet<String>,
    pub in_flight: &'a [InFlight],
    /// The UIDs of every claim known (the claim store, whole).
    pub claim_uids: &'a HashSet<String>,
}

/// The audit's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditPolicy {
    pub interval: Duration,
    /// `None`: report only.
    pub delete_after: Option<Duration>,
    pub name_prefix: String,
    /// `--volume-name-uuid-length`, -1 for the whole UID.
    pub uuid_length: i32,
}

/// What the audit remembers of a volume between passes (in memory: a new leader starts over,
/// which only delays a report).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sighting {
    pub first_listed: Timestamp,
    pub unreferenced_since: Option<Timestamp>,
    /// Something referenced it while this sidecar watched: whoever let go of it kept it (the
    /// PV of a `Retain` volume deleted to keep its data), so it is never deleted.
    pub ever_referenced: bool,
}

pub type AuditMemory = HashMap<String, Sighting>;

/// Whether a reported volume may be deleted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Deletion {
    /// `--audit-delete-after` is not set.
    Off,
    /// Its id holds no name our naming could have produced: whose it is cannot be told.
    NotOurName,
    /// The driver says it is in use (published to a node, or abnormal).
    InUse,
    /// A PV, snapshot or operation referenced it while this sidecar watched: it was let go of
    /// on purpose (a `Retain` volume's PV deleted), not leaked.
    WasReferenced,
    /// A claim with the UID its name holds exists.
    ClaimExists { claim_uid: String },
    /// Not unreferenced for `--audit-delete-after` yet.
    NotBefore(Timestamp),
    /// It may be deleted: record the DeleteVolume under this name, then send it.
    Due {
        volume_name: String,
        claim_uid: String,
    },
}

/// A volume nothing references, seen so on passes at least the interval apart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    pub volume: ListedVolume,
    pub unreferenced_since: Timestamp,
    pub deletion: Deletion,
}

#[derive(Debug, Default, PartialEq)]
pub struct AuditOutcome {
    pub memory: AuditMemory,
    pub findings: Vec<Finding>,
    /// Volumes no finding is made of because an in-tree PV may hold them and cannot be
    /// translated to tell: (volume id, PV name, why).
    pub undecided: Vec<(String, String, String)>,
}

/// One pass: `listed` at `started`, `references` read after it, `memory` from earlier passes.
pub fn audit_pass(
    memory: &AuditMemory,
    listed: &[ListedVolume],
    references: &References<'_>,
    policy: &AuditPolicy,
    started: Timestamp,
) -> AuditOutcome {
    let named_ids: Vec<&str> = listed.iter().map(|volume| volume.id.as_str()).collect();
    // Operations whose volume is not known by name among the listed ones: the earliest of
    // them bounds which volumes may be theirs.
    let unmatched_since = references
        .in_flight
        .iter()
        .filter(|operation| {
            operation.volume_id.is_none()
                && !named_ids
                    .iter()
                    .any(|id| holds_name(id, &operation.volume_name))
        })
        .map(|operation| operation.since)
        .min()
        .map(|since| {
            SignedDuration::try_from(CLOCK_MARGIN)
                .ok()
                .and_then(|margin| since.checked_sub(margin).ok())
                .unwrap_or(Timestamp::MIN)
        });
    let mut outcome = AuditOutcome::default();
    for volume in listed {
        let first_listed = memory
            .get(&volume.id)
            .map_or(started, |seen| seen.first_listed);
        // Whether something may reference it now, and whether something surely does.
        let (referenced, surely) =
            match reference_of(volume, references, policy, unmatched_since, first_listed) {
                Reference::None => (false, false),
                Reference::Some => (true, true),
                Reference::Maybe => (true, false),
                Reference::Unknown { pv, why } => {
                    outcome.undecided.push((volume.id.clone(), pv, why));
                    (true, false)
                }
            };
        let unreferenced_since = (!referenced).then(|| {
            memory
                .get(&volume.id)
                .and_then(|seen| seen.unreferenced_since)
                .unwrap_or(started)
        });
        let ever_referenced = surely
            || memory
                .get(&volume.id)
                .is_some_and(|seen| seen.ever_referenced);
        outcome.memory.insert(
            volume.id.clone(),
            Sighting {
                first_listed,
                unreferenced_since,
                ever_referenced,
            },
        );
        let Some(since) = unreferenced_since else {
            continue;
        };
        let interval = SignedDuration::try_from(policy.interval).unwrap_or(SignedDuration::MAX);
        if started.duration_since(since) < interval {
            continue;
        }
        outcome.findings.push(Finding {
            volume: volume.clone(),
            unreferenced_since: since,
            deletion: deletion(volume, since, ever_referenced, references, policy, started),
        });
    }
    outcome
}

enum Reference {
    None,
    /// A PV, a snapshot or an operation of its name or id references it.
    Some,
    /// It may be the volume of an operation whose volume is not known yet.
    Maybe,
    /// An in-tree PV that cannot be translated may reference it.
    Unknown {
        pv: String,
        why: String,
    },
}

fn reference_of(
    volume: &ListedVolume,
    references: &References<'_>,
    policy: &AuditPolicy,
    unmatched_since: Option<Timestamp>,
    first_listed: Timestamp,
) -> Reference {
    let id = volume.id.as_str();
    // A volume whose id holds one of our names is an operation's only if it holds that
    // operation's name; any other volume may be an operation's whose volume is unknown.
    let maybe_unmatched = || {
        our_volume_name(id, &policy.name_prefix, policy.uuid_length).is_none()
            && unmatched_since.is_some_and(|since| since <= first_listed)
    };
    if references.pv_handles.contains(id)
        || references.snapshot_sources.contains(id)
        || references.in_flight.iter().any(|operation| {
            operation.volume_id.as_deref() == Some(id) || holds_name(id, &operation.volume_name)
        })
    {
        return Reference::Some;
    }
    if maybe_unmatched() {
        return Reference::Maybe;
    }
    let Some(plugin) = InTreePlugin::for_csi_driver(references.driver) else {
        return Reference::None;
    };
    for pv in references.in_tree_pvs {
        match plugin.holds(pv, id) {
            Holding::Holds => return Reference::Some,
            Holding::DoesNotHold => {}
            Holding::Unknown(error) => {
                return Reference::Unknown {
                    pv: pv.metadata.name.clone().unwrap_or_default(),
                    why: error.to_string(),
                };
            }
        }
    }
    Reference::None
}

fn deletion(
    volume: &ListedVolume,
    since: Timestamp,
    ever_referenced: bool,
    references: &References<'_>,
    policy: &AuditPolicy,
    now: Timestamp,
) -> Deletion {
    let Some(delete_after) = policy.delete_after else {
        return Deletion::Off;
    };
    if volume.in_use {
        return Deletion::InUse;
    }
    if ever_referenced {
        return Deletion::WasReferenced;
    }
    let Some((volume_name, uid_part)) =
        our_volume_name(&volume.id, &policy.name_prefix, policy.uuid_length)
    else {
        return Deletion::NotOurName;
    };
    if let Some(claim_uid) = references
        .claim_uids
        .iter()
        .find(|uid| uid_matches(uid, &uid_part, policy.uuid_length))
    {
        return Deletion::ClaimExists {
            claim_uid: claim_uid.clone(),
        };
    }
    let due = SignedDuration::try_from(delete_after)
        .ok()
        .and_then(|delay| since.checked_add(delay).ok())
        .unwrap_or(Timestamp::MAX);
    if now < due {
        return Deletion::NotBefore(due);
    }
    Deletion::Due {
        volume_name,
        claim_uid: uid_part,
    }
}

/// Whether `id` holds the CreateVolume name `name`: it is the name, or ends with it after a
/// character that cannot be part of a name (a driver that prefixes ids).
pub fn holds_name(id: &str, name: &str) -> bool {
    id.strip_suffix(name).is_some_and(|before| {
        before.is_empty() || !before.ends_with(|c: char| c.is_ascii_alphanumeric() || c == '.')
    })
}

/// The volume name our naming could have produced that `id` holds (see [`holds_name`]), and
/// the part of the claim UID in it.
pub fn our_volume_name(id: &str, prefix: &str, uuid_length: i32) -> Option<(String, String)> {
    let marker = format!("{prefix}-");
    let uid_len = usize::try_from(uuid_length).unwrap_or(36);
    let start = id.len().checked_sub(marker.len() + uid_len)?;
    let name = id.get(start..)?;
    let uid_part = name.strip_prefix(&marker)?;
    let shaped = if uuid_length < 0 {
        is_uuid(uid_part)
    } else {
        uid_part
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
    };
    (shaped && holds_name(id, name)).then(|| (name.to_owned(), uid_part.to_owned()))
}

/// A lowercase UUID as Kubernetes writes UIDs: 8-4-4-4-12 hex digits.
fn is_uuid(text: &str) -> bool {
    text.len() == 36
        && text.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_hexdigit() && !c.is_ascii_uppercase(),
        })
}

/// Whether a claim with UID `uid` would have been given a name holding `uid_part`.
fn uid_matches(uid: &str, uid_part: &str, uuid_length: i32) -> bool {
    if uuid_length < 0 {
        uid == uid_part
    } else {
        uid.replace('-', "").starts_with(uid_part)
    }
}

#[cfg(test)]
mod tests;
