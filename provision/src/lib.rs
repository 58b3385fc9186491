//! The pure decision layer of the sidecar: everything it decides about a claim, a StorageClass
//! and a PersistentVolume, with no IO, no kube client and no async. Executors fetch the
//! objects, call these functions and act on what they return. Every function is total on data
//! coming from the API server or the driver: bad input is a typed error, never a panic.
//!
//! Provisioning one claim:
//! 1. [`claim_work`] says what the claim needs now (through [`should_provision`]: Provision,
//!    Skip with a reason, or Error).
//! 2. [`plan_provision`] validates the claim and its class and computes everything that does not
//!    need the driver: volume name, size, capabilities, parameters and all secret references.
//!    A data source in another namespace needs the ReferenceGrants of the namespace that
//!    [`grant_namespace`] names.
//! 3. The executor GETs `plan.secrets.provisioner` (if any), turns it into a map with
//!    [`secret_data`], GETs the VolumeAttributesClass `plan.attributes_class` names (if any)
//!    and turns it into `mutable_parameters` with [`mutable_parameters`], and builds the
//!    request with [`build_create_volume_request`]. With a
//!    driver that supports topology, [`accessibility_requirements`] says where the volume may
//!    and should be, from the executor's Node and CSINode caches ([`ClusterTopology`]).
//! 4. After CreateVolume succeeds, [`build_persistent_volume`] gives the PV to create. When the
//!    PV create answers AlreadyExists, [`existing_pv`] says whether that is success, or whether
//!    the new volume is in use by another PV or belongs to nobody.
//!
//! Deleting one PV: [`volume_has_work`] (from [`is_provisioner_for_volume`],
//! [`pv_finalizer_action`] and [`should_delete`]), then [`deletion_target`] (and
//! [`deletion_secret_from_class`] when the PV does not record its deletion secret), and right
//! before DeleteVolume [`check_detached`] (no VolumeAttachment names the PV).
//!
//! A crate of its own so that the compiler keeps it pure: it depends on the API types
//! (k8s-openapi, [`api`]), the CSI messages (csi-spec) and serialization only, never on tokio or
//! a kube client. The sidecar re-exports it as `csi_provisioner::provision` (and [`api`] as
//! `csi_provisioner::api`).

/// The sidecar's name for the CSI messages, so the decisions read `csi::...` as the sidecar does.
use csi_spec as csi;

// Public, so a caller can name a decision by its module (`provision::node::check_node`); the
// flat re-exports below are what today's callers import. `validation` and `reference_grant`
// are helpers of the other modules only.
pub mod accessibility;
pub mod api;
pub mod attachment;
pub mod attributes_class;
pub mod audit;
pub mod call_rate;
pub mod capabilities;
pub mod claim;
pub mod consistency;
pub mod data_source;
pub mod deletion;
pub mod event_delivery;
pub mod finalizers;
pub mod metadata;
pub mod migration;
pub mod node;
pub mod parameters;
pub mod plan;
pub mod protection;
pub mod quantity;
mod reference_grant;
pub mod reschedule;
pub mod secrets;
pub mod settings;
pub mod storage_capacity;
mod validation;
pub mod volume;
pub mod volume_name;
pub mod well_known;
pub mod work;

// The sidecar's controller tests build claims and volumes with these too; `cfg(test)` of this
// crate is not theirs, so they reach the builders through the `test-fixtures` feature, which
// only the sidecar's [dev-dependencies] enable.
// Public now, so clippy asks the builders for a `Default`: `PvcBuilder::new()` starts a chain of
// setters, and a `default()` beside it would be a second name for the same start.
#[cfg(any(test, feature = "test-fixtures"))]
#[allow(clippy::new_without_default)]
pub mod fixtures;
#[cfg(test)]
mod proptests;

pub use accessibility::{
    ClusterTopology, TopologyError, TopologyInputs, TopologyTerm, accessibility_requirements,
};
pub use attachment::{Attachment, AttachmentError, announce_detach_wait, check_detached};
pub use attributes_class::{
    AttributesClassError, ignored_attributes_class, mutable_parameters, recorded_class_moved,
    requested_attributes_class,
};
pub use call_rate::{
    AdaptiveRate, CALLS_PER_SECOND_ANNOTATION, CallRateError, class_call_rate, effective_rate,
};
pub use capabilities::{
    CapabilityError, SourceKind, check_create_delete_capabilities, csi_access_mode, fs_type,
    volume_capabilities,
};
pub use claim::{
    ClaimWork, DecisionError, DriverClass, NotOwner, ProvisionDecision, SkipReason,
    claim_class_name, claim_is_for_driver, class_for_driver, class_is_for_driver, migrated_plugin,
    selected_node, should_provision, storage_provisioner,
};
pub use consistency::{
    ANN_PROVISIONING_CONSISTENCY, PROVISIONING_FINALIZER, consistency_enabled,
    has_provisioning_finalizer, may_release_finalizer, needs_finalizer,
};
pub use data_source::{
    ANN_ALLOW_VOLUME_MODE_CHANGE, CLONE_PROTECTION_FINALIZER, DataSource, DataSourceError,
    SNAPSHOT_PROTECTION_FINALIZER, SourceProblem, check_clone_source, check_snapshot_source,
    clone_content_source, snapshot_content_source,
};
pub use deletion::{
    DeletionError, DeletionSecrets, DeletionTarget, ExistingPv, FinalizerAction, PvOfOperation,
    deletion_secret_from_class, deletion_secrets, deletion_target, existing_pv,
    has_deletable_source, is_migrated, is_provisioner_for_volume, may_delete_pv_first,
    pv_finalizer_action, pv_holds_volume, pv_is_for_claim, pv_of_operation, should_delete,
    volume_finalizer_action,
};
pub use event_delivery::{EventDelivery, event_delivery};
pub use finalizers::{finalizer_addition_patch, finalizer_removal_patch};
pub use metadata::{
    KeyAllowList, KeyPatternError, MetadataAllowLists, claim_metadata_parameters,
    copy_claim_labels, namespace_metadata_parameters,
};
pub use migration::{Holding, InTreePlugin, MigrationError};
pub use node::{
    CapacityCheck, NodeScope, Ownership, SingleNode, VolumePlace, capacity_check, check_node,
    claim_left_node, has_room, left_out, node_claim_work, ownership_delay, select_node_patch,
    volume_on_node, volume_place,
};
pub use parameters::{
    ExtraCreateMetadata, ParameterError, create_volume_parameters, deprecated_parameter_keys,
};
pub use plan::{
    ProvisionError, ProvisionPlan, build_create_volume_request, grant_namespace, plan_provision,
};
pub use protection::{
    CloneHold, CloneVerdict, InFlightSources, PendingRestores, SnapshotContent, SnapshotHold,
    SnapshotVerdict, SourceVolume, clone_verdict, snapshot_verdict,
};
pub use quantity::{QuantityError, format_binary_si, parse_quantity_bytes, requested_bytes};
pub use reschedule::{NodeVerdict, RescheduleCause, node_verdict, reschedule_patch};
pub use secrets::{
    SecretError, SecretKind, SecretRef, SecretRefs, TemplateContext, resolve_secret_ref,
    resolve_secret_refs, secret_data,
};
pub use settings::{DriverCapabilities, ProvisionerConfig, provisioner_identity};
pub use volume::{CreateResponseError, build_persistent_volume, topology_missing};
pub use volume_name::{VolumeNameError, check_volume_name_flags, names_may_collide, volume_name};
pub use well_known::{
    ANN_ALPHA_SELECTED_NODE, ANN_BETA_STORAGE_CLASS, ANN_BETA_STORAGE_PROVISIONER,
    ANN_CONTROLLER_MODIFY_SECRET_NAME, ANN_CONTROLLER_MODIFY_SECRET_NAMESPACE,
    ANN_DELETION_SECRET_NAME, ANN_DELETION_SECRET_NAMESPACE, ANN_MIGRATED_TO, ANN_PROVISIONED_BY,
    ANN_SELECTED_NODE, ANN_STORAGE_PROVISIONER, PROVISIONER_IDENTITY_KEY, PV_FINALIZER,
};
pub use work::{
    claim_work, drain_claim_work, has_operation_in_flight, holds_up_drain, volume_has_work,
};
