//! Test fixtures of the reconcilers: a scripted API server (tower-test's mock service behind a
//! real `kube::Client`) and a scripted CSI driver that share one scenario. A test lists every
//! request a reconcile must send, to the API server and to the driver, in the order it must
//! send them, with the answer each gets; a request that is unexpected, missing or out of order
//! fails the test, and so does a scenario that does not end within [`DEADLINE`].
//!
//! Events are the exception: a background task writes them, yielding to the requests that
//! make progress, so where they fall among the other requests is not part of the contract.
//! The API server collects them apart; [`Scenario::finish`] returns them in their own order.
//!
//! Run the tests with tokio's clock paused (`#[tokio::test(start_paused = true)]`): the
//! journal's retry and record timers then fire as soon as nothing else can run, and a hang
//! fails at once.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures::FutureExt;
use http::{Method, Request, Response};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Secret};
use k8s_openapi::api::storage::v1::{StorageClass, VolumeAttachment};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::client::Body;
use kube::runtime::reflector::{self, Lookup, Store};
use kube::runtime::watcher;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tonic::Status;
use tower_test::mock;

use crate::controller::cluster_views::grants::GrantCache;
use crate::controller::cluster_views::topology_cache::{TopologyCache, TopologyView};
use crate::controller::deletion::volumes::VolumeReconciler;
use crate::controller::provisioning::claims::ClaimReconciler;
use crate::controller::runtime::events::EventRecorder;
use crate::controller::shared::context::NodeDeployment;
use crate::controller::shared::context::{Context, FencedDriver, Settings, Stores, TopologyFlags};
use crate::csi;
use crate::csi_client::{CallError, CsiController};
use crate::fence::LeaseFence;
use crate::journal::{
    DRIVER_LABEL, Journal, JournalScope, Operation, OperationRecord, ProvisioningJournal,
    ProvisioningJournalSpec,
};
use crate::kube_client::RateLimitLayer;
use crate::kube_client::protobuf;
use crate::metrics::Metrics;
use crate::provision::SecretRef;
use crate::provision::fixtures::{DRIVER, PVC_UID, caps, config};
use crate::provision::{DriverCapabilities, MetadataAllowLists, ProvisionerConfig, SingleNode};

/// The sidecar's namespace, where the journal lives.
pub const JOURNAL_NAMESPACE: &str = "csi";
const JOURNAL_BASE_NAME: &str = "journal";
/// The shard new operations go to (the first, being filled) and restored ones are read from.
pub const SHARD: &str = "journal-0";
pub const RETRY_START: Duration = Duration::from_secs(1);
pub const RETRY_MAX: Duration = Duration::from_secs(300);
/// Virtual time a scenario may take; with the clock paused, a hang reaches it at once.
pub const DEADLINE: Duration = Duration::from_secs(600);
/// 1Gi, the size `PvcBuilder`'s claim asks for.
pub const GIB: i64 = 1 << 30;
/// `PvcBuilder`'s claim `apps/data`.
pub const CLAIM_PATH: &str = "/api/v1/namespaces/apps/persistentvolumeclaims/data";
/// The data of Secret `apps/creds`, the secret the tests' classes and PVs name.
pub const SECRETS: &[(&str, &str)] = &[("password", "s3cret")];

/// The volume (and PV) name of `PvcBuilder`'s claim.
pub fn claim_volume() -> String {
    format!("pvc-{PVC_UID}")
}

pub fn claim_volume_path() -> String {
    format!("/api/v1/persistentvolumes/{}", claim_volume())
}

/// The operation of claim `apps/data` in class `standard` (parameter `type: fast`, secret
/// `apps/creds`), as the journal holds it.
pub fn recorded_operation() -> Operation {
    Operation {
        volume_name: claim_volume(),
        claim_namespace: "apps".to_owned(),
        claim_name: "data".to_owned(),
        claim_uid: PVC_UID.to_owned(),
        class_name: "standard".to_owned(),
        request: csi::CreateVolumeRequest {
            name: claim_volume(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: GIB,
                limit_bytes: 0,
            }),
            parameters: strings(&[("type", "fast")]),
            ..csi::CreateVolumeRequest::default()
        },
        provisioner_secret: Some(SecretRef {
            name: "creds".to_owned(),
            namespace: "apps".to_owned(),
        }),
        attributes_class: None,
        known_volume_id: None,
    }
}

/// The read of Secret `apps/creds`.
pub fn secret_read() -> Step {
    get("/api/v1/namespaces/apps/secrets/creds").answer(200, secret("apps", "creds", SECRETS))
}

/// One request the scenario expects, with its answer.
pub enum Step {
    Api {
        call: ApiCall,
        reply: Reply,
    },
    CreateVolume {
        /// Boxed: the request is much larger than the other steps.
        expected: Box<CreateVolumeCall>,
        answer: Result<csi::CreateVolumeResponse, Status>,
        /// Answered only once the test lets the call go ([`held_create_volume`]).
        held: Option<Arc<HeldCall>>,
    },
    DeleteVolume {
        expected: csi::DeleteVolumeRequest,
        answer: Result<(), Status>,
    },
    GetCapacity {
        expected: csi::GetCapacityRequest,
        answer: Result<csi::GetCapacityResponse, Status>,
    },
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Api { call, .. } => write!(f, "{} {}", call.method, call.path),
            Step::CreateVolume { expected, .. } => write!(f, "CreateVolume {}", expected.name),
            Step::DeleteVolume { expected, .. } => {
                write!(f, "DeleteVolume {}", expected.volume_id)
            }
            Step::GetCapacity { expected, .. } => {
                write!(f, "GetCapacity {:?}", expected.accessible_topology)
            }
        }
    }
}

/// An expected API request: method, path and, optionally, JSON its body must include.
pub struct ApiCall {
    method: Method,
    path: String,
    includes: Option<Value>,
}

/// The API server's answer.
pub enum Reply {
    Object(u16, Value),
    /// The object as sent is the object as stored.
    Echo(u16),
}

pub fn get(path: impl Into<String>) -> ApiCall {
    call(Method::GET, path)
}

pub fn post(path: impl Into<String>) -> ApiCall {
    call(Method::POST, path)
}

pub fn put(path: impl Into<String>) -> ApiCall {
    call(Method::PUT, path)
}

pub fn patch(path: impl Into<String>) -> ApiCall {
    call(Method::PATCH, path)
}

pub fn delete(path: impl Into<String>) -> ApiCall {
    call(Method::DELETE, path)
}

fn call(method: Method, path: impl Into<String>) -> ApiCall {
    ApiCall {
        method,
        path: path.into(),
        includes: None,
    }
}

impl ApiCall {
    /// The request body must include this JSON: every key of an object (recursively), every
    /// element of an array (same length, in order).
    pub fn body(mut self, includes: Value) -> Self {
        self.includes = Some(includes);
        self
    }

    pub fn answer(self, status: u16, object: impl Serialize) -> Step {
        let object = serde_json::to_value(object).expect("answers serialize");
        self.reply(Reply::Object(status, object))
    }

    pub fn echo(self, status: u16) -> Step {
        self.reply(Reply::Echo(status))
    }

    /// A `metav1.Status` failure, as the API server refuses a request.
    pub fn refuse(self, status: u16, reason: &str) -> Step {
        self.reply(Reply::Object(
            status,
            json!({
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": format!("scripted {reason}"),
                "reason": reason,
                "code": status,
            }),
        ))
    }

    fn reply(self, reply: Reply) -> Step {
        Step::Api { call: self, reply }
    }
}

/// What a test checks of a CreateVolume request (the capabilities are the plan's tests' job).
#[derive(Debug, PartialEq)]
pub struct CreateVolumeCall {
    pub name: String,
    pub required_bytes: i64,
    pub parameters: HashMap<String, String>,
    pub secrets: HashMap<String, String>,
    pub accessibility: Option<csi::TopologyRequirement>,
    pub content_source: Option<csi::VolumeContentSource>,
    pub mutable_parameters: HashMap<String, String>,
}

impl From<&csi::CreateVolumeRequest> for CreateVolumeCall {
    fn from(request: &csi::CreateVolumeRequest) -> Self {
        CreateVolumeCall {
            name: request.name.clone(),
            required_bytes: request
                .capacity_range
                .as_ref()
                .map_or(0, |range| range.required_bytes),
            parameters: request.parameters.clone(),
            secrets: request.secrets.clone(),
            accessibility: request.accessibility_requirements.clone(),
            content_source: request.volume_content_source.clone(),
            mutable_parameters: request.mutable_parameters.clone(),
        }
    }
}

pub fn create_volume(
    expected: CreateVolumeCall,
    answer: Result<csi::CreateVolumeResponse, Status>,
) -> Step {
    Step::CreateVolume {
        expected: Box::new(expected),
        answer,
        held: None,
    }
}

/// A CreateVolume the driver answers only once the test calls [`HeldCall::release`], so that
/// a test can look at the sidecar while the call is in flight ([`HeldCall::sent`]).
pub fn held_create_volume(
    expected: CreateVolumeCall,
    answer: Result<csi::CreateVolumeResponse, Status>,
) -> (Step, Arc<HeldCall>) {
    let held = Arc::new(HeldCall::default());
    let step = Step::CreateVolume {
        expected: Box::new(expected),
        answer,
        held: Some(Arc::clone(&held)),
    };
    (step, held)
}

/// A driver call in flight, held by the test (see [`held_create_volume`]).
#[derive(Default)]
pub struct HeldCall {
    sent: tokio::sync::Notify,
    released: tokio::sync::Notify,
}

impl HeldCall {
    /// Waits until the sidecar has sent the call.
    pub async fn sent(&self) {
        self.sent.notified().await;
    }

    /// Lets the driver answer.
    pub fn release(&self) {
        self.released.notify_one();
    }
}

/// CreateVolume's answer for a volume created with this id and size.
pub fn created(volume_id: &str, capacity_bytes: i64) -> Result<csi::CreateVolumeResponse, Status> {
    Ok(csi::CreateVolumeResponse {
        volume: Some(csi::Volume {
            volume_id: volume_id.to_owned(),
            capacity_bytes,
            ..csi::Volume::default()
        }),
    })
}

pub fn delete_volume(
    volume_id: &str,
    secrets: &[(&str, &str)],
    answer: Result<(), Status>,
) -> Step {
    Step::DeleteVolume {
        expected: csi::DeleteVolumeRequest {
            volume_id: volume_id.to_owned(),
            secrets: strings(secrets),
        },
        answer,
    }
}

pub fn strings(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
        .collect()
}

/// Where the journal's shards are created.
pub fn journal_path() -> String {
    format!(
        "/apis/provisioner.csi-rs.dev/v1alpha1/namespaces/{JOURNAL_NAMESPACE}/provisioningjournals"
    )
}

/// The shard [`SHARD`].
pub fn shard_path() -> String {
    format!("{}/{SHARD}", journal_path())
}

/// The first write of [`SHARD`] (it does not exist yet), holding `operations`.
pub fn journal_created(operations: Value) -> Step {
    post(journal_path())
        .body(json!({ "metadata": { "name": SHARD }, "spec": { "operations": operations } }))
        .echo(201)
}

/// A later write of [`SHARD`], holding `operations`.
pub fn journal_replaced(operations: Value) -> Step {
    put(shard_path())
        .body(json!({ "spec": { "operations": operations } }))
        .echo(200)
}

/// The answer to a list of journal shards.
fn journal_listed(shards: Vec<ProvisioningJournal>) -> Step {
    get(journal_path()).answer(
        200,
        json!({
            "apiVersion": "provisioner.csi-rs.dev/v1alpha1",
            "kind": "ProvisioningJournalList",
            "metadata": {},
            "items": shards,
        }),
    )
}

/// Node mode: the list of every node's shards, one shard holding `operations` (another
/// node's, as far as this node can tell).
pub fn every_node_journal(operations: &[Operation]) -> Step {
    let records = operations
        .iter()
        .map(|operation| OperationRecord::from_operation(operation, Default::default()))
        .collect();
    let mut theirs = shard(records);
    // Another node's shard: not named like this sidecar's (whose own operations come from its
    // registry, not from this list).
    theirs.metadata.name = Some(format!("{JOURNAL_BASE_NAME}.other-node-0"));
    journal_listed(vec![theirs])
}

/// The journal's scope. In node mode the shards keep the central names, so the journal steps
/// read the same in both modes; only the read of every node's shards is node mode's.
fn journal_scope(node: Option<&NodeDeployment>) -> JournalScope {
    JournalScope {
        every_node_selector: node.and_then(|node| {
            JournalScope::new(JOURNAL_BASE_NAME, Some(&node.name)).every_node_selector
        }),
        ..JournalScope::new(JOURNAL_BASE_NAME, None)
    }
}

/// A shard as stored, holding `records`.
pub fn shard(records: Vec<OperationRecord>) -> ProvisioningJournal {
    let mut shard = ProvisioningJournal::new(
        SHARD,
        ProvisioningJournalSpec {
            driver: DRIVER.to_owned(),
            operations: records,
            ..ProvisioningJournalSpec::default()
        },
    );
    shard.metadata.namespace = Some(JOURNAL_NAMESPACE.to_owned());
    shard.metadata.labels = Some([(DRIVER_LABEL.to_owned(), JOURNAL_BASE_NAME.to_owned())].into());
    shard
}

/// A Secret with string data.
fn secret(namespace: &str, name: &str, data: &[(&str, &str)]) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            ..ObjectMeta::default()
        },
        data: Some(
            data.iter()
                .map(|(key, value)| ((*key).to_owned(), ByteString(value.as_bytes().to_vec())))
                .collect(),
        ),
        ..Secret::default()
    }
}

/// An object as the caches hold it (`CachedClaim`, `CachedVolume`).
pub fn cached<C: DeserializeOwned>(object: &impl Serialize) -> C {
    serde_json::from_value(serde_json::to_value(object).expect("objects serialize"))
        .expect("the cache reads what the API server sends")
}

/// Awaits `future`, failing the test if it does not end within [`DEADLINE`].
pub async fn bounded<F: Future>(future: F) -> F::Output {
    tokio::time::timeout(DEADLINE, future)
        .await
        .expect("the reconcile ended")
}

/// What the caches hold and how the context is set, before a scenario starts.
pub struct Cluster {
    claims: Vec<PersistentVolumeClaim>,
    volumes: Vec<PersistentVolume>,
    classes: Vec<StorageClass>,
    journaled: Vec<Operation>,
    journal_timeout: Duration,
    fence: LeaseFence,
    uuid_length: i32,
    draining: bool,
    topology: Option<(Vec<Value>, Vec<Value>)>,
    /// The Node and CSINode watches never list (no RBAC for them).
    topology_unlisted: bool,
    /// The PV watch has not listed yet (its objects still arriving).
    volumes_unlisted: bool,
    /// The claim watch's first list is not whole yet.
    claims_unlisted: bool,
    /// With the CrossNamespaceVolumeDataSource gate on: the listed ReferenceGrants (as JSON).
    grants: Option<Vec<Value>>,
    /// The ReferenceGrant watch never lists (no CRD).
    grants_unlisted: bool,
    /// With a driver that reports PUBLISH_UNPUBLISH_VOLUME: the listed VolumeAttachments.
    attachments: Option<Vec<VolumeAttachment>>,
    /// `--node-deployment`.
    node: Option<NodeDeployment>,
    /// The VolumeAttributesClass gate (on, as by default).
    attributes_classes: bool,
    /// The driver's name, when not `DRIVER` (a migration target).
    driver: Option<&'static str>,
    /// `--copy-claim-labels` and `--extra-create-metadata-*` allow-lists (none by default).
    metadata: MetadataAllowLists,
}

impl Cluster {
    pub fn new() -> Self {
        Cluster {
            claims: Vec::new(),
            volumes: Vec::new(),
            classes: Vec::new(),
            journaled: Vec::new(),
            journal_timeout: Duration::from_secs(10),
            fence: LeaseFence::open(),
            uuid_length: -1,
            draining: false,
            topology: None,
            topology_unlisted: false,
            volumes_unlisted: false,
            claims_unlisted: false,
            grants: None,
            grants_unlisted: false,
            attachments: None,
            node: None,
            attributes_classes: true,
            driver: None,
            metadata: MetadataAllowLists::default(),
        }
    }

    /// The driver is named `name` (e.g. a migration target).
    pub fn driver(mut self, name: &'static str) -> Self {
        self.driver = Some(name);
        self
    }

    /// `--node-deployment` on `node`, whose driver reports `segment` (and so topology when
    /// it is not empty); base delay 1 s, max delay 2 s.
    pub fn node_mode(mut self, node: &str, segment: &[(&str, &str)]) -> Self {
        let segment: std::collections::BTreeMap<String, String> = segment
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        if !segment.is_empty() {
            self.topology = Some((Vec::new(), Vec::new()));
        }
        self.node = Some(NodeDeployment {
            name: node.to_owned(),
            segment,
            immediate_binding: true,
            base_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(2),
        });
        self
    }

    /// The driver reports topology, and the cluster has these Nodes and CSINodes (as JSON).
    pub fn topology(mut self, nodes: Vec<Value>, csinodes: Vec<Value>) -> Self {
        self.topology = Some((nodes, csinodes));
        self
    }

    /// The driver reports topology, but the Node and CSINode watches never list.
    pub fn topology_unlisted(mut self) -> Self {
        self.topology = Some((Vec::new(), Vec::new()));
        self.topology_unlisted = true;
        self
    }

    /// The PV watch has not listed yet: its store holds what has arrived (these volumes) and a
    /// PV's absence from it says nothing.
    pub fn volumes_unlisted(mut self) -> Self {
        self.volumes_unlisted = true;
        self
    }

    /// The claim watch's first list is not whole yet: the claims given are those arrived.
    pub fn claims_unlisted(mut self) -> Self {
        self.claims_unlisted = true;
        self
    }

    /// The CrossNamespaceVolumeDataSource gate on, and these ReferenceGrants (as JSON) listed.
    pub fn cross_namespace(mut self, grants: Vec<Value>) -> Self {
        self.grants = Some(grants);
        self
    }

    /// The CrossNamespaceVolumeDataSource gate on, but the ReferenceGrant watch never lists.
    pub fn cross_namespace_unlisted(mut self) -> Self {
        self.grants = Some(Vec::new());
        self.grants_unlisted = true;
        self
    }

    /// A driver with PUBLISH_UNPUBLISH_VOLUME, and these VolumeAttachments listed.
    pub fn attaching(mut self, attachments: impl IntoIterator<Item = VolumeAttachment>) -> Self {
        self.attachments = Some(attachments.into_iter().collect());
        self
    }

    /// This replica cannot prove it leads (a leader paused past its lease).
    pub fn fenced(mut self) -> Self {
        let (_, never_renewed) = tokio::sync::watch::channel(None);
        self.fence = LeaseFence::new(never_renewed, Duration::from_secs(10));
        self
    }

    /// `--drain`.
    pub fn draining(mut self) -> Self {
        self.draining = true;
        self
    }

    pub fn claim(mut self, pvc: PersistentVolumeClaim) -> Self {
        self.claims.push(pvc);
        self
    }

    pub fn volume(mut self, pv: PersistentVolume) -> Self {
        self.volumes.push(pv);
        self
    }

    pub fn class(mut self, class: StorageClass) -> Self {
        self.classes.push(class);
        self
    }

    /// An operation the journal finds in [`SHARD`] when it loads.
    pub fn journaled(mut self, operation: Operation) -> Self {
        self.journaled.push(operation);
        self
    }

    /// `--volume-name-uuid-length`: names cut from part of the UID may collide.
    pub fn uuid_length(mut self, length: i32) -> Self {
        self.uuid_length = length;
        self
    }

    /// `--feature-gates=VolumeAttributesClass=false`.
    pub fn without_attributes_classes(mut self) -> Self {
        self.attributes_classes = false;
        self
    }

    /// The claim and namespace metadata allow-lists.
    pub fn metadata(mut self, lists: MetadataAllowLists) -> Self {
        self.metadata = lists;
        self
    }

    pub fn journal_timeout(mut self, timeout: Duration) -> Self {
        self.journal_timeout = timeout;
        self
    }

    /// Starts the API server, loads the journal (its list is answered here, before `steps`)
    /// and builds the context the reconcilers get.
    pub async fn start(self, steps: impl IntoIterator<Item = Step>) -> Scenario {
        let records = self
            .journaled
            .iter()
            .map(|operation| OperationRecord::from_operation(operation, Default::default()))
            .collect::<Vec<_>>();
        let shards = if records.is_empty() {
            Vec::new()
        } else {
            vec![shard(records)]
        };
        let list = journal_listed(shards);
        // The other deployment mode's shards, which hold nothing.
        let other_mode = journal_listed(Vec::new());
        let (client, driver, finish) = scripted([list, other_mode].into_iter().chain(steps));
        let settings = Settings {
            config: ProvisionerConfig {
                driver_name: self.driver.unwrap_or(DRIVER).to_owned(),
                volume_name_uuid_length: self.uuid_length,
                cross_namespace_data_sources: self.grants.is_some(),
                volume_attributes_classes: self.attributes_classes,
                metadata: self.metadata.clone(),
                ..config()
            },
            caps: DriverCapabilities {
                topology: self.topology.is_some(),
                publish_unpublish: self.attachments.is_some(),
                ..caps()
            },
            retry_interval_start: RETRY_START,
            retry_interval_max: RETRY_MAX,
            worker_threads: 4,
            max_concurrent_per_class: 0,
            adaptive_call_rate: false,
            audit_volumes_interval: Duration::ZERO,
            audit_delete_after: None,
            cloning_protection_threads: 1,
            snapshot_orphan_sweep_interval: Duration::from_secs(300),
            event_component: "csi-provisioner".to_owned(),
            hostname: "test-host".to_owned(),
            consistency_by_default: false,
            journal_namespace: JOURNAL_NAMESPACE.to_owned(),
            journal_scope: journal_scope(self.node.as_ref()),
            journal_timeout: self.journal_timeout,
            draining: self.draining,
            topology: TopologyFlags {
                strict: false,
                immediate: true,
            },
            node: self.node.clone(),
            capacity: None,
        };
        let journal = bounded(Journal::load(
            client.clone(),
            RateLimitLayer::unlimited(),
            JOURNAL_NAMESPACE,
            &settings.journal_scope,
            DRIVER,
            settings.journal_timeout,
        ))
        .await
        .expect("the journal loads");
        let events = EventRecorder::new(
            client.clone(),
            settings.event_component.clone(),
            settings.hostname.clone(),
            RateLimitLayer::unlimited(),
        );
        let claims = listed(self.claims.iter().map(cached));
        let stores = Stores {
            claims_listed: if self.claims_unlisted {
                futures::future::pending().boxed().shared()
            } else {
                crate::controller::runtime::cache::listed(&claims)
            },
            claims,
            volumes: if self.volumes_unlisted {
                store(self.volumes.iter().map(cached))
            } else {
                listed(self.volumes.iter().map(cached))
            },
            classes: store(self.classes),
            topology: self.topology.map(|(nodes, csinodes)| {
                if let Some(node) = &self.node {
                    TopologyView::Node(SingleNode {
                        name: node.name.clone(),
                        segment: node.segment.clone(),
                    })
                } else if self.topology_unlisted {
                    TopologyView::Watched(TopologyCache::from_stores(store([]), store([]), DRIVER))
                } else {
                    TopologyView::Watched(TopologyCache::from_stores(
                        listed(parse(nodes)),
                        listed(parse(csinodes)),
                        DRIVER,
                    ))
                }
            }),
            grants: self.grants.map(|grants| {
                if self.grants_unlisted {
                    GrantCache::new(store([]))
                } else {
                    GrantCache::new(listed(parse(grants)))
                }
            }),
            attachments: self
                .attachments
                .map(|attachments| listed(attachments.iter().map(cached))),
        };
        let driver = FencedDriver {
            csi: driver,
            fence: self.fence,
        };
        let ctx = Arc::new(Context::new(
            client,
            driver,
            stores,
            events,
            Arc::new(Metrics::new()),
            journal,
            settings,
        ));
        Scenario {
            claims: Arc::new(ClaimReconciler::new(Arc::clone(&ctx))),
            volumes: Arc::new(VolumeReconciler::new(Arc::clone(&ctx))),
            ctx,
            finish,
        }
    }
}

fn parse<K: DeserializeOwned>(objects: Vec<Value>) -> Vec<K> {
    objects
        .into_iter()
        .map(|object| serde_json::from_value(object).expect("test object"))
        .collect()
}

/// A store that has listed once, holding `objects`.
pub fn listed<K>(objects: impl IntoIterator<Item = K>) -> Store<K>
where
    K: Lookup<DynamicType = ()> + Clone + 'static,
{
    let (reader, mut writer) = reflector::store();
    writer.apply_watcher_event(&watcher::Event::Init);
    for object in objects {
        writer.apply_watcher_event(&watcher::Event::InitApply(object));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
    reader
}

fn store<K>(objects: impl IntoIterator<Item = K>) -> Store<K>
where
    K: Lookup<DynamicType = ()> + Clone + 'static,
{
    let (reader, mut writer) = reflector::store();
    for object in objects {
        writer.apply_watcher_event(&watcher::Event::Apply(object));
    }
    reader
}

/// A running scenario.
pub struct Scenario {
    ctx: Arc<Context>,
    /// The reconcilers, each with its state kept from one reconcile to the next.
    claims: Arc<ClaimReconciler>,
    volumes: Arc<VolumeReconciler>,
    finish: Finish,
}

impl Scenario {
    pub fn ctx(&self) -> Arc<Context> {
        Arc::clone(&self.ctx)
    }

    pub fn claims(&self) -> Arc<ClaimReconciler> {
        Arc::clone(&self.claims)
    }

    pub fn volumes(&self) -> Arc<VolumeReconciler> {
        Arc::clone(&self.volumes)
    }

    /// Ends the scenario: drops the context and the reconcilers, so the journal writes the changes it held back
    /// and the event writer the events it queued, then waits until every client is gone.
    /// Fails if a step was not taken. Returns the events written, as
    /// `<kind>/<name> <type> <reason>: <message>`.
    pub async fn finish(self) -> Vec<String> {
        let Scenario {
            ctx,
            claims,
            volumes,
            finish,
        } = self;
        drop((ctx, claims, volumes));
        finish.finish().await
    }
}

/// A scripted API server and driver for an executor with a context of its own (the capacity
/// controller): the client and driver to give it, and the end of the scenario.
pub fn scripted(steps: impl IntoIterator<Item = Step>) -> (Client, Arc<dyn CsiController>, Finish) {
    let script = Arc::new(Script::new(steps));
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let server = tokio::spawn(serve(handle, Arc::clone(&script)));
    let driver = Arc::new(ScriptedDriver {
        script: Arc::clone(&script),
    });
    (
        Client::new(service, "default"),
        driver,
        Finish { server, script },
    )
}

/// The end of a scripted scenario.
pub struct Finish {
    server: JoinHandle<Vec<String>>,
    script: Arc<Script>,
}

impl Finish {
    /// Waits until every client is gone (drop them first); fails if a step was not taken.
    /// Returns the events written.
    pub async fn finish(self) -> Vec<String> {
        let Finish { server, script } = self;
        let events = match tokio::time::timeout(DEADLINE, server).await {
            Ok(Ok(events)) => events,
            Ok(Err(failed)) => std::panic::resume_unwind(failed.into_panic()),
            Err(_) => panic!(
                "the scenario did not end; still expected: {}",
                script.remaining()
            ),
        };
        let remaining = script.remaining();
        assert!(remaining.is_empty(), "requests never sent: {remaining}");
        events
    }
}

/// The steps still to come and what happened so far (for failure messages).
struct Script {
    state: Mutex<ScriptState>,
}

struct ScriptState {
    steps: VecDeque<Step>,
    seen: Vec<String>,
}

impl Script {
    fn new(steps: impl IntoIterator<Item = Step>) -> Self {
        Script {
            state: Mutex::new(ScriptState {
                steps: steps.into_iter().collect(),
                seen: Vec::new(),
            }),
        }
    }

    /// The next step, for a request described as `got`; panics (after releasing the lock)
    /// if the scenario has none.
    fn next(&self, got: &str) -> Step {
        let (step, seen) = {
            let mut state = self.lock();
            let step = state.steps.pop_front();
            let seen = state.seen.join(", ");
            state.seen.push(got.to_owned());
            (step, seen)
        };
        step.unwrap_or_else(|| panic!("unexpected request {got} after [{seen}]"))
    }

    fn remaining(&self) -> String {
        let state = self.lock();
        let steps: Vec<String> = state.steps.iter().map(ToString::to_string).collect();
        steps.join(", ")
    }

    fn lock(&self) -> MutexGuard<'_, ScriptState> {
        // A failed assertion elsewhere may have poisoned it; the steps are still readable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The CSI driver of a scenario: each call takes the next step, which must be that call.
struct ScriptedDriver {
    script: Arc<Script>,
}

#[tonic::async_trait]
impl CsiController for ScriptedDriver {
    async fn create_volume(
        &self,
        request: csi::CreateVolumeRequest,
    ) -> Result<csi::CreateVolumeResponse, CallError> {
        let got = format!("CreateVolume {}", request.name);
        match self.script.next(&got) {
            Step::CreateVolume {
                expected,
                answer,
                held,
            } => {
                assert_eq!(CreateVolumeCall::from(&request), *expected, "{got}");
                if let Some(held) = held {
                    // notify_one keeps the permit if nobody waits yet: no wake-up is lost.
                    held.sent.notify_one();
                    held.released.notified().await;
                }
                answer.map_err(CallError::from)
            }
            step => panic!("the driver got {got}, the scenario expected {step}"),
        }
    }

    async fn delete_volume(
        &self,
        request: csi::DeleteVolumeRequest,
    ) -> Result<csi::DeleteVolumeResponse, CallError> {
        let got = format!("DeleteVolume {}", request.volume_id);
        match self.script.next(&got) {
            Step::DeleteVolume { expected, answer } => {
                assert_eq!(request.volume_id, expected.volume_id, "{got}");
                assert_eq!(request.secrets, expected.secrets, "secrets of {got}");
                answer
                    .map(|()| csi::DeleteVolumeResponse {})
                    .map_err(CallError::from)
            }
            step => panic!("the driver got {got}, the scenario expected {step}"),
        }
    }

    async fn get_capacity(
        &self,
        request: csi::GetCapacityRequest,
    ) -> Result<csi::GetCapacityResponse, CallError> {
        let got = format!("GetCapacity {:?}", request.accessible_topology);
        match self.script.next(&got) {
            Step::GetCapacity { expected, answer } => {
                assert_eq!(request, expected, "{got}");
                answer.map_err(CallError::from)
            }
            step => panic!("the driver got {got}, the scenario expected {step}"),
        }
    }
}

/// The API server: answers events apart, every other request with the next step. Ends when
/// every client is gone, with the events written.
async fn serve(
    mut handle: mock::Handle<Request<Body>, Response<Body>>,
    script: Arc<Script>,
) -> Vec<String> {
    let mut events = EventLog::default();
    while let Some((request, respond)) = handle.next_request().await {
        let (parts, body) = request.into_parts();
        let body = body.collect_bytes().await.expect("a request body");
        let protobuf = parts
            .headers
            .get(http::header::CONTENT_TYPE)
            .is_some_and(|value| value.as_bytes() == protobuf::CONTENT_TYPE.as_bytes());
        let sent: Value = if body.is_empty() {
            Value::Null
        } else if protobuf {
            // Events are the one kind written as protobuf.
            let event = crate::controller::runtime::events::wire::decode(&body)
                .expect("an enveloped event");
            serde_json::to_value(event).expect("JSON of an event")
        } else {
            serde_json::from_slice(&body).expect("a JSON request body")
        };
        let path = parts.uri.path();
        if let Some(reply) = events.record(&parts.method, path, &sent) {
            respond.send_response(response(201, &reply));
            continue;
        }
        let got = format!("{} {path}", parts.method);
        let (call, reply) = match script.next(&got) {
            Step::Api { call, reply } => (call, reply),
            step => panic!("the API server got {got}, the scenario expected {step}"),
        };
        assert_eq!(got, format!("{} {}", call.method, call.path), "request");
        if let Some(includes) = &call.includes {
            assert!(
                json_includes(&sent, includes),
                "the body of {got}\n{sent:#}\ndoes not include\n{includes:#}"
            );
        }
        respond.send_response(match reply {
            Reply::Object(status, object) => response(status, &object),
            Reply::Echo(status) => response(status, &sent),
        });
    }
    events.written
}

/// Events as written: new ones (POST) and repeats (a PATCH of the count).
#[derive(Default)]
struct EventLog {
    by_name: HashMap<String, Value>,
    written: Vec<String>,
}

impl EventLog {
    /// The answer to an event request; `None` for any other request.
    fn record(&mut self, method: &Method, path: &str, sent: &Value) -> Option<Value> {
        let rest = path.strip_prefix("/api/v1/namespaces/")?;
        let (_namespace, rest) = rest.split_once('/')?;
        let rest = rest.strip_prefix("events")?;
        let event = if *method == Method::POST && rest.is_empty() {
            let name = sent["metadata"]["name"].as_str().unwrap_or_default();
            self.by_name.insert(name.to_owned(), sent.clone());
            sent.clone()
        } else if *method == Method::PATCH {
            let name = rest.trim_start_matches('/');
            let event = self
                .by_name
                .get_mut(name)
                .expect("a repeat of a known event");
            event["count"] = sent["count"].clone();
            event.clone()
        } else {
            panic!("unexpected event request {method} {path}");
        };
        self.written.push(format!(
            "{}/{} {} {}: {}",
            text(&event["involvedObject"]["kind"]),
            text(&event["involvedObject"]["name"]),
            text(&event["type"]),
            text(&event["reason"]),
            text(&event["message"]),
        ));
        Some(event)
    }
}

fn text(value: &Value) -> &str {
    value.as_str().unwrap_or_default()
}

fn response(status: u16, body: &Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Body::from(serde_json::to_vec(body).expect("JSON")))
        .expect("a valid response")
}

fn json_includes(actual: &Value, expected: &Value) -> bool {
    match (actual, expected) {
        (Value::Object(actual), Value::Object(expected)) => expected
            .iter()
            .all(|(key, value)| actual.get(key).is_some_and(|a| json_includes(a, value))),
        (Value::Array(actual), Value::Array(expected)) => {
            actual.len() == expected.len()
                && actual
                    .iter()
                    .zip(expected)
                    .all(|(a, e)| json_includes(a, e))
        }
        _ => actual == expected,
    }
}
