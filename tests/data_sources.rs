//! Clones and snapshot restores on the real control plane, with the real snapshot machinery
//! (snapshot-controller and csi-snapshotter of external-snapshotter v8.7.0, support::snapshots)
//! and the reference driver: the content source the driver is asked for, the protection
//! finalizers upstream puts on the source and when they come off, the journal's promise when a
//! clone or a restore is interrupted (claim deleted, sidecar SIGKILLed, source deleted), and
//! every bad input as an event with nothing created.

use csi_test_support as support;

use csi_provisioner::api::VolumeSnapshotContent;
use csi_provisioner::provision::{CLONE_PROTECTION_FINALIZER, SNAPSHOT_PROTECTION_FINALIZER};
use csi_reference_driver::ContentSource;
use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim, TypedLocalObjectReference};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;

use support::cluster::{
    Cluster, claim, create_claim, journal_operations, pv_name, wait_bound, wait_event,
};
use support::peers::{Driver, Sidecar, SidecarOptions, TIMEOUT, metric_sum, parse_metrics};
use support::snapshots::Snapshotter;

const SNAPSHOT_GROUP: &str = "snapshot.storage.k8s.io";
const FAILED: &str = "ProvisioningFailed";

/// Journal in the test namespace, fast retries, a sweep every second.
fn options(cluster: &Cluster, extra: &[&str]) -> SidecarOptions {
    let mut args = vec![
        format!("--leader-election-namespace={}", cluster.ns()),
        "--retry-interval-start=200ms".to_owned(),
        "--retry-interval-max=2s".to_owned(),
        "--snapshot-orphan-sweep-interval=1s".to_owned(),
    ];
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    SidecarOptions {
        args,
        ..SidecarOptions::default()
    }
}

/// A claim of `size` whose content comes from `kind` `name` (`group` for snapshots).
fn claim_from(
    name: &str,
    class: &str,
    size: &str,
    volume_mode: Option<&str>,
    (group, kind, source): (Option<&str>, &str, &str),
) -> PersistentVolumeClaim {
    let mut pvc = claim(name, class, size, volume_mode);
    if let Some(spec) = pvc.spec.as_mut() {
        spec.data_source = Some(TypedLocalObjectReference {
            api_group: group.map(str::to_owned),
            kind: kind.to_owned(),
            name: source.to_owned(),
        });
    }
    pvc
}

fn clone_of(source: &str) -> (Option<&str>, &str, &str) {
    (None, "PersistentVolumeClaim", source)
}

fn restore_of(snapshot: &str) -> (Option<&'static str>, &'static str, &str) {
    (Some(SNAPSHOT_GROUP), "VolumeSnapshot", snapshot)
}

/// The driver's content source of the volume behind a claim's PV.
fn source_of(driver: &Driver, volume_name: &str) -> Option<ContentSource> {
    driver
        .volumes()
        .into_iter()
        .find(|v| v.name == volume_name)
        .and_then(|v| v.source)
}

/// The volume handle of a bound claim.
async fn handle_of(cluster: &Cluster, name: &str) -> String {
    let pvc = wait_bound(&cluster.claims, name).await;
    cluster
        .pv(&pv_name(&pvc))
        .await
        .spec
        .and_then(|spec| spec.csi)
        .map(|csi| csi.volume_handle)
        .unwrap_or_default()
}

fn has_finalizer(finalizers: Option<&Vec<String>>, finalizer: &str) -> bool {
    finalizers.is_some_and(|f| f.iter().any(|f| f == finalizer))
}

/// Data-source helpers on top of the shared cluster helpers (a trait: `Cluster` is
/// csi-test-support's).
trait DataSourceCluster {
    /// Waits until the snapshot `name` carries (`present`) or lacks the restore finalizer.
    async fn wait_snapshot_protected(&self, name: &str, present: bool);

    /// A bound 1Gi source claim `src` and the driver volume's handle.
    async fn bound_source(&self, class: &str, volume_mode: Option<&str>) -> String;

    /// Deletes a VolumeSnapshot and waits until it is gone.
    async fn delete_snapshot_and_wait(&self, name: &str, content: &str);

    /// Waits for a ProvisioningFailed event on `claim` whose message contains `text`, and
    /// checks that no PV was created for it.
    async fn wait_refused(&self, claim: &str, text: &str);
}

impl DataSourceCluster for Cluster {
    async fn wait_snapshot_protected(&self, name: &str, present: bool) {
        support::eventually(
            &format!("snapshot {name} protected: {present}"),
            TIMEOUT,
            || async {
                let snapshot = self
                    .snapshots()
                    .get(name)
                    .await
                    .map_err(|e| e.to_string())?;
                let finalizers = snapshot.metadata.finalizers.as_ref();
                if has_finalizer(finalizers, SNAPSHOT_PROTECTION_FINALIZER) == present {
                    Ok(())
                } else {
                    Err(format!("finalizers {finalizers:?}"))
                }
            },
        )
        .await;
    }

    async fn bound_source(&self, class: &str, volume_mode: Option<&str>) -> String {
        create_claim(&self.claims, &claim("src", class, "1Gi", volume_mode)).await;
        handle_of(self, "src").await
    }

    async fn delete_snapshot_and_wait(&self, name: &str, content: &str) {
        self.delete_snapshot(name).await;
        self.wait_snapshot_gone(name, content).await;
    }

    async fn wait_refused(&self, claim: &str, text: &str) {
        wait_event(&self.client, self.ns(), claim, FAILED, |m| m.contains(text)).await;
        let pvc = self
            .get_claim(claim)
            .await
            .expect("the claim is still there");
        assert!(!self.pv_exists(&pv_name(&pvc)).await, "no PV for {claim}");
        let phase = pvc.status.and_then(|s| s.phase);
        assert_eq!(phase.as_deref(), Some("Pending"), "{claim} stays Pending");
    }
}

/// A driver started with `driver_args`, its sidecar with `sidecar_args` (beside [`options`]),
/// a class of the driver and a bound 1Gi source claim `src` in it; the class's name and the
/// source volume's handle come with them.
async fn peers(
    cluster: &Cluster,
    driver_args: &[&str],
    sidecar_args: &[&str],
) -> (Driver, Sidecar, String, String) {
    let driver = Driver::start(driver_args).await;
    let sidecar = Sidecar::start_with(&driver, options(cluster, sidecar_args));
    let class = cluster.class("ds", &driver, "Delete", &[]).await;
    let handle = cluster.bound_source(&class, None).await;
    (driver, sidecar, class, handle)
}

/// The driver's csi-snapshotter and a ready VolumeSnapshot `snap` of `src`, taken as a user
/// takes it; with its content.
async fn snapshot_of_source(
    cluster: &Cluster,
    driver: &Driver,
) -> (Snapshotter, VolumeSnapshotContent) {
    let snapshotter = Snapshotter::start(driver);
    let snapshot_class = cluster.snapshot_class("snap", driver).await;
    let (_, content) = cluster
        .take_snapshot("snap", "src", &snapshot_class, &snapshotter)
        .await;
    (snapshotter, content)
}

// ------------------------------------------------------------------------------ clones

#[tokio::test]
async fn a_clone_reads_its_source_volume_and_the_source_goes_once_deleted() {
    // The scheduler binary's control plane, whichever test starts it (tests/scheduler/main.rs).
    support::control_plane_with_scheduler();
    let cluster = Cluster::new("clone").await;
    let (driver, mut sidecar, class, source_handle) = peers(&cluster, &[], &[]).await;

    let pvc = claim_from("copy", &class, "2Gi", None, clone_of("src"));
    let created = create_claim(&cluster.claims, &pvc).await;
    wait_bound(&cluster.claims, "copy").await;
    assert_eq!(
        source_of(&driver, &pv_name(&created)),
        Some(ContentSource::Volume(source_handle.clone())),
        "CreateVolume named the source claim's volume"
    );
    let source = cluster.get_claim("src").await.expect("source");
    assert!(
        has_finalizer(
            source.metadata.finalizers.as_ref(),
            CLONE_PROTECTION_FINALIZER
        ),
        "the source is protected: {:?}",
        source.metadata.finalizers
    );

    // Nothing clones from it any more: the cloning protection lets it go, and its volume.
    cluster.delete_claim("src").await;
    cluster.wait_claim_gone("src").await;
    support::eventually("the source volume to be deleted", TIMEOUT, || async {
        let volumes = driver.volumes();
        if volumes.iter().any(|v| v.id == source_handle) {
            Err(format!("{volumes:?}"))
        } else {
            Ok(())
        }
    })
    .await;
    assert_eq!(driver.volume_count(), 1, "the clone's volume stays");
    sidecar.assert_running();
}

/// The source claim is deleted while the clone's CreateVolume is slow: the source stays
/// (Terminating) until the clone is Bound, then goes; nothing leaks.
#[tokio::test]
async fn a_source_deleted_during_its_clone_waits_for_the_clone() {
    // The scheduler binary's control plane, whichever test starts it (tests/scheduler/main.rs).
    support::control_plane_with_scheduler();
    let cluster = Cluster::new("clone-src-deleted").await;
    let (driver, mut sidecar, class, source_handle) =
        peers(&cluster, &["--delay", "CreateVolume/volume=3s"], &[]).await;

    let created = create_claim(
        &cluster.claims,
        &claim_from("copy", &class, "1Gi", None, clone_of("src")),
    )
    .await;
    driver.wait_create_received(&pv_name(&created)).await;
    cluster.delete_claim("src").await;
    let source = cluster
        .get_claim("src")
        .await
        .expect("held by its finalizer");
    assert!(source.metadata.deletion_timestamp.is_some());

    wait_bound(&cluster.claims, "copy").await;
    cluster.wait_claim_gone("src").await;
    assert_eq!(
        source_of(&driver, &pv_name(&created)),
        Some(ContentSource::Volume(source_handle))
    );
    support::eventually("only the clone's volume to be left", TIMEOUT, || async {
        match driver.volume_count() {
            1 => Ok(()),
            n => Err(format!("{n} volumes")),
        }
    })
    .await;
    sidecar.assert_running();
}

/// The clone's claim is deleted while CreateVolume keeps timing out (the volume exists, the
/// answers are lost), then its source: the source stays while the journal's reaper still
/// replays the clone (the driver reads the source again), the reaper deletes the clone's
/// volume, and then the source goes with its volume.
#[tokio::test]
async fn a_clone_whose_claim_is_deleted_mid_flight_leaks_nothing() {
    // The scheduler binary's control plane, whichever test starts it (tests/scheduler/main.rs).
    support::control_plane_with_scheduler();
    let cluster = Cluster::new("clone-claim-deleted").await;
    // Debug logs say why the source is kept.
    let (driver, mut sidecar, class, _) = peers(&cluster, &[], &["-v=5"]).await;
    // Another driver's sidecar, whose cloning protection must leave our source alone.
    let bystander = Driver::start(&[]).await;
    let mut bystander_sidecar = Sidecar::start_with(&bystander, options(&cluster, &[]));

    driver.set_faults("fault CreateVolume/volume=after:deadline-exceeded\n");
    let created = create_claim(
        &cluster.claims,
        &claim_from("copy", &class, "1Gi", None, clone_of("src")),
    )
    .await;
    let volume = pv_name(&created);
    driver.wait_holds(&volume).await;
    cluster.delete_claim("copy").await;
    cluster.wait_claim_gone("copy").await;
    cluster.delete_claim("src").await;
    support::eventually("the source to be kept for the journal", TIMEOUT, || async {
        let kept = sidecar.log().lines().any(|line| {
            line.contains("clone source kept")
                && line.contains("an operation in the journal clones volume")
        });
        if kept {
            Ok(())
        } else {
            Err("not yet".to_owned())
        }
    })
    .await;
    let source = cluster.get_claim("src").await.expect("the source is held");
    assert!(source.metadata.deletion_timestamp.is_some());

    driver.set_faults("fault CreateVolume/volume=after:deadline-exceeded:2\n");
    cluster.wait_claim_gone("src").await;
    support::eventually("no volume to be left", TIMEOUT, || async {
        match driver.volume_count() {
            0 => Ok(()),
            n => Err(format!("{n} volumes")),
        }
    })
    .await;
    sidecar.assert_running();
    bystander_sidecar.assert_running();
}

// ------------------------------------------------------------------------------ restores

#[tokio::test]
async fn a_restore_reads_the_snapshot_and_releases_it_once_bound() {
    // The scheduler binary's control plane, whichever test starts it (tests/scheduler/main.rs).
    support::control_plane_with_scheduler();
    let cluster = Cluster::new("restore").await;
    let (driver, mut sidecar, class, _) = peers(&cluster, &[], &[]).await;
    let (_snapshotter, content) = snapshot_of_source(&cluster, &driver).await;
    let handle = content
        .status
        .and_then(|s| s.snapshot_handle)
        .expect("a ready content has a handle");

    let created = create_claim(
        &cluster.claims,
        &claim_from("restored", &class, "2Gi", None, restore_of("snap")),
    )
    .await;
    wait_bound(&cluster.claims, "restored").await;
    assert_eq!(
        source_of(&driver, &pv_name(&created)),
        Some(ContentSource::Snapshot(handle)),
        "CreateVolume named the snapshot's handle"
    );
    cluster.wait_snapshot_protected("snap", false).await;
    let content_name = content.metadata.name.clone().unwrap_or_default();
    cluster
        .delete_snapshot_and_wait("snap", &content_name)
        .await;
    sidecar.assert_running();
}

/// The slow restore's retry interval: "fast" binds before the first retry (on a loaded machine
/// too), and "slow" binds after it within the test's waits.
const SLOW_RESTORE_RETRY: &str = "25s";

/// Issue #31, hole 4: two restores of one snapshot; the first one's CreateVolume times out
/// (its volume may exist, its operation stays in the journal and is retried 25 s later), the
/// second one binds meanwhile. The second one's success must not take the snapshot's
/// protection off while the first one's operation still reads it (docs/journal.md rule 12).
#[tokio::test]
async fn a_finished_restore_leaves_the_snapshot_protected_while_another_restore_reads_it() {
    support::control_plane_with_scheduler();
    let cluster = Cluster::new("restore-shared").await;
    let driver = Driver::start(&[]).await;
    let mut sidecar = Sidecar::start_with(
        &driver,
        SidecarOptions {
            args: vec![
                format!("--leader-election-namespace={}", cluster.ns()),
                format!("--retry-interval-start={SLOW_RESTORE_RETRY}"),
                format!("--retry-interval-max={SLOW_RESTORE_RETRY}"),
                "--snapshot-orphan-sweep-interval=1s".to_owned(),
            ],
            ..SidecarOptions::default()
        },
    );
    let class = cluster.class("ds", &driver, "Delete", &[]).await;
    cluster.bound_source(&class, None).await;
    let (_snapshotter, content) = snapshot_of_source(&cluster, &driver).await;

    driver.set_faults("fault CreateVolume/snapshot=after:deadline-exceeded:1\n");
    let slow = create_claim(
        &cluster.claims,
        &claim_from("slow", &class, "1Gi", None, restore_of("snap")),
    )
    .await;
    let slow_volume = pv_name(&slow);
    driver.wait_holds(&slow_volume).await;
    create_claim(
        &cluster.claims,
        &claim_from("fast", &class, "1Gi", None, restore_of("snap")),
    )
    .await;
    wait_bound(&cluster.claims, "fast").await;
    // From here on the slow restore's retries fail, so that it is still in flight however long
    // the success event below waits for the client rate limit's spare capacity.
    driver.set_faults("fault CreateVolume/snapshot=before:unavailable\n");
    // Its success is announced after its snapshot's release was decided.
    wait_event(
        &cluster.client,
        cluster.ns(),
        "fast",
        "ProvisioningSucceeded",
        |_| true,
    )
    .await;
    let operations = journal_operations(&cluster.client, cluster.ns(), &driver)
        .await
        .expect("the journal lists");
    assert!(
        operations.iter().any(|op| op.volume_name == slow_volume),
        "the slow restore is still in flight: {operations:?}"
    );
    let snapshot = cluster.snapshots().get("snap").await.expect("the snapshot");
    assert!(
        has_finalizer(
            snapshot.metadata.finalizers.as_ref(),
            SNAPSHOT_PROTECTION_FINALIZER
        ),
        "released while the slow restore reads it: {:?}",
        snapshot.metadata.finalizers
    );

    driver.clear_faults();
    wait_bound(&cluster.claims, "slow").await;
    cluster.wait_snapshot_protected("snap", false).await;
    let content_name = content.metadata.name.clone().unwrap_or_default();
    cluster
        .delete_snapshot_and_wait("snap", &content_name)
        .await;
    sidecar.assert_running();
}

/// The snapshot is deleted while the restore's CreateVolume is slow: the restore goes on (the
/// snapshot carries the restore's finalizer), binds, and then the snapshot goes.
#[tokio::test]
async fn a_snapshot_deleted_during_its_restore_lets_the_restore_finish() {
    // The scheduler binary's control plane, whichever test starts it (tests/scheduler/main.rs).
    support::control_plane_with_scheduler();
    let cluster = Cluster::new("restore-snap-deleted").await;
    let (driver, mut sidecar, class, _) =
        peers(&cluster, &["--delay", "CreateVolume/snapshot=3s"], &[]).await;
    let (_snapshotter, content) = snapshot_of_source(&cluster, &driver).await;

    let created = create_claim(
        &cluster.claims,
        &claim_from("restored", &class, "1Gi", None, restore_of("snap")),
    )
    .await;
    driver.wait_create_received(&pv_name(&created)).await;
    cluster.wait_snapshot_protected("snap", true).await;
    cluster.delete_snapshot("snap").await;

    wait_bound(&cluster.claims, "restored").await;
    let content_name = content.metadata.name.clone().unwrap_or_default();
    cluster.wait_snapshot_gone("snap", &content_name).await;
    sidecar.assert_running();
}

/// The restore's claim is deleted while CreateVolume keeps timing out: the reaper deletes the
/// restored volume, the sweeper then takes the finalizer off the snapshot, which can go.
#[tokio::test]
async fn a_restore_whose_claim_is_deleted_mid_flight_leaks_nothing_and_frees_the_snapshot() {
    // The scheduler binary's control plane, whichever test starts it (tests/scheduler/main.rs).
    support::control_plane_with_scheduler();
    let cluster = Cluster::new("restore-claim-deleted").await;
    // Debug logs show each sweep's verdicts.
    let (driver, mut sidecar, class, _) = peers(&cluster, &[], &["-v=5"]).await;
    // Another driver's sidecar, whose sweeper must leave our snapshot alone.
    let bystander = Driver::start(&[]).await;
    let mut bystander_sidecar = Sidecar::start_with(&bystander, options(&cluster, &[]));
    let (_snapshotter, content) = snapshot_of_source(&cluster, &driver).await;

    driver.set_faults("fault CreateVolume/snapshot=after:deadline-exceeded\n");
    let created = create_claim(
        &cluster.claims,
        &claim_from("restored", &class, "1Gi", None, restore_of("snap")),
    )
    .await;
    let volume = pv_name(&created);
    driver.wait_holds(&volume).await;
    cluster.delete_claim("restored").await;
    cluster.wait_claim_gone("restored").await;
    // The sweeper must not free the snapshot while the journal still restores from it: a
    // sweep after the claim went keeps it, for the journal's sake.
    support::eventually(
        "a sweep to keep the snapshot for the journal",
        TIMEOUT,
        || async {
            let kept = sidecar.log().lines().any(|line| {
                line.contains("snapshot still needed")
                    && line.contains("an operation in the journal restores from snapshot")
            });
            if kept {
                Ok(())
            } else {
                Err("no such sweep yet".to_owned())
            }
        },
    )
    .await;
    cluster.wait_snapshot_protected("snap", true).await;
    driver.set_faults("fault CreateVolume/snapshot=after:deadline-exceeded:2\n");

    support::eventually("the restored volume to be deleted", TIMEOUT, || async {
        if driver.volumes().iter().any(|v| v.name == volume) {
            Err("still there".to_owned())
        } else {
            Ok(())
        }
    })
    .await;
    cluster.wait_snapshot_protected("snap", false).await;
    let content_name = content.metadata.name.clone().unwrap_or_default();
    cluster
        .delete_snapshot_and_wait("snap", &content_name)
        .await;
    sidecar.assert_running();
    bystander_sidecar.assert_running();
}

/// The sidecar is SIGKILLed while a restore's CreateVolume is in flight and the claim is
/// deleted while it is down: the next sidecar finds the operation in the journal, deletes the
/// volume and frees the snapshot.
#[tokio::test]
async fn a_restore_in_flight_when_the_sidecar_is_killed_leaks_nothing() {
    // The scheduler binary's control plane, whichever test starts it (tests/scheduler/main.rs).
    support::control_plane_with_scheduler();
    let cluster = Cluster::new("restore-sigkill").await;
    let (driver, mut sidecar, class, _) = peers(&cluster, &[], &[]).await;
    let (_snapshotter, _) = snapshot_of_source(&cluster, &driver).await;

    driver.set_faults("fault CreateVolume/snapshot=after:deadline-exceeded\n");
    let created = create_claim(
        &cluster.claims,
        &claim_from("restored", &class, "1Gi", None, restore_of("snap")),
    )
    .await;
    let volume = pv_name(&created);
    driver.wait_holds(&volume).await;
    sidecar.kill().await;
    cluster.delete_claim("restored").await;
    cluster.wait_claim_gone("restored").await;
    driver.clear_faults();
    sidecar.restart().await;

    support::eventually("the restored volume to be deleted", TIMEOUT, || async {
        if driver.volumes().iter().any(|v| v.name == volume) {
            Err("still there".to_owned())
        } else {
            Ok(())
        }
    })
    .await;
    cluster.wait_snapshot_protected("snap", false).await;
    sidecar.assert_running();
}

/// The backend audit (`--audit-volumes-interval`, `--audit-delete-after`) around a restore: a
/// restore in flight (its volume created, the answer never coming) and a volume whose PV and
/// claim are gone but from which a snapshot was taken are never reported nor deleted; once the
/// snapshot is deleted, that volume is referenced by nothing and the audit reports it, but never
/// deletes it: it was referenced while the sidecar watched, so it was kept on purpose.
#[tokio::test]
async fn the_audit_never_reports_a_restore_in_flight_nor_a_snapshots_source_volume() {
    support::control_plane_with_scheduler();
    let cluster = Cluster::new("restore-audit").await;
    let driver = Driver::start(&["--volume-id-prefix", "ref-"]).await;
    let mut options = options(
        &cluster,
        &["--audit-volumes-interval=1s", "--audit-delete-after=2s"],
    );
    options.metrics = true;
    let mut sidecar = Sidecar::start_with(&driver, options);
    let class = cluster.class("keep", &driver, "Retain", &[]).await;
    let source = cluster.bound_source(&class, None).await;
    let (_snapshotter, content) = snapshot_of_source(&cluster, &driver).await;
    let source_pv = cluster
        .pv(&format!("pvc-{}", source_claim_uid(&source)))
        .await;
    cluster.delete_claim("src").await;
    cluster.wait_claim_gone("src").await;
    let source_pv_name = source_pv.metadata.name.clone().unwrap_or_default();
    cluster
        .volumes
        .delete(&source_pv_name, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("deleting PV {source_pv_name}: {e}"));
    cluster.wait_pv_gone(&source_pv_name).await;

    driver.set_faults("fault CreateVolume/snapshot=after:hang\n");
    let created = create_claim(
        &cluster.claims,
        &claim_from("restored", &class, "1Gi", None, restore_of("snap")),
    )
    .await;
    driver.wait_holds(&pv_name(&created)).await;
    let audits = || {
        let page = sidecar.metrics().unwrap_or_default();
        metric_sum(
            &parse_metrics(&page),
            "csi_provisioner_volume_audits_total",
            &[("result", "complete")],
        )
    };
    let now = audits();
    support::eventually("five more audits", TIMEOUT, || async {
        let done = audits();
        (done >= now + 5.0)
            .then_some(())
            .ok_or_else(|| format!("{done} audits"))
    })
    .await;
    assert!(
        driver.volume_requests("DeleteVolume").is_empty(),
        "nothing deleted while the snapshot and the restore reference the volumes"
    );
    let reported = events_with_reason(&cluster, "UnreferencedVolume").await;
    assert!(reported.is_empty(), "{reported:?}");

    driver.clear_faults();
    wait_bound(&cluster.claims, "restored").await;
    cluster
        .delete_snapshot_and_wait("snap", content.metadata.name.as_deref().unwrap_or_default())
        .await;
    // Referenced by nothing now, it is reported; it was referenced while the sidecar watched
    // (a Retain volume whose PV was deleted: kept on purpose), so it is never deleted.
    support::eventually("the source volume to be reported", TIMEOUT, || async {
        let reported = events_with_reason(&cluster, "UnreferencedVolume").await;
        reported
            .iter()
            .any(|message| message.contains(&source) && message.contains("was referenced"))
            .then_some(())
            .ok_or_else(|| format!("{reported:?}"))
    })
    .await;
    assert!(driver.volumes().iter().any(|volume| volume.id == source));
    assert!(driver.volume_requests("DeleteVolume").is_empty());
    sidecar.assert_running();
}

/// The claim UID a volume id of ours (`ref-pvc-<uid>`) holds.
fn source_claim_uid(handle: &str) -> &str {
    handle.trim_start_matches("ref-pvc-")
}

async fn events_with_reason(cluster: &Cluster, reason: &str) -> Vec<String> {
    Api::<Event>::namespaced(cluster.client.clone(), cluster.ns())
        .list(&ListParams::default())
        .await
        .unwrap_or_else(|e| panic!("listing events: {e}"))
        .items
        .into_iter()
        .filter(|event| event.reason.as_deref() == Some(reason))
        .filter_map(|event| event.message)
        .collect()
}

// ------------------------------------------------------------------------------ bad input

#[tokio::test]
async fn bad_input_clones_smaller_than_or_of_another_mode_than_their_source() {
    // The scheduler binary's control plane, whichever test starts it (tests/scheduler/main.rs).
    support::control_plane_with_scheduler();
    let cluster = Cluster::new("clone-bad").await;
    let (driver, mut sidecar, class, _) = peers(&cluster, &[], &[]).await;
    let prefix = "error getting handle for DataSource Type PersistentVolumeClaim by Name";

    for (name, size, mode, text) in [
        (
            "smaller",
            "512Mi",
            None,
            "error, new PVC request must be greater than or equal in size to the specified PVC data source, requested 536870912 but source is 1073741824",
        ),
        (
            "block",
            "1Gi",
            Some("Block"),
            "the source PVC and destination PVCs must have the same volume mode for cloning.  Source is Filesystem, but new PVC requested Block",
        ),
        ("orphan", "1Gi", None, "error getting PVC missing"),
    ] {
        let source = if name == "orphan" { "missing" } else { "src" };
        create_claim(
            &cluster.claims,
            &claim_from(name, &class, size, mode, clone_of(source)),
        )
        .await;
        cluster
            .wait_refused(name, &format!("{prefix} {source}: {text}"))
            .await;
    }
    assert_eq!(driver.volume_count(), 1, "only the source's volume exists");
    sidecar.assert_running();
}

#[tokio::test]
async fn bad_input_a_driver_without_clone_volume_is_named() {
    // The scheduler binary's control plane, whichever test starts it (tests/scheduler/main.rs).
    support::control_plane_with_scheduler();
    let cluster = Cluster::new("clone-nocap").await;
    let (_driver, mut sidecar, class, _) = peers(&cluster, &["--no-clone"], &[]).await;
    create_claim(
        &cluster.claims,
        &claim_from("copy", &class, "1Gi", None, clone_of("src")),
    )
    .await;
    cluster
        .wait_refused(
            "copy",
            "CSI driver does not support clone operations: controller CLONE_VOLUME capability is not reported",
        )
        .await;
    let source = cluster.get_claim("src").await.expect("source");
    assert!(
        !has_finalizer(
            source.metadata.finalizers.as_ref(),
            CLONE_PROTECTION_FINALIZER
        ),
        "a clone that can never be made protects nothing"
    );
    sidecar.assert_running();
}

#[tokio::test]
async fn bad_input_restores_the_snapshot_does_not_allow() {
    // The scheduler binary's control plane, whichever test starts it (tests/scheduler/main.rs).
    support::control_plane_with_scheduler();
    let cluster = Cluster::new("restore-bad").await;
    let (driver, mut sidecar, class, _) = peers(&cluster, &[], &[]).await;
    let (_snapshotter, _) = snapshot_of_source(&cluster, &driver).await;
    let prefix = "error getting handle for DataSource Type VolumeSnapshot by Name";

    for (name, size, mode, snapshot, text) in [
        (
            "smaller",
            "512Mi",
            None,
            "snap",
            "requested volume size 536870912 is less than the size 1073741824 for the source snapshot snap",
        ),
        (
            "block",
            "1Gi",
            Some("Block"),
            "snap",
            "modifies the mode of the source volume but does not have permission to do so. snapshot.storage.kubernetes.io/allow-volume-mode-change annotation is not present on snapshotcontent",
        ),
        (
            "missing",
            "1Gi",
            None,
            "nothing",
            "error getting snapshot nothing from api server",
        ),
    ] {
        create_claim(
            &cluster.claims,
            &claim_from(name, &class, size, mode, restore_of(snapshot)),
        )
        .await;
        cluster
            .wait_refused(name, &format!("{prefix} {snapshot}: "))
            .await;
        wait_event(&cluster.client, cluster.ns(), name, FAILED, |m| {
            m.contains(text)
        })
        .await;
    }

    // A snapshot being deleted (held here by a finalizer of the test's) is refused to a
    // restore that has not protected it.
    let hold = json!({"metadata": {"finalizers": ["example.com/test-hold"]}});
    cluster
        .snapshots()
        .patch("snap", &PatchParams::default(), &Patch::Merge(&hold))
        .await
        .expect("holding the snapshot");
    cluster
        .snapshots()
        .delete("snap", &DeleteParams::default())
        .await
        .expect("deleting the snapshot");
    create_claim(
        &cluster.claims,
        &claim_from("late", &class, "1Gi", None, restore_of("snap")),
    )
    .await;
    cluster
        .wait_refused(
            "late",
            &format!("{prefix} snap: snapshot snap is being deleted"),
        )
        .await;
    assert_eq!(driver.volume_count(), 1, "only the source's volume exists");
    let release = json!({"metadata": {"finalizers": null}});
    cluster
        .snapshots()
        .patch("snap", &PatchParams::default(), &Patch::Merge(&release))
        .await
        .expect("releasing the snapshot");
    sidecar.assert_running();
}

/// A snapshot that never becomes ready (the driver fails every CreateSnapshot) is refused,
/// and so is a snapshot of another driver.
#[tokio::test]
async fn bad_input_a_snapshot_not_ready_or_of_another_driver() {
    // The scheduler binary's control plane, whichever test starts it (tests/scheduler/main.rs).
    support::control_plane_with_scheduler();
    let cluster = Cluster::new("restore-notready").await;
    let driver = Driver::start(&[]).await;
    let other = Driver::start(&[]).await;
    let mut sidecar = Sidecar::start_with(&driver, options(&cluster, &[]));
    let mut other_sidecar = Sidecar::start_with(&other, options(&cluster, &[]));
    let snapshotter = Snapshotter::start(&driver);
    let other_snapshotter = Snapshotter::start(&other);
    let class = cluster.class("restore", &driver, "Delete", &[]).await;
    let other_class = cluster.class("other", &other, "Delete", &[]).await;
    cluster.bound_source(&class, None).await;
    create_claim(
        &cluster.claims,
        &claim("other-src", &other_class, "1Gi", None),
    )
    .await;
    wait_bound(&cluster.claims, "other-src").await;
    let prefix = "error getting handle for DataSource Type VolumeSnapshot by Name";

    let other_snapshot_class = cluster.snapshot_class("other-snap", &other).await;
    let (_, content) = cluster
        .take_snapshot(
            "foreign",
            "other-src",
            &other_snapshot_class,
            &other_snapshotter,
        )
        .await;
    create_claim(
        &cluster.claims,
        &claim_from(
            "foreign-restore",
            &class,
            "1Gi",
            None,
            restore_of("foreign"),
        ),
    )
    .await;
    let content_name = content.metadata.name.clone().unwrap_or_default();
    cluster
        .wait_refused(
            "foreign-restore",
            &format!(
                "{prefix} foreign: snapshotcontent {content_name} for snapshot foreign is not handled by CSI driver of StorageClass {class}"
            ),
        )
        .await;

    driver.set_faults("fault CreateSnapshot=before:internal\n");
    let snapshot_class = cluster.snapshot_class("snap", &driver).await;
    cluster
        .create_snapshot("broken", "src", &snapshot_class)
        .await;
    create_claim(
        &cluster.claims,
        &claim_from("unready", &class, "1Gi", None, restore_of("broken")),
    )
    .await;
    support::eventually("a refusal of the unready snapshot", TIMEOUT, || async {
        let events = support::cluster::events_of(&cluster.client, cluster.ns(), "unready").await?;
        let refused = events.iter().any(|e| {
            let message = e.message.as_deref().unwrap_or_default();
            message.contains(&format!("{prefix} broken: snapshot broken is not Ready"))
                || message.contains(&format!("{prefix} broken: snapshot broken not bound"))
        });
        if refused {
            Ok(())
        } else {
            Err(support::cluster::summarize(&events))
        }
    })
    .await;
    assert_eq!(driver.volume_count(), 1, "only the source's volume exists");
    drop(snapshotter);
    sidecar.assert_running();
    other_sidecar.assert_running();
}
