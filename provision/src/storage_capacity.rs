//! CSIStorageCapacity decisions (`--enable-capacity`): which topology segments and classes get
//! an object, what each object holds, which existing objects are ours to keep, update or
//! delete, and which objects a provisioning or a deletion makes stale. Upstream's names,
//! labels and fields (docs/flags.md, "Capacity tracking"); the executor is
//! `controller::capacity`.
//!
//! Three of upstream's quirks are fixed here: a selector is compared by what it selects
//! (absent `matchLabels` ≡ empty, A10), an owner switch replaces the old controller owner
//! instead of adding a second one (A9), and a segment is a sorted map, so the node segment of
//! `--node-deployment` equals the segment read from a PV's node affinity (A11).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{NodeSelectorTerm, VolumeNodeAffinity};
use k8s_openapi::api::storage::v1::{CSIStorageCapacity, StorageClass};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};

use super::quantity::{format_binary_si, parse_quantity_bytes};
use crate::csi;

/// Label naming the driver of a CSIStorageCapacity object.
pub const DRIVER_NAME_LABEL: &str = "csi.storage.k8s.io/drivername";
/// Label naming the provisioner instance that manages the object.
pub const MANAGED_BY_LABEL: &str = "csi.storage.k8s.io/managed-by";
/// The managed-by value of a central provisioner, and the base of a node provisioner's.
pub const MANAGED_BY: &str = "external-provisioner";
/// `metadata.generateName` of the objects.
pub const GENERATE_NAME: &str = "csisc-";
/// Longest label value (DNS-1035 label length).
const LABEL_VALUE_MAX: usize = 63;
/// `-<FNV-1a-32 of "external-provisioner">-`: the separator of a shortened node id.
const SHORTENED_SEPARATOR_LEN: usize = 10;

/// One place in the cluster that gets its own objects: topology key/value pairs, sorted by
/// key. Empty for a driver without topology (the "nil" segment: an object with an empty
/// selector, which matches every node).
pub type Segment = BTreeMap<String, String>;

/// One object the provisioner wants to exist: a segment and a StorageClass of our driver.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkItem {
    pub segment: Segment,
    pub class: String,
}

impl fmt::Display for WorkItem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{{segment: [")?;
        for (index, (key, value)) in self.segment.iter().enumerate() {
            let separator = if index == 0 { "" } else { " " };
            write!(f, "{separator}{key}={value}")?;
        }
        write!(f, "], storageClassName: {:?}}}", self.class)
    }
}

/// The managed-by label value: `external-provisioner`, or with `--node-deployment`
/// `external-provisioner-<node>` shortened to a label value's 63 characters as upstream does
/// (the hashes are FNV-1a-32, printed as 8 hex digits).
pub fn managed_by(node: Option<&str>) -> String {
    let Some(node) = node else {
        return MANAGED_BY.to_owned();
    };
    let full = format!("{MANAGED_BY}-{node}");
    if full.len() <= LABEL_VALUE_MAX {
        return full;
    }
    match (LABEL_VALUE_MAX - SHORTENED_SEPARATOR_LEN).checked_sub(node.len()) {
        // Keep the node name whole, and as much of the base as fits before it.
        Some(base_len) if base_len > 0 => format!(
            "{}-{:08x}-{node}",
            &MANAGED_BY[..base_len.min(MANAGED_BY.len())],
            fnv1a32(MANAGED_BY.as_bytes())
        ),
        _ => format!("{MANAGED_BY}-{:08x}", fnv1a32(full.as_bytes())),
    }
}

fn fnv1a32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5, |hash: u32, byte| {
        (hash ^ u32::from(*byte)).wrapping_mul(0x0100_0193)
    })
}

/// The segments of a central provisioner, from the CSINodes that list our driver (each with
/// the topology keys it registered there) and the labels of their Nodes: a node whose Node is
/// missing, or lacks one of the keys, adds none; equal segments count once.
pub fn cluster_segments<'a>(
    registrations: impl IntoIterator<Item = (&'a str, &'a [String])>,
    node_labels: impl Fn(&str) -> Option<BTreeMap<String, String>>,
) -> BTreeSet<Segment> {
    registrations
        .into_iter()
        .filter_map(|(node, keys)| {
            let labels = node_labels(node)?;
            keys.iter()
                .map(|key| Some((key.clone(), labels.get(key)?.clone())))
                .collect::<Option<Segment>>()
        })
        .collect()
}

/// Whether capacity is published for `class`: our driver's, and not Immediate unless
/// `--capacity-for-immediate-binding` (an unset binding mode counts as not Immediate, as
/// upstream's; the API server defaults it to Immediate anyway).
pub fn publishes_for(class: &StorageClass, driver: &str, immediate_binding: bool) -> bool {
    class.provisioner == driver
        && (immediate_binding || class.volume_binding_mode.as_deref() != Some("Immediate"))
}

/// Every (segment, class) pair that should have an object.
pub fn desired_items<'a>(
    segments: &BTreeSet<Segment>,
    classes: impl IntoIterator<Item = &'a StorageClass>,
    driver: &str,
    immediate_binding: bool,
) -> BTreeSet<WorkItem> {
    let classes: Vec<&str> = classes
        .into_iter()
        .filter(|class| publishes_for(class, driver, immediate_binding))
        .filter_map(|class| class.metadata.name.as_deref())
        .collect();
    segments
        .iter()
        .flat_map(|segment| {
            classes.iter().map(|class| WorkItem {
                segment: segment.clone(),
                class: (*class).to_owned(),
            })
        })
        .collect()
}

/// GetCapacity for an item: the class's parameters as they are (upstream does not strip the
/// `csi.storage.k8s.io/` keys here), no capabilities, the segment as the topology.
pub fn get_capacity_request(item: &WorkItem, class: &StorageClass) -> csi::GetCapacityRequest {
    csi::GetCapacityRequest {
        volume_capabilities: Vec::new(),
        parameters: class
            .parameters
            .clone()
            .unwrap_or_default()
            .into_iter()
            .collect(),
        accessible_topology: Some(csi::Topology {
            segments: item.segment.clone().into_iter().collect(),
        }),
    }
}

/// What the driver reported for an item (`minimum_volume_size` has no field in the object).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacity {
    pub available: i64,
    pub maximum_volume_size: Option<i64>,
}

impl From<&csi::GetCapacityResponse> for Capacity {
    fn from(response: &csi::GetCapacityResponse) -> Self {
        Capacity {
            available: response.available_capacity,
            maximum_volume_size: response.maximum_volume_size,
        }
    }
}

/// What every object of this provisioner carries.
#[derive(Clone, Debug, PartialEq)]
pub struct ObjectTemplate {
    /// `NAMESPACE`.
    pub namespace: String,
    pub driver: String,
    /// See [`managed_by`].
    pub managed_by: String,
    /// `--capacity-ownerref-level` ≥ 0: the owner found at start.
    pub owner: Option<OwnerReference>,
}

impl ObjectTemplate {
    pub fn labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (DRIVER_NAME_LABEL.to_owned(), self.driver.clone()),
            (MANAGED_BY_LABEL.to_owned(), self.managed_by.clone()),
        ])
    }

    /// The label selector of the capacity watch: exactly the objects this instance manages.
    pub fn label_selector(&self) -> String {
        format!(
            "{DRIVER_NAME_LABEL}={},{MANAGED_BY_LABEL}={}",
            self.driver, self.managed_by
        )
    }

    /// Whether `object` carries both our labels (the watch sees exactly these).
    pub fn manages(&self, object: &CSIStorageCapacity) -> bool {
        let labels = object.metadata.labels.as_ref();
        self.labels()
            .iter()
            .all(|(key, value)| labels.and_then(|labels| labels.get(key)) == Some(value))
    }

    /// The object to create for `item`.
    pub fn new_object(&self, item: &WorkItem, capacity: Capacity) -> CSIStorageCapacity {
        CSIStorageCapacity {
            metadata: ObjectMeta {
                generate_name: Some(GENERATE_NAME.to_owned()),
                namespace: Some(self.namespace.clone()),
                labels: Some(self.labels()),
                owner_references: self.owner.clone().map(|owner| vec![owner]),
                ..ObjectMeta::default()
            },
            storage_class_name: item.class.clone(),
            node_topology: Some(selector(&item.segment)),
            capacity: Some(quantity(capacity.available)),
            maximum_volume_size: capacity.maximum_volume_size.map(quantity),
        }
    }

    /// `existing` brought up to date, or `None` if it already is: the capacity, the maximum
    /// volume size (both absent counts as equal) and the owner. The owner is added if missing;
    /// unlike upstream (A9), a reference to another controller (the owner level changed) is
    /// replaced, because the API server refuses two controller references and upstream's
    /// update is retried forever.
    pub fn updated_object(
        &self,
        existing: &CSIStorageCapacity,
        capacity: Capacity,
    ) -> Option<CSIStorageCapacity> {
        let capacity_equal = same_quantity(existing.capacity.as_ref(), Some(capacity.available));
        let maximum_equal = same_quantity(
            existing.maximum_volume_size.as_ref(),
            capacity.maximum_volume_size,
        );
        let owners = self.owner_references(existing.metadata.owner_references.as_deref());
        if capacity_equal && maximum_equal && owners.is_none() {
            return None;
        }
        let mut updated = existing.clone();
        updated.capacity = Some(quantity(capacity.available));
        updated.maximum_volume_size = capacity.maximum_volume_size.map(quantity);
        if let Some(owners) = owners {
            updated.metadata.owner_references = Some(owners);
        }
        Some(updated)
    }

    /// The owner references `existing` should have, or `None` if they are right: ours added,
    /// another controller reference dropped.
    fn owner_references(&self, existing: Option<&[OwnerReference]>) -> Option<Vec<OwnerReference>> {
        let owner = self.owner.as_ref()?;
        let existing = existing.unwrap_or_default();
        if existing.iter().any(|reference| reference.uid == owner.uid) {
            return None;
        }
        let mut references: Vec<OwnerReference> = existing
            .iter()
            .filter(|reference| reference.controller != Some(true))
            .cloned()
            .collect();
        references.push(owner.clone());
        Some(references)
    }
}

/// The node selector of a segment: its pairs as `matchLabels`, nothing else; an empty
/// selector (matches every node) for the nil segment.
pub fn selector(segment: &Segment) -> LabelSelector {
    LabelSelector {
        match_labels: (!segment.is_empty()).then(|| segment.clone()),
        match_expressions: None,
    }
}

/// The segment an object's selector stands for, compared by what it selects: absent and empty
/// `matchLabels` are the same (A10: upstream compares them structurally, so its objects for the
/// nil segment never match and are deleted and created again at every poll). `None` for a
/// selector that is not a plain `matchLabels` (no segment of ours produces it) and for a
/// missing one (which matches no node).
pub fn object_segment(object: &CSIStorageCapacity) -> Option<Segment> {
    let selector = object.node_topology.as_ref()?;
    if selector
        .match_expressions
        .as_ref()
        .is_some_and(|expressions| !expressions.is_empty())
    {
        return None;
    }
    Some(selector.match_labels.clone().unwrap_or_default())
}

fn quantity(bytes: i64) -> Quantity {
    Quantity(format_binary_si(bytes))
}

fn same_quantity(existing: Option<&Quantity>, wanted: Option<i64>) -> bool {
    match (existing, wanted) {
        (None, None) => true,
        (Some(existing), Some(wanted)) => parse_quantity_bytes(&existing.0) == Ok(wanted),
        _ => false,
    }
}

/// An object of ours that no item wants, to delete.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Obsolete {
    pub name: String,
    pub uid: String,
}

/// The existing objects, sorted out: the object of each item that has one, and the others.
#[derive(Debug, Default, PartialEq)]
pub struct Matching {
    pub linked: BTreeMap<WorkItem, Arc<CSIStorageCapacity>>,
    pub obsolete: Vec<Obsolete>,
}

/// Which object belongs to which item. An object matches an item with the same class and
/// selector (see [`object_segment`]); of several matching one item the oldest is kept (then
/// the first by name, so every pass picks the same) and the others are duplicates; objects
/// matching no item (a class or segment gone, or someone else's object with our labels) are
/// obsolete. An object being deleted (it has a `deletionTimestamp`) is neither: deleting it
/// again would change nothing, and its item needs a new one.
pub fn match_objects(
    desired: &BTreeSet<WorkItem>,
    objects: impl IntoIterator<Item = Arc<CSIStorageCapacity>>,
) -> Matching {
    let mut objects: Vec<Arc<CSIStorageCapacity>> = objects
        .into_iter()
        .filter(|object| !being_deleted(object))
        .collect();
    objects.sort_by(|a, b| age_order(a, b));
    let mut matching = Matching::default();
    for object in objects {
        let item = object_segment(&object).map(|segment| WorkItem {
            segment,
            class: object.storage_class_name.clone(),
        });
        match item {
            Some(item) if desired.contains(&item) && !matching.linked.contains_key(&item) => {
                matching.linked.insert(item, object);
            }
            _ => matching.obsolete.push(Obsolete {
                name: object.metadata.name.clone().unwrap_or_default(),
                uid: object.metadata.uid.clone().unwrap_or_default(),
            }),
        }
    }
    matching
}

/// The object of `item` among `objects`, the one [`match_objects`] links: same class and
/// selector, not being deleted, the oldest (then the first by name). One pass, no sorting.
pub fn object_of(
    item: &WorkItem,
    objects: impl IntoIterator<Item = Arc<CSIStorageCapacity>>,
) -> Option<Arc<CSIStorageCapacity>> {
    objects
        .into_iter()
        .filter(|object| {
            !being_deleted(object)
                && object.storage_class_name == item.class
                && object_segment(object).as_ref() == Some(&item.segment)
        })
        .min_by(|a, b| age_order(a, b))
}

/// Whether `object` is still obsolete: not being deleted, and either no item wants its class
/// and selector or another object is that item's (it is a duplicate).
pub fn still_obsolete(
    object: &Arc<CSIStorageCapacity>,
    desired: &BTreeSet<WorkItem>,
    objects: impl IntoIterator<Item = Arc<CSIStorageCapacity>>,
) -> bool {
    if being_deleted(object) {
        return false;
    }
    let item = object_segment(object).map(|segment| WorkItem {
        segment,
        class: object.storage_class_name.clone(),
    });
    match item {
        Some(item) if desired.contains(&item) => object_of(&item, objects)
            .is_none_or(|linked| linked.metadata.uid != object.metadata.uid),
        _ => true,
    }
}

/// What a sync does with what the driver reported for an item.
#[derive(Debug, PartialEq)]
pub enum SyncTarget {
    /// Bring the item's object up to date.
    Update(Arc<CSIStorageCapacity>),
    /// The object named so was created for the item and the watch has not reported it yet:
    /// read it; create another only if it is gone.
    Created(String),
    /// Create the item's object.
    Create,
}

/// The objects this instance created and the watch has not reported yet, by item. Without
/// them a lagging watch would make every sync of the item create one more object (each a
/// duplicate, deleted once seen, or a leak if the watch never reports it).
#[derive(Debug, Default, PartialEq)]
pub struct PendingCreates {
    names: BTreeMap<WorkItem, String>,
}

impl PendingCreates {
    /// `name` was created for `item`.
    pub fn created(&mut self, item: WorkItem, name: String) {
        self.names.insert(item, name);
    }

    /// Whether `item` has a create the watch has not reported.
    pub fn pending(&self, item: &WorkItem) -> bool {
        self.names.contains_key(item)
    }

    /// `item`'s create is settled: its object is gone, or another object serves it.
    pub fn forget(&mut self, item: &WorkItem) {
        self.names.remove(item);
    }

    /// After a watch event: the creates the watch now reports (`reported`), and those of items
    /// no longer wanted (their object, once seen, is obsolete), are settled.
    pub fn settle(&mut self, desired: &BTreeSet<WorkItem>, reported: impl Fn(&str) -> bool) {
        self.names
            .retain(|item, name| desired.contains(item) && !reported(name));
    }

    /// Create or not: the item's object (see [`object_of`]) if it has one, which settles a
    /// pending create; else the pending create, to read; else a new object.
    pub fn target(
        &mut self,
        item: &WorkItem,
        object: Option<Arc<CSIStorageCapacity>>,
    ) -> SyncTarget {
        match (object, self.names.get(item)) {
            (Some(object), _) => {
                self.forget(item);
                SyncTarget::Update(object)
            }
            (None, Some(name)) => SyncTarget::Created(name.clone()),
            (None, None) => SyncTarget::Create,
        }
    }
}

/// Whether `object` is on its way out (it has a `deletionTimestamp`).
pub fn being_deleted(object: &CSIStorageCapacity) -> bool {
    object.metadata.deletion_timestamp.is_some()
}

/// Oldest first, then by name: the order in which duplicates give way.
fn age_order(a: &CSIStorageCapacity, b: &CSIStorageCapacity) -> std::cmp::Ordering {
    let created = |object: &CSIStorageCapacity| {
        object
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|time| time.0)
    };
    created(a)
        .cmp(&created(b))
        .then_with(|| a.metadata.name.cmp(&b.metadata.name))
}

/// Why capacity may have changed outside the poll.
#[derive(Clone, Debug, PartialEq)]
pub enum RefreshCause {
    /// A volume of `class` was created; `affinity` is its PV's node affinity.
    Provisioned {
        class: String,
        affinity: Option<VolumeNodeAffinity>,
    },
    /// CreateVolume for a claim of `class` was sent and failed (the driver may have used
    /// space, or found less than was published).
    ProvisionFailed { class: String },
    /// A volume was deleted; `affinity` is its PV's node affinity.
    Deleted {
        affinity: Option<VolumeNodeAffinity>,
    },
    /// The orphan reaper deleted a volume of `class` that never got a PV (no affinity known).
    OrphanDeleted { class: String },
}

/// The items to query again after `cause`, and how many node-affinity terms were not plain
/// segments (only `In` with one value, no `matchFields`), which upstream logs and skips.
#[derive(Debug, Default, PartialEq)]
pub struct Refresh {
    pub items: Vec<WorkItem>,
    pub skipped_terms: usize,
}

/// Upstream's rules: a volume with node affinity refreshes every item whose segment is one of
/// the affinity's terms (any class: they share the space); a created volume without affinity
/// refreshes every item of its class, and so do a failed CreateVolume and a deleted orphan
/// (ours: upstream has no orphan reaper); a deleted volume without affinity refreshes nothing.
pub fn refreshed_items(desired: &BTreeSet<WorkItem>, cause: &RefreshCause) -> Refresh {
    let (class, affinity) = match cause {
        RefreshCause::Provisioned { class, affinity } => (Some(class), affinity.as_ref()),
        RefreshCause::ProvisionFailed { class } | RefreshCause::OrphanDeleted { class } => {
            (Some(class), None)
        }
        RefreshCause::Deleted { affinity } => (None, affinity.as_ref()),
    };
    match affinity {
        Some(affinity) => {
            let terms = affinity_terms(affinity);
            let mut segments = BTreeSet::new();
            let mut skipped_terms = 0;
            for term in terms {
                match term_segment(term) {
                    Some(segment) => {
                        segments.insert(segment);
                    }
                    None => skipped_terms += 1,
                }
            }
            Refresh {
                items: desired
                    .iter()
                    .filter(|item| segments.contains(&item.segment))
                    .cloned()
                    .collect(),
                skipped_terms,
            }
        }
        None => Refresh {
            items: desired
                .iter()
                .filter(|item| class.is_some_and(|class| item.class == *class))
                .cloned()
                .collect(),
            skipped_terms: 0,
        },
    }
}

fn affinity_terms(affinity: &VolumeNodeAffinity) -> &[NodeSelectorTerm] {
    affinity
        .required
        .as_ref()
        .map(|required| required.node_selector_terms.as_slice())
        .unwrap_or_default()
}

fn term_segment(term: &NodeSelectorTerm) -> Option<Segment> {
    if term
        .match_fields
        .as_ref()
        .is_some_and(|fields| !fields.is_empty())
    {
        return None;
    }
    term.match_expressions
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(|requirement| match requirement.values.as_deref() {
            Some([value]) if requirement.operator == "In" => {
                Some((requirement.key.clone(), value.clone()))
            }
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests;
