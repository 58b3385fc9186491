//! Leader election and shutdown of real `csi-provisioner` processes against the control plane:
//! two replicas share one Lease, the leader hands it over on SIGTERM, and the two-stage
//! shutdown lets a CreateVolume in flight finish (first signal) or aborts (second signal).
//!
//! The leader-election identity is the hostname, as upstream's; two replicas on one machine
//! get different hostnames from UTS namespaces (`unshare`), as two pods would have.

use csi_test_support as support;

use std::process::Command;
use std::time::{Duration, Instant};

use csi_provisioner::leader::{STOPPED_EVENT_NOT_SENT, lease_name};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use nix::sys::signal::Signal;

use support::cluster::{Cluster, driver_pvs, lease_holder, pv_name, wait_bound, wait_event};
use support::peers::{
    Driver, Sidecar, SidecarOptions, TIMEOUT, describe, metric_sum, parse_metrics,
};

/// Short lease timings so a failover takes seconds (flag validation: lease > renew > 1.2 × retry).
const FAST_LEASE: [&str; 3] = [
    "--leader-election-lease-duration=4s",
    "--leader-election-renew-deadline=3s",
    "--leader-election-retry-period=1s",
];

fn leader_args(namespace: &str) -> Vec<String> {
    let mut args = vec![
        "--leader-election".to_owned(),
        format!("--leader-election-namespace={namespace}"),
    ];
    args.extend(FAST_LEASE.iter().map(|s| (*s).to_owned()));
    args
}

fn require_uts_namespaces() {
    let works = Command::new("unshare")
        .args(["--user", "--map-root-user", "--uts", "true"])
        .status()
        .is_ok_and(|status| status.success());
    assert!(
        works,
        "this test runs two replicas with different hostnames in user+UTS namespaces \
         (`unshare --user --map-root-user --uts`), which this machine does not allow"
    );
}

fn count_lines(log: &str, needle: &str) -> usize {
    log.lines().filter(|line| line.contains(needle)).count()
}

#[tokio::test]
async fn one_replica_leads_and_hands_over_on_sigterm() {
    require_uts_namespaces();
    let cluster = Cluster::new("leader").await;
    let ns = cluster.ns();
    let driver = Driver::start(&[]).await;
    let replica = |host: &str| {
        Sidecar::start_with(
            &driver,
            SidecarOptions {
                args: leader_args(ns),
                hostname: Some(host.to_owned()),
                env: Vec::new(),
                metrics: true,
            },
        )
    };
    let mut a = replica("replica-a");
    let mut b = replica("replica-b");
    let lease = lease_name(driver.name());

    let first = support::eventually("one replica to hold the Lease", TIMEOUT, || async {
        match lease_holder(&cluster.client, ns, &driver).await? {
            holder if !holder.is_empty() => Ok(holder),
            other => Err(format!("holder {other:?}")),
        }
    })
    .await;
    let (leader, follower, follower_host) = match first.as_str() {
        "replica-a" => (&mut a, &mut b, "replica-b"),
        "replica-b" => (&mut b, &mut a, "replica-a"),
        other => panic!("Lease {lease} held by {other:?}, not by a replica"),
    };
    eprintln!("{first} leads Lease {ns}/{lease}");
    let became = leader_event(&cluster, &lease, &format!("{first} became leader")).await;
    assert_eq!(
        became.source.and_then(|s| s.component),
        Some(format!("{}/{first}", driver.name().replace('/', "-"))),
        "source: the driver name and the raw hostname"
    );
    wait_master_status(leader, 1.0).await;
    wait_master_status(follower, 0.0).await;

    let class = cluster.class("class", &driver, "Delete", &[]).await;
    for name in cluster.claims_named("before", &class, 3).await {
        wait_bound(&cluster.claims, &name).await;
    }
    assert_eq!(
        count_lines(&leader.log(), "became leader, starting controllers"),
        1
    );
    assert_eq!(
        count_lines(&follower.log(), "became leader"),
        0,
        "the follower must not lead while the leader renews"
    );
    assert_eq!(
        count_lines(&follower.log(), "provisioned"),
        0,
        "only the leader provisions"
    );
    assert_eq!(
        driver.volume_count(),
        3,
        "one volume per claim, no duplicate"
    );

    leader.signal(Signal::SIGTERM);
    let handover = Instant::now();
    support::eventually("the follower to take the Lease over", TIMEOUT, || async {
        match lease_holder(&cluster.client, ns, &driver).await? {
            holder if holder == follower_host => Ok(()),
            other => Err(format!("holder {other:?}")),
        }
    })
    .await;
    let failover = handover.elapsed();
    eprintln!(
        "failover took {:.1}s (lease duration 4s, retry period 1s)",
        failover.as_secs_f64()
    );
    let status = leader.wait_exit(TIMEOUT).await;
    assert_eq!(
        status.code(),
        Some(0),
        "the old leader ended with {}",
        describe(status)
    );
    // The event is bounded so that a slow API server cannot hold up the exit; when it was not
    // sent in time, the leader's log says so.
    if count_lines(&leader.log(), STOPPED_EVENT_NOT_SENT) == 0 {
        leader_event(&cluster, &lease, &format!("{first} stopped leading")).await;
    }
    leader_event(&cluster, &lease, &format!("{follower_host} became leader")).await;
    wait_master_status(follower, 1.0).await;
    assert_eq!(
        count_lines(&leader.log(), "released leader lease"),
        1,
        "the old leader released the Lease on SIGTERM"
    );

    for name in cluster.claims_named("after", &class, 3).await {
        wait_bound(&cluster.claims, &name).await;
    }
    assert_eq!(
        count_lines(&follower.log(), "became leader, starting controllers"),
        1
    );
    assert_eq!(
        driver.volume_count(),
        6,
        "one volume per claim, no duplicate"
    );
    let transitions = Api::<Lease>::namespaced(cluster.client.clone(), ns)
        .get(&lease)
        .await
        .expect("reading the Lease")
        .spec
        .and_then(|s| s.lease_transitions);
    assert!(
        transitions.is_some_and(|t| t >= 1),
        "leaseTransitions {transitions:?}"
    );
    follower.assert_running();
}

#[tokio::test]
async fn first_sigterm_waits_for_the_create_volume_in_flight() {
    let cluster = Cluster::new("drain").await;
    let driver = Driver::start(&["--delay", "CreateVolume=2s"]).await;
    let mut sidecar = Sidecar::start_with(
        &driver,
        SidecarOptions {
            args: leader_args(cluster.ns()),
            ..SidecarOptions::default()
        },
    );
    let class = cluster.class("class", &driver, "Delete", &[]).await;
    let created = cluster.claim("slow", &class).await;

    // CreateVolume takes 2 s once the driver has it.
    driver.wait_create_received(&pv_name(&created)).await;
    sidecar.signal(Signal::SIGTERM);
    let signalled = Instant::now();
    let status = sidecar.wait_exit(TIMEOUT).await;
    let took = signalled.elapsed();
    let volume = pv_name(&created);
    let pv_at_exit = cluster.pv_exists(&volume).await;
    eprintln!("exited {took:?} after SIGTERM with {}", describe(status));
    assert_eq!(
        status.code(),
        Some(0),
        "drain ended with {}",
        describe(status)
    );
    assert!(
        pv_at_exit,
        "the sidecar exited before the PV {volume} of the call in flight was created"
    );
    let codes: Vec<String> = driver
        .calls("CreateVolume")
        .into_iter()
        .map(|c| c.code)
        .collect();
    assert_eq!(codes, ["Ok"], "the call in flight ran to completion");
    assert_eq!(driver.volume_count(), 1);
    // The sidecar led (it provisioned), so the Lease exists: empty means released.
    let holder = lease_holder(&cluster.client, cluster.ns(), &driver)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(holder, "", "the Lease is released on the way out");
    wait_bound(&cluster.claims, "slow").await;
}

#[tokio::test]
async fn second_signal_aborts_at_once() {
    let cluster = Cluster::new("abort").await;
    let driver = Driver::start(&["--delay", "CreateVolume=30s"]).await;
    // The call's own timeout must outlast the steps before the second signal (the default 10 s
    // may not, on a loaded machine): a drain whose call ended would exit by itself.
    let mut sidecar = Sidecar::start(&driver, &["--timeout=60s"]);
    let class = cluster.class("class", &driver, "Delete", &[]).await;
    let created = cluster.claim("stuck", &class).await;

    driver.wait_create_received(&pv_name(&created)).await;
    sidecar.signal(Signal::SIGTERM);
    support::eventually("the sidecar to start draining", TIMEOUT, || async {
        if sidecar.log().contains("shutting down") {
            Ok(())
        } else {
            Err("no drain message in the log yet".to_owned())
        }
    })
    .await;
    assert!(
        sidecar.is_running(),
        "one signal must not end a drain with a call in flight"
    );
    sidecar.signal(Signal::SIGTERM);
    let signalled = Instant::now();
    // The call in flight would take 30 s more; an abort ends long before.
    let status = sidecar.wait_exit(Duration::from_secs(10)).await;
    eprintln!(
        "aborted {:?} after the second signal with {}",
        signalled.elapsed(),
        describe(status)
    );
    assert_eq!(
        status.code(),
        Some(130),
        "an abort exits non-zero (130, documented); got {}",
        describe(status)
    );
    assert!(
        !cluster.pv_exists(&pv_name(&created)).await,
        "no PV: the call was abandoned"
    );
    assert!(
        driver_pvs(&cluster.client, &driver)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .is_empty()
    );
}

/// A leader paused past its lease (SIGSTOP, a frozen VM) wakes up still believing it leads,
/// beside the replica that took over. Until it renews or exits it must send no CreateVolume:
/// each replica has its own driver process here, so what the paused one sends is seen apart.
#[tokio::test]
async fn a_leader_paused_past_its_lease_sends_nothing_when_it_wakes_up() {
    require_uts_namespaces();
    let cluster = Cluster::new("leader-paused").await;
    let ns = cluster.ns();
    // Every CreateVolume is answered DEADLINE_EXCEEDED: the claim stays in flight, retried.
    let lost_answers = ["--fault", "CreateVolume=after:deadline-exceeded"];
    let driver_a = Driver::start(&lost_answers).await;
    let driver_b = driver_a.twin(&lost_answers).await;
    let replica = |driver: &Driver, host: &str| {
        let mut args = leader_args(ns);
        args.extend(["--retry-interval-start=200ms", "--retry-interval-max=1s"].map(String::from));
        Sidecar::start_with(
            driver,
            SidecarOptions {
                args,
                hostname: Some(host.to_owned()),
                env: Vec::new(),
                ..SidecarOptions::default()
            },
        )
    };
    let mut a = replica(&driver_a, "replica-a");
    wait_holder(&cluster, &driver_a, "replica-a").await;
    let mut b = replica(&driver_b, "replica-b");
    let class = cluster.class("paused", &driver_a, "Delete", &[]).await;
    cluster.claim("data", &class).await;
    wait_requests(&driver_a, 2).await;

    a.signal(Signal::SIGSTOP);
    wait_holder(&cluster, &driver_a, "replica-b").await;
    wait_requests(&driver_b, 1).await;
    let sent_before_pause = driver_a.requests("CreateVolume").len();
    a.signal(Signal::SIGCONT);

    // Its renewal is refused (replica-b holds the Lease): it exits at its renew deadline.
    let status = a.wait_exit(TIMEOUT).await;
    assert!(!status.success(), "{}", describe(status));
    assert_eq!(
        driver_a.requests("CreateVolume").len(),
        sent_before_pause,
        "the paused leader sent CreateVolume after waking up, beside the new leader"
    );
    b.assert_running();
}

/// client-go's LeaderElection event with `message` on the Lease (Normal, the Lease's uid).
async fn leader_event(
    cluster: &Cluster,
    lease: &str,
    message: &str,
) -> k8s_openapi::api::core::v1::Event {
    let event = wait_event(
        &cluster.client,
        cluster.ns(),
        lease,
        "LeaderElection",
        |m| m == message,
    )
    .await;
    let uid = Api::<Lease>::namespaced(cluster.client.clone(), cluster.ns())
        .get(lease)
        .await
        .expect("reading the Lease")
        .metadata
        .uid;
    assert_eq!(event.type_.as_deref(), Some("Normal"));
    assert_eq!(event.involved_object.kind.as_deref(), Some("Lease"));
    assert_eq!(
        event.involved_object.api_version.as_deref(),
        Some("coordination.k8s.io/v1")
    );
    assert_eq!(event.involved_object.uid, uid, "the Lease's uid");
    assert_eq!(event.metadata.namespace.as_deref(), Some(cluster.ns()));
    event
}

/// Waits until `replica` reports `leader_election_master_status{name=""}` = `value`.
async fn wait_master_status(replica: &mut Sidecar, value: f64) {
    replica.wait_metrics().await;
    support::eventually("leader_election_master_status", TIMEOUT, || async {
        let samples = parse_metrics(&replica.metrics()?);
        let series = |name: &str| metric_sum(&samples, name, &[("name", "")]);
        match series("leader_election_master_status") {
            v if v == value
                && samples
                    .iter()
                    .any(|s| s.name == "leader_election_slowpath_total") =>
            {
                Ok(())
            }
            v => Err(format!("master status {v}")),
        }
    })
    .await;
}

async fn wait_holder(cluster: &Cluster, driver: &Driver, host: &str) {
    support::eventually(&format!("{host} to hold the Lease"), TIMEOUT, || async {
        match lease_holder(&cluster.client, cluster.ns(), driver).await? {
            holder if holder == host => Ok(()),
            other => Err(format!("holder {other:?}")),
        }
    })
    .await;
}

async fn wait_requests(driver: &Driver, count: usize) {
    support::eventually(
        &format!(
            "{count} CreateVolume requests at {}",
            driver.socket().display()
        ),
        TIMEOUT,
        || async {
            let seen = driver.requests("CreateVolume").len();
            if seen >= count {
                Ok(())
            } else {
                Err(format!("{seen} so far"))
            }
        },
    )
    .await;
}
