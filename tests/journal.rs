//! The journal of operations in flight and the provisioning-consistency finalizer, end to end:
//! the leaks of upstream issue #486 (its timelines B and C: a claim deleted, or the sidecar killed,
//! while CreateVolume is pending)
//! reproduced on a real control plane with the reference driver and the sidecar as processes,
//! and shown not to leak.
//!
//! Every sidecar runs with `--leader-election-namespace=<test namespace>`, so its journal shards
//! live in the test's namespace; each test has its own driver, so its shards are its own.

use csi_test_support as support;

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use csi_provisioner::csi;
use csi_provisioner::csi::controller_client::ControllerClient;
use csi_provisioner::csi::volume_capability::{
    AccessMode, AccessType, MountVolume, access_mode::Mode,
};
use csi_provisioner::journal::{DRIVER_LABEL, OperationRecord, Phase, ProvisioningJournal};
use csi_provisioner::provision::ANN_PROVISIONING_CONSISTENCY;
use k8s_openapi::api::core::v1::{Event, Namespace, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, PostParams};
use nix::sys::signal::Signal;
use prost::Message;

use support::cluster::{
    CLASS_QUEUED_METRIC, Cluster, driver_pvs, events_of,
    has_consistency_finalizer as has_finalizer, journal_operations, pv_name, summarize, wait_bound,
};
use support::csi_wire::channel;
use support::peers::{Driver, Sidecar, SidecarOptions, TIMEOUT, metric_sum, parse_metrics};

const ORPHAN_DELETED: &str = "OrphanedVolumeDeleted";
const ORPHANS_METRIC: &str = "csi_provisioner_orphaned_volumes_deleted_total";
const ORPHAN_WAITING_FOR_SECRET: &str = "OrphanWaitingForSecret";
const WAITING_FOR_SECRET_METRIC: &str = "csi_provisioner_orphaned_volumes_waiting_for_secret";

/// The journal's flags and waits, on top of the shared cluster helpers (a trait: `Cluster` is
/// csi-test-support's).
trait JournalCluster {
    /// The sidecar flags of every test here: journal in the test namespace, fast retries.
    fn sidecar_options(&self, extra: &[&str], metrics: bool) -> SidecarOptions;

    async fn operations(&self, driver: &Driver) -> Vec<OperationRecord>;

    /// Waits until the journal holds the operation of `volume` and `accept` likes it.
    async fn wait_operation(
        &self,
        driver: &Driver,
        volume: &str,
        what: &str,
        accept: impl Fn(&OperationRecord) -> bool,
    ) -> OperationRecord;

    /// Waits until the journal holds no operation (removals are written after the fact).
    async fn wait_nothing_in_journal(&self, driver: &Driver);

    /// Waits until nothing of `driver` is left: no volume on the driver, no PV, no journal
    /// operation.
    async fn wait_nothing_left(&self, driver: &Driver);

    /// Events with `reason` in the journal namespace (about journal shards).
    async fn journal_events(&self, reason: &str) -> Vec<Event>;

    async fn wait_orphan_event(&self, volume: &str) -> Event;

    /// Waits for an event with `reason` in the journal namespace whose message names `volume`.
    async fn wait_journal_event(&self, reason: &str, volume: &str) -> Event;
}

impl JournalCluster for Cluster {
    fn sidecar_options(&self, extra: &[&str], metrics: bool) -> SidecarOptions {
        let mut args = vec![
            format!("--leader-election-namespace={}", self.ns()),
            "--retry-interval-start=200ms".to_owned(),
            "--retry-interval-max=2s".to_owned(),
        ];
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        SidecarOptions {
            args,
            metrics,
            ..SidecarOptions::default()
        }
    }

    async fn operations(&self, driver: &Driver) -> Vec<OperationRecord> {
        journal_operations(&self.client, self.ns(), driver)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    async fn wait_operation(
        &self,
        driver: &Driver,
        volume: &str,
        what: &str,
        accept: impl Fn(&OperationRecord) -> bool,
    ) -> OperationRecord {
        support::eventually(
            &format!("the journal to show {volume} {what}"),
            TIMEOUT,
            || async {
                let operations = journal_operations(&self.client, self.ns(), driver).await?;
                operations
                    .iter()
                    .find(|op| op.volume_name == volume && accept(op))
                    .cloned()
                    .ok_or_else(|| format!("{operations:?}"))
            },
        )
        .await
    }

    async fn wait_nothing_in_journal(&self, driver: &Driver) {
        support::eventually("the journal to be empty", TIMEOUT, || async {
            let operations = journal_operations(&self.client, self.ns(), driver).await?;
            if operations.is_empty() {
                Ok(())
            } else {
                Err(format!("{operations:?}"))
            }
        })
        .await;
    }

    async fn wait_nothing_left(&self, driver: &Driver) {
        support::eventually(
            "no volume, PV or journal operation to be left",
            TIMEOUT,
            || async {
                let volumes = driver.volumes();
                let pvs = driver_pvs(&self.client, driver).await?;
                let operations = journal_operations(&self.client, self.ns(), driver).await?;
                if volumes.is_empty() && pvs.is_empty() && operations.is_empty() {
                    Ok(())
                } else {
                    Err(format!(
                        "driver volumes {:?}, PVs {:?}, journal {operations:?}",
                        volumes.iter().map(|v| &v.name).collect::<Vec<_>>(),
                        pvs.iter().map(|pv| &pv.metadata.name).collect::<Vec<_>>()
                    ))
                }
            },
        )
        .await;
    }

    async fn journal_events(&self, reason: &str) -> Vec<Event> {
        Api::<Event>::namespaced(self.client.clone(), self.ns())
            .list(&ListParams::default())
            .await
            .unwrap_or_else(|e| panic!("listing events: {e}"))
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .collect()
    }

    async fn wait_orphan_event(&self, volume: &str) -> Event {
        self.wait_journal_event(ORPHAN_DELETED, volume).await
    }

    async fn wait_journal_event(&self, reason: &str, volume: &str) -> Event {
        support::eventually(
            &format!("an {reason} event about {volume}"),
            TIMEOUT,
            || async {
                let events = self.journal_events(reason).await;
                events
                    .iter()
                    .find(|e| e.message.as_deref().is_some_and(|m| m.contains(volume)))
                    .cloned()
                    .ok_or_else(|| format!("{reason} events: {events:?}"))
            },
        )
        .await
    }
}

fn is_bound(pvc: &PersistentVolumeClaim) -> bool {
    pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
}

/// Waits until the orphan of `volume` is deleted: nothing of `driver` left, the event, the metric.
async fn wait_orphan_deleted(
    cluster: &Cluster,
    driver: &Driver,
    sidecar: &mut Sidecar,
    volume: &str,
) {
    cluster.wait_nothing_left(driver).await;
    cluster.wait_orphan_event(volume).await;
    assert_eq!(orphans_deleted_metric(sidecar).await, 1.0);
}

async fn orphans_deleted_metric(sidecar: &mut Sidecar) -> f64 {
    let page = sidecar.wait_metrics().await;
    metric_sum(&parse_metrics(&page), ORPHANS_METRIC, &[])
}

// ------------------------------------------------------------------------------ the driver, directly

/// Sends `request` to the driver until it answers other than ABORTED (another call on the same
/// name still running), as a backend that finishes an operation its caller gave up on.
async fn create_on_driver(driver: &Driver, request: csi::CreateVolumeRequest) -> csi::Volume {
    let mut client = ControllerClient::new(channel(driver.socket()).await);
    support::eventually(
        &format!("CreateVolume {} to succeed on the driver", request.name),
        TIMEOUT,
        || {
            let mut client = client.clone();
            let request = request.clone();
            async move {
                match client.create_volume(request).await {
                    Ok(reply) => reply
                        .into_inner()
                        .volume
                        .ok_or_else(|| "a reply without a volume".to_owned()),
                    Err(status) if status.code() == tonic::Code::Aborted => {
                        Err(status.message().to_owned())
                    }
                    Err(status) => panic!("CreateVolume failed: {status}"),
                }
            }
        },
    )
    .await;
    // The last answer was Ok; ask once more (idempotent) to hand the volume back.
    client
        .create_volume(request)
        .await
        .unwrap_or_else(|e| panic!("repeating CreateVolume: {e}"))
        .into_inner()
        .volume
        .unwrap_or_else(|| panic!("a reply without a volume"))
}

/// Puts `record` back in the journal as it was before its removal, whether or not that was
/// written (the sidecar must not be running). A lone operation is in the first shard, which
/// fills before the others.
async fn put_back(cluster: &Cluster, driver: &Driver, record: OperationRecord) {
    let shards: Api<ProvisioningJournal> = Api::namespaced(cluster.client.clone(), cluster.ns());
    let shard_name = format!("{}-0", csi_provisioner::leader::lease_name(driver.name()));
    let mut shard = shards
        .get(&shard_name)
        .await
        .unwrap_or_else(|e| panic!("reading journal shard {shard_name}: {e}"));
    shard
        .spec
        .operations
        .retain(|op| op.volume_name != record.volume_name);
    shard.spec.operations.push(record);
    shards
        .replace(&shard_name, &PostParams::default(), &shard)
        .await
        .unwrap_or_else(|e| panic!("restoring the record: {e}"));
    assert_eq!(cluster.operations(driver).await.len(), 1);
}

fn decode_request(record: &OperationRecord) -> csi::CreateVolumeRequest {
    let bytes = STANDARD
        .decode(&record.request)
        .unwrap_or_else(|e| panic!("journal request is not base64: {e}"));
    csi::CreateVolumeRequest::decode(bytes.as_slice())
        .unwrap_or_else(|e| panic!("journal request is not a CreateVolumeRequest: {e}"))
}

// ------------------------------------------------------------------------------ the leaks of #486

/// Timeline C: the sidecar dies while CreateVolume is pending, the claim is deleted, the
/// backend finishes the volume, the sidecar comes back. Upstream has no trace of the operation
/// any more and leaks the volume; the journal makes the new process delete it.
#[tokio::test]
async fn a_volume_created_while_the_sidecar_was_dead_for_a_deleted_claim_is_deleted() {
    let cluster = Cluster::new("journal-restart").await;
    let driver = Driver::start(&["--delay", "CreateVolume=4s"]).await;
    let mut sidecar = Sidecar::start_with(&driver, cluster.sidecar_options(&[], true));
    let class = cluster.class("journal", &driver, "Delete", &[]).await;
    let created = cluster.claim("data", &class).await;
    let volume = pv_name(&created);
    let uid = created.metadata.uid.clone().unwrap_or_default();

    let record = cluster
        .wait_operation(&driver, &volume, "recorded", |op| op.claim_uid == uid)
        .await;
    assert_eq!(record.claim, format!("{}/data", cluster.ns()));
    assert_eq!(record.storage_class, class);
    driver.wait_create_received(&volume).await;
    sidecar.kill().await;

    cluster.delete_claim("data").await;
    cluster.wait_claim_gone("data").await;
    // The reference driver abandons a call whose caller went away; a real backend usually
    // finishes it. The test plays the backend with the very request the journal holds.
    let request = decode_request(&record);
    assert_eq!(
        request.name, volume,
        "the journal holds the CreateVolume request"
    );
    let backend_volume = create_on_driver(&driver, request).await;
    assert_eq!(driver.volume_count(), 1);
    assert!(
        driver_pvs(&cluster.client, &driver)
            .await
            .unwrap_or_default()
            .is_empty(),
        "no PV was created for the deleted claim"
    );

    sidecar.restart().await;
    cluster.wait_nothing_left(&driver).await;
    let event = cluster.wait_orphan_event(&volume).await;
    let message = event.message.unwrap_or_default();
    assert!(
        message.contains(&backend_volume.volume_id) && message.contains(&uid),
        "the event names the volume id and the claim uid: {message}"
    );
    assert_eq!(
        event.involved_object.kind.as_deref(),
        Some("ProvisioningJournal"),
        "the event regards the journal shard"
    );
    assert_eq!(orphans_deleted_metric(&mut sidecar).await, 1.0);
    assert!(
        driver.calls("DeleteVolume").iter().any(|c| c.code == "Ok"),
        "DeleteVolume was called"
    );
    sidecar.assert_running();
}

/// Timeline B: the claim is deleted while CreateVolume keeps answering DEADLINE_EXCEEDED
/// (the volume exists, the answer is lost). The reaper keeps replaying CreateVolume, with the
/// failure visible in the journal, until it learns the volume id and deletes the volume.
#[tokio::test]
async fn a_claim_deleted_while_create_volume_keeps_timing_out_leaves_nothing() {
    let cluster = Cluster::new("journal-timeouts").await;
    let driver = Driver::start(&["--fault", "CreateVolume=after:deadline-exceeded"]).await;
    let mut sidecar = Sidecar::start_with(&driver, cluster.sidecar_options(&[], true));
    let class = cluster.class("journal", &driver, "Delete", &[]).await;
    let created = cluster.claim("data", &class).await;
    let volume = pv_name(&created);

    driver.wait_holds(&volume).await;
    cluster
        .wait_operation(&driver, &volume, "with a failed attempt", |op| {
            op.attempts >= 1 && op.last_error.is_some()
        })
        .await;
    cluster.delete_claim("data").await;
    cluster.wait_claim_gone("data").await;

    let orphaned = cluster
        .wait_operation(&driver, &volume, "orphaned", |op| {
            op.phase == Phase::Orphaned
        })
        .await;
    assert!(
        orphaned
            .last_error
            .as_deref()
            .is_some_and(|e| e.to_lowercase().contains("deadline")),
        "the journal shows why the orphan is not deleted yet: {orphaned:?}"
    );
    assert_eq!(driver.volume_count(), 1, "the volume is still there");

    driver.set_faults("fault CreateVolume=after:deadline-exceeded:2\n");
    wait_orphan_deleted(&cluster, &driver, &mut sidecar, &volume).await;
    sidecar.assert_running();
}

// ------------------------------------------------------------------------------ the consistency finalizer

/// `enable`: the finalizer is on the claim before CreateVolume is sent and comes off once the
/// claim is Bound.
#[tokio::test]
async fn the_consistency_finalizer_guards_provisioning_and_goes_once_bound() {
    let cluster = Cluster::new("journal-finalizer").await;
    let driver = Driver::start(&["--delay", "CreateVolume=3s"]).await;
    let mut sidecar = Sidecar::start_with(&driver, cluster.sidecar_options(&[], false));
    let class = cluster.class("journal", &driver, "Delete", &[]).await;
    let created = cluster.consistent_claim("data", &class, "enable").await;
    let volume = pv_name(&created);

    driver.wait_create_received(&volume).await;
    let during = cluster
        .get_claim("data")
        .await
        .unwrap_or_else(|| panic!("PVC gone"));
    assert!(
        has_finalizer(&during),
        "the finalizer is added before CreateVolume: {:?}",
        during.metadata.finalizers
    );

    wait_bound(&cluster.claims, "data").await;
    support::eventually(
        "the finalizer to be removed from the Bound claim",
        TIMEOUT,
        || async {
            let pvc = cluster.get_claim("data").await.ok_or("PVC gone")?;
            if is_bound(&pvc) && !has_finalizer(&pvc) {
                Ok(())
            } else {
                Err(format!("finalizers {:?}", pvc.metadata.finalizers))
            }
        },
    )
    .await;
    cluster.wait_nothing_in_journal(&driver).await;
    sidecar.assert_running();
}

/// `enable` on a claim deleted mid-provision: it stays Terminating while its orphan exists
/// (the reaper cannot delete it while CreateVolume keeps failing), then goes.
#[tokio::test]
async fn a_deleted_claim_with_the_finalizer_stays_until_its_orphan_is_deleted() {
    let cluster = Cluster::new("journal-terminating").await;
    let driver = Driver::start(&[
        "--delay",
        "CreateVolume=1s",
        "--fault",
        "CreateVolume=after:deadline-exceeded",
    ])
    .await;
    let mut sidecar = Sidecar::start_with(&driver, cluster.sidecar_options(&[], true));
    let class = cluster.class("journal", &driver, "Delete", &[]).await;
    let created = cluster.consistent_claim("data", &class, "enable").await;
    let volume = pv_name(&created);

    driver.wait_holds(&volume).await;
    cluster.delete_claim("data").await;
    cluster
        .wait_operation(&driver, &volume, "orphaned", |op| {
            op.phase == Phase::Orphaned
        })
        .await;
    let terminating = cluster
        .get_claim("data")
        .await
        .unwrap_or_else(|| panic!("the claim went while its volume still exists"));
    assert!(terminating.metadata.deletion_timestamp.is_some());
    assert!(
        has_finalizer(&terminating),
        "{:?}",
        terminating.metadata.finalizers
    );
    assert_eq!(driver.volume_count(), 1);

    driver.clear_faults();
    cluster.wait_claim_gone("data").await;
    wait_orphan_deleted(&cluster, &driver, &mut sidecar, &volume).await;
    sidecar.assert_running();
}

/// An orphan whose class is slow holds back only itself: while the reaper waits for a slot of
/// that class's rate (one call in 500 s) to replay the orphan's CreateVolume, it deletes
/// another class's orphan. The code before waited for every reap a scan had started before it
/// scanned again, so the second orphan waited the 500 s, and so would the audit's deletions
/// and `--drain`.
#[tokio::test]
async fn an_orphan_of_a_slow_class_holds_back_only_itself() {
    let cluster = Cluster::new("journal-slow-class").await;
    let driver = Driver::start(&["--fault", "CreateVolume=after:deadline-exceeded"]).await;
    let mut sidecar = Sidecar::start_with(&driver, cluster.sidecar_options(&[], true));
    let slow = cluster.class("slow", &driver, "Delete", &[]).await;
    let fast = cluster.class("fast", &driver, "Delete", &[]).await;
    let slow_volume = pv_name(&cluster.claim("slow-data", &slow).await);
    driver.wait_holds(&slow_volume).await;
    cluster.delete_claim("slow-data").await;
    cluster
        .wait_operation(&driver, &slow_volume, "orphaned", |op| {
            op.phase == Phase::Orphaned
        })
        .await;
    // From now on the class allows one call in 500 s: a replay of the orphan waits for it.
    cluster.set_class_rate(&slow, "0.002").await;
    support::eventually(
        "the slow orphan's replay to wait for its slot",
        TIMEOUT,
        || async {
            let page = sidecar.metrics()?;
            let queued = metric_sum(
                &parse_metrics(&page),
                CLASS_QUEUED_METRIC,
                &[("storage_class", slow.as_str())],
            );
            if queued >= 1.0 {
                Ok(())
            } else {
                Err(format!("{queued} calls of {slow} queued"))
            }
        },
    )
    .await;

    let fast_volume = pv_name(&cluster.claim("fast-data", &fast).await);
    driver.wait_holds(&fast_volume).await;
    cluster.delete_claim("fast-data").await;
    driver.clear_faults();
    support::eventually("the fast orphan to be deleted", TIMEOUT, || async {
        let left = driver.volumes();
        if left.iter().any(|volume| volume.name == fast_volume) {
            Err(format!("still on the driver: {left:?}"))
        } else {
            Ok(())
        }
    })
    .await;
    assert!(
        driver
            .volumes()
            .iter()
            .any(|volume| volume.name == slow_volume),
        "the slow orphan waits for its slot"
    );
    sidecar.assert_running();
}

/// `disable` set on a deleting claim: the finalizer goes at once, the claim with it, and the
/// journal still deletes the volume once the driver lets it.
#[tokio::test]
async fn disable_on_a_deleting_claim_lets_it_go_and_the_journal_still_deletes_the_volume() {
    let cluster = Cluster::new("journal-disable").await;
    let driver = Driver::start(&[
        "--delay",
        "CreateVolume=1s",
        "--fault",
        "CreateVolume=after:deadline-exceeded",
    ])
    .await;
    let mut sidecar = Sidecar::start_with(&driver, cluster.sidecar_options(&[], false));
    let class = cluster.class("journal", &driver, "Delete", &[]).await;
    let created = cluster.consistent_claim("data", &class, "enable").await;
    let volume = pv_name(&created);

    driver.wait_holds(&volume).await;
    cluster.delete_claim("data").await;
    cluster
        .wait_operation(&driver, &volume, "orphaned", |op| {
            op.phase == Phase::Orphaned
        })
        .await;
    let terminating = cluster
        .get_claim("data")
        .await
        .unwrap_or_else(|| panic!("PVC gone"));
    assert!(
        has_finalizer(&terminating),
        "{:?}",
        terminating.metadata.finalizers
    );

    cluster
        .patch_claim(
            "data",
            serde_json::json!({"metadata": {"annotations": {ANN_PROVISIONING_CONSISTENCY: "disable"}}}),
        )
        .await;
    cluster.wait_claim_gone("data").await;
    assert_eq!(driver.volume_count(), 1, "the faults still keep the volume");
    assert!(
        cluster
            .operations(&driver)
            .await
            .iter()
            .any(|op| op.volume_name == volume),
        "the journal still holds the operation"
    );

    driver.clear_faults();
    cluster.wait_nothing_left(&driver).await;
    cluster.wait_orphan_event(&volume).await;
    sidecar.assert_running();
}

/// Every finalizer removed by hand (a force delete) while a successful CreateVolume is in
/// flight: the PV is created for a claim that is gone, Released, and deleted with its volume.
#[tokio::test]
async fn a_force_deleted_claim_while_create_volume_succeeds_leaks_nothing() {
    let cluster = Cluster::new("journal-force").await;
    let driver = Driver::start(&["--delay", "CreateVolume=3s"]).await;
    let mut sidecar = Sidecar::start_with(&driver, cluster.sidecar_options(&[], false));
    let class = cluster.class("journal", &driver, "Delete", &[]).await;
    let created = cluster.consistent_claim("data", &class, "enable").await;
    let volume = pv_name(&created);

    driver.wait_create_received(&volume).await;
    cluster.delete_claim("data").await;
    cluster
        .patch_claim(
            "data",
            serde_json::json!({"metadata": {"finalizers": null}}),
        )
        .await;
    cluster.wait_claim_gone("data").await;

    cluster.wait_nothing_left(&driver).await;
    assert!(
        driver.calls("CreateVolume").iter().any(|c| c.code == "Ok")
            && driver.calls("DeleteVolume").iter().any(|c| c.code == "Ok"),
        "the volume was created and then deleted"
    );
    sidecar.assert_running();
}

/// The finalizer removed by hand while CreateVolume times out (volume created, answer lost):
/// the reaper finds the claim gone and deletes the volume.
#[tokio::test]
async fn the_finalizer_removed_by_hand_while_create_volume_times_out_leaks_nothing() {
    let cluster = Cluster::new("journal-unfinalized").await;
    let driver = Driver::start(&[
        "--delay",
        "CreateVolume=3s",
        "--fault",
        "CreateVolume=after:deadline-exceeded:1",
    ])
    .await;
    let mut sidecar = Sidecar::start_with(&driver, cluster.sidecar_options(&[], true));
    let class = cluster.class("journal", &driver, "Delete", &[]).await;
    let created = cluster.consistent_claim("data", &class, "enable").await;
    let volume = pv_name(&created);

    driver.wait_create_received(&volume).await;
    cluster
        .patch_claim(
            "data",
            serde_json::json!({"metadata": {"finalizers": null}}),
        )
        .await;
    cluster.delete_claim("data").await;
    cluster.wait_claim_gone("data").await;

    wait_orphan_deleted(&cluster, &driver, &mut sidecar, &volume).await;
    sidecar.assert_running();
}

/// `--provisioning-consistency-default enable`: claims without the annotation get the
/// finalizer; `disable` still opts a claim out.
#[tokio::test]
async fn the_consistency_default_applies_to_claims_without_the_annotation() {
    let cluster = Cluster::new("journal-default").await;
    let driver = Driver::start(&["--delay", "CreateVolume=2s"]).await;
    let mut sidecar = Sidecar::start_with(
        &driver,
        cluster.sidecar_options(&["--provisioning-consistency-default=enable"], false),
    );
    let class = cluster.class("journal", &driver, "Delete", &[]).await;
    let plain = cluster.claim("plain", &class).await;
    let opted_out = cluster
        .consistent_claim("opted-out", &class, "disable")
        .await;

    driver.wait_create_received(&pv_name(&plain)).await;
    let during = cluster
        .get_claim("plain")
        .await
        .unwrap_or_else(|| panic!("PVC gone"));
    assert!(has_finalizer(&during), "{:?}", during.metadata.finalizers);
    driver.wait_create_received(&pv_name(&opted_out)).await;
    let during = cluster
        .get_claim("opted-out")
        .await
        .unwrap_or_else(|| panic!("PVC gone"));
    assert!(!has_finalizer(&during), "{:?}", during.metadata.finalizers);

    for name in ["plain", "opted-out"] {
        wait_bound(&cluster.claims, name).await;
        support::eventually(
            &format!("{name} Bound without the finalizer"),
            TIMEOUT,
            || async {
                let pvc = cluster.get_claim(name).await.ok_or("PVC gone")?;
                if is_bound(&pvc) && !has_finalizer(&pvc) {
                    Ok(())
                } else {
                    Err(format!("finalizers {:?}", pvc.metadata.finalizers))
                }
            },
        )
        .await;
    }
    sidecar.assert_running();
}

// ------------------------------------------------------------------------------ compatibility

/// A volume created on the driver for a claim that does not exist, and its record as the first
/// journal format minimally wrote it (no formatVersion, phase, attempts, error or since), in a
/// shard of its own (`<driver>-5`) that an admin (or an older build) made by hand. Returns the
/// volume's name and its id on the driver.
async fn hand_made_orphan(cluster: &Cluster, driver: &Driver) -> (String, String) {
    let volume = format!("pvc-{}", uuid::Uuid::new_v4());
    let claim_uid = uuid::Uuid::new_v4().to_string();
    let request = csi::CreateVolumeRequest {
        name: volume.clone(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: 1 << 30,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![csi::VolumeCapability {
            access_type: Some(AccessType::Mount(MountVolume::default())),
            access_mode: Some(AccessMode {
                mode: Mode::SingleNodeWriter as i32,
            }),
        }],
        ..Default::default()
    };
    let backend_volume = create_on_driver(driver, request.clone()).await;

    let base = csi_provisioner::leader::lease_name(driver.name());
    // Recovery reads every shard; any of them may hold the record.
    let shard = format!("{base}-5");
    let resource = ApiResource::erase::<ProvisioningJournal>(&());
    let object = serde_json::json!({
        "apiVersion": ProvisioningJournal::api_version(&()),
        "kind": ProvisioningJournal::kind(&()),
        "metadata": {"name": shard, "labels": {DRIVER_LABEL: base}},
        "spec": {
            "driver": driver.name(),
            "operations": [{
                "volumeName": volume,
                "claim": format!("{}/gone", cluster.ns()),
                "claimUid": claim_uid,
                "storageClass": "no-such-class",
                "request": STANDARD.encode(request.encode_to_vec()),
            }],
        },
    });
    let object: DynamicObject =
        serde_json::from_value(object).unwrap_or_else(|e| panic!("a DynamicObject: {e}"));
    Api::<DynamicObject>::namespaced_with(cluster.client.clone(), cluster.ns(), &resource)
        .create(&PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("creating journal shard {shard}: {e}"));
    (volume, backend_volume.volume_id)
}

/// Waits until the hand-made orphan is gone: its volume deleted, with the event naming its id.
async fn wait_hand_made_orphan_deleted(
    cluster: &Cluster,
    driver: &Driver,
    sidecar: &mut Sidecar,
    (volume, volume_id): &(String, String),
) {
    cluster.wait_nothing_left(driver).await;
    let event = cluster.wait_orphan_event(volume).await;
    assert!(
        event
            .message
            .as_deref()
            .is_some_and(|m| m.contains(volume_id)),
        "{event:?}"
    );
    assert_eq!(orphans_deleted_metric(sidecar).await, 1.0);
    sidecar.assert_running();
}

/// A record of the first format, for a claim that does not exist and a volume that does: a
/// sidecar started on it deletes the volume and the record.
#[tokio::test]
async fn a_record_of_the_first_format_is_recovered_at_start() {
    let cluster = Cluster::new("journal-format1").await;
    let driver = Driver::start(&[]).await;
    let orphan = hand_made_orphan(&cluster, &driver).await;
    let stored = cluster.operations(&driver).await;
    assert_eq!(
        stored.len(),
        1,
        "the hand-made record is read back: {stored:?}"
    );

    let mut sidecar = Sidecar::start_with(&driver, cluster.sidecar_options(&[], true));
    wait_hand_made_orphan_deleted(&cluster, &driver, &mut sidecar, &orphan).await;
}

/// Every sidecar in a cluster sees every claim. The sidecar of another driver, whose default
/// is `disable` and which has none of the claim's operations, must leave the finalizer alone,
/// both while the claim is provisioned and while its orphan waits for deletion.
#[tokio::test]
async fn another_drivers_sidecar_leaves_the_finalizer_alone() {
    let cluster = Cluster::new("journal-two-drivers").await;
    let driver = Driver::start(&[
        "--delay",
        "CreateVolume=1s",
        "--fault",
        "CreateVolume=after:deadline-exceeded",
    ])
    .await;
    let other = Driver::start(&[]).await;
    let mut sidecar = Sidecar::start_with(
        &driver,
        cluster.sidecar_options(&["--provisioning-consistency-default=enable"], false),
    );
    let mut bystander = Sidecar::start_with(&other, cluster.sidecar_options(&[], false));
    let class = cluster.class("journal", &driver, "Delete", &[]).await;
    let created = cluster.claim("data", &class).await;
    let volume = pv_name(&created);
    // The bystander decides from its cache that the claim is not its to touch; it logs each
    // such decision (and never queues a reconcile for it).
    let triaged = format!("nothing to do claim={}/data", cluster.ns());
    let bystander_triages = |bystander: &Sidecar| bystander.log().matches(&triaged).count();

    driver.wait_holds(&volume).await;
    cluster
        .wait_operation(&driver, &volume, "with a failed attempt", |op| {
            op.attempts >= 1
        })
        .await;
    // It starts beside the other sidecar and may not have listed yet.
    let seen = support::eventually(
        "the other driver's sidecar to have seen the claim",
        TIMEOUT,
        || async {
            match bystander_triages(&bystander) {
                0 => Err("no triage logged yet".to_owned()),
                seen => Ok(seen),
            }
        },
    )
    .await;
    let pending = cluster
        .get_claim("data")
        .await
        .unwrap_or_else(|| panic!("PVC gone"));
    assert!(has_finalizer(&pending), "{:?}", pending.metadata.finalizers);

    cluster.delete_claim("data").await;
    cluster
        .wait_operation(&driver, &volume, "orphaned", |op| {
            op.phase == Phase::Orphaned
        })
        .await;
    support::eventually(
        "the other driver's sidecar to look at the deleting claim",
        TIMEOUT,
        || async {
            let now = bystander_triages(&bystander);
            if now > seen {
                Ok(())
            } else {
                Err(format!("{now} looks"))
            }
        },
    )
    .await;
    let terminating = cluster
        .get_claim("data")
        .await
        .unwrap_or_else(|| panic!("the claim went while its volume still exists"));
    assert!(
        has_finalizer(&terminating),
        "{:?}",
        terminating.metadata.finalizers
    );

    driver.clear_faults();
    cluster.wait_claim_gone("data").await;
    cluster.wait_nothing_left(&driver).await;
    sidecar.assert_running();
    bystander.assert_running();
}

/// The sidecar died after the PV was saved but before the record's removal was written (the
/// journal writes removals lazily). Recovery finds the PV and drops the record; the bound
/// claim keeps its volume.
#[tokio::test]
async fn a_record_whose_removal_was_lost_is_dropped_once_its_pv_exists() {
    let cluster = Cluster::new("journal-lost-removal").await;
    let driver = Driver::start(&[]).await;
    let mut sidecar = Sidecar::start_with(&driver, cluster.sidecar_options(&[], false));
    let class = cluster.class("journal", &driver, "Delete", &[]).await;
    let created = cluster.claim("data", &class).await;
    let volume = pv_name(&created);
    wait_bound(&cluster.claims, "data").await;
    sidecar.kill().await;

    // Only the name matters here: the PV is found before anything would be replayed.
    let request = csi::CreateVolumeRequest {
        name: volume.clone(),
        ..Default::default()
    };
    put_back(
        &cluster,
        &driver,
        OperationRecord {
            format_version: 1,
            volume_name: volume.clone(),
            claim: format!("{}/data", cluster.ns()),
            claim_uid: created.metadata.uid.clone().unwrap_or_default(),
            storage_class: class.clone(),
            request: STANDARD.encode(request.encode_to_vec()),
            ..OperationRecord::default()
        },
    )
    .await;

    sidecar.restart().await;
    cluster.wait_nothing_in_journal(&driver).await;
    let pvc = cluster
        .get_claim("data")
        .await
        .unwrap_or_else(|| panic!("PVC gone"));
    assert!(is_bound(&pvc), "the claim stays Bound");
    assert_eq!(driver.volume_count(), 1, "the volume stays");
    assert!(
        cluster.journal_events(ORPHAN_DELETED).await.is_empty(),
        "nothing was treated as an orphan"
    );
    sidecar.assert_running();
}

// ------------------------------------------------------------------------------ answers that prove nothing

/// Deletes StorageClass `class` (made by `cluster.class("journal", …)`), waits until it is gone,
/// and creates it again with `parameters`.
async fn recreate_class(
    cluster: &Cluster,
    driver: &Driver,
    class: &str,
    parameters: &[(&str, &str)],
) {
    let classes: Api<StorageClass> = Api::all(cluster.client.clone());
    classes
        .delete(class, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("deleting class {class}: {e}"));
    support::eventually("the class to be gone", TIMEOUT, || async {
        match classes.get_opt(class).await {
            Ok(None) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let again = cluster.class("journal", driver, "Delete", parameters).await;
    assert_eq!(again, class, "the class is created again under its name");
}

/// Waits until the driver has answered CreateVolume at least `count` times (with `code`, if
/// given).
async fn wait_create_answered(driver: &Driver, code: Option<&str>, count: usize) {
    support::eventually(
        &format!("{count} CreateVolume calls answered {code:?}"),
        TIMEOUT,
        || async {
            let calls = driver.calls("CreateVolume");
            let answered = calls
                .iter()
                .filter(|call| code.is_none_or(|code| call.code == code))
                .count();
            if answered >= count {
                Ok(())
            } else {
                Err(format!("{answered} so far, of {} calls", calls.len()))
            }
        },
    )
    .await;
}

/// A final error after an attempt whose answer was lost proves nothing: the first attempt
/// created the volume. The operation stays until the volume is deleted, however the claim ends.
#[tokio::test]
async fn a_final_error_after_a_timeout_leaves_the_operation_until_the_volume_is_deleted() {
    let cluster = Cluster::new("journal-final-after-timeout").await;
    let driver = Driver::start(&["--fault", "CreateVolume=after:deadline-exceeded"]).await;
    let mut sidecar = Sidecar::start_with(&driver, cluster.sidecar_options(&[], true));
    let class = cluster.class("journal", &driver, "Delete", &[]).await;
    let created = cluster.claim("data", &class).await;
    let volume = pv_name(&created);

    driver.wait_holds(&volume).await;
    cluster
        .wait_operation(&driver, &volume, "with a lost answer", |op| {
            op.attempts >= 1
        })
        .await;
    driver.set_faults("fault CreateVolume=before:internal\n");
    wait_create_answered(&driver, Some("Internal"), 2).await;
    cluster
        .wait_operation(&driver, &volume, "kept, with the final error", |op| {
            op.last_error
                .as_deref()
                .is_some_and(|e| e.contains("Internal"))
        })
        .await;

    cluster.delete_claim("data").await;
    cluster.wait_claim_gone("data").await;
    driver.clear_faults();
    wait_orphan_deleted(&cluster, &driver, &mut sidecar, &volume).await;
    sidecar.assert_running();
}

/// A StorageClass deleted and re-created with other parameters while CreateVolume is in flight:
/// every retry sends the request recorded first, so the volume the first attempt created is the
/// one the claim gets (a new plan would be answered ALREADY_EXISTS for ever).
#[tokio::test]
async fn a_class_recreated_mid_flight_does_not_change_the_recorded_request() {
    let cluster = Cluster::new("journal-class-recreated").await;
    let driver = Driver::start(&["--fault", "CreateVolume=after:deadline-exceeded"]).await;
    let _sidecar = Sidecar::start_with(&driver, cluster.sidecar_options(&[], false));
    let class = cluster
        .class("journal", &driver, "Delete", &[("tier", "silver")])
        .await;
    let created = cluster.claim("data", &class).await;
    let volume = pv_name(&created);
    driver.wait_holds(&volume).await;

    recreate_class(&cluster, &driver, &class, &[("tier", "gold")]).await;
    // Let the sidecar retry under the new class a few times before the driver answers again.
    let seen = driver.calls("CreateVolume").len();
    wait_create_answered(&driver, None, seen + 3).await;
    driver.clear_faults();

    let bound = wait_bound(&cluster.claims, "data").await;
    assert_eq!(pv_name(&bound), volume);
    let requests = driver.requests("CreateVolume");
    assert!(
        requests.iter().all(|r| !r.contains("gold")),
        "no CreateVolume carried the new class's parameters: {requests:#?}"
    );
    assert_eq!(driver.volume_count(), 1);
}

/// A class re-created naming a Secret that does not exist while a claim's operation is
/// recorded and its volume exists: the retries send the recorded request with the recorded
/// secret, and the claim is Bound. The code before read the class's Secret first: every attempt
/// failed on it, no CreateVolume was sent again, and the claim stayed Pending for ever.
#[tokio::test]
async fn a_class_recreated_with_a_missing_secret_does_not_block_the_recorded_request() {
    let cluster = Cluster::new("journal-class-secret").await;
    let driver = Driver::start(&["--fault", "CreateVolume=after:deadline-exceeded"]).await;
    let _sidecar = Sidecar::start_with(&driver, cluster.sidecar_options(&[], false));
    let ns = cluster.ns().to_owned();
    let secret = |name: &'static str| {
        [
            ("csi.storage.k8s.io/provisioner-secret-name", name),
            (
                "csi.storage.k8s.io/provisioner-secret-namespace",
                ns.as_str(),
            ),
        ]
    };
    cluster
        .create_secret("creds", &[("password", "not-logged")])
        .await;
    let class = cluster
        .class("journal", &driver, "Delete", &secret("creds"))
        .await;
    let created = cluster.claim("data", &class).await;
    let volume = pv_name(&created);
    driver.wait_holds(&volume).await;

    recreate_class(&cluster, &driver, &class, &secret("missing")).await;
    // The retries under the re-created class still reach the driver.
    let seen = driver.calls("CreateVolume").len();
    wait_create_answered(&driver, None, seen + 2).await;
    driver.clear_faults();

    let bound = wait_bound(&cluster.claims, "data").await;
    assert_eq!(pv_name(&bound), volume);
    assert_eq!(driver.volume_count(), 1);
}

// ------------------------------------------------------------------------------ stale records, exits

/// With reclaim policy Retain an admin may delete the PV and reuse its volume in a static PV of
/// another name. A stale record of the first claim (a removal lost, or a downgrade and
/// re-upgrade) must not delete that volume when it is replayed.
#[tokio::test]
async fn a_stale_record_never_deletes_a_volume_that_a_pv_of_another_name_references() {
    let cluster = Cluster::new("journal-stale-record").await;
    let driver = Driver::start(&["--fault", "CreateVolume=after:deadline-exceeded"]).await;
    let mut sidecar = Sidecar::start_with(&driver, cluster.sidecar_options(&[], false));
    let class = cluster.class("retain", &driver, "Retain", &[]).await;
    let created = cluster.claim("data", &class).await;
    let volume = pv_name(&created);
    let record = cluster
        .wait_operation(&driver, &volume, "recorded", |_| true)
        .await;
    driver.clear_faults();
    wait_bound(&cluster.claims, "data").await;
    // The sidecar takes its finalizer off a Retain PV once it sees it; killed before that, it
    // would leave the PV undeletable until it runs again.
    cluster.wait_pv_finalizer_gone(&volume).await;
    sidecar.kill().await;

    // The admin: the claim goes, the retained PV goes, its volume comes back as a static PV.
    let provisioned = cluster.pv(&volume).await;
    cluster.delete_claim("data").await;
    cluster.wait_claim_gone("data").await;
    cluster
        .volumes
        .delete(&volume, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("deleting PV {volume}: {e}"));
    cluster.wait_pv_gone(&volume).await;
    let static_name = format!("static-{}", cluster.ns());
    let mut reused = provisioned.clone();
    reused.metadata = ObjectMeta {
        name: Some(static_name.clone()),
        ..ObjectMeta::default()
    };
    reused.status = None;
    if let Some(spec) = reused.spec.as_mut() {
        spec.claim_ref = None;
    }
    cluster
        .volumes
        .create(&PostParams::default(), &reused)
        .await
        .unwrap_or_else(|e| panic!("creating the static PV: {e}"));

    put_back(&cluster, &driver, record).await;
    sidecar.restart().await;
    cluster.wait_nothing_in_journal(&driver).await;
    assert_eq!(driver.volume_count(), 1, "the reused volume is still there");
    assert!(
        driver.calls("DeleteVolume").is_empty(),
        "no DeleteVolume was sent: {:?}",
        driver.calls("DeleteVolume")
    );
    sidecar.assert_running();
    cluster
        .volumes
        .delete(&static_name, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("deleting the static PV: {e}"));
}

/// A graceful exit writes the removals the journal still holds, so the next leader has no
/// finished operation to replay.
#[tokio::test]
async fn a_graceful_exit_writes_the_removals_it_still_holds() {
    let cluster = Cluster::new("journal-flush").await;
    let driver = Driver::start(&[]).await;
    let mut sidecar = Sidecar::start_with(&driver, cluster.sidecar_options(&[], false));
    let class = cluster.class("journal", &driver, "Delete", &[]).await;
    let created = cluster.claim("data", &class).await;
    cluster
        .wait_operation(&driver, &pv_name(&created), "recorded", |_| true)
        .await;
    wait_bound(&cluster.claims, "data").await;
    sidecar.signal(Signal::SIGTERM);
    let status = sidecar.wait_exit(TIMEOUT).await;
    assert!(status.success(), "{}", support::peers::describe(status));
    let left = cluster.operations(&driver).await;
    assert!(left.is_empty(), "operations left after exit: {left:?}");
}

/// A claim whose provisioner secret lives in its own namespace is deleted with that namespace
/// while its volume may exist. The secret goes, so the orphan cannot be replayed, and the
/// consistency finalizer must not keep the namespace for ever: it comes off, and the orphan
/// waits, recorded in the sidecar's own namespace, until the secret can be read again.
#[tokio::test]
async fn a_namespace_deleted_with_the_secret_of_an_orphan_is_not_kept() {
    let cluster = Cluster::new("journal-secret-ns").await;
    let app = Cluster::new("journal-app").await;
    let driver = Driver::start(&["--fault", "CreateVolume=after:deadline-exceeded"]).await;
    let mut sidecar = Sidecar::start_with(&driver, cluster.sidecar_options(&[], true));
    let secret_in_claim_namespace = [
        ("csi.storage.k8s.io/provisioner-secret-name", "creds"),
        (
            "csi.storage.k8s.io/provisioner-secret-namespace",
            "${pvc.namespace}",
        ),
    ];
    let class = cluster
        .class("secret", &driver, "Delete", &secret_in_claim_namespace)
        .await;
    app.create_secret("creds", &[("password", "not-logged")])
        .await;
    let created = app.consistent_claim("data", &class, "enable").await;
    let volume = pv_name(&created);
    driver.wait_holds(&volume).await;
    cluster
        .wait_operation(&driver, &volume, "with a lost answer", |op| {
            op.attempts >= 1
        })
        .await;

    let namespaces: Api<Namespace> = Api::all(cluster.client.clone());
    namespaces
        .delete(app.ns(), &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("deleting namespace {}: {e}", app.ns()));
    // kube-controller-manager's namespace controller deletes every kind the API server serves,
    // one list and delete after another: on a loaded machine that takes longer than one claim.
    support::eventually("the claim's namespace to be gone", 3 * TIMEOUT, || async {
        match namespaces.get_opt(app.ns()).await {
            Ok(None) => Ok(()),
            other => Err(format!("{:?}", other.map(|ns| ns.map(|ns| ns.status)))),
        }
    })
    .await;
    cluster
        .wait_operation(&driver, &volume, "orphaned, waiting for its secret", |op| {
            op.phase == Phase::Orphaned
                && op
                    .last_error
                    .as_deref()
                    .is_some_and(|e| e.contains("creds"))
        })
        .await;
    assert_eq!(driver.volume_count(), 1, "the volume waits for its secret");
    let waiting = cluster
        .wait_journal_event(ORPHAN_WAITING_FOR_SECRET, &volume)
        .await;
    let message = waiting.message.unwrap_or_default();
    assert_eq!(waiting.type_.as_deref(), Some("Warning"), "{message}");
    assert_eq!(
        waiting.involved_object.kind.as_deref(),
        Some("ProvisioningJournal")
    );
    for named in [
        format!("claim {}/data", app.ns()),
        format!("provisioner secret {}/creds", app.ns()),
    ] {
        assert!(message.contains(&named), "{named:?} not in {message:?}");
    }
    assert!(
        !message.contains("not-logged"),
        "secret data in {message:?}"
    );
    wait_waiting_for_secret(&mut sidecar, 1.0).await;

    // An admin gives the secret back: the orphan is deleted.
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(app.ns().to_owned()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    namespaces
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap_or_else(|e| panic!("re-creating namespace {}: {e}", app.ns()));
    app.create_secret("creds", &[("password", "not-logged")])
        .await;
    driver.clear_faults();
    wait_orphan_deleted(&cluster, &driver, &mut sidecar, &volume).await;
    wait_waiting_for_secret(&mut sidecar, 0.0).await;
}

/// Waits until the gauge of orphans waiting for their secret shows `value`.
async fn wait_waiting_for_secret(sidecar: &mut Sidecar, value: f64) {
    sidecar.wait_metrics().await;
    support::eventually(
        &format!("{WAITING_FOR_SECRET_METRIC} to be {value}"),
        TIMEOUT,
        || async {
            let page = sidecar.metrics()?;
            let seen = metric_sum(&parse_metrics(&page), WAITING_FOR_SECRET_METRIC, &[]);
            if seen == value {
                Ok(())
            } else {
                Err(format!("{seen}"))
            }
        },
    )
    .await;
}

// ------------------------------------------------------------------------------ name collisions

/// The volume name of a claim with `--volume-name-uuid-length=1`: `pvc-` and the first hex
/// digit of its UID, so 17 claims share at least one name (16 digits).
fn short_volume_name(pvc: &PersistentVolumeClaim) -> String {
    let uid = pvc.metadata.uid.as_deref().unwrap_or_default();
    let first = uid.chars().find(|c| *c != '-').unwrap_or_default();
    format!("pvc-{first}")
}

fn claim_name(pvc: &PersistentVolumeClaim) -> String {
    pvc.metadata.name.clone().unwrap_or_default()
}

/// Claims whose volume names collide (a short `--volume-name-uuid-length`) never share a volume
/// or a journal record: per name one claim is Bound, the others stay Pending with a warning
/// event naming the collision, and no DeleteVolume touches a volume a PV references (the old
/// code deleted the first claim's live volume when the second one's PV create met its PV).
#[tokio::test]
async fn claims_whose_volume_names_collide_never_share_a_volume() {
    const CLAIMS: usize = 17;
    let cluster = Cluster::new("journal-collide").await;
    let driver = Driver::start(&[]).await;
    let sidecar = Sidecar::start_with(
        &driver,
        cluster.sidecar_options(&["--volume-name-uuid-length=1"], false),
    );
    let class = cluster.class("collide", &driver, "Delete", &[]).await;
    let names = cluster.claims_named("c", &class, CLAIMS).await;
    let mut by_volume: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut uid_of: BTreeMap<String, String> = BTreeMap::new();
    for name in &names {
        let pvc = cluster
            .get_claim(name)
            .await
            .unwrap_or_else(|| panic!("claim {name} vanished"));
        by_volume
            .entry(short_volume_name(&pvc))
            .or_default()
            .push(name.clone());
        uid_of.insert(
            pvc.metadata.uid.clone().unwrap_or_default(),
            short_volume_name(&pvc),
        );
    }
    assert!(
        by_volume.values().any(|claims| claims.len() > 1),
        "17 claims and 16 names: some collide ({by_volume:?})"
    );

    // Settled: per volume name one claim Bound to the PV of that name, every other claim of
    // that name Pending with a warning that names the volume and the claim holding it.
    let winners: BTreeMap<String, String> =
        support::eventually("every volume name to settle", TIMEOUT, || async {
            assert_no_shared_record(&cluster, &driver, &uid_of).await;
            let claims = cluster
                .claims
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?
                .items;
            let mut winners = BTreeMap::new();
            for (volume, group) in &by_volume {
                let bound: Vec<&PersistentVolumeClaim> = claims
                    .iter()
                    .filter(|pvc| group.contains(&claim_name(pvc)) && is_bound(pvc))
                    .collect();
                let [winner] = bound.as_slice() else {
                    return Err(format!("{volume}: bound {} of {group:?}", bound.len()));
                };
                let bound_to = winner.spec.as_ref().and_then(|s| s.volume_name.as_deref());
                assert_eq!(bound_to, Some(volume.as_str()), "{}", claim_name(winner));
                winners.insert(volume.clone(), claim_name(winner));
            }
            for (volume, group) in &by_volume {
                let holder = format!("{}/{}", cluster.ns(), winners[volume]);
                for loser in group.iter().filter(|c| **c != winners[volume]) {
                    let events = events_of(&cluster.client, cluster.ns(), loser).await?;
                    let named = events.iter().any(|e| {
                        e.type_.as_deref() == Some("Warning")
                            && e.reason.as_deref() == Some("ProvisioningFailed")
                            && e.message.as_deref().is_some_and(|m| {
                                m.contains(volume.as_str()) && names_claim(m, &holder)
                            })
                    });
                    if !named {
                        return Err(format!("{loser}: {}", summarize(&events)));
                    }
                }
            }
            Ok(winners)
        })
        .await;

    // The losers are retried and stay Pending; nothing is deleted meanwhile. The retries are
    // counted in the sidecar's log: their repeated events wait for the rate limit's spare
    // capacity (docs/flags.md, "Events are written asynchronously").
    let failures = || async {
        let log = sidecar.log();
        let mut total = 0;
        for (volume, group) in &by_volume {
            for loser in group.iter().filter(|c| **c != winners[volume]) {
                let marker = format!("provisioning failed claim={}/{loser} ", cluster.ns());
                total += log.lines().filter(|line| line.contains(&marker)).count();
            }
        }
        i32::try_from(total).unwrap_or(i32::MAX)
    };
    for (volume, group) in &by_volume {
        for loser in group.iter().filter(|c| **c != winners[volume]) {
            let events = events_of(&cluster.client, cluster.ns(), loser).await;
            eprintln!(
                "{loser} ({volume}): {}",
                summarize(&events.unwrap_or_default())
            );
        }
    }
    let losers = CLAIMS - by_volume.len();
    let before = failures().await;
    support::eventually("every loser to be retried", TIMEOUT, || async {
        assert_no_shared_record(&cluster, &driver, &uid_of).await;
        let now = failures().await;
        if now >= before + i32::try_from(losers).unwrap_or(i32::MAX) {
            Ok(())
        } else {
            Err(format!("{now} failures, {before} before"))
        }
    })
    .await;
    for (volume, group) in &by_volume {
        for loser in group.iter().filter(|c| **c != winners[volume]) {
            let pvc = cluster.get_claim(loser).await;
            assert!(
                pvc.as_ref().is_some_and(|pvc| !is_bound(pvc)
                    && pvc
                        .spec
                        .as_ref()
                        .and_then(|s| s.volume_name.as_ref())
                        .is_none()),
                "{loser} stays Pending: {:?}",
                pvc.and_then(|pvc| pvc.status)
            );
        }
    }
    let pvs = driver_pvs(&cluster.client, &driver)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(pvs.len(), by_volume.len(), "one PV per volume name");
    let volumes = driver.volumes();
    let deletes = driver.requests("DeleteVolume");
    for pv in &pvs {
        let handle = pv
            .spec
            .as_ref()
            .and_then(|s| s.csi.as_ref())
            .map(|csi| csi.volume_handle.clone())
            .unwrap_or_default();
        assert!(
            volumes.iter().any(|v| v.id == handle),
            "the volume {handle} of PV {:?} still exists on the driver: {volumes:?}",
            pv.metadata.name
        );
        assert!(
            !deletes.iter().any(|line| line.contains(&handle)),
            "DeleteVolume for {handle}, which PV {:?} references: {deletes:?}",
            pv.metadata.name
        );
    }
    assert_eq!(
        volumes.len(),
        by_volume.len(),
        "no volume beyond one per name"
    );
    // A loser whose CreateVolume reached the driver (its name's record was removed and the PV
    // not yet in its cache) got the winner's volume back and met the winner's PV: safe above.
    let creates = driver.requests("CreateVolume");
    let repeated: Vec<&String> = by_volume
        .keys()
        .filter(|volume| {
            let needle = format!("name: \"{volume}\"");
            creates.iter().filter(|line| line.contains(&needle)).count() > 1
        })
        .collect();
    eprintln!("volume names sent to the driver more than once: {repeated:?}");
    cluster.wait_nothing_in_journal(&driver).await;

    // Deleting every claim leaves nothing behind.
    for name in &names {
        cluster.delete_claim(name).await;
    }
    cluster.wait_nothing_left(&driver).await;
}

// ------------------------------------------------------------------------------ shards touched by others

/// `kubectl delete provisioningjournals --all` while operations are in flight: each shard is
/// written again whole from memory at once, so a sidecar killed right after still finds every
/// operation: the volumes of the claims deleted meanwhile are deleted, the others bound.
#[tokio::test]
async fn deleting_every_shard_under_load_loses_no_operation() {
    let cluster = Cluster::new("journal-shards-deleted").await;
    let driver = Driver::start(&["--fault", "CreateVolume=after:deadline-exceeded"]).await;
    let mut sidecar = Sidecar::start_with(&driver, cluster.sidecar_options(&[], false));
    let class = cluster.class("journal", &driver, "Delete", &[]).await;
    let mut volumes = Vec::new();
    for index in 0..6 {
        let created = cluster.claim(&format!("data-{index}"), &class).await;
        volumes.push(pv_name(&created));
    }
    for volume in &volumes {
        driver.wait_holds(volume).await;
        cluster
            .wait_operation(&driver, volume, "with a lost answer", |op| op.attempts >= 1)
            .await;
    }

    let shards: Api<ProvisioningJournal> = Api::namespaced(cluster.client.clone(), cluster.ns());
    // Twice: a shard written again is deleted again, the second time under a new process
    // (once it has loaded the journal: before, the shards were the only copy).
    for round in 0..2 {
        if round == 1 {
            sidecar.kill().await;
            sidecar.restart().await;
            support::eventually("the journal to be loaded", TIMEOUT, || async {
                if sidecar.has_loaded_journal() {
                    Ok(())
                } else {
                    Err("not yet".to_owned())
                }
            })
            .await;
        }
        shards
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await
            .unwrap_or_else(|e| panic!("deleting every journal shard: {e}"));
        support::eventually("every operation to be stored again", TIMEOUT, || async {
            let stored = journal_operations(&cluster.client, cluster.ns(), &driver).await?;
            let missing: Vec<&String> = volumes
                .iter()
                .filter(|volume| !stored.iter().any(|op| &op.volume_name == *volume))
                .collect();
            if missing.is_empty() {
                Ok(())
            } else {
                Err(format!("not in the journal: {missing:?}"))
            }
        })
        .await;
    }

    // Only what is stored survives a SIGKILL.
    for index in 0..3 {
        cluster.delete_claim(&format!("data-{index}")).await;
        cluster.wait_claim_gone(&format!("data-{index}")).await;
    }
    sidecar.kill().await;
    driver.clear_faults();
    sidecar.restart().await;
    for (index, volume) in volumes.iter().enumerate().skip(3) {
        let bound = wait_bound(&cluster.claims, &format!("data-{index}")).await;
        assert_eq!(&pv_name(&bound), volume);
    }
    cluster.wait_nothing_in_journal(&driver).await;
    let mut left: Vec<String> = driver.volumes().into_iter().map(|v| v.name).collect();
    left.sort();
    let mut bound = volumes[3..].to_vec();
    bound.sort();
    assert_eq!(
        left, bound,
        "the deleted claims' volumes are deleted, the others kept"
    );
    sidecar.assert_running();
}

/// An operation recorded by someone else while the sidecar runs (an admin, or a previous
/// leader that wrote once more before it stopped) is taken in without a restart: here an
/// orphan whose claim does not exist, whose volume the running sidecar deletes.
#[tokio::test]
async fn an_operation_written_by_someone_else_is_taken_in_without_a_restart() {
    let cluster = Cluster::new("journal-adopt").await;
    let driver = Driver::start(&[]).await;
    let mut sidecar = Sidecar::start_with(&driver, cluster.sidecar_options(&[], true));
    // A claim seen through end to end: the journal was loaded before the record is made.
    let class = cluster.class("journal", &driver, "Delete", &[]).await;
    cluster.claim("data", &class).await;
    wait_bound(&cluster.claims, "data").await;
    cluster.delete_claim("data").await;
    cluster.wait_nothing_left(&driver).await;

    let orphan = hand_made_orphan(&cluster, &driver).await;
    wait_hand_made_orphan_deleted(&cluster, &driver, &mut sidecar, &orphan).await;
}

/// Whether `message` names `claim <namespace>/<name>` (not a longer name that starts alike).
fn names_claim(message: &str, claim: &str) -> bool {
    let needle = format!("claim {claim}");
    message.match_indices(&needle).any(|(at, _)| {
        message[at + needle.len()..]
            .chars()
            .next()
            .is_none_or(|c| !c.is_ascii_alphanumeric() && c != '-')
    })
}

/// Fails the test if two claims share a journal record: every record's volume name is its
/// own claim's, and no name is recorded twice.
async fn assert_no_shared_record(
    cluster: &Cluster,
    driver: &Driver,
    volume_of_uid: &BTreeMap<String, String>,
) {
    let operations = cluster.operations(driver).await;
    let mut seen = BTreeMap::new();
    for op in &operations {
        assert_eq!(
            volume_of_uid.get(&op.claim_uid),
            Some(&op.volume_name),
            "a record for a name that is not its claim's: {operations:?}"
        );
        assert!(
            seen.insert(op.volume_name.clone(), op.claim_uid.clone())
                .is_none(),
            "{} recorded twice: {operations:?}",
            op.volume_name
        );
    }
}
