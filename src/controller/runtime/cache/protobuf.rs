//! The cached kinds decoded from protobuf, straight into the forms the JSON path builds (no
//! k8s-openapi object of the whole kind in between). Each message holds the fields the JSON
//! path's `Wire*` types read, with the tags of k8s.io/api's `generated.proto`.
//!
//! Reading the same as JSON: Go writes an empty `string`, list or map with `omitempty` to
//! protobuf but not to JSON, so those read as absent here ([`non_empty`]); Go's pointer fields
//! (`*string`, `*bool`) are written to protobuf only when set, so they keep their presence. The
//! test `cached_forms_read_the_same_from_protobuf_and_json` holds both reads of the same
//! objects from the API server against each other.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    AWSElasticBlockStoreVolumeSource, AzureDiskVolumeSource, AzureFilePersistentVolumeSource,
    CinderPersistentVolumeSource, GCEPersistentDiskVolumeSource, NodeSelector,
    NodeSelectorRequirement, NodeSelectorTerm, PersistentVolumeClaimSpec, PortworxVolumeSource,
    SecretReference, TypedLocalObjectReference, TypedObjectReference, VolumeNodeAffinity,
    VolumeResourceRequirements, VsphereVirtualDiskVolumeSource,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use prost::Message;
use serde::Serialize;

use super::{
    CachedAttachment, CachedClaim, CachedClaimStatus, CachedCsiSource, CachedVolume,
    CachedVolumeSpec, CachedVolumeStatus, WireAttachment, WireAttachmentSource, WireAttachmentSpec,
    WireMeta, identity_kept, split,
};
use crate::kube_client::protobuf::{
    FromProtobuf, ObjectMeta, ProtobufError, non_empty, non_empty_map, non_empty_vec,
};

fn decode<M: Message + Default>(kind: &'static str, bytes: &[u8]) -> Result<M, ProtobufError> {
    M::decode(bytes).map_err(|source| ProtobufError::Decode { what: kind, source })
}

fn wire_meta(meta: Option<ObjectMeta>) -> WireMeta {
    let meta = meta.unwrap_or_default();
    WireMeta {
        name: non_empty(meta.name),
        namespace: non_empty(meta.namespace),
        uid: non_empty(meta.uid),
        resource_version: non_empty(meta.resource_version),
        deletion_timestamp: meta.deletion_timestamp.and_then(|time| time.to_time()),
        annotations: non_empty_map(meta.annotations),
        finalizers: non_empty_vec(meta.finalizers),
    }
}

/// The cached form's identity and kept JSON (`cache::split`), or an error naming the object
/// (`namespace/name`, or `name` of a cluster-scoped one).
fn kept<Spec: Serialize, Status: Serialize>(
    kind: &'static str,
    meta: WireMeta,
    spec: Option<Spec>,
    status: Option<Status>,
) -> Result<
    (
        k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
        Box<str>,
    ),
    ProtobufError,
> {
    let name = match (&meta.namespace, &meta.name) {
        (Some(namespace), name) => format!("{namespace}/{}", name.as_deref().unwrap_or_default()),
        (None, name) => name.clone().unwrap_or_default(),
    };
    split(meta, spec, status).map_err(|source| ProtobufError::Keep { kind, name, source })
}

#[derive(Clone, PartialEq, Message)]
struct Phase {
    #[prost(string, optional, tag = "1")]
    phase: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct Claim {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMeta>,
    #[prost(message, optional, tag = "2")]
    spec: Option<ClaimSpec>,
    #[prost(message, optional, tag = "3")]
    status: Option<Phase>,
}

#[derive(Clone, PartialEq, Message)]
struct ClaimSpec {
    #[prost(string, repeated, tag = "1")]
    access_modes: Vec<String>,
    #[prost(message, optional, tag = "2")]
    resources: Option<Resources>,
    #[prost(string, optional, tag = "3")]
    volume_name: Option<String>,
    #[prost(message, optional, tag = "4")]
    selector: Option<Selector>,
    #[prost(string, optional, tag = "5")]
    storage_class_name: Option<String>,
    #[prost(string, optional, tag = "6")]
    volume_mode: Option<String>,
    #[prost(message, optional, tag = "7")]
    data_source: Option<Reference>,
    #[prost(message, optional, tag = "8")]
    data_source_ref: Option<Reference>,
    #[prost(string, optional, tag = "9")]
    volume_attributes_class_name: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct WireQuantity {
    #[prost(string, tag = "1")]
    string: String,
}

#[derive(Clone, PartialEq, Message)]
struct Resources {
    #[prost(btree_map = "string, message", tag = "1")]
    limits: BTreeMap<String, WireQuantity>,
    #[prost(btree_map = "string, message", tag = "2")]
    requests: BTreeMap<String, WireQuantity>,
}

#[derive(Clone, PartialEq, Message)]
struct Selector {
    #[prost(btree_map = "string, string", tag = "1")]
    match_labels: BTreeMap<String, String>,
    #[prost(message, repeated, tag = "2")]
    match_expressions: Vec<Requirement>,
}

/// `LabelSelectorRequirement` and `NodeSelectorRequirement`: the same fields and tags.
#[derive(Clone, PartialEq, Message)]
struct Requirement {
    #[prost(string, tag = "1")]
    key: String,
    #[prost(string, tag = "2")]
    operator: String,
    #[prost(string, repeated, tag = "3")]
    values: Vec<String>,
}

/// `TypedLocalObjectReference` (tags 1–3) and `TypedObjectReference` (4 more).
#[derive(Clone, PartialEq, Message)]
struct Reference {
    #[prost(string, optional, tag = "1")]
    api_group: Option<String>,
    #[prost(string, tag = "2")]
    kind: String,
    #[prost(string, tag = "3")]
    name: String,
    #[prost(string, optional, tag = "4")]
    namespace: Option<String>,
}

fn quantities(map: BTreeMap<String, WireQuantity>) -> Option<BTreeMap<String, Quantity>> {
    non_empty_map(
        map.into_iter()
            .map(|(name, quantity)| (name, Quantity(quantity.string)))
            .collect(),
    )
}

impl ClaimSpec {
    fn into_spec(self) -> PersistentVolumeClaimSpec {
        PersistentVolumeClaimSpec {
            access_modes: non_empty_vec(self.access_modes),
            resources: self.resources.map(|r| VolumeResourceRequirements {
                limits: quantities(r.limits),
                requests: quantities(r.requests),
            }),
            volume_name: non_empty(self.volume_name),
            selector: self.selector.map(|s| LabelSelector {
                match_labels: non_empty_map(s.match_labels),
                match_expressions: non_empty_vec(
                    s.match_expressions
                        .into_iter()
                        .map(|r| LabelSelectorRequirement {
                            key: r.key,
                            operator: r.operator,
                            values: non_empty_vec(r.values),
                        })
                        .collect(),
                ),
            }),
            storage_class_name: self.storage_class_name,
            volume_mode: self.volume_mode,
            data_source: self.data_source.map(|r| TypedLocalObjectReference {
                api_group: r.api_group,
                kind: r.kind,
                name: r.name,
            }),
            data_source_ref: self.data_source_ref.map(|r| TypedObjectReference {
                api_group: r.api_group,
                kind: r.kind,
                name: r.name,
                namespace: r.namespace,
            }),
            volume_attributes_class_name: self.volume_attributes_class_name,
        }
    }
}

impl FromProtobuf for CachedClaim {
    fn from_protobuf(message: &[u8]) -> Result<Self, ProtobufError> {
        let claim: Claim = decode("PersistentVolumeClaim", message)?;
        let meta = wire_meta(claim.metadata);
        let status = claim.status.map(|status| CachedClaimStatus {
            phase: non_empty(status.phase),
        });
        let spec = claim.spec.map(ClaimSpec::into_spec);
        let (metadata, rest) = kept("PersistentVolumeClaim", meta, spec, status)?;
        Ok(CachedClaim { metadata, rest })
    }
}

#[derive(Clone, PartialEq, Message)]
struct Volume {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMeta>,
    #[prost(message, optional, tag = "2")]
    spec: Option<VolumeSpec>,
    #[prost(message, optional, tag = "3")]
    status: Option<Phase>,
}

#[derive(Clone, PartialEq, Message)]
struct VolumeSpec {
    #[prost(message, optional, tag = "2")]
    source: Option<VolumeSource>,
    #[prost(string, optional, tag = "5")]
    persistent_volume_reclaim_policy: Option<String>,
    #[prost(string, optional, tag = "6")]
    storage_class_name: Option<String>,
    #[prost(message, optional, tag = "9")]
    node_affinity: Option<NodeAffinity>,
}

/// `PersistentVolumeSource`: CSI and the in-tree sources of the migrated plugins.
#[derive(Clone, PartialEq, Message)]
struct VolumeSource {
    #[prost(message, optional, tag = "1")]
    gce_persistent_disk: Option<DiskSource>,
    #[prost(message, optional, tag = "2")]
    aws_elastic_block_store: Option<DiskSource>,
    #[prost(message, optional, tag = "8")]
    cinder: Option<CinderSource>,
    #[prost(message, optional, tag = "13")]
    azure_file: Option<AzureFileSource>,
    #[prost(message, optional, tag = "14")]
    vsphere_volume: Option<VsphereSource>,
    #[prost(message, optional, tag = "16")]
    azure_disk: Option<AzureDiskSource>,
    #[prost(message, optional, tag = "18")]
    portworx_volume: Option<PortworxSource>,
    #[prost(message, optional, tag = "22")]
    csi: Option<CsiSource>,
}

/// GCE PD (`pdName`) and AWS EBS (`volumeID`): the same tags.
#[derive(Clone, PartialEq, Message)]
struct DiskSource {
    #[prost(string, tag = "1")]
    id: String,
    #[prost(string, optional, tag = "2")]
    fs_type: Option<String>,
    #[prost(int32, optional, tag = "3")]
    partition: Option<i32>,
    #[prost(bool, optional, tag = "4")]
    read_only: Option<bool>,
}

#[derive(Clone, PartialEq, Message)]
struct CinderSource {
    #[prost(string, tag = "1")]
    volume_id: String,
    #[prost(string, optional, tag = "2")]
    fs_type: Option<String>,
    #[prost(bool, optional, tag = "3")]
    read_only: Option<bool>,
    #[prost(message, optional, tag = "4")]
    secret_ref: Option<WireSecretReference>,
}

#[derive(Clone, PartialEq, Message)]
struct WireSecretReference {
    #[prost(string, optional, tag = "1")]
    name: Option<String>,
    #[prost(string, optional, tag = "2")]
    namespace: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct AzureFileSource {
    #[prost(string, tag = "1")]
    secret_name: String,
    #[prost(string, tag = "2")]
    share_name: String,
    #[prost(bool, optional, tag = "3")]
    read_only: Option<bool>,
    #[prost(string, optional, tag = "4")]
    secret_namespace: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct VsphereSource {
    #[prost(string, tag = "1")]
    volume_path: String,
    #[prost(string, optional, tag = "2")]
    fs_type: Option<String>,
    #[prost(string, optional, tag = "3")]
    storage_policy_name: Option<String>,
    #[prost(string, optional, tag = "4")]
    storage_policy_id: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct AzureDiskSource {
    #[prost(string, tag = "1")]
    disk_name: String,
    #[prost(string, tag = "2")]
    disk_uri: String,
    #[prost(string, optional, tag = "3")]
    caching_mode: Option<String>,
    #[prost(string, optional, tag = "4")]
    fs_type: Option<String>,
    #[prost(bool, optional, tag = "5")]
    read_only: Option<bool>,
    #[prost(string, optional, tag = "6")]
    kind: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct PortworxSource {
    #[prost(string, tag = "1")]
    volume_id: String,
    #[prost(string, optional, tag = "2")]
    fs_type: Option<String>,
    #[prost(bool, optional, tag = "3")]
    read_only: Option<bool>,
}

#[derive(Clone, PartialEq, Message)]
struct CsiSource {
    #[prost(string, tag = "1")]
    driver: String,
    #[prost(string, tag = "2")]
    volume_handle: String,
    #[prost(btree_map = "string, string", tag = "5")]
    volume_attributes: BTreeMap<String, String>,
}

#[derive(Clone, PartialEq, Message)]
struct NodeAffinity {
    #[prost(message, optional, tag = "1")]
    required: Option<WireNodeSelector>,
}

#[derive(Clone, PartialEq, Message)]
struct WireNodeSelector {
    #[prost(message, repeated, tag = "1")]
    node_selector_terms: Vec<WireNodeSelectorTerm>,
}

#[derive(Clone, PartialEq, Message)]
struct WireNodeSelectorTerm {
    #[prost(message, repeated, tag = "1")]
    match_expressions: Vec<Requirement>,
    #[prost(message, repeated, tag = "2")]
    match_fields: Vec<Requirement>,
}

/// A Go `bool` with `omitempty`: `false` reads as absent.
fn set(value: Option<bool>) -> Option<bool> {
    value.filter(|value| *value)
}

fn node_requirements(requirements: Vec<Requirement>) -> Option<Vec<NodeSelectorRequirement>> {
    non_empty_vec(
        requirements
            .into_iter()
            .map(|r| NodeSelectorRequirement {
                key: r.key,
                operator: r.operator,
                values: non_empty_vec(r.values),
            })
            .collect(),
    )
}

impl VolumeSpec {
    fn into_spec(self) -> CachedVolumeSpec {
        let source = self.source.unwrap_or_default();
        CachedVolumeSpec {
            csi: source.csi.map(|csi| CachedCsiSource {
                driver: csi.driver,
                volume_handle: csi.volume_handle,
                volume_attributes: identity_kept(non_empty_map(csi.volume_attributes)),
            }),
            persistent_volume_reclaim_policy: non_empty(self.persistent_volume_reclaim_policy),
            storage_class_name: non_empty(self.storage_class_name),
            node_affinity: self.node_affinity.map(|affinity| VolumeNodeAffinity {
                required: affinity.required.map(|required| NodeSelector {
                    node_selector_terms: required
                        .node_selector_terms
                        .into_iter()
                        .map(|term| NodeSelectorTerm {
                            match_expressions: node_requirements(term.match_expressions),
                            match_fields: node_requirements(term.match_fields),
                        })
                        .collect(),
                }),
            }),
            gce_persistent_disk: source.gce_persistent_disk.map(|d| {
                GCEPersistentDiskVolumeSource {
                    pd_name: d.id,
                    fs_type: non_empty(d.fs_type),
                    partition: d.partition.filter(|p| *p != 0),
                    read_only: set(d.read_only),
                }
            }),
            aws_elastic_block_store: source.aws_elastic_block_store.map(|d| {
                AWSElasticBlockStoreVolumeSource {
                    volume_id: d.id,
                    fs_type: non_empty(d.fs_type),
                    partition: d.partition.filter(|p| *p != 0),
                    read_only: set(d.read_only),
                }
            }),
            // Go's pointers: cachingMode, fsType, readOnly and kind keep their presence.
            azure_disk: source.azure_disk.map(|d| AzureDiskVolumeSource {
                disk_name: d.disk_name,
                disk_uri: d.disk_uri,
                caching_mode: d.caching_mode,
                fs_type: d.fs_type,
                read_only: d.read_only,
                kind: d.kind,
            }),
            azure_file: source.azure_file.map(|f| AzureFilePersistentVolumeSource {
                secret_name: f.secret_name,
                share_name: f.share_name,
                read_only: set(f.read_only),
                secret_namespace: f.secret_namespace,
            }),
            cinder: source.cinder.map(|c| CinderPersistentVolumeSource {
                volume_id: c.volume_id,
                fs_type: non_empty(c.fs_type),
                read_only: set(c.read_only),
                secret_ref: c.secret_ref.map(|s| SecretReference {
                    name: non_empty(s.name),
                    namespace: non_empty(s.namespace),
                }),
            }),
            vsphere_volume: source
                .vsphere_volume
                .map(|v| VsphereVirtualDiskVolumeSource {
                    volume_path: v.volume_path,
                    fs_type: non_empty(v.fs_type),
                    storage_policy_name: non_empty(v.storage_policy_name),
                    storage_policy_id: non_empty(v.storage_policy_id),
                }),
            portworx_volume: source.portworx_volume.map(|p| PortworxVolumeSource {
                volume_id: p.volume_id,
                fs_type: non_empty(p.fs_type),
                read_only: set(p.read_only),
            }),
        }
    }
}

impl FromProtobuf for CachedVolume {
    fn from_protobuf(message: &[u8]) -> Result<Self, ProtobufError> {
        let volume: Volume = decode("PersistentVolume", message)?;
        let meta = wire_meta(volume.metadata);
        let status = volume.status.map(|status| CachedVolumeStatus {
            phase: non_empty(status.phase),
        });
        let spec = volume.spec.map(VolumeSpec::into_spec);
        let (metadata, rest) = kept("PersistentVolume", meta, spec, status)?;
        Ok(CachedVolume { metadata, rest })
    }
}

#[derive(Clone, PartialEq, Message)]
struct Attachment {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMeta>,
    #[prost(message, optional, tag = "2")]
    spec: Option<AttachmentSpec>,
}

#[derive(Clone, PartialEq, Message)]
struct AttachmentSpec {
    #[prost(message, optional, tag = "2")]
    source: Option<AttachmentSource>,
    #[prost(string, tag = "3")]
    node_name: String,
}

#[derive(Clone, PartialEq, Message)]
struct AttachmentSource {
    #[prost(string, optional, tag = "1")]
    persistent_volume_name: Option<String>,
}

impl FromProtobuf for CachedAttachment {
    fn from_protobuf(message: &[u8]) -> Result<Self, ProtobufError> {
        let attachment: Attachment = decode("VolumeAttachment", message)?;
        Ok(CachedAttachment::from(WireAttachment {
            metadata: wire_meta(attachment.metadata),
            spec: attachment.spec.map(|spec| WireAttachmentSpec {
                node_name: spec.node_name,
                source: spec.source.map(|source| WireAttachmentSource {
                    persistent_volume_name: source.persistent_volume_name,
                }),
            }),
        }))
    }
}
