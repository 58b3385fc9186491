//! The sidecar against a driver nobody on this team wrote: the Kubernetes end-to-end mock CSI
//! driver (support::mock_driver), on the real control plane. Each test has its own namespace and
//! mock (with a unique name).

use csi_test_support as support;

use serde_json::{Value, json};

use support::cluster::{Cluster, pv_name, wait_bound};
use support::csi_wire::list_volume_ids;
use support::mock_driver::{MockDriver, MockDriverOptions};
use support::peers::Sidecar;

const SECRET_VALUE: &str = "not-for-the-log";

/// The string at `path` (object keys) in `value`, or "" when it is missing.
fn text<'a>(value: &'a Value, path: &[&str]) -> &'a str {
    path.iter()
        .try_fold(value, |v, key| v.get(key))
        .and_then(Value::as_str)
        .unwrap_or_default()
}

#[tokio::test]
async fn provisions_and_deletes_a_volume_on_the_mock_driver() {
    let cluster = Cluster::new("mock").await;
    let driver = MockDriver::start(MockDriverOptions::default()).await;
    let mut sidecar = Sidecar::start(&driver, &[]);
    cluster
        .create_secret("creds", &[("secretKey", SECRET_VALUE)])
        .await;
    let class = cluster
        .class(
            "mock",
            &driver,
            "Delete",
            &[
                ("type", "fast"),
                ("csi.storage.k8s.io/provisioner-secret-name", "creds"),
                (
                    "csi.storage.k8s.io/provisioner-secret-namespace",
                    cluster.ns(),
                ),
            ],
        )
        .await;
    let volume_name = pv_name(&cluster.claim("data", &class).await);
    wait_bound(&cluster.claims, "data").await;
    sidecar.assert_running();

    let creates = driver.calls("CreateVolume");
    assert_eq!(creates.len(), 1, "{}", driver.log());
    let create = &creates[0];
    assert_eq!(text(create, &["code"]), "OK", "{create}");
    let request = &driver.create_volume_requests()[0];
    assert_eq!(text(request, &["name"]), volume_name, "{request}");
    assert_eq!(
        request["capacity_range"]["required_bytes"],
        json!((1_i64 << 30).to_string()),
        "{request}"
    );
    assert_eq!(request["parameters"], json!({"type": "fast"}), "{request}");
    // The secret reaches the driver, and its value stays out of the mock's log.
    assert_eq!(
        request["secrets"],
        json!({"secretKey": "***redacted***"}),
        "{request}"
    );
    assert!(!driver.log().contains(SECRET_VALUE), "{}", driver.log());

    let volume_id = text(create, &["response", "volume", "volume_id"]).to_owned();
    assert!(!volume_id.is_empty(), "{create}");
    let pv = cluster.pv(&volume_name).await;
    let csi = pv
        .spec
        .as_ref()
        .and_then(|spec| spec.csi.as_ref())
        .expect("a CSI PV");
    assert_eq!(csi.driver, driver.name());
    assert_eq!(csi.volume_handle, volume_id, "the id the mock returned");
    assert!(list_volume_ids(driver.socket()).await.contains(&volume_id));

    cluster.delete_claim("data").await;
    cluster.wait_pv_gone(&volume_name).await;
    let left = list_volume_ids(driver.socket()).await;
    assert!(!left.contains(&volume_id), "{left:?}");
    let deletes = driver.calls("DeleteVolume");
    assert_eq!(deletes.len(), 1, "{}", driver.log());
    assert_eq!(text(&deletes[0], &["request", "volume_id"]), volume_id);
    assert_eq!(text(&deletes[0], &["code"]), "OK");
    sidecar.assert_running();
}
