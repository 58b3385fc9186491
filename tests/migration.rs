//! In-tree migration on the real control plane: kube-controller-manager 1.36 treats
//! `kubernetes.io/gce-pd` as migrated to `pd.csi.storage.gke.io` unconditionally, so a claim
//! of a `kubernetes.io/gce-pd` class is handed to the sidecar of a driver of that name (the
//! reference driver, serving ids in the GCE PD format). One test: the driver name is fixed, so
//! no two tests on one control plane could use it side by side. No other test of its binary
//! (tests/cluster/main.rs) uses it; tests/differential.rs does, on the scheduler binary's.

use csi_test_support as support;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    AzureFilePersistentVolumeSource, GCEPersistentDiskVolumeSource, ObjectReference,
    PersistentVolume, PersistentVolumeSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;

use support::cluster::{Cluster, create_class, storage_class, wait_bound, wait_event};
use support::eventually;
use support::peers::{Driver, Sidecar, SidecarOptions, TIMEOUT, metric_sum, parse_metrics};

const GCE_DRIVER: &str = "pd.csi.storage.gke.io";
const GCE_IN_TREE: &str = "kubernetes.io/gce-pd";
const ZONE: &str = "us-central1-a";
const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
const REGION_LABEL: &str = "topology.kubernetes.io/region";
const ID_PREFIX: &str = "projects/UNSPECIFIED/zones/us-central1-a/disks/";
const PV_FINALIZER: &str = "external-provisioner.volume.kubernetes.io/finalizer";
const LEFT_ALONE: &str = "migrated volume left alone";

fn annotation<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations.as_ref()?.get(key).map(String::as_str)
}

fn has_our_finalizer(pv: &PersistentVolume) -> bool {
    pv.metadata
        .finalizers
        .iter()
        .flatten()
        .any(|finalizer| finalizer == PV_FINALIZER)
}

/// A Released GCE PD PV (its claim never existed) that names us but whose zone label holds
/// two zones in no region: its handle cannot be translated.
fn untranslatable_pv(name: &str, namespace: &str) -> PersistentVolume {
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(BTreeMap::from([(
                ZONE_LABEL.to_owned(),
                "bad__zones".to_owned(),
            )])),
            annotations: Some(BTreeMap::from([(
                "pv.kubernetes.io/provisioned-by".to_owned(),
                GCE_IN_TREE.to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeSpec {
            capacity: Some(BTreeMap::from([(
                "storage".to_owned(),
                Quantity("1Gi".to_owned()),
            )])),
            access_modes: Some(vec!["ReadWriteOnce".to_owned()]),
            persistent_volume_reclaim_policy: Some("Delete".to_owned()),
            gce_persistent_disk: Some(GCEPersistentDiskVolumeSource {
                pd_name: "broken".to_owned(),
                ..GCEPersistentDiskVolumeSource::default()
            }),
            claim_ref: Some(ObjectReference {
                kind: Some("PersistentVolumeClaim".to_owned()),
                namespace: Some(namespace.to_owned()),
                name: Some("never-existed".to_owned()),
                uid: Some("00000000-0000-0000-0000-000000000000".to_owned()),
                ..ObjectReference::default()
            }),
            ..PersistentVolumeSpec::default()
        }),
        ..PersistentVolume::default()
    }
}

#[tokio::test]
async fn a_gce_pd_claim_is_provisioned_and_deleted_through_the_csi_driver() {
    let cluster = Cluster::new("migration").await;
    let mut driver = Driver::start_as(
        GCE_DRIVER,
        &[
            "--topology",
            &format!("topology.gke.io/zone={ZONE}"),
            "--volume-id-prefix",
            ID_PREFIX,
        ],
    )
    .await;
    let mut sidecar = Sidecar::start_with(
        &driver,
        SidecarOptions {
            metrics: true,
            ..SidecarOptions::args(&["--retry-interval-start=200ms", "--retry-interval-max=2s"])
        },
    );

    // First a migrated PV the sidecar cannot translate: it must be reported once and left
    // alone while everything below happens (a loop would report it every 2 s at most).
    let broken_name = format!("{}-broken", cluster.ns());
    cluster
        .volumes
        .create(
            &PostParams::default(),
            &untranslatable_pv(&broken_name, cluster.ns()),
        )
        .await
        .expect("creating the untranslatable PV");
    wait_event(
        &cluster.client,
        "default",
        &broken_name,
        "VolumeFailedDelete",
        |message| message.contains("failed to get region from zones"),
    )
    .await;

    // The in-tree class, as an in-tree user wrote it.
    let class_name = format!("{}-gce", cluster.ns());
    let mut class = storage_class(
        &class_name,
        &driver,
        "Delete",
        &[("zone", ZONE), ("fstype", "ext4"), ("type", "pd-ssd")],
    );
    GCE_IN_TREE.clone_into(&mut class.provisioner);
    create_class(&cluster.client, &class).await;
    let created = cluster.claim("data", &class_name).await;
    let volume_name = format!("pvc-{}", created.metadata.uid.clone().expect("uid"));

    let bound = wait_bound(&cluster.claims, "data").await;
    // kube-controller-manager handed the claim to the CSI driver. (1.36 writes no
    // `migrated-to` on claims: it derives it from the storage-provisioner annotation, which
    // already names the CSI driver, and removes it.)
    for key in [
        "volume.kubernetes.io/storage-provisioner",
        "volume.beta.kubernetes.io/storage-provisioner",
    ] {
        assert_eq!(
            annotation(&bound.metadata, key),
            Some(GCE_DRIVER),
            "{key}: {:?}",
            bound.metadata.annotations
        );
    }

    // CreateVolume got the class as the CSI driver reads it.
    let requests = driver.create_volume_requests();
    assert_eq!(requests.len(), 1, "{requests:?}");
    let request = &requests[0];
    assert_eq!(request["name"], volume_name);
    assert_eq!(request["parameters"], json!({"type": "pd-ssd"}));
    assert_eq!(
        request["volume_capabilities"][0]["access_type"]["mount"]["fs_type"],
        "ext4"
    );
    assert_eq!(
        request["accessibility_requirements"]["requisite"],
        json!([{"topology.gke.io/zone": ZONE}])
    );

    // The PV has the in-tree source, the Kubernetes zone keys and the in-tree provisioner.
    let pv = cluster.pv(&volume_name).await;
    let spec = pv.spec.clone().expect("spec");
    assert!(spec.csi.is_none(), "{spec:?}");
    let gce = spec.gce_persistent_disk.clone().expect("gcePersistentDisk");
    assert_eq!(gce.pd_name, volume_name);
    assert_eq!(gce.fs_type.as_deref(), Some("ext4"));
    let labels = pv.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get(ZONE_LABEL).map(String::as_str), Some(ZONE));
    assert_eq!(
        labels.get(REGION_LABEL).map(String::as_str),
        Some("us-central1")
    );
    let affinity = serde_json::to_value(&spec.node_affinity).expect("json");
    assert_eq!(
        affinity["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]["key"],
        ZONE_LABEL
    );
    assert_eq!(
        annotation(&pv.metadata, "pv.kubernetes.io/provisioned-by"),
        Some(GCE_IN_TREE)
    );
    assert!(has_our_finalizer(&pv), "{:?}", pv.metadata.finalizers);
    // kube-controller-manager marks the PV migrated, from its in-tree provisioned-by.
    eventually("the PV to be marked migrated", TIMEOUT, || async {
        let pv = cluster.pv(&volume_name).await;
        match annotation(&pv.metadata, "pv.kubernetes.io/migrated-to") {
            Some(GCE_DRIVER) => Ok(()),
            other => Err(format!("migrated-to {other:?}")),
        }
    })
    .await;

    // Deleting the claim deletes the backend volume by its GCE handle, then the PV.
    cluster.delete_claim("data").await;
    cluster.wait_pv_gone(&volume_name).await;
    let deleted: Vec<String> = driver
        .volume_requests("DeleteVolume")
        .into_iter()
        .map(|request| request.volume_id)
        .collect();
    assert_eq!(deleted, [format!("{ID_PREFIX}{volume_name}")]);
    wait_backend_empty(&driver).await;

    // The driver calls made for the in-tree volume are labelled migrated, the others not.
    let samples = parse_metrics(&sidecar.wait_metrics().await);
    let count = |method: &str, migrated: &str| {
        metric_sum(
            &samples,
            "csi_sidecar_operations_seconds_count",
            &[
                ("driver_name", GCE_DRIVER),
                ("method_name", method),
                ("grpc_status_code", "OK"),
                ("migrated", migrated),
            ],
        )
    };
    assert_eq!(count("/csi.v1.Controller/CreateVolume", "true"), 1.0);
    assert_eq!(count("/csi.v1.Controller/DeleteVolume", "true"), 1.0);
    assert!(count("/csi.v1.Identity/GetPluginCapabilities", "false") >= 1.0);

    // Meanwhile the untranslatable PV was left alone: reported once, never deleted. Its claim
    // never existed, so it was never Bound and got no finalizer (only a Bound PV does, as
    // upstream; that a Bound untranslatable PV gets ours is unit-tested in
    // `controller::volumes`).
    let log = sidecar.log();
    let reports = log
        .lines()
        .filter(|line| line.contains(LEFT_ALONE) && line.contains(&broken_name))
        .count();
    assert_eq!(reports, 1, "{log}");
    let broken = cluster.pv(&broken_name).await;
    assert!(
        !has_our_finalizer(&broken),
        "{:?}",
        broken.metadata.finalizers
    );
    assert!(
        !driver
            .volume_requests("DeleteVolume")
            .iter()
            .any(|request| request.volume_id.contains("broken"))
    );
    cluster
        .volumes
        .delete(&broken_name, &DeleteParams::default())
        .await
        .expect("deleting the untranslatable PV");
    cluster.wait_pv_gone(&broken_name).await;

    // Upstream's quirk A17, fixed: the driver now answers ids that are no GCE handle, so the
    // PV of a new claim cannot be translated back; each volume created is deleted again (under
    // its journal record) and nothing is left once the claim is gone.
    driver
        .restart_with(&["--topology", &format!("topology.gke.io/zone={ZONE}")])
        .await;
    let unusable = cluster.claim("unusable", &class_name).await;
    let unusable_volume = format!("pvc-{}", unusable.metadata.uid.clone().expect("uid"));
    wait_event(
        &cluster.client,
        cluster.ns(),
        "unusable",
        "ProvisioningFailed",
        |message| message.contains("to in-tree") && message.contains("the volume was deleted"),
    )
    .await;
    assert!(
        driver
            .volume_requests("DeleteVolume")
            .iter()
            .any(|request| request.volume_id.starts_with("vol-")),
        "no DeleteVolume of the untranslatable volume"
    );
    assert!(!cluster.pv_exists(&unusable_volume).await);
    cluster.delete_claim("unusable").await;
    cluster.wait_claim_gone("unusable").await;
    wait_backend_empty(&driver).await;
    assert!(!cluster.pv_exists(&unusable_volume).await);
}

/// Waits until the driver holds no volume any more.
async fn wait_backend_empty(driver: &Driver) {
    eventually("no backend volume to be left", TIMEOUT, || async {
        let volumes = driver.volumes();
        if volumes.is_empty() {
            Ok(())
        } else {
            Err(format!("{volumes:?}"))
        }
    })
    .await;
}

/// The driver of the in-tree `kubernetes.io/azure-file` plugin; no other test uses the name.
const AZURE_FILE_DRIVER: &str = "file.csi.azure.com";

/// A static Azure File PV written as Microsoft's docs write it: `secretName: azure-secret`,
/// which names no storage account, so its CSI handle cannot be told.
fn static_azure_file_pv(name: &str) -> PersistentVolume {
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeSpec {
            capacity: Some(BTreeMap::from([(
                "storage".to_owned(),
                Quantity("5Gi".to_owned()),
            )])),
            access_modes: Some(vec!["ReadWriteMany".to_owned()]),
            persistent_volume_reclaim_policy: Some("Retain".to_owned()),
            azure_file: Some(AzureFilePersistentVolumeSource {
                share_name: "static-share".to_owned(),
                secret_name: "azure-secret".to_owned(),
                ..AzureFilePersistentVolumeSource::default()
            }),
            ..PersistentVolumeSpec::default()
        }),
        ..PersistentVolume::default()
    }
}

/// Issue #31, hole 3: one in-tree PV whose source cannot be translated must not keep every
/// orphan of the driver: what its source does determine (the share) already says it does not
/// hold the orphan's volume, which is deleted.
#[tokio::test]
async fn an_untranslatable_azure_file_pv_does_not_keep_an_orphan_from_being_deleted() {
    let cluster = Cluster::new("migration-azure").await;
    let driver = Driver::start_as(
        AZURE_FILE_DRIVER,
        &["--fault", "CreateVolume=after:deadline-exceeded"],
    )
    .await;
    let mut sidecar = Sidecar::start(
        &driver,
        &["--retry-interval-start=200ms", "--retry-interval-max=2s"],
    );
    let static_name = format!("{}-static-share", cluster.ns());
    cluster
        .volumes
        .create(&PostParams::default(), &static_azure_file_pv(&static_name))
        .await
        .expect("creating the static Azure File PV");
    let class = cluster.class("csi", &driver, "Delete", &[]).await;

    // A claim whose CreateVolume created its volume but timed out, deleted meanwhile.
    let orphaned = cluster.claim("orphaned", &class).await;
    let volume = format!("pvc-{}", orphaned.metadata.uid.clone().expect("uid"));
    driver.wait_holds(&volume).await;
    cluster.delete_claim("orphaned").await;
    cluster.wait_claim_gone("orphaned").await;
    driver.clear_faults();

    wait_backend_empty(&driver).await;
    eventually("the orphan's record to go", TIMEOUT, || async {
        let operations =
            support::cluster::journal_operations(&cluster.client, "default", &driver).await?;
        if operations.is_empty() {
            Ok(())
        } else {
            Err(format!("{operations:?}"))
        }
    })
    .await;
    cluster
        .volumes
        .delete(&static_name, &DeleteParams::default())
        .await
        .expect("deleting the static PV");
    cluster.wait_pv_gone(&static_name).await;
    sidecar.assert_running();
}
