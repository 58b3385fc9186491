//! Proves the real control-plane behaviour the sidecar relies on, with no sidecar involved:
//! the PV controller marks a PVC of an external provisioner's StorageClass, binds a pre-bound
//! CSI PV to it, and releases the PV once the PVC is deleted.

use csi_test_support as support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, ObjectReference, PersistentVolume, PersistentVolumeClaim,
    PersistentVolumeClaimSpec, PersistentVolumeSpec, VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};

const DRIVER: &str = "smoke.example.com";
const ANN_STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
const ANN_PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
const TIMEOUT: Duration = Duration::from_secs(60);

#[tokio::test]
async fn pv_controller_annotates_binds_and_releases() {
    let started = Instant::now();
    let (client, ns) = support::test_namespace("smoke").await;
    eprintln!(
        "control plane up after {:.1}s (its own start-up took {:.1}s)",
        started.elapsed().as_secs_f64(),
        support::control_plane().startup_time().as_secs_f64()
    );
    let classes: Api<StorageClass> = Api::all(client.clone());
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns.name());
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let class_name = format!("{ns}-class");
    let claim_name = "data";
    let volume_name = format!("{ns}-pv");

    let class = StorageClass {
        metadata: named(&class_name),
        provisioner: DRIVER.to_owned(),
        volume_binding_mode: Some("Immediate".to_owned()),
        reclaim_policy: Some("Delete".to_owned()),
        ..StorageClass::default()
    };
    classes
        .create(&PostParams::default(), &class)
        .await
        .expect("create StorageClass");

    let claim = PersistentVolumeClaim {
        metadata: named(claim_name),
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".to_owned()]),
            storage_class_name: Some(class_name.clone()),
            resources: Some(VolumeResourceRequirements {
                requests: Some(gibibyte()),
                ..VolumeResourceRequirements::default()
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        ..PersistentVolumeClaim::default()
    };
    let claim = claims
        .create(&PostParams::default(), &claim)
        .await
        .expect("create PVC");

    // 1. The PV controller hands the claim to the external provisioner named by the class.
    let step = Instant::now();
    let annotated = support::eventually(
        "the PV controller to set volume.kubernetes.io/storage-provisioner on the PVC",
        TIMEOUT,
        || async {
            let pvc = claims.get(claim_name).await.map_err(|e| e.to_string())?;
            let value = pvc
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANN_STORAGE_PROVISIONER).cloned());
            match value {
                Some(v) => Ok(v),
                None => Err(format!("annotations {:?}", pvc.metadata.annotations)),
            }
        },
    )
    .await;
    assert_eq!(annotated, DRIVER);
    eprintln!(
        "storage-provisioner annotation after {:.1}s",
        step.elapsed().as_secs_f64()
    );

    // 2. A PV pre-bound to the claim (what the sidecar creates) gets bound both ways.
    let claim_uid = claim.metadata.uid.clone().expect("created PVC has a uid");
    let volume = PersistentVolume {
        metadata: ObjectMeta {
            name: Some(volume_name.clone()),
            annotations: Some(BTreeMap::from([(
                ANN_PROVISIONED_BY.to_owned(),
                DRIVER.to_owned(),
            )])),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeSpec {
            access_modes: Some(vec!["ReadWriteOnce".to_owned()]),
            capacity: Some(gibibyte()),
            storage_class_name: Some(class_name.clone()),
            persistent_volume_reclaim_policy: Some("Delete".to_owned()),
            claim_ref: Some(ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("PersistentVolumeClaim".to_owned()),
                namespace: Some(ns.name().to_owned()),
                name: Some(claim_name.to_owned()),
                uid: Some(claim_uid),
                ..ObjectReference::default()
            }),
            csi: Some(CSIPersistentVolumeSource {
                driver: DRIVER.to_owned(),
                volume_handle: format!("{ns}-handle"),
                ..CSIPersistentVolumeSource::default()
            }),
            ..PersistentVolumeSpec::default()
        }),
        ..PersistentVolume::default()
    };
    volumes
        .create(&PostParams::default(), &volume)
        .await
        .expect("create PV");
    let step = Instant::now();
    support::eventually("the PVC to become Bound to the PV", TIMEOUT, || async {
        let pvc = claims.get(claim_name).await.map_err(|e| e.to_string())?;
        let phase = pvc.status.as_ref().and_then(|s| s.phase.clone());
        let bound_to = pvc.spec.as_ref().and_then(|s| s.volume_name.clone());
        if phase.as_deref() == Some("Bound") && bound_to.as_deref() == Some(volume_name.as_str()) {
            Ok(())
        } else {
            Err(format!("phase {phase:?}, volumeName {bound_to:?}"))
        }
    })
    .await;
    support::eventually("the PV to become Bound", TIMEOUT, || async {
        let phase = volume_phase(&volumes, &volume_name).await?;
        if phase.as_deref() == Some("Bound") {
            Ok(())
        } else {
            Err(format!("phase {phase:?}"))
        }
    })
    .await;
    eprintln!("bound after {:.1}s", step.elapsed().as_secs_f64());

    // 3. Deleting the claim releases the volume: the sidecar's cue to delete it.
    claims
        .delete(claim_name, &DeleteParams::default())
        .await
        .expect("delete PVC");
    let step = Instant::now();
    support::eventually(
        "the PV to become Released after its PVC was deleted",
        TIMEOUT,
        || async {
            let phase = volume_phase(&volumes, &volume_name).await?;
            if phase.as_deref() == Some("Released") {
                Ok(())
            } else {
                Err(format!("phase {phase:?}"))
            }
        },
    )
    .await;
    eprintln!("released after {:.1}s", step.elapsed().as_secs_f64());

    volumes
        .delete(&volume_name, &DeleteParams::default())
        .await
        .expect("delete PV");
    classes
        .delete(&class_name, &DeleteParams::default())
        .await
        .expect("delete StorageClass");
    eprintln!("smoke test done in {:.1}s", started.elapsed().as_secs_f64());
}

fn named(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        ..ObjectMeta::default()
    }
}

fn gibibyte() -> BTreeMap<String, Quantity> {
    BTreeMap::from([("storage".to_owned(), Quantity("1Gi".to_owned()))])
}

async fn volume_phase(
    volumes: &Api<PersistentVolume>,
    name: &str,
) -> Result<Option<String>, String> {
    let pv = volumes.get(name).await.map_err(|e| e.to_string())?;
    Ok(pv.status.and_then(|s| s.phase))
}
