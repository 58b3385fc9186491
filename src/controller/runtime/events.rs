//! Kubernetes events on claims and volumes, written as core/v1 Events like upstream's
//! client-go recorder (so upstream's RBAC, which grants core `events`, keeps working).
//!
//! Events are written by a background task, never by the reconcile that reports them. News goes
//! at once: the first Warning about an object, and a Warning whose reason differs from the last
//! Warning about it (`provision::event_delivery`), take their turn in the client-side rate
//! limit (`--kube-api-qps`) like any request. Everything else (Normal events, a Warning
//! repeating the last one's reason) yields to the requests that make progress: it is sent only
//! when the token bucket is full, or once it has waited 5 minutes (`kube_client::MAX_YIELD`).
//! Both sidecars spend the same budget on the same events; ours spends it on PVs first, so
//! claims are bound sooner and the bulk of the events follow, while a failing claim shows why
//! at once. Each event keeps the time it happened. Repeats of the same event within ten
//! minutes bump `count` instead of creating new objects, as client-go's aggregation does.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::core::Request;
use kube::{Client, Resource};
use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::kube_client::RateLimitLayer;
use crate::kube_client::protobuf;
use crate::provision::{EventDelivery, event_delivery};

pub(in crate::controller) mod wire;

/// Events older than this are not aggregated into (client-go uses the same window).
const AGGREGATION_WINDOW: Duration = Duration::from_secs(600);
/// Upper bound on remembered events, and on the objects whose last Warning is remembered; the
/// oldest are forgotten first.
const MAX_REMEMBERED: usize = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

#[derive(Debug, PartialEq, Eq, Hash, Clone)]
struct EventKey {
    object: String,
    type_: EventType,
    reason: String,
    message: String,
}

#[derive(Debug)]
struct Recorded {
    namespace: String,
    name: String,
    count: i32,
    first_seen: Instant,
}

struct Pending {
    regarding: ObjectReference,
    type_: EventType,
    reason: String,
    message: String,
    at: Timestamp,
    queued: Instant,
}

/// A new core/v1 Event about `regarding` (its namespace, else `default`), named as client-go
/// names them: `<object name>.<hex nanoseconds>`.
pub fn core_event(
    regarding: &ObjectReference,
    type_: EventType,
    reason: &str,
    message: &str,
    at: Timestamp,
    source: &EventSource,
) -> Event {
    let namespace = regarding.namespace.as_deref().unwrap_or("default");
    let object_name = regarding.name.as_deref().unwrap_or_default();
    Event {
        metadata: ObjectMeta {
            name: Some(format!("{object_name}.{:x}", at.as_nanosecond())),
            namespace: Some(namespace.to_owned()),
            ..ObjectMeta::default()
        },
        involved_object: regarding.clone(),
        reason: Some(reason.to_owned()),
        message: Some(message.to_owned()),
        type_: Some(type_.as_str().to_owned()),
        source: Some(source.clone()),
        first_timestamp: Some(Time(at)),
        last_timestamp: Some(Time(at)),
        count: Some(1),
        reporting_component: source.component.clone(),
        reporting_instance: source.host.clone(),
        ..Event::default()
    }
}

/// Where reconcilers report events; cheap, never blocks.
pub struct EventRecorder {
    queue: mpsc::UnboundedSender<Pending>,
}

impl EventRecorder {
    /// `component` is the event source, e.g. `<driver>_<hostname>_<uuid>` as upstream's library
    /// uses; `limit` is the client's rate limiter, to find spare capacity.
    pub fn new(client: Client, component: String, host: String, limit: RateLimitLayer) -> Self {
        let (queue, pending) = mpsc::unbounded_channel();
        let writer = Writer {
            client,
            component,
            host,
            limit,
            recent: HashMap::new(),
            last_warnings: LastWarnings::default(),
        };
        tokio::spawn(writer.run(pending));
        Self { queue }
    }

    /// Queues an event. Delivery failures are logged: events never fail an operation.
    pub fn publish(
        &self,
        regarding: &ObjectReference,
        type_: EventType,
        reason: &str,
        message: &str,
    ) {
        let pending = Pending {
            regarding: regarding.clone(),
            type_,
            reason: reason.to_owned(),
            message: message.to_owned(),
            at: Timestamp::now(),
            queued: Instant::now(),
        };
        if self.queue.send(pending).is_err() {
            debug!(reason, "event dropped: the event writer has stopped");
        }
    }
}

struct Writer {
    client: Client,
    component: String,
    host: String,
    limit: RateLimitLayer,
    recent: HashMap<EventKey, Recorded>,
    last_warnings: LastWarnings,
}

impl Writer {
    /// Sorts the events as they arrive: news is written at once, the rest waits in order of
    /// arrival for spare capacity (each at most `MAX_YIELD` after it was queued).
    async fn run(mut self, mut pending: mpsc::UnboundedReceiver<Pending>) {
        let mut waiting: VecDeque<Pending> = VecDeque::new();
        let mut open = true;
        loop {
            let event = match waiting.front() {
                Some(oldest) => {
                    let since = tokio::time::Instant::from_std(oldest.queued);
                    // The waiting event first: with capacity to spare, events go out in the
                    // order they happened; without, news overtakes them.
                    tokio::select! {
                        biased;
                        () = self.limit.yield_since(since) => {
                            if let Some(oldest) = waiting.pop_front() {
                                self.write(oldest).await;
                            }
                            continue;
                        }
                        received = pending.recv(), if open => match received {
                            Some(event) => event,
                            None => {
                                open = false;
                                continue;
                            }
                        },
                    }
                }
                None if open => match pending.recv().await {
                    Some(event) => event,
                    None => return,
                },
                None => return,
            };
            let warning = (event.type_ == EventType::Warning).then_some(event.reason.as_str());
            let object = object_key(&event.regarding);
            match event_delivery(warning, self.last_warnings.get(&object)) {
                EventDelivery::AtOnce => {
                    if let Some(reason) = warning {
                        self.last_warnings.insert(object, reason);
                    }
                    self.write(event).await;
                }
                EventDelivery::WhenSpare => {
                    if warning.is_some() {
                        self.last_warnings.touch(&object);
                    }
                    waiting.push_back(event);
                }
            }
        }
    }

    async fn write(&mut self, event: Pending) {
        let regarding = &event.regarding;
        let key = EventKey {
            object: object_key(regarding),
            type_: event.type_,
            reason: event.reason.clone(),
            message: event.message.clone(),
        };
        if let Some((namespace, name, count)) = self.bump(&key) {
            let patch = serde_json::json!({ "count": count, "lastTimestamp": Time(event.at) });
            let request = Request::new(Event::url_path(&(), Some(&namespace)))
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .map_err(kube::Error::BuildRequest);
            match self.send(request).await {
                Ok(()) => return,
                Err(err) => debug!(%err, name, "event aggregation failed, creating a new event"),
            }
        }
        let namespace = regarding
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_string());
        let object_name = regarding.name.clone().unwrap_or_default();
        let object = core_event(
            regarding,
            event.type_,
            &event.reason,
            &event.message,
            event.at,
            &EventSource {
                component: Some(self.component.clone()),
                host: Some(self.host.clone()),
            },
        );
        let name = object.metadata.name.clone().unwrap_or_default();
        let request = Request::new(Event::url_path(&(), Some(&namespace)))
            .create(&PostParams::default(), wire::encode(&object))
            .map_err(kube::Error::BuildRequest)
            .map(|mut request| {
                request.headers_mut().insert(
                    http::header::CONTENT_TYPE,
                    http::HeaderValue::from_static(protobuf::CONTENT_TYPE),
                );
                request
            });
        match self.send(request).await {
            // The name is ours (`core_event`): nothing of the answer is needed.
            Ok(()) => self.remember(key, namespace, name),
            Err(err) => {
                warn!(%err, reason = event.reason, object = object_name, "failed to record event")
            }
        }
    }

    /// Sends a write of an event; its answer is not read.
    async fn send(
        &self,
        request: Result<http::Request<Vec<u8>>, kube::Error>,
    ) -> Result<(), kube::Error> {
        protobuf::write_unread(&self.client, request?).await
    }

    /// If an identical event was recorded recently, returns where it is and its new count.
    fn bump(&mut self, key: &EventKey) -> Option<(String, String, i32)> {
        let recorded = self.recent.get_mut(key)?;
        if recorded.first_seen.elapsed() > AGGREGATION_WINDOW {
            self.recent.remove(key);
            return None;
        }
        recorded.count = recorded.count.saturating_add(1);
        Some((
            recorded.namespace.clone(),
            recorded.name.clone(),
            recorded.count,
        ))
    }

    fn remember(&mut self, key: EventKey, namespace: String, name: String) {
        if self.recent.len() >= MAX_REMEMBERED {
            self.recent
                .retain(|_, recorded| recorded.first_seen.elapsed() <= AGGREGATION_WINDOW);
            if self.recent.len() >= MAX_REMEMBERED {
                self.recent.clear();
            }
        }
        self.recent.insert(
            key,
            Recorded {
                namespace,
                name,
                count: 1,
                first_seen: Instant::now(),
            },
        );
    }
}

/// The key of an event's object: its uid; objects referenced without one (journal shards) are
/// keyed by namespace and name.
fn object_key(regarding: &ObjectReference) -> String {
    regarding.uid.clone().unwrap_or_else(|| {
        format!(
            "{}/{}",
            regarding.namespace.as_deref().unwrap_or_default(),
            regarding.name.as_deref().unwrap_or_default()
        )
    })
}

/// The reason of the last Warning about each object, for [`event_delivery`]; at most
/// `MAX_REMEMBERED` objects, those with the oldest Warnings forgotten first (a forgotten
/// object's next Warning goes at once, as a first one).
#[derive(Default)]
struct LastWarnings {
    /// By object key: the reason, and when it was last seen (a sequence number).
    reasons: HashMap<String, (Box<str>, u64)>,
    next: u64,
}

impl LastWarnings {
    fn get(&self, object: &str) -> Option<&str> {
        self.reasons.get(object).map(|(reason, _)| &**reason)
    }

    fn insert(&mut self, object: String, reason: &str) {
        self.make_room();
        let seen = self.tick();
        self.reasons.insert(object, (reason.into(), seen));
    }

    /// A repeat keeps its object among the remembered ones.
    fn touch(&mut self, object: &str) {
        let seen = self.tick();
        if let Some((_, last)) = self.reasons.get_mut(object) {
            *last = seen;
        }
    }

    fn tick(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    /// When full, keeps the objects seen in the last `MAX_REMEMBERED / 2` Warnings (at most
    /// that many: each sequence number belongs to one object), so the sweep runs at most once
    /// per `MAX_REMEMBERED / 2` insertions.
    fn make_room(&mut self) {
        if self.reasons.len() < MAX_REMEMBERED {
            return;
        }
        let kept_from = self.next.saturating_sub(MAX_REMEMBERED as u64 / 2);
        self.reasons.retain(|_, (_, seen)| *seen > kept_from);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_warnings_forget_the_oldest_objects_first() {
        let mut last = LastWarnings::default();
        for i in 0..MAX_REMEMBERED {
            last.insert(format!("claim-{i}"), "ProvisioningFailed");
        }
        // claim-0 repeats: it is now among the most recent.
        last.touch("claim-0");
        last.insert("one more".to_owned(), "ProvisioningFailed");
        assert!(last.reasons.len() <= MAX_REMEMBERED / 2 + 1);
        assert_eq!(last.get("claim-0"), Some("ProvisioningFailed"));
        assert_eq!(last.get("claim-1"), None);
        assert_eq!(
            last.get(&format!("claim-{}", MAX_REMEMBERED - 1)),
            Some("ProvisioningFailed")
        );
        assert_eq!(last.get("one more"), Some("ProvisioningFailed"));
    }

    #[test]
    fn a_new_reason_replaces_the_last_one() {
        let mut last = LastWarnings::default();
        last.insert("claim".to_owned(), "ProvisioningFailed");
        last.insert("claim".to_owned(), "VolumeAttributesClassIgnored");
        assert_eq!(last.get("claim"), Some("VolumeAttributesClassIgnored"));
        assert_eq!(last.reasons.len(), 1);
    }
}
