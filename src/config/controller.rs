//! Flags of the reconcilers: retries, workers, side controllers and our own limits.

use std::time::Duration;

use clap::{ArgAction, ValueEnum};

use super::error::{ConfigError, not_after, positive_count, positive_duration};
use super::go::{parse_go_bool, parse_go_duration};

#[derive(Debug, Clone, clap::Args)]
pub struct ControllerArgs {
    /// Base of the per-item exponential retry backoff.
    #[arg(long, default_value = "1s", value_parser = parse_go_duration)]
    pub retry_interval_start: Duration,

    /// Cap of the per-item exponential retry backoff.
    #[arg(long, default_value = "5m", value_parser = parse_go_duration)]
    pub retry_interval_max: Duration,

    /// Claim workers and volume workers (each).
    #[arg(long, default_value_t = 100)]
    pub worker_threads: u64,

    /// Workers removing the clone-source finalizer.
    #[arg(long, default_value_t = 1)]
    pub cloning_protection_threads: u64,

    /// Period of the orphaned snapshot-finalizer sweep; 0 disables it.
    #[arg(long, default_value = "5m", value_parser = parse_go_duration)]
    pub snapshot_orphan_sweep_interval: Duration,

    /// Ours (not upstream): at most this many CreateVolume/DeleteVolume calls in flight per
    /// StorageClass, so one slow class cannot occupy every worker. 0 = unlimited.
    #[arg(long, default_value_t = 0)]
    pub max_concurrent_per_storage_class: u64,

    /// Ours (not upstream): halve a StorageClass's CreateVolume/DeleteVolume rate when its
    /// driver answers UNAVAILABLE, or RESOURCE_EXHAUSTED without a place asked for, and let it
    /// climb back in steps while the driver keeps up.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub adaptive_call_rate: bool,

    /// Ours (not upstream): how often to compare the driver's volumes (ListVolumes) with the
    /// PVs, VolumeSnapshotContents and operations in flight that reference them, and report
    /// those nothing references. 0 = never.
    #[arg(long, default_value = "0s", value_parser = parse_go_duration)]
    pub audit_volumes_interval: Duration,

    /// Ours (not upstream): delete a volume the audit has found referenced by nothing for this
    /// long, if its id holds a volume name of ours whose claim is gone. 0 = never.
    #[arg(long, default_value = "0s", value_parser = parse_go_duration)]
    pub audit_delete_after: Duration,

    /// Ours (not upstream): whether a PVC without the annotation
    /// `volume.kubernetes.io/provisioning-consistency` gets the provisioning-protection
    /// finalizer before CreateVolume (guards against the volume leak of upstream issue #486).
    #[arg(long, value_enum, default_value_t = ConsistencyDefault::Disable)]
    pub provisioning_consistency_default: ConsistencyDefault,

    /// Ours (not upstream): hand over to another provisioner (uninstall, or downgrade to
    /// upstream): take the Lease, start no new provisioning, finish every operation in flight,
    /// remove the provisioning-protection finalizer from every claim, then exit 0.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub drain: bool,
}

/// `--provisioning-consistency-default` (ours).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ConsistencyDefault {
    Enable,
    Disable,
}

impl ControllerArgs {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        positive_count("worker-threads", self.worker_threads)?;
        positive_count(
            "cloning-protection-threads",
            self.cloning_protection_threads,
        )?;
        positive_duration("retry-interval-start", self.retry_interval_start)?;
        if !self.audit_delete_after.is_zero() {
            positive_duration("audit-volumes-interval", self.audit_volumes_interval).map_err(
                |_| ConfigError::Invalid {
                    flag: "audit-delete-after",
                    reason: "needs --audit-volumes-interval: volumes are deleted only after audits found them referenced by nothing".into(),
                },
            )?;
            not_after(
                ("audit-volumes-interval", self.audit_volumes_interval),
                ("audit-delete-after", self.audit_delete_after),
            )?;
        }
        not_after(
            ("retry-interval-start", self.retry_interval_start),
            ("retry-interval-max", self.retry_interval_max),
        )
    }
}
