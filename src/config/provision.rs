//! Flags of volume naming and of what CreateVolume and the PV carry.

use clap::ArgAction;
use csi_provision::metadata::{KeyAllowList, MetadataAllowLists};

use super::error::ConfigError;
use super::go::parse_go_bool;

#[derive(Debug, Clone, clap::Args)]
pub struct ProvisionArgs {
    /// Prefix of PV and CreateVolume names: `<prefix>-<pvc-uid>`.
    #[arg(long, default_value = "pvc")]
    pub volume_name_prefix: String,

    /// -1 = full PVC UID; otherwise the first N characters of the UID without dashes (0..=32).
    #[arg(long, default_value_t = -1)]
    pub volume_name_uuid_length: i64,

    /// Add PVC name/namespace and PV name to the CreateVolume parameters.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub extra_create_metadata: bool,

    /// Ours: claim labels copied onto the PV at creation: keys and `<prefix>*` patterns,
    /// comma-separated (repeatable). A label the PV already gets from the sidecar is kept.
    #[arg(long, action = ArgAction::Append, value_parser = parse_key_allow_list)]
    pub copy_claim_labels: Vec<KeyAllowList>,

    /// Ours: claim annotations passed to CreateVolume as
    /// `csi.storage.k8s.io/pvc/annotations/<key>` (keys and `<prefix>*`, repeatable).
    #[arg(long, action = ArgAction::Append, value_parser = parse_key_allow_list)]
    pub extra_create_metadata_claim_annotations: Vec<KeyAllowList>,

    /// Labels of the claim's namespace passed to CreateVolume as
    /// `csi.storage.k8s.io/namespace/labels/<key>` (upstream PR #1531's name; keys and
    /// `<prefix>*`, repeatable).
    #[arg(long, action = ArgAction::Append, value_parser = parse_key_allow_list)]
    pub extra_create_metadata_namespace_labels: Vec<KeyAllowList>,

    /// Annotations of the claim's namespace passed to CreateVolume as
    /// `csi.storage.k8s.io/namespace/annotations/<key>` (upstream PR #1531's name; keys and
    /// `<prefix>*`, repeatable).
    #[arg(long, action = ArgAction::Append, value_parser = parse_key_allow_list)]
    pub extra_create_metadata_namespace_annotations: Vec<KeyAllowList>,

    /// fsType used when the StorageClass has none.
    #[arg(long, default_value = "")]
    pub default_fstype: String,

    /// Set PV.spec.csi.readOnly for ReadOnlyMany-only claims.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub controller_publish_readonly: bool,

    /// Reject a volumeMode change when restoring from a snapshot.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "true", default_missing_value = "true", value_parser = parse_go_bool)]
    pub prevent_volume_mode_conversion: bool,
}

/// One occurrence of an allow-list flag: `key,prefix*,...`, each a valid label/annotation key
/// (or the start of one before `*`); clap's message names the flag.
fn parse_key_allow_list(s: &str) -> Result<KeyAllowList, String> {
    KeyAllowList::parse(s).map_err(|error| error.to_string())
}

/// Every occurrence of a repeatable allow-list flag together.
fn union(lists: &[KeyAllowList]) -> KeyAllowList {
    lists
        .iter()
        .fold(KeyAllowList::default(), KeyAllowList::union)
}

impl ProvisionArgs {
    /// The resolved metadata allow-lists (every occurrence of each flag).
    pub fn metadata_allow_lists(&self) -> MetadataAllowLists {
        MetadataAllowLists {
            claim_labels: union(&self.copy_claim_labels),
            claim_annotations: union(&self.extra_create_metadata_claim_annotations),
            namespace_labels: union(&self.extra_create_metadata_namespace_labels),
            namespace_annotations: union(&self.extra_create_metadata_namespace_annotations),
        }
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        // 0 keeps no digit of the UID: every claim would get the volume name `<prefix>-`.
        if !(-1..=32).contains(&self.volume_name_uuid_length) || self.volume_name_uuid_length == 0 {
            return Err(ConfigError::OutOfRange {
                flag: "volume-name-uuid-length",
                value: self.volume_name_uuid_length.to_string(),
                expected: "-1 (the whole UID) or between 1 and 32",
            });
        }
        if self.volume_name_prefix.is_empty() {
            return Err(ConfigError::OutOfRange {
                flag: "volume-name-prefix",
                value: String::new(),
                expected: "non-empty",
            });
        }
        Ok(())
    }
}
