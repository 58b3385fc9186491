//! Watches of claims, volumes and classes (and, for a driver that attaches volumes,
//! VolumeAttachments) feeding in-memory stores.
//!
//! Claims and volumes are cached as [`CachedClaim`] and [`CachedVolume`], built for size: with
//! 10,000 claims and 10,000 volumes the stores are most of the sidecar's memory. Only the
//! fields the sidecar reads are parsed (`managedFields`, often larger than the rest of a PVC or
//! PV together, and the `last-applied-configuration` annotation are skipped, never
//! allocated). What identifies an object (name, namespace, UID, resource version, deletion
//! timestamp) stays in its `ObjectMeta`, which the reflector keys on; the annotations,
//! finalizers and spec are kept as one compact JSON string and parsed again when a reconcile
//! needs them (`to_claim`, `to_volume`). A typed claim costs two `BTreeMap`s of 540 bytes
//! each however few entries they hold, plus a dozen small strings; its JSON, about 200 bytes.
//!
//! On the wire the claims, volumes and attachments come as protobuf (`protobuf.rs`, through
//! `kube_client::protobuf_watch`). The JSON `Wire*` types below read the same fields from JSON:
//! the reconcile fixtures and the simulator build their cached objects with them, and
//! `tests/protobuf.rs` holds the protobuf read against them on the API server's objects.
//!
//! The stores are for deciding *whether* to look at an object. Every decision that could
//! create or delete storage is re-checked against a fresh read from the API server by the
//! reconcilers (see docs/design.md, "Fresh state before acting").

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use futures::future::{BoxFuture, Shared};
use futures::{FutureExt, Stream, StreamExt, TryStreamExt, future};
use k8s_openapi::api::core::v1::{
    AWSElasticBlockStoreVolumeSource, AzureDiskVolumeSource, AzureFilePersistentVolumeSource,
    CSIPersistentVolumeSource, CinderPersistentVolumeSource, GCEPersistentDiskVolumeSource,
    PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PersistentVolumeClaimStatus, PersistentVolumeSpec, PersistentVolumeStatus,
    PortworxVolumeSource, VolumeNodeAffinity, VsphereVirtualDiskVolumeSource,
};
use k8s_openapi::api::storage::v1::{StorageClass, VolumeAttachment};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{WatchEvent, WatchParams};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use tracing::info;

use crate::kube_client::protobuf::FromProtobuf;
use crate::kube_client::protobuf_watch;
use crate::provision::{Attachment, PROVISIONER_IDENTITY_KEY};

const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// A cached object's fields that are kept as JSON could not be read back.
#[derive(Debug, thiserror::Error)]
#[error("cached {kind} {name} is unreadable: {source}")]
pub struct CacheError {
    kind: &'static str,
    name: String,
    source: serde_json::Error,
}

/// A claim as cached: identity in `metadata`, the rest as JSON (see the module comment); of
/// the status only the phase is kept.
#[derive(Clone, Debug, Deserialize, Resource)]
#[resource(inherit = PersistentVolumeClaim)]
#[serde(try_from = "WireClaim")]
pub struct CachedClaim {
    pub metadata: ObjectMeta,
    rest: Box<str>,
}

impl CachedClaim {
    pub fn to_claim(&self) -> Result<PersistentVolumeClaim, CacheError> {
        let (metadata, spec, status) =
            read_rest::<_, CachedClaimStatus>(&self.metadata, &self.rest).map_err(|source| {
                CacheError {
                    kind: "PersistentVolumeClaim",
                    name: format!(
                        "{}/{}",
                        self.metadata.namespace.as_deref().unwrap_or_default(),
                        self.metadata.name.as_deref().unwrap_or_default()
                    ),
                    source,
                }
            })?;
        Ok(PersistentVolumeClaim {
            metadata,
            spec,
            status: status.map(|status| PersistentVolumeClaimStatus {
                phase: status.phase,
                ..PersistentVolumeClaimStatus::default()
            }),
        })
    }
}

impl TryFrom<WireClaim> for CachedClaim {
    type Error = serde_json::Error;

    fn try_from(wire: WireClaim) -> Result<Self, Self::Error> {
        let (metadata, rest) = split(wire.metadata, wire.spec, wire.status)?;
        Ok(CachedClaim { metadata, rest })
    }
}

/// A volume as cached: what tells whether the volume reconciler has work (the provisioner
/// annotation or CSI driver, finalizers, reclaim policy, phase) and the class for metrics.
/// Deletion itself reads the whole PV again from the API server.
#[derive(Clone, Debug, Deserialize, Resource)]
#[resource(inherit = PersistentVolume)]
#[serde(try_from = "WireVolume")]
pub struct CachedVolume {
    pub metadata: ObjectMeta,
    rest: Box<str>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
struct CachedVolumeSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    csi: Option<CachedCsiSource>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    persistent_volume_reclaim_policy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    storage_class_name: Option<String>,
    /// Node mode decides by it which node deletes the PV (`provision::volume_on_node`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    node_affinity: Option<VolumeNodeAffinity>,
    // The in-tree sources of the seven migrated plugins (`provision::has_deletable_source`,
    // `pv_holds_volume`); absent, and free, on CSI PVs. Not flattened into a struct of their
    // own: serde's flatten buffers every other field of every PV while parsing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gce_persistent_disk: Option<GCEPersistentDiskVolumeSource>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    aws_elastic_block_store: Option<AWSElasticBlockStoreVolumeSource>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    azure_disk: Option<AzureDiskVolumeSource>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    azure_file: Option<AzureFilePersistentVolumeSource>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cinder: Option<CinderPersistentVolumeSource>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    vsphere_volume: Option<VsphereVirtualDiskVolumeSource>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    portworx_volume: Option<PortworxVolumeSource>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
struct CachedCsiSource {
    #[serde(default)]
    driver: String,
    #[serde(default)]
    volume_handle: String,
    /// Only the provisioner identity, which names the node that created a PV in node mode;
    /// the other attributes (the driver's own, often many) are dropped while parsing.
    #[serde(
        default,
        deserialize_with = "identity_only",
        skip_serializing_if = "Option::is_none"
    )]
    volume_attributes: Option<BTreeMap<String, String>>,
}

fn identity_only<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    Option::<BTreeMap<String, String>>::deserialize(deserializer).map(identity_kept)
}

/// Of a CSI PV's attributes, the provisioner identity only.
fn identity_kept(attributes: Option<BTreeMap<String, String>>) -> Option<BTreeMap<String, String>> {
    attributes
        .and_then(|mut attributes| attributes.remove_entry(PROVISIONER_IDENTITY_KEY))
        .map(|entry| BTreeMap::from([entry]))
}

#[derive(Debug, Deserialize, Serialize)]
struct CachedVolumeStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    phase: Option<String>,
}

impl CachedVolume {
    /// The PV with the cached fields only: enough for the triage, not for DeleteVolume.
    pub fn to_volume(&self) -> Result<PersistentVolume, CacheError> {
        let (metadata, spec, status) =
            read_rest::<CachedVolumeSpec, CachedVolumeStatus>(&self.metadata, &self.rest).map_err(
                |source| CacheError {
                    kind: "PersistentVolume",
                    name: self.metadata.name.clone().unwrap_or_default(),
                    source,
                },
            )?;
        Ok(PersistentVolume {
            metadata,
            spec: spec.map(|spec| PersistentVolumeSpec {
                csi: spec.csi.map(|csi| CSIPersistentVolumeSource {
                    driver: csi.driver,
                    volume_handle: csi.volume_handle,
                    volume_attributes: csi.volume_attributes,
                    ..CSIPersistentVolumeSource::default()
                }),
                persistent_volume_reclaim_policy: spec.persistent_volume_reclaim_policy,
                storage_class_name: spec.storage_class_name,
                node_affinity: spec.node_affinity,
                gce_persistent_disk: spec.gce_persistent_disk,
                aws_elastic_block_store: spec.aws_elastic_block_store,
                azure_disk: spec.azure_disk,
                azure_file: spec.azure_file,
                cinder: spec.cinder,
                vsphere_volume: spec.vsphere_volume,
                portworx_volume: spec.portworx_volume,
                ..PersistentVolumeSpec::default()
            }),
            status: status.map(|status| PersistentVolumeStatus {
                phase: status.phase,
                ..PersistentVolumeStatus::default()
            }),
        })
    }
}

impl TryFrom<WireVolume> for CachedVolume {
    type Error = serde_json::Error;

    fn try_from(wire: WireVolume) -> Result<Self, Self::Error> {
        let (metadata, rest) = split(wire.metadata, wire.spec, wire.status)?;
        Ok(CachedVolume { metadata, rest })
    }
}

/// A VolumeAttachment as cached: its name, and the PV and node of the attach check; the
/// attacher, inline volume sources and status are never read.
#[derive(Clone, Debug, Deserialize, Resource)]
#[resource(inherit = VolumeAttachment)]
#[serde(from = "WireAttachment")]
pub struct CachedAttachment {
    pub metadata: ObjectMeta,
    persistent_volume_name: Option<Box<str>>,
    node_name: Box<str>,
}

impl CachedAttachment {
    pub fn attachment(&self) -> Attachment<'_> {
        Attachment {
            name: self.metadata.name.as_deref().unwrap_or_default(),
            persistent_volume_name: self.persistent_volume_name.as_deref(),
            node_name: &self.node_name,
        }
    }
}

impl From<WireAttachment> for CachedAttachment {
    fn from(wire: WireAttachment) -> Self {
        let spec = wire.spec.unwrap_or_default();
        CachedAttachment {
            metadata: ObjectMeta {
                name: wire.metadata.name,
                resource_version: wire.metadata.resource_version,
                ..ObjectMeta::default()
            },
            persistent_volume_name: spec
                .source
                .and_then(|source| source.persistent_volume_name)
                .map(String::into_boxed_str),
            node_name: spec.node_name.into_boxed_str(),
        }
    }
}

#[derive(Deserialize)]
struct WireAttachment {
    metadata: WireMeta,
    spec: Option<WireAttachmentSpec>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireAttachmentSpec {
    #[serde(default)]
    node_name: String,
    source: Option<WireAttachmentSource>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireAttachmentSource {
    persistent_volume_name: Option<String>,
}

/// A claim's status: the phase only. The protection controllers decide on it (is a clone or
/// a restore still Pending?), as upstream's do from their informer; keeping it costs about 25
/// bytes a claim, where a live list of every claim would cost a request, and a response of
/// every claim held whole, at each decision (13 MiB for 10,000 claims). A phase that lags
/// shows a claim Pending a little longer: its source is kept a little longer, never released
/// early (docs/journal.md, rule 12).
#[derive(Deserialize, Serialize)]
struct CachedClaimStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    phase: Option<String>,
}

/// A claim as the API server sends it, with only the fields the sidecar reads.
#[derive(Deserialize)]
struct WireClaim {
    metadata: WireMeta,
    spec: Option<PersistentVolumeClaimSpec>,
    status: Option<CachedClaimStatus>,
}

/// A volume as the API server sends it, with only the fields the sidecar reads.
#[derive(Deserialize)]
struct WireVolume {
    metadata: WireMeta,
    spec: Option<CachedVolumeSpec>,
    status: Option<CachedVolumeStatus>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireMeta {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    deletion_timestamp: Option<Time>,
    annotations: Option<BTreeMap<String, String>>,
    finalizers: Option<Vec<String>>,
}

/// `Option::default` without requiring `Default` of the type inside, as `#[serde(default)]`
/// on a generic field would.
fn none<T>() -> Option<T> {
    None
}

/// What is kept as JSON.
#[derive(Deserialize, Serialize)]
struct Rest<Spec, Status> {
    #[serde(default = "none", skip_serializing_if = "Option::is_none")]
    annotations: Option<BTreeMap<String, String>>,
    #[serde(default = "none", skip_serializing_if = "Option::is_none")]
    finalizers: Option<Vec<String>>,
    #[serde(default = "none", skip_serializing_if = "Option::is_none")]
    spec: Option<Spec>,
    #[serde(default = "none", skip_serializing_if = "Option::is_none")]
    status: Option<Status>,
}

/// The identity to keep typed, and the rest as JSON.
fn split<Spec: Serialize, Status: Serialize>(
    metadata: WireMeta,
    spec: Option<Spec>,
    status: Option<Status>,
) -> Result<(ObjectMeta, Box<str>), serde_json::Error> {
    let WireMeta {
        name,
        namespace,
        uid,
        resource_version,
        deletion_timestamp,
        mut annotations,
        finalizers,
    } = metadata;
    if let Some(annotations) = annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
    }
    let rest = serde_json::to_string(&Rest {
        annotations,
        finalizers,
        spec,
        status,
    })?;
    let identity = ObjectMeta {
        name,
        namespace,
        uid,
        resource_version,
        deletion_timestamp,
        ..ObjectMeta::default()
    };
    Ok((identity, rest.into_boxed_str()))
}

/// The metadata as the API server sent it (minus the fields never read), spec and status.
type Parts<Spec, Status> = (ObjectMeta, Option<Spec>, Option<Status>);

fn read_rest<Spec: DeserializeOwned, Status: DeserializeOwned>(
    identity: &ObjectMeta,
    rest: &str,
) -> Result<Parts<Spec, Status>, serde_json::Error> {
    let Rest {
        annotations,
        finalizers,
        spec,
        status,
    } = serde_json::from_str(rest)?;
    let metadata = ObjectMeta {
        annotations,
        finalizers,
        ..identity.clone()
    };
    Ok((metadata, spec, status))
}

/// How the watches read the objects already present, at start and after a `410 Gone`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InitialList {
    /// A watch with `sendInitialEvents=true` (KEP-3157, on by default since Kubernetes 1.34):
    /// the API server streams the objects from its watch cache one event at a time, so no
    /// response holding all of them is ever buffered. With 10,000 claims and 10,000 PVs a
    /// list response is 13 and 18 MiB of JSON, read whole before it is parsed: this keeps the
    /// start-up peak at the steady size. It also costs one request per kind, not two.
    Streamed,
    /// `resourceVersion=0` lists, then watches: for API servers without streaming lists.
    Listed,
}

/// Label selector of the probe: matches nothing, so the answer is only the end bookmark.
const PROBE_SELECTOR: &str = "provisioner.csi-rs.dev/initial-list-probe";
/// Server-side lifetime of the probe watch; an API server that ignores `sendInitialEvents`
/// ends it after this without the bookmark.
const PROBE_SERVER_TIMEOUT_SECS: u32 = 2;
const PROBE_CLIENT_TIMEOUT: Duration = Duration::from_secs(3);
/// The annotation on the bookmark that closes the initial events of a streaming list.
const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// Asks the API server, with one short watch of StorageClasses that matches nothing, whether
/// it streams initial events. Any other answer than the closing bookmark (an error from a
/// server with the `WatchList` gate off, a timeout from one that ignores the parameter) means
/// lists.
pub async fn probe_initial_list(client: &Client) -> InitialList {
    let api = Api::<StorageClass>::all(client.clone());
    let params = WatchParams::default()
        .labels(PROBE_SELECTOR)
        .timeout(PROBE_SERVER_TIMEOUT_SECS)
        .initial_events();
    let first = tokio::time::timeout(PROBE_CLIENT_TIMEOUT, async {
        match api.watch(&params, "0").await {
            Ok(stream) => std::pin::pin!(stream).next().await,
            Err(error) => Some(Err(error)),
        }
    })
    .await
    .unwrap_or(None);
    let strategy = initial_list_from(first.as_ref());
    match (strategy, first) {
        (InitialList::Streamed, _) => info!("the API server streams initial lists"),
        (InitialList::Listed, Some(Err(error))) => {
            info!(%error, "the API server does not stream initial lists; listing instead")
        }
        (InitialList::Listed, _) => {
            info!("the API server does not stream initial lists; listing instead")
        }
    }
    strategy
}

/// The decision of [`probe_initial_list`], from the probe's first event.
fn initial_list_from<E>(first: Option<&Result<WatchEvent<StorageClass>, E>>) -> InitialList {
    match first {
        Some(Ok(WatchEvent::Bookmark(bookmark)))
            if bookmark
                .metadata
                .annotations
                .get(INITIAL_EVENTS_END)
                .is_some_and(|value| value == "true") =>
        {
            InitialList::Streamed
        }
        _ => InitialList::Listed,
    }
}

/// Whether a watch has listed once: resolves `true` when its first list is whole, `false` if the
/// watch ended before; cheap to clone and await from any number of tasks.
pub type Listed = Shared<BoxFuture<'static, bool>>;

/// Whether `listed` has resolved `true` already, without waiting. (A `Shared` polls what it
/// shares with a waker of its own, which wakes every task awaiting a clone of it.)
pub fn has_listed(listed: &Listed) -> bool {
    listed.clone().now_or_never() == Some(true)
}

/// Resolves once the store has listed (`false` if its watch ended before), for any number of
/// concurrent waiters. `Store::wait_until_ready` itself wakes only the waiter that polled it
/// last (kube-runtime's `DelayedInit` keeps one waker): a second waiter would wait for ever.
/// `Shared` polls it once for all.
pub fn listed<K>(store: &Store<K>) -> Listed
where
    K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
{
    let store = store.clone();
    async move { store.wait_until_ready().await.is_ok() }
        .boxed()
        .shared()
}

/// A watched, cached resource: the store to read and the stream of changed objects
/// that drives a controller (the stream must be polled for the store to fill). Every event,
/// deletions included (the stream reports none), signals `changes` if given.
pub fn watch<K>(
    api: Api<K>,
    initial_list: InitialList,
    changes: Option<&Arc<Notify>>,
) -> (
    Store<K>,
    impl Stream<Item = Result<K, watcher::Error>> + Send + 'static,
)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    watch_signalling(
        api,
        initial_list,
        changes,
        |_: Option<&K>, _: Option<&K>| true,
    )
}

/// [`watch`], signalling `changes` only for the events `changed` tells apart: it is given
/// the cached object (`None` if new) and the object after the event (`None` if deleted).
/// The store is updated before the signal, so a woken reader sees the change.
pub fn watch_signalling<K, F>(
    api: Api<K>,
    initial_list: InitialList,
    changes: Option<&Arc<Notify>>,
    changed: F,
) -> (
    Store<K>,
    impl Stream<Item = Result<K, watcher::Error>> + Send + 'static,
)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    F: Fn(Option<&K>, Option<&K>) -> bool + Send + 'static,
{
    reflect(watcher(api, watcher_config(initial_list)), changes, changed)
}

/// [`watch`] of a kind decoded from protobuf (see `kube_client::protobuf`).
pub fn watch_protobuf<K>(
    client: &Client,
    initial_list: InitialList,
) -> (
    Store<K>,
    impl Stream<Item = Result<K, watcher::Error>> + Send + 'static,
)
where
    K: Resource<DynamicType = ()> + FromProtobuf + Clone + Debug + Send + Sync + 'static,
{
    reflect(
        protobuf_watch::watcher(client.clone(), watcher_config(initial_list)),
        None,
        |_: Option<&K>, _: Option<&K>| true,
    )
}

/// The claim watch (protobuf). Unlike the other stores, the claim store takes the objects of its
/// first list as they arrive, not once the list is whole: at 100,000 claims that list takes
/// seconds, and a claim with work is provisioned as soon as it is seen. The store is therefore
/// "ready" (kube-runtime's sense) from the start, and the returned [`Listed`] says when the
/// first list is whole: every reader that takes a claim's absence from the store for a fact
/// waits for it (docs/journal.md, "Decisions on a store still filling").
pub fn watch_claims(
    client: &Client,
    initial_list: InitialList,
) -> (
    Store<CachedClaim>,
    Listed,
    impl Stream<Item = Result<CachedClaim, watcher::Error>> + Send + 'static,
) {
    let (reader, mut writer) = reflector::store();
    // Ready at once: an empty list, whole.
    writer.apply_watcher_event(&watcher::Event::Init);
    writer.apply_watcher_event(&watcher::Event::InitDone);
    let (whole, listed) = tokio::sync::oneshot::channel();
    let mut first = FirstList::new(whole);
    let stream = protobuf_watch::watcher(client.clone(), watcher_config(initial_list))
        .default_backoff()
        .filter_map(move |event| {
            future::ready(match event {
                Ok(event) => first.route(event).map(|event| {
                    writer.apply_watcher_event(&event);
                    Ok(event)
                }),
                Err(error) => Some(Err(error)),
            })
        })
        .applied_objects();
    let listed = listed.map(|whole| whole.is_ok()).boxed().shared();
    (reader, listed, stream)
}

/// Where the events of the claim watch's first list go (see [`watch_claims`]): while nothing
/// else is in the store, each object goes straight in (an `Apply`), which is exactly what the
/// list leaves once whole (initial events hold no deletions). A first list that is restarted
/// before it ends (its stream broke) could leave behind objects deleted meanwhile, so from
/// that restart on every list is buffered and swapped in whole, as kube-runtime's writer does.
struct FirstList {
    state: FirstListState,
    whole: Option<tokio::sync::oneshot::Sender<()>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FirstListState {
    /// Before the watch's first `Init`.
    NotStarted,
    /// Inside the first list: objects go straight into the store.
    Arriving,
    /// Later lists, buffered by the writer.
    Buffered,
}

impl FirstList {
    fn new(whole: tokio::sync::oneshot::Sender<()>) -> Self {
        FirstList {
            state: FirstListState::NotStarted,
            whole: Some(whole),
        }
    }

    /// The event for the store's writer and the controllers in place of `event` (`None`:
    /// none).
    fn route<K>(&mut self, event: watcher::Event<K>) -> Option<watcher::Event<K>> {
        use FirstListState::{Arriving, Buffered, NotStarted};
        use watcher::Event::{Init, InitApply, InitDone};
        match (self.state, event) {
            (NotStarted, Init) => {
                self.state = Arriving;
                None
            }
            (Arriving, InitApply(object)) => Some(watcher::Event::Apply(object)),
            (Arriving, InitDone) => {
                self.state = Buffered;
                self.say_whole();
                None
            }
            // The first list restarts: buffer this one and swap it in whole.
            (Arriving, Init) => {
                self.state = Buffered;
                Some(Init)
            }
            (_, InitDone) => {
                self.say_whole();
                Some(InitDone)
            }
            (_, event) => Some(event),
        }
    }

    fn say_whole(&mut self) {
        if let Some(whole) = self.whole.take() {
            let _ = whole.send(());
        }
    }
}

/// The store fed by `events`, and the stream of changed objects; see [`watch_signalling`].
fn reflect<K, F>(
    events: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    changes: Option<&Arc<Notify>>,
    changed: F,
) -> (
    Store<K>,
    impl Stream<Item = Result<K, watcher::Error>> + Send + 'static,
)
where
    K: Resource<DynamicType = ()> + Clone + Debug + Send + Sync + 'static,
    F: Fn(Option<&K>, Option<&K>) -> bool + Send + 'static,
{
    let (reader, mut writer) = reflector::store();
    let changes = changes.cloned();
    let cached = reader.clone();
    let stream = events
        .default_backoff()
        .inspect_ok(move |event| {
            let signal = changes
                .as_ref()
                .filter(|_| event_changes(&cached, event, &changed));
            writer.apply_watcher_event(event);
            if let Some(changes) = signal {
                changes.notify_one();
            }
        })
        .applied_objects();
    (reader, stream)
}

/// Whether `event` changes something `changed` cares about, judged against the store before
/// the event. A re-list's end always counts: objects deleted meanwhile vanish with it.
fn event_changes<K>(
    store: &Store<K>,
    event: &watcher::Event<K>,
    changed: &impl Fn(Option<&K>, Option<&K>) -> bool,
) -> bool
where
    K: Resource<DynamicType = ()> + Clone,
{
    let cached = |object: &K| store.get(&ObjectRef::from_obj(object));
    match event {
        watcher::Event::Apply(object) | watcher::Event::InitApply(object) => {
            changed(cached(object).as_deref(), Some(object))
        }
        watcher::Event::Delete(object) => {
            let old = cached(object);
            changed(Some(old.as_deref().unwrap_or(object)), None)
        }
        watcher::Event::Init => false,
        watcher::Event::InitDone => true,
    }
}

/// The VolumeAttachment store, and the stream of the attachments deleted: each may free a PV
/// whose deletion waits for it. A re-list that finds one gone reports nothing; the PV's backoff
/// retry covers that.
pub fn watch_attachments(
    client: &Client,
    initial_list: InitialList,
) -> (
    Store<CachedAttachment>,
    impl Stream<Item = Result<CachedAttachment, watcher::Error>> + Send + 'static,
) {
    let (reader, writer) = reflector::store();
    let deleted = protobuf_watch::watcher(client.clone(), watcher_config(initial_list))
        .default_backoff()
        .reflect(writer)
        .try_filter_map(|event| {
            future::ready(Ok(match event {
                watcher::Event::Delete(attachment) => Some(attachment),
                _ => None,
            }))
        });
    (reader, deleted)
}

/// Both ways read from the API server's watch cache (`resourceVersion=0`), as client-go's
/// informers do. A list asks without a page size: kube-core drops `resourceVersion=0` from a
/// request with a `limit` (the server ignores the limit for it), and pages of 500 from etcd
/// cost one `--kube-api-qps` token each: 40 requests and 6.5 s at the default QPS to start
/// with 10,000 claims and 10,000 PVs.
fn watcher_config(initial_list: InitialList) -> watcher::Config {
    let listed = watcher::Config {
        page_size: None,
        ..watcher::Config::default().any_semantic()
    };
    match initial_list {
        InitialList::Streamed => listed.streaming_lists(),
        InitialList::Listed => listed,
    }
}

/// The three watched kinds of the sidecar.
pub struct Watches<C, V, S> {
    pub claims: (Store<CachedClaim>, C),
    /// When the claim store's first list is whole (see [`watch_claims`]).
    pub claims_listed: Listed,
    pub volumes: (Store<CachedVolume>, V),
    pub classes: (Store<StorageClass>, S),
}

/// `class_changes` is signalled at every StorageClass event (see [`watch`]).
pub fn watch_all(
    client: &Client,
    initial_list: InitialList,
    class_changes: Option<&Arc<Notify>>,
) -> Watches<
    impl Stream<Item = Result<CachedClaim, watcher::Error>> + Send + 'static,
    impl Stream<Item = Result<CachedVolume, watcher::Error>> + Send + 'static,
    impl Stream<Item = Result<StorageClass, watcher::Error>> + Send + 'static,
> {
    let (claims, claims_listed, claim_stream) = watch_claims(client, initial_list);
    Watches {
        claims: (claims, claim_stream),
        claims_listed,
        volumes: watch_protobuf(client, initial_list),
        classes: watch(
            Api::<StorageClass>::all(client.clone()),
            initial_list,
            class_changes,
        ),
    }
}

mod protobuf;
#[cfg(test)]
mod tests;
