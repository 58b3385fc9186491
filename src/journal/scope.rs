//! Which shards a sidecar reads and writes: those of its driver and, in node mode
//! (`--node-deployment`), of its node alone. A node never loads, replays or reaps another
//! node's operations: that node's driver holds those volumes, and would answer NotFound to a
//! DeleteVolume for them (success, and the volume left behind).
//!
//! Shards are labelled `provisioner.csi-rs.dev/driver=<driver>` (the sanitised driver name, as
//! the Lease) and, in node mode, `provisioner.csi-rs.dev/node=<node key>`; a central sidecar
//! selects the shards without the node label. Shard names are `<driver>-<index>` (central) and
//! `<driver>.<node key>-<index>` (node mode): the driver part never holds a `.`, so no node's
//! shard name is another driver's, and the index is the digits after the last `-`, so no
//! node's is another node's.

use std::collections::BTreeMap;

/// Label naming the driver on every shard.
pub const DRIVER_LABEL: &str = "provisioner.csi-rs.dev/driver";
/// Label naming the node on every shard of a node-mode sidecar.
pub const NODE_LABEL: &str = "provisioner.csi-rs.dev/node";

/// A label value holds at most 63 characters.
const LABEL_VALUE_MAX: usize = 63;
/// A shortened key: this many characters of the node name, `-`, 16 hex digits of a hash.
const KEPT: usize = LABEL_VALUE_MAX - 1 - 16;

/// The shards of one sidecar: their name prefix, the labels they carry and the selector that
/// finds exactly them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalScope {
    pub base_name: String,
    pub labels: BTreeMap<String, String>,
    pub selector: String,
    /// Node mode: the selector of every node's shards of this driver, this node's included.
    /// Read (never written) before a data source's protection comes off, since another node
    /// may still replay a clone or restore from it (docs/journal.md rule 12).
    pub every_node_selector: Option<String>,
    /// The shards of the other deployment mode of this driver (node mode's when central, the
    /// central ones in node mode): a sidecar that switched modes must not start while they
    /// hold operations, which nobody would see through (`Journal::load`).
    pub other_mode_selector: String,
}

impl JournalScope {
    /// `driver_base` is the sanitised driver name (`leader::lease_name`); `node` is
    /// `NODE_NAME` in node mode.
    pub fn new(driver_base: &str, node: Option<&str>) -> Self {
        let mut labels = BTreeMap::from([(DRIVER_LABEL.to_owned(), driver_base.to_owned())]);
        match node {
            None => JournalScope {
                base_name: driver_base.to_owned(),
                labels,
                selector: format!("{DRIVER_LABEL}={driver_base},!{NODE_LABEL}"),
                every_node_selector: None,
                other_mode_selector: format!("{DRIVER_LABEL}={driver_base},{NODE_LABEL}"),
            },
            Some(node) => {
                let key = node_key(node);
                labels.insert(NODE_LABEL.to_owned(), key.clone());
                JournalScope {
                    base_name: format!("{driver_base}.{key}"),
                    labels,
                    selector: format!("{DRIVER_LABEL}={driver_base},{NODE_LABEL}={key}"),
                    every_node_selector: Some(format!("{DRIVER_LABEL}={driver_base},{NODE_LABEL}")),
                    other_mode_selector: format!("{DRIVER_LABEL}={driver_base},!{NODE_LABEL}"),
                }
            }
        }
    }
}

/// The node's label value: the node name when it has at most 62 characters; otherwise its
/// first 46, `-` and 16 hex digits of its FNV-1a 64-bit hash: exactly 63, so a shortened key
/// never equals a name kept whole. Node names are DNS subdomains (lowercase alphanumerics,
/// `-`, `.`), so both are valid label values and valid in a shard name; the character before
/// the `-` is made alphanumeric (`x`) if the cut falls after a `.` or `-`.
pub fn node_key(node: &str) -> String {
    if node.len() < LABEL_VALUE_MAX {
        return node.to_owned();
    }
    let mut kept: String = node.chars().take(KEPT).collect();
    if !kept.ends_with(|c: char| c.is_ascii_alphanumeric()) {
        kept.pop();
        kept.push('x');
    }
    format!("{kept}-{:016x}", fnv1a_64(node.as_bytes()))
}

fn fnv1a_64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid_label_value(value: &str) -> bool {
        value.len() <= 63
            && value.starts_with(|c: char| c.is_ascii_alphanumeric())
            && value.ends_with(|c: char| c.is_ascii_alphanumeric())
            && value
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    }

    /// A DNS subdomain: dot-separated labels, each alphanumeric at both ends.
    fn valid_object_name(name: &str) -> bool {
        name.len() <= 253
            && name.split('.').all(|label| {
                !label.is_empty()
                    && label.starts_with(|c: char| c.is_ascii_alphanumeric())
                    && label.ends_with(|c: char| c.is_ascii_alphanumeric())
                    && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            })
    }

    #[test]
    fn a_central_sidecar_selects_the_shards_without_a_node() {
        let scope = JournalScope::new("hostpath-csi-k8s-io", None);
        assert_eq!(scope.base_name, "hostpath-csi-k8s-io");
        assert_eq!(
            scope.selector,
            "provisioner.csi-rs.dev/driver=hostpath-csi-k8s-io,!provisioner.csi-rs.dev/node"
        );
        assert_eq!(scope.labels.len(), 1);
        assert_eq!(scope.every_node_selector, None);
        assert_eq!(
            scope.other_mode_selector,
            "provisioner.csi-rs.dev/driver=hostpath-csi-k8s-io,provisioner.csi-rs.dev/node"
        );
    }

    #[test]
    fn a_node_sidecar_has_its_own_shards() {
        let scope = JournalScope::new("hostpath-csi-k8s-io", Some("worker-1.example.com"));
        assert_eq!(scope.base_name, "hostpath-csi-k8s-io.worker-1.example.com");
        assert_eq!(
            scope.selector,
            "provisioner.csi-rs.dev/driver=hostpath-csi-k8s-io,provisioner.csi-rs.dev/node=worker-1.example.com"
        );
        assert_eq!(scope.labels[NODE_LABEL], "worker-1.example.com");
        assert_eq!(
            scope.every_node_selector.as_deref(),
            Some("provisioner.csi-rs.dev/driver=hostpath-csi-k8s-io,provisioner.csi-rs.dev/node")
        );
        assert!(valid_object_name(&format!("{}-0", scope.base_name)));
        assert_eq!(
            scope.other_mode_selector,
            "provisioner.csi-rs.dev/driver=hostpath-csi-k8s-io,!provisioner.csi-rs.dev/node"
        );
    }

    #[test]
    fn long_node_names_are_shortened_to_valid_distinct_keys() {
        let long_a = format!("{}a", "n".repeat(252));
        let long_b = format!("{}b", "n".repeat(252));
        let cut_at_dot = format!("{}.{}", "a".repeat(45), "b".repeat(60));
        let cut_at_dash = format!("{}-{}", "a".repeat(45), "b".repeat(60));
        let keys: Vec<String> = [&long_a, &long_b, &cut_at_dot, &cut_at_dash]
            .iter()
            .map(|node| node_key(node))
            .collect();
        for key in &keys {
            assert_eq!(key.len(), 63, "{key}");
            assert!(valid_label_value(key), "{key}");
            assert!(valid_object_name(&format!("driver-x.{key}-12")), "{key}");
        }
        assert_ne!(keys[0], keys[1]);
        assert_ne!(keys[2], keys[3]);
        // Kept whole below 63: never equal to a shortened key (always 63 long).
        let short = "n".repeat(62);
        assert_eq!(node_key(&short), short);
        assert_eq!(node_key(&"n".repeat(63)).len(), 63);
        assert_ne!(node_key(&"n".repeat(63)), "n".repeat(63));
    }

    #[test]
    fn fnv1a_64_has_the_reference_values() {
        assert_eq!(fnv1a_64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a_64(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
