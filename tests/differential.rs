//! The differential suite: is this sidecar a drop-in for upstream external-provisioner v6.3.0?
//! Each scenario runs twice against the same kind of driver, once with upstream (built and
//! cached by hack/build-upstream-provisioner.sh) and then with ours, each run in a namespace,
//! with Nodes and a driver process of its own. Every CreateVolume request the driver received,
//! every PV created and what the sidecar did to the claims (selected-node annotation, its
//! events) are normalised (names and UIDs that differ by construction) and compared field by
//! field. A difference fails the test unless [`ALLOWED`] lists it, citing docs/flags.md.
//! `cargo test --test scheduler differential:: -- --nocapture` prints the table of compared fields.
//!
//! Drivers: the Kubernetes e2e mock (its own log gives the requests as protojson) for the
//! provisioning cases without topology; the reference driver (its `--request-log`) for
//! topology: the mock knows one fixed segment only; and for clones and restores, whose content
//! source its `--request-log` shows. Topology keys are unique to each scenario,
//! since Nodes are cluster-wide, and shared by its two runs, which never overlap: the first
//! run's Nodes are gone before the second starts.
//!
//! VolumeAttributesClass: the reference driver with `--modify-volume`, so its `--request-log`
//! shows each CreateVolume's `mutable_parameters`.
//!
//! Capacity tracking and node deployment: the CSIStorageCapacity objects each sidecar
//! publishes (labels, owner, class, selector, capacity, maximum size) are compared too, in a
//! central run over three zones and in a run of two node-mode sidecars, each with its own
//! driver instance, where the CreateVolume requests and the PVs of the claims kube-scheduler put
//! on each node are compared as well.
//!
//! In-tree migration: a `kubernetes.io/gce-pd` claim provisioned through a driver named
//! `pd.csi.storage.gke.io` (the translated CreateVolume, the in-tree PV), then deleted.

use csi_test_support as support;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use csi_provisioner::provision::SNAPSHOT_PROTECTION_FINALIZER;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::core::v1::{TopologySelectorLabelRequirement, TopologySelectorTerm};
use k8s_openapi::api::core::v1::{TypedLocalObjectReference, TypedObjectReference};
use k8s_openapi::api::storage::v1::{CSIStorageCapacity, StorageClass};
use kube::Api;
use kube::api::ListParams;
use serde_json::{Value, json};

use support::cluster::{
    Cluster, attributes_class_claim, claim, create_claim, create_class, driver_pvs, events_of,
    storage_class, wait_event,
};
use support::mock_driver::{MockDriver, MockDriverOptions};
use support::peers::{CsiEndpoint, Driver, Sidecar, SidecarOptions, TIMEOUT};
use support::snapshots::Snapshotter;
use support::topology::{ANN_SELECTED_NODE, Topology, scheduling_cluster};

/// A difference the comparison accepts: the scenario and field (globs, `*` matches anything)
/// and the docs/flags.md line that lists it as deliberate.
struct Allowed {
    scenario: &'static str,
    field: &'static str,
    why: &'static str,
}

/// Every difference between upstream and ours that these scenarios show and docs/flags.md lists
/// as deliberate. (Ours sorts node-affinity expressions, which [`pv_json`] normalises; the
/// other deliberate differences of docs/flags.md concern failures, deletion, restarts and
/// leader election, which no scenario here provokes, and of the refused clones and restores
/// here none meets one: no source claim is unbound, so no claim status is printed, and the
/// snapshot CRDs are installed.)
const ALLOWED: &[Allowed] = &[Allowed {
    scenario: "restores",
    field: "*snapshot snap-fs*finalizers*",
    why: "docs/flags.md \"Clones and snapshot restores\": the refused restore-smaller is still a Pending restore of snap-fs, so ours keeps its protection",
}];

// ------------------------------------------------------------------------------ the two runs

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Upstream,
    Ours,
}

impl Side {
    fn label(self) -> &'static str {
        match self {
            Side::Upstream => "upstream",
            Side::Ours => "ours",
        }
    }
}

/// Both sidecars retry as fast, so that a wait never depends on upstream's 1 s start.
const FAST_RETRIES: [&str; 2] = ["--retry-interval-start=200ms", "--retry-interval-max=2s"];

fn start_sidecar(side: Side, driver: &impl CsiEndpoint, flags: &[&str]) -> Sidecar {
    start_sidecar_with_env(side, driver, flags, Vec::new())
}

/// [`start_sidecar`] with environment variables (`NAMESPACE`, `NODE_NAME`).
fn start_sidecar_with_env(
    side: Side,
    driver: &impl CsiEndpoint,
    flags: &[&str],
    env: Vec<(&'static str, String)>,
) -> Sidecar {
    let mut options = SidecarOptions::args(&FAST_RETRIES);
    options.args.extend(flags.iter().map(|f| (*f).to_owned()));
    options.env = env;
    match side {
        Side::Upstream => Sidecar::start_upstream(driver, options),
        Side::Ours => Sidecar::start_with(driver, options),
    }
}

/// What one run produced, normalised: `requests` (by volume name, oldest first), `pvs` and
/// `claims` (by claim name), and the finalizers of the objects claims were cloned or restored
/// from (`sources`, by `claim <name>` / `snapshot <name>`; empty without such objects).
struct Observed {
    requests: BTreeMap<String, Vec<Value>>,
    pvs: BTreeMap<String, Value>,
    claims: BTreeMap<String, Value>,
    sources: BTreeMap<String, Value>,
    /// The CSIStorageCapacity objects published (by class and segment); empty without
    /// `--enable-capacity`.
    capacities: BTreeMap<String, Value>,
}

impl Observed {
    fn to_value(&self) -> Value {
        let mut value = json!({"requests": self.requests, "pvs": self.pvs, "claims": self.claims});
        // Only where there are sources: the other scenarios' tables stay as they were.
        if !self.sources.is_empty() {
            value["sources"] = json!(self.sources);
        }
        if !self.capacities.is_empty() {
            value["capacities"] = json!(self.capacities);
        }
        value
    }
}

/// The objects a scenario's claims are cloned or restored from: claims and VolumeSnapshots of
/// the scenario's namespace, by name.
struct Sources<'a> {
    claims: &'a [&'a str],
    snapshots: &'a [&'a str],
}

const NO_SOURCES: Sources<'static> = Sources {
    claims: &[],
    snapshots: &[],
};

/// Replaces what differs between the two runs by construction: the namespace (class and Node
/// names contain it), the driver name, claim UIDs (volume and PV names, extra-create-metadata
/// parameters). Volume handles are replaced where they are ([`pv_json`]): the mock's are small
/// numbers, which a replacement everywhere would find in sizes too. So are a CreateVolume's
/// content source ids ([`Normaliser::content_source`]), by the name of the object they are the
/// handle of in that run: a request naming another source than upstream's still differs.
struct Normaliser {
    replacements: Vec<(String, String)>,
    /// A source volume's or snapshot's handle in this run, and what it stands for.
    source_handles: BTreeMap<String, String>,
}

impl Normaliser {
    fn new(namespace: &str, driver: &str) -> Self {
        Normaliser {
            replacements: vec![
                (namespace.to_owned(), "<ns>".to_owned()),
                (driver.to_owned(), "<driver>".to_owned()),
            ],
            source_handles: BTreeMap::new(),
        }
    }

    /// `request` with its content source's id replaced by the source it is the handle of; an
    /// id of no source of this run is kept, so that it differs.
    fn content_source(&self, mut request: Value) -> Value {
        for pointer in [
            "/volume_content_source/volume/volume_id",
            "/volume_content_source/snapshot/snapshot_id",
        ] {
            if let Some(id) = request.pointer_mut(pointer)
                && let Some(source) = id.as_str().and_then(|id| self.source_handles.get(id))
            {
                *id = json!(source);
            }
        }
        request
    }

    fn claim(&mut self, pvc: &PersistentVolumeClaim) {
        let name = pvc.metadata.name.clone().unwrap_or_default();
        let uid = pvc.metadata.uid.clone().unwrap_or_default();
        self.replacements.push((uid, format!("<uid of {name}>")));
    }

    /// `text` with every replacement applied, the longest first (a class name contains the
    /// namespace).
    fn replace(&self, text: &str) -> String {
        let mut replacements: Vec<&(String, String)> = self
            .replacements
            .iter()
            .filter(|(from, _)| !from.is_empty())
            .collect();
        replacements.sort_by_key(|(from, _)| std::cmp::Reverse(from.len()));
        replacements
            .into_iter()
            .fold(text.to_owned(), |out, (from, to)| {
                out.replace(from.as_str(), to)
            })
    }

    /// `value` with every replacement applied to every string and object key in it.
    fn apply(&self, value: &Value) -> Value {
        match value {
            Value::String(s) => Value::String(self.replace(s)),
            Value::Array(items) => Value::Array(items.iter().map(|v| self.apply(v)).collect()),
            Value::Object(map) => Value::Object(
                map.iter()
                    .map(|(k, v)| (self.replace(k), self.apply(v)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }
}

/// The PV as compared: metadata name, annotations, labels and finalizers; the whole spec
/// except the claimRef's uid and resourceVersion; node-affinity expressions sorted by key
/// within each term (upstream's order is Go map order; ours sorted, docs/flags.md "Node
/// affinity"); the volume handle (the driver's choice) and the provisioner identity (a start
/// time and a random number) replaced.
fn pv_json(pv: &PersistentVolume) -> Value {
    let mut value = serde_json::to_value(pv).unwrap_or_else(|e| panic!("PV to JSON: {e}"));
    let metadata = &pv.metadata;
    value["metadata"] = json!({
        "name": metadata.name,
        "annotations": metadata.annotations,
        "labels": metadata.labels,
        "finalizers": metadata.finalizers,
    });
    if let Some(object) = value.as_object_mut() {
        object.remove("status");
    }
    let spec = &mut value["spec"];
    if let Some(claim_ref) = spec.get_mut("claimRef").and_then(Value::as_object_mut) {
        claim_ref.remove("uid");
        claim_ref.remove("resourceVersion");
    }
    if let Some(handle) = spec.pointer_mut("/csi/volumeHandle") {
        *handle = json!("<volume handle>");
    }
    if let Some(identity) = spec
        .pointer_mut("/csi/volumeAttributes")
        .and_then(Value::as_object_mut)
        .and_then(|attributes| attributes.get_mut("storage.kubernetes.io/csiProvisionerIdentity"))
    {
        *identity = json!("<provisioner identity>");
    }
    if let Some(terms) = spec
        .pointer_mut("/nodeAffinity/required/nodeSelectorTerms")
        .and_then(Value::as_array_mut)
    {
        for term in terms {
            if let Some(expressions) = term
                .get_mut("matchExpressions")
                .and_then(Value::as_array_mut)
            {
                expressions.sort_by_key(|e| e["key"].as_str().unwrap_or_default().to_owned());
            }
        }
    }
    value
}

/// The provisioner's events on a claim, as (type, reason, message) without repeats.
async fn provisioner_events(cluster: &Cluster, claim: &str) -> Vec<Value> {
    const REASONS: [&str; 3] = [
        "Provisioning",
        "ProvisioningSucceeded",
        "ProvisioningFailed",
    ];
    let events = events_of(&cluster.client, cluster.ns(), claim)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let unique: BTreeSet<(String, String, String)> = events
        .into_iter()
        .filter(|e| REASONS.contains(&e.reason.as_deref().unwrap_or_default()))
        .map(|e| {
            (
                e.type_.unwrap_or_default(),
                e.reason.unwrap_or_default(),
                e.message.unwrap_or_default(),
            )
        })
        .collect();
    unique
        .into_iter()
        .map(
            |(type_, reason, message)| json!({"type": type_, "reason": reason, "message": message}),
        )
        .collect()
}

/// Collects what the run produced for `claims` once each is settled (`wait` returned):
/// `requests` are the driver's CreateVolume requests; `sources` the objects some of the claims
/// are made from.
async fn observe(
    cluster: &Cluster,
    driver: &impl CsiEndpoint,
    claims: &[&str],
    sources: &Sources<'_>,
    requests: Vec<Value>,
) -> Observed {
    let mut normaliser = Normaliser::new(cluster.ns(), driver.name());
    let observed_sources = observe_sources(cluster, sources, &mut normaliser).await;
    let mut observed_claims = BTreeMap::new();
    for name in claims {
        let pvc = cluster
            .get_claim(name)
            .await
            .unwrap_or_else(|| panic!("PVC {name} is gone"));
        normaliser.claim(&pvc);
        let annotations = pvc.metadata.annotations.clone().unwrap_or_default();
        observed_claims.insert(
            (*name).to_owned(),
            json!({
                "selected-node": annotations.get(ANN_SELECTED_NODE),
                "phase": pvc.status.as_ref().and_then(|s| s.phase.clone()),
                "events": provisioner_events(cluster, name).await,
            }),
        );
    }
    let pvs = driver_pvs(&cluster.client, driver)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut observed_pvs = BTreeMap::new();
    for pv in &pvs {
        let claim = pv
            .spec
            .as_ref()
            .and_then(|spec| spec.claim_ref.as_ref())
            .and_then(|r| r.name.clone())
            .unwrap_or_default();
        observed_pvs.insert(claim, pv_json(pv));
    }
    let mut by_volume: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for request in &requests {
        let request = normaliser.content_source(normaliser.apply(request));
        let name = request["name"].as_str().unwrap_or_default().to_owned();
        by_volume.entry(name).or_default().push(request);
    }
    Observed {
        requests: by_volume,
        pvs: observed_pvs
            .iter()
            .map(|(k, v)| (k.clone(), normaliser.apply(v)))
            .collect(),
        claims: observed_claims
            .iter()
            .map(|(k, v)| (k.clone(), normaliser.apply(v)))
            .collect(),
        sources: observed_sources,
        capacities: BTreeMap::new(),
    }
}

/// The finalizers of each source, and each source's handle for `normaliser`: a source claim's
/// PV's volume handle, a snapshot's content's snapshot handle.
async fn observe_sources(
    cluster: &Cluster,
    sources: &Sources<'_>,
    normaliser: &mut Normaliser,
) -> BTreeMap<String, Value> {
    let mut observed = BTreeMap::new();
    for name in sources.claims {
        let pvc = cluster
            .get_claim(name)
            .await
            .unwrap_or_else(|| panic!("source PVC {name} is gone"));
        if let Some(volume) = pvc.spec.as_ref().and_then(|s| s.volume_name.as_deref()) {
            let handle = cluster.pv(volume).await.spec.and_then(|s| s.csi);
            if let Some(csi) = handle {
                normaliser
                    .source_handles
                    .insert(csi.volume_handle, format!("<volume of claim {name}>"));
            }
        }
        observed.insert(
            format!("claim {name}"),
            json!({"finalizers": pvc.metadata.finalizers}),
        );
    }
    for name in sources.snapshots {
        let snapshot = cluster
            .snapshots()
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("reading VolumeSnapshot {name}: {e}"));
        let content = snapshot
            .status
            .as_ref()
            .and_then(|s| s.bound_volume_snapshot_content_name.clone());
        if let Some(content) = content {
            let content = cluster
                .snapshot_contents()
                .get(&content)
                .await
                .unwrap_or_else(|e| panic!("reading VolumeSnapshotContent {content}: {e}"));
            if let Some(handle) = content.status.and_then(|s| s.snapshot_handle) {
                normaliser
                    .source_handles
                    .insert(handle, format!("<snapshot {name}>"));
            }
        }
        observed.insert(
            format!("snapshot {name}"),
            json!({"finalizers": snapshot.metadata.finalizers}),
        );
    }
    observed
}

// ------------------------------------------------------------------------------ comparison

/// One compared leaf: its path and both values (`None`: absent on that side).
struct Row {
    field: String,
    upstream: Option<Value>,
    ours: Option<Value>,
}

/// Every leaf of both values, paired by path (object keys; array indices).
fn leaves(path: &str, upstream: Option<&Value>, ours: Option<&Value>, rows: &mut Vec<Row>) {
    match (upstream, ours) {
        (Some(Value::Object(a)), Some(Value::Object(b))) if !a.is_empty() || !b.is_empty() => {
            let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for key in keys {
                leaves(&format!("{path}.{key}"), a.get(key), b.get(key), rows);
            }
        }
        (Some(Value::Array(a)), Some(Value::Array(b))) if !a.is_empty() || !b.is_empty() => {
            for i in 0..a.len().max(b.len()) {
                leaves(&format!("{path}[{i}]"), a.get(i), b.get(i), rows);
            }
        }
        (Some(Value::Object(a)), None) if !a.is_empty() => {
            for (key, v) in a {
                leaves(&format!("{path}.{key}"), Some(v), None, rows);
            }
        }
        (None, Some(Value::Object(b))) if !b.is_empty() => {
            for (key, v) in b {
                leaves(&format!("{path}.{key}"), None, Some(v), rows);
            }
        }
        _ => rows.push(Row {
            field: path.to_owned(),
            upstream: upstream.cloned(),
            ours: ours.cloned(),
        }),
    }
}

/// `*` matches any run of characters.
fn glob(pattern: &str, text: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == text,
        Some((head, tail)) => {
            text.starts_with(head)
                && (head.len()..=text.len())
                    .any(|i| text.is_char_boundary(i) && glob(tail, &text[i..]))
        }
    }
}

fn show(value: Option<&Value>) -> String {
    let text = value.map_or_else(|| "<absent>".to_owned(), Value::to_string);
    if text.chars().count() > 70 {
        format!("{}…", text.chars().take(69).collect::<String>())
    } else {
        text
    }
}

/// Prints the table of compared fields and fails on every difference [`ALLOWED`] does not list.
fn compare(scenario: &str, upstream: &Observed, ours: &Observed) {
    let mut rows = Vec::new();
    leaves(
        "",
        Some(&upstream.to_value()),
        Some(&ours.to_value()),
        &mut rows,
    );
    let mut table = format!(
        "\n== differential scenario {scenario}: {} fields compared\n{:<90} | {:<70} | {:<70} | result\n",
        rows.len(),
        "field",
        "upstream",
        "ours"
    );
    let mut failures = Vec::new();
    for row in &rows {
        let field = row.field.trim_start_matches('.');
        let result = if row.upstream == row.ours {
            "same".to_owned()
        } else if let Some(allowed) = ALLOWED
            .iter()
            .find(|a| glob(a.scenario, scenario) && glob(a.field, field))
        {
            format!("allowed: {}", allowed.why)
        } else {
            failures.push(format!(
                "{field}: upstream {}, ours {}",
                show(row.upstream.as_ref()),
                show(row.ours.as_ref())
            ));
            "DIFFERENT".to_owned()
        };
        let _ = writeln!(
            table,
            "{field:<90} | {:<70} | {:<70} | {result}",
            show(row.upstream.as_ref()),
            show(row.ours.as_ref())
        );
    }
    println!("{table}");
    assert!(
        failures.is_empty(),
        "scenario {scenario}: {} difference(s) not in the allow-list:\n{}\nupstream: {:#}\nours: {:#}",
        failures.len(),
        failures.join("\n"),
        upstream.to_value(),
        ours.to_value()
    );
}

// ------------------------------------------------------------------------------ objects

fn class_with(
    name: &str,
    driver: &impl CsiEndpoint,
    reclaim_policy: &str,
    parameters: &[(&str, &str)],
    edit: impl FnOnce(&mut StorageClass),
) -> StorageClass {
    let mut class = storage_class(name, driver, reclaim_policy, parameters);
    edit(&mut class);
    class
}

/// A claim of `size` in `class` with these access modes, volume mode and annotations.
async fn create_claim_with(
    cluster: &Cluster,
    name: &str,
    class: &str,
    size: &str,
    access_modes: &[&str],
    volume_mode: Option<&str>,
    annotations: &[(&str, &str)],
) {
    let mut pvc = claim(name, class, size, volume_mode);
    if let Some(spec) = pvc.spec.as_mut() {
        spec.access_modes = Some(access_modes.iter().map(|m| (*m).to_owned()).collect());
    }
    if !annotations.is_empty() {
        pvc.metadata.annotations = Some(
            annotations
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        );
    }
    create_claim(&cluster.claims, &pvc).await;
}

async fn wait_all_bound(cluster: &Cluster, claims: &[&str]) {
    for name in claims {
        support::eventually(&format!("PVC {name} to be Bound"), TIMEOUT, || async {
            let pvc = cluster.claims.get(name).await.map_err(|e| e.to_string())?;
            let phase = pvc.status.as_ref().and_then(|s| s.phase.clone());
            if phase.as_deref() == Some("Bound") {
                Ok(())
            } else {
                Err(format!(
                    "phase {phase:?}, annotations {:?}",
                    pvc.metadata.annotations
                ))
            }
        })
        .await;
        // Ours writes events asynchronously: compare them once they are there.
        wait_event(
            &cluster.client,
            cluster.ns(),
            name,
            "ProvisioningSucceeded",
            |_| true,
        )
        .await;
    }
}

// ------------------------------------------------------------------------------ scenarios

/// Immediate claims without topology on the e2e mock: class parameters, a provisioner secret
/// from templates, fsType from the class and from `--default-fstype`, block and filesystem
/// volumes, every access mode, mount options, Retain, `--extra-create-metadata`.
async fn immediate_plain(side: Side) -> Observed {
    // The binary's other tests need kube-scheduler: whichever test comes first starts it.
    support::control_plane_with_scheduler();
    let cluster = Cluster::new(&format!("diff-plain-{}", side.label())).await;
    let driver = MockDriver::start(MockDriverOptions::default()).await;
    let secret_templates = [
        ("type", "fast"),
        ("csi.storage.k8s.io/fstype", "xfs"),
        (
            "csi.storage.k8s.io/provisioner-secret-name",
            "${pvc.name}-creds",
        ),
        (
            "csi.storage.k8s.io/provisioner-secret-namespace",
            "${pvc.namespace}",
        ),
    ];
    let with_secret = format!("{}-secret", cluster.ns());
    let class = class_with(&with_secret, &driver, "Retain", &secret_templates, |c| {
        c.mount_options = Some(vec!["noatime".to_owned(), "nodiratime".to_owned()]);
        c.allow_volume_expansion = Some(true);
    });
    create_class(&cluster.client, &class).await;
    let plain = format!("{}-plain", cluster.ns());
    create_class(
        &cluster.client,
        &class_with(&plain, &driver, "Delete", &[], |_| {}),
    )
    .await;
    for claim in ["fs-rwo", "block-rwx"] {
        cluster
            .create_secret(&format!("{claim}-creds"), &[("password", "not-logged")])
            .await;
    }
    let claims = ["fs-rwo", "block-rwx", "default-fs-rox", "rwop", "rwx-big"];
    create_claim_with(
        &cluster,
        "fs-rwo",
        &with_secret,
        "1Gi",
        &["ReadWriteOnce"],
        None,
        &[],
    )
    .await;
    create_claim_with(
        &cluster,
        "block-rwx",
        &with_secret,
        "2Gi",
        &["ReadWriteMany"],
        Some("Block"),
        &[],
    )
    .await;
    create_claim_with(
        &cluster,
        "default-fs-rox",
        &plain,
        "1Gi",
        &["ReadOnlyMany"],
        None,
        &[],
    )
    .await;
    create_claim_with(
        &cluster,
        "rwop",
        &plain,
        "1Gi",
        &["ReadWriteOncePod"],
        None,
        &[],
    )
    .await;
    create_claim_with(
        &cluster,
        "rwx-big",
        &plain,
        "1500Mi",
        &["ReadWriteMany", "ReadOnlyMany"],
        None,
        &[],
    )
    .await;
    let mut sidecar = start_sidecar(
        side,
        &driver,
        &["--extra-create-metadata", "--default-fstype=ext4"],
    );
    wait_all_bound(&cluster, &claims).await;
    // Both sidecars take their finalizer off a Retain PV a moment after creating it; the PVs
    // are compared once that has happened, not while it may be under way.
    for retained in ["fs-rwo", "block-rwx"] {
        let volume = cluster
            .get_claim(retained)
            .await
            .and_then(|pvc| pvc.spec?.volume_name)
            .unwrap_or_else(|| panic!("PVC {retained} is bound to no PV"));
        cluster.wait_pv_finalizer_gone(&volume).await;
    }
    sidecar.assert_running();
    drop(sidecar);
    observe(
        &cluster,
        &driver,
        &claims,
        &NO_SOURCES,
        driver.create_volume_requests(),
    )
    .await
}

/// A scenario's topology keys: a zone and a rack (two keys, so that node affinity has two
/// expressions, whose order upstream does not keep), unique to the scenario.
struct Keys {
    zone: String,
    rack: String,
}

impl Keys {
    fn of(scenario: &str) -> Self {
        Keys {
            zone: format!("{scenario}.diff.example/zone"),
            rack: format!("{scenario}.diff.example/rack"),
        }
    }

    /// The segment of `zone`: `zone=<zone>,rack=r-<zone>`.
    fn segment(&self, zone: &str) -> String {
        format!("{}={zone},{}=r-{zone}", self.zone, self.rack)
    }
}

/// A scenario's Nodes: one per zone of `zones`, labelled with its segment, with CSINodes of
/// the driver naming both keys.
async fn zone_nodes(topology: &Topology, driver: &Driver, keys: &Keys, zones: &[&str]) {
    for zone in zones {
        let rack = format!("r-{zone}");
        let node = topology
            .create_node(
                &format!("node-{zone}"),
                &[(keys.zone.as_str(), zone), (keys.rack.as_str(), &rack)],
            )
            .await;
        topology
            .create_csi_node(
                &node,
                driver.name(),
                &format!("id-{zone}"),
                &[&keys.zone, &keys.rack],
            )
            .await;
    }
}

/// The reference driver with one segment per zone (`capacities` overrides some).
async fn zone_driver(keys: &Keys, zones: &[&str], capacities: &[(&str, &str)]) -> Driver {
    let segments: Vec<String> = zones
        .iter()
        .map(|zone| {
            let capacity = capacities
                .iter()
                .find(|(z, _)| z == zone)
                .map(|(_, c)| format!(":{c}"))
                .unwrap_or_default();
            format!("{}{capacity}", keys.segment(zone))
        })
        .collect();
    let args: Vec<&str> = segments
        .iter()
        .flat_map(|segment| ["--segment", segment.as_str()])
        .collect();
    Driver::start(&args).await
}

const ZONES: [&str; 3] = ["z1", "z2", "z3"];

/// Immediate claims with the topology of three zones: every Node's segment is requisite, the
/// preferred order follows the StatefulSet rule for `www-web-N`.
async fn topology_immediate(side: Side) -> Observed {
    let keys = Keys::of("immediate");
    let (cluster, topology) = scheduling_cluster(&format!("diff-topo-{}", side.label())).await;
    let driver = zone_driver(&keys, &ZONES, &[]).await;
    zone_nodes(&topology, &driver, &keys, &ZONES).await;
    let class = cluster.class("zones", &driver, "Delete", &[]).await;
    let claims = ["data", "www-web-0", "www-web-1", "www-web-2"];
    for name in claims {
        cluster.claim(name, &class).await;
    }
    let mut sidecar = start_sidecar(side, &driver, &[]);
    wait_all_bound(&cluster, &claims).await;
    sidecar.assert_running();
    drop(sidecar);
    observe(
        &cluster,
        &driver,
        &claims,
        &NO_SOURCES,
        driver.create_volume_requests(),
    )
    .await
}

/// Immediate claims in a class whose allowedTopologies name two of the three zones.
async fn allowed_topologies(side: Side) -> Observed {
    let keys = Keys::of("allowed");
    let (cluster, topology) = scheduling_cluster(&format!("diff-allowed-{}", side.label())).await;
    let driver = zone_driver(&keys, &ZONES, &[]).await;
    zone_nodes(&topology, &driver, &keys, &ZONES).await;
    let name = format!("{}-allowed", cluster.ns());
    let class = class_with(&name, &driver, "Delete", &[], |c| {
        c.allowed_topologies = Some(vec![TopologySelectorTerm {
            match_label_expressions: Some(vec![TopologySelectorLabelRequirement {
                key: keys.zone.clone(),
                values: vec!["z3".to_owned(), "z2".to_owned()],
            }]),
        }]);
    });
    create_class(&cluster.client, &class).await;
    let claims = ["data", "www-web-1"];
    for claim in claims {
        cluster.claim(claim, &name).await;
    }
    let mut sidecar = start_sidecar(side, &driver, &[]);
    wait_all_bound(&cluster, &claims).await;
    sidecar.assert_running();
    drop(sidecar);
    observe(
        &cluster,
        &driver,
        &claims,
        &NO_SOURCES,
        driver.create_volume_requests(),
    )
    .await
}

/// `--strict-topology` and a WaitForFirstConsumer claim whose node was selected by hand.
async fn strict_wffc(side: Side) -> Observed {
    let keys = Keys::of("strict");
    let (cluster, topology) = scheduling_cluster(&format!("diff-strict-{}", side.label())).await;
    let driver = zone_driver(&keys, &ZONES, &[]).await;
    zone_nodes(&topology, &driver, &keys, &ZONES).await;
    let class = topology.wffc_class("wffc", driver.name()).await;
    let node = topology.node_name("node-z2");
    let claims = ["data"];
    create_claim_with(
        &cluster,
        "data",
        &class,
        "1Gi",
        &["ReadWriteOnce"],
        None,
        &[(ANN_SELECTED_NODE, node.as_str())],
    )
    .await;
    let mut sidecar = start_sidecar(side, &driver, &["--strict-topology"]);
    wait_all_bound(&cluster, &claims).await;
    sidecar.assert_running();
    drop(sidecar);
    observe(
        &cluster,
        &driver,
        &claims,
        &NO_SOURCES,
        driver.create_volume_requests(),
    )
    .await
}

/// WaitForFirstConsumer claims whose pods kube-scheduler puts on three different Nodes.
async fn wffc_several_nodes(side: Side) -> Observed {
    let keys = Keys::of("wffc");
    let (cluster, topology) = scheduling_cluster(&format!("diff-wffc-{}", side.label())).await;
    let driver = zone_driver(&keys, &ZONES, &[]).await;
    zone_nodes(&topology, &driver, &keys, &ZONES).await;
    let class = topology.wffc_class("wffc", driver.name()).await;
    let mut sidecar = start_sidecar(side, &driver, &[]);
    let claims = ["vol-z1", "vol-z2", "vol-z3"];
    for (claim, zone) in claims.iter().zip(ZONES) {
        cluster.claim(claim, &class).await;
        topology
            .create_pod(
                &format!("app-{zone}"),
                &[*claim],
                &[(keys.zone.as_str(), zone)],
            )
            .await;
    }
    wait_all_bound(&cluster, &claims).await;
    sidecar.assert_running();
    drop(sidecar);
    observe(
        &cluster,
        &driver,
        &claims,
        &NO_SOURCES,
        driver.create_volume_requests(),
    )
    .await
}

/// ResourceExhausted on the selected node: `--strict-topology` allows only node-z1's zone,
/// which is full. Both sidecars must remove the selected node and say why.
async fn reschedule(side: Side) -> Observed {
    let keys = Keys::of("reschedule");
    let (cluster, topology) =
        scheduling_cluster(&format!("diff-reschedule-{}", side.label())).await;
    let driver = zone_driver(&keys, &ZONES, &[("z1", "1Mi")]).await;
    zone_nodes(&topology, &driver, &keys, &ZONES).await;
    let class = topology.wffc_class("wffc", driver.name()).await;
    let node = topology.node_name("node-z1");
    create_claim_with(
        &cluster,
        "data",
        &class,
        "1Gi",
        &["ReadWriteOnce"],
        None,
        &[(ANN_SELECTED_NODE, node.as_str())],
    )
    .await;
    let mut sidecar = start_sidecar(side, &driver, &["--strict-topology"]);
    // Both events before the sidecar stops: ours sends the Warning at once and the Normal
    // `Provisioning` when its rate limit has room (docs/flags.md), so it may come second.
    wait_refused(&cluster, "data", "ProvisioningFailed").await;
    support::eventually("the selected node to be removed", TIMEOUT, || async {
        match topology.selected_node("data").await {
            None => Ok(()),
            Some(node) => Err(node),
        }
    })
    .await;
    sidecar.assert_running();
    drop(sidecar);
    observe(
        &cluster,
        &driver,
        &["data"],
        &NO_SOURCES,
        driver.create_volume_requests(),
    )
    .await
}

// ------------------------------------------------------------------------------ clones and restores

/// The source claims of the clone and restore scenarios (1Gi each) and their snapshots.
const SOURCE_FS: &str = "src-fs";
const SOURCE_BLOCK: &str = "src-block";
const SNAPSHOT_FS: &str = "snap-fs";
const SNAPSHOT_BLOCK: &str = "snap-block";

/// A run of a clone or restore scenario: the reference driver (CLONE_VOLUME and snapshots, its
/// `--request-log` gives the content source) without topology, the sidecar, and the bound
/// source claims.
struct SourceRun {
    cluster: Cluster,
    driver: Driver,
    sidecar: Sidecar,
    class: String,
}

async fn source_run(side: Side, prefix: &str) -> SourceRun {
    support::control_plane_with_scheduler();
    let cluster = Cluster::new(&format!("{prefix}-{}", side.label())).await;
    let driver = Driver::start(&[]).await;
    let class = cluster.class("sources", &driver, "Delete", &[]).await;
    create_claim_with(
        &cluster,
        SOURCE_FS,
        &class,
        "1Gi",
        &["ReadWriteOnce"],
        None,
        &[],
    )
    .await;
    create_claim_with(
        &cluster,
        SOURCE_BLOCK,
        &class,
        "1Gi",
        &["ReadWriteOnce"],
        Some("Block"),
        &[],
    )
    .await;
    let sidecar = start_sidecar(side, &driver, &[]);
    wait_all_bound(&cluster, &[SOURCE_FS, SOURCE_BLOCK]).await;
    SourceRun {
        cluster,
        driver,
        sidecar,
        class,
    }
}

/// Where a claim's content comes from: `dataSource` (the API server copies it to
/// `dataSourceRef`) or only `dataSourceRef`, as a populator's claim names its kind.
enum Origin<'a> {
    DataSource {
        api_group: Option<&'a str>,
        kind: &'a str,
        name: &'a str,
    },
    DataSourceRef {
        api_group: &'a str,
        kind: &'a str,
        name: &'a str,
    },
}

impl<'a> Origin<'a> {
    fn claim(name: &'a str) -> Self {
        Origin::DataSource {
            api_group: None,
            kind: "PersistentVolumeClaim",
            name,
        }
    }

    fn snapshot(name: &'a str) -> Self {
        Origin::DataSource {
            api_group: Some("snapshot.storage.k8s.io"),
            kind: "VolumeSnapshot",
            name,
        }
    }
}

/// A ReadWriteOnce claim of `size` in `class` whose content comes `from` a source.
async fn create_claim_from(
    run: &SourceRun,
    name: &str,
    size: &str,
    volume_mode: Option<&str>,
    from: Origin<'_>,
) {
    let mut pvc = claim(name, &run.class, size, volume_mode);
    if let Some(spec) = pvc.spec.as_mut() {
        match from {
            Origin::DataSource {
                api_group,
                kind,
                name,
            } => {
                spec.data_source = Some(TypedLocalObjectReference {
                    api_group: api_group.map(str::to_owned),
                    kind: kind.to_owned(),
                    name: name.to_owned(),
                });
            }
            Origin::DataSourceRef {
                api_group,
                kind,
                name,
            } => {
                spec.data_source_ref = Some(TypedObjectReference {
                    api_group: Some(api_group.to_owned()),
                    kind: kind.to_owned(),
                    name: name.to_owned(),
                    namespace: None,
                });
            }
        }
    }
    let created = create_claim(&run.cluster.claims, &pvc).await;
    eprintln!(
        "DEBUG created {name}: {:?} / {:?}",
        created.spec.as_ref().unwrap().data_source,
        created.spec.as_ref().unwrap().data_source_ref
    );
}

/// Waits until the sidecar has said that it works on `claim` and then the event `reason`.
async fn wait_refused(cluster: &Cluster, claim: &str, reason: &str) {
    for reason in ["Provisioning", reason] {
        wait_event(&cluster.client, cluster.ns(), claim, reason, |_| true).await;
    }
}

/// Waits until the restores' provisioner finalizer is off `snapshots` (both sidecars take it
/// off once the restored volume exists; a restore may have put it back just before).
async fn wait_snapshots_released(cluster: &Cluster, snapshots: &[&str]) {
    for name in snapshots {
        support::eventually(
            &format!("the provisioner's finalizer to be off VolumeSnapshot {name}"),
            TIMEOUT,
            || async {
                let snapshot = cluster
                    .snapshots()
                    .get(name)
                    .await
                    .map_err(|e| e.to_string())?;
                let finalizers = snapshot.metadata.finalizers.unwrap_or_default();
                if finalizers
                    .iter()
                    .any(|f| f == SNAPSHOT_PROTECTION_FINALIZER)
                {
                    Err(format!("finalizers {finalizers:?}"))
                } else {
                    Ok(())
                }
            },
        )
        .await;
    }
}

/// Clones of the bound source claims into an equal and a larger filesystem claim and into a
/// block claim; refused: a smaller claim, another volume mode, a source claim that does not
/// exist.
async fn clones(side: Side) -> Observed {
    let mut run = source_run(side, "diff-clone").await;
    // As in [`restores`]: one source's clones one after another, upstream's protection of the
    // source may conflict otherwise.
    create_claim_from(&run, "clone-fs", "1Gi", None, Origin::claim(SOURCE_FS)).await;
    wait_all_bound(&run.cluster, &["clone-fs"]).await;
    create_claim_from(
        &run,
        "clone-fs-larger",
        "2Gi",
        None,
        Origin::claim(SOURCE_FS),
    )
    .await;
    create_claim_from(
        &run,
        "clone-block",
        "1Gi",
        Some("Block"),
        Origin::claim(SOURCE_BLOCK),
    )
    .await;
    create_claim_from(
        &run,
        "clone-smaller",
        "512Mi",
        None,
        Origin::claim(SOURCE_FS),
    )
    .await;
    create_claim_from(
        &run,
        "clone-fs-into-block",
        "1Gi",
        Some("Block"),
        Origin::claim(SOURCE_FS),
    )
    .await;
    create_claim_from(
        &run,
        "clone-missing",
        "1Gi",
        None,
        Origin::claim("no-such-claim"),
    )
    .await;
    let cluster = &run.cluster;
    wait_all_bound(cluster, &["clone-fs-larger", "clone-block"]).await;
    for refused in ["clone-smaller", "clone-fs-into-block", "clone-missing"] {
        wait_refused(cluster, refused, "ProvisioningFailed").await;
    }
    run.sidecar.assert_running();
    drop(run.sidecar);
    let claims = [
        SOURCE_FS,
        SOURCE_BLOCK,
        "clone-fs",
        "clone-fs-larger",
        "clone-block",
        "clone-smaller",
        "clone-fs-into-block",
        "clone-missing",
    ];
    let sources = Sources {
        claims: &[SOURCE_FS, SOURCE_BLOCK],
        snapshots: &[],
    };
    let requests = run.driver.create_volume_requests();
    observe(cluster, &run.driver, &claims, &sources, requests).await
}

/// Restores of VolumeSnapshots (taken through snapshot-controller and csi-snapshotter) into an
/// equal and a larger filesystem claim and of a block snapshot into a block claim; refused: a
/// smaller claim, a snapshot that does not exist, a VolumeSnapshot of another API group; and a
/// populator's kind, left alone.
async fn restores(side: Side) -> Observed {
    let mut run = source_run(side, "diff-restore").await;
    let snapshotter = Snapshotter::start(&run.driver);
    let cluster = &run.cluster;
    let snapshot_class = cluster.snapshot_class("snap", &run.driver).await;
    for (snapshot, claim) in [(SNAPSHOT_FS, SOURCE_FS), (SNAPSHOT_BLOCK, SOURCE_BLOCK)] {
        cluster
            .take_snapshot(snapshot, claim, &snapshot_class, &snapshotter)
            .await;
    }
    let from_fs = || Origin::snapshot(SNAPSHOT_FS);
    // Upstream protects a source with an update of the object its cache holds: two first
    // restores of one snapshot at once may conflict ("Operation cannot be fulfilled", a
    // ProvisioningFailed event of one run only). One source's restores go one after another.
    create_claim_from(&run, "restore-fs", "1Gi", None, from_fs()).await;
    wait_all_bound(cluster, &["restore-fs"]).await;
    create_claim_from(&run, "restore-fs-larger", "2Gi", None, from_fs()).await;
    create_claim_from(
        &run,
        "restore-block",
        "1Gi",
        Some("Block"),
        Origin::snapshot(SNAPSHOT_BLOCK),
    )
    .await;
    create_claim_from(&run, "restore-smaller", "512Mi", None, from_fs()).await;
    create_claim_from(
        &run,
        "restore-missing",
        "1Gi",
        None,
        Origin::snapshot("no-such-snapshot"),
    )
    .await;
    let wrong_group = Origin::DataSourceRef {
        api_group: "wrong.example.com",
        kind: "VolumeSnapshot",
        name: SNAPSHOT_FS,
    };
    create_claim_from(&run, "restore-wrong-group", "1Gi", None, wrong_group).await;
    let populator = Origin::DataSourceRef {
        api_group: "populator.example.com",
        kind: "Backup",
        name: "nightly",
    };
    create_claim_from(&run, "populated", "1Gi", None, populator).await;
    let restored = ["restore-fs-larger", "restore-block"];
    wait_all_bound(cluster, &restored).await;
    for refused in ["restore-smaller", "restore-missing", "restore-wrong-group"] {
        wait_refused(cluster, refused, "ProvisioningFailed").await;
    }
    wait_event(
        &cluster.client,
        cluster.ns(),
        "populated",
        "Provisioning",
        |m| m.contains("populator"),
    )
    .await;
    // Ours keeps snap-fs protected while the refused restore-smaller is a Pending restore of
    // it (ALLOWED); upstream's release after restore-fs-larger does not look.
    match side {
        Side::Upstream => wait_snapshots_released(cluster, &[SNAPSHOT_FS, SNAPSHOT_BLOCK]).await,
        Side::Ours => wait_snapshots_released(cluster, &[SNAPSHOT_BLOCK]).await,
    }
    run.sidecar.assert_running();
    snapshotter
        .check_running()
        .unwrap_or_else(|stopped| panic!("{stopped}"));
    drop(run.sidecar);
    let claims = [
        SOURCE_FS,
        SOURCE_BLOCK,
        "restore-fs",
        "restore-fs-larger",
        "restore-block",
        "restore-smaller",
        "restore-missing",
        "restore-wrong-group",
        "populated",
    ];
    let sources = Sources {
        claims: &[SOURCE_FS, SOURCE_BLOCK],
        snapshots: &[SNAPSHOT_FS, SNAPSHOT_BLOCK],
    };
    let requests = run.driver.create_volume_requests();
    observe(cluster, &run.driver, &claims, &sources, requests).await
}

// ------------------------------------------------------------------------------ capacity

const CAPACITY_DRIVER_LABEL: &str = "csi.storage.k8s.io/drivername";

/// The CSIStorageCapacity objects of `driver` in the scenario's namespace, keyed by managed-by
/// label, class and segment (a duplicate gets `#2`), as compared: everything but the name the
/// server generated, the UID and the resourceVersion.
async fn capacity_objects(cluster: &Cluster, driver: &str) -> BTreeMap<String, Value> {
    let api: Api<CSIStorageCapacity> = Api::namespaced(cluster.client.clone(), cluster.ns());
    let listed = api
        .list(&ListParams::default().labels(&format!("{CAPACITY_DRIVER_LABEL}={driver}")))
        .await
        .unwrap_or_else(|e| panic!("list CSIStorageCapacities: {e}"));
    let mut objects = BTreeMap::new();
    for object in listed.items {
        let labels = object.metadata.labels.clone().unwrap_or_default();
        let segment: Vec<String> = object
            .node_topology
            .as_ref()
            .and_then(|selector| selector.match_labels.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|(key, value)| format!("{key}={value}"))
            .collect();
        let base = format!(
            "{} {} [{}]",
            labels
                .get("csi.storage.k8s.io/managed-by")
                .map_or("-", String::as_str),
            object.storage_class_name,
            segment.join(",")
        );
        let mut key = base.clone();
        let mut copy = 1;
        while objects.contains_key(&key) {
            copy += 1;
            key = format!("{base}#{copy}");
        }
        let owners: Vec<Value> = object
            .metadata
            .owner_references
            .iter()
            .flatten()
            .map(|owner| {
                json!({"apiVersion": owner.api_version, "kind": owner.kind, "name": owner.name,
                       "controller": owner.controller, "blockOwnerDeletion": owner.block_owner_deletion})
            })
            .collect();
        objects.insert(
            key,
            json!({
                "generateName": object.metadata.generate_name,
                "labels": labels,
                "ownerReferences": owners,
                "storageClassName": object.storage_class_name,
                "nodeTopology": object.node_topology,
                "capacity": object.capacity,
                "maximumVolumeSize": object.maximum_volume_size,
            }),
        );
    }
    objects
}

/// `objects` (by [`capacity_objects`]' key) with the run's namespace and driver name replaced.
fn normalised_capacities(
    cluster: &Cluster,
    driver: &str,
    objects: &BTreeMap<String, Value>,
) -> BTreeMap<String, Value> {
    let normaliser = Normaliser::new(cluster.ns(), driver);
    objects
        .iter()
        .map(|(key, object)| (normaliser.replace(key), normaliser.apply(object)))
        .collect()
}

/// Waits until the published objects are `expected` many and `settled` accepts them.
async fn wait_capacities(
    cluster: &Cluster,
    driver: &str,
    expected: usize,
    settled: impl Fn(&BTreeMap<String, Value>) -> bool,
) -> BTreeMap<String, Value> {
    support::eventually(
        &format!("{expected} CSIStorageCapacity objects of {driver}"),
        TIMEOUT,
        || async {
            let objects = capacity_objects(cluster, driver).await;
            if objects.len() == expected && settled(&objects) {
                Ok(objects)
            } else {
                Err(format!("{objects:#?}"))
            }
        },
    )
    .await
}

/// Central capacity tracking: three zones whose driver reports different capacities (one
/// zone full), two WaitForFirstConsumer classes (one with parameters) and an Immediate class
/// (not published without `--capacity-for-immediate-binding`), no owner.
async fn capacity_central(side: Side) -> Observed {
    let keys = Keys::of("capacity");
    let (cluster, topology) = scheduling_cluster(&format!("diff-capacity-{}", side.label())).await;
    let driver = zone_driver(&keys, &ZONES, &[("z1", "10Gi"), ("z2", "3Mi"), ("z3", "0")]).await;
    zone_nodes(&topology, &driver, &keys, &ZONES).await;
    topology.wffc_class("fast", driver.name()).await;
    let slow = format!("{}-slow", cluster.ns());
    let class = class_with(&slow, &driver, "Delete", &[("tier", "slow")], |c| {
        c.volume_binding_mode = Some("WaitForFirstConsumer".to_owned());
    });
    create_class(&cluster.client, &class).await;
    cluster.class("immediate", &driver, "Delete", &[]).await;
    let mut sidecar = start_sidecar_with_env(
        side,
        &driver,
        &[
            "--enable-capacity",
            "--capacity-ownerref-level=-1",
            "--capacity-poll-interval=2s",
        ],
        vec![("NAMESPACE", cluster.ns().to_owned())],
    );
    let objects = wait_capacities(&cluster, driver.name(), ZONES.len() * 2, |objects| {
        objects.values().all(|object| !object["capacity"].is_null())
    })
    .await;
    sidecar.assert_running();
    drop(sidecar);
    let mut observed = observe(&cluster, &driver, &[], &NO_SOURCES, Vec::new()).await;
    observed.capacities = normalised_capacities(&cluster, driver.name(), &objects);
    observed
}

/// `--node-deployment` with `--enable-capacity`: two Nodes, each with its own driver
/// instance (the node's own segment) and its own sidecar; a WaitForFirstConsumer claim per
/// node whose pod kube-scheduler puts there. Compared: each instance's CreateVolume request,
/// the PVs, and each node's capacity object after the provisioning refreshed it.
async fn node_mode(side: Side) -> Observed {
    let key = "node.diff.example/node";
    let (cluster, topology) = scheduling_cluster(&format!("diff-node-{}", side.label())).await;
    let nodes = [topology.node_name("n1"), topology.node_name("n2")];
    let first = Driver::start(&[
        "--node-id",
        &nodes[0],
        "--topology",
        &format!("{key}={}", nodes[0]),
        "--capacity=10Gi",
    ])
    .await;
    let second = first
        .twin(&[
            "--node-id",
            &nodes[1],
            "--topology",
            &format!("{key}={}", nodes[1]),
            "--capacity=10Gi",
        ])
        .await;
    for (suffix, node) in ["n1", "n2"].iter().zip(&nodes) {
        topology.create_node(suffix, &[(key, node.as_str())]).await;
        topology
            .create_csi_node(node, first.name(), node, &[key])
            .await;
    }
    let class = topology.wffc_class("local", first.name()).await;
    let sidecars: Vec<Sidecar> = [&first, &second]
        .iter()
        .zip(&nodes)
        .map(|(driver, node)| {
            start_sidecar_with_env(
                side,
                *driver,
                &[
                    "--node-deployment",
                    "--enable-capacity",
                    "--capacity-ownerref-level=-1",
                    "--capacity-poll-interval=10m",
                ],
                vec![
                    ("NODE_NAME", node.clone()),
                    ("NAMESPACE", cluster.ns().to_owned()),
                ],
            )
        })
        .collect();
    let claims = ["vol-n1", "vol-n2"];
    for (claim, node) in claims.iter().zip(&nodes) {
        cluster.claim(claim, &class).await;
        topology
            .create_pod(&format!("app-{claim}"), &[*claim], &[(key, node.as_str())])
            .await;
    }
    wait_all_bound(&cluster, &claims).await;
    // Each node's object shows the claim of 1 GiB taken from its 10 GiB.
    let objects = wait_capacities(&cluster, first.name(), nodes.len(), |objects| {
        objects
            .values()
            .all(|object| object["capacity"] == json!("9Gi"))
    })
    .await;
    for mut sidecar in sidecars {
        sidecar.assert_running();
    }
    let mut requests = first.create_volume_requests();
    requests.extend(second.create_volume_requests());
    let mut observed = observe(&cluster, &first, &claims, &NO_SOURCES, requests).await;
    observed.capacities = normalised_capacities(&cluster, first.name(), &objects);
    observed
}

/// VolumeAttributesClasses that exist before their claims, with the reference driver reporting
/// MODIFY_VOLUME: a claim naming our driver's class (its parameters become `mutable_parameters`,
/// the PV names the class, kube-controller-manager binds it); a claim naming another driver's
/// class (refused); a claim without a class.
async fn attributes_classes(side: Side) -> Observed {
    support::control_plane_with_scheduler();
    let cluster = Cluster::new(&format!("diff-vac-{}", side.label())).await;
    let driver = Driver::start(&["--modify-volume"]).await;
    let class = cluster
        .class("vac", &driver, "Delete", &[("type", "fast")])
        .await;
    let gold = cluster
        .attributes_class(
            "gold",
            driver.name(),
            &[("iops", "3000"), ("csi.storage.k8s.io/fstype", "xfs")],
        )
        .await;
    let foreign = cluster
        .attributes_class("foreign", "other.csi.example.com", &[("iops", "100")])
        .await;
    for (name, attributes_class) in [("tuned", &gold), ("foreign", &foreign)] {
        create_claim(
            &cluster.claims,
            &attributes_class_claim(name, &class, attributes_class),
        )
        .await;
    }
    create_claim(&cluster.claims, &claim("plain", &class, "1Gi", None)).await;
    let mut sidecar = start_sidecar(side, &driver, &[]);
    wait_all_bound(&cluster, &["tuned", "plain"]).await;
    wait_refused(&cluster, "foreign", "ProvisioningFailed").await;
    sidecar.assert_running();
    drop(sidecar);
    let requests = driver.create_volume_requests();
    let claims = ["tuned", "foreign", "plain"];
    let observed = observe(&cluster, &driver, &claims, &NO_SOURCES, requests).await;
    for name in [gold, foreign] {
        cluster.delete_attributes_class(&name).await;
    }
    observed
}

// ------------------------------------------------------------------------------ tests

/// In-tree migration: the reference driver named `pd.csi.storage.gke.io` (ids in the GCE
/// format), a `kubernetes.io/gce-pd` class with `zone` and `fstype`. The PV is an in-tree one
/// (no CSI driver to find it by): it is read by the claim's volume name, once
/// kube-controller-manager has marked it migrated. The driver name is fixed, so this is the
/// one scenario using it.
async fn migration(side: Side) -> Observed {
    const GCE_DRIVER: &str = "pd.csi.storage.gke.io";
    support::control_plane_with_scheduler();
    let cluster = Cluster::new(&format!("diff-migration-{}", side.label())).await;
    let driver = Driver::start_as(
        GCE_DRIVER,
        &[
            "--topology",
            "topology.gke.io/zone=us-central1-a",
            "--volume-id-prefix",
            "projects/UNSPECIFIED/zones/us-central1-a/disks/",
        ],
    )
    .await;
    let name = format!("{}-gce", cluster.ns());
    let class = class_with(
        &name,
        &driver,
        "Delete",
        &[
            ("zone", "us-central1-a"),
            ("fstype", "ext4"),
            ("type", "pd-ssd"),
        ],
        |c| "kubernetes.io/gce-pd".clone_into(&mut c.provisioner),
    );
    create_class(&cluster.client, &class).await;
    let claims = ["data"];
    cluster.claim("data", &name).await;
    let mut sidecar = start_sidecar(side, &driver, &[]);
    wait_all_bound(&cluster, &claims).await;
    let volume = cluster
        .get_claim("data")
        .await
        .and_then(|pvc| pvc.spec?.volume_name)
        .expect("a bound claim names its PV");
    let pv = support::eventually("the PV to be marked migrated", TIMEOUT, || async {
        let pv = cluster.pv(&volume).await;
        let migrated = pv
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("pv.kubernetes.io/migrated-to"))
            .is_some();
        if migrated {
            Ok(pv)
        } else {
            Err("not yet".to_owned())
        }
    })
    .await;
    let mut observed = observe(
        &cluster,
        &driver,
        &claims,
        &NO_SOURCES,
        driver.create_volume_requests(),
    )
    .await;
    let mut normaliser = Normaliser::new(cluster.ns(), driver.name());
    if let Some(pvc) = cluster.get_claim("data").await {
        normaliser.claim(&pvc);
    }
    observed
        .pvs
        .insert("data".to_owned(), normaliser.apply(&pv_json(&pv)));
    cluster.delete_claim("data").await;
    let _ = Api::<StorageClass>::all(cluster.client.clone())
        .delete(&name, &Default::default())
        .await;
    // The second run must not find this run's PV (same driver name): each sidecar deletes
    // its own, with the GCE handle translated from the in-tree PV.
    cluster.wait_pv_gone(&volume).await;
    assert!(driver.volumes().is_empty(), "{:?}", driver.volumes());
    sidecar.assert_running();
    drop(sidecar);
    observed
}

#[tokio::test]
async fn in_tree_migration_matches_upstream() {
    let upstream = migration(Side::Upstream).await;
    let ours = migration(Side::Ours).await;
    compare("migration", &upstream, &ours);
}

#[tokio::test]
async fn immediate_claims_without_topology_match_upstream() {
    let upstream = immediate_plain(Side::Upstream).await;
    let ours = immediate_plain(Side::Ours).await;
    compare("immediate-plain", &upstream, &ours);
}

#[tokio::test]
async fn immediate_claims_with_topology_match_upstream() {
    let upstream = topology_immediate(Side::Upstream).await;
    let ours = topology_immediate(Side::Ours).await;
    compare("topology-immediate", &upstream, &ours);
}

#[tokio::test]
async fn allowed_topologies_match_upstream() {
    let upstream = allowed_topologies(Side::Upstream).await;
    let ours = allowed_topologies(Side::Ours).await;
    compare("allowed-topologies", &upstream, &ours);
}

#[tokio::test]
async fn strict_topology_with_a_selected_node_matches_upstream() {
    let upstream = strict_wffc(Side::Upstream).await;
    let ours = strict_wffc(Side::Ours).await;
    compare("strict-wffc", &upstream, &ours);
}

#[tokio::test]
async fn wait_for_first_consumer_on_several_nodes_matches_upstream() {
    let upstream = wffc_several_nodes(Side::Upstream).await;
    let ours = wffc_several_nodes(Side::Ours).await;
    compare("wffc-several-nodes", &upstream, &ours);
}

#[tokio::test]
async fn reschedule_after_resource_exhausted_matches_upstream() {
    let upstream = reschedule(Side::Upstream).await;
    let ours = reschedule(Side::Ours).await;
    compare("reschedule", &upstream, &ours);
}

#[tokio::test]
async fn clones_match_upstream() {
    let upstream = clones(Side::Upstream).await;
    let ours = clones(Side::Ours).await;
    compare("clones", &upstream, &ours);
}

#[tokio::test]
async fn attributes_classes_match_upstream() {
    let upstream = attributes_classes(Side::Upstream).await;
    let ours = attributes_classes(Side::Ours).await;
    compare("attributes-classes", &upstream, &ours);
}

#[tokio::test]
async fn restores_match_upstream() {
    let upstream = restores(Side::Upstream).await;
    let ours = restores(Side::Ours).await;
    compare("restores", &upstream, &ours);
}

#[tokio::test]
async fn capacity_objects_match_upstream() {
    let upstream = capacity_central(Side::Upstream).await;
    let ours = capacity_central(Side::Ours).await;
    compare("capacity-central", &upstream, &ours);
}

#[tokio::test]
async fn node_deployment_matches_upstream() {
    let upstream = node_mode(Side::Upstream).await;
    let ours = node_mode(Side::Ours).await;
    compare("node-mode", &upstream, &ours);
}

#[test]
fn globs_match_paths() {
    assert!(glob(
        "pvs.*.metadata.finalizers*",
        "pvs.data.metadata.finalizers[1]"
    ));
    assert!(glob("*", "anything"));
    assert!(!glob("pvs.*.spec", "pvs.data.metadata"));
    assert!(glob("requests.*[0].name", "requests.pvc-x[0].name"));
}
