//! A core/v1 Event as protobuf, with the fields `core_event` sets (tags of k8s.io/api's
//! `core/v1/generated.proto`). The API server decodes and answers protobuf at a fraction of
//! JSON's cost, and the writer reads nothing of the answer but its status.

use k8s_openapi::api::core::v1::{Event, ObjectReference};
use prost::Message;

use crate::kube_client::protobuf::{ObjectMeta, WireTime, seal_envelope};

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
