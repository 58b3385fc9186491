use super::*;

use k8s_openapi::api::core::v1::{AWSElasticBlockStoreVolumeSource, PersistentVolumeSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

const UID: &str = "0b6c6f4e-1d7a-4e55-9a37-2f6b8c3d9e10";
const OTHER_UID: &str = "7f1e2d3c-4b5a-4968-8776-655443322110";

fn at(seconds: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + seconds).unwrap()
}

fn volume(id: &str) -> ListedVolume {
    ListedVolume {
        id: id.to_owned(),
        capacity_bytes: 1 << 30,
        in_use: false,
    }
}

fn policy(delete_after: Option<u64>) -> AuditPolicy {
    AuditPolicy {
        interval: Duration::from_secs(60),
        delete_after: delete_after.map(Duration::from_secs),
        name_prefix: "pvc".to_owned(),
        uuid_length: -1,
    }
}

#[derive(Default)]
struct Refs {
    driver: String,
    handles: HashSet<String>,
    in_tree: Vec<PersistentVolume>,
    snapshots: HashSet<String>,
    in_flight: Vec<InFlight>,
    claims: HashSet<String>,
}

impl Refs {
    fn new() -> Self {
        Refs {
            driver: "hostpath.csi.k8s.io".to_owned(),
            ..Refs::default()
        }
    }

    fn get(&self) -> References<'_> {
        References {
            driver: &self.driver,
            pv_handles: &self.handles,
            in_tree_pvs: &self.in_tree,
            snapshot_sources: &self.snapshots,
            in_flight: &self.in_flight,
            claim_uids: &self.claims,
        }
    }
}

/// Two passes a minute apart over `listed`; the second pass's findings.
fn two_passes(listed: &[ListedVolume], refs: &Refs, policy: &AuditPolicy) -> Vec<Finding> {
    let first = audit_pass(&AuditMemory::new(), listed, &refs.get(), policy, at(0));
    assert!(
        first.findings.is_empty(),
        "nothing is reported on first sight"
    );
    audit_pass(&first.memory, listed, &refs.get(), policy, at(60)).findings
}

#[test]
fn a_listing_takes_pages_until_the_last() {
    let mut listing = Listing::default();
    assert_eq!(
        listing.add_page([Some(volume("a")), Some(volume("b"))], "2"),
        Ok(Some("2".to_owned()))
    );
    assert_eq!(listing.add_page([Some(volume("c"))], ""), Ok(None));
    assert_eq!(listing.volumes().len(), 3);
}

#[test]
fn a_listing_refuses_duplicates_empty_entries_and_loops() {
    let mut listing = Listing::default();
    listing.add_page([Some(volume("a"))], "1").unwrap();
    assert_eq!(
        listing.add_page([Some(volume("a"))], ""),
        Err(ListingError::Duplicate("a".to_owned()))
    );
    let mut listing = Listing::default();
    assert_eq!(listing.add_page([None], ""), Err(ListingError::NoVolumeId));
    assert_eq!(
        Listing::default().add_page([Some(volume(""))], ""),
        Err(ListingError::NoVolumeId)
    );
    let mut listing = Listing::default();
    listing.add_page([Some(volume("a"))], "t").unwrap();
    assert_eq!(
        listing.add_page([Some(volume("b"))], "t"),
        Err(ListingError::TokenRepeated("t".to_owned()))
    );
}

#[test]
fn a_volume_is_reported_only_once_unreferenced_for_an_interval() {
    let refs = Refs::new();
    let listed = [volume("vol-1")];
    let first = audit_pass(
        &AuditMemory::new(),
        &listed,
        &refs.get(),
        &policy(None),
        at(0),
    );
    assert!(first.findings.is_empty());
    let early = audit_pass(&first.memory, &listed, &refs.get(), &policy(None), at(59));
    assert!(early.findings.is_empty(), "not an interval apart yet");
    let later = audit_pass(&early.memory, &listed, &refs.get(), &policy(None), at(60));
    assert_eq!(
        later.findings,
        [Finding {
            volume: volume("vol-1"),
            unreferenced_since: at(0),
            deletion: Deletion::Off,
        }]
    );
}

#[test]
fn a_reference_seen_in_between_starts_the_count_again() {
    let mut refs = Refs::new();
    let listed = [volume("vol-1")];
    let first = audit_pass(
        &AuditMemory::new(),
        &listed,
        &refs.get(),
        &policy(None),
        at(0),
    );
    refs.handles.insert("vol-1".to_owned());
    let held = audit_pass(&first.memory, &listed, &refs.get(), &policy(None), at(60));
    assert!(held.findings.is_empty());
    refs.handles.clear();
    let again = audit_pass(&held.memory, &listed, &refs.get(), &policy(None), at(120));
    assert!(again.findings.is_empty(), "unreferenced since 120 only");
    let last = audit_pass(&again.memory, &listed, &refs.get(), &policy(None), at(180));
    assert_eq!(last.findings[0].unreferenced_since, at(120));
}

#[test]
fn pvs_snapshot_contents_and_operations_in_flight_reference_volumes() {
    let name = format!("pvc-{UID}");
    let mut refs = Refs::new();
    refs.handles.insert("vol-pv".to_owned());
    refs.snapshots.insert("vol-snap".to_owned());
    refs.in_flight.push(InFlight {
        volume_name: name.clone(),
        since: at(-3600),
        volume_id: None,
    });
    let listed = [
        volume("vol-pv"),
        volume("vol-snap"),
        volume(&format!("ref-{name}")),
        volume("vol-free"),
    ];
    let findings = two_passes(&listed, &refs, &policy(None));
    let ids: Vec<&str> = findings.iter().map(|f| f.volume.id.as_str()).collect();
    assert_eq!(ids, ["vol-free"]);
}

#[test]
fn an_operation_whose_volume_is_unknown_holds_back_volumes_listed_after_it_began() {
    let mut refs = Refs::new();
    // Recorded at 0, its volume not known by name (a driver of random ids).
    refs.in_flight.push(InFlight {
        volume_name: format!("pvc-{UID}"),
        since: at(1000),
        volume_id: None,
    });
    let listed = [volume("vol-new")];
    let policy = policy(None);
    // Listed first before the operation began (less the clock margin): not its volume.
    let old = audit_pass(&AuditMemory::new(), &listed, &refs.get(), &policy, at(0));
    let old = audit_pass(&old.memory, &listed, &refs.get(), &policy, at(1200));
    assert_eq!(old.findings.len(), 1, "{old:?}");
    // Listed first after it began: it may be its volume.
    let new = audit_pass(&AuditMemory::new(), &listed, &refs.get(), &policy, at(900));
    let new = audit_pass(&new.memory, &listed, &refs.get(), &policy, at(1200));
    assert!(new.findings.is_empty(), "{new:?}");
    // Only held back, not referenced: once the operation is gone it may be deleted.
    let held_back = audit_pass(&AuditMemory::new(), &listed, &refs.get(), &policy, at(900));
    assert!(!held_back.memory["vol-new"].ever_referenced);
    // A volume holding another of our names is not that operation's.
    let named = [volume(&format!("pvc-{OTHER_UID}"))];
    let findings = two_passes(&named, &refs, &policy);
    assert_eq!(findings.len(), 1);
    // A deletion recorded by id holds back nothing but its own volume, listed or not.
    refs.in_flight = vec![InFlight {
        volume_name: format!("pvc-{OTHER_UID}"),
        since: at(1000),
        volume_id: Some("vol-deleting".to_owned()),
    }];
    let listed = [volume("vol-new"), volume("vol-deleting")];
    let new = audit_pass(&AuditMemory::new(), &listed, &refs.get(), &policy, at(900));
    let new = audit_pass(&new.memory, &listed, &refs.get(), &policy, at(1200));
    let ids: Vec<&str> = new.findings.iter().map(|f| f.volume.id.as_str()).collect();
    assert_eq!(ids, ["vol-new"]);
}

#[test]
fn an_in_tree_pv_references_its_volume_through_migration() {
    let mut refs = Refs::new();
    refs.driver = "ebs.csi.aws.com".to_owned();
    let pv = |name: &str, volume_id: &str| PersistentVolume {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeSpec {
            aws_elastic_block_store: Some(AWSElasticBlockStoreVolumeSource {
                volume_id: volume_id.to_owned(),
                ..AWSElasticBlockStoreVolumeSource::default()
            }),
            ..PersistentVolumeSpec::default()
        }),
        ..PersistentVolume::default()
    };
    refs.in_tree
        .push(pv("in-tree", "aws://us-east-1a/vol-0123"));
    let listed = [volume("vol-0123"), volume("vol-0456")];
    let findings = two_passes(&listed, &refs, &policy(None));
    let ids: Vec<&str> = findings.iter().map(|f| f.volume.id.as_str()).collect();
    assert_eq!(ids, ["vol-0456"]);
    // One that cannot be translated leaves the volumes it may hold undecided.
    refs.in_tree = vec![pv("broken", "aws://us-east-1a/x/vol-0456")];
    let first = audit_pass(
        &AuditMemory::new(),
        &listed,
        &refs.get(),
        &policy(None),
        at(0),
    );
    let undecided: Vec<(&str, &str)> = first
        .undecided
        .iter()
        .map(|(id, pv, _)| (id.as_str(), pv.as_str()))
        .collect();
    assert_eq!(undecided, [("vol-0456", "broken")]);
    let later = audit_pass(&first.memory, &listed, &refs.get(), &policy(None), at(60));
    let ids: Vec<&str> = later
        .findings
        .iter()
        .map(|f| f.volume.id.as_str())
        .collect();
    assert_eq!(ids, ["vol-0123"], "an undecided volume is not reported");
}

#[test]
fn only_our_names_whose_claim_is_gone_may_be_deleted_and_only_after_the_delay() {
    let name = format!("pvc-{UID}");
    let mut refs = Refs::new();
    let listed = [volume(&format!("ref-{name}")), volume("vol-random")];
    let off = two_passes(&listed, &refs, &policy(None));
    assert!(off.iter().all(|f| f.deletion == Deletion::Off));

    let waiting = two_passes(&listed, &refs, &policy(Some(120)));
    assert_eq!(waiting[0].deletion, Deletion::NotBefore(at(120)));
    assert_eq!(waiting[1].deletion, Deletion::NotOurName);

    let due = two_passes(&listed, &refs, &policy(Some(60)));
    assert_eq!(
        due[0].deletion,
        Deletion::Due {
            volume_name: name.clone(),
            claim_uid: UID.to_owned(),
        }
    );

    refs.claims.insert(UID.to_owned());
    let kept = two_passes(&listed, &refs, &policy(Some(60)));
    assert_eq!(
        kept[0].deletion,
        Deletion::ClaimExists {
            claim_uid: UID.to_owned()
        }
    );
    refs.claims.clear();

    let published = [ListedVolume {
        in_use: true,
        ..volume(&format!("ref-{name}"))
    }];
    let in_use = two_passes(&published, &refs, &policy(Some(60)));
    assert_eq!(in_use[0].deletion, Deletion::InUse);
}

#[test]
fn a_volume_once_referenced_is_never_deleted_but_still_reported() {
    // A Retain volume whose PV an admin deleted to keep the data.
    let id = format!("pvc-{UID}");
    let mut refs = Refs::new();
    refs.handles.insert(id.clone());
    let listed = [volume(&id)];
    let policy = policy(Some(60));
    let held = audit_pass(&AuditMemory::new(), &listed, &refs.get(), &policy, at(0));
    refs.handles.clear();
    let first = audit_pass(&held.memory, &listed, &refs.get(), &policy, at(60));
    let later = audit_pass(&first.memory, &listed, &refs.get(), &policy, at(600));
    assert_eq!(later.findings[0].deletion, Deletion::WasReferenced);
}

#[test]
fn an_unreadable_record_time_holds_back_reports_and_never_panics() {
    let mut refs = Refs::new();
    refs.in_flight.push(InFlight {
        volume_name: "lost".to_owned(),
        since: Timestamp::MIN,
        volume_id: None,
    });
    let listed = [volume("vol-1")];
    let findings = two_passes(&listed, &refs, &policy(Some(u64::MAX)));
    assert!(findings.is_empty());
}

#[test]
fn a_short_uid_matches_every_claim_it_could_be() {
    let short = AuditPolicy {
        uuid_length: 8,
        ..policy(Some(60))
    };
    let listed = [volume("pvc-0b6c6f4e")];
    let mut refs = Refs::new();
    refs.claims.insert(OTHER_UID.to_owned());
    let due = two_passes(&listed, &refs, &short);
    assert!(matches!(due[0].deletion, Deletion::Due { .. }), "{due:?}");
    refs.claims.insert(UID.to_owned());
    let kept = two_passes(&listed, &refs, &short);
    assert!(
        matches!(kept[0].deletion, Deletion::ClaimExists { .. }),
        "{kept:?}"
    );
}

#[test]
fn our_names_are_found_whole_at_the_end_of_an_id() {
    let name = format!("pvc-{UID}");
    assert_eq!(
        our_volume_name(&name, "pvc", -1),
        Some((name.clone(), UID.to_owned()))
    );
    assert!(our_volume_name(&format!("ref-{name}"), "pvc", -1).is_some());
    assert!(our_volume_name(&format!("ref/{name}"), "pvc", -1).is_some());
    assert_eq!(our_volume_name(&format!("xpvc-{UID}"), "pvc", -1), None);
    assert_eq!(our_volume_name(&format!("{name}-1"), "pvc", -1), None);
    assert_eq!(
        our_volume_name(&format!("pvc-{}", UID.to_uppercase()), "pvc", -1),
        None
    );
    assert_eq!(our_volume_name("pvc-0b6c6f4e", "pvc", -1), None);
    assert_eq!(
        our_volume_name("pvc-0b6c6f4e", "pvc", 8),
        Some(("pvc-0b6c6f4e".to_owned(), "0b6c6f4e".to_owned()))
    );
    assert_eq!(our_volume_name("pvc-0b6c-f4e", "pvc", 8), None);
    assert_eq!(our_volume_name("vol-1", "pvc", -1), None);
}
