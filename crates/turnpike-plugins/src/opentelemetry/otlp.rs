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
    /// A string written from its pieces (a URL from scheme, host and target).
    Concat(&'a [&'a str]),
    Int(i64),
}

#[inline]
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

fn varint_len(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

/// A length-delimited field's bytes: its tag, its length and the contents (tags here are one
/// byte: fields below 16).
fn field_len(len: usize) -> usize {
    1 + varint_len(len as u64) + len
}

/// The sizes of a `KeyValue`: its `AnyValue`'s and its own (without its tag and length).
fn key_value_len(key: &str, value: &Value<'_>) -> (usize, usize) {
    let any_len = match value {
        Value::Str(s) => field_len(s.len()),
        Value::Concat(parts) => field_len(parts.iter().map(|p| p.len()).sum()),
        Value::Int(i) => 1 + varint_len(*i as u64),
    };
    (any_len, field_len(key.len()) + field_len(any_len))
}

/// A `KeyValue` written in place: its sizes are computed, no buffer per level.
#[inline(always)]
fn key_value(out: &mut Vec<u8>, field: u32, key: &str, value: &Value<'_>) {
    // The common case, a short attribute: every tag and length is one byte (sizes by plain
    // sums), written a few at a time around the texts.
    let text = match value {
        Value::Str(s) => s.len(),
        Value::Concat(parts) => parts.iter().map(|p| p.len()).sum(),
        Value::Int(i) => 9 + varint_len(*i as u64),
    };
    if key.len() + text < 0x78 && field < 16 {
        let any_len = match value {
            Value::Int(i) => 1 + varint_len(*i as u64),
            _ => 2 + text,
        };
        let kv_len = 2 + key.len() + 2 + any_len;
        out.extend_from_slice(&[
            ((field << 3) | 2) as u8,
            kv_len as u8,
            0x0a,
            key.len() as u8,
        ]);
        out.extend_from_slice(key.as_bytes());
        match value {
            Value::Str(s) => {
                out.extend_from_slice(&[0x12, any_len as u8, 0x0a, s.len() as u8]);
                out.extend_from_slice(s.as_bytes());
            }
            Value::Concat(parts) => {
                out.extend_from_slice(&[0x12, any_len as u8, 0x0a, (any_len - 2) as u8]);
                for p in *parts {
                    out.extend_from_slice(p.as_bytes());
                }
            }
            Value::Int(i) => {
                out.extend_from_slice(&[0x12, any_len as u8, 0x18]);
                varint(out, *i as u64);
            }
        }
        return;
    }
    let (any_len, kv_len) = key_value_len(key, value);
    tag(out, field, 2);
    varint(out, kv_len as u64);
    bytes_field(out, 1, key.as_bytes());
    tag(out, 2, 2);
    varint(out, any_len as u64);
    match value {
        Value::Str(s) => bytes_field(out, 1, s.as_bytes()),
        Value::Concat(parts) => {
            tag(out, 1, 2);
            varint(out, parts.iter().map(|p| p.len()).sum::<usize>() as u64);
            for p in *parts {
                out.extend_from_slice(p.as_bytes());
            }
        }
        Value::Int(i) => {
            tag(out, 3, 0);
            varint(out, *i as u64);
        }
    }
}

/// A span attribute (`Span.attributes`, field 9) written by [`encode_span_with`]'s caller:
/// inlined where the key is a literal, its bytes are written as constants.
#[inline(always)]
pub fn attribute(out: &mut Vec<u8>, key: &'static str, value: Value<'_>) {
    key_value(out, 9, key, &value);
}

/// One `Span` message.
pub fn encode_span(s: &Span<'_>) -> Bytes {
    encode_span_with(s, 0, |_| {})
}

/// One `Span` message, with the attributes `more` writes (at most `more_len` bytes) before
/// `s.attributes`.
#[inline(always)]
pub fn encode_span_with(s: &Span<'_>, more_len: usize, more: impl FnOnce(&mut Vec<u8>)) -> Bytes {
    // Room for it all at once: the fixed fields (ids, name, kind, times, status: under 96
    // bytes and the name) and each attribute (its texts, and at most 16 bytes of tags,
    // lengths and integers).
    let size = 96
        + more_len
        + s.name.len()
        + s.attributes
            .iter()
            .map(|(k, v)| {
                k.len()
                    + 16
                    + match v {
                        Value::Str(s) => s.len(),
                        Value::Concat(parts) => parts.iter().map(|p| p.len()).sum(),
                        Value::Int(_) => 0,
                    }
            })
            .sum::<usize>();
    let mut out = Vec::with_capacity(size);
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
    more(&mut out);
    for (k, v) in s.attributes {
        key_value(&mut out, 9, k, v);
    }
    if s.status != 0 {
        tag(&mut out, 15, 2);
        varint(&mut out, 1 + varint_len(s.status) as u64);
        tag(&mut out, 3, 0);
        varint(&mut out, s.status);
    }
    Bytes::from(out)
}

/// The request's trace as its log records carry it.
pub struct LogTrace {
    pub trace_id: [u8; 16],
    /// The request's span, when the trace is sampled.
    pub span_id: Option<[u8; 8]>,
    /// 1: sampled.
    pub flags: u32,
}

/// One `LogRecord` (`opentelemetry/proto/logs/v1/logs.proto`) as Kong's `prepare_logs` makes
/// it: time, severity, the line as a string body, `request.id` and the `introspection.*`
/// attributes, and the request's trace (id, flags, and its span when sampled).
pub fn encode_log(
    r: &crate::request_logs::RequestLog,
    request_id: Option<&str>,
    trace: Option<&LogTrace>,
) -> Bytes {
    let mut out = Vec::with_capacity(128 + r.body.len() + r.source.as_ref().map_or(0, |s| s.len()));
    tag(&mut out, 1, 1);
    out.extend_from_slice(&r.time_ns.to_le_bytes());
    let (number, text) = crate::request_logs::severity(r.level);
    tag(&mut out, 2, 0);
    varint(&mut out, number);
    bytes_field(&mut out, 3, text.as_bytes());
    message(&mut out, 5, |body| bytes_field(body, 1, r.body.as_bytes()));
    if let Some(line) = r.line {
        // A Lua number: a double, as Kong's attributes give it.
        message(&mut out, 6, |kv| {
            bytes_field(kv, 1, b"introspection.current.line");
            message(kv, 2, |v| {
                tag(v, 4, 1);
                v.extend_from_slice(&(line as f64).to_le_bytes());
            });
        });
    }
    for (k, v) in [
        ("request.id", request_id),
        ("introspection.name", r.name.as_deref()),
        ("introspection.namewhat", r.namewhat),
        ("introspection.source", r.source.as_deref()),
        ("introspection.what", Some(r.what)),
    ] {
        if let Some(v) = v {
            key_value(&mut out, 6, k, &Value::Str(v));
        }
    }
    if let Some(t) = trace {
        tag(&mut out, 8, 5);
        out.extend_from_slice(&t.flags.to_le_bytes());
        bytes_field(&mut out, 9, &t.trace_id);
        if let Some(s) = &t.span_id {
            bytes_field(&mut out, 10, s);
        }
    }
    tag(&mut out, 11, 1);
    out.extend_from_slice(&r.time_ns.to_le_bytes());
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

/// An `ExportTraceServiceRequest` of encoded spans under one resource and Kong's scope; of
/// encoded log records, the `ExportLogsServiceRequest` (its envelope has the same fields).
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
    fn computed_sizes_match_what_is_written() {
        for v in [0u64, 1, 127, 128, 300, 16383, 16384, u64::MAX] {
            let mut b = Vec::new();
            varint(&mut b, v);
            assert_eq!(b.len(), varint_len(v), "{v}");
        }
        for value in [
            Value::Str("x".repeat(200).leak()),
            Value::Str("short"),
            Value::Str("y".repeat(110).leak()),
            Value::Int(-1),
            Value::Int(200),
        ] {
            let mut direct = Vec::new();
            key_value(&mut direct, 9, "http.status_code", &value);
            let mut nested = Vec::new();
            message(&mut nested, 9, |kv| {
                bytes_field(kv, 1, b"http.status_code");
                message(kv, 2, |any| match &value {
                    Value::Str(s) => bytes_field(any, 1, s.as_bytes()),
                    Value::Concat(_) => unreachable!(),
                    Value::Int(i) => {
                        tag(any, 3, 0);
                        varint(any, *i as u64);
                    }
                });
            });
            assert_eq!(direct, nested);
        }
    }

    #[test]
    fn a_concatenated_string_is_the_string() {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        key_value(
            &mut a,
            9,
            "http.url",
            &Value::Concat(&["http", "://", "h", "/x?q=1"]),
        );
        key_value(&mut b, 9, "http.url", &Value::Str("http://h/x?q=1"));
        assert_eq!(a, b);
    }

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
