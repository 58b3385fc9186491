//! The lease fence: a leader that cannot show a recent renewal of its Lease sends no
//! CreateVolume or DeleteVolume. A replica paused longer than its lease (SIGSTOP, a frozen VM,
//! a stalled node) wakes up still believing it leads while another replica may have taken
//! over; until its next renewal succeeds (or fails for good and it exits), it must not act on
//! storage beside the new leader.
//!
//! The renewal time is taken when the renewal request is sent, so it is never later than the
//! moment the API server stored it; another replica takes over no earlier than a full lease
//! duration after observing that write. A fence valid for the renew deadline (shorter than the
//! lease duration, which the flags' validation enforces) is therefore closed before anyone
//! else can lead. The check happens right before each call: a pause between the check and the
//! call itself is not covered, but it is a matter of microseconds instead of the whole pause.

use std::time::Duration;

use thiserror::Error;
use tokio::sync::watch;
use tokio::time::Instant;

#[derive(Debug, Error, PartialEq)]
#[error(
    "not sent: this replica's leadership is not proven (last Lease renewal: {since}); another replica may lead"
)]
pub struct Fenced {
    since: String,
}

/// Read side of the leader's renewals; cheap to clone.
#[derive(Clone, Debug)]
pub struct LeaseFence {
    /// `None` without leader election: the only replica needs no fence.
    renewed: Option<watch::Receiver<Option<Instant>>>,
    valid_for: Duration,
}

impl LeaseFence {
    /// No leader election: always open.
    pub fn open() -> Self {
        Self {
            renewed: None,
            valid_for: Duration::ZERO,
        }
    }

    /// Open while the last renewal sent, as `renewed` reports it, is younger than `valid_for`.
    pub fn new(renewed: watch::Receiver<Option<Instant>>, valid_for: Duration) -> Self {
        Self {
            renewed: Some(renewed),
            valid_for,
        }
    }

    /// Whether a storage call may be sent now.
    pub fn check(&self) -> Result<(), Fenced> {
        match &self.renewed {
            None => Ok(()),
            Some(renewed) => proven(*renewed.borrow(), Instant::now(), self.valid_for),
        }
    }
}

fn proven(last_renew: Option<Instant>, now: Instant, valid_for: Duration) -> Result<(), Fenced> {
    match last_renew {
        Some(at) if now.saturating_duration_since(at) < valid_for => Ok(()),
        Some(at) => Err(Fenced {
            since: format!("{:?} ago", now.saturating_duration_since(at)),
        }),
        None => Err(Fenced {
            since: "none while leading".to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_only_within_the_validity_of_the_last_renewal() {
        let t0 = Instant::now();
        let valid = Duration::from_secs(10);
        assert!(proven(Some(t0), t0 + Duration::from_secs(9), valid).is_ok());
        assert!(proven(Some(t0), t0 + Duration::from_secs(10), valid).is_err());
        assert!(proven(None, t0, valid).is_err());
    }

    #[test]
    fn without_leader_election_the_fence_is_open() {
        assert!(LeaseFence::open().check().is_ok());
    }

    #[test]
    fn a_renewal_reopens_the_fence_and_a_lost_lease_closes_it() {
        let (sender, receiver) = watch::channel(None);
        let fence = LeaseFence::new(receiver, Duration::from_secs(10));
        assert!(fence.check().is_err(), "not leading yet");
        sender.send_replace(Some(Instant::now()));
        assert!(fence.check().is_ok());
        sender.send_replace(None);
        assert!(fence.check().is_err(), "leadership lost");
    }
}
