use super::*;
use crate::api::VolumeSnapshotStatus;
use crate::csi::volume_content_source::{SnapshotSource, VolumeSource};
use crate::fixtures::{DRIVER, PvcBuilder};

fn ours(handle: &str) -> Option<SourceVolume<'_>> {
    Some(SourceVolume {
        driver: DRIVER,
        handle,
    })
}
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

fn cloning(volume_id: &str) -> csi::VolumeContentSource {
    csi::VolumeContentSource {
        r#type: Some(Type::Volume(VolumeSource {
            volume_id: volume_id.to_owned(),
        })),
    }
}

fn restoring(snapshot_id: &str) -> csi::VolumeContentSource {
    csi::VolumeContentSource {
        r#type: Some(Type::Snapshot(SnapshotSource {
            snapshot_id: snapshot_id.to_owned(),
        })),
    }
}

/// Claim `apps/src`, being deleted, with the clone finalizer.
fn source() -> PersistentVolumeClaim {
    PvcBuilder::new()
        .name("src")
        .annotation(crate::ANN_STORAGE_PROVISIONER, DRIVER)
        .finalizer(CLONE_PROTECTION_FINALIZER)
        .deleting()
        .build()
}

fn clone_of(name: &str, phase: &str) -> PvcBuilder {
    PvcBuilder::new()
        .name("copy")
        .phase(phase)
        .data_source(None, CLAIM_KIND, name)
}

#[test]
fn a_source_not_deleted_or_without_the_finalizer_is_untouched() {
    let none = InFlightSources::default();
    let alive = PvcBuilder::new()
        .name("src")
        .finalizer(CLONE_PROTECTION_FINALIZER)
        .build();
    assert_eq!(
        clone_verdict(&alive, [], None, DRIVER, &none),
        CloneVerdict::Untouched
    );
    let unprotected = PvcBuilder::new().name("src").deleting().build();
    assert_eq!(
        clone_verdict(&unprotected, [], None, DRIVER, &none),
        CloneVerdict::Untouched
    );
}

#[test]
fn a_pending_clone_holds_its_source_with_upstreams_text() {
    let clone = clone_of("src", "Pending").build();
    let verdict = clone_verdict(
        &source(),
        [&clone],
        ours("vol-1"),
        DRIVER,
        &Default::default(),
    );
    assert_eq!(
        verdict,
        CloneVerdict::Keep(CloneHold::PendingClone("apps/copy".into()))
    );
    let CloneVerdict::Keep(hold) = verdict else {
        unreachable!()
    };
    assert_eq!(
        hold.to_string(),
        "PVC 'apps/copy' is in 'Pending' state, cloning in progress"
    );
}

#[test]
fn a_bound_clone_or_a_clone_of_another_claim_holds_nothing() {
    let bound = clone_of("src", "Bound").build();
    let other = clone_of("other", "Pending").build();
    let elsewhere = clone_of("src", "Pending").namespace("other-ns").build();
    assert_eq!(
        clone_verdict(
            &source(),
            [&bound, &other, &elsewhere],
            ours("vol-1"),
            DRIVER,
            &Default::default()
        ),
        CloneVerdict::Release
    );
}

#[test]
fn a_cross_namespace_clone_holds_its_source_unlike_upstreams_a2() {
    let clone = PvcBuilder::new()
        .name("copy")
        .namespace("other-ns")
        .phase("Pending")
        .data_source_ref(None, CLAIM_KIND, "src", Some("apps"))
        .build();
    assert_eq!(
        clone_verdict(
            &source(),
            [&clone],
            ours("vol-1"),
            DRIVER,
            &Default::default()
        ),
        CloneVerdict::Keep(CloneHold::PendingClone("other-ns/copy".into()))
    );
}

#[test]
fn an_operation_in_flight_cloning_the_volume_holds_it() {
    let in_flight = InFlightSources::new(&[cloning("vol-1"), restoring("snap-1")]);
    assert_eq!(
        clone_verdict(&source(), [], ours("vol-1"), DRIVER, &in_flight),
        CloneVerdict::Keep(CloneHold::InFlight {
            volume_id: "vol-1".into()
        })
    );
    assert_eq!(
        clone_verdict(&source(), [], ours("vol-2"), DRIVER, &in_flight),
        CloneVerdict::Release
    );
    let foreign = SourceVolume {
        driver: "other.example.com",
        handle: "vol-1",
    };
    assert_eq!(
        clone_verdict(&source(), [], Some(foreign), DRIVER, &Default::default()),
        CloneVerdict::Untouched,
        "another driver's sidecar decides for its volumes"
    );
    let mut foreign_claim = source();
    foreign_claim.metadata.annotations = Some(
        [(
            crate::ANN_STORAGE_PROVISIONER.to_owned(),
            "other.example.com".to_owned(),
        )]
        .into(),
    );
    assert_eq!(
        clone_verdict(&foreign_claim, [], None, DRIVER, &Default::default()),
        CloneVerdict::Untouched,
        "a claim of another provisioner whose PV is not known here is not ours either"
    );
    assert_eq!(
        clone_verdict(&source(), [], None, DRIVER, &in_flight),
        CloneVerdict::Keep(CloneHold::UnknownVolume),
        "an unknown volume may be the one cloned"
    );
    let restores_only = InFlightSources::new(&[restoring("snap-1")]);
    assert_eq!(
        clone_verdict(&source(), [], None, DRIVER, &restores_only),
        CloneVerdict::Release
    );
}

fn snapshot(name: &str, content: Option<&str>, protected: bool) -> VolumeSnapshot {
    VolumeSnapshot {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("apps".into()),
            finalizers: protected.then(|| vec![SNAPSHOT_PROTECTION_FINALIZER.to_owned()]),
            ..ObjectMeta::default()
        },
        status: Some(VolumeSnapshotStatus {
            bound_volume_snapshot_content_name: content.map(str::to_owned),
            ..VolumeSnapshotStatus::default()
        }),
        ..VolumeSnapshot::default()
    }
}

fn restore_of(phase: &str) -> PvcBuilder {
    PvcBuilder::new().phase(phase)
}

#[test]
fn pending_or_unset_claims_index_the_snapshots_they_restore() {
    let claims = [
        restore_of("Pending")
            .data_source(Some(SNAPSHOT_API_GROUP), SNAPSHOT_KIND, "a")
            .build(),
        restore_of("").data_source(None, SNAPSHOT_KIND, "b").build(),
        restore_of("Pending")
            .data_source_ref(Some(SNAPSHOT_API_GROUP), SNAPSHOT_KIND, "c", Some("other"))
            .build(),
        restore_of("Pending")
            .data_source_ref(None, SNAPSHOT_KIND, "d", None)
            .build(),
        // Bound, another group, another kind: not indexed.
        restore_of("Bound")
            .data_source(None, SNAPSHOT_KIND, "e")
            .build(),
        restore_of("Pending")
            .data_source(Some("example.com"), SNAPSHOT_KIND, "f")
            .build(),
        restore_of("Pending")
            .data_source(None, CLAIM_KIND, "g")
            .build(),
    ];
    let index = PendingRestores::new(&claims);
    let mut keys: Vec<_> = index.0.iter().cloned().collect();
    keys.sort();
    assert_eq!(keys, ["apps/a", "apps/b", "apps/d", "other/c"]);
}

fn our_content(handle: Option<&str>) -> SnapshotContent<'_> {
    SnapshotContent::Listed {
        driver: DRIVER,
        handle,
    }
}

#[test]
fn a_snapshot_a_pending_claim_restores_is_kept_and_others_released() {
    let claims = [restore_of("Pending")
        .data_source(None, SNAPSHOT_KIND, "wanted")
        .build()];
    let pending = PendingRestores::new(&claims);
    let none = InFlightSources::default();
    let verdict = |snap: &VolumeSnapshot| {
        snapshot_verdict(snap, &pending, &none, our_content(Some("snap-1")), DRIVER)
    };
    assert_eq!(
        verdict(&snapshot("wanted", Some("c1"), true)),
        SnapshotVerdict::Keep(SnapshotHold::PendingRestore)
    );
    assert_eq!(
        verdict(&snapshot("orphan", Some("c2"), true)),
        SnapshotVerdict::Release
    );
    assert_eq!(
        verdict(&snapshot("orphan", Some("c2"), false)),
        SnapshotVerdict::Untouched
    );
}

#[test]
fn with_restores_in_flight_the_content_handle_decides() {
    let pending = PendingRestores::default();
    let in_flight = InFlightSources::new(&[restoring("snap-1")]);
    let snap = snapshot("s", Some("content-1"), true);
    let verdict = |content| snapshot_verdict(&snap, &pending, &in_flight, content, DRIVER);
    assert_eq!(
        verdict(our_content(Some("snap-1"))),
        SnapshotVerdict::Keep(SnapshotHold::InFlight {
            snapshot_id: "snap-1".into()
        })
    );
    assert_eq!(
        verdict(our_content(Some("snap-2"))),
        SnapshotVerdict::Release
    );
    assert_eq!(verdict(our_content(None)), SnapshotVerdict::Release);
    assert_eq!(verdict(SnapshotContent::Missing), SnapshotVerdict::Release);
    assert_eq!(
        verdict(SnapshotContent::Unknown),
        SnapshotVerdict::Keep(SnapshotHold::UnknownHandle)
    );
}

#[test]
fn another_drivers_snapshot_is_left_to_its_sidecar() {
    let pending = PendingRestores::default();
    let none = InFlightSources::default();
    let foreign = SnapshotContent::Listed {
        driver: "other.example.com",
        handle: Some("snap-1"),
    };
    assert_eq!(
        snapshot_verdict(
            &snapshot("s", Some("c"), true),
            &pending,
            &none,
            foreign,
            DRIVER
        ),
        SnapshotVerdict::Untouched
    );
}
