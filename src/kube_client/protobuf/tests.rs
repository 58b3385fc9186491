use futures::io::Cursor;

use super::*;

/// A kind for the tests: the object's name only.
#[derive(Debug, PartialEq)]
struct Named(String);

impl FromProtobuf for Named {
    fn from_protobuf(message: &[u8]) -> Result<Self, ProtobufError> {
        let object: BookmarkObject = decode("object", message)?;
        Ok(Named(
            object.metadata.unwrap_or_default().name.unwrap_or_default(),
        ))
    }
}

fn object(name: &str, annotations: &[(&str, &str)]) -> BookmarkObject {
    BookmarkObject {
        metadata: Some(ObjectMeta {
            name: Some(name.to_owned()),
            resource_version: Some("42".to_owned()),
            annotations: annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..ObjectMeta::default()
        }),
    }
}

fn frame_of(type_: &str, message: &impl Message) -> Vec<u8> {
    let event = WireWatchEvent {
        type_: type_.to_owned(),
        object: Some(RawExtension {
            raw: seal_envelope("v1", "Thing", message),
        }),
    };
    seal_envelope("meta.k8s.io/v1", "WatchEvent", &event)
}

fn framed(frames: &[Vec<u8>]) -> Vec<u8> {
    let mut bytes = Vec::new();
    for frame in frames {
        bytes.extend_from_slice(&u32::try_from(frame.len()).unwrap().to_be_bytes());
        bytes.extend_from_slice(frame);
    }
    bytes
}

#[test]
fn an_envelope_opens_to_what_was_sealed() {
    let sealed = seal_envelope("v1", "Thing", &object("a", &[]));
    assert_eq!(&sealed[..4], b"k8s\0");
    let (type_meta, raw) = open_envelope(&sealed).unwrap();
    assert_eq!(
        (type_meta.api_version.as_str(), type_meta.kind.as_str()),
        ("v1", "Thing")
    );
    assert_eq!(Named::from_protobuf(&raw).unwrap(), Named("a".to_owned()));
    assert!(matches!(
        open_envelope(b"{\"kind\":\"Status\"}"),
        Err(ProtobufError::NoEnvelope)
    ));
}

#[test]
fn a_list_decodes_its_items_and_resource_version() {
    let list = List {
        metadata: Some(ListMeta {
            resource_version: "7".to_owned(),
            continue_: String::new(),
        }),
        items: vec![
            object("a", &[]).encode_to_vec(),
            object("b", &[]).encode_to_vec(),
        ],
    };
    let page: ListPage<Named> = decode_list(&seal_envelope("v1", "ThingList", &list)).unwrap();
    assert_eq!(page.resource_version, "7");
    assert_eq!(page.items, [Named("a".to_owned()), Named("b".to_owned())]);
}

#[test]
fn watch_events_decode_by_type() {
    let added = decode_watch_event::<Named>(&frame_of("ADDED", &object("a", &[]))).unwrap();
    assert!(matches!(added, WatchEvent::Added(Named(name)) if name == "a"));
    let deleted = decode_watch_event::<Named>(&frame_of("DELETED", &object("b", &[]))).unwrap();
    assert!(matches!(deleted, WatchEvent::Deleted(Named(name)) if name == "b"));

    let end = object("", &[(INITIAL_EVENTS_END, "true")]);
    let bookmark = decode_watch_event::<Named>(&frame_of("BOOKMARK", &end)).unwrap();
    assert!(matches!(
        bookmark,
        WatchEvent::Bookmark { resource_version, initial_events_end: true } if resource_version == "42"
    ));
    let plain = decode_watch_event::<Named>(&frame_of("BOOKMARK", &object("", &[]))).unwrap();
    assert!(matches!(
        plain,
        WatchEvent::Bookmark {
            initial_events_end: false,
            ..
        }
    ));

    let gone = WireStatus {
        status: "Failure".to_owned(),
        message: "too old resource version".to_owned(),
        reason: "Expired".to_owned(),
        code: 410,
    };
    let error = decode_watch_event::<Named>(&frame_of("ERROR", &gone)).unwrap();
    assert!(
        matches!(error, WatchEvent::Error(status) if status.code == 410 && status.reason == "Expired")
    );

    assert!(matches!(
        decode_watch_event::<Named>(&frame_of("RENAMED", &object("a", &[]))),
        Err(ProtobufError::EventType(type_)) if type_ == "RENAMED"
    ));
    assert!(decode_watch_event::<Named>(b"k8s\0\xff\xff").is_err());
}

#[tokio::test]
async fn frames_are_read_whole_and_the_stream_ends_between_them() {
    let bytes = framed(&[b"one".to_vec(), Vec::new(), b"three".to_vec()]);
    let mut stream = Cursor::new(bytes);
    assert_eq!(read_frame(&mut stream).await.unwrap().unwrap(), b"one");
    assert_eq!(read_frame(&mut stream).await.unwrap().unwrap(), b"");
    assert_eq!(read_frame(&mut stream).await.unwrap().unwrap(), b"three");
    assert!(read_frame(&mut stream).await.unwrap().is_none());
}

#[tokio::test]
async fn a_cut_frame_or_an_absurd_length_is_an_error() {
    let mut cut = framed(&[b"whole".to_vec()]);
    cut.truncate(6);
    assert!(read_frame(&mut Cursor::new(cut)).await.is_err());
    let mut cut_length = Cursor::new(vec![0u8, 0]);
    assert!(read_frame(&mut cut_length).await.is_err());
    let huge = (u32::MAX).to_be_bytes().to_vec();
    assert!(read_frame(&mut Cursor::new(huge)).await.is_err());
}

#[test]
fn error_answers_read_in_either_encoding() {
    let forbidden = WireStatus {
        status: "Failure".to_owned(),
        message: "nope".to_owned(),
        reason: "Forbidden".to_owned(),
        code: 403,
    };
    let status = error_status(403, &seal_envelope("v1", "Status", &forbidden));
    assert_eq!((status.code, status.reason.as_str()), (403, "Forbidden"));
    assert!(status.is_forbidden());

    let json = br#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"gone","reason":"Gone","code":410}"#;
    let status = error_status(410, json);
    assert_eq!((status.code, status.message.as_str()), (410, "gone"));

    let status = error_status(502, b"<html>bad gateway</html>");
    assert_eq!(status.code, 502);
    assert!(status.message.contains("bad gateway"));
}

#[test]
fn times_keep_whole_seconds_as_json_does() {
    let time = WireTime {
        seconds: 1_700_000_000,
        nanos: 5,
    }
    .to_time()
    .unwrap();
    assert_eq!(time.0.as_second(), 1_700_000_000);
    assert_eq!(time.0.subsec_nanosecond(), 0);
    assert_eq!(WireTime::from_time(&time).seconds, 1_700_000_000);
}

/// An object whose annotation values are any bytes, as a client writing protobuf can store.
#[derive(Clone, PartialEq, Message)]
struct RawObject {
    #[prost(message, optional, tag = "1")]
    metadata: Option<RawMeta>,
}

#[derive(Clone, PartialEq, Message)]
struct RawMeta {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(string, tag = "3")]
    namespace: String,
    #[prost(btree_map = "string, bytes", tag = "12")]
    annotations: BTreeMap<String, Vec<u8>>,
}

fn raw_object(name: &str, value: &[u8]) -> RawObject {
    RawObject {
        metadata: Some(RawMeta {
            name: name.to_owned(),
            namespace: "ns".to_owned(),
            annotations: BTreeMap::from([("note".to_owned(), value.to_vec())]),
        }),
    }
}

/// A kind for the tests that keeps the annotations.
#[derive(Debug, PartialEq)]
struct Annotated(String, BTreeMap<String, String>);

impl FromProtobuf for Annotated {
    fn from_protobuf(message: &[u8]) -> Result<Self, ProtobufError> {
        let meta = decode::<BookmarkObject>("object", message)?
            .metadata
            .unwrap_or_default();
        Ok(Annotated(meta.name.unwrap_or_default(), meta.annotations))
    }
}

#[test]
fn a_string_that_is_not_utf8_reads_as_the_json_of_the_api_server_and_hides_nothing() {
    let list = List {
        metadata: Some(ListMeta {
            resource_version: "7".to_owned(),
            continue_: String::new(),
        }),
        items: vec![
            raw_object("before", b"plain").encode_to_vec(),
            raw_object("odd", b"caf\xe9 \xff").encode_to_vec(),
            // Not a message at all: left out, the others kept.
            vec![0x0a, 0x7f, b'x'],
            raw_object("after", b"plain").encode_to_vec(),
        ],
    };
    let page: ListPage<Annotated> = decode_list(&seal_envelope("v1", "ThingList", &list)).unwrap();
    let names: Vec<_> = page.items.iter().map(|item| item.0.as_str()).collect();
    assert_eq!(names, ["before", "odd", "after"]);
    assert_eq!(page.items[1].1["note"], "caf\u{FFFD} \u{FFFD}");

    let modified =
        decode_watch_event::<Annotated>(&frame_of("MODIFIED", &raw_object("odd", b"\xe2\x82")))
            .unwrap();
    assert!(matches!(
        modified,
        WatchEvent::Modified(Annotated(name, notes)) if name == "odd" && notes["note"] == "\u{FFFD}\u{FFFD}"
    ));
    let single =
        decode_object::<Annotated>(&seal_envelope("v1", "Thing", &raw_object("odd", b"\x80")));
    assert_eq!(single.unwrap().1["note"], "\u{FFFD}");
    assert_eq!(
        item_name(&raw_object("odd", b"\x80").encode_to_vec()),
        "ns/odd"
    );
}
