//! Flags of volume naming and of what CreateVolume and the PV carry.

use clap::ArgAction;

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

impl ProvisionArgs {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if !(-1..=32).contains(&self.volume_name_uuid_length) {
            return Err(ConfigError::OutOfRange {
                flag: "volume-name-uuid-length",
                value: self.volume_name_uuid_length.to_string(),
                expected: "between -1 and 32",
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
