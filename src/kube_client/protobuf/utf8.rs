//! Strings that are not UTF-8, read as the API server's JSON shows them.
//!
//! A Go `string` holds any bytes, and a client that writes protobuf can store such a string in a
//! field the API server does not validate (an annotation's value, a CSI volume attribute). The
//! API server's JSON encoding (Go's `encoding/json`) writes each byte that is not part of valid
//! UTF-8 as U+FFFD; prost refuses the whole message instead, and with it the object. Without
//! the message's schema at hand, [`repair`] walks the wire format: a length-delimited field
//! that is valid UTF-8 stays as it is, one that parses as a message is repaired inside, and any
//! other is a string and gets Go's replacement. A string whose bytes also parse as a message
//! stays unrepaired, and the object is reported as undecodable (its own object only).

use prost::bytes::Buf;
use prost::encoding::{decode_varint, encode_varint};

/// Nesting deeper than any built-in kind's (a PV's node affinity is about 8 levels).
const MAX_DEPTH: usize = 32;

/// `message` with every invalid UTF-8 byte of its strings replaced, or `None` if it is not a
/// well-formed message.
pub fn repair(message: &[u8]) -> Option<Vec<u8>> {
    repair_at(message, 0)
}

fn repair_at(message: &[u8], depth: usize) -> Option<Vec<u8>> {
    let mut rest = message;
    let mut out = Vec::with_capacity(message.len());
    while rest.has_remaining() {
        let key = decode_varint(&mut rest).ok()?;
        if key >> 3 == 0 {
            return None;
        }
        encode_varint(key, &mut out);
        let fixed = match key & 7 {
            0 => {
                let value = decode_varint(&mut rest).ok()?;
                encode_varint(value, &mut out);
                continue;
            }
            1 => 8,
            5 => 4,
            2 => {
                let length = usize::try_from(decode_varint(&mut rest).ok()?).ok()?;
                let field = rest.get(..length)?;
                rest = &rest[length..];
                let repaired = if std::str::from_utf8(field).is_ok() {
                    None
                } else if depth < MAX_DEPTH
                    && let Some(inner) = repair_at(field, depth + 1)
                {
                    Some(inner)
                } else {
                    Some(go_lossy(field))
                };
                let field = repaired.as_deref().unwrap_or(field);
                encode_varint(field.len() as u64, &mut out);
                out.extend_from_slice(field);
                continue;
            }
            // Groups (3, 4) are not in any Kubernetes message.
            _ => return None,
        };
        out.extend_from_slice(rest.get(..fixed)?);
        rest = &rest[fixed..];
    }
    Some(out)
}

/// Go's `encoding/json` rule: every byte that does not start a valid UTF-8 sequence becomes
/// U+FFFD (one per byte, where Rust's `from_utf8_lossy` writes one per invalid sequence).
fn go_lossy(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len() + 8);
    for chunk in bytes.utf8_chunks() {
        out.extend_from_slice(chunk.valid().as_bytes());
        for _ in chunk.invalid() {
            out.extend_from_slice("\u{FFFD}".as_bytes());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[derive(Clone, PartialEq, prost::Message)]
    struct Inner {
        #[prost(bytes = "vec", tag = "1")]
        text: Vec<u8>,
        #[prost(btree_map = "string, bytes", tag = "2")]
        map: BTreeMap<String, Vec<u8>>,
        #[prost(int64, tag = "3")]
        number: i64,
        #[prost(fixed64, tag = "4")]
        fixed: u64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    struct Outer {
        #[prost(message, optional, tag = "1")]
        inner: Option<Inner>,
        #[prost(bytes = "vec", tag = "2")]
        text: Vec<u8>,
    }

    /// The same messages read with strings, as the decoders declare them.
    #[derive(Clone, PartialEq, prost::Message)]
    struct InnerText {
        #[prost(string, tag = "1")]
        text: String,
        #[prost(btree_map = "string, string", tag = "2")]
        map: BTreeMap<String, String>,
        #[prost(int64, tag = "3")]
        number: i64,
        #[prost(fixed64, tag = "4")]
        fixed: u64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    struct OuterText {
        #[prost(message, optional, tag = "1")]
        inner: Option<InnerText>,
        #[prost(string, tag = "2")]
        text: String,
    }

    fn encoded(text: &[u8], value: &[u8], outer: &[u8]) -> Vec<u8> {
        use prost::Message;
        Outer {
            inner: Some(Inner {
                text: text.to_vec(),
                map: BTreeMap::from([("key".to_owned(), value.to_vec())]),
                number: -300,
                fixed: u64::MAX,
            }),
            text: outer.to_vec(),
        }
        .encode_to_vec()
    }

    #[test]
    fn invalid_bytes_in_nested_strings_read_as_go_writes_them_in_json() {
        use prost::Message;
        let message = encoded(b"ok \xff\xfe end", b"\xe2\x82 truncated", b"caf\xe9");
        assert!(OuterText::decode(message.as_slice()).is_err());
        let repaired = repair(&message).expect("a well-formed message");
        let read = OuterText::decode(repaired.as_slice()).expect("valid UTF-8 after repair");
        let inner = read.inner.expect("inner kept");
        assert_eq!(inner.text, "ok \u{FFFD}\u{FFFD} end");
        assert_eq!(inner.map["key"], "\u{FFFD}\u{FFFD} truncated");
        assert_eq!((inner.number, inner.fixed), (-300, u64::MAX));
        assert_eq!(read.text, "caf\u{FFFD}");
    }

    #[test]
    fn a_valid_message_is_left_as_it_is() {
        let message = encoded("naïve ✓".as_bytes(), b"plain", b"");
        assert_eq!(repair(&message).as_deref(), Some(message.as_slice()));
    }

    #[test]
    fn what_is_not_a_message_is_refused() {
        // A length beyond the end, a zero field number, a group.
        assert_eq!(repair(&[0x0a, 0x05, b'a']), None);
        assert_eq!(repair(&[0x00, 0x01]), None);
        assert_eq!(repair(&[0x0b]), None);
        assert_eq!(repair(&[]), Some(Vec::new()));
    }

    #[test]
    fn go_replaces_each_invalid_byte() {
        assert_eq!(go_lossy(b"a\xe2\x82b"), "a\u{FFFD}\u{FFFD}b".as_bytes());
        assert_eq!(
            go_lossy(b"\xed\xa0\x80"),
            "\u{FFFD}\u{FFFD}\u{FFFD}".as_bytes()
        );
        assert_eq!(go_lossy("é".as_bytes()), "é".as_bytes());
    }
}
