//! Claim and namespace metadata by allow-list on a real control plane, with the reference
//! driver, which logs every CreateVolume request it receives (`--request-log`) and keeps each
//! volume's parameters in its state: `--copy-claim-labels` puts exactly the listed claim
//! labels on the PV; `--extra-create-metadata-claim-annotations` and
//! `--extra-create-metadata-namespace-labels`/`-annotations` pass exactly the listed keys that
//! are present; without the flags nothing changes; and a CreateVolume replayed after a SIGKILL
//! (by the claim reconciler, or by the orphan reaper once the claim is gone) sends the
//! parameters first recorded, however the namespace and the claim changed meanwhile.

use csi_test_support as support;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim};
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use support::cluster::{Cluster, claim, create_claim, pv_name, wait_bound};
use support::eventually;
use support::peers::{Driver, Sidecar, TIMEOUT};

/// The four allow-lists, each with a key that is absent or a pattern.
const METADATA_FLAGS: [&str; 4] = [
    "--copy-claim-labels=team,cost.example.com/*,absent",
    "--extra-create-metadata-claim-annotations=example.com/owner",
    "--extra-create-metadata-namespace-labels=tier,absent",
    "--extra-create-metadata-namespace-annotations=contact",
];

/// Short retries, so that a retry comes soon after the driver stops failing.
const RETRIES: [&str; 2] = ["--retry-interval-start=200ms", "--retry-interval-max=2s"];

fn strings(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// Sets labels and annotations on the test's namespace (a merge patch: `null` removes a key).
async fn set_namespace_metadata(cluster: &Cluster, labels: Value, annotations: Value) {
    Api::<Namespace>::all(cluster.client.clone())
        .patch(
            cluster.ns(),
            &PatchParams::default(),
            &Patch::Merge(json!({ "metadata": { "labels": labels, "annotations": annotations } })),
        )
        .await
        .unwrap_or_else(|e| panic!("labelling namespace {}: {e}", cluster.ns()));
}

/// A claim with listed and unlisted labels and annotations.
fn labelled_claim(name: &str, class: &str, owner: &str) -> PersistentVolumeClaim {
    let mut pvc = claim(name, class, "1Gi", None);
    pvc.metadata.labels = Some(strings(&[
        ("team", "storage"),
        ("app", "db"),
        ("cost.example.com/center", "42"),
    ]));
    pvc.metadata.annotations = Some(strings(&[
        ("example.com/owner", owner),
        ("note", "private"),
    ]));
    pvc
}

/// The parameters of every CreateVolume the driver received for `volume`.
fn parameters_sent(driver: &Driver, volume: &str) -> Vec<Value> {
    driver
        .create_volume_requests()
        .into_iter()
        .filter(|request| request["name"] == volume)
        .map(|request| request["parameters"].clone())
        .collect()
}

/// The parameters the driver's volume named `volume` was created with.
fn parameters_kept(driver: &Driver, volume: &str) -> BTreeMap<String, String> {
    driver
        .volumes()
        .into_iter()
        .find(|record| record.name == volume)
        .unwrap_or_else(|| panic!("the driver holds no volume {volume}"))
        .parameters
}

fn metadata_parameters(tier: &str, owner: &str) -> BTreeMap<String, String> {
    strings(&[
        ("type", "fast"),
        (
            "csi.storage.k8s.io/pvc/annotations/example.com/owner",
            owner,
        ),
        ("csi.storage.k8s.io/namespace/labels/tier", tier),
        ("csi.storage.k8s.io/namespace/annotations/contact", "ops"),
    ])
}

/// The namespace and the claim carry listed and unlisted keys: CreateVolume gets exactly the
/// listed ones that are present, under their prefixes beside the class's parameter, and the PV
/// exactly the listed claim labels.
#[tokio::test]
async fn only_the_listed_metadata_reaches_the_pv_and_create_volume() {
    let cluster = Cluster::new("metadata").await;
    set_namespace_metadata(
        &cluster,
        json!({ "tier": "gold", "unlisted": "x" }),
        json!({ "contact": "ops", "private": "y" }),
    )
    .await;
    let driver = Driver::start(&[]).await;
    let class = cluster
        .class("sc", &driver, "Delete", &[("type", "fast")])
        .await;
    let _sidecar = Sidecar::start(&driver, &METADATA_FLAGS);
    let pvc = create_claim(&cluster.claims, &labelled_claim("data", &class, "alice")).await;
    wait_bound(&cluster.claims, "data").await;

    let volume = pv_name(&pvc);
    let pv = cluster.pv(&volume).await;
    assert_eq!(
        pv.metadata.labels.unwrap_or_default(),
        strings(&[("team", "storage"), ("cost.example.com/center", "42")])
    );
    let expected = metadata_parameters("gold", "alice");
    let sent = parameters_sent(&driver, &volume);
    assert!(!sent.is_empty());
    for parameters in sent {
        assert_eq!(parameters, json!(expected));
    }
    assert_eq!(parameters_kept(&driver, &volume), expected);
}

/// The same namespace and claim without the flags: the PV has no labels and CreateVolume only
/// the class's parameter, as upstream.
#[tokio::test]
async fn without_the_flags_nothing_is_passed() {
    let cluster = Cluster::new("metadata-off").await;
    set_namespace_metadata(
        &cluster,
        json!({ "tier": "gold" }),
        json!({ "contact": "ops" }),
    )
    .await;
    let driver = Driver::start(&[]).await;
    let class = cluster
        .class("sc", &driver, "Delete", &[("type", "fast")])
        .await;
    let _sidecar = Sidecar::start(&driver, &[]);
    let pvc = create_claim(&cluster.claims, &labelled_claim("data", &class, "alice")).await;
    wait_bound(&cluster.claims, "data").await;

    let volume = pv_name(&pvc);
    let pv = cluster.pv(&volume).await;
    assert_eq!(pv.metadata.labels.unwrap_or_default(), BTreeMap::new());
    for parameters in parameters_sent(&driver, &volume) {
        assert_eq!(parameters, json!({ "type": "fast" }));
    }
    assert_eq!(
        parameters_kept(&driver, &volume),
        strings(&[("type", "fast")])
    );
}

/// The driver creates the volume and answers DEADLINE_EXCEEDED; the sidecar is SIGKILLed, the
/// namespace label and the claim annotation change, and a new sidecar finishes the claim: every
/// CreateVolume carried the parameters of the first, the only ones the driver answers for the
/// name without ALREADY_EXISTS (a request rebuilt from the new metadata never binds the claim).
#[tokio::test]
async fn a_retry_after_a_restart_sends_the_parameters_first_recorded() {
    let cluster = Cluster::new("metadata-replay").await;
    set_namespace_metadata(
        &cluster,
        json!({ "tier": "gold" }),
        json!({ "contact": "ops" }),
    )
    .await;
    let driver = Driver::start(&["--fault", "CreateVolume=after:deadline-exceeded"]).await;
    let class = cluster
        .class("sc", &driver, "Delete", &[("type", "fast")])
        .await;
    let args: Vec<&str> = METADATA_FLAGS.iter().chain(&RETRIES).copied().collect();
    let mut sidecar = Sidecar::start(&driver, &args);
    let pvc = create_claim(&cluster.claims, &labelled_claim("data", &class, "alice")).await;
    let volume = pv_name(&pvc);
    driver.wait_holds(&volume).await;
    sidecar.kill().await;

    set_namespace_metadata(&cluster, json!({ "tier": "platinum" }), json!({})).await;
    cluster
        .patch_claim(
            "data",
            json!({ "metadata": { "annotations": { "example.com/owner": "bob" } } }),
        )
        .await;
    driver.clear_faults();
    sidecar.restart().await;
    wait_bound(&cluster.claims, "data").await;

    let first = metadata_parameters("gold", "alice");
    let sent = parameters_sent(&driver, &volume);
    assert!(
        sent.len() >= 2,
        "one CreateVolume before the kill, one after: {sent:?}"
    );
    for parameters in sent {
        assert_eq!(parameters, json!(first));
    }
    assert_eq!(parameters_kept(&driver, &volume), first);
}

/// As above, but the claim is deleted while the sidecar is down: the orphan reaper replays
/// the recorded request (a changed one would be ALREADY_EXISTS, and the orphan would stay) and
/// deletes the volume.
#[tokio::test]
async fn an_orphan_is_replayed_with_its_first_parameters_and_deleted() {
    let cluster = Cluster::new("metadata-orphan").await;
    set_namespace_metadata(
        &cluster,
        json!({ "tier": "gold" }),
        json!({ "contact": "ops" }),
    )
    .await;
    let driver = Driver::start(&["--fault", "CreateVolume=after:deadline-exceeded"]).await;
    let class = cluster
        .class("sc", &driver, "Delete", &[("type", "fast")])
        .await;
    let args: Vec<&str> = METADATA_FLAGS.iter().chain(&RETRIES).copied().collect();
    let mut sidecar = Sidecar::start(&driver, &args);
    let pvc = create_claim(&cluster.claims, &labelled_claim("data", &class, "alice")).await;
    let volume = pv_name(&pvc);
    driver.wait_holds(&volume).await;
    sidecar.kill().await;

    set_namespace_metadata(&cluster, json!({ "tier": "platinum" }), json!({})).await;
    cluster.delete_claim("data").await;
    cluster.wait_claim_gone("data").await;
    driver.clear_faults();
    sidecar.restart().await;
    // The driver saves its state before it logs the call's answer: both are waited for.
    eventually("the orphan's volume to be deleted", TIMEOUT, || async {
        let held: Vec<String> = driver.volumes().into_iter().map(|v| v.name).collect();
        let answered = driver
            .calls("DeleteVolume")
            .iter()
            .any(|call| call.code == "Ok");
        (held.is_empty() && answered).then_some(()).ok_or(format!(
            "volumes {held:?}, DeleteVolume answered Ok: {answered}"
        ))
    })
    .await;

    let first = metadata_parameters("gold", "alice");
    let sent = parameters_sent(&driver, &volume);
    assert!(
        sent.len() >= 2,
        "one CreateVolume before the kill, the replay after: {sent:?}"
    );
    for parameters in sent {
        assert_eq!(parameters, json!(first));
    }
}
