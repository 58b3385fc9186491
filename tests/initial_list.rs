//! The sidecar against an API server that does not stream initial lists (the `WatchList`
//! feature gate off, as on clusters before Kubernetes 1.34): it must notice, list instead, and
//! provision and delete as usual. The other test binaries run against the default API server,
//! which streams them.

use csi_test_support as support;

use support::cluster::{Cluster, pv_name, wait_bound};
use support::peers::{Driver, Sidecar};

const NOT_STREAMED: &str = "the API server does not stream initial lists; listing instead";

#[tokio::test]
async fn without_streaming_lists_the_sidecar_lists_and_provisions() {
    support::control_plane_with_apiserver_flags(&["--feature-gates=WatchList=false"]);
    let cluster = Cluster::new("listed").await;
    let driver = Driver::start(&[]).await;
    let class = cluster.class("listed", &driver, "Delete", &[]).await;
    // Present before the sidecar starts, so only its initial list can bring it in.
    let early = cluster.claim("early", &class).await;

    let mut sidecar = Sidecar::start(&driver, &[]);
    wait_bound(&cluster.claims, "early").await;
    let late = cluster.claim("late", &class).await;
    wait_bound(&cluster.claims, "late").await;
    assert!(
        sidecar.log().contains(NOT_STREAMED),
        "the sidecar did not fall back to lists:\n{}",
        sidecar.log()
    );

    for (name, created) in [("early", &early), ("late", &late)] {
        cluster.delete_claim(name).await;
        cluster.wait_pv_gone(&pv_name(created)).await;
    }
    assert_eq!(driver.volume_count(), 0, "driver volumes left");
    sidecar.assert_running();
}
