//! Whether a claim is ours to provision now (upstream's shouldProvision chain), and the kinds of
//! work a claim may need ([`ClaimWork`]): defined here, below `work` (which finds the work) and
//! `node` (which narrows it to one node), so neither imports the other.

use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use thiserror::Error;

use super::migration::{InTreePlugin, MigrationError};
use super::well_known::{
    ANN_ALPHA_SELECTED_NODE, ANN_BETA_STORAGE_CLASS, ANN_BETA_STORAGE_PROVISIONER, ANN_MIGRATED_TO,
    ANN_SELECTED_NODE, ANN_STORAGE_PROVISIONER,
};

const WAIT_FOR_FIRST_CONSUMER: &str = "WaitForFirstConsumer";

/// The verdict on one claim event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProvisionDecision {
    /// Go on with [`plan_provision`](super::plan_provision).
    Provision,
    /// Not ours, or not yet: drop the event without an error or a Kubernetes event.
    Skip(SkipReason),
    /// Ours, but it cannot proceed: count a failure and retry with backoff.
    Error(DecisionError),
}

/// The work a claim needs now. `C` is how the caller holds the claim's StorageClass (a
/// reference, or the cache's `Arc`), handed back with [`ClaimWork::Provision`].
#[derive(Debug, PartialEq)]
pub enum ClaimWork<C> {
    /// Nothing now; the reason, when the claim is not ours to provision (for the debug log).
    Nothing(Option<SkipReason>),
    /// Take the provisioning-consistency finalizer off.
    ReleaseFinalizer,
    /// Plan and provision a volume with this class.
    Provision(C),
    /// Ours, but it cannot proceed: a failure to report and retry.
    Refuse(DecisionError),
    /// `--node-deployment`: an Immediate claim no node owns yet; compete for it with this
    /// class (see `provision::node`). Never returned by [`claim_work`](super::claim_work) itself.
    BecomeOwner(C),
}

/// Why a claim is left alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SkipReason {
    /// `spec.volumeName` is set: the claim is bound, or being bound, to an existing PV.
    AlreadyBound { volume_name: String },
    /// No storage-provisioner annotation: kube-controller-manager has not asked for
    /// external provisioning.
    NoProvisionerAnnotation,
    /// The claim waits for another provisioner.
    OtherProvisioner { provisioner: String },
    /// WaitForFirstConsumer class and the scheduler has not selected a node yet.
    WaitingForFirstConsumer,
    /// The claim's class belongs to another provisioner (upstream stops silently here too).
    ClassOfOtherProvisioner { class: String, provisioner: String },
    /// The sidecar drains (`--drain`) and the claim has no operation in flight: the
    /// provisioner taking over provisions it.
    Draining,
    /// `--node-deployment`: the claim is not this node's (see `provision::node`).
    NotThisNode(NotOwner),
}

/// Why a claim is not this node's (debug log only: other nodes' claims are ignored silently).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotOwner {
    #[error("the claim is assigned to node {0:?}")]
    OtherNode(String),
    #[error("the claim waits for the scheduler to select a node")]
    NotScheduled,
    #[error(
        "Immediate class and --node-deployment-immediate-binding=false: another controller must select a node"
    )]
    ImmediateBindingOff,
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::AlreadyBound { volume_name } => {
                write!(f, "claim is already bound to volume {volume_name:?}")
            }
            Self::NoProvisionerAnnotation => {
                f.write_str("claim has no storage-provisioner annotation")
            }
            Self::OtherProvisioner { provisioner } => {
                write!(f, "claim waits for provisioner {provisioner:?}")
            }
            Self::WaitingForFirstConsumer => {
                f.write_str("claim waits for the scheduler to select a node")
            }
            Self::ClassOfOtherProvisioner { class, provisioner } => write!(
                f,
                "storage class {class:?} belongs to provisioner {provisioner:?}"
            ),
            Self::Draining => f.write_str(
                "the sidecar drains and no operation of this claim is in flight; the next provisioner takes it",
            ),
            Self::NotThisNode(reason) => write!(f, "not this node's claim: {reason}"),
        }
    }
}

/// A claim that is ours but cannot be decided on.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecisionError {
    /// The executor found no StorageClass named by the claim (the text is the API server's).
    #[error("storageclass.storage.k8s.io {0:?} not found")]
    StorageClassNotFound(String),
}

/// Upstream's decision chain, in its order: `spec.volumeName` set → skip; the GA (else beta)
/// storage-provisioner annotation must name `driver_name`; a missing class is an error; a
/// WaitForFirstConsumer class needs a non-empty `selected-node`; the class must belong to
/// `driver_name`. `class` is the class named by [`claim_class_name`], `None` if it does not
/// exist.
pub fn should_provision(
    pvc: &PersistentVolumeClaim,
    class: Option<&StorageClass>,
    driver_name: &str,
) -> ProvisionDecision {
    if let Some(volume_name) = pvc
        .spec
        .as_ref()
        .and_then(|spec| spec.volume_name.as_deref())
        .filter(|name| !name.is_empty())
    {
        return ProvisionDecision::Skip(SkipReason::AlreadyBound {
            volume_name: volume_name.to_owned(),
        });
    }

    let Some(provisioner) = storage_provisioner(pvc) else {
        return ProvisionDecision::Skip(SkipReason::NoProvisionerAnnotation);
    };
    if !claim_is_for_driver(pvc, driver_name) {
        return ProvisionDecision::Skip(SkipReason::OtherProvisioner {
            provisioner: provisioner.to_owned(),
        });
    }

    let Some(class) = class else {
        return ProvisionDecision::Error(DecisionError::StorageClassNotFound(
            claim_class_name(pvc).to_owned(),
        ));
    };

    if class.volume_binding_mode.as_deref() == Some(WAIT_FOR_FIRST_CONSUMER)
        && selected_node(pvc).is_none()
    {
        return ProvisionDecision::Skip(SkipReason::WaitingForFirstConsumer);
    }

    if !class_is_for_driver(class, driver_name) {
        return ProvisionDecision::Skip(SkipReason::ClassOfOtherProvisioner {
            class: class.metadata.name.clone().unwrap_or_default(),
            provisioner: class.provisioner.clone(),
        });
    }
    ProvisionDecision::Provision
}

/// Whether the claim asks for this driver: its storage-provisioner annotation (GA, else beta)
/// names the driver, or names the in-tree plugin migrated to the driver while
/// `pv.kubernetes.io/migrated-to` names the driver (kube-controller-manager writes the CSI
/// name in both annotations; upstream's library and sidecar together accept exactly these).
pub fn claim_is_for_driver(pvc: &PersistentVolumeClaim, driver_name: &str) -> bool {
    match storage_provisioner(pvc) {
        Some(provisioner) if provisioner == driver_name => true,
        Some(provisioner) => {
            InTreePlugin::for_csi_driver(driver_name)
                .is_some_and(|plugin| plugin.in_tree_name() == provisioner)
                && annotation(&pvc.metadata, ANN_MIGRATED_TO) == Some(driver_name)
        }
        None => false,
    }
}

/// Whether the class is provisioned by this driver: its provisioner is the driver, or the
/// in-tree plugin migrated to it (such a class is translated first, see [`migrated_class`]).
pub fn class_is_for_driver(class: &StorageClass, driver_name: &str) -> bool {
    class.provisioner == driver_name || migrated_plugin(class, driver_name).is_some()
}

/// The in-tree plugin of a class whose provisioner is the in-tree plugin migrated to this
/// driver: the claims of that class are migrated claims. Decided by the class alone, as
/// upstream's, not by the claim's annotations.
pub fn migrated_plugin(class: &StorageClass, driver_name: &str) -> Option<InTreePlugin> {
    InTreePlugin::for_csi_driver(driver_name)
        .filter(|plugin| plugin.in_tree_name() == class.provisioner)
}

/// A claim's class as the driver reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct DriverClass {
    pub class: Arc<StorageClass>,
    /// For an in-tree class migrated to the driver: the plugin, whose source the CSI PV is
    /// translated back to.
    pub plugin: Option<InTreePlugin>,
    /// The `pv.kubernetes.io/provisioned-by` of the PV, when not the plan's: a migrated
    /// claim's PV names the class's own (in-tree) provisioner, as upstream's library writes it.
    pub provisioned_by: Option<String>,
}

/// The class a claim is provisioned with: an in-tree class migrated to `driver_name` is
/// translated (parameters, allowedTopologies); any other class is taken as it is.
pub fn class_for_driver(
    class: Arc<StorageClass>,
    driver_name: &str,
) -> Result<DriverClass, MigrationError> {
    let Some(plugin) = migrated_plugin(&class, driver_name) else {
        return Ok(DriverClass {
            class,
            plugin: None,
            provisioned_by: None,
        });
    };
    Ok(DriverClass {
        class: Arc::new(plugin.translate_class(&class)?),
        plugin: Some(plugin),
        provisioned_by: Some(class.provisioner.clone()),
    })
}

/// The StorageClass a claim asks for: the legacy beta annotation wins over
/// `spec.storageClassName`; `""` when neither is set.
pub fn claim_class_name(pvc: &PersistentVolumeClaim) -> &str {
    annotation(&pvc.metadata, ANN_BETA_STORAGE_CLASS)
        .or_else(|| pvc.spec.as_ref()?.storage_class_name.as_deref())
        .unwrap_or_default()
}

/// The provisioner kube-controller-manager asks for: the GA annotation, else the beta one.
/// Presence, not emptiness, selects the key: an empty GA value hides the beta one.
pub fn storage_provisioner(pvc: &PersistentVolumeClaim) -> Option<&str> {
    annotation(&pvc.metadata, ANN_STORAGE_PROVISIONER)
        .or_else(|| annotation(&pvc.metadata, ANN_BETA_STORAGE_PROVISIONER))
}

/// The node the scheduler selected for the claim, if any: the GA annotation when present,
/// else the alpha one. Presence selects the key, as in upstream's library: an empty GA value
/// means no node, whatever the alpha key says.
pub fn selected_node(pvc: &PersistentVolumeClaim) -> Option<&str> {
    annotation(&pvc.metadata, ANN_SELECTED_NODE)
        .or_else(|| annotation(&pvc.metadata, ANN_ALPHA_SELECTED_NODE))
        .filter(|node| !node.is_empty())
}

pub(super) fn annotation<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations.as_ref()?.get(key).map(String::as_str)
}

#[cfg(test)]
mod tests;
