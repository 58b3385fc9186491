//! Kubernetes events on claims and volumes, written as core/v1 Events like upstream's
//! client-go recorder (so upstream's RBAC, which grants core `events`, keeps working).
//! Repeats of the same event within ten minutes bump `count` instead of creating new
//! objects, as client-go's aggregation does, which keeps event writes per claim bounded.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use tracing::{debug, warn};

/// Events older than this are not aggregated into (client-go uses the same window).
const AGGREGATION_WINDOW: Duration = Duration::from_secs(600);
/// Upper bound on remembered events; the oldest are forgotten first.
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
    object_uid: String,
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

pub struct EventRecorder {
    client: Client,
    component: String,
    host: String,
    recent: Mutex<HashMap<EventKey, Recorded>>,
}

impl EventRecorder {
    /// `component` is the event source, e.g. `<driver>_<hostname>_<uuid>` as upstream's library uses.
    pub fn new(client: Client, component: String, host: String) -> Self {
        Self {
            client,
            component,
            host,
            recent: Mutex::new(HashMap::new()),
        }
    }

    /// Records an event; failures are logged and otherwise ignored, as event delivery
    /// must never block or fail an operation.
    pub async fn publish(
        &self,
        regarding: &ObjectReference,
        type_: EventType,
        reason: &str,
        message: &str,
    ) {
        // Objects referenced without a uid (journal shards) are keyed by namespace and name.
        let object_key = regarding.uid.clone().unwrap_or_else(|| {
            format!(
                "{}/{}",
                regarding.namespace.as_deref().unwrap_or_default(),
                regarding.name.as_deref().unwrap_or_default()
            )
        });
        let key = EventKey {
            object_uid: object_key,
            type_,
            reason: reason.to_string(),
            message: message.to_string(),
        };
        let now = Timestamp::now();
        if let Some((namespace, name, count)) = self.bump(&key) {
            let patch = serde_json::json!({ "count": count, "lastTimestamp": Time(now) });
            let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
            match api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => return,
                Err(err) => debug!(%err, name, "event aggregation failed, creating a new event"),
            }
        }
        let namespace = regarding
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_string());
        let object_name = regarding.name.clone().unwrap_or_default();
        let event = Event {
            metadata: ObjectMeta {
                name: Some(format!("{object_name}.{:x}", now.as_nanosecond())),
                namespace: Some(namespace.clone()),
                ..ObjectMeta::default()
            },
            involved_object: regarding.clone(),
            reason: Some(reason.to_string()),
            message: Some(message.to_string()),
            type_: Some(type_.as_str().to_string()),
            source: Some(EventSource {
                component: Some(self.component.clone()),
                host: Some(self.host.clone()),
            }),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            count: Some(1),
            reporting_component: Some(self.component.clone()),
            reporting_instance: Some(self.host.clone()),
            ..Event::default()
        };
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        match api.create(&PostParams::default(), &event).await {
            Ok(created) => self.remember(key, namespace, created.metadata.name.unwrap_or_default()),
            Err(err) => warn!(%err, reason, object = object_name, "failed to record event"),
        }
    }

    /// If an identical event was recorded recently, returns where it is and its new count.
    fn bump(&self, key: &EventKey) -> Option<(String, String, i32)> {
        let mut recent = self
            .recent
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let recorded = recent.get_mut(key)?;
        if recorded.first_seen.elapsed() > AGGREGATION_WINDOW {
            recent.remove(key);
            return None;
        }
        recorded.count = recorded.count.saturating_add(1);
        Some((
            recorded.namespace.clone(),
            recorded.name.clone(),
            recorded.count,
        ))
    }

    fn remember(&self, key: EventKey, namespace: String, name: String) {
        let mut recent = self
            .recent
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if recent.len() >= MAX_REMEMBERED {
            recent.retain(|_, recorded| recorded.first_seen.elapsed() <= AGGREGATION_WINDOW);
            if recent.len() >= MAX_REMEMBERED {
                recent.clear();
            }
        }
        recent.insert(
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
