//! CSIStorageCapacity flags (`controller::capacity`).

use std::time::Duration;

use clap::ArgAction;

use super::error::{ConfigError, positive_count, positive_duration};
use super::go::{parse_go_bool, parse_go_duration};

#[derive(Debug, Clone, clap::Args)]
pub struct CapacityArgs {
    /// Publish CSIStorageCapacity objects.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub enable_capacity: bool,

    /// Also publish capacity for Immediate-binding StorageClasses.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub capacity_for_immediate_binding: bool,

    /// Period of the capacity re-query.
    #[arg(long, default_value = "1m", value_parser = parse_go_duration)]
    pub capacity_poll_interval: Duration,

    /// Owner of CSIStorageCapacity objects: -1 none, 0 the pod, 1 its controller, ...
    #[arg(long, default_value_t = 1)]
    pub capacity_ownerref_level: i64,

    /// Capacity workers.
    #[arg(long, default_value_t = 1)]
    pub capacity_threads: u64,

    /// QPS of the capacity client.
    #[arg(long, default_value_t = 1.0)]
    pub kube_api_capacity_qps: f32,

    /// Burst of the capacity client.
    #[arg(long, default_value_t = 5)]
    pub kube_api_capacity_burst: i32,
}

impl CapacityArgs {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.enable_capacity {
            positive_count("capacity-threads", self.capacity_threads)?;
            // Upstream would poll without a pause, GetCapacity for every item in a loop.
            positive_duration("capacity-poll-interval", self.capacity_poll_interval)?;
        }
        Ok(())
    }
}
