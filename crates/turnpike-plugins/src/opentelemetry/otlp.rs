//! OTLP's protobuf messages for traces (`opentelemetry/proto/trace/v1/trace.proto` and the
//! collector's `ExportTraceServiceRequest`), written by hand: a span is encoded once, in the log
//! phase, and a batch is the resource's envelope around the encoded spans.

use bytes::Bytes;

/// A span as Kong's `transform_span` gives it.
pub struct Span<'a> {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub parent_span_id: Option<[u8; 8]>,
    pub name: &'a str,
    /// 2: SERVER.
    pub kind: u64,
    pub start_ns: u64,
    pub end_ns: u64,
    pub attributes: &'a [(&'a str, Value<'a>)],
    /// 0: unset, 2: error.
    pub status: u64,
}

pub enum Value<'a> {
    Str(&'a str),
    Int(i64),
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn tag(out: &mut Vec<u8>, field: u32, wire: u8) {
    varint(out, ((field as u64) << 3) | wire as u64);
}

fn bytes_field(out: &mut Vec<u8>, field: u32, b: &[u8]) {
    tag(out, field, 2);
    varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// A length-delimited field whose contents `f` writes.
fn message(out: &mut Vec<u8>, field: u32, f: impl FnOnce(&mut Vec<u8>)) {
    let mut inner = Vec::new();
    f(&mut inner);
    bytes_field(out, field, &inner);
}

fn key_value(out: &mut Vec<u8>, field: u32, key: &str, value: &Value<'_>) {
    message(out, field, |kv| {
        bytes_field(kv, 1, key.as_bytes());
        message(kv, 2, |any| match value {
            Value::Str(s) => bytes_field(any, 1, s.as_bytes()),
            Value::Int(i) => {
                tag(any, 3, 0);
                varint(any, *i as u64);
            }
        });
    });
}

/// One `Span` message.
pub fn encode_span(s: &Span<'_>) -> Bytes {
    let mut out = Vec::with_capacity(256);
    bytes_field(&mut out, 1, &s.trace_id);
    bytes_field(&mut out, 2, &s.span_id);
    if let Some(p) = &s.parent_span_id {
        bytes_field(&mut out, 4, p);
    }
    bytes_field(&mut out, 5, s.name.as_bytes());
    tag(&mut out, 6, 0);
    varint(&mut out, s.kind);
    tag(&mut out, 7, 1);
    out.extend_from_slice(&s.start_ns.to_le_bytes());
    tag(&mut out, 8, 1);
    out.extend_from_slice(&s.end_ns.to_le_bytes());
    for (k, v) in s.attributes {
        key_value(&mut out, 9, k, v);
    }
    if s.status != 0 {
        message(&mut out, 15, |st| {
            tag(st, 3, 0);
            varint(st, s.status);
        });
    }
    Bytes::from(out)
}

/// The `Resource` message of a config's resource attributes, built once per config.
pub fn encode_resource(attributes: &[(String, String)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in attributes {
        key_value(&mut out, 1, k, &Value::Str(v));
    }
    out
}

/// An `ExportTraceServiceRequest` of encoded spans under one resource and Kong's scope.
pub fn encode_request(resource: &[u8], spans: &[Bytes]) -> Bytes {
    let mut out =
        Vec::with_capacity(resource.len() + spans.iter().map(|s| s.len() + 4).sum::<usize>() + 64);
    message(&mut out, 1, |rs| {
        bytes_field(rs, 1, resource);
        message(rs, 2, |ss| {
            message(ss, 1, |scope| {
                bytes_field(scope, 1, b"kong-internal");
                bytes_field(scope, 2, b"0.1.0");
            });
            for s in spans {
                bytes_field(ss, 2, s);
            }
        });
    });
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_and_fields_are_protobuf() {
        let mut v = Vec::new();
        varint(&mut v, 300);
        assert_eq!(v, [0xac, 0x02]);
        let mut v = Vec::new();
        bytes_field(&mut v, 5, b"kong");
        assert_eq!(v, [0x2a, 4, b'k', b'o', b'n', b'g']);
        let s = encode_span(&Span {
            trace_id: [1; 16],
            span_id: [2; 8],
            parent_span_id: None,
            name: "kong",
            kind: 2,
            start_ns: 1,
            end_ns: 2,
            attributes: &[("http.status_code", Value::Int(200))],
            status: 0,
        });
        // trace id field first: tag 0x0a, length 16.
        assert_eq!(&s[..2], &[0x0a, 16]);
        assert!(s.windows(4).any(|w| w == b"kong"));
    }
}
