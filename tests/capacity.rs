//! `--enable-capacity` end to end, on the real control plane with kube-scheduler: the
//! CSIStorageCapacity objects the sidecar publishes for the reference driver's per-zone
//! capacity (upstream's names, labels, owner and fields), kept up to date and cleaned up, and
//! the scheduler placing pods by them; then the start-up errors.
//!
//! Isolation: each test has its own driver (so its own drivername label), zone key, Nodes and
//! namespace; the objects of other tests' sidecars are never looked at.

use csi_test_support as support;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::storage::v1::{CSIDriver, CSIDriverSpec, CSIStorageCapacity};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};

use support::cluster::{Cluster, claim, create_claim, wait_bound};
use support::peers::{
    Driver, Sidecar, SidecarOptions, TIMEOUT, describe, metric_sum, parse_metrics,
};
use support::topology::{Topology, pv_segments, scheduling_cluster};

const GI: i64 = 1 << 30;

/// The objects of `driver` in `namespace`, by zone (the value of `key` in their selector;
/// each test has one class), and how many listed objects share a (zone, class) with another.
struct Listed {
    by_zone: BTreeMap<String, CSIStorageCapacity>,
    duplicates: usize,
}

async fn objects_by_zone(client: &Client, namespace: &str, driver: &str, key: &str) -> Listed {
    let api: Api<CSIStorageCapacity> = Api::namespaced(client.clone(), namespace);
    let selector = format!("csi.storage.k8s.io/drivername={driver}");
    let list = api
        .list(&ListParams::default().labels(&selector))
        .await
        .unwrap_or_else(|e| panic!("listing CSIStorageCapacity: {e}"));
    let listed = list.items.len();
    let zone_of = |object: &CSIStorageCapacity| {
        object
            .node_topology
            .as_ref()
            .and_then(|selector| selector.match_labels.as_ref())
            .and_then(|labels| labels.get(key))
            .cloned()
            .unwrap_or_default()
    };
    let keys: std::collections::BTreeSet<(String, String)> = list
        .items
        .iter()
        .map(|object| (zone_of(object), object.storage_class_name.clone()))
        .collect();
    Listed {
        duplicates: listed - keys.len(),
        by_zone: list
            .items
            .into_iter()
            .map(|object| (zone_of(&object), object))
            .collect(),
    }
}

fn bytes(quantity: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>) -> i64 {
    let text = quantity.map(|q| q.0.as_str()).unwrap_or("absent");
    match text.strip_suffix("Gi") {
        Some(gib) => gib.parse::<i64>().map(|g| g * GI).unwrap_or(-1),
        None => text.parse().unwrap_or(-1),
    }
}

/// (capacity, maximumVolumeSize) per zone.
fn sizes(objects: &BTreeMap<String, CSIStorageCapacity>) -> BTreeMap<String, (i64, i64)> {
    objects
        .iter()
        .map(|(zone, object)| {
            (
                zone.clone(),
                (
                    bytes(object.capacity.as_ref()),
                    bytes(object.maximum_volume_size.as_ref()),
                ),
            )
        })
        .collect()
}

async fn wait_sizes(
    cluster: &Cluster,
    driver: &str,
    key: &str,
    want: &[(&str, i64, i64)],
) -> BTreeMap<String, CSIStorageCapacity> {
    let want: BTreeMap<String, (i64, i64)> = want
        .iter()
        .map(|(zone, capacity, maximum)| ((*zone).to_owned(), (*capacity, *maximum)))
        .collect();
    support::eventually("the CSIStorageCapacity objects", TIMEOUT, || async {
        let listed = objects_by_zone(&cluster.client, cluster.ns(), driver, key).await;
        if sizes(&listed.by_zone) == want && listed.duplicates == 0 {
            Ok(listed.by_zone)
        } else {
            Err(format!(
                "{:?}, {} duplicates",
                sizes(&listed.by_zone),
                listed.duplicates
            ))
        }
    })
    .await
}

/// A CSIDriver object for `driver` with `storageCapacity: true`, deleted by [`Self::delete`]
/// at the end of the test (a test that fails leaves it: its driver name is unique).
struct CsiDriverObject {
    api: Api<CSIDriver>,
    name: String,
}

impl CsiDriverObject {
    async fn create(client: &Client, name: &str) -> Self {
        let api: Api<CSIDriver> = Api::all(client.clone());
        let object = CSIDriver {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            spec: CSIDriverSpec {
                attach_required: Some(false),
                storage_capacity: Some(true),
                ..CSIDriverSpec::default()
            },
        };
        api.create(&PostParams::default(), &object)
            .await
            .unwrap_or_else(|e| panic!("creating CSIDriver {name}: {e}"));
        CsiDriverObject {
            api,
            name: name.to_owned(),
        }
    }
}

impl CsiDriverObject {
    async fn delete(self) {
        self.api
            .delete(&self.name, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("deleting CSIDriver {}: {e}", self.name));
    }
}

/// Two zones of this test: node-a in z1 (10Gi, volumes up to 10Gi), node-b in z2 (20Gi,
/// volumes up to 15Gi), each with a CSINode listing the driver.
async fn two_zones(topology: &Topology, driver: &Driver, key: &str) {
    for (suffix, zone) in [("node-a", "z1"), ("node-b", "z2")] {
        let node = topology.create_node(suffix, &[(key, zone)]).await;
        topology
            .create_csi_node(&node, driver.name(), &format!("id-{node}"), &[key])
            .await;
    }
}

fn sidecar_options(namespace: &str, args: &[&str], pod: Option<&str>) -> SidecarOptions {
    let mut env = vec![("NAMESPACE", namespace.to_owned())];
    if let Some(pod) = pod {
        env.push(("POD_NAME", pod.to_owned()));
    }
    SidecarOptions {
        args: args.iter().map(|arg| (*arg).to_owned()).collect(),
        metrics: true,
        env,
        ..SidecarOptions::default()
    }
}

#[tokio::test]
async fn objects_per_zone_follow_capacity_and_guide_the_scheduler() {
    let (cluster, topology) = scheduling_cluster("capacity").await;
    let key = format!("{}.example/zone", cluster.ns());
    let driver = Driver::start(&[
        "--segment",
        &format!("{key}=z1:10Gi"),
        "--segment",
        &format!("{key}=z2:20Gi"),
        "--max-volume-size=15Gi",
    ])
    .await;
    let csi_driver = CsiDriverObject::create(&cluster.client, driver.name()).await;
    two_zones(&topology, &driver, &key).await;
    let class = topology.wffc_class("wffc", driver.name()).await;
    // The owner (level 0): a Pod of this test, as the sidecar's own would be.
    topology.create_pod("sidecar", &[], &[]).await;
    let pod: Pod = Api::namespaced(cluster.client.clone(), cluster.ns())
        .get("sidecar")
        .await
        .expect("the owner pod");
    let mut sidecar = Sidecar::start_with(
        &driver,
        sidecar_options(
            cluster.ns(),
            &[
                "--enable-capacity",
                "--capacity-ownerref-level=0",
                // Long: every update below comes from a refresh or a watch event.
                "--capacity-poll-interval=1h",
                "--retry-interval-start=200ms",
                "--retry-interval-max=2s",
            ],
            Some("sidecar"),
        ),
    );

    // One object per (zone, class), as upstream's.
    let objects = wait_sizes(
        &cluster,
        driver.name(),
        &key,
        &[("z1", 10 * GI, 10 * GI), ("z2", 20 * GI, 15 * GI)],
    )
    .await;
    for (zone, object) in &objects {
        let meta = &object.metadata;
        assert!(
            meta.name
                .as_deref()
                .unwrap_or_default()
                .starts_with("csisc-")
        );
        assert_eq!(meta.generate_name.as_deref(), Some("csisc-"));
        assert_eq!(
            meta.labels.clone().unwrap_or_default(),
            BTreeMap::from([
                (
                    "csi.storage.k8s.io/drivername".to_owned(),
                    driver.name().to_owned()
                ),
                (
                    "csi.storage.k8s.io/managed-by".to_owned(),
                    "external-provisioner".to_owned()
                ),
            ])
        );
        let owners = meta.owner_references.clone().unwrap_or_default();
        assert_eq!(owners.len(), 1, "{zone}: {owners:?}");
        assert_eq!(owners[0].kind, "Pod");
        assert_eq!(owners[0].name, "sidecar");
        assert_eq!(Some(&owners[0].uid), pod.metadata.uid.as_ref());
        assert_eq!(owners[0].controller, Some(true));
        assert_eq!(object.storage_class_name, class);
        let selector = object.node_topology.clone().expect("a node selector");
        assert_eq!(
            selector.match_labels,
            Some(BTreeMap::from([(key.clone(), zone.clone())]))
        );
        assert_eq!(selector.match_expressions, None);
    }

    // The gauges (set when the controller sees the objects, which may follow the list above).
    sidecar.wait_metrics().await;
    support::eventually("the capacity gauges", TIMEOUT, || async {
        let page = sidecar.metrics()?;
        let samples = parse_metrics(&page);
        let gauges = [
            "csistoragecapacities_desired_goal",
            "csistoragecapacities_desired_current",
            "csistoragecapacities_obsolete",
        ]
        .map(|name| metric_sum(&samples, name, &[]));
        // The capacity queue, as upstream's `csistoragecapacity`: each object's work added,
        // taken and done.
        let queue = |series: &str| metric_sum(&samples, series, &[("name", "csistoragecapacity")]);
        let work = [
            queue("workqueue_adds_total"),
            queue("workqueue_work_duration_seconds_count"),
        ];
        if gauges == [2.0, 2.0, 0.0] && work[0] >= 2.0 && work[1] >= 2.0 {
            Ok(())
        } else {
            Err(format!("gauges {gauges:?}, queue adds and work {work:?}"))
        }
    })
    .await;

    // A 12Gi claim fits only zone 2's maximum volume size: the scheduler puts its pod there,
    // and the provisioning refreshes zone 2's object at once (the poll is an hour away).
    create_claim(&cluster.claims, &claim("fits-z2", &class, "12Gi", None)).await;
    topology.create_pod("app", &["fits-z2"], &[]).await;
    let node = topology.wait_pod_scheduled("app").await;
    assert_eq!(node, topology.node_name("node-b"));
    let bound = wait_bound(&cluster.claims, "fits-z2").await;
    let pv = cluster
        .pv(bound
            .spec
            .and_then(|s| s.volume_name)
            .as_deref()
            .unwrap_or_default())
        .await;
    assert_eq!(
        pv_segments(&pv),
        vec![BTreeMap::from([(key.clone(), "z2".to_owned())])]
    );
    wait_sizes(
        &cluster,
        driver.name(),
        &key,
        &[("z1", 10 * GI, 10 * GI), ("z2", 8 * GI, 8 * GI)],
    )
    .await;

    // Too big for every zone: the scheduler finds no node for lack of capacity (its
    // VolumeBinding plugin's reason) and the driver gets no CreateVolume.
    let creates = driver.create_volume_requests().len();
    create_claim(&cluster.claims, &claim("too-big", &class, "11Gi", None)).await;
    topology.create_pod("too-big", &["too-big"], &[]).await;
    support::eventually(
        "the scheduler to give up on pod too-big",
        TIMEOUT,
        || async {
            let pod: Pod = Api::namespaced(cluster.client.clone(), cluster.ns())
                .get("too-big")
                .await
                .map_err(|e| e.to_string())?;
            let scheduled = pod
                .status
                .and_then(|status| status.conditions)
                .unwrap_or_default()
                .into_iter()
                .find(|c| c.type_ == "PodScheduled");
            match scheduled {
                Some(c)
                    if c.status == "False"
                        && c.message.as_deref().is_some_and(|message| {
                            message.contains("node(s) did not have enough free storage")
                        }) =>
                {
                    Ok(())
                }
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    assert_eq!(topology.selected_node("too-big").await, None);
    assert_eq!(driver.create_volume_requests().len(), creates);

    // Someone deletes an object: it is created again.
    let api: Api<CSIStorageCapacity> = Api::namespaced(cluster.client.clone(), cluster.ns());
    let objects = objects_by_zone(&cluster.client, cluster.ns(), driver.name(), &key)
        .await
        .by_zone;
    let z1_name = objects["z1"].metadata.name.clone().expect("name");
    api.delete(&z1_name, &DeleteParams::default())
        .await
        .expect("deleting an object");
    support::eventually("zone 1's object to be created again", TIMEOUT, || async {
        let listed = objects_by_zone(&cluster.client, cluster.ns(), driver.name(), &key).await;
        match listed
            .by_zone
            .get("z1")
            .and_then(|o| o.metadata.name.clone())
        {
            Some(name)
                if name != z1_name && listed.by_zone.len() == 2 && listed.duplicates == 0 =>
            {
                Ok(())
            }
            other => Err(format!("{other:?}, {} duplicates", listed.duplicates)),
        }
    })
    .await;

    // An object with our labels that no item wants: deleted.
    let mut foreign = objects["z1"].clone();
    foreign.metadata = ObjectMeta {
        name: Some("foreign".to_owned()),
        labels: foreign.metadata.labels.clone(),
        ..ObjectMeta::default()
    };
    foreign.storage_class_name = "no-such-class".to_owned();
    api.create(&PostParams::default(), &foreign)
        .await
        .expect("creating a foreign object");
    support::eventually("the foreign object to be deleted", TIMEOUT, || async {
        match api.get_opt("foreign").await.map_err(|e| e.to_string())? {
            None => Ok(()),
            Some(_) => Err("still there".to_owned()),
        }
    })
    .await;

    // The class goes: its objects go.
    let classes: Api<k8s_openapi::api::storage::v1::StorageClass> =
        Api::all(cluster.client.clone());
    classes
        .delete(&class, &DeleteParams::default())
        .await
        .expect("deleting the class");
    wait_sizes(&cluster, driver.name(), &key, &[]).await;
    sidecar.assert_running();
    csi_driver.delete().await;
}

// ------------------------------------------------------------------------ start-up errors

/// Starts the sidecar and returns its log once it has exited 1.
async fn exit_log(driver: &Driver, options: SidecarOptions) -> String {
    let mut sidecar = Sidecar::start_with(driver, options);
    let status = sidecar.wait_exit(TIMEOUT).await;
    assert_eq!(
        status.code(),
        Some(1),
        "{}: {}",
        describe(status),
        sidecar.log()
    );
    sidecar.log()
}

#[tokio::test]
async fn start_up_errors_name_what_is_missing() {
    let (cluster, topology) = scheduling_cluster("capacity-errors").await;
    let driver = Driver::start(&[]).await;
    let ns = cluster.ns();

    let log = exit_log(
        &driver,
        SidecarOptions {
            args: vec!["--enable-capacity".to_owned()],
            ..SidecarOptions::default()
        },
    )
    .await;
    assert!(
        log.contains("csi-provisioner: need NAMESPACE env variable for CSIStorageCapacity objects"),
        "{log}"
    );

    let log = exit_log(&driver, sidecar_options(ns, &["--enable-capacity"], None)).await;
    assert!(
        log.contains(
            "csi-provisioner: need POD_NAME env variable to determine CSIStorageCapacity owner"
        ),
        "{log}"
    );

    // Level 2 from a Pod that has no controller.
    topology.create_pod("lonely", &[], &[]).await;
    let log = exit_log(
        &driver,
        sidecar_options(
            ns,
            &["--enable-capacity", "--capacity-ownerref-level=2"],
            Some("lonely"),
        ),
    )
    .await;
    let want = format!(
        "csi-provisioner: look up owner(s) of pod: v1/Pod \"lonely\" in namespace \"{ns}\" has no controlling owner, cannot unwind the ownership further"
    );
    assert!(log.contains(&want), "{log}");

    let without_capacity = Driver::start(&["--no-get-capacity"]).await;
    let log = exit_log(
        &without_capacity,
        sidecar_options(
            ns,
            &["--enable-capacity", "--capacity-ownerref-level=-1"],
            None,
        ),
    )
    .await;
    let want = format!(
        "csi-provisioner: --enable-capacity: the CSI driver \"{}\" does not report the GET_CAPACITY controller capability, so it cannot report capacity",
        without_capacity.name()
    );
    assert!(log.contains(&want), "{log}");
}

/// A driver without topology gets one object per class with an empty selector (all nodes), and
/// it stays: upstream compares its wanted empty `matchLabels` with the stored absent one, never
/// finds its object, and deletes and re-creates it at every poll (A10). Here the object keeps
/// its UID across polls, counted by the GetCapacity calls the sidecar reports.
#[tokio::test]
async fn without_topology_one_object_per_class_stays_across_polls() {
    // No Nodes here, but the binary's other tests need kube-scheduler: whichever test comes
    // first starts it.
    support::control_plane_with_scheduler();
    let cluster = Cluster::new("capacity-flat").await;
    let driver = Driver::start(&["--capacity=5Gi"]).await;
    let class = cluster.class("flat", &driver, "Delete", &[]).await;
    let options = sidecar_options(
        cluster.ns(),
        &[
            "--enable-capacity",
            "--capacity-ownerref-level=-1",
            "--capacity-poll-interval=1s",
            "--capacity-for-immediate-binding",
        ],
        None,
    );
    let mut sidecar = Sidecar::start_with(&driver, options);
    let api: Api<CSIStorageCapacity> = Api::namespaced(cluster.client.clone(), cluster.ns());
    let selector = format!("csi.storage.k8s.io/drivername={}", driver.name());
    let listed = || async {
        api.list(&ListParams::default().labels(&selector))
            .await
            .map_err(|e| e.to_string())
            .map(|list| list.items)
    };
    let first = support::eventually("one object for the class", TIMEOUT, || async {
        match listed().await?.as_slice() {
            [object] if object.storage_class_name == class && object.capacity.is_some() => {
                Ok(object.clone())
            }
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let selects_all = first.node_topology.as_ref().is_none_or(|selector| {
        selector
            .match_labels
            .as_ref()
            .is_none_or(|labels| labels.is_empty())
            && selector
                .match_expressions
                .as_ref()
                .is_none_or(|expressions| expressions.is_empty())
    });
    assert!(selects_all, "{:?}", first.node_topology);
    let calls = |page: &str| {
        metric_sum(
            &parse_metrics(page),
            "csi_sidecar_operations_seconds_count",
            &[("method_name", "/csi.v1.Controller/GetCapacity")],
        )
    };
    let polled_at_first = calls(&sidecar.wait_metrics().await);
    support::eventually("three more polls", TIMEOUT, || async {
        let page = sidecar.metrics()?;
        let polled = calls(&page);
        (polled >= polled_at_first + 3.0)
            .then_some(())
            .ok_or(format!("{polled} GetCapacity calls"))
    })
    .await;
    let objects = listed().await.expect("listing the objects");
    let uids: Vec<_> = objects.iter().map(|o| o.metadata.uid.clone()).collect();
    assert_eq!(
        uids,
        vec![first.metadata.uid.clone()],
        "the object was replaced or duplicated"
    );
    sidecar.assert_running();
}
