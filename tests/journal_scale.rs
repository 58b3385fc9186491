//! The journal at scale: 10,000 operations in flight at once must not make a shard grow past
//! what the API server stores (about 1.5 MiB per object in etcd), or every later write, and so
//! every later CreateVolume, would stall. The driver answers every CreateVolume UNAVAILABLE
//! without creating anything (the call may still be running, so each record stays), so all
//! 10,000 operations are recorded together; then one more claim must still be recorded and
//! sent to the driver.
//!
//! In a test binary of its own: it fills the control plane with 10,000 claims.

use csi_test_support as support;

use futures::StreamExt;
use kube::api::{Api, ListParams};

use csi_provisioner::journal::{DRIVER_LABEL, ProvisioningJournal};
use support::cluster::{Cluster, claim, create_claim, pv_name};
use support::peers::{Driver, Sidecar, SidecarOptions};

const IN_FLIGHT: usize = 10_000;
/// What "well under the limit" means here: a third of 1.5 MiB.
const MAX_SHARD_BYTES: usize = 512 * 1024;
/// Generous bound on each wait (creating and recording 10,000 claims on 2 cores); never an
/// assertion on speed. The test command runs this binary while the other lane builds or runs
/// the node: the whole test took 847 s on a cold run with the e2e suite's Go build beside it
/// (216 s with nothing compiling), so the bound is well above that.
const SCALE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1800);
const ANN_STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";

/// The shards of `driver`'s journal in `namespace`: (name, operations, size as JSON).
async fn shard_sizes(
    shards: &Api<ProvisioningJournal>,
    driver: &Driver,
) -> Result<Vec<(String, usize, usize)>, String> {
    let selector = format!(
        "{DRIVER_LABEL}={}",
        csi_provisioner::leader::lease_name(driver.name())
    );
    let listed = shards
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|e| format!("listing journal shards: {e}"))?;
    Ok(listed
        .items
        .into_iter()
        .map(|shard| {
            let size = serde_json::to_vec(&shard).map_or(0, |json| json.len());
            let name = shard.metadata.name.clone().unwrap_or_default();
            (name, shard.spec.operations.len(), size)
        })
        .collect())
}

#[tokio::test]
async fn ten_thousand_operations_in_flight_keep_every_shard_small_and_provisioning_going() {
    let cluster = Cluster::new("journal-scale").await;
    let driver = Driver::start(&["--fault", "CreateVolume=before:unavailable"]).await;
    let options = SidecarOptions {
        args: vec![
            format!("--leader-election-namespace={}", cluster.ns()),
            "--kube-api-qps=1000".to_owned(),
            "--kube-api-burst=2000".to_owned(),
        ],
        ..SidecarOptions::default()
    };
    let mut sidecar = Sidecar::start_with(&driver, options);
    let class = cluster.class("scale", &driver, "Delete", &[]).await;

    let created = futures::stream::iter(0..IN_FLIGHT)
        .map(|index| {
            let mut pvc = claim(&format!("data-{index}"), &class, "1Gi", None);
            pvc.metadata
                .annotations
                .get_or_insert_default()
                .insert(ANN_STORAGE_PROVISIONER.to_owned(), driver.name().to_owned());
            let claims = cluster.claims.clone();
            async move { create_claim(&claims, &pvc).await }
        })
        .buffer_unordered(32)
        .count()
        .await;
    assert_eq!(created, IN_FLIGHT);

    let shards: Api<ProvisioningJournal> = Api::namespaced(cluster.client.clone(), cluster.ns());
    let sizes = support::eventually(
        "every claim's operation to be recorded",
        SCALE_TIMEOUT,
        || async {
            let sizes = shard_sizes(&shards, &driver).await?;
            let recorded: usize = sizes.iter().map(|(_, operations, _)| operations).sum();
            if recorded >= IN_FLIGHT {
                Ok(sizes)
            } else {
                Err(format!("{recorded} of {IN_FLIGHT} recorded"))
            }
        },
    )
    .await;
    let largest = sizes
        .iter()
        .max_by_key(|(_, _, size)| *size)
        .cloned()
        .unwrap_or_default();
    println!(
        "{IN_FLIGHT} operations in {} shards; largest {} with {} operations, {} bytes",
        sizes.len(),
        largest.0,
        largest.1,
        largest.2
    );
    assert!(
        largest.2 < MAX_SHARD_BYTES,
        "shard {} holds {} bytes",
        largest.0,
        largest.2
    );

    // Provisioning goes on: one more claim is recorded, and only then sent to the driver.
    let late = create_claim(&cluster.claims, &claim("late", &class, "1Gi", None)).await;
    let volume = pv_name(&late);
    support::eventually(
        "the late claim to be recorded and sent",
        SCALE_TIMEOUT,
        || async {
            let needle = format!("name: \"{volume}\"");
            let sent = driver
                .requests("CreateVolume")
                .iter()
                .any(|line| line.contains(&needle));
            let sizes = shard_sizes(&shards, &driver).await?;
            let recorded: usize = sizes.iter().map(|(_, operations, _)| operations).sum();
            if sent && recorded > IN_FLIGHT {
                Ok(())
            } else {
                Err(format!("sent {sent}, {recorded} recorded"))
            }
        },
    )
    .await;
    sidecar.assert_running();
}
