//! Claims of in-tree classes migrated to the driver.

use super::*;

const GCE: &str = "pd.csi.storage.gke.io";

/// A claim of in-tree class `standard` (`kubernetes.io/gce-pd`), as kube-controller-manager
/// annotates it for the driver `pd.csi.storage.gke.io`.
fn migrated() -> (Cluster, PersistentVolumeClaim) {
    let class = ClassBuilder::new()
        .provisioner("kubernetes.io/gce-pd")
        .parameter("fstype", "ext4")
        .parameter("type", "pd-ssd")
        .build();
    let pvc = PvcBuilder::new()
        .annotation(ANN_STORAGE_PROVISIONER, GCE)
        .annotation(ANN_MIGRATED_TO, GCE)
        .resource_version("7")
        .build();
    (Cluster::new().driver(GCE).class(class), pvc)
}

fn migrated_create() -> CreateVolumeCall {
    CreateVolumeCall {
        parameters: strings(&[("type", "pd-ssd")]),
        secrets: HashMap::new(),
        ..expected_create()
    }
}

#[tokio::test(start_paused = true)]
async fn a_migrated_claim_is_provisioned_with_the_translated_class_and_an_in_tree_pv() {
    let (cluster, pvc) = migrated();
    let handle = format!("projects/p/zones/us-central1-a/disks/{}", claim_volume());
    let scenario = cluster
        .start([
            record_written(),
            create_volume(migrated_create(), created(&handle, GIB)),
            post("/api/v1/persistentvolumes")
                .body(json!({
                    "metadata": {
                        "name": claim_volume(),
                        "annotations": { "pv.kubernetes.io/provisioned-by": "kubernetes.io/gce-pd" },
                    },
                    "spec": {
                        "gcePersistentDisk": { "pdName": claim_volume(), "fsType": "ext4" },
                        "claimRef": { "namespace": "apps", "name": "data", "uid": PVC_UID },
                    },
                }))
                .echo(201),
            record_removed(),
        ])
        .await;
    assert_eq!(reconcile(&scenario, pvc).await, Next::Wait);
    assert_eq!(scenario.finish().await, [provisioning(), succeeded()]);
}

#[tokio::test(start_paused = true)]
async fn a_migrated_volume_whose_pv_cannot_be_translated_is_deleted_under_its_record() {
    let (cluster, pvc) = migrated();
    let scenario = cluster
        .start([
            record_written(),
            create_volume(migrated_create(), created("vol-1", GIB)),
            get(claim_volume_path()).refuse(404, "NotFound"),
            delete_volume("vol-1", &[], Err(Status::unavailable("driver restarting"))),
        ])
        .await;
    assert_eq!(
        reconcile(&scenario, pvc.clone()).await,
        Next::RetryIn(RETRY_START)
    );
    // The failed deletion keeps the record: the volume is not forgotten.
    assert!(in_flight(&scenario));
    let mut events = scenario.finish().await;
    assert_eq!(events.remove(0), provisioning());
    assert!(
        events[0].contains("deleting the volume failed, it is retried"),
        "{events:?}"
    );

    // A PV of the name holding another volume (an in-tree source cannot hold this handle).
    let (cluster, pvc) = migrated();
    let other = PvBuilder::new()
        .name(&claim_volume())
        .no_csi()
        .map(|pv| {
            if let Some(spec) = pv.spec.as_mut() {
                spec.gce_persistent_disk = Some(GCEPersistentDiskVolumeSource {
                    pd_name: "vol-1".to_owned(),
                    ..Default::default()
                });
            }
        })
        .build();
    let scenario = cluster
        .start([
            record_written(),
            create_volume(migrated_create(), created("vol-1", GIB)),
            get(claim_volume_path()).answer(200, other),
            delete_volume("vol-1", &[], Ok(())),
            record_removed(),
        ])
        .await;
    assert_eq!(reconcile(&scenario, pvc).await, Next::RetryIn(RETRY_START));
    assert!(!in_flight(&scenario));
    assert_eq!(
        scenario.finish().await,
        [
            provisioning(),
            failed(&format!(
                "failed to translate the CSI PV of volume {} to in-tree: failed to get id components.Got: 1, wanted 6 components or more. ; the volume was deleted",
                claim_volume()
            ))
        ]
    );
}

/// The untranslatable volume is deleted only if no PV of its name references it: one that
/// does (an earlier attempt's, or a colliding claim's) keeps it and ends the operation.
#[tokio::test(start_paused = true)]
async fn an_untranslatable_volume_that_a_pv_references_is_not_deleted() {
    let (cluster, pvc) = migrated();
    let holder = PvBuilder::new()
        .name(&claim_volume())
        .csi_driver(GCE)
        .handle("vol-1")
        .build();
    let scenario = cluster
        .start([
            record_written(),
            create_volume(migrated_create(), created("vol-1", GIB)),
            get(claim_volume_path()).answer(200, holder),
            record_removed(),
        ])
        .await;
    assert_eq!(reconcile(&scenario, pvc).await, Next::RetryIn(RETRY_START));
    assert!(!in_flight(&scenario));
    let events = scenario.finish().await;
    assert_eq!(events.len(), 2, "{events:?}");
}

#[tokio::test(start_paused = true)]
async fn a_migrated_class_that_cannot_be_translated_is_reported_before_anything_is_sent() {
    let (cluster, pvc) = migrated();
    let class = ClassBuilder::new()
        .provisioner("kubernetes.io/gce-pd")
        .parameter("zone", "z")
        .build();
    let mut class = class;
    class.allowed_topologies = Some(vec![Default::default()]);
    let scenario = cluster.class(class).start([]).await;
    assert_eq!(reconcile(&scenario, pvc).await, Next::RetryIn(RETRY_START));
    assert_eq!(
        scenario.finish().await,
        [
            provisioning(),
            failed(
                "failed to translate storage class: cannot simultaneously set allowed topologies and zone/zones parameters"
            )
        ]
    );
}
