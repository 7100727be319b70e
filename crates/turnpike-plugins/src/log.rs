//! Kong's log phase: what a plugin sees of a request once its response went to the client
//! (body sent, or the client gone). The proxy builds a [`LogEntry`] only for routes whose
//! chain has a plugin with a log phase, and copies headers only when one of them asks.

use std::net::IpAddr;
use std::time::SystemTime;

use http::{HeaderMap, Method, Uri};
use serde::ser::SerializeMap;
use serde::Serialize;
use serde_json::Value;
use turnpike_config::declarative::{Route, Service};

use crate::Identity;

/// An address as text: IPv4 written on the stack without the formatter's machinery (a
/// tenth of its cost, no allocation), IPv6 by the formatter.
pub(crate) enum IpText {
    V4([u8; 15], usize),
    V6(String),
}

impl std::ops::Deref for IpText {
    type Target = str;
    fn deref(&self) -> &str {
        match self {
            // Only ASCII digits and dots are written.
            IpText::V4(b, n) => std::str::from_utf8(&b[..*n]).unwrap_or(""),
            IpText::V6(s) => s,
        }
    }
}

impl Serialize for IpText {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self)
    }
}

pub(crate) fn ip_text(ip: std::net::IpAddr) -> IpText {
    let std::net::IpAddr::V4(v4) = ip else {
        return IpText::V6(ip.to_string());
    };
    let mut b = [0u8; 15];
    let mut n = 0;
    for (i, o) in v4.octets().into_iter().enumerate() {
        if i > 0 {
            b[n] = b'.';
            n += 1;
        }
        if o >= 100 {
            b[n] = b'0' + o / 100;
            n += 1;
        }
        if o >= 10 {
            b[n] = b'0' + o / 10 % 10;
            n += 1;
        }
        b[n] = b'0' + o % 10;
        n += 1;
    }
    IpText::V4(b, n)
}

/// Who produced the response: the upstream service, or the gateway itself (an error, a
/// plugin's exit). Kong's `kong.response.get_source()` ("service" / "exit" / "error").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Service,
    Exit,
    Error,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Service => "service",
            Source::Exit => "exit",
            Source::Error => "error",
        }
    }
}

/// A TLS connection as Kong's serializer shows it (`request.tls`, a stream's `session.tls`):
/// the protocol version (`ngx.ssl.get_tls1_version_str`), the cipher by OpenSSL's name
/// (nginx's `$ssl_cipher`) and `$ssl_client_verify` (`NONE`: the proxy asks no client for a
/// certificate).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct TlsInfo {
    pub version: &'static str,
    pub cipher: &'static str,
    pub client_verify: &'static str,
}

/// What a request looked like, gathered only for plugins that log it in full (file-log,
/// http-log: see `Handler::log_headers`); metrics need none of it.
pub struct RequestDetails {
    pub started_at: SystemTime,
    pub client_ip: IpAddr,
    pub method: Method,
    /// The URI as the client sent it.
    pub uri: Uri,
    /// The host the client asked for (Host header or authority).
    pub host: String,
    pub tls: bool,
    /// The connection's TLS, when it has one (`request.tls`).
    pub tls_info: Option<TlsInfo>,
    /// As the plugins left them (a hidden credential is not there).
    pub request_headers: HeaderMap,
    pub response_headers: HeaderMap,
    /// The URI sent upstream (path and query), when the request went there.
    pub upstream_uri: Option<Uri>,
}

/// One finished request, as Kong's `kong.log.serialize()` describes it.
pub struct LogEntry<'a> {
    /// Present when a plugin of the chain asked for it.
    pub details: Option<&'a RequestDetails>,
    /// The request's id (Kong's `kong.request.get_id()`, `X-Kong-Request-Id`).
    pub request_id: &'a http::HeaderValue,
    /// Bytes received: request head and body as framed on the wire (estimated for HTTP/2).
    pub request_size: u64,
    pub status: u16,
    /// Bytes sent: response head and body.
    pub response_size: u64,
    pub source: Source,
    /// Kong's latencies, in milliseconds: the whole request, the upstream's part (`proxy`,
    /// absent when no upstream answered) and the gateway's own (`kong`).
    pub latency_request_ms: u64,
    pub latency_proxy_ms: Option<u64>,
    pub latency_kong_ms: u64,
    pub route: &'a Route,
    pub service: Option<&'a Service>,
    pub consumer: Option<&'a Identity>,
    /// What the request's plugins kept between phases (Kong's `kong.ctx`).
    pub ctx: Option<&'a crate::PluginCtx>,
    /// The router, plugin phases and balancer tries, when `tracing_instrumentations` records
    /// them (`crate::spans`).
    pub spans: Option<&'a crate::spans::Spans>,
}

/// A header map as Kong serializes it: one value as a string, several as a list; credentials'
/// headers (`authorization`, `proxy-authorization`) redacted when `redact`.
struct Headers<'a> {
    map: &'a HeaderMap,
    redact: bool,
}

impl Serialize for Headers<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.map.keys_len()))?;
        for name in self.map.keys() {
            let key = name.as_str();
            if self.redact && (key == "authorization" || key == "proxy-authorization") {
                m.serialize_entry(key, "REDACTED")?;
                continue;
            }
            let mut values = self.map.get_all(name).iter();
            let first = values.next().map(|v| String::from_utf8_lossy(v.as_bytes()));
            match (first, values.next()) {
                (Some(one), None) => m.serialize_entry(key, &one)?,
                _ => {
                    let all: Vec<_> = self
                        .map
                        .get_all(name)
                        .iter()
                        .map(|v| String::from_utf8_lossy(v.as_bytes()))
                        .collect();
                    m.serialize_entry(key, &all)?
                }
            }
        }
        m.end()
    }
}

/// A query string as Kong serializes it: `k=v` as strings, a bare `k` as `true`, the last of
/// a repeated name.
struct Query<'a>(Option<&'a str>);

impl Serialize for Query<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let pairs: Vec<(&str, Option<&str>)> = self
            .0
            .into_iter()
            .flat_map(|q| q.split('&'))
            .filter(|p| !p.is_empty())
            .map(|p| match p.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (p, None),
            })
            .collect();
        let mut m = s.serialize_map(None)?;
        for (i, (k, v)) in pairs.iter().enumerate() {
            // A name given again: the last one counts, where it first appeared.
            if pairs[..i].iter().any(|(o, _)| o == k) {
                continue;
            }
            let last = pairs
                .iter()
                .rev()
                .find(|(o, _)| o == k)
                .map_or(*v, |(_, v)| *v);
            match last {
                Some(v) => m.serialize_entry(k, v)?,
                None => m.serialize_entry(k, &true)?,
            }
        }
        m.end()
    }
}

#[derive(Serialize)]
struct SerializedRequest<'a> {
    method: &'a str,
    uri: &'a str,
    url: String,
    querystring: Query<'a>,
    headers: Headers<'a>,
    size: u64,
    /// Absent over plain HTTP, as Kong's nil.
    #[serde(skip_serializing_if = "Option::is_none")]
    tls: Option<TlsInfo>,
}

#[derive(Serialize)]
struct SerializedResponse<'a> {
    status: u16,
    headers: Headers<'a>,
    size: u64,
}

/// Kong's `tries`: each balancer try's peer, when its choice began (`balancer_start`, ms and
/// ns since the epoch) and how long it took (`balancer_latency`), and for a failed one its
/// `state` and `code`.
struct Tries<'a>(&'a crate::spans::Spans);

impl Serialize for Tries<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let tries = self.0.tries.borrow();
        let mut seq = s.serialize_seq(Some(tries.len()))?;
        for t in tries.iter() {
            seq.serialize_element(&Try { spans: self.0, t })?;
        }
        seq.end()
    }
}

struct Try<'a> {
    spans: &'a crate::spans::Spans,
    t: &'a crate::spans::TrySpan,
}

impl Serialize for Try<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let t = self.t;
        let start_ns = self.spans.ns(t.start);
        let latency_ns = t.picked.saturating_duration_since(t.start).as_nanos() as u64;
        let mut m = s.serialize_map(None)?;
        match t.ip {
            Some(ip) => m.serialize_entry("ip", &*ip_text(ip))?,
            None => m.serialize_entry("ip", &*t.host)?,
        }
        m.serialize_entry("port", &t.port)?;
        m.serialize_entry("balancer_start", &(start_ns / 1_000_000))?;
        m.serialize_entry("balancer_start_ns", &start_ns)?;
        m.serialize_entry("balancer_latency", &(latency_ns / 1_000_000))?;
        m.serialize_entry("balancer_latency_ns", &latency_ns)?;
        if let Some(code) = t.failed {
            m.serialize_entry("state", "failed")?;
            m.serialize_entry("code", &code)?;
        }
        m.end()
    }
}

#[derive(Serialize)]
struct Latencies {
    request: u64,
    proxy: i64,
    kong: u64,
    receive: u64,
}

#[derive(Serialize)]
struct SerializedConsumer<'a> {
    id: &'a str,
    username: Option<&'a str>,
    custom_id: Option<&'a str>,
}

#[derive(Serialize)]
struct EntityId<'a> {
    id: &'a str,
}

/// Kong's serialized log message, borrowed from the entry: written straight to JSON text (no
/// `Value` tree for the text the log plugins send).
#[derive(Serialize)]
struct Serialized<'a> {
    request: SerializedRequest<'a>,
    response: SerializedResponse<'a>,
    latencies: Latencies,
    /// Absent when no try was made (an exit or error before the balancer), as Kong's nil.
    #[serde(skip_serializing_if = "Option::is_none")]
    tries: Option<Tries<'a>>,
    client_ip: IpText,
    started_at: u64,
    upstream_uri: &'a str,
    source: &'static str,
    route: &'a Route,
    service: Option<&'a Service>,
    consumer: Option<SerializedConsumer<'a>>,
    authenticated_entity: Option<EntityId<'a>>,
    workspace: &'static str,
}

static EMPTY_HEADERS: std::sync::LazyLock<HeaderMap> = std::sync::LazyLock::new(HeaderMap::new);

impl<'e> LogEntry<'e> {
    fn serialized(&self) -> Serialized<'_> {
        let d = self.details;
        let empty: &HeaderMap = &EMPTY_HEADERS;
        let uri = d.map(|d| &d.uri);
        let path_query = uri
            .and_then(|u| u.path_and_query())
            .map_or("/", |p| p.as_str());
        let (scheme, host) = match d {
            Some(d) => (if d.tls { "https" } else { "http" }, d.host.as_str()),
            None => ("http", ""),
        };
        Serialized {
            request: SerializedRequest {
                method: d.map_or("", |d| d.method.as_str()),
                uri: path_query,
                url: format!("{scheme}://{host}{path_query}"),
                querystring: Query(uri.and_then(|u| u.query())),
                headers: Headers {
                    map: d.map_or(empty, |d| &d.request_headers),
                    redact: true,
                },
                size: self.request_size,
                tls: d.and_then(|d| d.tls_info),
            },
            response: SerializedResponse {
                status: self.status,
                headers: Headers {
                    map: d.map_or(empty, |d| &d.response_headers),
                    redact: false,
                },
                size: self.response_size,
            },
            latencies: Latencies {
                request: self.latency_request_ms,
                proxy: self.latency_proxy_ms.map_or(-1, |v| v as i64),
                kong: self.latency_kong_ms,
                receive: 0,
            },
            tries: self
                .spans
                .filter(|s| !s.tries.borrow().is_empty())
                .map(Tries),
            client_ip: d.map_or(IpText::V6(String::new()), |d| ip_text(d.client_ip)),
            started_at: d.map_or(0, |d| {
                d.started_at
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map_or(0, |t| t.as_millis() as u64)
            }),
            upstream_uri: d
                .and_then(|d| d.upstream_uri.as_ref())
                .and_then(|u| u.path_and_query())
                .map_or("", |p| p.as_str()),
            source: self.source.as_str(),
            route: self.route,
            service: self.service,
            consumer: self.consumer.map(|c| SerializedConsumer {
                id: c.consumer_id(),
                username: c.username(),
                custom_id: c.custom_id(),
            }),
            authenticated_entity: self
                .consumer
                .and_then(|c| c.credential_id())
                .map(|id| EntityId { id }),
            workspace: "00000000-0000-0000-0000-000000000000",
        }
    }

    /// Kong's serialized log message (the JSON file-log writes and http-log sends), with
    /// credentials' headers redacted as Kong does (`authorization`, `proxy-authorization`),
    /// and what plugins set with `kong.log.set_serialize_value`.
    pub fn to_json(&self) -> Value {
        let mut v = serde_json::to_value(self.serialized()).unwrap_or(Value::Null);
        if let Some(set) = self.ctx.and_then(|c| c.get::<SerializeValues>()) {
            set.apply(&mut v);
        }
        v
    }

    /// The same written straight to JSON text (no `Value` tree), for the log plugins
    /// (`crate::lua::log_text` adds `custom_fields_by_lua` when a plugin has them).
    pub fn to_json_text(&self) -> String {
        if self
            .ctx
            .is_some_and(|c| c.get::<SerializeValues>().is_some())
        {
            return self.to_json().to_string();
        }
        serde_json::to_string(&self.serialized()).unwrap_or_default()
    }
}

/// How `kong.log.set_serialize_value` sets a field: always, only when absent, only when there.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SetMode {
    Set,
    Add,
    Replace,
}

/// What the request's plugins set in its serialized log entry (Kong's
/// `kong.log.set_serialize_value`), in the order they set it: a dotted path, its value
/// (`None`: removed), and how.
#[derive(Debug, Default)]
pub struct SerializeValues(pub Vec<(String, Option<Value>, SetMode)>);

impl SerializeValues {
    fn apply(&self, entry: &mut Value) {
        for (path, value, mode) in &self.0 {
            let present = path
                .split('.')
                .try_fold(&*entry, |at, part| at.get(part))
                .is_some();
            let wanted = match mode {
                SetMode::Set => true,
                SetMode::Add => !present,
                SetMode::Replace => present,
            };
            if wanted {
                set_path(entry, path, value.clone());
            }
        }
    }
}

/// A stream session's log entry (Kong's `kong.log.serialize` in the stream subsystem): what
/// the stream log plugins (file-log, tcp-log, udp-log) write for a `tcp`, `tls` or `udp`
/// route.
pub struct StreamLogEntry<'a> {
    /// Bytes from and to the client, and to and from the service.
    pub received: u64,
    pub sent: u64,
    pub upstream_sent: u64,
    pub upstream_received: u64,
    /// Kong's stream statuses: 200 (proxied), 403 (a plugin refused it), 502 (the service
    /// could not be reached).
    pub status: u16,
    pub server_port: u16,
    /// From the session's start to the service connected, and the whole session, in ms.
    pub latency_kong_ms: u64,
    pub session_ms: u64,
    pub route: &'a Route,
    pub service: Option<&'a Service>,
    pub client_ip: std::net::IpAddr,
    /// When the session started.
    pub started_at: SystemTime,
    /// The client's TLS, when the gateway terminated it (a `tls` route; not a passthrough).
    pub tls: Option<TlsInfo>,
    /// The balancer's tries, in order (Kong's `tries`; empty when none was made).
    pub tries: &'a [StreamTry],
}

/// One try of a stream session's balancer (Kong's stream `tries` entry): the peer, when its
/// choice began (ns since the epoch) and how long the choice took, and whether connecting to
/// it failed (Kong's `state = "failed"`; the stream subsystem has no status `code`).
#[derive(Debug, Clone)]
pub struct StreamTry {
    pub ip: Option<IpAddr>,
    pub host: std::sync::Arc<str>,
    pub port: u16,
    pub start_ns: u64,
    pub latency_ns: u64,
    pub failed: bool,
}

impl Serialize for StreamTry {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        match self.ip {
            Some(ip) => m.serialize_entry("ip", &*ip_text(ip))?,
            None => m.serialize_entry("ip", &*self.host)?,
        }
        m.serialize_entry("port", &self.port)?;
        m.serialize_entry("balancer_start", &(self.start_ns / 1_000_000))?;
        m.serialize_entry("balancer_start_ns", &self.start_ns)?;
        m.serialize_entry("balancer_latency", &(self.latency_ns / 1_000_000))?;
        m.serialize_entry("balancer_latency_ns", &self.latency_ns)?;
        if self.failed {
            m.serialize_entry("state", "failed")?;
        }
        m.end()
    }
}

#[derive(Serialize)]
struct StreamSessionPart {
    #[serde(skip_serializing_if = "Option::is_none")]
    tls: Option<TlsInfo>,
    received: u64,
    sent: u64,
    status: u16,
    server_port: u16,
}

#[derive(Serialize)]
struct StreamUpstreamPart {
    received: u64,
    sent: u64,
}

#[derive(Serialize)]
struct StreamLatencies {
    kong: u64,
    session: u64,
}

#[derive(Serialize)]
struct StreamSerialized<'a> {
    session: StreamSessionPart,
    upstream: StreamUpstreamPart,
    latencies: StreamLatencies,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    tries: &'a [StreamTry],
    route: &'a Route,
    service: Option<&'a Service>,
    client_ip: IpText,
    started_at: u64,
    workspace: &'static str,
    workspace_name: &'static str,
}

impl StreamLogEntry<'_> {
    fn serialized(&self) -> StreamSerialized<'_> {
        StreamSerialized {
            session: StreamSessionPart {
                tls: self.tls,
                received: self.received,
                sent: self.sent,
                status: self.status,
                server_port: self.server_port,
            },
            upstream: StreamUpstreamPart {
                received: self.upstream_received,
                sent: self.upstream_sent,
            },
            latencies: StreamLatencies {
                kong: self.latency_kong_ms,
                session: self.session_ms,
            },
            tries: self.tries,
            route: self.route,
            service: self.service,
            client_ip: ip_text(self.client_ip),
            started_at: self
                .started_at
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |t| t.as_millis() as u64),
            workspace: "00000000-0000-0000-0000-000000000000",
            workspace_name: "default",
        }
    }

    /// The entry as a JSON value (for `custom_fields_by_lua`).
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self.serialized()).unwrap_or(Value::Null)
    }

    /// The entry as Kong's stream serializer writes it.
    pub fn to_json_text(&self) -> String {
        serde_json::to_string(&self.serialized()).unwrap_or_default()
    }
}

/// Sets (or with `None` removes) the field at a dotted path, making objects on the way.
pub fn set_path(json: &mut serde_json::Value, path: &str, value: Option<serde_json::Value>) {
    let mut parts = path.split('.').peekable();
    let mut at = json;
    while let Some(part) = parts.next() {
        if !at.is_object() {
            *at = serde_json::Value::Object(Default::default());
        }
        let Some(obj) = at.as_object_mut() else {
            return;
        };
        if parts.peek().is_none() {
            match value {
                Some(v) => {
                    obj.insert(part.to_string(), v);
                }
                None => {
                    obj.remove(part);
                }
            }
            return;
        }
        at = obj
            .entry(part.to_string())
            .or_insert_with(|| serde_json::Value::Object(Default::default()));
    }
}
