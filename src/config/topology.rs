//! Topology flags: `--strict-topology` and `--immediate-topology`.

use clap::ArgAction;

use super::go::parse_go_bool;

#[derive(Debug, Clone, clap::Args)]
pub struct TopologyArgs {
    /// Late binding: only the selected node's topology is requisite/preferred.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub strict_topology: bool,

    /// Immediate binding without allowedTopologies: pass the aggregated cluster topology.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "true", default_missing_value = "true", value_parser = parse_go_bool)]
    pub immediate_topology: bool,
}
