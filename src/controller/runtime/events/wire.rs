//! A core/v1 Event as protobuf, with the fields `core_event` sets (tags of k8s.io/api's
//! `core/v1/generated.proto`). The API server decodes and answers protobuf at a fraction of
//! JSON's cost, and the writer reads nothing of the answer but its status.

use k8s_openapi::api::core::v1::{Event, ObjectReference};
use prost::Message;

use crate::kube_client::protobuf::{ObjectMeta, WireTime, seal_envelope};
#[cfg(test)]
use crate::kube_client::protobuf::{ProtobufError, open_envelope};

#[derive(Clone, PartialEq, Message)]
struct WireEvent {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMeta>,
    #[prost(message, optional, tag = "2")]
    involved_object: Option<WireReference>,
    #[prost(string, optional, tag = "3")]
    reason: Option<String>,
    #[prost(string, optional, tag = "4")]
    message: Option<String>,
    #[prost(message, optional, tag = "5")]
    source: Option<WireSource>,
    #[prost(message, optional, tag = "6")]
    first_timestamp: Option<WireTime>,
    #[prost(message, optional, tag = "7")]
    last_timestamp: Option<WireTime>,
    #[prost(int32, optional, tag = "8")]
    count: Option<i32>,
    #[prost(string, optional, tag = "9")]
    type_: Option<String>,
    #[prost(string, optional, tag = "14")]
    reporting_component: Option<String>,
    #[prost(string, optional, tag = "15")]
    reporting_instance: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct WireReference {
    #[prost(string, optional, tag = "1")]
    kind: Option<String>,
    #[prost(string, optional, tag = "2")]
    namespace: Option<String>,
    #[prost(string, optional, tag = "3")]
    name: Option<String>,
    #[prost(string, optional, tag = "4")]
    uid: Option<String>,
    #[prost(string, optional, tag = "5")]
    api_version: Option<String>,
    #[prost(string, optional, tag = "6")]
    resource_version: Option<String>,
    #[prost(string, optional, tag = "7")]
    field_path: Option<String>,
}

#[derive(Clone, PartialEq, Message)]
struct WireSource {
    #[prost(string, optional, tag = "1")]
    component: Option<String>,
    #[prost(string, optional, tag = "2")]
    host: Option<String>,
}

fn reference(reference: &ObjectReference) -> WireReference {
    WireReference {
        kind: reference.kind.clone(),
        namespace: reference.namespace.clone(),
        name: reference.name.clone(),
        uid: reference.uid.clone(),
        api_version: reference.api_version.clone(),
        resource_version: reference.resource_version.clone(),
        field_path: reference.field_path.clone(),
    }
}

/// `event` as the body of a create, in the protobuf envelope.
pub fn encode(event: &Event) -> Vec<u8> {
    let wire = WireEvent {
        metadata: Some(ObjectMeta {
            name: event.metadata.name.clone(),
            namespace: event.metadata.namespace.clone(),
            ..ObjectMeta::default()
        }),
        involved_object: Some(reference(&event.involved_object)),
        reason: event.reason.clone(),
        message: event.message.clone(),
        source: event.source.as_ref().map(|source| WireSource {
            component: source.component.clone(),
            host: source.host.clone(),
        }),
        first_timestamp: event.first_timestamp.as_ref().map(WireTime::from_time),
        last_timestamp: event.last_timestamp.as_ref().map(WireTime::from_time),
        count: event.count,
        type_: event.type_.clone(),
        reporting_component: event.reporting_component.clone(),
        reporting_instance: event.reporting_instance.clone(),
    };
    seal_envelope("v1", "Event", &wire)
}

/// The event in an enveloped create body: what the scripted API server of the reconcile
/// fixtures reads, and the round trip of [`encode`].
#[cfg(test)]
pub(crate) fn decode(body: &[u8]) -> Result<Event, ProtobufError> {
    use k8s_openapi::api::core::v1::EventSource;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1;

    let (_, raw) = open_envelope(body)?;
    let wire = WireEvent::decode(raw.as_slice()).map_err(|source| ProtobufError::Decode {
        what: "event",
        source,
    })?;
    let metadata = wire.metadata.unwrap_or_default();
    let involved = wire.involved_object.unwrap_or_default();
    Ok(Event {
        metadata: v1::ObjectMeta {
            name: metadata.name,
            namespace: metadata.namespace,
            ..v1::ObjectMeta::default()
        },
        involved_object: ObjectReference {
            kind: involved.kind,
            namespace: involved.namespace,
            name: involved.name,
            uid: involved.uid,
            api_version: involved.api_version,
            resource_version: involved.resource_version,
            field_path: involved.field_path,
        },
        reason: wire.reason,
        message: wire.message,
        source: wire.source.map(|source| EventSource {
            component: source.component,
            host: source.host,
        }),
        first_timestamp: wire.first_timestamp.and_then(WireTime::to_time),
        last_timestamp: wire.last_timestamp.and_then(WireTime::to_time),
        count: wire.count,
        type_: wire.type_,
        reporting_component: wire.reporting_component,
        reporting_instance: wire.reporting_instance,
        ..Event::default()
    })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::EventSource;
    use k8s_openapi::jiff::Timestamp;

    use super::*;
    use crate::controller::runtime::events::{EventType, core_event};

    #[test]
    fn an_event_reads_back_as_it_was_written() {
        let regarding = ObjectReference {
            kind: Some("PersistentVolumeClaim".to_owned()),
            namespace: Some("ns".to_owned()),
            name: Some("claim".to_owned()),
            uid: Some("u-1".to_owned()),
            api_version: Some("v1".to_owned()),
            resource_version: Some("7".to_owned()),
            field_path: None,
        };
        let at = Timestamp::from_second(1_700_000_000).unwrap();
        let source = EventSource {
            component: Some("driver_host_x".to_owned()),
            host: Some("host".to_owned()),
        };
        let event = core_event(
            &regarding,
            EventType::Warning,
            "ProvisioningFailed",
            "no space",
            at,
            &source,
        );
        assert_eq!(decode(&encode(&event)).unwrap(), event);
    }
}
