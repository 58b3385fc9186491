//! The PersistentVolume for a created volume.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    PersistentVolume, PersistentVolumeSpec, SecretReference, VolumeNodeAffinity,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use thiserror::Error;

use crate::csi;

use super::plan::ProvisionPlan;
use super::quantity::format_binary_si;
use super::secrets::SecretRef;
use super::well_known::{
    ANN_CONTROLLER_MODIFY_SECRET_NAME, ANN_CONTROLLER_MODIFY_SECRET_NAMESPACE,
    ANN_DELETION_SECRET_NAME, ANN_DELETION_SECRET_NAMESPACE, ANN_PROVISIONED_BY,
    PROVISIONER_IDENTITY_KEY, PV_FINALIZER,
};

/// Why a successful CreateVolume answer cannot become a PV.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CreateResponseError {
    /// The driver said OK without a volume; repeating CreateVolume with the same name is the
    /// only way to learn its id.
    #[error("CreateVolume response has no volume")]
    MissingVolume,
    /// As [`CreateResponseError::MissingVolume`]: nothing to delete without an id.
    #[error("CreateVolume response has an empty volume_id")]
    EmptyVolumeId,
    /// The volume exists but is too small: delete it (see [`CreateResponseError::volume_to_delete`]).
    #[error("created volume capacity {capacity} less than requested capacity {requested}")]
    CapacityTooSmall {
        volume_id: String,
        capacity: i64,
        requested: i64,
    },
    /// A volume asked for with a content source came back without one: the driver ignored
    /// the source, so the volume is empty and is deleted (upstream's text).
    #[error("volume content source missing")]
    ContentSourceMissing { volume_id: String },
}

impl CreateResponseError {
    /// The backend volume the executor must DeleteVolume before anything else, if any.
    pub fn volume_to_delete(&self) -> Option<&str> {
        match self {
            Self::CapacityTooSmall { volume_id, .. } | Self::ContentSourceMissing { volume_id } => {
                Some(volume_id)
            }
            Self::MissingVolume | Self::EmptyVolumeId => None,
        }
    }
}

/// The pre-bound PV for a volume the driver created according to `plan`.
///
/// Node-affinity expressions are sorted by topology key, so the same response always gives
/// the same PV (upstream iterates a map and its order varies between runs).
pub fn build_persistent_volume(
    plan: &ProvisionPlan,
    response: &csi::CreateVolumeResponse,
) -> Result<PersistentVolume, CreateResponseError> {
    let volume = response
        .volume
        .as_ref()
        .ok_or(CreateResponseError::MissingVolume)?;
    if volume.volume_id.is_empty() {
        return Err(CreateResponseError::EmptyVolumeId);
    }
    let capacity = match volume.capacity_bytes {
        // The driver does not know or say: take what was asked for.
        0 => plan.required_bytes,
        capacity if capacity < plan.required_bytes => {
            return Err(CreateResponseError::CapacityTooSmall {
                volume_id: volume.volume_id.clone(),
                capacity,
                requested: plan.required_bytes,
            });
        }
        capacity => capacity,
    };
    if plan.source.is_some() && volume.content_source.is_none() {
        return Err(CreateResponseError::ContentSourceMissing {
            volume_id: volume.volume_id.clone(),
        });
    }

    let mut annotations =
        BTreeMap::from([(ANN_PROVISIONED_BY.to_owned(), plan.provisioned_by.clone())]);
    // Always written, empty when there is no secret (as upstream writes it): deletion then knows the
    // class had none instead of re-reading a class that may have changed.
    let (deletion_name, deletion_namespace) = plan
        .secrets
        .provisioner
        .as_ref()
        .map(|r| (r.name.clone(), r.namespace.clone()))
        .unwrap_or_default();
    annotations.insert(ANN_DELETION_SECRET_NAME.to_owned(), deletion_name);
    annotations.insert(ANN_DELETION_SECRET_NAMESPACE.to_owned(), deletion_namespace);
    if let Some(modify) = &plan.secrets.controller_modify {
        annotations.insert(
            ANN_CONTROLLER_MODIFY_SECRET_NAME.to_owned(),
            modify.name.clone(),
        );
        annotations.insert(
            ANN_CONTROLLER_MODIFY_SECRET_NAMESPACE.to_owned(),
            modify.namespace.clone(),
        );
    }

    let mut attributes =
        BTreeMap::from([(PROVISIONER_IDENTITY_KEY.to_owned(), plan.identity.clone())]);
    // The driver's context wins over the identity key.
    attributes.extend(
        volume
            .volume_context
            .iter()
            .map(|(k, v)| (k.clone(), v.clone())),
    );

    let secrets = &plan.secrets;
    let csi_source = CSIPersistentVolumeSource {
        driver: plan.driver_name.clone(),
        volume_handle: volume.volume_id.clone(),
        fs_type: plan.fs_type.clone(),
        volume_attributes: Some(attributes),
        read_only: plan.read_only.then_some(true),
        controller_publish_secret_ref: secrets.controller_publish.as_ref().map(reference),
        node_stage_secret_ref: secrets.node_stage.as_ref().map(reference),
        node_publish_secret_ref: secrets.node_publish.as_ref().map(reference),
        controller_expand_secret_ref: secrets.controller_expand.as_ref().map(reference),
        node_expand_secret_ref: secrets.node_expand.as_ref().map(reference),
    };

    Ok(PersistentVolume {
        metadata: ObjectMeta {
            name: Some(plan.volume_name.clone()),
            annotations: Some(annotations),
            finalizers: Some(vec![PV_FINALIZER.to_owned()]),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeSpec {
            access_modes: Some(plan.access_modes.clone()),
            capacity: Some(BTreeMap::from([(
                "storage".to_owned(),
                Quantity(format_binary_si(capacity)),
            )])),
            claim_ref: Some(plan.claim_ref.clone()),
            csi: Some(csi_source),
            mount_options: plan.mount_options.clone(),
            node_affinity: if plan.topology {
                node_affinity(&volume.accessible_topology)
            } else {
                None
            },
            persistent_volume_reclaim_policy: plan.reclaim_policy.clone(),
            storage_class_name: Some(plan.class_name.clone()),
            volume_attributes_class_name: plan.attributes_class.clone(),
            volume_mode: plan.volume_mode.clone(),
            ..PersistentVolumeSpec::default()
        }),
        status: None,
    })
}

/// Whether a volume created under topology requirements came back without any accessible
/// topology (none reported, or only empty segments): its PV then has no node affinity, so
/// the scheduler may put its pods on nodes that cannot reach it. The CSI spec allows it (the
/// volume is then accessible from every node), but a driver that was asked for a segment
/// rarely means it; the claim gets a warning. Upstream says nothing, and with only empty
/// segments builds a PV the API server rejects for ever.
pub fn topology_missing(request: &csi::CreateVolumeRequest, volume: &csi::Volume) -> bool {
    let asked = request
        .accessibility_requirements
        .as_ref()
        .is_some_and(|requirements| !requirements.requisite.is_empty());
    asked
        && volume
            .accessible_topology
            .iter()
            .all(|topology| topology.segments.is_empty())
}

fn reference(secret: &SecretRef) -> SecretReference {
    SecretReference {
        name: Some(secret.name.clone()),
        namespace: Some(secret.namespace.clone()),
    }
}

/// One term per non-empty topology (terms are ORed), one `In` expression per segment, sorted
/// by key.
fn node_affinity(topologies: &[csi::Topology]) -> Option<VolumeNodeAffinity> {
    let terms: Vec<NodeSelectorTerm> = topologies
        .iter()
        .filter(|topology| !topology.segments.is_empty())
        .map(|topology| {
            let segments: BTreeMap<&String, &String> = topology.segments.iter().collect();
            NodeSelectorTerm {
                match_expressions: Some(
                    segments
                        .into_iter()
                        .map(|(key, value)| NodeSelectorRequirement {
                            key: key.clone(),
                            operator: "In".to_owned(),
                            values: Some(vec![value.clone()]),
                        })
                        .collect(),
                ),
                match_fields: None,
            }
        })
        .collect();
    if terms.is_empty() {
        return None;
    }
    Some(VolumeNodeAffinity {
        required: Some(NodeSelector {
            node_selector_terms: terms,
        }),
    })
}

#[cfg(test)]
mod tests;
