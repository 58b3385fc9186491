//! Test-only builders for claims, classes and volumes. Defaults describe the common case: an
//! annotated claim `apps/data` of class `standard` asking for 1Gi ReadWriteOnce, and a
//! Bound PV `pv-1` of this driver with the finalizer and policy Delete. [`Cluster`] is a set of
//! Nodes and CSINodes for the topology decisions.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, ObjectReference, PersistentVolume, PersistentVolumeClaim,
    PersistentVolumeClaimSpec, PersistentVolumeClaimStatus, PersistentVolumeSpec,
    PersistentVolumeStatus, TypedLocalObjectReference, TypedObjectReference,
    VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, Time};

use super::accessibility::ClusterTopology;
use super::metadata::MetadataAllowLists;
use super::settings::{DriverCapabilities, ProvisionerConfig};
use super::well_known::PV_FINALIZER;

pub const DRIVER: &str = "hostpath.csi.k8s.io";
pub const PVC_UID: &str = "0b2c9f8e-1d3a-4e5f-8a7b-6c5d4e3f2a1b";
pub const IDENTITY: &str = "1700000000000-42-hostpath.csi.k8s.io";

/// A driver that supports everything but topology, SINGLE_NODE_MULTI_WRITER and
/// PUBLISH_UNPUBLISH_VOLUME.
pub fn caps() -> DriverCapabilities {
    DriverCapabilities {
        controller_service: true,
        create_delete_volume: true,
        single_node_multi_writer: false,
        topology: false,
        clone: true,
        snapshot: true,
        publish_unpublish: false,
        modify_volume: true,
    }
}

/// Upstream's default flags.
pub fn config() -> ProvisionerConfig {
    ProvisionerConfig {
        driver_name: DRIVER.to_owned(),
        volume_name_prefix: "pvc".to_owned(),
        volume_name_uuid_length: -1,
        extra_create_metadata: false,
        metadata: MetadataAllowLists::default(),
        default_fstype: String::new(),
        controller_publish_readonly: false,
        prevent_volume_mode_conversion: true,
        cross_namespace_data_sources: false,
        volume_attributes_classes: true,
        identity: IDENTITY.to_owned(),
    }
}

fn strings(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

pub fn deletion_time() -> Time {
    Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
}

#[derive(Clone)]
pub struct PvcBuilder(PersistentVolumeClaim);

impl PvcBuilder {
    pub fn new() -> Self {
        Self(PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some("data".into()),
                namespace: Some("apps".into()),
                uid: Some(PVC_UID.into()),
                ..ObjectMeta::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: Some(strings(&["ReadWriteOnce"])),
                storage_class_name: Some("standard".into()),
                resources: Some(VolumeResourceRequirements {
                    requests: Some(BTreeMap::from([(
                        "storage".to_owned(),
                        Quantity("1Gi".into()),
                    )])),
                    limits: None,
                }),
                ..PersistentVolumeClaimSpec::default()
            }),
            status: None,
        })
    }

    fn spec(&mut self) -> &mut PersistentVolumeClaimSpec {
        self.0.spec.get_or_insert_with(Default::default)
    }

    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.0
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_owned(), value.to_owned());
        self
    }

    pub fn finalizer(mut self, finalizer: &str) -> Self {
        self.0
            .metadata
            .finalizers
            .get_or_insert_with(Vec::new)
            .push(finalizer.to_owned());
        self
    }

    pub fn deleting(mut self) -> Self {
        self.0.metadata.deletion_timestamp = Some(deletion_time());
        self
    }

    pub fn uid(mut self, uid: &str) -> Self {
        self.0.metadata.uid = Some(uid.to_owned());
        self
    }

    pub fn no_name(mut self) -> Self {
        self.0.metadata.name = None;
        self
    }

    pub fn name(mut self, name: &str) -> Self {
        self.0.metadata.name = Some(name.to_owned());
        self
    }

    pub fn namespace(mut self, namespace: &str) -> Self {
        self.0.metadata.namespace = Some(namespace.to_owned());
        self
    }

    /// `status.phase` (the cache keeps it; nothing else of the status).
    pub fn phase(mut self, phase: &str) -> Self {
        self.0.status = Some(PersistentVolumeClaimStatus {
            phase: Some(phase.to_owned()),
            ..PersistentVolumeClaimStatus::default()
        });
        self
    }

    pub fn no_namespace(mut self) -> Self {
        self.0.metadata.namespace = None;
        self
    }

    pub fn resource_version(mut self, version: &str) -> Self {
        self.0.metadata.resource_version = Some(version.to_owned());
        self
    }

    pub fn volume_name(mut self, name: &str) -> Self {
        self.spec().volume_name = Some(name.to_owned());
        self
    }

    pub fn class(mut self, class: &str) -> Self {
        self.spec().storage_class_name = Some(class.to_owned());
        self
    }

    pub fn no_class(mut self) -> Self {
        self.spec().storage_class_name = None;
        self
    }

    pub fn storage(mut self, quantity: &str) -> Self {
        self.spec().resources = Some(VolumeResourceRequirements {
            requests: Some(BTreeMap::from([(
                "storage".to_owned(),
                Quantity(quantity.to_owned()),
            )])),
            limits: None,
        });
        self
    }

    pub fn no_storage(mut self) -> Self {
        self.spec().resources = None;
        self
    }

    pub fn access_modes(mut self, modes: &[&str]) -> Self {
        self.spec().access_modes = Some(strings(modes));
        self
    }

    pub fn volume_mode(mut self, mode: &str) -> Self {
        self.spec().volume_mode = Some(mode.to_owned());
        self
    }

    pub fn selector(mut self) -> Self {
        self.spec().selector = Some(LabelSelector::default());
        self
    }

    pub fn attributes_class(mut self, name: &str) -> Self {
        self.spec().volume_attributes_class_name = Some(name.to_owned());
        self
    }

    pub fn data_source(mut self, api_group: Option<&str>, kind: &str, name: &str) -> Self {
        self.spec().data_source = Some(TypedLocalObjectReference {
            api_group: api_group.map(str::to_owned),
            kind: kind.to_owned(),
            name: name.to_owned(),
        });
        self
    }

    pub fn data_source_ref(
        mut self,
        api_group: Option<&str>,
        kind: &str,
        name: &str,
        namespace: Option<&str>,
    ) -> Self {
        self.spec().data_source_ref = Some(TypedObjectReference {
            api_group: api_group.map(str::to_owned),
            kind: kind.to_owned(),
            name: name.to_owned(),
            namespace: namespace.map(str::to_owned),
        });
        self
    }

    pub fn build(self) -> PersistentVolumeClaim {
        self.0
    }
}

pub struct ClassBuilder(StorageClass);

impl ClassBuilder {
    pub fn new() -> Self {
        Self(StorageClass {
            metadata: ObjectMeta {
                name: Some("standard".into()),
                ..ObjectMeta::default()
            },
            provisioner: DRIVER.to_owned(),
            ..StorageClass::default()
        })
    }

    pub fn provisioner(mut self, provisioner: &str) -> Self {
        self.0.provisioner = provisioner.to_owned();
        self
    }

    pub fn name(mut self, name: &str) -> Self {
        self.0.metadata.name = Some(name.to_owned());
        self
    }

    pub fn binding_mode(mut self, mode: &str) -> Self {
        self.0.volume_binding_mode = Some(mode.to_owned());
        self
    }

    pub fn parameter(mut self, key: &str, value: &str) -> Self {
        self.0
            .parameters
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_owned(), value.to_owned());
        self
    }

    pub fn mount_options(mut self, options: &[&str]) -> Self {
        self.0.mount_options = Some(strings(options));
        self
    }

    pub fn reclaim_policy(mut self, policy: &str) -> Self {
        self.0.reclaim_policy = Some(policy.to_owned());
        self
    }

    pub fn build(self) -> StorageClass {
        self.0
    }
}

pub struct PvBuilder(PersistentVolume);

impl PvBuilder {
    pub fn new() -> Self {
        Self(PersistentVolume {
            metadata: ObjectMeta {
                name: Some("pv-1".into()),
                finalizers: Some(vec![PV_FINALIZER.to_owned()]),
                ..ObjectMeta::default()
            },
            spec: Some(PersistentVolumeSpec {
                csi: Some(CSIPersistentVolumeSource {
                    driver: DRIVER.to_owned(),
                    volume_handle: "vol-1".to_owned(),
                    ..CSIPersistentVolumeSource::default()
                }),
                claim_ref: Some(ObjectReference {
                    name: Some("data".into()),
                    namespace: Some("apps".into()),
                    uid: Some(PVC_UID.into()),
                    ..ObjectReference::default()
                }),
                persistent_volume_reclaim_policy: Some("Delete".into()),
                storage_class_name: Some("standard".into()),
                ..PersistentVolumeSpec::default()
            }),
            status: Some(PersistentVolumeStatus {
                phase: Some("Bound".into()),
                ..PersistentVolumeStatus::default()
            }),
        })
    }

    fn spec(&mut self) -> &mut PersistentVolumeSpec {
        self.0.spec.get_or_insert_with(Default::default)
    }

    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.0
            .metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(key.to_owned(), value.to_owned());
        self
    }

    pub fn uid(mut self, uid: &str) -> Self {
        self.0.metadata.uid = Some(uid.to_owned());
        self
    }

    pub fn resource_version(mut self, version: &str) -> Self {
        self.0.metadata.resource_version = Some(version.to_owned());
        self
    }

    pub fn provisioned_by(self, provisioner: &str) -> Self {
        self.annotation(super::ANN_PROVISIONED_BY, provisioner)
    }

    pub fn csi_driver(mut self, driver: &str) -> Self {
        if let Some(csi) = self.spec().csi.as_mut() {
            csi.driver = driver.to_owned();
        }
        self
    }

    pub fn name(mut self, name: &str) -> Self {
        self.0.metadata.name = Some(name.to_owned());
        self
    }

    pub fn handle(mut self, handle: &str) -> Self {
        if let Some(csi) = self.spec().csi.as_mut() {
            csi.volume_handle = handle.to_owned();
        }
        self
    }

    /// Any change the other builders do not offer.
    pub fn map(mut self, change: impl FnOnce(&mut PersistentVolume)) -> Self {
        change(&mut self.0);
        self
    }

    pub fn no_csi(mut self) -> Self {
        self.spec().csi = None;
        self
    }

    pub fn claim_uid(mut self, uid: &str) -> Self {
        if let Some(claim_ref) = self.spec().claim_ref.as_mut() {
            claim_ref.uid = Some(uid.to_owned());
        }
        self
    }

    pub fn no_claim_ref(mut self) -> Self {
        self.spec().claim_ref = None;
        self
    }

    pub fn class(mut self, class: &str) -> Self {
        self.spec().storage_class_name = Some(class.to_owned());
        self
    }

    pub fn policy(mut self, policy: &str) -> Self {
        self.spec().persistent_volume_reclaim_policy = Some(policy.to_owned());
        self
    }

    pub fn no_policy(mut self) -> Self {
        self.spec().persistent_volume_reclaim_policy = None;
        self
    }

    pub fn phase(mut self, phase: &str) -> Self {
        self.0.status = Some(PersistentVolumeStatus {
            phase: Some(phase.to_owned()),
            ..PersistentVolumeStatus::default()
        });
        self
    }

    pub fn no_finalizer(mut self) -> Self {
        self.0.metadata.finalizers = None;
        self
    }

    pub fn deleting(mut self) -> Self {
        self.0.metadata.deletion_timestamp = Some(deletion_time());
        self
    }

    /// Node affinity of one term: `key In [value]`, as a PV of a topology-aware volume has.
    pub fn on(mut self, key: &str, value: &str) -> Self {
        use k8s_openapi::api::core::v1::{
            NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, VolumeNodeAffinity,
        };
        if let Some(spec) = self.0.spec.as_mut() {
            spec.node_affinity = Some(VolumeNodeAffinity {
                required: Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_expressions: Some(vec![NodeSelectorRequirement {
                            key: key.to_owned(),
                            operator: "In".to_owned(),
                            values: Some(vec![value.to_owned()]),
                        }]),
                        match_fields: None,
                    }],
                }),
            });
        }
        self
    }

    pub fn build(self) -> PersistentVolume {
        self.0
    }
}

/// Nodes and CSINodes over plain maps: the caches the claim reconciler reads topology from.
#[derive(Debug, Clone, Default)]
pub struct Cluster {
    /// CSINode name → the topology keys our driver registered there.
    pub csinodes: BTreeMap<String, Vec<String>>,
    /// Node name → labels.
    pub nodes: BTreeMap<String, BTreeMap<String, String>>,
}

impl Cluster {
    pub fn new() -> Self {
        Self::default()
    }

    /// A Node with these labels.
    pub fn node(mut self, name: &str, labels: &[(&str, &str)]) -> Self {
        let labels = labels
            .iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .collect();
        self.nodes.insert(name.to_owned(), labels);
        self
    }

    /// A CSINode where our driver registered these keys (none: registered without keys, or
    /// not registered).
    pub fn csinode(mut self, name: &str, keys: &[&str]) -> Self {
        let keys = keys.iter().map(|key| (*key).to_owned()).collect();
        self.csinodes.insert(name.to_owned(), keys);
        self
    }

    /// A Node with these labels and its CSINode with these keys.
    pub fn member(self, name: &str, keys: &[&str], labels: &[(&str, &str)]) -> Self {
        self.node(name, labels).csinode(name, keys)
    }
}

impl ClusterTopology for Cluster {
    fn csinode_keys(&self, node: &str) -> Option<Vec<String>> {
        self.csinodes.get(node).cloned()
    }

    fn any_csinode_keys(&self) -> Option<Vec<String>> {
        self.csinodes
            .values()
            .find(|keys| !keys.is_empty())
            .cloned()
    }

    fn node_labels(&self, node: &str) -> Option<BTreeMap<String, String>> {
        self.nodes.get(node).cloned()
    }

    fn node_segments(&self, keys: &[String]) -> Vec<BTreeMap<String, String>> {
        self.nodes
            .values()
            .filter(|labels| keys.iter().all(|key| labels.contains_key(key)))
            .map(|labels| {
                keys.iter()
                    .map(|key| (key.clone(), labels[key].clone()))
                    .collect()
            })
            .collect()
    }
}
