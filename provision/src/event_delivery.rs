//! When the sidecar's event writer sends an event (`controller::events`).
//!
//! Events yield to the requests that make progress: under the client-side rate limit an event
//! waits until the token bucket is full (at most 5 minutes). That is right for the bulk of
//! them (the Normal events of every claim provisioned, the same failure reported on every
//! retry), but a user looking at a failing claim waits for its first Warning, and for the
//! Warning that says the failure changed. Those are news: they go at once, still taking their
//! turn in the rate limit like any request. A repeat of the last Warning's reason adds nothing
//! the user has not seen (its count only), so it waits as before.

/// How soon an event is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventDelivery {
    /// Now, through the client's rate limit like any request.
    AtOnce,
    /// When the client's token bucket is full, or once the event has waited the longest yield.
    WhenSpare,
}

/// When to send an event about an object. `warning`: the event's reason if it is a Warning,
/// `None` for a Normal event; `last_warning`: the reason of the last Warning about the same
/// object, `None` if there was none (or it is forgotten).
pub fn event_delivery(warning: Option<&str>, last_warning: Option<&str>) -> EventDelivery {
    match warning {
        Some(reason) if last_warning != Some(reason) => EventDelivery::AtOnce,
        _ => EventDelivery::WhenSpare,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_warning_about_an_object_goes_at_once() {
        assert_eq!(
            event_delivery(Some("ProvisioningFailed"), None),
            EventDelivery::AtOnce
        );
    }

    #[test]
    fn a_warning_whose_reason_changed_goes_at_once() {
        assert_eq!(
            event_delivery(
                Some("ProvisioningFailed"),
                Some("VolumeAttributesClassIgnored")
            ),
            EventDelivery::AtOnce
        );
    }

    #[test]
    fn a_repeated_warning_waits_for_spare_capacity() {
        assert_eq!(
            event_delivery(Some("ProvisioningFailed"), Some("ProvisioningFailed")),
            EventDelivery::WhenSpare
        );
    }

    #[test]
    fn normal_events_wait_for_spare_capacity() {
        assert_eq!(event_delivery(None, None), EventDelivery::WhenSpare);
        assert_eq!(
            event_delivery(None, Some("ProvisioningFailed")),
            EventDelivery::WhenSpare
        );
    }
}
