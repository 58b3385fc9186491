//! `--node-deployment` at start: which node this sidecar serves (env `NODE_NAME`), where its
//! driver says the node is (NodeGetInfo), and that the cluster has such a Node.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client};
use tracing::{info, warn};

use super::error::AppError;
use crate::config::NodeDeploymentArgs;
use crate::controller::NodeDeployment;
use crate::csi_client::CsiClient;

/// The node of a node-mode sidecar; `None` without `--node-deployment`. NodeGetInfo is bounded
/// by `--timeout`, like every driver call.
pub(super) async fn node_deployment(
    args: &NodeDeploymentArgs,
    driver: &CsiClient,
    client: &Client,
) -> Result<Option<NodeDeployment>, AppError> {
    let Some(name) = args
        .node_name(std::env::var("NODE_NAME").ok())
        .map_err(AppError::NodeName)?
    else {
        return Ok(None);
    };
    let reply = driver.node_get_info().await.map_err(AppError::NodeInfo)?;
    let segment: BTreeMap<String, String> = reply
        .accessible_topology
        .map(|topology| topology.segments.into_iter().collect())
        .unwrap_or_default();
    check_node_exists(client, &name).await?;
    info!(
        node = name,
        node_id = reply.node_id,
        ?segment,
        "node deployment: serving this node only"
    );
    Ok(Some(NodeDeployment {
        name,
        segment,
        immediate_binding: args.node_deployment_immediate_binding,
        base_delay: args.node_deployment_base_delay,
        max_delay: args.node_deployment_max_delay,
    }))
}

/// A NODE_NAME that names no Node is a deployment mistake: stop with a message naming it.
/// Without the right to read Nodes (RBAC of an older release), or if the API server cannot
/// be asked now, say so and go on.
async fn check_node_exists(client: &Client, name: &str) -> Result<(), AppError> {
    match Api::<Node>::all(client.clone()).get_metadata(name).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Err(AppError::NodeNotFound {
            node: name.to_owned(),
        }),
        Err(error) => {
            warn!(node = name, %error, "cannot check that NODE_NAME names a Node (grant get on nodes); going on");
            Ok(())
        }
    }
}
