//! The sidecar end to end: a real control plane, the reference driver and `csi-provisioner` as
//! separate processes over a real unix socket. Each test has its own namespace, driver (with a
//! unique name) and StorageClass, so the tests run in parallel without seeing each other.

use csi_test_support as support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::{Patch, PatchParams};

use support::cluster::{
    Cluster, claim, create_claim, driver_pvs, has_pv_finalizer, pv_name, wait_bound, wait_event,
};
use support::peers::{Driver, Sidecar, SidecarOptions, TIMEOUT, metric_sum, parse_metrics};

const ANN_PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
const ANN_DELETION_SECRET_NAME: &str = "volume.kubernetes.io/provisioner-deletion-secret-name";
const ANN_DELETION_SECRET_NAMESPACE: &str =
    "volume.kubernetes.io/provisioner-deletion-secret-namespace";
const IDENTITY_KEY: &str = "storage.kubernetes.io/csiProvisionerIdentity";
const CREATE_VOLUME_METHOD: &str = "/csi.v1.Controller/CreateVolume";
const GIB: i64 = 1 << 30;

/// Fast retries so failure paths finish within seconds.
const FAST_RETRIES: [&str; 2] = ["--retry-interval-start=200ms", "--retry-interval-max=2s"];

fn pv_phase(pv: &PersistentVolume) -> Option<String> {
    pv.status.as_ref().and_then(|s| s.phase.clone())
}

fn annotation<'a>(pv: &'a PersistentVolume, key: &str) -> Option<&'a str> {
    pv.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// Every CSI volume handle of the driver's PVs, and the ids of the driver's volumes, as sets;
/// fails on a duplicate in either.
async fn handles_and_volume_ids(
    cluster: &Cluster,
    driver: &Driver,
) -> (BTreeSet<String>, BTreeSet<String>) {
    let pvs = driver_pvs(&cluster.client, driver)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let handles: Vec<String> = pvs
        .iter()
        .filter_map(|pv| pv.spec.as_ref()?.csi.as_ref())
        .map(|csi| csi.volume_handle.clone())
        .collect();
    let unique_handles: BTreeSet<String> = handles.iter().cloned().collect();
    assert_eq!(
        handles.len(),
        unique_handles.len(),
        "two PVs share a volume handle: {handles:?}"
    );
    let volumes = driver.volumes();
    let names: BTreeSet<&str> = volumes.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(
        names.len(),
        volumes.len(),
        "the driver holds two volumes with one name: {volumes:?}"
    );
    (unique_handles, volumes.into_iter().map(|v| v.id).collect())
}

#[tokio::test]
async fn provisions_binds_and_deletes_a_filesystem_volume() {
    let cluster = Cluster::new("fs").await;
    let driver = Driver::start(&[]).await;
    let mut sidecar = Sidecar::start(&driver, &[]);
    let class = cluster
        .class(
            "fast",
            &driver,
            "Delete",
            &[("type", "fast"), ("csi.storage.k8s.io/fstype", "ext4")],
        )
        .await;
    let created = cluster.claim("data", &class).await;
    let claim_uid = created
        .metadata
        .uid
        .clone()
        .expect("a created PVC has a uid");
    let volume_name = pv_name(&created);

    let bound = wait_bound(&cluster.claims, "data").await;
    assert_eq!(
        bound.spec.as_ref().and_then(|s| s.volume_name.as_deref()),
        Some(volume_name.as_str())
    );

    let volumes = driver.volumes();
    assert_eq!(volumes.len(), 1, "driver volumes: {volumes:?}");
    let volume = &volumes[0];
    assert_eq!(volume.name, volume_name, "CreateVolume name is pvc-<uid>");
    assert_eq!(volume.capacity_bytes, GIB);
    assert_eq!(
        volume.parameters,
        BTreeMap::from([("type".to_owned(), "fast".to_owned())]),
        "csi.storage.k8s.io/ keys are stripped from the parameters"
    );

    let pv = cluster.pv(&volume_name).await;
    let spec = pv.spec.clone().expect("PV spec");
    let claim_ref = spec.claim_ref.clone().expect("PV claimRef");
    assert_eq!(claim_ref.uid.as_deref(), Some(claim_uid.as_str()));
    assert_eq!(claim_ref.name.as_deref(), Some("data"));
    assert_eq!(claim_ref.namespace.as_deref(), Some(cluster.ns()));
    assert_eq!(claim_ref.kind.as_deref(), Some("PersistentVolumeClaim"));
    assert!(
        has_pv_finalizer(&pv),
        "finalizers {:?}",
        pv.metadata.finalizers
    );
    assert_eq!(annotation(&pv, ANN_PROVISIONED_BY), Some(driver.name()));
    // Upstream always writes the deletion-secret annotations, empty without a secret.
    assert_eq!(annotation(&pv, ANN_DELETION_SECRET_NAME), Some(""));
    assert_eq!(annotation(&pv, ANN_DELETION_SECRET_NAMESPACE), Some(""));
    assert_eq!(
        spec.capacity
            .as_ref()
            .and_then(|c| c.get("storage"))
            .map(|q| q.0.as_str()),
        Some("1Gi")
    );
    assert_eq!(
        spec.persistent_volume_reclaim_policy.as_deref(),
        Some("Delete")
    );
    assert_eq!(spec.storage_class_name.as_deref(), Some(class.as_str()));
    assert_eq!(
        spec.access_modes.as_deref(),
        Some(&["ReadWriteOnce".to_owned()][..])
    );
    assert_eq!(spec.volume_mode.as_deref(), Some("Filesystem"));
    let csi = spec.csi.clone().expect("PV csi source");
    assert_eq!(csi.driver, driver.name());
    assert_eq!(csi.volume_handle, volume.id);
    assert_eq!(csi.fs_type.as_deref(), Some("ext4"));
    let attributes = csi.volume_attributes.clone().unwrap_or_default();
    let identity = attributes
        .get(IDENTITY_KEY)
        .unwrap_or_else(|| panic!("no {IDENTITY_KEY} in {attributes:?}"));
    assert!(
        identity.ends_with(&format!("-{}", driver.name())),
        "identity {identity:?} is <ms>-<rand>-<driver>"
    );
    assert_eq!(
        attributes.get("type").map(String::as_str),
        Some("fast"),
        "the volume context is passed through"
    );

    // The success event is written after the PV, so it may trail the binding a little.
    let provisioning = format!(
        "External provisioner is provisioning volume for claim \"{}/data\"",
        cluster.ns()
    );
    let succeeded = format!("Successfully provisioned volume {volume_name}");
    for (reason, message) in [
        ("Provisioning", provisioning.as_str()),
        ("ProvisioningSucceeded", succeeded.as_str()),
    ] {
        let event = wait_event(&cluster.client, cluster.ns(), "data", reason, |m| {
            m == message
        })
        .await;
        assert_eq!(
            event.type_.as_deref(),
            Some("Normal"),
            "{reason} event type"
        );
    }

    cluster.delete_claim("data").await;
    cluster.wait_pv_gone(&volume_name).await;
    support::eventually("the driver to delete the volume", TIMEOUT, || async {
        match driver.volume_count() {
            0 => Ok(()),
            n => Err(format!("{n} volumes left")),
        }
    })
    .await;
    // The PV protection controller edits the deleting PV's finalizers while we remove ours;
    // that must not fail the deletion and make it start over with a second DeleteVolume.
    assert_eq!(driver.calls("DeleteVolume").len(), 1, "{}", sidecar.log());
    assert!(
        !sidecar.log().contains("volume deletion failed"),
        "{}",
        sidecar.log()
    );
    // The test cluster is a current one: the caches fill from streamed initial lists
    // (tests/initial_list.rs covers the fallback).
    assert!(
        sidecar
            .log()
            .contains("the API server streams initial lists"),
        "{}",
        sidecar.log()
    );
    sidecar.assert_running();
}

#[tokio::test]
async fn provisions_a_block_volume_without_fs_type() {
    let cluster = Cluster::new("block").await;
    let driver = Driver::start(&[]).await;
    let mut sidecar = Sidecar::start(&driver, &[]);
    let class = cluster
        .class(
            "block",
            &driver,
            "Delete",
            &[("csi.storage.k8s.io/fstype", "ext4")],
        )
        .await;
    let created = create_claim(&cluster.claims, &claim("raw", &class, "1Gi", Some("Block"))).await;
    wait_bound(&cluster.claims, "raw").await;

    let pv = cluster.pv(&pv_name(&created)).await;
    let spec = pv.spec.expect("PV spec");
    assert_eq!(spec.volume_mode.as_deref(), Some("Block"));
    let csi = spec.csi.expect("PV csi source");
    assert_eq!(csi.fs_type, None, "a block PV has no fsType");
    let volumes = driver.volumes();
    assert_eq!(volumes.len(), 1, "driver volumes: {volumes:?}");
    assert_eq!(
        volumes[0].access,
        csi_reference_driver::AccessKind::Block,
        "CreateVolume asked for block access"
    );
    sidecar.assert_running();
}

#[tokio::test]
async fn retain_policy_keeps_the_released_volume() {
    let cluster = Cluster::new("retain").await;
    let driver = Driver::start(&[]).await;
    let mut sidecar = Sidecar::start(&driver, &[]);
    let class = cluster.class("keep", &driver, "Retain", &[]).await;
    let created = cluster.claim("kept", &class).await;
    wait_bound(&cluster.claims, "kept").await;
    let name = pv_name(&created);
    assert_eq!(
        cluster
            .pv(&name)
            .await
            .spec
            .and_then(|s| s.persistent_volume_reclaim_policy)
            .as_deref(),
        Some("Retain")
    );
    // Upstream drops its finalizer from PVs that are not deleted by the provisioner.
    cluster.wait_pv_finalizer_gone(&name).await;

    cluster.delete_claim("kept").await;
    support::eventually("the PV to be Released", TIMEOUT, || async {
        let pv = cluster
            .volumes
            .get(&name)
            .await
            .map_err(|e| e.to_string())?;
        match pv_phase(&pv).as_deref() {
            Some("Released") => Ok(()),
            other => Err(format!("phase {other:?}")),
        }
    })
    .await;
    // The sidecar has seen the Released PV by now; give it a few more seconds to (wrongly)
    // delete anything, watching all the time.
    let window = Instant::now();
    while window.elapsed() < Duration::from_secs(3) {
        let pv = cluster
            .volumes
            .get_opt(&name)
            .await
            .expect("reading the PV");
        assert!(
            pv.as_ref()
                .is_some_and(|pv| pv_phase(pv).as_deref() == Some("Released")),
            "a Retain PV must stay Released, found {:?}",
            pv.map(|pv| pv_phase(&pv))
        );
        assert_eq!(driver.volume_count(), 1, "the driver must keep the volume");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(
        driver.calls("DeleteVolume").is_empty(),
        "DeleteVolume was called for a Retain volume"
    );
    sidecar.assert_running();
}

/// A PV is deleted before its volume (the precondition on its resourceVersion is the quorum
/// check), so while DeleteVolume fails the PV stays, Terminating, held by our finalizer, with
/// VolumeFailedDelete events. Switching its policy to Retain lets it go and keeps the volume;
/// otherwise the volume and the PV go once the driver recovers.
#[tokio::test]
async fn a_failing_delete_volume_keeps_the_terminating_pv_until_it_succeeds() {
    let cluster = Cluster::new("failed-delete").await;
    let driver = Driver::start(&["--fault", "DeleteVolume=before:internal"]).await;
    let mut sidecar = Sidecar::start(&driver, &FAST_RETRIES);
    let class = cluster.class("brittle", &driver, "Delete", &[]).await;
    let names = ["recovers", "rescued"];
    let mut volumes = Vec::new();
    for name in names {
        volumes.push(pv_name(&cluster.claim(name, &class).await));
    }
    for name in names {
        wait_bound(&cluster.claims, name).await;
        cluster.delete_claim(name).await;
    }
    for volume in &volumes {
        wait_event(
            &cluster.client,
            "default",
            volume,
            "VolumeFailedDelete",
            |m| m.contains("Internal"),
        )
        .await;
        let pv = cluster.pv(volume).await;
        assert!(pv.metadata.deletion_timestamp.is_some(), "{volume}");
        assert!(
            has_pv_finalizer(&pv),
            "{volume}: finalizers {:?}",
            pv.metadata.finalizers
        );
    }
    assert_eq!(driver.volume_count(), 2);

    cluster
        .volumes
        .patch(
            &volumes[1],
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"persistentVolumeReclaimPolicy": "Retain"}})),
        )
        .await
        .expect("switching the PV to Retain");
    cluster.wait_pv_gone(&volumes[1]).await;
    assert_eq!(driver.volume_count(), 2, "Retain keeps the volume");

    driver.clear_faults();
    cluster.wait_pv_gone(&volumes[0]).await;
    support::eventually("the driver to delete one volume", TIMEOUT, || async {
        let left: Vec<String> = driver.volumes().into_iter().map(|v| v.name).collect();
        (left == [volumes[1].clone()])
            .then_some(())
            .ok_or(format!("volumes left: {left:?}"))
    })
    .await;
    sidecar.assert_running();
}

#[tokio::test]
async fn provisioner_secret_from_templates_reaches_the_driver() {
    let cluster = Cluster::new("secrets").await;
    // Both at their highest verbosity: no secret value may reach a log even then.
    let driver = Driver::start_logging(&[], "trace").await;
    let highest_verbosity = [FAST_RETRIES[0], FAST_RETRIES[1], "-v=10"];
    let mut sidecar = Sidecar::start_with(&driver, SidecarOptions::args(&highest_verbosity));
    let class = cluster
        .class(
            "secret",
            &driver,
            "Delete",
            &[
                (
                    "csi.storage.k8s.io/provisioner-secret-name",
                    "${pvc.name}-secret",
                ),
                (
                    "csi.storage.k8s.io/provisioner-secret-namespace",
                    "${pvc.namespace}",
                ),
            ],
        )
        .await;
    let password = format!("pw-{}", uuid::Uuid::new_v4().simple());
    cluster
        .create_secret(
            "alpha-secret",
            &[("username", "admin"), ("password", &password)],
        )
        .await;

    // 1. The Secret exists: its keys reach CreateVolume, its ref lands on the PV.
    let alpha = cluster.claim("alpha", &class).await;
    wait_bound(&cluster.claims, "alpha").await;
    let alpha_volume = pv_name(&alpha);
    let pv = cluster.pv(&alpha_volume).await;
    assert_eq!(
        annotation(&pv, ANN_DELETION_SECRET_NAME),
        Some("alpha-secret")
    );
    assert_eq!(
        annotation(&pv, ANN_DELETION_SECRET_NAMESPACE),
        Some(cluster.ns())
    );
    let requests: Vec<String> = driver
        .requests("CreateVolume")
        .into_iter()
        .filter(|r| r.contains(&alpha_volume))
        .collect();
    assert!(!requests.is_empty(), "no CreateVolume for {alpha_volume}");
    for request in &requests {
        assert!(
            request.contains(
                r#"secrets: {"password": "***stripped***", "username": "***stripped***"}"#
            ),
            "CreateVolume did not carry the Secret's keys: {request}"
        );
    }

    // 2. The Secret is missing: a ProvisioningFailed event, no CreateVolume; then it appears.
    let beta = cluster.claim("beta", &class).await;
    let expected = format!(
        "error getting secret beta-secret in namespace {}",
        cluster.ns()
    );
    let failed = wait_event(
        &cluster.client,
        cluster.ns(),
        "beta",
        "ProvisioningFailed",
        |m| m.contains(&expected),
    )
    .await;
    assert_eq!(failed.type_.as_deref(), Some("Warning"));
    let beta_volume = pv_name(&beta);
    assert!(
        !driver
            .requests("CreateVolume")
            .iter()
            .any(|r| r.contains(&beta_volume)),
        "CreateVolume must not be called without the Secret"
    );
    cluster
        .create_secret("beta-secret", &[("token", "t0k3n")])
        .await;
    wait_bound(&cluster.claims, "beta").await;

    // 3. Deletion reads the Secret named on the PV.
    cluster.delete_claim("alpha").await;
    cluster.wait_pv_gone(&alpha_volume).await;
    let deletes = driver.requests("DeleteVolume");
    assert!(
        deletes.iter().any(|r| r
            .contains(r#"secrets: {"password": "***stripped***", "username": "***stripped***"}"#)),
        "DeleteVolume did not carry the deletion Secret's keys: {deletes:?}"
    );
    assert_eq!(driver.volume_count(), 1, "only beta's volume is left");
    let encoded = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, &password);
    for (who, log) in [("driver", driver.log()), ("sidecar", sidecar.log())] {
        assert!(
            !log.contains(&password) && !log.contains(&encoded),
            "a secret value reached the {who} log (at the highest verbosity)"
        );
    }
    sidecar.assert_running();
}

#[tokio::test]
async fn unknown_reserved_parameter_fails_without_calling_the_driver() {
    let cluster = Cluster::new("reserved").await;
    let driver = Driver::start(&[]).await;
    let mut sidecar = Sidecar::start(&driver, &[]);
    let class = cluster
        .class(
            "reserved",
            &driver,
            "Delete",
            &[("csi.storage.k8s.io/unknown", "x")],
        )
        .await;
    cluster.claim("bad", &class).await;
    let expected = "failed to strip CSI Parameters of prefixed keys: found unknown parameter key \
                    \"csi.storage.k8s.io/unknown\" with reserved namespace csi.storage.k8s.io/";
    let event = wait_event(
        &cluster.client,
        cluster.ns(),
        "bad",
        "ProvisioningFailed",
        |m| m == expected,
    )
    .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert!(
        driver.requests("CreateVolume").is_empty(),
        "the driver was asked to create a volume"
    );
    assert_eq!(driver.volume_count(), 0);
    sidecar.assert_running();
}

#[tokio::test]
async fn final_driver_error_is_reported_and_retried() {
    let cluster = Cluster::new("final").await;
    let driver = Driver::start(&["--fault", "CreateVolume=before:internal:2"]).await;
    let mut sidecar = Sidecar::start_with(&driver, SidecarOptions::args(&FAST_RETRIES));
    let class = cluster.class("final", &driver, "Delete", &[]).await;
    cluster.claim("retried", &class).await;
    let event = wait_event(
        &cluster.client,
        cluster.ns(),
        "retried",
        "ProvisioningFailed",
        |m| m.contains("rpc error: code = Internal"),
    )
    .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    wait_bound(&cluster.claims, "retried").await;
    let codes: Vec<String> = driver
        .calls("CreateVolume")
        .into_iter()
        .map(|c| c.code)
        .collect();
    assert_eq!(
        codes,
        ["Internal", "Internal", "Ok"],
        "two failures, then one successful retry"
    );
    assert_eq!(driver.volume_count(), 1);
    sidecar.assert_running();
}

#[tokio::test]
async fn infeasible_driver_error_delays_the_retry() {
    let cluster = Cluster::new("infeasible").await;
    let driver = Driver::start(&["--fault", "CreateVolume=before:invalid-argument:1"]).await;
    // The slow-retry window is --retry-interval-max; a normal retry would come after 200 ms.
    let mut sidecar = Sidecar::start_with(
        &driver,
        SidecarOptions::args(&["--retry-interval-start=200ms", "--retry-interval-max=3s"]),
    );
    let class = cluster.class("infeasible", &driver, "Delete", &[]).await;
    cluster.claim("slow", &class).await;
    let event = wait_event(
        &cluster.client,
        cluster.ns(),
        "slow",
        "ProvisioningFailed",
        |m| m.starts_with("Volume provisioning failed with infeasible error. Retries will be delayed. rpc error: code = InvalidArgument"),
    )
    .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    wait_bound(&cluster.claims, "slow").await;

    let calls = driver.calls("CreateVolume");
    let codes: Vec<&str> = calls.iter().map(|c| c.code.as_str()).collect();
    assert_eq!(
        codes,
        ["InvalidArgument", "Ok"],
        "no retry inside the slow-retry window, one after it"
    );
    let gap = calls[1].at.duration_since(calls[0].at);
    eprintln!("retry after the infeasible error came {gap:#}");
    assert!(
        gap >= k8s_openapi::jiff::SignedDuration::from_secs(2),
        "the retry came {gap:#} after the infeasible error, inside the 3 s slow-retry window"
    );
    assert_eq!(driver.volume_count(), 1);
    sidecar.assert_running();
}

#[tokio::test]
async fn deadline_exceeded_after_create_binds_without_a_duplicate() {
    let cluster = Cluster::new("deadline").await;
    let driver = Driver::start(&["--fault", "CreateVolume=after:deadline-exceeded:1"]).await;
    let mut sidecar = Sidecar::start_with(&driver, SidecarOptions::args(&FAST_RETRIES));
    let class = cluster.class("deadline", &driver, "Delete", &[]).await;
    let created = cluster.claim("late", &class).await;
    wait_event(
        &cluster.client,
        cluster.ns(),
        "late",
        "ProvisioningFailed",
        |m| m.contains("DeadlineExceeded"),
    )
    .await;
    wait_bound(&cluster.claims, "late").await;

    let volumes = driver.volumes();
    assert_eq!(volumes.len(), 1, "exactly one volume: {volumes:?}");
    let pv = cluster.pv(&pv_name(&created)).await;
    assert_eq!(
        pv.spec
            .and_then(|s| s.csi)
            .map(|csi| csi.volume_handle)
            .as_deref(),
        Some(volumes[0].id.as_str()),
        "the PV holds the volume the first (timed-out) call created"
    );
    let codes: Vec<String> = driver
        .calls("CreateVolume")
        .into_iter()
        .map(|c| c.code)
        .collect();
    assert_eq!(codes.first().map(String::as_str), Some("DeadlineExceeded"));
    assert_eq!(codes.last().map(String::as_str), Some("Ok"));
    sidecar.assert_running();
}

#[tokio::test]
async fn backoff_bounds_the_attempts_of_a_persistent_error() {
    let cluster = Cluster::new("backoff").await;
    let driver = Driver::start(&["--fault", "CreateVolume=before:internal"]).await;
    let mut sidecar = Sidecar::start_with(
        &driver,
        SidecarOptions {
            metrics: true,
            ..SidecarOptions::args(&FAST_RETRIES)
        },
    );
    sidecar.wait_metrics().await;
    let class = cluster.class("backoff", &driver, "Delete", &[]).await;
    cluster.claim("stuck", &class).await;

    let attempts = |page: &str| {
        metric_sum(
            &parse_metrics(page),
            "csi_sidecar_operations_seconds_count",
            &[
                ("driver_name", driver.name()),
                ("method_name", CREATE_VOLUME_METHOD),
            ],
        )
    };
    let at_start = support::eventually("the first CreateVolume attempt", TIMEOUT, || async {
        let page = sidecar.metrics()?;
        match attempts(&page) {
            n if n >= 1.0 => Ok(n),
            n => Err(format!("{n} attempts")),
        }
    })
    .await;
    // A measurement window: with 200 ms doubling up to 2 s, at most about 5 attempts fall into
    // 6 s; without backoff there would be dozens. The bound is the one the backoff controls (no
    // more than that); how many a loaded machine manages is not asserted beyond one retry.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let page = sidecar.metrics().unwrap_or_else(|e| panic!("{e}"));
    let in_window = attempts(&page) - at_start;
    let failed = metric_sum(
        &parse_metrics(&page),
        "csi_sidecar_operations_seconds_count",
        &[
            ("method_name", CREATE_VOLUME_METHOD),
            ("grpc_status_code", "Internal"),
        ],
    );
    let gaps: Vec<String> = driver
        .calls("CreateVolume")
        .windows(2)
        .map(|w| format!("{:#}", w[1].at.duration_since(w[0].at)))
        .collect();
    eprintln!("{in_window} CreateVolume attempts in 6 s; gaps between attempts: {gaps:?}");
    assert!(
        (1.0..=10.0).contains(&in_window),
        "{in_window} attempts in 6 s; gaps {gaps:?}"
    );
    assert_eq!(
        failed,
        attempts(&page),
        "every attempt failed with Internal"
    );

    driver.clear_faults();
    wait_bound(&cluster.claims, "stuck").await;
    assert_eq!(driver.volume_count(), 1);

    // The claim queue as client-go's would count it: every failed attempt a retry, every
    // retry an add, nothing left waiting or running once the claim is bound.
    let samples = support::eventually("the claim queue to empty", TIMEOUT, || async {
        let samples = parse_metrics(&sidecar.metrics()?);
        let claims = |series: &str| metric_sum(&samples, series, &[("name", "claims")]);
        match (
            claims("workqueue_depth"),
            claims("workqueue_unfinished_work_seconds"),
        ) {
            (0.0, 0.0) => Ok(samples),
            other => Err(format!("depth and unfinished work {other:?}")),
        }
    })
    .await;
    let claims = |series: &str| metric_sum(&samples, series, &[("name", "claims")]);
    let failed_attempts = metric_sum(
        &samples,
        "csi_sidecar_operations_seconds_count",
        &[
            ("method_name", CREATE_VOLUME_METHOD),
            ("grpc_status_code", "Internal"),
        ],
    );
    let retries = claims("workqueue_retries_total");
    assert!(
        retries >= failed_attempts,
        "{retries} retries for {failed_attempts} failed CreateVolume calls"
    );
    assert!(claims("workqueue_adds_total") > retries, "the first add");
    assert_eq!(
        claims("workqueue_work_duration_seconds_count"),
        claims("workqueue_queue_duration_seconds_count"),
        "each reconcile waited and ran once"
    );
    assert!(claims("workqueue_work_duration_seconds_count") > failed_attempts);
    let volumes = |series: &str| metric_sum(&samples, series, &[("name", "volumes")]);
    assert_eq!(volumes("workqueue_depth"), 0.0, "the volume queue exists");
    for series in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_virtual_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_virtual_memory_max_bytes",
        "process_start_time_seconds",
    ] {
        assert!(
            metric_sum(&samples, series, &[]) > 0.0,
            "{series} of the running sidecar"
        );
    }
    sidecar.assert_running();
}

#[tokio::test]
async fn claim_deleted_while_create_volume_is_in_flight_leaves_nothing() {
    let cluster = Cluster::new("inflight").await;
    let driver = Driver::start(&["--delay", "CreateVolume=3s"]).await;
    let mut sidecar = Sidecar::start_with(&driver, SidecarOptions::args(&FAST_RETRIES));
    let class = cluster.class("inflight", &driver, "Delete", &[]).await;
    let created = cluster.claim("gone", &class).await;
    driver.wait_create_received(&pv_name(&created)).await;
    cluster.delete_claim("gone").await;

    support::eventually("the delayed CreateVolume to finish", TIMEOUT, || async {
        let log = driver.log();
        if driver.calls("CreateVolume").is_empty()
            && !log.contains("CSI call cancelled by the caller")
        {
            Err("still running".to_owned())
        } else {
            Ok(())
        }
    })
    .await;
    support::eventually("no volume and no PV to be left", TIMEOUT, || async {
        let pvs = driver_pvs(&cluster.client, &driver).await?;
        let volumes = driver.volume_count();
        if pvs.is_empty() && volumes == 0 {
            Ok(())
        } else {
            Err(format!(
                "{volumes} volumes, PVs {:?}",
                pvs.iter()
                    .map(|pv| (pv.metadata.name.clone(), pv_phase(pv)))
                    .collect::<Vec<_>>()
            ))
        }
    })
    .await;
    eprintln!(
        "CreateVolume calls: {:?}, DeleteVolume calls: {:?}",
        driver
            .calls("CreateVolume")
            .iter()
            .map(|c| &c.code)
            .collect::<Vec<_>>(),
        driver
            .calls("DeleteVolume")
            .iter()
            .map(|c| &c.code)
            .collect::<Vec<_>>()
    );
    sidecar.assert_running();
}

/// Creates `count` claims `<prefix>-<i>`, `spacing` apart, and returns their names. Spaced
/// claims are at different stages when a peer is killed: done, in flight, not started.
async fn create_claims(
    cluster: &Cluster,
    class: &str,
    count: usize,
    spacing: Duration,
) -> Vec<String> {
    let mut names = Vec::new();
    for i in 0..count {
        let name = format!("claim-{i}");
        cluster.claim(&name, class).await;
        names.push(name);
        tokio::time::sleep(spacing).await;
    }
    names
}

/// All claims Bound, every driver volume has exactly one PV and vice versa.
async fn assert_all_bound_one_volume_each(cluster: &Cluster, driver: &Driver, names: &[String]) {
    for name in names {
        wait_bound(&cluster.claims, name).await;
    }
    let (handles, ids) = handles_and_volume_ids(cluster, driver).await;
    assert_eq!(
        handles, ids,
        "driver volumes and PV volume handles differ (leak or duplicate)"
    );
    assert_eq!(ids.len(), names.len(), "one volume per claim");
}

#[tokio::test]
async fn driver_restarted_mid_run_loses_no_claim() {
    let cluster = Cluster::new("driver-restart").await;
    let mut driver = Driver::start(&["--delay", "CreateVolume=1s"]).await;
    let mut sidecar = Sidecar::start_with(&driver, SidecarOptions::args(&FAST_RETRIES));
    let class = cluster.class("restart", &driver, "Delete", &[]).await;
    let creating = create_claims(&cluster, &class, 8, Duration::from_millis(250));
    let kill_mid_run = async {
        support::eventually("some volumes to exist", TIMEOUT, || async {
            match driver.volume_count() {
                n if n >= 2 => Ok(()),
                n => Err(format!("{n} volumes")),
            }
        })
        .await;
        driver.kill().await;
        eprintln!("driver killed with {} volumes saved", driver.volume_count());
        driver.restart().await;
    };
    let (names, ()) = tokio::join!(creating, kill_mid_run);

    assert_all_bound_one_volume_each(&cluster, &driver, &names).await;
    sidecar.assert_running();
}

#[tokio::test]
async fn sidecar_restarted_mid_run_loses_no_claim_and_duplicates_nothing() {
    let cluster = Cluster::new("sidecar-restart").await;
    let driver = Driver::start(&["--delay", "CreateVolume=2s"]).await;
    let mut sidecar = Sidecar::start_with(&driver, SidecarOptions::args(&FAST_RETRIES));
    let class = cluster.class("restart", &driver, "Delete", &[]).await;
    let creating = create_claims(&cluster, &class, 10, Duration::from_millis(300));
    let kill_mid_run = async {
        support::eventually("some volumes to exist", TIMEOUT, || async {
            match driver.volume_count() {
                n if n >= 3 => Ok(()),
                n => Err(format!("{n} volumes")),
            }
        })
        .await;
        sidecar.kill().await;
        eprintln!(
            "sidecar killed with {} volumes created and {} PVs",
            driver.volume_count(),
            driver_pvs(&cluster.client, &driver)
                .await
                .map(|pvs| pvs.len())
                .unwrap_or_default()
        );
        sidecar.restart().await;
    };
    let (names, ()) = tokio::join!(creating, kill_mid_run);

    assert_all_bound_one_volume_each(&cluster, &driver, &names).await;
    sidecar.assert_running();
}

#[tokio::test]
async fn metrics_carry_upstream_names_and_labels() {
    let cluster = Cluster::new("metrics").await;
    let driver = Driver::start(&[]).await;
    let mut sidecar = Sidecar::start_with(
        &driver,
        SidecarOptions {
            metrics: true,
            ..SidecarOptions::default()
        },
    );
    sidecar.wait_metrics().await;
    let class = cluster.class("metrics", &driver, "Delete", &[]).await;
    cluster.claim("measured", &class).await;
    wait_bound(&cluster.claims, "measured").await;

    // The counter is bumped after the PV is created, so it may trail the binding a little.
    let page = support::eventually("provision_total to count the claim", TIMEOUT, || async {
        let page = sidecar.metrics()?;
        let provisioned = metric_sum(
            &parse_metrics(&page),
            "controller_persistentvolumeclaim_provision_total",
            &[("class", class.as_str()), ("source", "")],
        );
        if provisioned == 1.0 {
            Ok(page)
        } else {
            Err(format!("provision_total {provisioned}"))
        }
    })
    .await;
    let samples = parse_metrics(&page);
    assert!(
        page.contains("# TYPE csi_sidecar_operations_seconds histogram"),
        "csi_sidecar_operations_seconds is a histogram"
    );
    let creates: Vec<_> = samples
        .iter()
        .filter(|s| {
            s.name == "csi_sidecar_operations_seconds_count"
                && s.labels.get("method_name").map(String::as_str) == Some(CREATE_VOLUME_METHOD)
        })
        .collect();
    assert_eq!(creates.len(), 1, "one CreateVolume series: {creates:?}");
    let labels: BTreeMap<&str, &str> = creates[0]
        .labels
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        labels,
        BTreeMap::from([
            ("driver_name", driver.name()),
            ("grpc_status_code", "OK"),
            ("method_name", CREATE_VOLUME_METHOD),
        ])
    );
    assert_eq!(creates[0].value, 1.0);
    assert!(
        samples
            .iter()
            .any(|s| s.name == "csi_sidecar_operations_seconds_bucket"
                && s.labels.get("method_name").map(String::as_str) == Some(CREATE_VOLUME_METHOD)
                && s.labels.get("le").map(String::as_str) == Some("0.1")),
        "histogram buckets start at upstream's 0.1"
    );
    let provisioned: Vec<_> = samples
        .iter()
        .filter(|s| s.name == "controller_persistentvolumeclaim_provision_total")
        .collect();
    let label_names: BTreeSet<&str> = provisioned
        .iter()
        .flat_map(|s| s.labels.keys().map(String::as_str))
        .collect();
    assert_eq!(label_names, BTreeSet::from(["class", "source"]));
    assert!(
        samples.iter().any(|s| s.name
            == "controller_persistentvolumeclaim_provision_duration_seconds_count"
            && s.labels.get("class") == Some(&class)),
        "provision duration histogram for the class"
    );
    sidecar.assert_running();
}

/// The cluster test binary (tests/cluster/main.rs) installs no snapshot CRDs: a restore is told that the VolumeSnapshot CRD is
/// missing, nothing is created, the sidecar keeps running (its snapshot sweeper waits for the
/// CRDs) and claims without a data source are still provisioned.
#[tokio::test]
async fn bad_input_a_restore_in_a_cluster_without_the_volume_snapshot_crd() {
    let cluster = Cluster::new("no-snapshot-crd").await;
    let driver = Driver::start(&[]).await;
    let mut sidecar = Sidecar::start(&driver, &["--retry-interval-max=2s"]);
    let class = cluster.class("plain", &driver, "Delete", &[]).await;
    let mut restore = claim("restored", &class, "1Gi", None);
    if let Some(spec) = restore.spec.as_mut() {
        spec.data_source = Some(k8s_openapi::api::core::v1::TypedLocalObjectReference {
            api_group: Some("snapshot.storage.k8s.io".to_owned()),
            kind: "VolumeSnapshot".to_owned(),
            name: "snap".to_owned(),
        });
    }
    create_claim(&cluster.claims, &restore).await;
    wait_event(
        &cluster.client,
        cluster.ns(),
        "restored",
        "ProvisioningFailed",
        |message| {
            message.starts_with(
                "error getting handle for DataSource Type VolumeSnapshot by Name snap: error getting snapshot snap from api server: ",
            ) && message.contains(
                "(the VolumeSnapshot CRD of snapshot.storage.k8s.io/v1 is not installed in the cluster)",
            )
        },
    )
    .await;
    cluster.claim("plain", &class).await;
    wait_bound(&cluster.claims, "plain").await;
    assert_eq!(driver.volume_count(), 1, "only the plain claim's volume");
    sidecar.assert_running();
}

/// `--enable-pprof`: the profiling paths on the metrics server, 404 without the flag; the CPU
/// profile is gzip'd `profile.proto` of the time asked for.
#[tokio::test]
async fn profiling_endpoints_are_served_only_with_enable_pprof() {
    use std::io::Read;

    use csi_provisioner::profiling::cpu::Profile;
    use prost::Message;

    let driver = Driver::start(&[]).await;
    let options = |args: &[&str]| SidecarOptions {
        metrics: true,
        ..SidecarOptions::args(args)
    };
    let mut with = Sidecar::start_with(&driver, options(&["--enable-pprof"]));
    let mut without = Sidecar::start_with(&driver, options(&[]));
    with.wait_metrics().await;
    without.wait_metrics().await;
    let status = |sidecar: &Sidecar, path: &str| {
        sidecar
            .http_get(path, Duration::ZERO)
            .unwrap_or_else(|e| panic!("{e}"))
            .0
    };
    for path in [
        "/debug/pprof/",
        "/debug/pprof/heap",
        "/debug/pprof/cmdline",
        "/debug/pprof/profile?seconds=1",
    ] {
        assert_eq!(status(&without, path), 404, "{path} without the flag");
    }
    for path in ["/debug/pprof/", "/debug/pprof/heap", "/debug/pprof/cmdline"] {
        assert_eq!(status(&with, path), 200, "{path} with the flag");
    }
    assert_eq!(status(&with, "/debug/pprof/goroutine"), 404, "Go's only");

    let (code, gzipped) = with
        .http_get("/debug/pprof/profile?seconds=1", Duration::from_secs(1))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&gzipped));
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(gzipped.as_slice())
        .read_to_end(&mut bytes)
        .expect("a gzip stream");
    let profile = Profile::decode(bytes.as_slice()).expect("profile.proto");
    let text = |i: i64| {
        usize::try_from(i)
            .ok()
            .and_then(|i| profile.string_table.get(i))
            .map_or("?", String::as_str)
    };
    let types: Vec<(&str, &str)> = profile
        .sample_type
        .iter()
        .map(|t| (text(t.r#type), text(t.unit)))
        .collect();
    assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
    assert_eq!(profile.period, 10_000_000, "100 Hz");
    assert!(
        (1_000_000_000..2_000_000_000).contains(&profile.duration_nanos),
        "profiled for {} ns",
        profile.duration_nanos
    );
    with.assert_running();
    without.assert_running();
}
