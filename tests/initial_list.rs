//! The sidecar against an API server that does not stream initial lists (the `WatchList`
//! feature gate off, as on clusters before Kubernetes 1.34): it must notice, list instead, and
//! provision and delete as usual. The other test binaries run against the default API server,
//! which streams them.

mod support;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, DeleteParams};

use support::peers::{
    Driver, Sidecar, TIMEOUT, claim, create_claim, create_class, pv_name, storage_class, wait_bound,
};

const NOT_STREAMED: &str = "the API server does not stream initial lists; listing instead";

#[tokio::test]
async fn without_streaming_lists_the_sidecar_lists_and_provisions() {
    support::control_plane_with_apiserver_flags(&["--feature-gates=WatchList=false"]);
    let (client, ns) = support::test_namespace("listed").await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns.name());
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let driver = Driver::start(&[]).await;
    let class = format!("{}-listed", ns.name());
    create_class(&client, &storage_class(&class, &driver, "Delete", &[])).await;
    // Present before the sidecar starts, so only its initial list can bring it in.
    let early = create_claim(&claims, &claim("early", &class, "1Gi", None)).await;

    let mut sidecar = Sidecar::start(&driver, &[]);
    wait_bound(&claims, "early").await;
    let late = create_claim(&claims, &claim("late", &class, "1Gi", None)).await;
    wait_bound(&claims, "late").await;
    assert!(
        sidecar.log().contains(NOT_STREAMED),
        "the sidecar did not fall back to lists:\n{}",
        sidecar.log()
    );

    for (name, created) in [("early", &early), ("late", &late)] {
        claims
            .delete(name, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("deleting PVC {name}: {e}"));
        let pv = pv_name(created);
        support::eventually(&format!("PV {pv} deleted"), TIMEOUT, || async {
            match volumes.get_opt(&pv).await {
                Ok(None) => Ok(()),
                Ok(Some(_)) => Err("still there".to_owned()),
                Err(e) => Err(e.to_string()),
            }
        })
        .await;
    }
    assert_eq!(driver.volume_count(), 0, "driver volumes left");
    sidecar.assert_running();
}
