//! The Kubernetes protobuf wire format, for the built-in kinds the sidecar reads most (claims,
//! PVs, VolumeAttachments) and the events it writes. Upstream's core client asks for protobuf;
//! the API server encodes it at a fraction of JSON's cost and it is cheaper to decode.
//!
//! Facts of the format (k8s.io/apimachinery, pkg/runtime/serializer/protobuf): an object is
//! the four bytes `k8s\0`, then a `runtime.Unknown` whose `raw` is the object's own message. A
//! watch answer is a sequence of frames, each a 4-byte big-endian length and then an enveloped
//! `meta.v1.WatchEvent` whose `object.raw` holds the enveloped object. Errors are `Status`
//! objects, in the same envelope.
//!
//! The messages here carry only the fields the sidecar reads; prost skips the others on the
//! wire without allocating them (`managedFields` above all), as the JSON path's `Wire*` types
//! do. Field numbers are those of the kinds' `generated.proto`.

use std::collections::BTreeMap;

use futures::{AsyncRead, AsyncReadExt};
use http_body_util::BodyExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Client;
use kube::client::Body;
use kube::core::Status;
use prost::Message;
use tracing::warn;

mod utf8;

/// What the sidecar asks for where protobuf is served: protobuf, else JSON (an API server
/// answers an error it builds itself, e.g. from an aggregator or a proxy, in JSON).
pub const ACCEPT: &str = "application/vnd.kubernetes.protobuf, application/json";
/// The media type of a watch stream in protobuf frames.
pub const ACCEPT_WATCH: &str = "application/vnd.kubernetes.protobuf;stream=watch";
pub const CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf";
const MAGIC: &[u8; 4] = b"k8s\0";
/// Largest watch frame accepted: etcd refuses objects above 1.5 MiB, so a frame this large is
/// a broken stream, not an object.
const MAX_FRAME: usize = 16 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ProtobufError {
    #[error("the answer is not a Kubernetes protobuf object (no k8s\\0 prefix)")]
    NoEnvelope,
    #[error("cannot decode the {what}: {source}")]
    Decode {
        what: &'static str,
        #[source]
        source: prost::DecodeError,
    },
    #[error("a watch frame of {0} bytes, above the limit of {MAX_FRAME}")]
    FrameTooLarge(usize),
    #[error("a watch event of unknown type {0:?}")]
    EventType(String),
    #[error("a watch event without an object")]
    NoObject,
    #[error("cannot keep the {kind} {name}: {source}")]
    Keep {
        kind: &'static str,
        name: String,
        #[source]
        source: serde_json::Error,
    },
}

fn decode<M: Message + Default>(what: &'static str, bytes: &[u8]) -> Result<M, ProtobufError> {
    M::decode(bytes).map_err(|source| ProtobufError::Decode { what, source })
}

/// A kind the sidecar decodes from protobuf, from its message (inside the envelope).
pub trait FromProtobuf: Sized {
    fn from_protobuf(message: &[u8]) -> Result<Self, ProtobufError>;
}

#[derive(Clone, PartialEq, Message)]
pub struct TypeMeta {
    #[prost(string, tag = "1")]
    pub api_version: String,
    #[prost(string, tag = "2")]
    pub kind: String,
}

/// `runtime.Unknown`: the envelope's body.
#[derive(Clone, PartialEq, Message)]
struct Unknown {
    #[prost(message, optional, tag = "1")]
    type_meta: Option<TypeMeta>,
    #[prost(bytes = "vec", tag = "2")]
    raw: Vec<u8>,
}

/// The object's own message inside `k8s\0` + `runtime.Unknown`, with its kind.
pub fn open_envelope(bytes: &[u8]) -> Result<(TypeMeta, Vec<u8>), ProtobufError> {
    let body = bytes.strip_prefix(MAGIC).ok_or(ProtobufError::NoEnvelope)?;
    let unknown: Unknown = decode("envelope", body)?;
    Ok((unknown.type_meta.unwrap_or_default(), unknown.raw))
}

/// `message` of kind `api_version`/`kind`, enveloped for a request body.
pub fn seal_envelope(api_version: &str, kind: &str, message: &impl Message) -> Vec<u8> {
    let unknown = Unknown {
        type_meta: Some(TypeMeta {
            api_version: api_version.to_owned(),
            kind: kind.to_owned(),
        }),
        raw: message.encode_to_vec(),
    };
    let mut bytes = Vec::with_capacity(MAGIC.len() + unknown.encoded_len());
    bytes.extend_from_slice(MAGIC);
    unknown.encode(&mut bytes).expect("a Vec grows as needed");
    bytes
}

#[derive(Clone, PartialEq, Message)]
struct ListMeta {
    #[prost(string, tag = "2")]
    resource_version: String,
    #[prost(string, tag = "3")]
    continue_: String,
}

/// Any `…List`: its items stay undecoded (an embedded message and `bytes` are the same on
/// the wire), for the kind's own decoder.
#[derive(Clone, PartialEq, Message)]
struct List {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ListMeta>,
    #[prost(bytes = "vec", repeated, tag = "2")]
    items: Vec<Vec<u8>>,
}

/// A list answer: its resource version, continue token and items.
pub struct ListPage<K> {
    pub resource_version: String,
    pub continue_token: String,
    pub items: Vec<K>,
}

/// Decodes a list answer. An item that cannot be decoded is left out with a warning naming it:
/// it must not hide the others (the list is the whole view of the kind).
pub fn decode_list<K: FromProtobuf>(bytes: &[u8]) -> Result<ListPage<K>, ProtobufError> {
    let (_, raw) = open_envelope(bytes)?;
    let list: List = decode("list", &raw)?;
    let metadata = list.metadata.unwrap_or_default();
    let mut items = Vec::with_capacity(list.items.len());
    for item in &list.items {
        match decode_kind(item) {
            Ok(object) => items.push(object),
            Err(error) => warn!(
                object = item_name(item),
                %error,
                "a listed object cannot be decoded; left out of the list"
            ),
        }
    }
    Ok(ListPage {
        resource_version: metadata.resource_version,
        continue_token: metadata.continue_,
        items,
    })
}

/// Decodes one object answer (a GET).
pub fn decode_object<K: FromProtobuf>(bytes: &[u8]) -> Result<K, ProtobufError> {
    let (_, raw) = open_envelope(bytes)?;
    decode_kind(&raw)
}

/// Decodes an object's message as the API server's JSON shows it: a string that is not UTF-8
/// reads with U+FFFD for each invalid byte ([`utf8`]) rather than failing the object.
fn decode_kind<K: FromProtobuf>(message: &[u8]) -> Result<K, ProtobufError> {
    K::from_protobuf(message).or_else(|error| match utf8::repair(message) {
        Some(repaired) if repaired != message => K::from_protobuf(&repaired).map_err(|_| error),
        _ => Err(error),
    })
}

/// Just the name of an object's message, for a warning about it (prost skips, without reading
/// them, the fields a message does not declare).
#[derive(Clone, PartialEq, Message)]
struct ItemName {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ItemMeta>,
}

#[derive(Clone, PartialEq, Message)]
struct ItemMeta {
    #[prost(bytes = "vec", tag = "1")]
    name: Vec<u8>,
    #[prost(bytes = "vec", tag = "3")]
    namespace: Vec<u8>,
}

/// `namespace/name` (or `name`) of an object's message, as far as it can be read.
fn item_name(message: &[u8]) -> String {
    let meta = ItemName::decode(message)
        .ok()
        .and_then(|named| named.metadata)
        .unwrap_or_default();
    let name = String::from_utf8_lossy(&meta.name);
    match String::from_utf8_lossy(&meta.namespace) {
        namespace if namespace.is_empty() => name.into_owned(),
        namespace => format!("{namespace}/{name}"),
    }
}

#[derive(Clone, PartialEq, Message)]
struct RawExtension {
    #[prost(bytes = "vec", tag = "1")]
    raw: Vec<u8>,
}

#[derive(Clone, PartialEq, Message)]
struct WireWatchEvent {
    #[prost(string, tag = "1")]
    type_: String,
    #[prost(message, optional, tag = "2")]
    object: Option<RawExtension>,
}

/// The metadata a bookmark carries.
#[derive(Clone, PartialEq, Message)]
struct BookmarkObject {
    #[prost(message, optional, tag = "1")]
    metadata: Option<ObjectMeta>,
}

/// A watch event, decoded.
#[derive(Debug)]
pub enum WatchEvent<K> {
    Added(K),
    Modified(K),
    Deleted(K),
    /// The resource version reached, and whether it closes the initial events of a
    /// streamed list (the annotation `k8s.io/initial-events-end`).
    Bookmark {
        resource_version: String,
        initial_events_end: bool,
    },
    Error(Box<Status>),
}

const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// Decodes one frame of a watch stream.
pub fn decode_watch_event<K: FromProtobuf>(frame: &[u8]) -> Result<WatchEvent<K>, ProtobufError> {
    // The frame is an enveloped WatchEvent; accept a bare one as well.
    let event: WireWatchEvent = match open_envelope(frame) {
        Ok((_, raw)) => decode("watch event", &raw)?,
        Err(ProtobufError::NoEnvelope) => decode("watch event", frame)?,
        Err(error) => return Err(error),
    };
    let raw = event.object.ok_or(ProtobufError::NoObject)?.raw;
    let message = match open_envelope(&raw) {
        Ok((_, message)) => message,
        Err(ProtobufError::NoEnvelope) => raw,
        Err(error) => return Err(error),
    };
    Ok(match event.type_.as_str() {
        "ADDED" => WatchEvent::Added(decode_kind(&message)?),
        "MODIFIED" => WatchEvent::Modified(decode_kind(&message)?),
        "DELETED" => WatchEvent::Deleted(decode_kind(&message)?),
        "BOOKMARK" => {
            let metadata = decode::<BookmarkObject>("bookmark", &message)?
                .metadata
                .unwrap_or_default();
            WatchEvent::Bookmark {
                initial_events_end: metadata
                    .annotations
                    .get(INITIAL_EVENTS_END)
                    .is_some_and(|value| value == "true"),
                resource_version: metadata.resource_version.unwrap_or_default(),
            }
        }
        "ERROR" => WatchEvent::Error(Box::new(decode_status_message(&message)?)),
        _ => return Err(ProtobufError::EventType(event.type_)),
    })
}

/// Sends `request` asking for `accept`. An error answer becomes `kube::Error::Api` with the
/// API server's `Status`, whichever encoding it came in (kube's own path reads JSON only).
pub async fn send(
    client: &Client,
    request: http::Request<Vec<u8>>,
    accept: &'static str,
) -> Result<Body, kube::Error> {
    let (mut parts, body) = request.into_parts();
    parts
        .headers
        .insert(http::header::ACCEPT, http::HeaderValue::from_static(accept));
    let response = client
        .send(http::Request::from_parts(parts, Body::from(body)))
        .await?;
    let code = response.status();
    if code.is_success() {
        return Ok(response.into_body());
    }
    let body = collect(response.into_body()).await?;
    Err(kube::Error::Api(Box::new(error_status(
        code.as_u16(),
        &body,
    ))))
}

/// Sends a write whose answer the caller has no use for (the object as stored), asking for
/// protobuf, which the API server encodes at a fraction of JSON's cost, and parsing none of it.
/// Errors come back as with [`send`].
pub async fn write_unread(
    client: &Client,
    request: http::Request<Vec<u8>>,
) -> Result<(), kube::Error> {
    let body = send(client, request, ACCEPT).await?;
    collect(body).await.map(drop)
}

/// The whole body of an answer.
pub async fn collect(body: Body) -> Result<bytes::Bytes, kube::Error> {
    Ok(body
        .collect()
        .await
        .map_err(|error| kube::Error::Service(error.into()))?
        .to_bytes())
}

/// Reads the next frame of a watch stream; `None` at its end.
pub async fn read_frame(stream: &mut (impl AsyncRead + Unpin)) -> std::io::Result<Option<Vec<u8>>> {
    let mut length = [0u8; 4];
    // The end of the stream between frames is its normal end.
    let mut read = 0;
    while read < length.len() {
        match stream.read(&mut length[read..]).await? {
            0 if read == 0 => return Ok(None),
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            n => read += n,
        }
    }
    let length = u32::from_be_bytes(length) as usize;
    if length > MAX_FRAME {
        return Err(std::io::Error::other(ProtobufError::FrameTooLarge(length)));
    }
    let mut frame = vec![0u8; length];
    stream.read_exact(&mut frame).await?;
    Ok(Some(frame))
}

#[derive(Clone, PartialEq, Message)]
struct WireStatus {
    #[prost(string, tag = "2")]
    status: String,
    #[prost(string, tag = "3")]
    message: String,
    #[prost(string, tag = "4")]
    reason: String,
    #[prost(int32, tag = "6")]
    code: i32,
}

fn decode_status_message(message: &[u8]) -> Result<Status, ProtobufError> {
    let wire: WireStatus = decode("status", message)?;
    Ok(Status {
        status: match wire.status.as_str() {
            "Success" => Some(kube::core::response::StatusSummary::Success),
            "Failure" => Some(kube::core::response::StatusSummary::Failure),
            _ => None,
        },
        message: wire.message,
        reason: wire.reason,
        code: u16::try_from(wire.code).unwrap_or_default(),
        ..Status::default()
    })
}

/// The `Status` of an error answer with HTTP status `code`: protobuf or JSON as the API server
/// chose, or the body's text if it is neither (a proxy's page).
pub fn error_status(code: u16, body: &[u8]) -> Status {
    let decoded = match open_envelope(body) {
        Ok((_, message)) => decode_status_message(&message).ok(),
        Err(_) => serde_json::from_slice::<Status>(body).ok(),
    };
    match decoded {
        Some(status) if status.code != 0 => status,
        Some(status) => Status { code, ..status },
        None => Status::failure(String::from_utf8_lossy(body).trim(), "").with_code(code),
    }
}

/// `meta.v1.Time`. The JSON form has whole seconds only; so does this, to read the same.
#[derive(Clone, Copy, PartialEq, Message)]
pub struct WireTime {
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

impl WireTime {
    pub fn to_time(self) -> Option<Time> {
        k8s_openapi::jiff::Timestamp::from_second(self.seconds)
            .ok()
            .map(Time)
    }

    pub fn from_time(time: &Time) -> Self {
        WireTime {
            seconds: time.0.as_second(),
            nanos: 0,
        }
    }
}

/// The `ObjectMeta` fields the sidecar reads (the same as the JSON path's).
#[derive(Clone, PartialEq, Message)]
pub struct ObjectMeta {
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    #[prost(string, optional, tag = "3")]
    pub namespace: Option<String>,
    #[prost(string, optional, tag = "5")]
    pub uid: Option<String>,
    #[prost(string, optional, tag = "6")]
    pub resource_version: Option<String>,
    #[prost(message, optional, tag = "9")]
    pub deletion_timestamp: Option<WireTime>,
    #[prost(btree_map = "string, string", tag = "12")]
    pub annotations: BTreeMap<String, String>,
    #[prost(string, repeated, tag = "14")]
    pub finalizers: Vec<String>,
}

/// Go's `string` fields with `omitempty` are left out of JSON when empty, but always written in
/// protobuf: an empty one reads as absent, as it does from JSON.
pub fn non_empty(value: Option<String>) -> Option<String> {
    value.filter(|value| !value.is_empty())
}

/// An empty list or map reads as absent, as it does from JSON (`omitempty`).
pub fn non_empty_vec<T>(values: Vec<T>) -> Option<Vec<T>> {
    (!values.is_empty()).then_some(values)
}

pub fn non_empty_map<V>(values: BTreeMap<String, V>) -> Option<BTreeMap<String, V>> {
    (!values.is_empty()).then_some(values)
}

#[cfg(test)]
mod tests;
