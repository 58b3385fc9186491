//! Leader-election flags.

use std::collections::BTreeMap;
use std::time::Duration;

use clap::ArgAction;

use super::error::ConfigError;
use super::go::{parse_go_bool, parse_go_duration};

#[derive(Debug, Clone, clap::Args)]
pub struct LeaderArgs {
    /// Enable Lease-based leader election.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true", value_parser = parse_go_bool)]
    pub leader_election: bool,

    /// Lease namespace (default: env POD_NAMESPACE, the service-account namespace, `default`).
    #[arg(long, default_value = "")]
    pub leader_election_namespace: String,

    /// How long a Lease is valid after its last renewal.
    #[arg(long, default_value = "15s", value_parser = parse_go_duration)]
    pub leader_election_lease_duration: Duration,

    /// How long the leader keeps retrying a renewal before giving up leadership.
    #[arg(long, default_value = "10s", value_parser = parse_go_duration)]
    pub leader_election_renew_deadline: Duration,

    /// Interval between acquire/renew attempts.
    #[arg(long, default_value = "5s", value_parser = parse_go_duration)]
    pub leader_election_retry_period: Duration,

    /// Labels put on the Lease while leading: `k:v,k2:v2` (repeatable; later keys win).
    #[arg(long, action = ArgAction::Append, value_parser = parse_label_list)]
    pub leader_election_labels: Vec<LabelList>,
}

/// One occurrence of `--leader-election-labels`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelList(pub Vec<(String, String)>);

impl LeaderArgs {
    /// The resolved `--leader-election-labels` (later keys win).
    pub fn labels(&self) -> BTreeMap<String, String> {
        self.leader_election_labels
            .iter()
            .flat_map(|l| l.0.iter().cloned())
            .collect()
    }

    /// The same constraints client-go's leader elector enforces at start (fatal upstream);
    /// only checked when leader election is on.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if !self.leader_election {
            return Ok(());
        }
        let lease = self.leader_election_lease_duration;
        let renew = self.leader_election_renew_deadline;
        let retry = self.leader_election_retry_period;
        for (flag, d) in [
            ("leader-election-lease-duration", lease),
            ("leader-election-renew-deadline", renew),
            ("leader-election-retry-period", retry),
        ] {
            if d < Duration::from_secs(1) {
                return Err(ConfigError::OutOfRange {
                    flag,
                    value: format!("{d:?}"),
                    expected: "at least 1s",
                });
            }
        }
        if lease <= renew {
            return Err(ConfigError::Ordering {
                flag: "leader-election-lease-duration",
                value: lease,
                relation: "greater than",
                other: "leader-election-renew-deadline",
                other_value: renew,
            });
        }
        // client-go requires renewDeadline > 1.2 * retryPeriod (its jitter factor).
        if renew.as_secs_f64() <= 1.2 * retry.as_secs_f64() {
            return Err(ConfigError::Ordering {
                flag: "leader-election-renew-deadline",
                value: renew,
                relation: "greater than 1.2 times",
                other: "leader-election-retry-period",
                other_value: retry,
            });
        }
        Ok(())
    }
}

/// `k:v,k2:v2` like csi-lib-utils: every item must contain exactly one `:`.
pub fn parse_label_list(s: &str) -> Result<LabelList, String> {
    s.split(',')
        .map(
            |item| match item.split(':').collect::<Vec<_>>().as_slice() {
                [k, v] => Ok(((*k).to_owned(), (*v).to_owned())),
                _ => Err(format!(
                    "malformed item in list of labels: {item:?} (want key:value)"
                )),
            },
        )
        .collect::<Result<Vec<_>, _>>()
        .map(LabelList)
}
