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
mod tests {
    use k8s_openapi::api::core::v1::TopologySelectorLabelRequirement;

    use super::super::fixtures::Cluster;
    use super::*;

    const ZONE: &str = "topology.example/zone";
    const RACK: &str = "topology.example/rack";

    fn inputs<'a>(
        claim_name: &'a str,
        selected_node: Option<&'a str>,
        allowed_topologies: &'a [TopologySelectorTerm],
    ) -> TopologyInputs<'a> {
        TopologyInputs {
            claim_name,
            selected_node,
            allowed_topologies,
            strict: false,
            immediate: true,
        }
    }

    /// A selector term: one expression per `(key, values)`.
    fn selector(expressions: &[(&str, &[&str])]) -> TopologySelectorTerm {
        TopologySelectorTerm {
            match_label_expressions: Some(
                expressions
                    .iter()
                    .map(|(key, values)| TopologySelectorLabelRequirement {
                        key: (*key).to_owned(),
                        values: values.iter().map(|value| (*value).to_owned()).collect(),
                    })
                    .collect(),
            ),
        }
    }

    fn term(pairs: &[(&str, &str)]) -> TopologyTerm {
        TopologyTerm::new(
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        )
    }

    fn topologies(terms: &[&[(&str, &str)]]) -> Vec<csi::Topology> {
        terms.iter().map(|pairs| term(pairs).to_csi()).collect()
    }

    fn requirement(
        inputs: &TopologyInputs<'_>,
        cluster: &Cluster,
    ) -> (Vec<csi::Topology>, Vec<csi::Topology>) {
        match accessibility_requirements(inputs, cluster) {
            Ok(Some(requirement)) => (requirement.requisite, requirement.preferred),
            other => panic!("expected a requirement, got {other:?}"),
        }
    }

    fn error(inputs: &TopologyInputs<'_>, cluster: &Cluster) -> TopologyError {
        match accessibility_requirements(inputs, cluster) {
            Err(error) => error,
            Ok(other) => panic!("expected an error, got {other:?}"),
        }
    }

    /// §1.5a's worked example: n1 {zone a, rack 1}, n2 {zone a, rack 2}, n3 {zone b, rack 1}.
    fn three_racks() -> Cluster {
        Cluster::new()
            .member("n1", &[ZONE, RACK], &[(ZONE, "a"), (RACK, "1")])
            .member("n2", &[ZONE, RACK], &[(ZONE, "a"), (RACK, "2")])
            .member("n3", &[ZONE, RACK], &[(ZONE, "b"), (RACK, "1")])
    }

    /// Three zones z1..z3, one node each.
    fn three_zones() -> Cluster {
        Cluster::new()
            .member("n1", &[ZONE], &[(ZONE, "z1")])
            .member("n2", &[ZONE], &[(ZONE, "z2")])
            .member("n3", &[ZONE], &[(ZONE, "z3")])
    }

    #[test]
    fn delayed_binding_aggregates_all_nodes_and_prefers_the_selected_one() {
        let (requisite, preferred) = requirement(&inputs("data", Some("n2"), &[]), &three_racks());
        let sorted: [&[(&str, &str)]; 3] = [
            &[(RACK, "1"), (ZONE, "a")],
            &[(RACK, "1"), (ZONE, "b")],
            &[(RACK, "2"), (ZONE, "a")],
        ];
        assert_eq!(requisite, topologies(&sorted));
        assert_eq!(
            preferred,
            topologies(&[sorted[2], sorted[0], sorted[1]]),
            "the selected node's term first, then the rest in sorted order"
        );
    }

    #[test]
    fn delayed_aggregation_includes_nodes_where_the_driver_is_not_registered() {
        let cluster = three_zones().node("n4", &[(ZONE, "z4")]);
        let (requisite, preferred) = requirement(&inputs("data", Some("n1"), &[]), &cluster);
        assert_eq!(
            requisite,
            topologies(&[
                &[(ZONE, "z1")],
                &[(ZONE, "z2")],
                &[(ZONE, "z3")],
                &[(ZONE, "z4")]
            ])
        );
        assert_eq!(preferred[0], term(&[(ZONE, "z1")]).to_csi());
    }

    #[test]
    fn fnv1_is_not_fnv1a() {
        assert_eq!(fnv1_32(b"web"), 1_181_096_325);
        assert_eq!(fnv1_32(b""), 2_166_136_261);
        // FNV-1a (xor, then multiply) would give 265927825.
    }

    #[test]
    fn statefulset_claims_rotate_by_ordinal_from_the_set_name_hash() {
        // (1181096325 + 2) mod 3 = 2.
        assert_eq!(statefulset_offset("data-web-2", 3), 2);
        assert_eq!(
            statefulset_offset("web-2", 3),
            2,
            "`web-2` hashes `web` too"
        );
        assert_eq!(
            statefulset_offset("logs-web-2", 3),
            2,
            "claims of one pod agree"
        );
        for ordinal in 0..6u32 {
            let expected = (1_181_096_325 + ordinal as usize) % 3;
            assert_eq!(
                statefulset_offset(&format!("data-web-{ordinal}"), 3),
                expected
            );
        }
        assert_eq!(
            statefulset_offset("mydisk", 7),
            fnv1_32(b"mydisk") as usize % 7
        );
        // Leading zeros parse; a sign, a non-digit or a number over u32 do not, and then the
        // whole name is hashed with ordinal 0.
        assert_eq!(statefulset_offset("data-web-002", 3), 2);
        for whole in [
            "data-web-+2",
            "data-web-2a",
            "data-web-",
            "data-web-4294967296",
        ] {
            assert_eq!(
                statefulset_offset(whole, 5),
                fnv1_32(whole.as_bytes()) as usize % 5,
                "{whole}"
            );
        }
        // The sum wraps at 32 bits.
        let wrapped = fnv1_32(b"web").wrapping_add(u32::MAX) as usize % 7;
        assert_eq!(statefulset_offset("d-web-4294967295", 7), wrapped);
    }

    #[test]
    fn immediate_binding_rotates_the_sorted_terms_per_statefulset_ordinal() {
        let cluster = three_zones();
        let (requisite, preferred) = requirement(&inputs("data-web-2", None, &[]), &cluster);
        let zones = topologies(&[&[(ZONE, "z1")], &[(ZONE, "z2")], &[(ZONE, "z3")]]);
        assert_eq!(requisite, zones);
        assert_eq!(
            preferred,
            vec![zones[2].clone(), zones[0].clone(), zones[1].clone()]
        );
        let (_, preferred) = requirement(&inputs("data-web-0", None, &[]), &cluster);
        assert_eq!(preferred, zones, "(1181096325 + 0) mod 3 = 0");
    }

    #[test]
    fn immediate_topology_off_sends_nothing_without_node_or_allowed_topologies() {
        let mut immediate_off = inputs("data", None, &[]);
        immediate_off.immediate = false;
        assert_eq!(
            accessibility_requirements(&immediate_off, &three_zones()),
            Ok(None)
        );
        // allowedTopologies are still sent.
        let allowed = [selector(&[(ZONE, &["z2"])])];
        immediate_off.allowed_topologies = &allowed;
        let (requisite, preferred) = requirement(&immediate_off, &three_zones());
        assert_eq!(requisite, topologies(&[&[(ZONE, "z2")]]));
        assert_eq!(preferred, requisite);
        // A selected node is always aggregated.
        let mut delayed = inputs("data", Some("n1"), &[]);
        delayed.immediate = false;
        assert!(matches!(
            accessibility_requirements(&delayed, &three_zones()),
            Ok(Some(_))
        ));
    }

    #[test]
    fn an_empty_selected_node_is_no_selected_node() {
        let mut empty = inputs("data", Some(""), &[]);
        empty.immediate = false;
        assert_eq!(accessibility_requirements(&empty, &three_zones()), Ok(None));
    }

    #[test]
    fn allowed_topologies_flatten_to_the_cross_product_of_each_selector_term() {
        let allowed = [
            selector(&[(ZONE, &["z1", "z2"]), (RACK, &["rA", "rB"])]),
            selector(&[(ZONE, &["z3"])]),
        ];
        assert_eq!(
            flatten(&allowed),
            vec![
                term(&[(ZONE, "z1"), (RACK, "rA")]),
                term(&[(ZONE, "z2"), (RACK, "rA")]),
                term(&[(ZONE, "z1"), (RACK, "rB")]),
                term(&[(ZONE, "z2"), (RACK, "rB")]),
                term(&[(ZONE, "z3")]),
            ]
        );
        // Sorted: fewer pairs first, then by key (rack < zone), then value.
        let (requisite, _) = requirement(&inputs("data", None, &allowed), &Cluster::new());
        assert_eq!(
            requisite,
            topologies(&[
                &[(ZONE, "z3")],
                &[(RACK, "rA"), (ZONE, "z1")],
                &[(RACK, "rA"), (ZONE, "z2")],
                &[(RACK, "rB"), (ZONE, "z1")],
                &[(RACK, "rB"), (ZONE, "z2")],
            ])
        );
    }

    #[test]
    fn allowed_topologies_are_not_intersected_with_nodes() {
        let allowed = [selector(&[(ZONE, &["z1", "z9"])])];
        let (requisite, preferred) =
            requirement(&inputs("data", Some("n1"), &allowed), &three_zones());
        assert_eq!(requisite, topologies(&[&[(ZONE, "z1")], &[(ZONE, "z9")]]));
        assert_eq!(preferred, requisite);
    }

    #[test]
    fn an_expression_without_values_empties_the_product_so_far() {
        // Last: the selector term gives nothing.
        assert_eq!(
            flatten(&[selector(&[(ZONE, &["z1"]), (RACK, &[])])]),
            vec![]
        );
        // First: the next expression starts again (upstream's behaviour).
        assert_eq!(
            flatten(&[selector(&[(ZONE, &[]), (RACK, &["r1"])])]),
            vec![term(&[(RACK, "r1")])]
        );
        // Selector terms without expressions give nothing either.
        let nothing = [
            TopologySelectorTerm::default(),
            selector(&[]),
            selector(&[(ZONE, &[])]),
        ];
        assert_eq!(
            accessibility_requirements(&inputs("data", None, &nothing), &three_zones()),
            Ok(None),
            "allowedTopologies that flatten to nothing: no requirement"
        );
        assert_eq!(
            accessibility_requirements(&inputs("data", Some("n1"), &nothing), &three_zones()),
            Ok(None),
            "even with a selected node"
        );
    }

    #[test]
    fn requisite_is_sorted_and_adjacent_duplicates_dropped() {
        let allowed = [
            selector(&[(ZONE, &["z2", "z1"])]),
            selector(&[(ZONE, &["z1"])]),
            selector(&[(ZONE, &["z1"]), (RACK, &["r1"])]),
        ];
        let (requisite, _) = requirement(&inputs("data", None, &allowed), &Cluster::new());
        assert_eq!(
            requisite,
            topologies(&[
                &[(ZONE, "z1")],
                &[(ZONE, "z2")],
                &[(RACK, "r1"), (ZONE, "z1")]
            ])
        );
    }

    #[test]
    fn term_order_is_length_then_key_then_value_in_byte_order() {
        let mut terms = vec![
            term(&[("b", "1"), ("a", "2")]),
            term(&[("b", "0")]),
            term(&[("a", "2"), ("b", "0")]),
            term(&[("a", "Z")]),
            term(&[("a", "a")]),
            term(&[("B", "9")]),
        ];
        terms.sort();
        assert_eq!(
            terms,
            vec![
                term(&[("B", "9")]),
                term(&[("a", "Z")]),
                term(&[("a", "a")]),
                term(&[("b", "0")]),
                term(&[("a", "2"), ("b", "0")]),
                term(&[("a", "2"), ("b", "1")]),
            ]
        );
    }

    #[test]
    fn subset_is_every_pair_present_with_the_same_value() {
        let node = term(&[(RACK, "1"), (ZONE, "a")]);
        assert!(term(&[]).is_subset_of(&node));
        assert!(term(&[]).is_subset_of(&term(&[])));
        assert!(term(&[(ZONE, "a")]).is_subset_of(&node));
        assert!(term(&[(RACK, "1")]).is_subset_of(&node));
        assert!(node.is_subset_of(&node));
        assert!(!term(&[(ZONE, "b")]).is_subset_of(&node));
        assert!(!term(&[("other", "a")]).is_subset_of(&node));
        assert!(!term(&[(RACK, "1"), ("x", "1"), (ZONE, "a")]).is_subset_of(&node));
        assert!(!node.is_subset_of(&term(&[(ZONE, "a")])));
    }

    #[test]
    fn allowed_zones_match_a_node_term_with_more_keys() {
        let allowed = [selector(&[(ZONE, &["a", "b"])])];
        let (requisite, preferred) =
            requirement(&inputs("data", Some("n3"), &allowed), &three_racks());
        assert_eq!(requisite, topologies(&[&[(ZONE, "a")], &[(ZONE, "b")]]));
        assert_eq!(preferred, topologies(&[&[(ZONE, "b")], &[(ZONE, "a")]]));
    }

    #[test]
    fn strict_topology_sends_only_the_selected_nodes_term() {
        let mut strict = inputs("data", Some("n2"), &[]);
        strict.strict = true;
        let only = topologies(&[&[(RACK, "2"), (ZONE, "a")]]);
        assert_eq!(
            requirement(&strict, &three_racks()),
            (only.clone(), only.clone())
        );

        let allowed = [selector(&[(ZONE, &["a"])])];
        strict.allowed_topologies = &allowed;
        assert_eq!(requirement(&strict, &three_racks()), (only.clone(), only));
    }

    #[test]
    fn strict_topology_refuses_a_node_outside_the_allowed_topologies() {
        let allowed = [
            selector(&[(ZONE, &["b"])]),
            selector(&[(ZONE, &["a"]), (RACK, &["1"])]),
        ];
        let mut strict = inputs("data", Some("n2"), &allowed);
        strict.strict = true;
        let error = error(&strict, &three_racks());
        assert_eq!(
            error.to_string(),
            "error generating accessibility requirements: selected node '\"n2\"' topology \
             '[{topology.example/rack 2} {topology.example/zone a}]' is not in allowed \
             topologies: [[{topology.example/zone b}] [{topology.example/rack 1} \
             {topology.example/zone a}]]"
        );
        assert!(!error.reschedules());

        // Nothing allowed at all (an expression without values) is refused too.
        let nothing = [selector(&[(ZONE, &[])])];
        strict.allowed_topologies = &nothing;
        assert_eq!(
            error_text(&strict, &three_racks()),
            "error generating accessibility requirements: selected node '\"n2\"' topology \
             '[{topology.example/rack 2} {topology.example/zone a}]' is not in allowed \
             topologies: []"
        );
    }

    fn error_text(inputs: &TopologyInputs<'_>, cluster: &Cluster) -> String {
        error(inputs, cluster).to_string()
    }

    #[test]
    fn a_selected_node_without_csinode_reschedules() {
        let cluster = three_zones().node("gone", &[(ZONE, "z1")]);
        let error = error(&inputs("data", Some("gone"), &[]), &cluster);
        assert_eq!(
            error,
            TopologyError::CsiNodeNotFound {
                node: "gone".to_owned()
            }
        );
        assert!(error.reschedules());
        assert_eq!(
            error.to_string(),
            "failed to get selected CSINode gone: csinode.storage.k8s.io \"gone\" not found"
        );
    }

    #[test]
    fn a_selected_node_without_keys_is_retried() {
        let cluster = three_zones()
            .csinode("bare", &[])
            .node("bare", &[(ZONE, "z1")]);
        let error = error(&inputs("data", Some("bare"), &[]), &cluster);
        assert!(!error.reschedules());
        assert_eq!(
            error.to_string(),
            "error generating accessibility requirements: no topology key found for node bare"
        );
    }

    #[test]
    fn a_selected_node_gone_or_lacking_a_key_is_retried_with_its_labels() {
        let cluster = Cluster::new().csinode("n1", &[ZONE, RACK]);
        let error = error(&inputs("data", Some("n1"), &[]), &cluster);
        assert!(!error.reschedules());
        assert_eq!(
            error.to_string(),
            "error generating accessibility requirements: topology labels from selected node \
             map[] does not match topology keys from CSINode [topology.example/zone \
             topology.example/rack]"
        );

        let cluster = cluster.node("n1", &[(ZONE, "a"), ("kubernetes.io/hostname", "n1")]);
        assert_eq!(
            error_text(&inputs("data", Some("n1"), &[]), &cluster),
            "error generating accessibility requirements: topology labels from selected node \
             map[kubernetes.io/hostname:n1 topology.example/zone:a] does not match topology \
             keys from CSINode [topology.example/zone topology.example/rack]"
        );
    }

    #[test]
    fn immediate_binding_needs_a_csinode_with_keys() {
        let cluster = Cluster::new()
            .node("n1", &[(ZONE, "z1")])
            .csinode("n1", &[]);
        let error = error(&inputs("data", None, &[]), &cluster);
        assert_eq!(error, TopologyError::NoAvailableTopology);
        assert_eq!(
            error.to_string(),
            "error generating accessibility requirements: no available topology found"
        );
        assert_eq!(
            error_text(&inputs("data", None, &[]), &Cluster::new()),
            "error generating accessibility requirements: no available topology found"
        );
    }

    #[test]
    fn keys_found_on_no_node_are_an_error() {
        let cluster = Cluster::new()
            .csinode("n1", &[ZONE, RACK])
            .node("n1", &[(ZONE, "z1")]);
        let expected = "error generating accessibility requirements: topologyKeys \
                        [topology.example/zone topology.example/rack] were not found on any \
                        nodes";
        assert_eq!(error_text(&inputs("data", None, &[]), &cluster), expected);

        // With a selected node that has the keys, its own Node always matches; without it...
        let cluster = cluster.node("n1", &[(ZONE, "z1"), (RACK, "r1")]);
        assert!(accessibility_requirements(&inputs("data", Some("n1"), &[]), &cluster).is_ok());
    }

    #[test]
    fn a_selected_node_outside_the_allowed_topologies_is_an_error() {
        let allowed = [selector(&[(ZONE, &["b"])])];
        let error = error(&inputs("data", Some("n2"), &allowed), &three_racks());
        assert!(!error.reschedules());
        assert_eq!(
            error.to_string(),
            "error generating accessibility requirements: topology [{topology.example/rack 2} \
             {topology.example/zone a}] from selected node \"n2\" is not in requisite: \
             [[{topology.example/zone b}]]"
        );
    }

    #[test]
    fn go_formatting_of_maps_and_lists() {
        let mut map = BTreeMap::new();
        assert_eq!(go_map(&map), "map[]");
        map.insert("b".to_owned(), "2".to_owned());
        map.insert("a".to_owned(), "1".to_owned());
        assert_eq!(go_map(&map), "map[a:1 b:2]");
        assert_eq!(go_list::<String>(&[]), "[]");
        assert_eq!(go_list(&["k1".to_owned(), "k2".to_owned()]), "[k1 k2]");
        assert_eq!(term(&[]).to_string(), "[]");
        assert_eq!(term(&[("z", "1"), ("a", "2")]).to_string(), "[{a 2} {z 1}]");
    }

    #[test]
    fn a_repeated_key_keeps_its_largest_value_in_the_segment_map() {
        let allowed = [selector(&[(ZONE, &["z2"]), (ZONE, &["z1"])])];
        let (requisite, _) = requirement(&inputs("data", None, &allowed), &Cluster::new());
        assert_eq!(requisite, topologies(&[&[(ZONE, "z2")]]));
    }

    #[test]
    fn keys_outside_the_csi_grammar_are_refused() {
        let long_prefix = format!("{}/zone", "a".repeat(64));
        let cases = [
            (
                long_prefix.as_str(),
                "a key prefix of at most 63 characters",
            ),
            ("Example.com/zone", "a key prefix in DNS notation"),
            ("/zone", "a key prefix in DNS notation"),
            ("example.com/", "a key name of 1 to 63 characters"),
            ("my zone", "a key name of 1 to 63 characters"),
            ("a/b/c", "a key name of 1 to 63 characters"),
        ];
        for (key, problem) in cases {
            let allowed = [selector(&[(key, &["z1"])])];
            let error = error_text(&inputs("data", None, &allowed), &Cluster::new());
            assert!(
                error.starts_with(&format!(
                    "error generating accessibility requirements: topology key {key:?} cannot \
                     be sent to the CSI driver: the CSI spec requires {problem}"
                )),
                "{error}"
            );
        }
        for key in [
            "zone",
            "Zone_1.a",
            "topology.kubernetes.io/zone",
            &format!("{}/{}", "a".repeat(63), "B".repeat(63)),
        ] {
            let allowed = [selector(&[(key, &["z1"])])];
            assert!(
                accessibility_requirements(&inputs("data", None, &allowed), &Cluster::new())
                    .is_ok(),
                "{key}"
            );
        }
    }

    #[test]
    fn values_outside_the_csi_grammar_are_refused() {
        // An empty label value is valid in Kubernetes, not in CSI.
        let cluster = Cluster::new().member("n1", &[ZONE], &[(ZONE, "")]);
        assert_eq!(
            error_text(&inputs("data", Some("n1"), &[]), &cluster),
            "error generating accessibility requirements: topology value \"\" of key \
             \"topology.example/zone\" cannot be sent to the CSI driver: the CSI spec requires \
             1 to 63 characters, alphanumerics, '-', '_' or '.', beginning and ending with an \
             alphanumeric"
        );
        let too_long = "a".repeat(64);
        for value in ["zone 1", "-z", "z.", too_long.as_str(), "zöne"] {
            let allowed = [selector(&[(ZONE, &[value])])];
            assert!(
                matches!(
                    accessibility_requirements(&inputs("data", None, &allowed), &Cluster::new()),
                    Err(TopologyError::InvalidValue { .. })
                ),
                "{value}"
            );
        }
    }

    #[test]
    fn keys_differing_only_in_case_are_refused() {
        let allowed = [
            selector(&[("Zone", &["z1"])]),
            selector(&[("zone", &["z2"])]),
        ];
        assert_eq!(
            error_text(&inputs("data", None, &allowed), &Cluster::new()),
            "error generating accessibility requirements: topology keys \"Zone\" and \"zone\" \
             cannot both be sent to the CSI driver: the CSI spec makes keys case-insensitive"
        );
    }

    #[test]
    fn segment_maps_over_4_kib_are_refused() {
        let keys: Vec<String> = (0..40).map(|i| format!("example.com/key-{i:02}")).collect();
        let value = "v".repeat(63);
        let values = [value.as_str()];
        let pairs: Vec<(&str, &[&str])> =
            keys.iter().map(|key| (key.as_str(), &values[..])).collect();
        // 40 × (18 + 63) = 3240 bytes: fine.
        let allowed = [selector(&pairs)];
        assert!(
            accessibility_requirements(&inputs("data", None, &allowed), &Cluster::new()).is_ok()
        );
        let long_keys: Vec<String> = (0..40)
            .map(|i| format!("{}.com/key-{i:02}", "e".repeat(40)))
            .collect();
        let pairs: Vec<(&str, &[&str])> = long_keys
            .iter()
            .map(|key| (key.as_str(), &values[..]))
            .collect();
        let allowed = [selector(&pairs)];
        let error = error(&inputs("data", None, &allowed), &Cluster::new());
        // 40 × (51 + 63) = 4560 bytes.
        assert!(
            matches!(error, TopologyError::TermTooLarge { bytes: 4560, .. }),
            "{error}"
        );
        assert!(
            error
                .to_string()
                .ends_with("take 4560 bytes, the CSI spec allows 4096 for a map")
        );
    }
}
