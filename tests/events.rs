//! Events where users look, under the client-side rate limit: most events yield to the requests
//! that make progress (they wait for a full token bucket, up to 5 minutes), but a claim's first
//! Warning is news and goes at once, taking its turn in the rate limit like any request
//! (docs/flags.md, "Events are written asynchronously").

use csi_test_support as support;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::ListParams;

use support::cluster::{Cluster, claim, create_claim, events_of, summarize, wait_bound};
use support::peers::{Driver, Sidecar};

/// Claims that keep the sidecar's token bucket busy: one CreateVolume at a time, each taking
/// half a second, so PV creates come twice as fast as `--kube-api-qps=1` lets them out and the
/// bucket is never full while they are provisioned (about `BUSY_CLAIMS` seconds). Few enough
/// requests wait at any time that a request sent now goes out within seconds.
const BUSY_CLAIMS: usize = 150;
/// Far below the 5 minutes an event may yield, and below the time the busy claims keep the
/// bucket from filling up (about `BUSY_CLAIMS` seconds): an event that waited for spare capacity
/// misses it (with the event writer of before, which let every event yield, this test times out
/// here). The count of claims still unbound when it comes is the sharper proof, below.
const NEWS_BOUND: Duration = Duration::from_secs(100);

fn is_bound(claim: &PersistentVolumeClaim) -> bool {
    claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
}

async fn bound_busy_claims(cluster: &Cluster) -> usize {
    let claims = cluster
        .claims
        .list(&ListParams::default())
        .await
        .unwrap_or_else(|e| panic!("listing claims: {e}"));
    claims
        .items
        .iter()
        .filter(|claim| {
            claim
                .metadata
                .name
                .as_deref()
                .is_some_and(|name| name.starts_with("busy-"))
                && is_bound(claim)
        })
        .count()
}

#[tokio::test]
async fn a_claims_first_warning_does_not_wait_for_a_busy_rate_limit() {
    let cluster = Cluster::new("events").await;
    let driver =
        Driver::start(&["--delay", "CreateVolume=500ms", "--max-volume-size", "1Gi"]).await;
    let busy = cluster.class("busy", &driver, "Delete", &[]).await;
    let failing = cluster.class("failing", &driver, "Delete", &[]).await;
    let _sidecar = Sidecar::start(
        &driver,
        &[
            "--kube-api-qps=1",
            "--kube-api-burst=1",
            "--max-concurrent-per-storage-class=1",
        ],
    );
    // The sidecar has started (at 1 request a second, its watches take a while).
    cluster.claim("warm-up", &busy).await;
    wait_bound(&cluster.claims, "warm-up").await;
    // From here on the bucket is busy: the busy claims' PV creates wait for their tokens.
    cluster.claims_named("busy", &busy, BUSY_CLAIMS).await;

    // Above the driver's --max-volume-size: OUT_OF_RANGE, a ProvisioningFailed Warning.
    create_claim(&cluster.claims, &claim("too-big", &failing, "2Gi", None)).await;
    let created = Instant::now();
    support::eventually(
        "the first ProvisioningFailed Warning of too-big",
        NEWS_BOUND,
        || async {
            let events = events_of(&cluster.client, cluster.ns(), "too-big").await?;
            events
                .iter()
                .any(|e| {
                    e.reason.as_deref() == Some("ProvisioningFailed")
                        && e.type_.as_deref() == Some("Warning")
                })
                .then_some(())
                .ok_or_else(|| summarize(&events))
        },
    )
    .await;
    let waited = created.elapsed();
    let bound = bound_busy_claims(&cluster).await;
    // The bucket was still busy when the Warning came: an event waiting for spare capacity
    // would still be waiting.
    assert!(
        bound < BUSY_CLAIMS / 2,
        "{bound} of {BUSY_CLAIMS} busy claims bound after {waited:?}: the bucket was not kept busy"
    );
    eprintln!("the Warning came after {waited:?}, with {bound} of {BUSY_CLAIMS} busy claims bound");
}
