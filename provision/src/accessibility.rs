//! Where the driver may and should create a volume: the `accessibility_requirements` of a
//! CreateVolume request, computed as upstream v6.3 does from the claim's selected node, the
//! class's allowedTopologies, the topology keys drivers registered in CSINodes and the Node
//! labels. The executor reads the caches behind [`ClusterTopology`]; nothing here does IO.
//!
//! Upstream keeps a per-claim cache so a retry sends the same request even after the Node or
//! CSINode changed; the sidecar replays the request recorded in its journal instead, so this
//! module always computes from what the caller's caches hold now.
//!
//! Beyond upstream, a result the CSI spec forbids (a key or value outside the spec's grammar,
//! two keys differing only in case, a segment map over the spec's 4 KiB map limit) is an error
//! rather than a request the driver may reject or misread.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::api::core::v1::TopologySelectorTerm;

use crate::csi;

use super::validation::dns1123_subdomain_problem;

/// What the claim reconciler knows about the cluster, read from its Node and CSINode caches.
pub trait ClusterTopology {
    /// Topology keys our driver registered in the CSINode named `node`: `None` when no CSINode
    /// has that name; `Some(vec![])` when it exists without keys for our driver.
    fn csinode_keys(&self, node: &str) -> Option<Vec<String>>;
    /// The keys of some CSINode whose entry for our driver has at least one key (upstream picks
    /// one at random; implementations return the first by name, which is deterministic),
    /// `None` if none has.
    fn any_csinode_keys(&self) -> Option<Vec<String>>;
    /// Labels of the Node named `node`, `None` when there is no such Node.
    fn node_labels(&self, node: &str) -> Option<BTreeMap<String, String>>;
    /// For every Node carrying every key of `keys`, the values of those keys (one map per
    /// Node, only the given keys).
    fn node_segments(&self, keys: &[String]) -> Vec<BTreeMap<String, String>>;
}

/// The inputs from the claim, its class and the flags.
pub struct TopologyInputs<'a> {
    pub claim_name: &'a str,
    /// `volume.kubernetes.io/selected-node` (GA key, else alpha), non-empty.
    pub selected_node: Option<&'a str>,
    pub allowed_topologies: &'a [TopologySelectorTerm],
    /// --strict-topology
    pub strict: bool,
    /// --immediate-topology
    pub immediate: bool,
}

/// One place a volume may be accessible from: key/value pairs that must all hold, kept sorted
/// by key, then value (subset and order below rely on it).
///
/// Pairs are a list, not a map, because upstream keeps a repeated key (possible only with
/// input the API server refuses) until the conversion to a CSI segment map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopologyTerm(Vec<(String, String)>);

impl TopologyTerm {
    fn new(mut pairs: Vec<(String, String)>) -> Self {
        pairs.sort();
        Self(pairs)
    }

    /// Every pair of `self` is in `other`, walking both sorted lists once as upstream does (so
    /// a repeated key in `other` with a different value first answers false). The empty term
    /// is a subset of everything.
    fn is_subset_of(&self, other: &TopologyTerm) -> bool {
        let mut wanted = self.0.iter().peekable();
        for (key, value) in &other.0 {
            let Some((wanted_key, wanted_value)) = wanted.peek() else {
                return true;
            };
            if wanted_key != key {
                continue;
            }
            if wanted_value != value {
                return false;
            }
            wanted.next();
        }
        wanted.peek().is_none()
    }

    fn to_csi(&self) -> csi::Topology {
        csi::Topology {
            // A repeated key keeps its last (largest) value, as upstream's map assignment does.
            segments: self.0.iter().cloned().collect(),
        }
    }
}

/// Upstream's term order: fewer pairs first, then pair by pair, key before value, byte order.
impl Ord for TopologyTerm {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0
            .len()
            .cmp(&other.0.len())
            .then_with(|| self.0.cmp(&other.0))
    }
}

impl PartialOrd for TopologyTerm {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Go's `%v` of upstream's term: `[{rack 1} {zone a}]`.
impl fmt::Display for TopologyTerm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pairs: Vec<String> = self.0.iter().map(|(k, v)| format!("{{{k} {v}}}")).collect();
        write!(f, "[{}]", pairs.join(" "))
    }
}

/// Upstream prefixes every error but the reschedule with this when it reports it.
const GENERATION_PREFIX: &str = "error generating accessibility requirements: ";

/// The spec's general limit for a `map<string, string>` (the Topology message sets none of
/// its own).
const CSI_MAP_LIMIT_BYTES: usize = 4096;

/// Why no accessibility requirement could be computed. Display is the full text the user sees
/// in the ProvisioningFailed event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    /// The selected node has no CSINode (upstream's lister NotFound): the scheduler must pick
    /// another node.
    CsiNodeNotFound { node: String },
    /// The selected node's CSINode lists no topology key for our driver (driver not or not yet
    /// registered there).
    NoTopologyKeys { node: String },
    /// The selected Node is gone (`labels` empty) or lacks one of the keys.
    NodeLabelsMismatch {
        labels: BTreeMap<String, String>,
        keys: Vec<String>,
    },
    /// `--strict-topology`: the selected node's term matches none of the allowed topologies.
    NotInAllowedTopologies {
        node: String,
        term: TopologyTerm,
        allowed: Vec<TopologyTerm>,
    },
    /// Immediate binding: no CSINode lists a topology key for our driver.
    NoAvailableTopology,
    /// No Node carries all the keys.
    KeysOnNoNode { keys: Vec<String> },
    /// The selected node's term has no subset among the allowed topologies.
    SelectedNotInRequisite {
        node: String,
        term: TopologyTerm,
        requisite: Vec<TopologyTerm>,
    },
    /// Beyond upstream: a key outside the CSI spec's grammar for topology keys.
    InvalidKey { key: String, problem: &'static str },
    /// Beyond upstream: a value outside the CSI spec's grammar (empty node labels included).
    InvalidValue { key: String, value: String },
    /// Beyond upstream: the CSI spec makes keys case-insensitive, so both may not be sent.
    KeysDifferOnlyInCase { key: String, other: String },
    /// Beyond upstream: a segment map larger than the CSI spec's map limit, counting only its
    /// keys' and values' bytes (the smallest reading of the limit).
    TermTooLarge { term: TopologyTerm, bytes: usize },
}

impl TopologyError {
    /// Whether upstream turns this error into a reschedule (state R: the selected-node
    /// annotation is removed) instead of a retry.
    pub fn reschedules(&self) -> bool {
        matches!(self, Self::CsiNodeNotFound { .. })
    }
}

impl fmt::Display for TopologyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.reschedules() {
            f.write_str(GENERATION_PREFIX)?;
        }
        // Node names are DNS subdomains, for which Rust's `{:?}` is Go's `%q`.
        match self {
            Self::CsiNodeNotFound { node } => write!(
                f,
                "failed to get selected CSINode {node}: csinode.storage.k8s.io {node:?} not found"
            ),
            Self::NoTopologyKeys { node } => write!(f, "no topology key found for node {node}"),
            Self::NodeLabelsMismatch { labels, keys } => write!(
                f,
                "topology labels from selected node {} does not match topology keys from CSINode {}",
                go_map(labels),
                go_list(keys)
            ),
            Self::NotInAllowedTopologies {
                node,
                term,
                allowed,
            } => write!(
                f,
                "selected node '{node:?}' topology '{term}' is not in allowed topologies: {}",
                go_list(allowed)
            ),
            Self::NoAvailableTopology => f.write_str("no available topology found"),
            Self::KeysOnNoNode { keys } => write!(
                f,
                "topologyKeys {} were not found on any nodes",
                go_list(keys)
            ),
            Self::SelectedNotInRequisite {
                node,
                term,
                requisite,
            } => write!(
                f,
                "topology {term} from selected node {node:?} is not in requisite: {}",
                go_list(requisite)
            ),
            Self::InvalidKey { key, problem } => write!(
                f,
                "topology key {key:?} cannot be sent to the CSI driver: the CSI spec requires \
                 {problem}"
            ),
            Self::InvalidValue { key, value } => write!(
                f,
                "topology value {value:?} of key {key:?} cannot be sent to the CSI driver: the \
                 CSI spec requires 1 to 63 characters, alphanumerics, '-', '_' or '.', beginning \
                 and ending with an alphanumeric"
            ),
            Self::KeysDifferOnlyInCase { key, other } => write!(
                f,
                "topology keys {key:?} and {other:?} cannot both be sent to the CSI driver: the \
                 CSI spec makes keys case-insensitive"
            ),
            Self::TermTooLarge { term, bytes } => write!(
                f,
                "topology {term} cannot be sent to the CSI driver: its keys and values take \
                 {bytes} bytes, the CSI spec allows {CSI_MAP_LIMIT_BYTES} for a map"
            ),
        }
    }
}

/// Go's `%v` of a `map[string]string`: `map[a:b c:d]`, keys sorted.
fn go_map(map: &BTreeMap<String, String>) -> String {
    let pairs: Vec<String> = map.iter().map(|(k, v)| format!("{k}:{v}")).collect();
    format!("map[{}]", pairs.join(" "))
}

/// Go's `%v` of a slice: `[a b]`.
fn go_list<T: fmt::Display>(items: &[T]) -> String {
    let items: Vec<String> = items.iter().map(ToString::to_string).collect();
    format!("[{}]", items.join(" "))
}

/// The selected node's keys and term.
struct SelectedNode<'a> {
    name: &'a str,
    keys: Vec<String>,
    term: TopologyTerm,
}

/// The CSI `accessibility_requirements` for a claim, or `None` when upstream sends none (no
/// selected node, no allowedTopologies and `--immediate-topology=false`; or allowedTopologies
/// that flatten to nothing). Call only when topology is supported (driver capability and
/// feature gate).
pub fn accessibility_requirements(
    inputs: &TopologyInputs<'_>,
    cluster: &impl ClusterTopology,
) -> Result<Option<csi::TopologyRequirement>, TopologyError> {
    let selected = match inputs.selected_node.filter(|node| !node.is_empty()) {
        Some(node) => Some(selected_node(node, cluster)?),
        None => None,
    };
    let mut requisite = match &selected {
        Some(node) if inputs.strict => {
            strict_check(node, inputs.allowed_topologies)?;
            vec![node.term.clone()]
        }
        _ if !inputs.allowed_topologies.is_empty() => flatten(inputs.allowed_topologies),
        None if !inputs.immediate => return Ok(None),
        Some(node) => aggregate(&node.keys, cluster)?,
        None => {
            let keys = cluster
                .any_csinode_keys()
                .filter(|keys| !keys.is_empty())
                .ok_or(TopologyError::NoAvailableTopology)?;
            aggregate(&keys, cluster)?
        }
    };
    if requisite.is_empty() {
        return Ok(None);
    }
    requisite.sort();
    requisite.dedup();

    let first = match &selected {
        None => statefulset_offset(inputs.claim_name, requisite.len()),
        Some(_) if inputs.strict => 0,
        Some(node) => requisite
            .iter()
            .position(|term| term.is_subset_of(&node.term))
            .ok_or_else(|| TopologyError::SelectedNotInRequisite {
                node: node.name.to_owned(),
                term: node.term.clone(),
                requisite: requisite.clone(),
            })?,
    };
    check_csi_rules(&requisite)?;
    let mut preferred = requisite.clone();
    preferred.rotate_left(first);
    Ok(Some(csi::TopologyRequirement {
        requisite: to_csi(&requisite),
        preferred: to_csi(&preferred),
    }))
}

/// Empty terms are left out, as upstream does: a segment map without pairs says nothing. (No
/// path above makes one: every term has a pair per key or per allowed expression.)
fn to_csi(terms: &[TopologyTerm]) -> Vec<csi::Topology> {
    terms
        .iter()
        .filter(|term| !term.0.is_empty())
        .map(TopologyTerm::to_csi)
        .collect()
}

fn selected_node<'a>(
    name: &'a str,
    cluster: &impl ClusterTopology,
) -> Result<SelectedNode<'a>, TopologyError> {
    let keys = cluster
        .csinode_keys(name)
        .ok_or_else(|| TopologyError::CsiNodeNotFound {
            node: name.to_owned(),
        })?;
    if keys.is_empty() {
        return Err(TopologyError::NoTopologyKeys {
            node: name.to_owned(),
        });
    }
    let labels = cluster.node_labels(name).unwrap_or_default();
    let Some(term) = term_for_keys(&keys, &labels) else {
        return Err(TopologyError::NodeLabelsMismatch { labels, keys });
    };
    Ok(SelectedNode { name, keys, term })
}

/// The term of `keys` read from `labels` (one pair per key, a repeated key repeated), `None`
/// if a key is missing.
fn term_for_keys(keys: &[String], labels: &BTreeMap<String, String>) -> Option<TopologyTerm> {
    keys.iter()
        .map(|key| Some((key.clone(), labels.get(key)?.clone())))
        .collect::<Option<Vec<_>>>()
        .map(TopologyTerm::new)
}

/// `--strict-topology` with allowedTopologies: one allowed term must match the node's.
fn strict_check(
    node: &SelectedNode<'_>,
    allowed_topologies: &[TopologySelectorTerm],
) -> Result<(), TopologyError> {
    if allowed_topologies.is_empty() {
        return Ok(());
    }
    let allowed = flatten(allowed_topologies);
    if allowed.iter().any(|term| term.is_subset_of(&node.term)) {
        return Ok(());
    }
    Err(TopologyError::NotInAllowedTopologies {
        node: node.name.to_owned(),
        term: node.term.clone(),
        allowed,
    })
}

/// One term per Node carrying every key.
fn aggregate(
    keys: &[String],
    cluster: &impl ClusterTopology,
) -> Result<Vec<TopologyTerm>, TopologyError> {
    let terms: Vec<TopologyTerm> = cluster
        .node_segments(keys)
        .iter()
        .filter_map(|segments| term_for_keys(keys, segments))
        .collect();
    if terms.is_empty() {
        return Err(TopologyError::KeysOnNoNode {
            keys: keys.to_vec(),
        });
    }
    Ok(terms)
}

/// allowedTopologies as a list of terms: each selector term gives the cross product of its
/// expressions' values, in upstream's order. An expression without values empties the product
/// built so far, and the next expression starts a new one (upstream's behaviour; the API server
/// refuses such expressions).
fn flatten(allowed_topologies: &[TopologySelectorTerm]) -> Vec<TopologyTerm> {
    let mut flat = Vec::new();
    for selector in allowed_topologies {
        let mut product: Vec<Vec<(String, String)>> = Vec::new();
        for expression in selector.match_label_expressions.iter().flatten() {
            let mut next = Vec::new();
            for value in &expression.values {
                let pair = (expression.key.clone(), value.clone());
                if product.is_empty() {
                    next.push(vec![pair]);
                } else {
                    next.extend(product.iter().map(|partial| {
                        let mut extended = partial.clone();
                        extended.push(pair.clone());
                        extended
                    }));
                }
            }
            product = next;
        }
        flat.extend(product.into_iter().map(TopologyTerm::new));
    }
    flat
}

/// Where preferred starts without a selected node, spreading a StatefulSet's claims
/// (`<claim>-<set>-<ordinal>`) over the terms: the ordinal plus the FNV-1 hash of the set's
/// name (the in-tree heuristic). Upstream hashes a random number for an empty name; the API
/// server never gives one, and the empty name's hash keeps this function pure.
fn statefulset_offset(claim_name: &str, terms: usize) -> usize {
    let (hashed, ordinal) = match claim_name.rsplit_once('-') {
        Some((base, suffix)) => match go_parse_u32(suffix) {
            Some(ordinal) => (base.rsplit_once('-').map_or(base, |(_, set)| set), ordinal),
            None => (claim_name, 0),
        },
        None => (claim_name, 0),
    };
    fnv1_32(hashed.as_bytes()).wrapping_add(ordinal) as usize % terms
}

/// Go's `strconv.ParseUint(s, 10, 32)`: decimal digits only (no sign), at most `u32::MAX`.
fn go_parse_u32(text: &str) -> Option<u32> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// FNV-1 (multiply, then xor; not FNV-1a), 32 bits.
fn fnv1_32(bytes: &[u8]) -> u32 {
    const OFFSET_BASIS: u32 = 2_166_136_261;
    const PRIME: u32 = 16_777_619;
    bytes.iter().fold(OFFSET_BASIS, |hash, byte| {
        hash.wrapping_mul(PRIME) ^ u32::from(*byte)
    })
}

/// The CSI spec's rules for Topology segments (csi.proto, message Topology, and the general
/// size limits), checked on every term sent (preferred holds the same terms).
fn check_csi_rules(terms: &[TopologyTerm]) -> Result<(), TopologyError> {
    let mut keys = BTreeSet::new();
    for term in terms {
        let mut bytes = 0;
        for (key, value) in &term.0 {
            if let Some(problem) = csi_key_problem(key) {
                return Err(TopologyError::InvalidKey {
                    key: key.clone(),
                    problem,
                });
            }
            if !is_csi_word(value) {
                return Err(TopologyError::InvalidValue {
                    key: key.clone(),
                    value: value.clone(),
                });
            }
            keys.insert(key.as_str());
            bytes += key.len() + value.len();
        }
        if bytes > CSI_MAP_LIMIT_BYTES {
            return Err(TopologyError::TermTooLarge {
                term: term.clone(),
                bytes,
            });
        }
    }
    let mut lowered: BTreeMap<String, &str> = BTreeMap::new();
    for key in keys {
        if let Some(other) = lowered.insert(key.to_lowercase(), key) {
            return Err(TopologyError::KeysDifferOnlyInCase {
                key: other.to_owned(),
                other: key.to_owned(),
            });
        }
    }
    Ok(())
}

/// A CSI topology key: an optional prefix of at most 63 characters in DNS notation (lower
/// case), a `/`, and a name as [`is_csi_word`].
fn csi_key_problem(key: &str) -> Option<&'static str> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        if prefix.len() > 63 {
            return Some("a key prefix of at most 63 characters");
        }
        if dns1123_subdomain_problem(prefix).is_some() {
            return Some(
                "a key prefix in DNS notation: lower case alphanumerics, '-' or '.', beginning \
                 and ending with an alphanumeric",
            );
        }
    }
    if !is_csi_word(name) {
        return Some(
            "a key name of 1 to 63 characters, alphanumerics, '-', '_' or '.', beginning and \
             ending with an alphanumeric",
        );
    }
    None
}

/// 1 to 63 characters, `[A-Za-z0-9]` at both ends and `[-_.A-Za-z0-9]` between: the CSI
/// spec's grammar for key names and values.
fn is_csi_word(text: &str) -> bool {
    let bytes = text.as_bytes();
    let inner = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.');
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            bytes.len() <= 63
                && first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && bytes.iter().all(inner)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests;
