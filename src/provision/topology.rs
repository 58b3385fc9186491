//! TEMPORARY stand-in until the topology module lands (same API).
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::TopologySelectorTerm;

use crate::csi;

pub trait ClusterTopology {
    fn csinode_keys(&self, node: &str) -> Option<Vec<String>>;
    fn any_csinode_keys(&self) -> Option<Vec<String>>;
    fn node_labels(&self, node: &str) -> Option<BTreeMap<String, String>>;
    fn node_segments(&self, keys: &[String]) -> Vec<BTreeMap<String, String>>;
}

pub struct TopologyInputs<'a> {
    pub claim_name: &'a str,
    pub selected_node: Option<&'a str>,
    pub allowed_topologies: &'a [TopologySelectorTerm],
    pub strict: bool,
    pub immediate: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    #[error("failed to get selected CSINode {0}")]
    CsiNodeNotFound(String),
}

impl TopologyError {
    pub fn reschedules(&self) -> bool {
        matches!(self, Self::CsiNodeNotFound(_))
    }
}

pub fn accessibility_requirements(
    _inputs: &TopologyInputs<'_>,
    _cluster: &impl ClusterTopology,
) -> Result<Option<csi::TopologyRequirement>, TopologyError> {
    Ok(None)
}
