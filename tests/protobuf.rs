//! The protobuf path against the API server: every cached kind read from protobuf equals the
//! same object read from the JSON the API server serves (field by field, through the cached
//! forms the reconcilers get), the protobuf watch streams its initial events and then changes,
//! and errors arrive as the API server's `Status`.

use std::collections::BTreeMap;

use csi_provisioner::controller::cache::{CachedAttachment, CachedClaim, CachedVolume};
use csi_provisioner::kube_client::protobuf::{self, ACCEPT, FromProtobuf};
use csi_provisioner::kube_client::protobuf_watch;
use csi_test_support as support;
use futures::{StreamExt, TryStreamExt};
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use serde_json::json;
use support::cluster::{Cluster, wait_bound};
use support::peers::{Driver, Sidecar};

/// GETs `path` accepting `accept`; the HTTP status, content type and body.
async fn get_accepting(client: &Client, path: &str, accept: &str) -> (u16, String, Vec<u8>) {
    let request = http::Request::get(path)
        .header(http::header::ACCEPT, accept)
        .body(kube::client::Body::empty())
        .unwrap();
    let response = client.send(request).await.expect("GET");
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .map(|value| value.to_str().unwrap_or_default().to_owned())
        .unwrap_or_default();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, content_type, body.to_vec())
}

/// GETs `path` asking for protobuf; the HTTP status and the body.
async fn get_protobuf(client: &Client, path: &str) -> (u16, Vec<u8>) {
    let (status, content_type, body) = get_accepting(client, path, ACCEPT).await;
    if status == 200 {
        assert_eq!(
            content_type,
            protobuf::CONTENT_TYPE,
            "the API server answered {content_type}"
        );
    }
    (status, body)
}

/// The object read both ways: from JSON (kube's path, the `Wire*` types) and from protobuf.
/// The controller manager may change it between the two reads (a PV's phase): read again until
/// both are of the same version.
async fn both_ways<K>(client: &Client, api: &Api<K>, name: &str) -> (K, K)
where
    K: Resource + FromProtobuf + Clone + DeserializeOwned + std::fmt::Debug,
{
    let path = format!("{}/{name}", api.resource_url());
    for _ in 0..20 {
        let from_json = api.get(name).await.expect("JSON GET");
        let (status, body) = get_protobuf(client, &path).await;
        assert_eq!(status, 200, "protobuf GET {path}");
        let from_protobuf = protobuf::decode_object::<K>(&body).expect("protobuf decode");
        if from_json.meta().resource_version == from_protobuf.meta().resource_version {
            return (from_json, from_protobuf);
        }
    }
    panic!("{path} kept changing between the two reads");
}

async fn create<K>(api: &Api<K>, object: serde_json::Value) -> K
where
    K: Resource + Clone + DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let object: K = serde_json::from_value(object).expect("a valid object");
    api.create(&PostParams::default(), &object)
        .await
        .expect("create")
}

/// Claims with every field the cached form keeps, set and unset: empty and absent class,
/// selectors, limits, both data sources, the attributes class, annotations (with kubectl's
/// last-applied copy, which the cache drops), finalizers, a deletion under way.
fn claims(ns: &str) -> Vec<serde_json::Value> {
    let spec = |extra: serde_json::Value| {
        let mut spec = json!({
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
        });
        spec.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        spec
    };
    vec![
        json!({"metadata": {"name": "plain", "namespace": ns}, "spec": spec(json!({"storageClassName": "gold"}))}),
        json!({"metadata": {"name": "empty-class", "namespace": ns}, "spec": spec(json!({"storageClassName": ""}))}),
        json!({"metadata": {"name": "no-class", "namespace": ns}, "spec": spec(json!({}))}),
        json!({
            "metadata": {
                "name": "full",
                "namespace": ns,
                "labels": {"app": "db"},
                "annotations": {
                    "volume.kubernetes.io/storage-provisioner": "pb.csi",
                    "kubectl.kubernetes.io/last-applied-configuration": "{\"a\":1}",
                    "empty": "",
                },
                "finalizers": ["example.com/keep"],
            },
            "spec": spec(json!({
                "accessModes": ["ReadWriteOnce", "ReadOnlyMany"],
                "resources": {"requests": {"storage": "1500Mi"}, "limits": {"storage": "2Gi"}},
                "storageClassName": "gold",
                "volumeMode": "Block",
                "volumeName": "pv-x",
                "volumeAttributesClassName": "fast",
                "selector": {
                    "matchLabels": {"tier": "a"},
                    "matchExpressions": [
                        {"key": "zone", "operator": "In", "values": ["z1", "z2"]},
                        {"key": "gone", "operator": "DoesNotExist"},
                    ],
                },
                "dataSource": {"kind": "PersistentVolumeClaim", "name": "plain"},
                "dataSourceRef": {"kind": "PersistentVolumeClaim", "name": "plain"},
            })),
        }),
        json!({
            "metadata": {"name": "snapshot-source", "namespace": ns},
            "spec": spec(json!({
                "storageClassName": "gold",
                "dataSource": {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "snap"},
                "dataSourceRef": {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "snap"},
            })),
        }),
    ]
}

/// PVs of every source the cached form keeps (CSI and the seven migrated in-tree plugins),
/// zero values and set ones.
fn volumes(prefix: &str) -> Vec<serde_json::Value> {
    let pv = |name: &str, source: serde_json::Value, extra: serde_json::Value| {
        let mut spec = json!({
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
        });
        spec.as_object_mut()
            .unwrap()
            .extend(source.as_object().unwrap().clone());
        spec.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        json!({"metadata": {"name": format!("{prefix}-{name}")}, "spec": spec})
    };
    vec![
        pv(
            "csi",
            json!({"csi": {"driver": "pb.csi", "volumeHandle": "h1", "fsType": "ext4",
                "volumeAttributes": {"storage.kubernetes.io/csiProvisionerIdentity": "123-pb.csi", "other": "x"}}}),
            json!({
                "persistentVolumeReclaimPolicy": "Delete",
                "storageClassName": "gold",
                "nodeAffinity": {"required": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]},
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
                ]}},
            }),
        ),
        pv(
            "csi-bare",
            json!({"csi": {"driver": "pb.csi", "volumeHandle": "h2"}}),
            json!({"persistentVolumeReclaimPolicy": "Retain"}),
        ),
        pv(
            "gce",
            json!({"gcePersistentDisk": {"pdName": "disk"}}),
            json!({}),
        ),
        pv(
            "aws",
            json!({"awsElasticBlockStore": {"volumeID": "vol", "fsType": "xfs", "partition": 2, "readOnly": true}}),
            json!({}),
        ),
        pv(
            "azure-disk",
            json!({"azureDisk": {"diskName": "d", "diskURI": "https://example/d", "readOnly": false}}),
            json!({}),
        ),
        pv(
            "azure-file",
            json!({"azureFile": {"secretName": "s", "shareName": "share", "secretNamespace": "other"}}),
            json!({}),
        ),
        pv(
            "cinder",
            json!({"cinder": {"volumeID": "c", "secretRef": {"name": "s", "namespace": "other"}}}),
            json!({}),
        ),
        pv(
            "vsphere",
            json!({"vsphereVolume": {"volumePath": "[ds] v.vmdk", "storagePolicyName": "p"}}),
            json!({}),
        ),
        pv(
            "portworx",
            json!({"portworxVolume": {"volumeID": "p", "readOnly": true}}),
            json!({}),
        ),
    ]
}

#[tokio::test]
async fn cached_forms_read_the_same_from_protobuf_and_json() {
    let cluster = Cluster::new("protobuf").await;
    let ns = cluster.ns().to_owned();
    let client = cluster.client.clone();

    let claim_api = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns);
    let cached_claims = Api::<CachedClaim>::namespaced(client.clone(), &ns);
    let mut claim_names = Vec::new();
    for claim in claims(&ns) {
        let created = create(&claim_api, claim).await;
        claim_names.push(created.metadata.name.unwrap());
    }
    // A deletion under way (held by the finalizer): the deletion timestamp is read too.
    claim_api
        .delete("full", &DeleteParams::default())
        .await
        .unwrap();
    // Status is written through its subresource, as the PV controller does.
    claim_api
        .patch_status(
            "plain",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Lost"}})),
        )
        .await
        .unwrap();

    for name in &claim_names {
        let (json, pb) = both_ways(&client, &cached_claims, name).await;
        assert_eq!(json.metadata, pb.metadata, "claim {name}: identity");
        assert_eq!(
            json.to_claim().unwrap(),
            pb.to_claim().unwrap(),
            "claim {name}: the rest"
        );
    }
    let full = both_ways(&client, &cached_claims, "full").await.1;
    assert!(full.metadata.deletion_timestamp.is_some());
    let full = full.to_claim().unwrap();
    let annotations = full.metadata.annotations.unwrap();
    assert!(!annotations.contains_key("kubectl.kubernetes.io/last-applied-configuration"));
    assert_eq!(annotations.get("empty").map(String::as_str), Some(""));

    let pv_api = Api::<PersistentVolume>::all(client.clone());
    let cached_volumes = Api::<CachedVolume>::all(client.clone());
    let mut pv_names = Vec::new();
    for volume in volumes(&ns) {
        let created = create(&pv_api, volume).await;
        pv_names.push(created.metadata.name.unwrap());
    }
    for name in &pv_names {
        let (json, pb) = both_ways(&client, &cached_volumes, name).await;
        assert_eq!(json.metadata, pb.metadata, "PV {name}: identity");
        assert_eq!(
            json.to_volume().unwrap(),
            pb.to_volume().unwrap(),
            "PV {name}: the rest"
        );
    }

    let va_api = Api::<VolumeAttachment>::all(client.clone());
    let cached_attachments = Api::<CachedAttachment>::all(client.clone());
    let va_name = format!("{ns}-va");
    create(
        &va_api,
        json!({
            "metadata": {"name": va_name},
            "spec": {"attacher": "pb.csi", "nodeName": "n1", "source": {"persistentVolumeName": format!("{ns}-csi")}},
        }),
    )
    .await;
    let (json, pb) = both_ways(&client, &cached_attachments, &va_name).await;
    assert_eq!(json.metadata, pb.metadata);
    assert_eq!(json.attachment(), pb.attachment());

    // Errors come as the API server's Status, in protobuf.
    let (status, body) =
        get_protobuf(&client, &format!("{}/absent", cached_claims.resource_url())).await;
    let error = protobuf::error_status(status, &body);
    assert_eq!(
        (error.code, error.reason.as_str()),
        (404, "NotFound"),
        "{error:?}"
    );

    claim_api
        .patch(
            "full",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    for name in &pv_names {
        pv_api.delete(name, &DeleteParams::default()).await.unwrap();
    }
    va_api
        .delete(&va_name, &DeleteParams::default())
        .await
        .unwrap();
}

/// The next event of `events` for an object of namespace `ns` (and named `name`, if given:
/// the controller manager changes the namespace's other claims meanwhile).
async fn next_in<S>(events: &mut S, ns: &str, name: Option<&str>) -> Event<CachedClaim>
where
    S: futures::Stream<Item = Result<Event<CachedClaim>, watcher::Error>> + Unpin,
{
    loop {
        let event = events
            .try_next()
            .await
            .expect("watch")
            .expect("stream ended");
        let wanted = |claim: &CachedClaim| {
            claim.metadata.namespace.as_deref() == Some(ns)
                && name.is_none_or(|name| claim.metadata.name.as_deref() == Some(name))
        };
        match &event {
            Event::Apply(claim) | Event::Delete(claim) | Event::InitApply(claim)
                if !wanted(claim) => {}
            _ => return event,
        }
    }
}

#[tokio::test]
async fn the_protobuf_watch_streams_the_initial_claims_then_their_changes() {
    let cluster = Cluster::new("protobuf-watch").await;
    let ns = cluster.ns().to_owned();
    let claim_api = Api::<PersistentVolumeClaim>::namespaced(cluster.client.clone(), &ns);
    let mut existing = BTreeMap::new();
    for claim in claims(&ns) {
        let created: PersistentVolumeClaim = create(&claim_api, claim).await;
        existing.insert(
            created.metadata.name.clone().unwrap(),
            created.metadata.uid.clone().unwrap(),
        );
    }

    for config in [
        watcher::Config::default().any_semantic().streaming_lists(),
        watcher::Config::default().any_semantic(),
    ] {
        let streamed = config.initial_list_strategy == watcher::InitialListStrategy::StreamingList;
        let mut events =
            protobuf_watch::watcher::<CachedClaim>(cluster.client.clone(), config).boxed();
        assert!(matches!(next_in(&mut events, &ns, None).await, Event::Init));
        let mut initial = BTreeMap::new();
        loop {
            match next_in(&mut events, &ns, None).await {
                Event::InitApply(claim) => {
                    initial.insert(
                        claim.metadata.name.clone().unwrap(),
                        claim.metadata.uid.clone().unwrap(),
                    );
                }
                Event::InitDone => break,
                other => panic!("streamed={streamed}: unexpected {other:?} before InitDone"),
            }
        }
        assert_eq!(initial, existing, "streamed={streamed}");

        let name = format!("new-{streamed}");
        let mut claim = claims(&ns).remove(0);
        claim["metadata"]["name"] = json!(name);
        let created: PersistentVolumeClaim = create(&claim_api, claim).await;
        match next_in(&mut events, &ns, Some(&name)).await {
            Event::Apply(claim) => assert_eq!(claim.metadata.uid, created.metadata.uid),
            other => panic!("streamed={streamed}: expected the new claim, got {other:?}"),
        }
        claim_api
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {"changed": "yes"}}})),
            )
            .await
            .unwrap();
        match next_in(&mut events, &ns, Some(&name)).await {
            Event::Apply(claim) => {
                let annotations = claim.to_claim().unwrap().metadata.annotations.unwrap();
                assert_eq!(annotations["changed"], "yes");
            }
            other => panic!("streamed={streamed}: expected the change, got {other:?}"),
        }
        claim_api
            .delete(&name, &DeleteParams::default())
            .await
            .unwrap();
        // pvc-protection's finalizer: the deletion timestamp first, then the deletion.
        loop {
            match next_in(&mut events, &ns, Some(&name)).await {
                Event::Apply(claim) if claim.metadata.deletion_timestamp.is_some() => {}
                Event::Delete(claim) => {
                    assert_eq!(claim.metadata.uid, created.metadata.uid);
                    break;
                }
                other => panic!("streamed={streamed}: expected the deletion, got {other:?}"),
            }
        }
    }
}

/// A watch the API server refuses (a label selector it cannot parse): the answer is its
/// `Status`, in protobuf, read as such.
#[tokio::test]
async fn a_refused_watch_is_read_as_the_api_servers_status() {
    let cluster = Cluster::new("protobuf-status").await;
    let path = format!(
        "{}?watch=true&labelSelector=a%3D%3D%3Db",
        Api::<CachedClaim>::namespaced(cluster.client.clone(), cluster.ns()).resource_url()
    );
    let (code, content_type, body) =
        get_accepting(&cluster.client, &path, protobuf::ACCEPT_WATCH).await;
    assert_eq!(code, 400);
    assert!(
        content_type.starts_with(protobuf::CONTENT_TYPE),
        "{content_type}"
    );
    let status = protobuf::error_status(code, &body);
    assert_eq!(
        (status.code, status.reason.as_str()),
        (400, "BadRequest"),
        "{status:?}"
    );
    assert!(
        status.message.contains("unable to parse requirement"),
        "{status:?}"
    );
}

/// A claim as a client that writes protobuf sends it: an annotation's value may be any bytes,
/// which the API server stores as they are (a Go string).
#[derive(Clone, PartialEq, prost::Message)]
struct RawClaim {
    #[prost(message, optional, tag = "1")]
    metadata: Option<RawClaimMeta>,
    #[prost(message, optional, tag = "2")]
    spec: Option<RawClaimSpec>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RawClaimMeta {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(btree_map = "string, bytes", tag = "12")]
    annotations: BTreeMap<String, Vec<u8>>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RawClaimSpec {
    #[prost(string, repeated, tag = "1")]
    access_modes: Vec<String>,
    #[prost(message, optional, tag = "2")]
    resources: Option<RawResources>,
    #[prost(string, optional, tag = "5")]
    storage_class_name: Option<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RawResources {
    #[prost(btree_map = "string, message", tag = "2")]
    requests: BTreeMap<String, RawQuantity>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RawQuantity {
    #[prost(string, tag = "1")]
    string: String,
}

/// POSTs claim `name` of `class` in protobuf, with the annotation `note` holding `note`.
async fn create_raw_claim(client: &Client, ns: &str, name: &str, class: &str, note: &[u8]) {
    let claim = RawClaim {
        metadata: Some(RawClaimMeta {
            name: name.to_owned(),
            annotations: BTreeMap::from([("note".to_owned(), note.to_vec())]),
        }),
        spec: Some(RawClaimSpec {
            access_modes: vec!["ReadWriteOnce".to_owned()],
            resources: Some(RawResources {
                requests: BTreeMap::from([(
                    "storage".to_owned(),
                    RawQuantity {
                        string: "1Gi".to_owned(),
                    },
                )]),
            }),
            storage_class_name: Some(class.to_owned()),
        }),
    };
    let request = http::Request::post(format!("/api/v1/namespaces/{ns}/persistentvolumeclaims"))
        .header(http::header::CONTENT_TYPE, protobuf::CONTENT_TYPE)
        .body(protobuf::seal_envelope(
            "v1",
            "PersistentVolumeClaim",
            &claim,
        ))
        .unwrap();
    protobuf::write_unread(client, request)
        .await
        .unwrap_or_else(|e| panic!("creating claim {name} in protobuf: {e}"));
}

/// A claim whose annotation is not UTF-8 (stored by a client writing protobuf) is read as the
/// API server's JSON shows it, U+FFFD for each invalid byte, in a GET, a list (the path of an
/// API server without WatchList) and a streamed list, and hides no other claim; the sidecar
/// provisions it and the claims created after it. The code before this test failed the whole
/// list, so nothing was provisioned.
#[tokio::test]
async fn a_claim_with_a_string_that_is_not_utf8_is_read_as_json_shows_it_and_stops_nothing() {
    let cluster = Cluster::new("protobuf-utf8").await;
    let ns = cluster.ns().to_owned();
    let client = cluster.client.clone();
    let driver = Driver::start(&[]).await;
    let class = cluster.class("odd", &driver, "Delete", &[]).await;
    create_raw_claim(&client, &ns, "odd", &class, b"caf\xe9 \xe2\x82 ok").await;
    let shown = "caf\u{FFFD} \u{FFFD}\u{FFFD} ok";

    let cached_claims = Api::<CachedClaim>::namespaced(client.clone(), &ns);
    let (json, pb) = both_ways(&client, &cached_claims, "odd").await;
    assert_eq!(json.metadata, pb.metadata, "identity");
    let (json, pb) = (json.to_claim().unwrap(), pb.to_claim().unwrap());
    assert_eq!(json, pb, "JSON and protobuf read the claim differently");
    assert_eq!(pb.metadata.annotations.unwrap()["note"], shown);

    cluster.claim("plain", &class).await;
    for config in [
        watcher::Config::default().any_semantic().streaming_lists(),
        watcher::Config::default().any_semantic(),
    ] {
        let streamed = config.initial_list_strategy == watcher::InitialListStrategy::StreamingList;
        let mut events = protobuf_watch::watcher::<CachedClaim>(client.clone(), config).boxed();
        let mut initial = BTreeMap::new();
        loop {
            match next_in(&mut events, &ns, None).await {
                Event::Init => {}
                Event::InitApply(claim) => {
                    let claim = claim.to_claim().unwrap();
                    let note = claim
                        .metadata
                        .annotations
                        .unwrap_or_default()
                        .remove("note");
                    initial.insert(claim.metadata.name.unwrap(), note);
                }
                Event::InitDone => break,
                other => panic!("streamed={streamed}: unexpected {other:?} before InitDone"),
            }
        }
        let expected = BTreeMap::from([
            ("odd".to_owned(), Some(shown.to_owned())),
            ("plain".to_owned(), None),
        ]);
        assert_eq!(initial, expected, "streamed={streamed}");
    }

    let mut sidecar = Sidecar::start(&driver, &[]);
    cluster.claim("after", &class).await;
    for name in ["odd", "plain", "after"] {
        wait_bound(&cluster.claims, name).await;
    }
    sidecar.assert_running();
}
