use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::*;
use crate::api::{VolumeSnapshotContentSpec, VolumeSnapshotContentStatus, VolumeSnapshotStatus};
use crate::fixtures::{ClassBuilder, DRIVER, PvBuilder, PvcBuilder, deletion_time};

const SOURCE_UID: &str = "5c1c8b4e-0000-4000-8000-00000000000a";
const SNAPSHOT_UID: &str = "5c1c8b4e-0000-4000-8000-00000000000b";

fn clone_of(name: &str) -> DataSource {
    DataSource {
        kind: SourceKind::Clone,
        namespace: "apps".into(),
        name: name.into(),
    }
}

/// The bound source claim `src` (1Gi) of volume `pv-src`.
fn source_claim() -> PvcBuilder {
    PvcBuilder::new()
        .uid(SOURCE_UID)
        .volume_name("pv-src")
        .phase("Bound")
        .storage("1Gi")
}

fn named(builder: PvcBuilder, name: &str) -> PersistentVolumeClaim {
    let mut claim = builder.build();
    claim.metadata.name = Some(name.into());
    claim
}

fn source_pv() -> PvBuilder {
    PvBuilder::new()
        .name("pv-src")
        .handle("vol-src")
        .claim_uid(SOURCE_UID)
}

fn pv_named_for_src(builder: PvBuilder) -> PersistentVolume {
    let mut pv = builder.build();
    if let Some(claim) = pv.spec.as_mut().and_then(|s| s.claim_ref.as_mut()) {
        claim.name = Some("src".into());
    }
    pv
}

fn clone_check(pvc: PvcBuilder, source: PvcBuilder) -> Result<String, String> {
    check_clone_source(&pvc.build(), &clone_of("src"), &named(source, "src"))
        .map_err(|e| e.to_string())
}

fn clone(pvc: PvcBuilder, pv: Option<PvBuilder>) -> Result<csi::VolumeContentSource, String> {
    let pv = pv.map(pv_named_for_src);
    clone_content_source(
        &pvc.build(),
        &ClassBuilder::new().build(),
        &clone_of("src"),
        &named(source_claim(), "src"),
        pv.as_ref(),
    )
    .map_err(|e| e.to_string())
}

const CLONE_PREFIX: &str =
    "error getting handle for DataSource Type PersistentVolumeClaim by Name src: ";

#[test]
fn a_bound_source_of_the_same_driver_is_cloned_from_its_volume() {
    assert_eq!(
        clone_check(PvcBuilder::new(), source_claim()),
        Ok("pv-src".into())
    );
    assert_eq!(
        clone(PvcBuilder::new(), Some(source_pv())),
        Ok(csi::VolumeContentSource {
            r#type: Some(Type::Volume(VolumeSource {
                volume_id: "vol-src".into()
            }))
        })
    );
}

#[test]
fn source_claim_checks_come_in_upstreams_order_with_its_texts() {
    let cases = [
        (
            PvcBuilder::new(),
            PvcBuilder::new().phase("Pending"),
            "the PVC DataSource src must have a status of Bound.  Got {Pending [] map[] [] map[] map[] <nil> <nil>}",
        ),
        (
            PvcBuilder::new(),
            source_claim().deleting(),
            "the PVC DataSource src is currently being deleted",
        ),
        (
            PvcBuilder::new(),
            source_claim().no_class(),
            "the source PVC (src) storageclass cannot be empty",
        ),
        (
            PvcBuilder::new().no_class(),
            source_claim(),
            "the requested PVC (data) storageclass cannot be empty",
        ),
        (
            PvcBuilder::new().storage("512Mi"),
            source_claim(),
            "error, new PVC request must be greater than or equal in size to the specified PVC data source, requested 536870912 but source is 1073741824",
        ),
        (
            PvcBuilder::new(),
            source_claim().volume_name(""),
            "volume name is empty in source PVC src",
        ),
    ];
    for (pvc, source, text) in cases {
        assert_eq!(
            clone_check(pvc, source),
            Err(format!("{CLONE_PREFIX}{text}"))
        );
    }
}

#[test]
fn a_source_volume_that_is_not_the_source_claims_is_invalid() {
    let generic = format!("{CLONE_PREFIX}claim in dataSource not bound or invalid");
    for pv in [
        None,
        Some(source_pv().no_csi()),
        Some(source_pv().csi_driver("other.example.com")),
        Some(source_pv().no_claim_ref()),
        Some(source_pv().claim_uid("another-uid")),
        Some(source_pv().phase("Released")),
    ] {
        assert_eq!(clone(PvcBuilder::new(), pv), Err(generic.clone()));
    }
}

#[test]
fn a_clone_keeps_the_volume_mode() {
    let block_pv = || {
        let mut pv = source_pv();
        pv = pv.name("pv-src");
        pv
    };
    let mut block = pv_named_for_src(block_pv());
    if let Some(spec) = block.spec.as_mut() {
        spec.volume_mode = Some("Block".into());
    }
    let run = |pvc: PvcBuilder, pv: &PersistentVolume| {
        clone_content_source(
            &pvc.build(),
            &ClassBuilder::new().build(),
            &clone_of("src"),
            &named(source_claim(), "src"),
            Some(pv),
        )
        .map(|_| ())
        .map_err(|e| e.to_string())
    };
    assert_eq!(
        run(PvcBuilder::new(), &block),
        Err(format!(
            "{CLONE_PREFIX}the source PVC and destination PVCs must have the same volume mode for cloning.  Source is Block, but new PVC requested Filesystem"
        ))
    );
    assert_eq!(run(PvcBuilder::new().volume_mode("Block"), &block), Ok(()));
    let filesystem = pv_named_for_src(source_pv());
    assert_eq!(
        run(PvcBuilder::new().volume_mode("Block"), &filesystem),
        Err(format!(
            "{CLONE_PREFIX}the source PVC and destination PVCs must have the same volume mode for cloning.  Source is Filesystem, but new PVC requested Block"
        ))
    );
    assert_eq!(
        run(PvcBuilder::new().volume_mode("Filesystem"), &filesystem),
        Ok(())
    );
}

fn restore_of(name: &str) -> DataSource {
    DataSource {
        kind: SourceKind::Snapshot,
        namespace: "apps".into(),
        name: name.into(),
    }
}

fn snapshot() -> VolumeSnapshot {
    VolumeSnapshot {
        metadata: ObjectMeta {
            name: Some("snap".into()),
            namespace: Some("apps".into()),
            uid: Some(SNAPSHOT_UID.into()),
            ..ObjectMeta::default()
        },
        status: Some(VolumeSnapshotStatus {
            bound_volume_snapshot_content_name: Some("content-1".into()),
            ready_to_use: Some(true),
            restore_size: Some(Quantity("1Gi".into())),
        }),
        ..VolumeSnapshot::default()
    }
}

fn content() -> VolumeSnapshotContent {
    VolumeSnapshotContent {
        metadata: ObjectMeta {
            name: Some("content-1".into()),
            ..ObjectMeta::default()
        },
        spec: VolumeSnapshotContentSpec {
            driver: DRIVER.into(),
            deletion_policy: "Delete".into(),
            volume_snapshot_ref: k8s_openapi::api::core::v1::ObjectReference {
                name: Some("snap".into()),
                namespace: Some("apps".into()),
                uid: Some(SNAPSHOT_UID.into()),
                ..Default::default()
            },
            source_volume_mode: Some("Filesystem".into()),
            ..VolumeSnapshotContentSpec::default()
        },
        status: Some(VolumeSnapshotContentStatus {
            snapshot_handle: Some("snap-handle".into()),
            ready_to_use: Some(true),
            restore_size: Some(1 << 30),
        }),
    }
}

fn restore(
    pvc: PvcBuilder,
    snapshot: &VolumeSnapshot,
    content: &VolumeSnapshotContent,
) -> Result<csi::VolumeContentSource, String> {
    snapshot_content_source(
        &pvc.build(),
        &ClassBuilder::new().build(),
        &restore_of("snap"),
        snapshot,
        content,
        true,
    )
    .map_err(|e| e.to_string())
}

const RESTORE_PREFIX: &str =
    "error getting handle for DataSource Type VolumeSnapshot by Name snap: ";

#[test]
fn a_ready_snapshot_of_the_driver_is_restored_from_its_handle() {
    assert_eq!(
        check_snapshot_source(&restore_of("snap"), &snapshot()),
        Ok("content-1".into())
    );
    assert_eq!(
        restore(PvcBuilder::new().storage("2Gi"), &snapshot(), &content()),
        Ok(csi::VolumeContentSource {
            r#type: Some(Type::Snapshot(SnapshotSource {
                snapshot_id: "snap-handle".into()
            }))
        })
    );
}

#[test]
fn a_snapshot_being_deleted_is_used_only_by_a_restore_that_protected_it() {
    let mut deleting = snapshot();
    deleting.metadata.deletion_timestamp = Some(deletion_time());
    assert_eq!(
        check_snapshot_source(&restore_of("snap"), &deleting).map_err(|e| e.to_string()),
        Err(format!("{RESTORE_PREFIX}snapshot snap is being deleted"))
    );
    deleting.metadata.finalizers = Some(vec![SNAPSHOT_PROTECTION_FINALIZER.into()]);
    assert_eq!(
        check_snapshot_source(&restore_of("snap"), &deleting),
        Ok("content-1".into())
    );
    let mut unbound = snapshot();
    unbound.status = None;
    assert_eq!(
        check_snapshot_source(&restore_of("snap"), &unbound).map_err(|e| e.to_string()),
        Err(format!("{RESTORE_PREFIX}snapshot snap not bound"))
    );
}

#[test]
fn content_and_readiness_checks_come_in_upstreams_order_with_its_texts() {
    let mut other_snapshot = content();
    other_snapshot.spec.volume_snapshot_ref.uid = Some("old-uid".into());
    let mut other_driver = content();
    other_driver.spec.driver = "other.example.com".into();
    let mut no_handle = content();
    no_handle.status = None;
    let mut not_ready = snapshot();
    if let Some(status) = not_ready.status.as_mut() {
        status.ready_to_use = Some(false);
    }
    let cases = [
        (
            snapshot(),
            other_snapshot,
            "snapshotcontent content-1 for snapshot snap is bound to a different snapshot",
        ),
        (
            snapshot(),
            other_driver,
            "snapshotcontent content-1 for snapshot snap is not handled by CSI driver of StorageClass standard",
        ),
        (not_ready, content(), "snapshot snap is not Ready"),
        (
            snapshot(),
            no_handle,
            "snapshot handle snap is not available",
        ),
    ];
    for (snapshot, content, text) in cases {
        assert_eq!(
            restore(PvcBuilder::new(), &snapshot, &content),
            Err(format!("{RESTORE_PREFIX}{text}"))
        );
    }
}

#[test]
fn a_restore_is_at_least_as_large_as_the_snapshot() {
    assert_eq!(
        restore(PvcBuilder::new().storage("512Mi"), &snapshot(), &content()),
        Err(format!(
            "{RESTORE_PREFIX}requested volume size 536870912 is less than the size 1073741824 for the source snapshot snap"
        ))
    );
    assert_eq!(
        restore(PvcBuilder::new().no_storage(), &snapshot(), &content()),
        Err(format!(
            "{RESTORE_PREFIX}error getting capacity for PVC data when creating snapshot snap"
        ))
    );
    let mut unknown_size = snapshot();
    if let Some(status) = unknown_size.status.as_mut() {
        status.restore_size = None;
    }
    assert!(restore(PvcBuilder::new().storage("1Mi"), &unknown_size, &content()).is_ok());
}

#[test]
fn a_restore_into_another_volume_mode_needs_the_contents_permission() {
    let denied = |reason: &str| {
        Err(format!(
            "{RESTORE_PREFIX}requested volume apps/data modifies the mode of the source volume but does not have permission to do so. {reason}"
        ))
    };
    let block = || PvcBuilder::new().volume_mode("Block");
    assert_eq!(
        restore(block(), &snapshot(), &content()),
        denied(
            "snapshot.storage.kubernetes.io/allow-volume-mode-change annotation is not present on snapshotcontent content-1"
        )
    );
    let with = |value: &str| {
        let mut content = content();
        content.metadata.annotations =
            Some([(ANN_ALLOW_VOLUME_MODE_CHANGE.to_owned(), value.to_owned())].into());
        content
    };
    assert_eq!(
        restore(block(), &snapshot(), &with("yes")),
        denied(
            "failed to convert snapshot.storage.kubernetes.io/allow-volume-mode-change annotation value to boolean with error: strconv.ParseBool: parsing \"yes\": invalid syntax"
        )
    );
    assert_eq!(
        restore(block(), &snapshot(), &with("False")),
        denied(
            "snapshot.storage.kubernetes.io/allow-volume-mode-change is set to false on snapshotcontent content-1"
        )
    );
    assert!(restore(block(), &snapshot(), &with("TRUE")).is_ok());
    // The same mode, or no mode on either side, needs nothing.
    assert!(
        restore(
            PvcBuilder::new().volume_mode("Filesystem"),
            &snapshot(),
            &content()
        )
        .is_ok()
    );
    assert!(restore(PvcBuilder::new(), &snapshot(), &content()).is_ok());
    // With the flag off, nothing is compared.
    let off = snapshot_content_source(
        &block().build(),
        &ClassBuilder::new().build(),
        &restore_of("snap"),
        &snapshot(),
        &content(),
        false,
    );
    assert!(off.is_ok());
}
