//! Claim and namespace metadata an operator chose to pass on, by allow-list only: claim labels
//! copied onto the PV (`--copy-claim-labels`), and claim annotations, namespace labels and
//! namespace annotations added to CreateVolume's parameters
//! (`--extra-create-metadata-claim-annotations`, `--extra-create-metadata-namespace-labels`,
//! `--extra-create-metadata-namespace-annotations`).
//!
//! The parameter names are those of upstream's open PR kubernetes-csi/external-provisioner#1531
//! (`csi.storage.k8s.io/namespace/labels/<key>`, `.../namespace/annotations/<key>`), and the
//! claim's annotations follow the same convention (`csi.storage.k8s.io/pvc/annotations/<key>`),
//! so a driver written against a later upstream release reads the same keys. A class cannot
//! set any of them: the class's own `csi.storage.k8s.io/` keys other than the known ones are
//! refused ([`super::parameters`]), so these, like `--extra-create-metadata`'s, are never
//! overridden by the class and never override it.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim};
use thiserror::Error;

use super::validation::qualified_name_problem;

/// Prefix of the CreateVolume parameters that carry the claim's allow-listed annotations.
pub const CLAIM_ANNOTATIONS_PREFIX: &str = "csi.storage.k8s.io/pvc/annotations/";
/// Prefix of the parameters that carry the claim namespace's allow-listed labels (upstream #1531).
pub const NAMESPACE_LABELS_PREFIX: &str = "csi.storage.k8s.io/namespace/labels/";
/// Prefix of the parameters that carry the claim namespace's allow-listed annotations (upstream
/// #1531).
pub const NAMESPACE_ANNOTATIONS_PREFIX: &str = "csi.storage.k8s.io/namespace/annotations/";

/// An allow-list entry that is neither a label/annotation key nor `<prefix>*`.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum KeyPatternError {
    #[error("{pattern:?} is not a Kubernetes label or annotation key: {reason}")]
    NotAKey {
        pattern: String,
        reason: &'static str,
    },
    #[error(
        "{pattern:?} is not the start of a Kubernetes label or annotation key: {reason} (a pattern is a key prefix followed by one final *)"
    )]
    NotAPrefix {
        pattern: String,
        reason: &'static str,
    },
    #[error(
        "\"*\" alone would pass every key; name the keys, or a prefix followed by * (e.g. example.com/*)"
    )]
    Everything,
    #[error("empty entry in the list of keys")]
    Empty,
}

/// The keys an operator allowed: exact keys, and key prefixes (written `<prefix>*`). Empty
/// allows nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyAllowList {
    exact: BTreeSet<String>,
    prefixes: BTreeSet<String>,
}

impl KeyAllowList {
    /// A comma-separated list of keys and `<prefix>*` patterns; the empty string is the empty
    /// list. Each key must be a valid label/annotation key, and each prefix the start of one.
    pub fn parse(list: &str) -> Result<Self, KeyPatternError> {
        let mut allowed = Self::default();
        if list.is_empty() {
            return Ok(allowed);
        }
        for pattern in list.split(',') {
            match pattern.strip_suffix('*') {
                Some("") => return Err(KeyPatternError::Everything),
                Some(prefix) => {
                    // A prefix is the start of a key when some key continues it.
                    if let Some(reason) = qualified_name_problem(&format!("{prefix}x")) {
                        return Err(KeyPatternError::NotAPrefix {
                            pattern: pattern.to_owned(),
                            reason,
                        });
                    }
                    allowed.prefixes.insert(prefix.to_owned());
                }
                None if pattern.is_empty() => return Err(KeyPatternError::Empty),
                None => {
                    if let Some(reason) = qualified_name_problem(pattern) {
                        return Err(KeyPatternError::NotAKey {
                            pattern: pattern.to_owned(),
                            reason,
                        });
                    }
                    allowed.exact.insert(pattern.to_owned());
                }
            }
        }
        Ok(allowed)
    }

    /// Every key either list allows (for a repeated flag).
    pub fn union(mut self, other: &KeyAllowList) -> Self {
        self.exact.extend(other.exact.iter().cloned());
        self.prefixes.extend(other.prefixes.iter().cloned());
        self
    }

    pub fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.prefixes.is_empty()
    }

    pub fn allows(&self, key: &str) -> bool {
        self.exact.contains(key) || self.prefixes.iter().any(|prefix| key.starts_with(prefix))
    }

    /// The allowed entries of `map`.
    fn select<'a>(
        &'a self,
        map: Option<&'a BTreeMap<String, String>>,
    ) -> impl Iterator<Item = (&'a String, &'a String)> + 'a {
        map.into_iter()
            .flatten()
            .filter(|(key, _)| self.allows(key))
    }
}

/// The four allow-lists; all empty (the default) changes nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MetadataAllowLists {
    /// `--copy-claim-labels`: claim labels put on the PV.
    pub claim_labels: KeyAllowList,
    /// `--extra-create-metadata-claim-annotations`.
    pub claim_annotations: KeyAllowList,
    /// `--extra-create-metadata-namespace-labels`.
    pub namespace_labels: KeyAllowList,
    /// `--extra-create-metadata-namespace-annotations`.
    pub namespace_annotations: KeyAllowList,
}

impl MetadataAllowLists {
    /// Whether a new CreateVolume needs the claim's Namespace (read live by the executor).
    pub fn needs_namespace(&self) -> bool {
        !self.namespace_labels.is_empty() || !self.namespace_annotations.is_empty()
    }

    /// Whether the PV needs the claim's labels (which the claim cache does not keep).
    pub fn needs_claim_labels(&self) -> bool {
        !self.claim_labels.is_empty()
    }
}

/// The CreateVolume parameters from the claim's allow-listed annotations, only those present.
pub fn claim_metadata_parameters(
    pvc: &PersistentVolumeClaim,
    lists: &MetadataAllowLists,
) -> HashMap<String, String> {
    prefixed(
        CLAIM_ANNOTATIONS_PREFIX,
        lists
            .claim_annotations
            .select(pvc.metadata.annotations.as_ref()),
    )
    .collect()
}

/// The CreateVolume parameters from the namespace's allow-listed labels and annotations, only
/// those present.
pub fn namespace_metadata_parameters(
    namespace: &Namespace,
    lists: &MetadataAllowLists,
) -> HashMap<String, String> {
    let meta = &namespace.metadata;
    prefixed(
        NAMESPACE_LABELS_PREFIX,
        lists.namespace_labels.select(meta.labels.as_ref()),
    )
    .chain(prefixed(
        NAMESPACE_ANNOTATIONS_PREFIX,
        lists
            .namespace_annotations
            .select(meta.annotations.as_ref()),
    ))
    .collect()
}

fn prefixed<'a>(
    prefix: &'a str,
    entries: impl Iterator<Item = (&'a String, &'a String)> + 'a,
) -> impl Iterator<Item = (String, String)> + 'a {
    entries.map(move |(key, value)| (format!("{prefix}{key}"), value.clone()))
}

/// Puts the claim's allow-listed labels on the PV. A label the PV already has (the sidecar's
/// own, such as the zone labels of a migrated in-tree PV) is kept: the claim never overrides
/// what the sidecar decided.
pub fn copy_claim_labels(
    pv: &mut PersistentVolume,
    claim_labels: Option<&BTreeMap<String, String>>,
    lists: &MetadataAllowLists,
) {
    let mut copied = lists.claim_labels.select(claim_labels).peekable();
    if copied.peek().is_none() {
        return;
    }
    let labels = pv.metadata.labels.get_or_insert_with(BTreeMap::new);
    for (key, value) in copied {
        labels.entry(key.clone()).or_insert_with(|| value.clone());
    }
}

#[cfg(test)]
mod tests;
