//! Cross-namespace data sources on a real control plane: kube-apiserver and the sidecar run
//! with the CrossNamespaceVolumeDataSource gate, a claim clones a claim of another namespace
//! through `dataSourceRef.namespace`, and the reference driver clones the volume.
//!
//! One test, in order, because the ReferenceGrant CRD is cluster-wide: first without the CRD
//! (upstream's sidecar would stay idle for ever, A6), then with it but without a grant, then
//! with a grant. The sidecar is the same throughout: it takes the CRD in once it appears.
//! Last, a restore from a VolumeSnapshot of the other namespace (the snapshot machinery of
//! support::snapshots), whose protection finalizer comes off again (upstream leaves it, A4).

use csi_test_support as support;

use std::time::Duration;

use csi_provisioner::api::ReferenceGrant;
use csi_provisioner::provision::SNAPSHOT_PROTECTION_FINALIZER;
use csi_testbed::snapshots::{SnapshotBinaries, install_crds};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, TypedObjectReference};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use support::cluster::{
    Cluster, claim, create_claim, pv_name, wait_bound, wait_event, wait_event_within,
};
use support::eventually;
use support::peers::{Driver, Sidecar, TIMEOUT};
use support::snapshots::Snapshotter;

const GATE: &str = "--feature-gates=CrossNamespaceVolumeDataSource=true";
/// Short claim retries, so that the claim waiting for the CRD goes on soon after it appears.
const RETRY_MAX: &str = "--retry-interval-max=2s";
/// A grant watch that failed until its CRD came: its capped backoff (30 s) with jitter (up to as
/// much again), then the claim's next retry.
const GRANT_WATCH_RECOVERY: Duration = Duration::from_secs(150);

/// A 1Gi claim of `class` made from `source` (a claim, or a VolumeSnapshot with `api_group`)
/// of `namespace`.
fn from_other_namespace(
    name: &str,
    class: &str,
    (api_group, kind): (Option<&str>, &str),
    namespace: &str,
    source: &str,
) -> PersistentVolumeClaim {
    let mut pvc = claim(name, class, "1Gi", None);
    if let Some(spec) = pvc.spec.as_mut() {
        spec.data_source_ref = Some(TypedObjectReference {
            api_group: api_group.map(str::to_owned),
            kind: kind.to_owned(),
            name: source.to_owned(),
            namespace: Some(namespace.to_owned()),
        });
    }
    pvc
}

const CLAIMS: (Option<&str>, &str) = (None, "PersistentVolumeClaim");
const SNAPSHOTS: (Option<&str>, &str) = (Some("snapshot.storage.k8s.io"), "VolumeSnapshot");

/// Applies the ReferenceGrant `name` in `namespace`: the claims of `from` may use the objects
/// of `to` (group, kind, name).
async fn grant(cluster: &Cluster, name: &str, namespace: &str, from: &str, to: serde_json::Value) {
    let grants: Api<ReferenceGrant> = Api::namespaced(cluster.client.clone(), namespace);
    // Applied: a custom resource's body must carry apiVersion and kind, which the partial type
    // does not serialize.
    grants
        .patch(
            name,
            &PatchParams::apply("csi-provisioner-tests"),
            &Patch::Apply(json!({
                "apiVersion": "gateway.networking.k8s.io/v1beta1",
                "kind": "ReferenceGrant",
                "metadata": {"name": name},
                "spec": {
                    "from": [{"group": "", "kind": "PersistentVolumeClaim", "namespace": from}],
                    "to": [to],
                },
            })),
        )
        .await
        .unwrap_or_else(|e| panic!("creating the ReferenceGrant {name}: {e}"));
}

/// The CreateVolume requests the driver received for the volume `name`.
fn creates_of(driver: &Driver, name: &str) -> Vec<serde_json::Value> {
    driver
        .create_volume_requests()
        .into_iter()
        .filter(|request| request["name"] == name)
        .collect()
}

/// Installs Gateway API's ReferenceGrant CRD, as the snapshot machinery's build collects it.
async fn install_reference_grant_crd() {
    let files = tokio::task::spawn_blocking(|| {
        let dir = csi_testbed::workspace::snapshotter().map_err(|e| e.to_string())?;
        SnapshotBinaries::at(&dir)
            .crd_files()
            .map_err(|e| e.to_string())
    })
    .await
    .expect("the CRD lookup task")
    .unwrap_or_else(|e| panic!("finding the ReferenceGrant CRD: {e}"));
    let grant: Vec<_> = files
        .into_iter()
        .filter(|path| path.to_string_lossy().contains("referencegrants"))
        .collect();
    assert_eq!(grant.len(), 1, "one ReferenceGrant CRD file: {grant:?}");
    install_crds(support::control_plane(), &grant)
        .await
        .unwrap_or_else(|e| panic!("installing the ReferenceGrant CRD: {e}"));
}

#[tokio::test]
async fn sources_in_another_namespace_need_the_crd_and_a_grant() {
    support::control_plane_with_apiserver_flags(&[GATE]);
    let source = Cluster::new("xns-src").await;
    let target = Cluster::new("xns-dst").await;
    let driver = Driver::start(&[]).await;
    let class = source.class("c", &driver, "Delete", &[]).await;
    let _sidecar = Sidecar::start(&driver, &[GATE, RETRY_MAX]);

    source.claim("src", &class).await;
    let src = wait_bound(&source.claims, "src").await;
    let source_handle = source
        .pv(&pv_name(&src))
        .await
        .spec
        .and_then(|spec| spec.csi)
        .map(|csi| csi.volume_handle)
        .expect("the source PV's volume handle");

    // No ReferenceGrant CRD: the clone is told why, every other claim is provisioned.
    let clone = create_claim(
        &target.claims,
        &from_other_namespace("clone", &class, CLAIMS, source.ns(), "src"),
    )
    .await;
    let kept = clone
        .spec
        .as_ref()
        .and_then(|spec| spec.data_source_ref.as_ref())
        .and_then(|reference| reference.namespace.clone());
    assert_eq!(
        kept.as_deref(),
        Some(source.ns()),
        "kube-apiserver dropped dataSourceRef.namespace: is its gate on?"
    );
    wait_event(
        &target.client,
        target.ns(),
        "clone",
        "ProvisioningFailed",
        |message| {
            message.contains(
                "the ReferenceGrant CRD (gateway.networking.k8s.io/v1beta1) may not be installed",
            )
        },
    )
    .await;
    target.claim("plain", &class).await;
    wait_bound(&target.claims, "plain").await;
    assert!(creates_of(&driver, &pv_name(&clone)).is_empty());

    // The CRD, no grant: upstream's refusal, still nothing sent. The grant watch has been
    // failing since the start, so its next try may be its capped backoff (30 s) plus jitter
    // away, and the claim's retry comes after that.
    install_reference_grant_crd().await;
    let refused = format!(
        "accessing {}/src of PersistentVolumeClaim dataSource from {}/clone isn't allowed",
        source.ns(),
        target.ns()
    );
    wait_event_within(
        &target.client,
        target.ns(),
        "clone",
        "ProvisioningFailed",
        |message| message == refused,
        GRANT_WATCH_RECOVERY,
    )
    .await;
    assert!(creates_of(&driver, &pv_name(&clone)).is_empty());

    // A grant in the source's namespace to the target's claims: the clone binds, made from the
    // source claim's volume.
    grant(
        &target,
        "clones",
        source.ns(),
        target.ns(),
        json!({"group": "", "kind": "PersistentVolumeClaim", "name": "src"}),
    )
    .await;
    wait_bound(&target.claims, "clone").await;
    let creates = creates_of(&driver, &pv_name(&clone));
    assert!(!creates.is_empty());
    for create in creates {
        assert_eq!(
            create["volume_content_source"]["volume"]["volume_id"], source_handle,
            "{create}"
        );
    }

    // A restore from a snapshot of the other namespace, granted: the snapshot's protection
    // finalizer comes off once the PV is saved.
    let snapshotter = Snapshotter::start(&driver);
    let snapshot_class = source.snapshot_class("snap", &driver).await;
    let (_, content) = source
        .take_snapshot("src-snap", "src", &snapshot_class, &snapshotter)
        .await;
    let snapshot_handle = content
        .status
        .and_then(|status| status.snapshot_handle)
        .expect("a ready content's snapshot handle");
    grant(
        &target,
        "restores",
        source.ns(),
        target.ns(),
        json!({"group": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot"}),
    )
    .await;
    let restore = create_claim(
        &target.claims,
        &from_other_namespace("restore", &class, SNAPSHOTS, source.ns(), "src-snap"),
    )
    .await;
    wait_bound(&target.claims, "restore").await;
    let creates = creates_of(&driver, &pv_name(&restore));
    assert!(!creates.is_empty());
    for create in creates {
        assert_eq!(
            create["volume_content_source"]["snapshot"]["snapshot_id"], snapshot_handle,
            "{create}"
        );
    }
    eventually(
        "the restore's finalizer to come off the snapshot",
        TIMEOUT,
        || async {
            let snapshot = source
                .snapshots()
                .get("src-snap")
                .await
                .map_err(|e| e.to_string())?;
            let finalizers = snapshot.metadata.finalizers.unwrap_or_default();
            if finalizers
                .iter()
                .any(|f| f == SNAPSHOT_PROTECTION_FINALIZER)
            {
                Err(format!("{finalizers:?}"))
            } else {
                Ok(())
            }
        },
    )
    .await;
}

/// kube-apiserver keeps `dataSourceRef.namespace` (its gate is on), the sidecar runs without
/// the gate: the claim is refused with upstream's text and nothing is sent to the driver.
#[tokio::test]
async fn bad_input_a_source_in_another_namespace_without_the_gate() {
    support::control_plane_with_apiserver_flags(&[GATE]);
    let source = Cluster::new("xns-nogate-src").await;
    let target = Cluster::new("xns-nogate-dst").await;
    let driver = Driver::start(&[]).await;
    let class = source.class("c", &driver, "Delete", &[]).await;
    let mut sidecar = Sidecar::start(&driver, &[RETRY_MAX]);
    source.claim("src", &class).await;
    wait_bound(&source.claims, "src").await;

    let clone = create_claim(
        &target.claims,
        &from_other_namespace("clone", &class, CLAIMS, source.ns(), "src"),
    )
    .await;
    wait_event(
        &target.client,
        target.ns(),
        "clone",
        "ProvisioningFailed",
        |message| {
            message
                == "dataSourceRef namespace specified but the CrossNamespaceVolumeDataSource feature is disabled"
        },
    )
    .await;
    assert!(creates_of(&driver, &pv_name(&clone)).is_empty());
    assert_eq!(driver.volume_count(), 1, "only the source's volume");
    sidecar.assert_running();
}
