//! Handing claims over between this sidecar and upstream external-provisioner v6.3 (built and
//! cached by hack/build-upstream-provisioner.sh) while operations are in flight: the downgrade
//! through `--drain`, and the upgrade. Real control plane, the reference driver with its
//! durable state, both sidecars as processes; docs/deploy.md describes the procedure.
//!
//! Upstream keeps no journal and does not know our claim finalizer: what it cannot see when it
//! takes over (an orphan of a deleted claim) leaks, and our finalizer stays on the claim for
//! good. The drain must leave neither.

use csi_test_support as support;

use std::collections::BTreeSet;

use csi_provisioner::leader::lease_name;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Secret};
use kube::api::{Api, DeleteParams};
use nix::sys::signal::Signal;

use support::cluster::{
    Cluster, driver_pvs, has_consistency_finalizer, journal_operations, lease_holder, pv_name,
    wait_bound, wait_event,
};
use support::peers::{Driver, Sidecar, SidecarOptions, TIMEOUT, describe};

/// Every CreateVolume creates the volume and answers DEADLINE_EXCEEDED, as a backend slower
/// than `--timeout`: the sidecar keeps each operation in flight, retrying.
const CREATE_TIMES_OUT: &str = "fault CreateVolume=after:deadline-exceeded\n";

/// Our sidecar's flags: the Lease and the journal in the test namespace, fast retries.
fn ours(cluster: &Cluster, extra: &[&str]) -> SidecarOptions {
    let mut options = SidecarOptions::args(&[
        "--leader-election",
        "--retry-interval-start=200ms",
        "--retry-interval-max=2s",
    ]);
    options
        .args
        .push(format!("--leader-election-namespace={}", cluster.ns()));
    options.args.extend(extra.iter().map(|s| (*s).to_owned()));
    options
}

/// Upstream's flags: its defaults, with retries as fast as ours.
fn upstream() -> SidecarOptions {
    SidecarOptions::args(&["--retry-interval-start=200ms", "--retry-interval-max=2s"])
}

/// The claims of one downgrade, by what they are doing when our sidecar stops.
struct InFlight {
    class: String,
    /// Live claims whose CreateVolume created the volume but timed out.
    live: Vec<String>,
    /// Deleted claims whose volume exists on the driver: orphans (one kept Terminating by
    /// our finalizer).
    deleted: Vec<PersistentVolumeClaim>,
}

/// Creates claims (some with the consistency finalizer) whose CreateVolume times out after
/// creating the volume, deletes some, and stops our sidecar with SIGTERM while every one of
/// them is in flight.
async fn stop_with_claims_in_flight(cluster: &Cluster, driver: &Driver) -> InFlight {
    let mut sidecar = Sidecar::start_with(driver, ours(cluster, &[]));
    let class = cluster.class("handover", driver, "Delete", &[]).await;
    let mut claims = Vec::new();
    for name in ["plain-0", "plain-1", "doomed-0"] {
        claims.push(cluster.claim(name, &class).await);
    }
    for name in ["guarded-0", "guarded-1", "doomed-1"] {
        claims.push(cluster.consistent_claim(name, &class, "enable").await);
    }
    for claim in &claims {
        driver.wait_holds(&pv_name(claim)).await;
    }
    let deleted: Vec<PersistentVolumeClaim> = claims
        .iter()
        .filter(|claim| name(claim).starts_with("doomed"))
        .cloned()
        .collect();
    for claim in &deleted {
        cluster.delete_claim(name(claim)).await;
    }
    support::eventually(
        "both deleted claims' operations to be orphaned",
        TIMEOUT,
        || async {
            let operations = journal_operations(&cluster.client, cluster.ns(), driver).await?;
            let orphaned = operations
                .iter()
                .filter(|op| op.phase == csi_provisioner::journal::Phase::Orphaned)
                .count();
            if operations.len() == claims.len() && orphaned == deleted.len() {
                Ok(())
            } else {
                Err(format!("{operations:?}"))
            }
        },
    )
    .await;
    let terminating = cluster
        .get_claim("doomed-1")
        .await
        .unwrap_or_else(|| panic!("doomed-1 went while its volume exists"));
    assert!(has_consistency_finalizer(&terminating));

    sidecar.signal(Signal::SIGTERM);
    let status = sidecar.wait_exit(TIMEOUT).await;
    assert!(status.success(), "SIGTERM: {}", describe(status));
    let live = claims
        .iter()
        .map(|claim| name(claim).to_owned())
        .filter(|name| !name.starts_with("doomed"))
        .collect();
    InFlight {
        class,
        live,
        deleted,
    }
}

fn name(pvc: &PersistentVolumeClaim) -> &str {
    pvc.metadata.name.as_deref().unwrap_or_default()
}

/// Waits until every claim of `names` is Bound and the driver holds exactly the volumes the
/// driver's PVs reference, one per claim: nothing leaked, nothing doubled.
async fn wait_all_bound_nothing_leaked(cluster: &Cluster, driver: &Driver, names: &[String]) {
    for name in names {
        wait_bound(&cluster.claims, name).await;
    }
    support::eventually(
        "one volume per claim, each referenced by a PV",
        TIMEOUT,
        || async {
            let handles: BTreeSet<String> = driver_pvs(&cluster.client, driver)
                .await?
                .into_iter()
                .filter_map(|pv| Some(pv.spec?.csi?.volume_handle))
                .collect();
            let volumes: BTreeSet<String> = driver.volumes().into_iter().map(|v| v.id).collect();
            if handles == volumes && volumes.len() == names.len() {
                Ok(())
            } else {
                Err(format!(
                    "driver volumes {volumes:?}, PV handles {handles:?}, {} claims",
                    names.len()
                ))
            }
        },
    )
    .await;
}

/// Downgrade: SIGTERM our sidecar with claims in flight (volumes created, answers lost, two
/// claims deleted, the consistency finalizer on some), run it with `--drain` once the driver
/// answers again: it finishes every operation, removes every finalizer and exits 0; then
/// upstream binds every claim left with the volume already created, and nothing leaks.
#[tokio::test]
async fn a_drain_hands_every_claim_in_flight_over_to_upstream() {
    let cluster = Cluster::new("handover-drain").await;
    let driver = Driver::start(&[]).await;
    driver.set_faults(CREATE_TIMES_OUT);
    let in_flight = stop_with_claims_in_flight(&cluster, &driver).await;
    // Created between the stop and the drain: nobody recorded anything for it.
    let late = cluster
        .consistent_claim("late", &in_flight.class, "enable")
        .await;

    driver.clear_faults();
    let mut drain = Sidecar::start_with(&driver, ours(&cluster, &["--drain"]));
    let status = drain.wait_exit(TIMEOUT).await;
    assert!(status.success(), "--drain: {}", describe(status));
    let log = drain.log();
    assert!(log.contains("--drain: no new provisioning"), "{log}");
    assert!(log.contains("drain complete"), "{log}");

    let left = journal_operations(&cluster.client, cluster.ns(), &driver)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(left.is_empty(), "the journal is empty: {left:?}");
    for claim in cluster
        .claims
        .list(&Default::default())
        .await
        .unwrap_or_else(|e| panic!("listing claims: {e}"))
    {
        assert!(
            !has_consistency_finalizer(&claim),
            "{} keeps our finalizer",
            name(&claim)
        );
    }
    for claim in &in_flight.deleted {
        cluster.wait_claim_gone(name(claim)).await;
        let volume = pv_name(claim);
        assert!(
            driver.volumes().iter().all(|v| v.name != volume),
            "the orphan {volume} was deleted by the drain"
        );
    }
    for live in &in_flight.live {
        let claim = cluster
            .get_claim(live)
            .await
            .unwrap_or_else(|| panic!("{live} gone"));
        assert!(
            cluster.pv_exists(&pv_name(&claim)).await,
            "the drain created the PV of {live}"
        );
    }
    let late_volume = pv_name(&late);
    assert!(
        driver
            .requests("CreateVolume")
            .iter()
            .all(|request| !request.contains(&late_volume)),
        "the drain sent no CreateVolume for a claim it had not recorded"
    );
    assert_eq!(
        lease_holder(&cluster.client, cluster.ns(), &driver)
            .await
            .unwrap_or_else(|e| panic!("{e}")),
        "",
        "the drain released the Lease"
    );

    let _upstream = Sidecar::start_upstream(&driver, upstream());
    let mut remaining = in_flight.live.clone();
    remaining.push("late".to_owned());
    wait_all_bound_nothing_leaked(&cluster, &driver, &remaining).await;

    // Our PV finalizer is upstream's too: upstream deletes what the drain provisioned.
    let handed = cluster
        .get_claim(&in_flight.live[0])
        .await
        .unwrap_or_else(|| panic!("claim gone"));
    cluster.delete_claim(&in_flight.live[0]).await;
    cluster.wait_pv_gone(&pv_name(&handed)).await;
    remaining.remove(0);
    wait_all_bound_nothing_leaked(&cluster, &driver, &remaining).await;
}

/// An orphan whose provisioner Secret is gone cannot be deleted: the drain does not complete
/// (a `DrainBlocked` event on the shard says why) until the Secret is back, then it deletes
/// the volume and exits 0.
#[tokio::test]
async fn an_orphan_whose_secret_is_gone_holds_the_drain_until_it_is_back() {
    let cluster = Cluster::new("handover-blocked").await;
    let driver = Driver::start(&[]).await;
    driver.set_faults(CREATE_TIMES_OUT);
    let mut sidecar = Sidecar::start_with(&driver, ours(&cluster, &[]));
    let secret = [
        ("csi.storage.k8s.io/provisioner-secret-name", "creds"),
        (
            "csi.storage.k8s.io/provisioner-secret-namespace",
            cluster.ns(),
        ),
    ];
    let class = cluster.class("secret", &driver, "Delete", &secret).await;
    cluster
        .create_secret("creds", &[("password", "not-logged")])
        .await;
    let created = cluster.claim("data", &class).await;
    let volume = pv_name(&created);
    driver.wait_holds(&volume).await;
    cluster.delete_claim("data").await;
    cluster.wait_claim_gone("data").await;
    Api::<Secret>::namespaced(cluster.client.clone(), cluster.ns())
        .delete("creds", &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("deleting Secret creds: {e}"));
    sidecar.signal(Signal::SIGTERM);
    let status = sidecar.wait_exit(TIMEOUT).await;
    assert!(status.success(), "SIGTERM: {}", describe(status));

    driver.clear_faults();
    let mut drain = Sidecar::start_with(&driver, ours(&cluster, &["--drain"]));
    let shard = format!("{}-0", lease_name(driver.name()));
    wait_event(
        &cluster.client,
        cluster.ns(),
        &shard,
        "DrainBlocked",
        |message| message.contains(&volume) && message.contains("creds"),
    )
    .await;
    drain.assert_running();
    assert_eq!(driver.volume_count(), 1, "the orphan waits for its Secret");

    cluster
        .create_secret("creds", &[("password", "not-logged")])
        .await;
    let status = drain.wait_exit(TIMEOUT).await;
    assert!(status.success(), "--drain: {}", describe(status));
    assert_eq!(driver.volume_count(), 0, "the orphan was deleted");
    let left = journal_operations(&cluster.client, cluster.ns(), &driver)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(left.is_empty(), "{left:?}");
}

/// Without the drain, upstream forgets what our journal held: the orphans' volumes leak and our
/// finalizer stays on the claims it guarded. The reason `--drain` exists.
#[tokio::test]
async fn a_downgrade_without_the_drain_leaks_orphans_and_keeps_our_finalizer() {
    let cluster = Cluster::new("handover-nodrain").await;
    let driver = Driver::start(&[]).await;
    driver.set_faults(CREATE_TIMES_OUT);
    let in_flight = stop_with_claims_in_flight(&cluster, &driver).await;
    driver.clear_faults();

    let _upstream = Sidecar::start_upstream(&driver, upstream());
    for live in &in_flight.live {
        wait_bound(&cluster.claims, live).await;
    }
    let guarded = cluster
        .get_claim("guarded-0")
        .await
        .unwrap_or_else(|| panic!("guarded-0 gone"));
    assert!(
        has_consistency_finalizer(&guarded),
        "upstream does not know our finalizer"
    );
    let volumes: BTreeSet<String> = driver.volumes().into_iter().map(|v| v.name).collect();
    for claim in &in_flight.deleted {
        assert!(
            volumes.contains(&pv_name(claim)),
            "upstream left the orphan {} on the driver",
            pv_name(claim)
        );
    }
    let terminating = cluster
        .get_claim("doomed-1")
        .await
        .unwrap_or_else(|| panic!("doomed-1 went"));
    assert!(
        has_consistency_finalizer(&terminating),
        "the deleted claim stays Terminating for good"
    );
}

/// Upgrade: upstream provisions claims against a driver whose CreateVolume creates the volume
/// and then times out (some calls still in their delay), and is SIGKILLed; ours, started on
/// the same driver, binds every claim to the volume upstream's calls created, and nothing
/// leaks.
#[tokio::test]
async fn an_upgrade_from_upstream_mid_flight_binds_every_claim_once() {
    let cluster = Cluster::new("handover-upgrade").await;
    let driver = Driver::start(&[]).await;
    driver.set_faults(&format!("delay CreateVolume=1s\n{CREATE_TIMES_OUT}"));
    let mut upstream = Sidecar::start_upstream(&driver, upstream());
    let class = cluster.class("upgrade", &driver, "Delete", &[]).await;
    let names = cluster.claims_named("claim", &class, 6).await;
    let mut created = Vec::new();
    for name in &names {
        let claim = cluster
            .get_claim(name)
            .await
            .unwrap_or_else(|| panic!("{name} gone"));
        created.push(pv_name(&claim));
    }
    for volume in &created {
        driver.wait_create_received(volume).await;
    }
    driver.wait_holds(&created[0]).await;
    upstream.kill().await;

    driver.clear_faults();
    let _ours = Sidecar::start_with(&driver, ours(&cluster, &[]));
    wait_all_bound_nothing_leaked(&cluster, &driver, &names).await;
    support::eventually("the journal to be empty", TIMEOUT, || async {
        let left = journal_operations(&cluster.client, cluster.ns(), &driver).await?;
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        }
    })
    .await;
}
