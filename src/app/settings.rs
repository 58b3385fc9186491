//! The reconcilers' settings from the flags and what the driver reported.

use std::time::{SystemTime, UNIX_EPOCH};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResourceList;
use kube::Client;
use tracing::{info, warn};

use super::error::AppError;
use crate::config::{Args, ConsistencyDefault, Gate};
use crate::controller::{NodeDeployment, Settings, TopologyFlags};
use crate::csi_client::DriverInfo;
use crate::journal::JournalScope;
use crate::leader;
use crate::provision::{DriverCapabilities, ProvisionerConfig, provisioner_identity};

const SERVICE_ACCOUNT_NAMESPACE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// `node`: the node of `--node-deployment` (`app::node`), `None` otherwise.
pub(super) fn settings(
    args: &Args,
    info: &DriverInfo,
    node: Option<NodeDeployment>,
) -> Result<Settings, AppError> {
    let gates = args.feature_gates();
    let caps = DriverCapabilities {
        controller_service: info.supports_controller_service(),
        create_delete_volume: info.supports_create_delete(),
        single_node_multi_writer: info.supports_single_node_multi_writer(),
        topology: info.supports_topology() && gates.enabled(Gate::Topology),
        clone: info.supports_clone(),
        snapshot: info.supports_snapshot(),
        publish_unpublish: info.supports_publish_unpublish(),
        modify_volume: info.supports_modify_volume(),
    };
    let provision = &args.provision;
    let controller = &args.controller;
    let uuid_length =
        i32::try_from(provision.volume_name_uuid_length).map_err(|_| AppError::UuidLength)?;
    if !controller.audit_volumes_interval.is_zero() && !info.supports_list_volumes() {
        return Err(AppError::NoListVolumes {
            driver: info.name.clone(),
        });
    }
    let hostname = leader::sanitize_name(&hostname());
    let node_name = node.as_ref().map(|node| node.name.as_str());
    let identity = provisioner_identity(unix_millis(), random_below_10000(), &info.name, node_name);
    let journal_scope = JournalScope::new(&leader::lease_name(&info.name), node_name);
    Ok(Settings {
        config: ProvisionerConfig {
            driver_name: info.name.clone(),
            volume_name_prefix: provision.volume_name_prefix.clone(),
            volume_name_uuid_length: uuid_length,
            extra_create_metadata: provision.extra_create_metadata,
            metadata: provision.metadata_allow_lists(),
            default_fstype: provision.default_fstype.clone(),
            controller_publish_readonly: provision.controller_publish_readonly,
            prevent_volume_mode_conversion: provision.prevent_volume_mode_conversion,
            cross_namespace_data_sources: gates.enabled(Gate::CrossNamespaceVolumeDataSource),
            volume_attributes_classes: gates.enabled(Gate::VolumeAttributesClass),
            identity,
        },
        caps,
        retry_interval_start: controller.retry_interval_start,
        retry_interval_max: controller.retry_interval_max,
        worker_threads: usize::try_from(controller.worker_threads).unwrap_or(usize::MAX),
        max_concurrent_per_class: usize::try_from(controller.max_concurrent_per_storage_class)
            .unwrap_or(usize::MAX),
        adaptive_call_rate: controller.adaptive_call_rate,
        audit_volumes_interval: controller.audit_volumes_interval,
        audit_delete_after: (!controller.audit_delete_after.is_zero())
            .then_some(controller.audit_delete_after),
        cloning_protection_threads: usize::try_from(controller.cloning_protection_threads)
            .unwrap_or(usize::MAX),
        snapshot_orphan_sweep_interval: controller.snapshot_orphan_sweep_interval,
        event_component: format!("{}_{}_{}", info.name, hostname, uuid::Uuid::new_v4()),
        hostname,
        consistency_by_default: controller.provisioning_consistency_default
            == ConsistencyDefault::Enable,
        journal_namespace: leader::resolve_namespace(
            &args.leader.leader_election_namespace,
            std::env::var("POD_NAMESPACE").ok().as_deref(),
            std::fs::read_to_string(SERVICE_ACCOUNT_NAMESPACE)
                .ok()
                .as_deref(),
        ),
        journal_scope,
        journal_timeout: args.driver.timeout,
        draining: controller.drain,
        topology: TopologyFlags {
            strict: args.topology.strict_topology,
            immediate: args.topology.immediate_topology,
        },
        node,
        capacity: None,
    })
}

/// Upstream's start-up check: the VolumeAttributesClass gate, on and not named on the command
/// line, is switched off when the API server does not serve the kind in storage.k8s.io/v1.
/// A discovery error leaves it on (claims naming a class then fail at the class's GET).
pub(super) async fn check_attributes_classes_served(
    settings: &mut Settings,
    args: &Args,
    client: &Client,
) {
    let explicit = args
        .feature_gates()
        .is_explicit(Gate::VolumeAttributesClass);
    if !settings.config.volume_attributes_classes || explicit {
        return;
    }
    match client.list_api_group_resources(STORAGE_V1).await {
        Ok(resources) if !serves_attributes_classes(&resources) => {
            info!(
                "Disabling VolumeAttributesClass feature gate because the VolumeAttributesClass v1 API is not available"
            );
            settings.config.volume_attributes_classes = false;
        }
        Ok(_) => {}
        Err(error) => {
            warn!(%error, "discovery of {STORAGE_V1} failed; the VolumeAttributesClass gate stays on");
        }
    }
}

const STORAGE_V1: &str = "storage.k8s.io/v1";

fn serves_attributes_classes(resources: &APIResourceList) -> bool {
    resources
        .resources
        .iter()
        .any(|resource| resource.kind == "VolumeAttributesClass")
}

fn hostname() -> String {
    hostname::get()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "unknown".into())
}

fn unix_millis() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis())
}

fn random_below_10000() -> u16 {
    (uuid::Uuid::new_v4().as_u128() % 10_000) as u16
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResource;

    use super::*;

    fn listing(kinds: &[&str]) -> APIResourceList {
        APIResourceList {
            group_version: STORAGE_V1.to_owned(),
            resources: kinds
                .iter()
                .map(|kind| APIResource {
                    kind: (*kind).to_owned(),
                    ..APIResource::default()
                })
                .collect(),
        }
    }

    #[test]
    fn the_kind_decides_whether_attributes_classes_are_served() {
        assert!(serves_attributes_classes(&listing(&[
            "StorageClass",
            "VolumeAttributesClass"
        ])));
        // Kubernetes before 1.34 serves the kind only in v1beta1 (or v1alpha1).
        assert!(!serves_attributes_classes(&listing(&[
            "StorageClass",
            "CSIDriver"
        ])));
    }
}
