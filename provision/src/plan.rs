//! Everything decided about one claim before the driver is called, and the CreateVolume
//! request made from it.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use thiserror::Error;

use crate::api::ReferenceGrantSpec;
use crate::csi;
use crate::csi::volume_capability::access_mode::Mode;

use super::attributes_class::requested_attributes_class;
use super::capabilities::{self, CapabilityError, SourceKind, check_provisioning_capabilities};
use super::claim::claim_class_name;
use super::data_source::{CLAIM_KIND, DataSource, SNAPSHOT_API_GROUP, SNAPSHOT_KIND};
use super::metadata::claim_metadata_parameters;
use super::parameters::{
    ExtraCreateMetadata, ParameterError, create_volume_parameters, deprecated_parameter_keys,
};
use super::quantity::{QuantityError, requested_bytes};
use super::reference_grant::{GrantedObject, reference_granted};
use super::secrets::{SecretError, SecretRefs, TemplateContext, resolve_secret_refs};
use super::settings::{DriverCapabilities, ProvisionerConfig};
use super::volume_name::{VolumeNameError, volume_name};

/// Why a claim cannot be provisioned. Every variant is raised before CreateVolume, so nothing
/// exists on the backend yet.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ProvisionError {
    /// Upstream's IgnoredError: stop without retrying and without a failure event (upstream
    /// emits a Normal `Provisioning` event "Assuming an external populator will provision the
    /// volume"). See [`ProvisionError::is_ignored`].
    #[error(
        "data source ({kind}) is not handled by the provisioner, assuming an external populator will provision it"
    )]
    ExternalPopulator { kind: String },
    #[error(
        "dataSourceRef namespace specified but the CrossNamespaceVolumeDataSource feature is disabled"
    )]
    CrossNamespaceDataSource,
    /// No ReferenceGrant of the source's namespace lets the claim's namespace use the source.
    #[error(
        "accessing {namespace}/{name} of {kind} dataSource from {claim_namespace}/{claim_name} isn't allowed"
    )]
    ReferenceNotGranted {
        namespace: String,
        name: String,
        kind: String,
        claim_namespace: String,
        claim_name: String,
    },
    #[error("the PVC source not found for PVC {claim}")]
    EmptyDataSourceName { claim: String },
    #[error(
        "the PVC source does not belong to the right APIGroup. Expected snapshot.storage.k8s.io, Got {api_group}"
    )]
    SnapshotApiGroup { api_group: String },
    #[error("claim Selector is not supported")]
    Selector,
    #[error("claim has no {0}")]
    IncompleteClaim(&'static str),
    #[error(transparent)]
    Capability(#[from] CapabilityError),
    #[error(transparent)]
    VolumeName(#[from] VolumeNameError),
    #[error("invalid storage request: {0}")]
    StorageRequest(#[from] QuantityError),
    #[error(transparent)]
    Parameters(#[from] ParameterError),
    #[error(transparent)]
    Secrets(#[from] SecretError),
}

impl ProvisionError {
    /// True when the claim is someone else's job (an external populator): stop quietly.
    pub fn is_ignored(&self) -> bool {
        matches!(self, Self::ExternalPopulator { .. })
    }
}

/// The decided provisioning of one claim: the CreateVolume inputs and everything the PV needs.
#[derive(Debug, Clone, PartialEq)]
pub struct ProvisionPlan {
    /// PV name and CreateVolume `name`.
    pub volume_name: String,
    /// Requested size in bytes (0 when the claim requests none).
    pub required_bytes: i64,
    pub volume_capabilities: Vec<csi::VolumeCapability>,
    pub parameters: HashMap<String, String>,
    /// Deprecated class parameter keys in use; the executor logs a warning for each.
    pub deprecated_parameters: Vec<String>,
    /// Every secret reference; `secrets.provisioner` is the Secret to GET for CreateVolume.
    pub secrets: SecretRefs,
    pub driver_name: String,
    pub identity: String,
    /// Filesystem for the PV's `spec.csi.fsType`; always `None` for block volumes.
    pub fs_type: Option<String>,
    /// `PV.spec.csi.readOnly` (`--controller-publish-readonly` with a single ROX mode).
    pub read_only: bool,
    /// Whether the driver reports topology, so the PV gets node affinity.
    pub topology: bool,
    /// Pre-binding reference to the claim, with uid and resourceVersion.
    pub claim_ref: ObjectReference,
    pub class_name: String,
    /// The class's `provisioner`, recorded in `pv.kubernetes.io/provisioned-by`.
    pub provisioned_by: String,
    pub reclaim_policy: Option<String>,
    pub mount_options: Option<Vec<String>>,
    pub access_modes: Vec<String>,
    pub volume_mode: Option<String>,
    /// The snapshot or claim the volume's content comes from; the executor reads it and
    /// decides the content source with [`super::snapshot_content_source`] or
    /// [`super::clone_content_source`].
    pub source: Option<DataSource>,
    /// The VolumeAttributesClass whose parameters CreateVolume carries as
    /// `mutable_parameters` (see [`super::mutable_parameters`]), and the PV's
    /// `volumeAttributesClassName`; `None` without one or with the gate off.
    pub attributes_class: Option<String>,
}

/// Validates the claim against its class and the driver, and decides every input of
/// CreateVolume and of the PV, in upstream's order (so the first error is upstream's too).
/// `class` is the claim's class, already accepted by
/// [`should_provision`](super::should_provision); `grants` are the ReferenceGrants of the
/// namespace [`grant_namespace`] names (none when it names none).
pub fn plan_provision(
    pvc: &PersistentVolumeClaim,
    class: &StorageClass,
    config: &ProvisionerConfig,
    caps: &DriverCapabilities,
    grants: &[ReferenceGrantSpec],
) -> Result<ProvisionPlan, ProvisionError> {
    let source = claim_source(pvc, config, grants)?;
    let kind = source
        .as_ref()
        .map_or(SourceKind::Empty, |source| source.kind);
    let attributes_class = requested_attributes_class(pvc, config).map(str::to_owned);
    check_provisioning_capabilities(caps, kind, attributes_class.is_some())?;
    let spec = pvc.spec.clone().unwrap_or_default();
    if spec.selector.is_some() {
        return Err(ProvisionError::Selector);
    }

    let meta = &pvc.metadata;
    let pvc_uid = meta.uid.as_deref().unwrap_or_default();
    let name = volume_name(
        &config.volume_name_prefix,
        config.volume_name_uuid_length,
        pvc_uid,
    )?;
    let pvc_name = meta
        .name
        .as_deref()
        .ok_or(ProvisionError::IncompleteClaim("metadata.name"))?;
    let pvc_namespace = meta
        .namespace
        .as_deref()
        .ok_or(ProvisionError::IncompleteClaim("metadata.namespace"))?;

    let no_parameters = BTreeMap::new();
    let class_parameters = class.parameters.as_ref().unwrap_or(&no_parameters);
    let fs_type = capabilities::fs_type(class_parameters, &config.default_fstype)?;
    let required_bytes = requested_bytes(pvc)?;
    let access_modes = spec.access_modes.clone().unwrap_or_default();
    let block = capabilities::is_block(spec.volume_mode.as_deref())?;
    let volume_capabilities = capabilities::volume_capabilities(
        &access_modes,
        block,
        fs_type.as_deref(),
        class.mount_options.as_deref().unwrap_or_default(),
        caps.single_node_multi_writer,
    )?;
    let secrets = resolve_secret_refs(
        class_parameters,
        &TemplateContext {
            pv_name: &name,
            pvc_name,
            pvc_namespace,
            pvc_annotations: meta.annotations.as_ref(),
        },
    )?;
    let extra = config.extra_create_metadata.then_some(ExtraCreateMetadata {
        pvc_name,
        pvc_namespace,
        pv_name: &name,
    });
    let mut parameters = create_volume_parameters(class_parameters, extra.as_ref())?;
    parameters.extend(claim_metadata_parameters(pvc, &config.metadata));

    let read_only = config.controller_publish_readonly
        && matches!(
            access_modes.as_slice(),
            [only] if capabilities::csi_access_mode(only, caps.single_node_multi_writer)
                == Ok(Mode::MultiNodeReaderOnly)
        );
    Ok(ProvisionPlan {
        volume_name: name,
        required_bytes,
        volume_capabilities,
        parameters,
        deprecated_parameters: deprecated_parameter_keys(class_parameters),
        secrets,
        driver_name: config.driver_name.clone(),
        identity: config.identity.clone(),
        fs_type: if block { None } else { fs_type },
        read_only,
        topology: caps.topology,
        claim_ref: ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some(CLAIM_KIND.to_owned()),
            namespace: Some(pvc_namespace.to_owned()),
            name: Some(pvc_name.to_owned()),
            uid: Some(pvc_uid.to_owned()),
            resource_version: meta.resource_version.clone(),
            field_path: None,
        },
        class_name: claim_class_name(pvc).to_owned(),
        provisioned_by: class.provisioner.clone(),
        reclaim_policy: class.reclaim_policy.clone(),
        mount_options: class.mount_options.clone(),
        access_modes,
        volume_mode: spec.volume_mode,
        source,
        attributes_class,
    })
}

/// The CreateVolume request of a plan. `provisioner_secrets` is the data of the Secret named by
/// `plan.secrets.provisioner` (see [`secret_data`](super::secret_data)), empty when there is
/// none; `accessibility_requirements` comes from the topology decision, `None` when the driver
/// has no topology; `volume_content_source` from the data source decision;
/// `mutable_parameters` from the claim's VolumeAttributesClass (empty without one).
pub fn build_create_volume_request(
    plan: &ProvisionPlan,
    provisioner_secrets: HashMap<String, String>,
    accessibility_requirements: Option<csi::TopologyRequirement>,
    volume_content_source: Option<csi::VolumeContentSource>,
    mutable_parameters: HashMap<String, String>,
) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        name: plan.volume_name.clone(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: plan.required_bytes,
            limit_bytes: 0,
        }),
        volume_capabilities: plan.volume_capabilities.clone(),
        parameters: plan.parameters.clone(),
        secrets: provisioner_secrets,
        volume_content_source,
        accessibility_requirements,
        mutable_parameters,
    }
}

/// The data source a claim names: `spec.dataSource`, else `spec.dataSourceRef` (upstream's
/// rule: `dataSource` wins, and names an object of the claim's namespace).
struct SourceReference<'a> {
    kind: &'a str,
    /// Empty for the core group.
    api_group: &'a str,
    name: &'a str,
    /// The reference's own namespace; `None` for the claim's.
    namespace: Option<&'a str>,
}

fn source_reference(pvc: &PersistentVolumeClaim) -> Option<SourceReference<'_>> {
    let spec = pvc.spec.as_ref()?;
    if let Some(source) = spec.data_source.as_ref() {
        return Some(SourceReference {
            kind: &source.kind,
            api_group: source.api_group.as_deref().unwrap_or_default(),
            name: &source.name,
            namespace: None,
        });
    }
    spec.data_source_ref.as_ref().map(|source| SourceReference {
        kind: &source.kind,
        api_group: source.api_group.as_deref().unwrap_or_default(),
        name: &source.name,
        namespace: source.namespace.as_deref().filter(|ns| !ns.is_empty()),
    })
}

/// The namespace whose ReferenceGrants decide whether the claim may use its data source: a
/// `dataSourceRef` into another namespace, with the CrossNamespaceVolumeDataSource gate on.
/// `None` when the claim needs no grant; the executor then passes none to [`plan_provision`].
pub fn grant_namespace<'a>(
    pvc: &'a PersistentVolumeClaim,
    config: &ProvisionerConfig,
) -> Option<&'a str> {
    let namespace = source_reference(pvc)?.namespace?;
    let claim_namespace = pvc.metadata.namespace.as_deref().unwrap_or_default();
    (config.cross_namespace_data_sources && namespace != claim_namespace).then_some(namespace)
}

/// Classifies the claim's data source, in upstream's order: the gate, the ReferenceGrant of
/// a source in another namespace, the name, then the kind (so a populator's kind in another
/// namespace needs a grant too).
fn claim_source(
    pvc: &PersistentVolumeClaim,
    config: &ProvisionerConfig,
    grants: &[ReferenceGrantSpec],
) -> Result<Option<DataSource>, ProvisionError> {
    let Some(reference) = source_reference(pvc) else {
        return Ok(None);
    };
    let claim_namespace = pvc.metadata.namespace.as_deref().unwrap_or_default();
    let namespace = match reference.namespace {
        None => claim_namespace,
        Some(_) if !config.cross_namespace_data_sources => {
            return Err(ProvisionError::CrossNamespaceDataSource);
        }
        Some(namespace) => namespace,
    };
    let object = GrantedObject {
        api_group: reference.api_group,
        kind: reference.kind,
        name: reference.name,
    };
    if namespace != claim_namespace && !reference_granted(grants, claim_namespace, object) {
        return Err(ProvisionError::ReferenceNotGranted {
            namespace: namespace.to_owned(),
            name: reference.name.to_owned(),
            kind: reference.kind.to_owned(),
            claim_namespace: claim_namespace.to_owned(),
            claim_name: pvc.metadata.name.clone().unwrap_or_default(),
        });
    }
    // Upstream's order: the name first, even for a populator's kind.
    if reference.name.is_empty() {
        return Err(ProvisionError::EmptyDataSourceName {
            claim: pvc.metadata.name.clone().unwrap_or_default(),
        });
    }
    let kind = match reference.kind {
        SNAPSHOT_KIND if reference.api_group == SNAPSHOT_API_GROUP => SourceKind::Snapshot,
        SNAPSHOT_KIND => {
            return Err(ProvisionError::SnapshotApiGroup {
                api_group: reference.api_group.to_owned(),
            });
        }
        // Upstream clones from a claim whatever group the reference names.
        CLAIM_KIND => SourceKind::Clone,
        kind => {
            return Err(ProvisionError::ExternalPopulator {
                kind: kind.to_owned(),
            });
        }
    };
    Ok(Some(DataSource {
        kind,
        namespace: namespace.to_owned(),
        name: reference.name.to_owned(),
    }))
}

#[cfg(test)]
mod tests;
