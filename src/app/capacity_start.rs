//! `--enable-capacity` at start: what the capacity controller needs from the environment, the
//! driver and the API server, or the reason the sidecar cannot publish capacity.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::storage::v1::CSIStorageCapacity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DynamicObject, GroupVersionKind, ListParams};
use kube::{Api, Client, ResourceExt};
use tracing::info;

use crate::config::CapacityArgs;
use crate::controller::{CapacitySettings, NodeDeployment, SegmentSource};
use crate::csi_client::DriverInfo;
use crate::provision::storage_capacity::{ObjectTemplate, Segment, managed_by};

#[derive(Debug, thiserror::Error)]
pub enum CapacityStartError {
    #[error(
        "--enable-capacity: the CSI driver {driver:?} does not report the GET_CAPACITY controller capability, so it cannot report capacity"
    )]
    NoGetCapacity { driver: String },
    #[error("need NAMESPACE env variable for CSIStorageCapacity objects")]
    NoNamespace,
    #[error("need POD_NAME env variable to determine CSIStorageCapacity owner")]
    NoPodName,
    /// Upstream probes for v1 and falls back to v1beta1 (Kubernetes before 1.24); we use v1
    /// only (docs/flags.md).
    #[error(
        "--enable-capacity: the API server does not serve storage.k8s.io/v1 CSIStorageCapacity (Kubernetes 1.24 or later is needed)"
    )]
    NotServed,
    #[error("unexpected error when checking for the V1 CSIStorageCapacity API: {0}")]
    ApiCheck(#[source] kube::Error),
    #[error(
        "look up owner(s) of pod: {api_version}/{kind} {name:?} in namespace {namespace:?} has no controlling owner, cannot unwind the ownership further"
    )]
    NoController {
        api_version: String,
        kind: String,
        name: String,
        namespace: String,
    },
    #[error("look up owner(s) of pod: get {kind} {name:?} in namespace {namespace:?}: {source}")]
    OwnerGet {
        kind: String,
        name: String,
        namespace: String,
        #[source]
        source: Box<kube::Error>,
    },
}

/// The capacity settings, or why the sidecar cannot publish capacity. `client` is the
/// capacity client (the API check and the owner lookup count against its limits).
pub(super) async fn capacity_settings(
    args: &CapacityArgs,
    info: &DriverInfo,
    topology: bool,
    node: Option<&NodeDeployment>,
    client: &Client,
) -> Result<CapacitySettings, CapacityStartError> {
    if !info.supports_get_capacity() {
        return Err(CapacityStartError::NoGetCapacity {
            driver: info.name.clone(),
        });
    }
    let namespace = env_value("NAMESPACE").ok_or(CapacityStartError::NoNamespace)?;
    let pod_name = env_value("POD_NAME");
    if args.capacity_ownerref_level >= 0 && pod_name.is_none() {
        return Err(CapacityStartError::NoPodName);
    }
    check_v1_served(client, &namespace).await?;
    let owner = match (u32::try_from(args.capacity_ownerref_level), pod_name) {
        (Ok(level), Some(pod)) => Some(find_owner(client, &namespace, &pod, level).await?),
        _ => None,
    };
    let segments = match node {
        Some(node) => SegmentSource::Fixed(node.segment.clone()),
        None if topology => SegmentSource::Cluster,
        None => {
            info!(
                "--enable-capacity: the driver has no topology, so one CSIStorageCapacity object per StorageClass is published, for all nodes (an empty nodeTopology selector)"
            );
            SegmentSource::Fixed(Segment::new())
        }
    };
    Ok(CapacitySettings {
        template: ObjectTemplate {
            namespace,
            driver: info.name.clone(),
            managed_by: managed_by(node.map(|node| node.name.as_str())),
            owner,
        },
        segments,
        poll_interval: args.capacity_poll_interval,
        threads: usize::try_from(args.capacity_threads).unwrap_or(usize::MAX),
        immediate_binding: args.capacity_for_immediate_binding,
    })
}

fn env_value(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|value| !value.is_empty())
}

/// Whether the API server serves CSIStorageCapacity in storage.k8s.io/v1: a list of at most
/// one object in `namespace` (a request the controller's watch needs granted anyway).
async fn check_v1_served(client: &Client, namespace: &str) -> Result<(), CapacityStartError> {
    let api = Api::<CSIStorageCapacity>::namespaced(client.clone(), namespace);
    match api.list_metadata(&ListParams::default().limit(1)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Err(CapacityStartError::NotServed),
        Err(error) => Err(CapacityStartError::ApiCheck(error)),
    }
}

/// `--capacity-ownerref-level`: 0 the Pod itself, 1 its controller (as referenced, without a
/// GET), 2 and more the controller's controller, read up the chain.
async fn find_owner(
    client: &Client,
    namespace: &str,
    pod: &str,
    level: u32,
) -> Result<OwnerReference, CapacityStartError> {
    let pod = Api::<Pod>::namespaced(client.clone(), namespace)
        .get(pod)
        .await
        .map_err(|source| CapacityStartError::OwnerGet {
            kind: "Pod".to_owned(),
            name: pod.to_owned(),
            namespace: namespace.to_owned(),
            source: Box::new(source),
        })?;
    let mut current = OwnerReference {
        api_version: <Pod as k8s_openapi::Resource>::API_VERSION.to_owned(),
        kind: <Pod as k8s_openapi::Resource>::KIND.to_owned(),
        name: pod.name_any(),
        uid: pod.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: None,
    };
    let mut references = pod.owner_references().to_vec();
    for step in 0..level {
        let controller = controller_of(&references, &current, namespace)?;
        if step + 1 < level {
            references = get_owner_references(client, namespace, &controller).await?;
        }
        current = OwnerReference {
            block_owner_deletion: None,
            controller: Some(true),
            ..controller
        };
    }
    Ok(current)
}

fn controller_of(
    references: &[OwnerReference],
    object: &OwnerReference,
    namespace: &str,
) -> Result<OwnerReference, CapacityStartError> {
    references
        .iter()
        .find(|reference| reference.controller == Some(true))
        .cloned()
        .ok_or_else(|| CapacityStartError::NoController {
            api_version: object.api_version.clone(),
            kind: object.kind.clone(),
            name: object.name.clone(),
            namespace: namespace.to_owned(),
        })
}

/// The owner references of the object `reference` names, read with discovery of its kind.
async fn get_owner_references(
    client: &Client,
    namespace: &str,
    reference: &OwnerReference,
) -> Result<Vec<OwnerReference>, CapacityStartError> {
    let get_error = |source| CapacityStartError::OwnerGet {
        kind: reference.kind.clone(),
        name: reference.name.clone(),
        namespace: namespace.to_owned(),
        source: Box::new(source),
    };
    let (group, version) = match reference.api_version.split_once('/') {
        Some((group, version)) => (group, version),
        None => ("", reference.api_version.as_str()),
    };
    let gvk = GroupVersionKind::gvk(group, version, &reference.kind);
    let (resource, _) = kube::discovery::pinned_kind(client, &gvk)
        .await
        .map_err(get_error)?;
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource);
    let object = api.get(&reference.name).await.map_err(get_error)?;
    Ok(object.owner_references().to_vec())
}
