//! Kong's tracing header formats (`kong/observability/tracing/propagation`): each format's
//! extractor reads the incoming context (trace id, the caller's span id, the sampled flag), and
//! its injector writes the outgoing one. Extraction takes the first format of `extract` that
//! finds its headers; `preserve` injects in the format found (or `default_format`).

use http::{HeaderMap, HeaderName, HeaderValue};

use super::schema::Propagation;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Format {
    B3,
    B3Single,
    W3c,
    Jaeger,
    Ot,
    Datadog,
    Aws,
    Gcp,
}

impl Format {
    pub fn parse(s: &str) -> Option<Format> {
        Some(match s {
            "b3" => Format::B3,
            "b3-single" => Format::B3Single,
            "w3c" => Format::W3c,
            "jaeger" => Format::Jaeger,
            "ot" => Format::Ot,
            "datadog" => Format::Datadog,
            "aws" => Format::Aws,
            "gcp" => Format::Gcp,
            _ => return None,
        })
    }
}

/// What an extractor found.
#[derive(Default, Debug, PartialEq)]
pub struct Extracted {
    /// 8 or 16 bytes.
    pub trace_id: Option<Vec<u8>>,
    /// The caller's span: the parent of this request's span.
    pub span_id: Option<[u8; 8]>,
    pub sampled: Option<bool>,
    /// The W3C trace flags as received.
    pub flags: Option<u8>,
    /// b3 came in its single-header form.
    pub single_header: bool,
}

#[cfg(test)]
fn hex_bytes(s: &str) -> Option<Vec<u8>> {
    let mut out = vec![0u8; s.len() / 2];
    (s.len().is_multiple_of(2) && hex_into(s, &mut out).is_some()).then_some(out)
}

/// Hex digits into `out`, right-aligned (left-padded with zeros); `None` if not hex or too
/// long.
fn hex_into(s: &str, out: &mut [u8]) -> Option<()> {
    let b = s.as_bytes();
    if b.is_empty() || b.len() > out.len() * 2 {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    out.fill(0);
    for (pos, &c) in (out.len() * 2 - b.len()..).zip(b) {
        let d = digit(c)?;
        out[pos / 2] |= if pos.is_multiple_of(2) { d << 4 } else { d };
    }
    Some(())
}

/// A trace id in hex of up to 32 digits, left-padded to 8 or 16 bytes.
fn trace_id(s: &str) -> Option<Vec<u8>> {
    let mut id = vec![0u8; if s.len() > 16 { 16 } else { 8 }];
    hex_into(s, &mut id)?;
    (!id.iter().all(|b| *b == 0)).then_some(id)
}

fn span_id(s: &str) -> Option<[u8; 8]> {
    let mut id = [0u8; 8];
    hex_into(s, &mut id)?;
    (id != [0; 8]).then_some(id)
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Each byte's two hex digits: one look-up a byte where the traceparent is written.
static HEX_PAIRS: [[u8; 2]; 256] = {
    let mut t = [[0u8; 2]; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = [HEX[i >> 4], HEX[i & 15]];
        i += 1;
    }
    t
};

fn get<'h>(h: &'h HeaderMap, name: &str) -> Option<&'h str> {
    h.get(name).and_then(|v| v.to_str().ok()).map(str::trim)
}

fn truthy(s: &str) -> Option<bool> {
    match s.to_ascii_lowercase().as_str() {
        "1" | "true" | "d" => Some(true),
        "0" | "false" => Some(false),
        _ => None,
    }
}

/// The headers that start a context, by format: one pass over the request's header names
/// tells which formats may be there (looking each name up cost ~300 instructions, ten of them
/// for a request that carries none).
const STARTS: &[(&str, Format)] = &[
    ("traceparent", Format::W3c),
    ("b3", Format::B3),
    ("x-b3-traceid", Format::B3),
    ("x-b3-sampled", Format::B3),
    ("x-b3-flags", Format::B3),
    ("uber-trace-id", Format::Jaeger),
    ("ot-tracer-traceid", Format::Ot),
    ("x-datadog-trace-id", Format::Datadog),
    ("x-amzn-trace-id", Format::Aws),
    ("x-cloud-trace-context", Format::Gcp),
];

fn bit(f: Format) -> u16 {
    1 << (f as u16)
}

/// The first format of `formats` whose headers are there, with what it found.
pub fn extract(h: &HeaderMap, formats: &[Format]) -> Option<(Format, Extracted)> {
    let mut present = 0u16;
    for k in h.keys() {
        if let Some((_, f)) = STARTS.iter().find(|(n, _)| *n == k.as_str()) {
            present |= bit(*f);
        }
    }
    if present == 0 {
        return None;
    }
    formats
        .iter()
        .filter(|f| {
            present
                & bit(if **f == Format::B3Single {
                    Format::B3
                } else {
                    **f
                })
                != 0
        })
        .find_map(|f| extract_one(h, *f).map(|e| (*f, e)))
}

fn extract_one(h: &HeaderMap, f: Format) -> Option<Extracted> {
    match f {
        Format::W3c => {
            let tp = get(h, "traceparent")?;
            let mut parts = tp.split('-');
            let (v, t, s, fl) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
            if v.len() != 2 || v == "ff" || t.len() != 32 || s.len() != 16 || fl.len() != 2 {
                return None;
            }
            if v == "00" && parts.next().is_some() {
                return None;
            }
            let flags = u8::from_str_radix(fl, 16).ok()?;
            Some(Extracted {
                trace_id: Some(trace_id(t)?),
                span_id: Some(span_id(s)?),
                sampled: Some(flags & 1 == 1),
                flags: Some(flags),
                single_header: false,
            })
        }
        Format::B3 | Format::B3Single => {
            if let Some(single) = get(h, "b3") {
                let parts: Vec<&str> = single.split('-').collect();
                if parts.len() == 1 {
                    return Some(Extracted {
                        sampled: truthy(parts[0]),
                        single_header: true,
                        ..Extracted::default()
                    });
                }
                return Some(Extracted {
                    trace_id: Some(trace_id(parts[0])?),
                    span_id: Some(span_id(parts[1])?),
                    sampled: parts.get(2).and_then(|s| truthy(s)),
                    flags: None,
                    single_header: true,
                });
            }
            let t = get(h, "x-b3-traceid");
            let sampled = get(h, "x-b3-flags")
                .filter(|f| *f == "1")
                .map(|_| true)
                .or_else(|| get(h, "x-b3-sampled").and_then(truthy));
            if t.is_none() && sampled.is_none() {
                return None;
            }
            Some(Extracted {
                trace_id: match t {
                    Some(t) => Some(trace_id(t)?),
                    None => None,
                },
                span_id: get(h, "x-b3-spanid").and_then(span_id),
                sampled,
                flags: None,
                single_header: false,
            })
        }
        Format::Jaeger => {
            let v = get(h, "uber-trace-id")?;
            let parts: Vec<&str> = v.split(':').collect();
            if parts.len() != 4 {
                return None;
            }
            let flags = u8::from_str_radix(parts[3], 16).ok()?;
            Some(Extracted {
                trace_id: Some(trace_id(parts[0])?),
                span_id: Some(span_id(parts[1])?),
                sampled: Some(flags & 1 == 1),
                flags: None,
                single_header: false,
            })
        }
        Format::Ot => {
            let t = get(h, "ot-tracer-traceid")?;
            Some(Extracted {
                trace_id: Some(trace_id(t)?),
                span_id: get(h, "ot-tracer-spanid").and_then(span_id),
                sampled: get(h, "ot-tracer-sampled").and_then(truthy),
                flags: None,
                single_header: false,
            })
        }
        Format::Datadog => {
            let t: u64 = get(h, "x-datadog-trace-id")?.parse().ok()?;
            if t == 0 {
                return None;
            }
            let p: Option<u64> = get(h, "x-datadog-parent-id").and_then(|p| p.parse().ok());
            Some(Extracted {
                trace_id: Some(t.to_be_bytes().to_vec()),
                span_id: p.filter(|p| *p != 0).map(u64::to_be_bytes),
                sampled: get(h, "x-datadog-sampling-priority")
                    .and_then(|p| p.parse::<i64>().ok())
                    .map(|p| p > 0),
                flags: None,
                single_header: false,
            })
        }
        Format::Aws => {
            let v = get(h, "x-amzn-trace-id")?;
            let mut e = Extracted::default();
            for kv in v.split(';') {
                let (k, val) = kv.trim().split_once('=')?;
                match k {
                    "Root" => {
                        let mut p = val.split('-');
                        let (one, time, rest) = (p.next()?, p.next()?, p.next()?);
                        if one != "1" || time.len() != 8 || rest.len() != 24 {
                            return None;
                        }
                        e.trace_id = Some(trace_id(&format!("{time}{rest}"))?);
                    }
                    "Parent" => e.span_id = Some(span_id(val)?),
                    "Sampled" => e.sampled = truthy(val),
                    _ => {}
                }
            }
            e.trace_id.as_ref()?;
            Some(e)
        }
        Format::Gcp => {
            let v = get(h, "x-cloud-trace-context")?;
            let (t, rest) = v.split_once('/')?;
            let (span, opts) = rest.split_once(';').unwrap_or((rest, ""));
            let span: u64 = span.parse().ok()?;
            if t.len() != 32 {
                return None;
            }
            Some(Extracted {
                trace_id: Some(trace_id(t)?),
                span_id: (span != 0).then(|| span.to_be_bytes()),
                sampled: opts.strip_prefix("o=").and_then(truthy),
                flags: None,
                single_header: false,
            })
        }
    }
}

/// What is injected: this request's trace and span, its parent, and the decision.
pub struct Inject<'a> {
    /// 8 or 16 bytes.
    pub trace_id: &'a [u8],
    pub span_id: [u8; 8],
    pub parent_id: Option<[u8; 8]>,
    pub sampled: bool,
    pub flags: u8,
}

/// The headers of format `f` for `c`.
pub fn inject(f: Format, c: &Inject<'_>) -> Vec<(HeaderName, HeaderValue)> {
    if f == Format::W3c {
        return traceparent(c)
            .map(|v| (TRACEPARENT.clone(), v))
            .into_iter()
            .collect();
    }
    let t = hex::encode(c.trace_id);
    let t16 = hex::encode(pad16(c.trace_id));
    let s = hex::encode(c.span_id);
    let sampled = if c.sampled { "1" } else { "0" };
    let h = |n: &'static str, v: String| {
        HeaderValue::from_str(&v)
            .ok()
            .map(|v| (HeaderName::from_static(n), v))
    };
    let low64 = |id: &[u8]| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&id[id.len() - 8..]);
        u64::from_be_bytes(b)
    };
    let out = match f {
        Format::W3c => unreachable!("written above"),
        Format::B3 => {
            let mut v = vec![
                h("x-b3-traceid", t.clone()),
                h("x-b3-spanid", s.clone()),
                h("x-b3-sampled", sampled.to_string()),
            ];
            if let Some(p) = c.parent_id {
                v.push(h("x-b3-parentspanid", hex::encode(p)));
            }
            v
        }
        Format::B3Single => {
            let mut v = format!("{t}-{s}-{sampled}");
            if let Some(p) = c.parent_id {
                v.push('-');
                v.push_str(&hex::encode(p));
            }
            vec![h("b3", v)]
        }
        Format::Jaeger => vec![h(
            "uber-trace-id",
            format!(
                "{t}:{s}:{}:{}",
                c.parent_id.map_or("0".to_string(), hex::encode),
                if c.sampled { "01" } else { "00" }
            ),
        )],
        Format::Ot => vec![
            h("ot-tracer-traceid", t.clone()),
            h("ot-tracer-spanid", s.clone()),
            h(
                "ot-tracer-sampled",
                if c.sampled { "true" } else { "false" }.to_string(),
            ),
        ],
        Format::Datadog => vec![
            h("x-datadog-trace-id", low64(c.trace_id).to_string()),
            h(
                "x-datadog-parent-id",
                u64::from_be_bytes(c.span_id).to_string(),
            ),
            h("x-datadog-sampling-priority", sampled.to_string()),
        ],
        Format::Aws => vec![h(
            "x-amzn-trace-id",
            format!(
                "Root=1-{}-{};Parent={s};Sampled={sampled}",
                &t16[..8],
                &t16[8..]
            ),
        )],
        Format::Gcp => vec![h(
            "x-cloud-trace-context",
            format!("{t16}/{};o={sampled}", u64::from_be_bytes(c.span_id)),
        )],
    };
    out.into_iter().flatten().collect()
}

static TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");

/// The w3c context, the common case, written straight into the header's bytes.
fn traceparent(c: &Inject<'_>) -> Option<HeaderValue> {
    // `00-<32 hex>-<16 hex>-<2 hex>`, written in place.
    let mut v = [b'-'; 55];
    v[..2].copy_from_slice(b"00");
    let hex = |out: &mut [u8], b: &[u8]| {
        for (pair, x) in out.chunks_exact_mut(2).zip(b) {
            pair.copy_from_slice(&HEX_PAIRS[*x as usize]);
        }
    };
    hex(&mut v[3..35], &pad16(c.trace_id));
    hex(&mut v[36..52], &c.span_id);
    hex(&mut v[53..55], &[c.flags | c.sampled as u8]);
    // SAFETY: hex digits and dashes only, every one a visible ASCII byte (a header value
    // needs no check of its 55 bytes).
    Some(unsafe { HeaderValue::from_maybe_shared_unchecked(bytes::Bytes::copy_from_slice(&v)) })
}

/// A trace id as OTLP's 16 bytes (an 8-byte id left-padded with zeros).
pub fn pad16(id: &[u8]) -> [u8; 16] {
    let mut out = [0u8; 16];
    let n = id.len().min(16);
    out[16 - n..].copy_from_slice(&id[id.len() - n..]);
    out
}

enum Injector {
    Preserve,
    Format(Format),
}

/// A config's propagation, compiled (Kong's `propagation.get_plugin_params`): when
/// `propagation` names no extractor, injector or header to clear, the older `header_type`
/// (and zipkin's `default_header_type`) decide.
pub struct Params {
    extract: Vec<Format>,
    inject: Vec<Injector>,
    clear: Vec<HeaderName>,
    default_format: Format,
}

impl Params {
    pub fn new(p: &Propagation, header_type: &str, default_header_type: Option<&str>) -> Params {
        let list = |v: &Option<Vec<String>>| -> Vec<String> { v.clone().unwrap_or_default() };
        let injector = |s: &str| match s {
            "preserve" => Some(Injector::Preserve),
            f => Format::parse(f).map(Injector::Format),
        };
        let clear: Vec<HeaderName> = list(&p.clear)
            .iter()
            .filter_map(|h| HeaderName::from_bytes(h.to_ascii_lowercase().as_bytes()).ok())
            .collect();
        if p.extract.is_some() || p.inject.is_some() || p.clear.is_some() {
            return Params {
                extract: list(&p.extract)
                    .iter()
                    .filter_map(|f| Format::parse(f))
                    .collect(),
                inject: list(&p.inject).iter().filter_map(|f| injector(f)).collect(),
                clear,
                default_format: Format::parse(&p.default_format).unwrap_or(Format::W3c),
            };
        }
        let default_format = default_header_type
            .or(Some(p.default_format.as_str()))
            .and_then(Format::parse)
            .unwrap_or(Format::W3c);
        let legacy_extract = vec![
            Format::B3,
            Format::W3c,
            Format::Jaeger,
            Format::Ot,
            Format::Datadog,
            Format::Aws,
            Format::Gcp,
        ];
        let (extract, inject) = match header_type {
            "preserve" => (legacy_extract, vec![Injector::Preserve]),
            "ignore" => (Vec::new(), vec![Injector::Format(default_format)]),
            other => (
                legacy_extract,
                [Some(Injector::Preserve), injector(other)]
                    .into_iter()
                    .flatten()
                    .collect(),
            ),
        };
        Params {
            extract,
            inject,
            clear,
            default_format,
        }
    }

    /// The caller's context, if a format of `extract` finds one.
    pub fn extract(&self, h: &HeaderMap) -> Option<(Format, Extracted)> {
        extract(h, &self.extract)
    }

    /// Clears `clear` and writes `c` in each format of `inject` (`found`: the format the
    /// context came in, for `preserve`).
    pub fn inject(
        &self,
        h: &mut HeaderMap,
        found: Option<Format>,
        single_header: bool,
        c: &Inject<'_>,
    ) {
        for name in &self.clear {
            h.remove(name);
        }
        for i in &self.inject {
            let f = match i {
                Injector::Format(f) => *f,
                Injector::Preserve => match found.unwrap_or(self.default_format) {
                    Format::B3 if single_header => Format::B3Single,
                    f => f,
                },
            };
            if f == Format::W3c {
                // No list of one.
                if let Some(v) = traceparent(c) {
                    h.insert(TRACEPARENT.clone(), v);
                }
                continue;
            }
            for (k, v) in inject(f, c) {
                h.insert(k, v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_is_written_as_w3c_gives_it() {
        let c = Inject {
            trace_id: &[0xab; 8],
            span_id: [0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef],
            parent_id: None,
            sampled: true,
            flags: 0,
        };
        assert_eq!(
            traceparent(&c).unwrap(),
            "00-0000000000000000abababababababab-0123456789abcdef-01"
        );
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    const ALL: &[Format] = &[
        Format::B3,
        Format::W3c,
        Format::Jaeger,
        Format::Ot,
        Format::Datadog,
        Format::Aws,
        Format::Gcp,
    ];

    #[test]
    fn every_format_reads_back_what_it_writes() {
        let trace = hex_bytes("0af7651916cd43dd8448eb211c80319c").unwrap();
        let c = Inject {
            trace_id: &trace,
            span_id: [0xb7, 0xad, 0x6b, 0x71, 0x69, 0x20, 0x33, 0x31],
            parent_id: None,
            sampled: true,
            flags: 0,
        };
        for f in [
            Format::W3c,
            Format::B3,
            Format::B3Single,
            Format::Jaeger,
            Format::Ot,
            Format::Aws,
            Format::Gcp,
        ] {
            let mut h = HeaderMap::new();
            for (k, v) in inject(f, &c) {
                h.insert(k, v);
            }
            let (_, e) = extract(&h, &[f]).unwrap_or_else(|| panic!("{f:?}: {h:?}"));
            assert_eq!(e.trace_id.as_deref(), Some(&trace[..]), "{f:?}");
            assert_eq!(e.span_id, Some(c.span_id), "{f:?}");
            assert_eq!(e.sampled, Some(true), "{f:?}");
        }
        // Datadog carries the low 64 bits.
        let mut h = HeaderMap::new();
        for (k, v) in inject(Format::Datadog, &c) {
            h.insert(k, v);
        }
        assert_eq!(h["x-datadog-trace-id"], "9532127138774266268");
        let (_, e) = extract(&h, &[Format::Datadog]).unwrap();
        assert_eq!(e.trace_id.unwrap(), trace[8..]);
    }

    #[test]
    fn the_specs_examples() {
        let h = headers(&[(
            "traceparent",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        )]);
        let (f, e) = extract(&h, ALL).unwrap();
        assert_eq!(f, Format::W3c);
        assert_eq!(
            hex::encode(e.trace_id.unwrap()),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(e.sampled, Some(true));
        // Invalid ids are no context.
        for bad in [
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-xyz-00f067aa0ba902b7-01",
        ] {
            assert!(
                extract(&headers(&[("traceparent", bad)]), ALL).is_none(),
                "{bad}"
            );
        }
        let h = headers(&[(
            "b3",
            "80f198ee56343ba864fe8b2a57d3eff7-e457b5a2e4d86bd1-1-05e3ac9a4f6e3b90",
        )]);
        let (f, e) = extract(&h, ALL).unwrap();
        assert_eq!(
            (f, e.single_header, e.sampled),
            (Format::B3, true, Some(true))
        );
        let h = headers(&[("uber-trace-id", "abc:def:0:1")]);
        let (_, e) = extract(&h, ALL).unwrap();
        assert_eq!(hex::encode(e.trace_id.unwrap()), "0000000000000abc");
        let h = headers(&[(
            "x-amzn-trace-id",
            "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1",
        )]);
        let (f, e) = extract(&h, ALL).unwrap();
        assert_eq!(f, Format::Aws);
        assert_eq!(
            hex::encode(e.trace_id.unwrap()),
            "5759e988bd862e3fe1be46a994272793"
        );
        let h = headers(&[(
            "x-cloud-trace-context",
            "105445aa7843bc8bf206b12000100000/1;o=1",
        )]);
        let (f, e) = extract(&h, ALL).unwrap();
        assert_eq!(
            (f, e.span_id, e.sampled),
            (Format::Gcp, Some(1u64.to_be_bytes()), Some(true))
        );
        // The first format of the list that finds its headers wins.
        let h = headers(&[
            ("x-b3-traceid", "463ac35c9f6413ad"),
            ("x-b3-spanid", "a2fb4a1d1a96d312"),
            (
                "traceparent",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            ),
        ]);
        assert_eq!(extract(&h, ALL).unwrap().0, Format::B3);
        assert_eq!(
            extract(&h, &[Format::W3c, Format::B3]).unwrap().0,
            Format::W3c
        );
    }
}
