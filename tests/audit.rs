//! Ours: the backend audit (`--audit-volumes-interval`, `--audit-delete-after`) end to end,
//! with the reference driver's ListVolumes over its socket. The driver runs with
//! `--volume-id-prefix=ref-`, so a volume's id holds its CreateVolume name, as many drivers'
//! ids do; volumes nobody provisioned are made by calling the driver directly.

use csi_test_support as support;

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{ConfigMap, Event};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams};
use nix::sys::signal::Signal;

use support::cluster::{
    Cluster, create_class, driver_pvs, journal_operations, pv_name, wait_bound,
};
use support::peers::{Driver, Sidecar, SidecarOptions, TIMEOUT, metric_sum, parse_metrics};

const UNREFERENCED: &str = "UnreferencedVolume";
const DELETED: &str = "UnreferencedVolumeDeleted";
const ID_PREFIX: &str = "ref-";

fn sidecar_options(cluster: &Cluster, extra: &[&str]) -> SidecarOptions {
    let mut args = vec![
        format!("--leader-election-namespace={}", cluster.ns()),
        "--retry-interval-start=200ms".to_owned(),
        "--retry-interval-max=2s".to_owned(),
        "--timeout=2s".to_owned(),
    ];
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    SidecarOptions {
        args,
        metrics: true,
        ..SidecarOptions::default()
    }
}

/// The ids the driver holds.
fn driver_ids(driver: &Driver) -> BTreeSet<String> {
    driver
        .volumes()
        .into_iter()
        .map(|volume| volume.id)
        .collect()
}

/// The audit report ConfigMap's `volumes` table, by volume id: its deletion column.
async fn report(cluster: &Cluster, driver: &Driver) -> Option<BTreeMap<String, String>> {
    let name = format!(
        "{}-audit",
        csi_provisioner::leader::lease_name(driver.name())
    );
    let map = Api::<ConfigMap>::namespaced(cluster.client.clone(), cluster.ns())
        .get_opt(&name)
        .await
        .unwrap_or_else(|e| panic!("reading ConfigMap {name}: {e}"))?;
    let table = map.data?.get("volumes")?.clone();
    Some(
        table
            .lines()
            .skip(1)
            .filter_map(|line| {
                let fields: Vec<&str> = line.split('\t').collect();
                Some((fields.first()?.to_string(), fields.get(3)?.to_string()))
            })
            .collect(),
    )
}

async fn wait_reported(cluster: &Cluster, driver: &Driver, ids: &BTreeSet<String>) {
    support::eventually(
        "the report to list exactly the unreferenced volumes",
        TIMEOUT,
        || async {
            let listed: BTreeSet<String> = report(cluster, driver)
                .await
                .unwrap_or_default()
                .into_keys()
                .collect();
            if &listed == ids {
                Ok(())
            } else {
                Err(format!("listed {listed:?}"))
            }
        },
    )
    .await;
}

async fn events(cluster: &Cluster, reason: &str) -> Vec<Event> {
    Api::<Event>::namespaced(cluster.client.clone(), cluster.ns())
        .list(&ListParams::default())
        .await
        .unwrap_or_else(|e| panic!("listing events: {e}"))
        .items
        .into_iter()
        .filter(|event| event.reason.as_deref() == Some(reason))
        .collect()
}

/// The volume ids every `UnreferencedVolume` event so far named.
async fn ever_reported(cluster: &Cluster, ids: &BTreeSet<String>) -> BTreeSet<String> {
    let events = events(cluster, UNREFERENCED).await;
    ids.iter()
        .filter(|id| {
            events.iter().any(|event| {
                event
                    .message
                    .as_deref()
                    .is_some_and(|message| message.contains(&format!("Volume {id} ")))
            })
        })
        .cloned()
        .collect()
}

async fn wait_volume_gone(driver: &Driver, id: &str) {
    support::eventually(&format!("volume {id} to be deleted"), TIMEOUT, || async {
        if driver_ids(driver).contains(id) {
            Err("still there".to_owned())
        } else {
            Ok(())
        }
    })
    .await;
}

async fn wait_journal_empty(cluster: &Cluster, driver: &Driver) {
    support::eventually("the journal to be empty", TIMEOUT, || async {
        let left = journal_operations(&cluster.client, cluster.ns(), driver).await?;
        left.is_empty()
            .then_some(())
            .ok_or_else(|| format!("{left:?}"))
    })
    .await;
}

/// The handles of the driver's PVs.
async fn pv_handles(cluster: &Cluster, driver: &Driver) -> BTreeSet<String> {
    driver_pvs(&cluster.client, driver)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .iter()
        .filter_map(|pv| Some(pv.spec.as_ref()?.csi.as_ref()?.volume_handle.clone()))
        .collect()
}

/// A bound claim, a claim in flight (its volume created, the driver's answer never coming), a
/// volume of our name whose claim never existed, one of another provisioner's name and one of
/// our name whose claim exists: the first two are never reported; the last three are; only the
/// one of our name without a claim is deleted, once it has been unreferenced for the delay.
#[tokio::test]
async fn the_audit_reports_and_deletes_only_what_nothing_references() {
    let cluster = Cluster::new("audit").await;
    let driver = Driver::start(&["--volume-id-prefix", ID_PREFIX]).await;
    let class = cluster.class("audit", &driver, "Delete", &[]).await;
    let mut sidecar = Sidecar::start_with(
        &driver,
        sidecar_options(
            &cluster,
            &["--audit-volumes-interval=1s", "--audit-delete-after=3s"],
        ),
    );
    let bound = cluster.claim("bound", &class).await;
    wait_bound(&cluster.claims, "bound").await;
    let ours = driver
        .create_directly(&format!("pvc-{}", uuid::Uuid::new_v4()))
        .await;
    let foreign = driver
        .create_directly("leaked-by-another-provisioner")
        .await;
    // A claim of a driver nobody serves: it exists, so the volume named after it stays.
    let other_class = format!("{}-nobody", cluster.ns());
    create_class(
        &cluster.client,
        &StorageClass {
            metadata: ObjectMeta {
                name: Some(other_class.clone()),
                ..ObjectMeta::default()
            },
            provisioner: "nobody.example.com".to_owned(),
            ..StorageClass::default()
        },
    )
    .await;
    let waiting = cluster.claim("waiting", &other_class).await;
    let claimed = driver.create_directly(&pv_name(&waiting)).await;
    // The driver creates the next volumes and never answers (so no more direct creates).
    driver.set_faults("fault CreateVolume=after:hang\n");
    let in_flight = cluster.claim("in-flight", &class).await;
    driver.wait_holds(&pv_name(&in_flight)).await;
    let unreferenced: BTreeSet<String> = [&ours, &foreign, &claimed].into_iter().cloned().collect();

    wait_volume_gone(&driver, &ours).await;
    let remaining: BTreeSet<String> = [&foreign, &claimed].into_iter().cloned().collect();
    wait_reported(&cluster, &driver, &remaining).await;
    let table = report(&cluster, &driver).await.unwrap_or_default();
    assert_eq!(table[&foreign], "never: not our name", "{table:?}");
    assert!(table[&claimed].starts_with("never: claim "), "{table:?}");
    support::eventually("an UnreferencedVolume event for each", TIMEOUT, || async {
        let reported = ever_reported(&cluster, &unreferenced).await;
        (reported == unreferenced)
            .then_some(())
            .ok_or_else(|| format!("events for {reported:?}"))
    })
    .await;
    support::eventually("the UnreferencedVolumeDeleted event", TIMEOUT, || async {
        let deleted = events(&cluster, DELETED).await;
        deleted
            .iter()
            .any(|event| event.message.as_deref().is_some_and(|m| m.contains(&ours)))
            .then_some(())
            .ok_or_else(|| format!("{deleted:?}"))
    })
    .await;
    let page = sidecar.wait_metrics().await;
    let samples = parse_metrics(&page);
    assert_eq!(
        metric_sum(&samples, "csi_provisioner_unreferenced_volumes", &[]),
        2.0
    );
    assert_eq!(
        metric_sum(
            &samples,
            "csi_provisioner_unreferenced_volumes_deleted_total",
            &[]
        ),
        1.0
    );
    // Nothing referenced was ever reported, and only the volume of ours was deleted.
    let referenced: BTreeSet<String> = driver_ids(&driver)
        .difference(&unreferenced)
        .cloned()
        .collect();
    assert_eq!(referenced.len(), 2, "the bound and the in-flight volume");
    assert!(ever_reported(&cluster, &referenced).await.is_empty());
    let deletes: Vec<String> = driver
        .volume_requests("DeleteVolume")
        .into_iter()
        .map(|request| request.volume_id)
        .collect();
    assert_eq!(
        deletes,
        std::slice::from_ref(&ours),
        "only the volume of ours was deleted"
    );

    // The claim in flight gets its volume; the journal is empty again.
    driver.clear_faults();
    wait_bound(&cluster.claims, "in-flight").await;
    assert_eq!(
        pv_handles(&cluster, &driver).await,
        referenced,
        "{bound:?} and in-flight hold the two others"
    );
    wait_journal_empty(&cluster, &driver).await;
    sidecar.assert_running();
}

/// The deletion is recorded before it is sent: a leader killed while its DeleteVolume hangs
/// leaves the record, and the next leader deletes the volume by its id, without a CreateVolume.
#[tokio::test]
async fn a_new_leader_finishes_a_recorded_deletion_without_a_create_volume() {
    let cluster = Cluster::new("audit-failover").await;
    let driver = Driver::start(&["--volume-id-prefix", ID_PREFIX]).await;
    let class = cluster.class("audit", &driver, "Delete", &[]).await;
    let replica = |host: &str| {
        let mut options = sidecar_options(
            &cluster,
            &[
                "--leader-election",
                "--leader-election-lease-duration=4s",
                "--leader-election-renew-deadline=3s",
                "--leader-election-retry-period=1s",
                "--audit-volumes-interval=1s",
                "--audit-delete-after=2s",
            ],
        );
        options.hostname = Some(host.to_owned());
        Sidecar::start_with(&driver, options)
    };
    let mut first = replica("audit-a");
    cluster.claim("bound", &class).await;
    wait_bound(&cluster.claims, "bound").await;
    let mut second = replica("audit-b");

    driver.set_faults("fault DeleteVolume=before:hang\n");
    let name = format!("pvc-{}", uuid::Uuid::new_v4());
    let leaked = driver.create_directly(&name).await;
    support::eventually("the deletion to be recorded and sent", TIMEOUT, || async {
        let recorded = journal_operations(&cluster.client, cluster.ns(), &driver)
            .await?
            .iter()
            .any(|record| record.volume_id.as_deref() == Some(leaked.as_str()));
        let sent = driver
            .requests("DeleteVolume")
            .iter()
            .any(|line| line.contains(&leaked));
        (recorded && sent)
            .then_some(())
            .ok_or_else(|| format!("recorded {recorded}, sent {sent}"))
    })
    .await;
    first.signal(Signal::SIGKILL);
    let _ = first.wait_exit(TIMEOUT).await;
    driver.clear_faults();
    wait_volume_gone(&driver, &leaked).await;
    wait_journal_empty(&cluster, &driver).await;
    let creates: Vec<String> = driver
        .requests("CreateVolume")
        .into_iter()
        .filter(|line| line.contains(&name))
        .collect();
    assert_eq!(
        creates.len(),
        1,
        "only the test's own CreateVolume: {creates:?}"
    );
    assert_eq!(
        pv_handles(&cluster, &driver).await,
        driver_ids(&driver),
        "the bound claim's volume is the only one left"
    );
    second.assert_running();
}

/// Upstream issue #486's leak, reproduced with upstream's sidecar and then with ours: claims
/// whose CreateVolume creates the volume and times out, the sidecar SIGKILLed while they are in
/// flight, half of them deleted meanwhile, the sidecar started again and the driver healed.
/// Then our sidecar audits the driver: it finds exactly the volumes that no PV references
/// (upstream's leaks; none of ours) and, opted in, deletes them and nothing else.
#[tokio::test]
async fn the_audit_finds_and_deletes_what_upstream_leaked_and_ours_did_not() {
    const CLAIMS: usize = 8;
    let mut found = Vec::new();
    for upstream in [true, false] {
        let who = if upstream { "upstream" } else { "ours" };
        let cluster = Cluster::new(&format!("audit-{who}")).await;
        let driver = Driver::start(&["--volume-id-prefix", ID_PREFIX]).await;
        let class = cluster.class("leaky", &driver, "Delete", &[]).await;
        let start = |driver: &Driver| {
            let options = sidecar_options(&cluster, &[]);
            if upstream {
                Sidecar::start_upstream(
                    driver,
                    SidecarOptions::args(&[
                        "--retry-interval-start=200ms",
                        "--retry-interval-max=2s",
                        "--timeout=2s",
                    ]),
                )
            } else {
                Sidecar::start_with(driver, options)
            }
        };
        driver.set_faults("fault CreateVolume=after:deadline-exceeded\n");
        let mut sidecar = start(&driver);
        let mut claims = Vec::new();
        for index in 0..CLAIMS {
            claims.push(cluster.claim(&format!("claim-{index}"), &class).await);
        }
        for claim in &claims {
            driver.wait_holds(&pv_name(claim)).await;
        }
        sidecar.signal(Signal::SIGKILL);
        let _ = sidecar.wait_exit(TIMEOUT).await;
        let (deleted, kept) = claims.split_at(CLAIMS / 2);
        for claim in deleted {
            cluster
                .delete_claim(claim.metadata.name.as_deref().unwrap_or_default())
                .await;
        }
        for claim in deleted {
            cluster
                .wait_claim_gone(claim.metadata.name.as_deref().unwrap_or_default())
                .await;
        }
        driver.clear_faults();
        sidecar.restart().await;
        for claim in kept {
            wait_bound(
                &cluster.claims,
                claim.metadata.name.as_deref().unwrap_or_default(),
            )
            .await;
        }
        // Settled: every claim left is bound; what the driver holds beyond the PVs leaked.
        support::eventually("the deleted claims to be gone", TIMEOUT, || async {
            let left = cluster
                .claims
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?
                .items
                .len();
            (left == kept.len())
                .then_some(())
                .ok_or_else(|| format!("{left} claims"))
        })
        .await;
        if !upstream {
            wait_journal_empty(&cluster, &driver).await;
        }
        sidecar.signal(Signal::SIGTERM);
        let _ = sidecar.wait_exit(TIMEOUT).await;
        let held = pv_handles(&cluster, &driver).await;
        let leaked: BTreeSet<String> = driver_ids(&driver).difference(&held).cloned().collect();

        let deletes_before = driver.volume_requests("DeleteVolume").len();
        let mut auditor = Sidecar::start_with(
            &driver,
            sidecar_options(
                &cluster,
                &["--audit-volumes-interval=1s", "--audit-delete-after=2s"],
            ),
        );
        if !leaked.is_empty() {
            wait_reported(&cluster, &driver, &leaked).await;
        }
        support::eventually("the leaked volumes to be deleted", TIMEOUT, || async {
            let ids = driver_ids(&driver);
            let held = pv_handles(&cluster, &driver).await;
            (ids == held)
                .then_some(())
                .ok_or_else(|| format!("volumes {ids:?}, PVs' {held:?}"))
        })
        .await;
        // The driver saves its state before it answers, and the sidecar counts a deletion once
        // the answer is in: the counter may lag the state a moment.
        auditor.wait_metrics().await;
        let deleted_count = support::eventually("the deletions to be counted", TIMEOUT, || async {
            let page = auditor.metrics()?;
            let deleted_count = metric_sum(
                &parse_metrics(&page),
                "csi_provisioner_unreferenced_volumes_deleted_total",
                &[],
            );
            (deleted_count == leaked.len() as f64)
                .then_some(deleted_count)
                .ok_or_else(|| format!("{who}: {deleted_count} counted, {} leaked", leaked.len()))
        })
        .await;
        let deletes: BTreeSet<String> = driver
            .volume_requests("DeleteVolume")
            .into_iter()
            .skip(deletes_before)
            .map(|request| request.volume_id)
            .collect();
        assert_eq!(
            deletes, leaked,
            "only the leaked volumes were deleted (every claim left is bound)"
        );
        auditor.assert_running();
        println!(
            "{who}: {} claims, {} deleted mid-flight with the sidecar SIGKILLed: {} volumes leaked, the audit found and deleted {deleted_count}",
            CLAIMS,
            deleted.len(),
            leaked.len()
        );
        found.push((who, leaked.len()));
    }
    assert!(
        found[0].1 > 0,
        "upstream leaks in this scenario (its issue #486): {found:?}"
    );
    assert_eq!(found[1].1, 0, "ours leaks nothing: {found:?}");
}
