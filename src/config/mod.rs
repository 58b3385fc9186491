//! Command-line flags: every flag of upstream csi-provisioner v6.3 with the same name, type
//! and default, plus the few extra flags of ours (marked "Ours" in their doc comments).
//!
//! `Args` is made of one group per consumer (the driver connection, the API client, the
//! leader election, the HTTP server, logging, ...), so each module takes only its own flags.
//! Upstream parses flags with Go's pflag, so the parsers follow Go conventions (see `go`):
//! durations like `1m30s`, bools as `--flag`, `--flag=true`, `--flag=false` (never
//! `--flag false`), the last occurrence of a scalar flag wins, map flags accumulate.
//! docs/flags.md documents every flag; `FLAGS` is the same table in machine-readable form.
//!
//! This module imports nothing from the rest of the crate: it sits below every consumer. It
//! parses the metadata allow-lists into the pure `csi-provision` crate's type (one rule for
//! what a key is, shared with the decisions).

mod capacity;
mod client;
mod controller;
mod driver;
mod error;
mod flags;
mod gates;
mod go;
mod http;
mod leader;
mod logging;
mod node_deployment;
mod provision;
mod topology;

#[cfg(test)]
mod same_evidence;
#[cfg(test)]
mod tests;

use std::ffi::OsString;

use clap::{ArgAction, CommandFactory, FromArgMatches, Parser};

pub use capacity::CapacityArgs;
pub use client::ClientArgs;
pub use controller::{ConsistencyDefault, ControllerArgs};
pub use driver::DriverArgs;
pub use error::ConfigError;
pub use flags::{FLAGS, FlagInfo, FlagStatus};
pub use gates::{FeatureGates, Gate, GateKey, GateList, parse_gate_list};
pub use go::{parse_go_bool, parse_go_duration};
pub use http::{HttpArgs, LEADER_HEALTH_PATH};
pub use leader::{LabelList, LeaderArgs, parse_label_list};
pub use logging::{LogArgs, LoggingFormat, VModule, VModuleItem, parse_quantity, parse_vmodule};
pub use node_deployment::NodeDeploymentArgs;
pub use provision::ProvisionArgs;
pub use topology::TopologyArgs;

/// The version printed by `--version` (upstream prints `<argv0> <version>`).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The line `--version` prints: `<argv0> <version>`, as upstream does.
pub fn version_line(argv0: &str) -> String {
    format!("{argv0} {VERSION}")
}

/// All flags of the sidecar.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "csi-provisioner",
    about = "CSI provisioner sidecar: a drop-in replacement for kubernetes-csi/external-provisioner",
    disable_version_flag = true,
    args_override_self = true
)]
pub struct Args {
    #[command(flatten)]
    pub driver: DriverArgs,

    #[command(flatten)]
    pub client: ClientArgs,

    /// Print `<argv0> <version>` and exit 0.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub version: bool,

    /// Go-specific (sets GOMAXPROCS from the cgroup quota); accepted and ignored.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub automaxprocs: bool,

    #[command(flatten)]
    pub provision: ProvisionArgs,

    #[command(flatten)]
    pub topology: TopologyArgs,

    #[command(flatten)]
    pub capacity: CapacityArgs,

    #[command(flatten)]
    pub node_deployment: NodeDeploymentArgs,

    #[command(flatten)]
    pub leader: LeaderArgs,

    #[command(flatten)]
    pub http: HttpArgs,

    #[command(flatten)]
    pub controller: ControllerArgs,

    /// `Gate=bool,...` (repeatable). Gates: Topology, CrossNamespaceVolumeDataSource,
    /// VolumeAttributesClass, ReleaseLeaderElectionOnExit, AllAlpha, AllBeta.
    #[arg(long, action = ArgAction::Append, value_parser = parse_gate_list)]
    pub feature_gates: Vec<GateList>,

    #[command(flatten)]
    pub log: LogArgs,
}

impl Args {
    /// Parses the process arguments; prints the error or help and exits like clap (exit 2
    /// for bad flags, as pflag does).
    pub fn parse_flags() -> Self {
        match Self::parse_flags_from(std::env::args_os()) {
            Ok(args) => args,
            Err(e) => e.exit(),
        }
    }

    /// Parses `argv` (including argv[0]). Single-dash long forms of Go's `flag` package
    /// (`-csi-address=/x`, `-leader-election`) are accepted as their `--` form.
    pub fn parse_flags_from<I, T>(argv: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString>,
    {
        // pflag takes the next argument as a flag's value even if it starts with `-`.
        let mut cmd = Self::command().mut_args(|a| {
            if a.get_num_args().is_none_or(|n| n.min_values() > 0) {
                a.allow_hyphen_values(true)
            } else {
                a
            }
        });
        cmd.build();
        let argv = go::normalize_single_dash(&cmd, argv.into_iter().map(Into::into).collect());
        let matches = cmd.clone().try_get_matches_from(argv)?;
        Self::from_arg_matches(&matches)
    }

    /// Checks value ranges and combinations that a parser cannot; the error names the flag.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.http.validate(self.leader.leader_election)?;
        self.provision.validate()?;
        self.controller.validate()?;
        self.capacity.validate()?;
        self.driver.validate()?;
        self.node_deployment.validate()?;
        self.client.validate()?;
        self.log
            .validate(self.feature_gates().logging_alpha_options())?;
        self.leader.validate()
    }

    /// The resolved `--feature-gates` (later occurrences win).
    pub fn feature_gates(&self) -> FeatureGates {
        FeatureGates::resolve(&self.feature_gates)
    }
}
