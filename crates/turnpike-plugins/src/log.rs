//! Kong's log phase: what a plugin sees of a request once its response went to the client
//! (body sent, or the client gone). The proxy builds a [`LogEntry`] only for routes whose
//! chain has a plugin with a log phase, and copies headers only when one of them asks.

use std::net::IpAddr;
use std::time::SystemTime;

use http::{HeaderMap, Method, Uri};
use serde_json::{json, Map, Value};
use turnpike_config::declarative::{Route, Service};

use crate::Identity;

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
    /// Upstream attempts (`tries`).
    pub tries: u32,
    /// What the request's plugins kept between phases (Kong's `kong.ctx`).
    pub ctx: Option<&'a crate::PluginCtx>,
}

fn headers_json(h: &HeaderMap) -> Value {
    let mut m = Map::new();
    for name in h.keys() {
        let values: Vec<Value> = h
            .get_all(name)
            .iter()
            .map(|v| Value::from(String::from_utf8_lossy(v.as_bytes()).into_owned()))
            .collect();
        let v = if values.len() == 1 {
            values.into_iter().next().unwrap_or(Value::Null)
        } else {
            Value::Array(values)
        };
        m.insert(name.as_str().to_string(), v);
    }
    Value::Object(m)
}

impl LogEntry<'_> {
    /// Kong's serialized log message (the JSON file-log writes and http-log sends), with
    /// credentials' headers redacted as Kong does (`authorization`, `proxy-authorization`).
    pub fn to_json(&self) -> Value {
        let empty = HeaderMap::new();
        let (
            method,
            uri,
            host,
            tls,
            request_headers,
            response_headers,
            upstream_uri,
            client_ip,
            started_at,
        ) = match self.details {
            Some(d) => (
                d.method.as_str(),
                Some(&d.uri),
                d.host.as_str(),
                d.tls,
                &d.request_headers,
                &d.response_headers,
                d.upstream_uri
                    .as_ref()
                    .and_then(|u| u.path_and_query())
                    .map(|p| p.as_str()),
                d.client_ip.to_string(),
                d.started_at
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64),
            ),
            None => ("", None, "", false, &empty, &empty, None, String::new(), 0),
        };
        let scheme = if tls { "https" } else { "http" };
        let path_query = uri
            .and_then(|u| u.path_and_query())
            .map_or("/", |p| p.as_str());
        let mut query = Map::new();
        if let Some(q) = uri.and_then(|u| u.query()) {
            for pair in q.split('&').filter(|p| !p.is_empty()) {
                let (k, v) = match pair.split_once('=') {
                    Some((k, v)) => (k, Value::from(v)),
                    None => (pair, Value::Bool(true)),
                };
                query.insert(k.to_string(), v);
            }
        }
        let mut request_headers = headers_json(request_headers);
        for secret in ["authorization", "proxy-authorization"] {
            if let Some(v) = request_headers.get_mut(secret) {
                *v = Value::from("REDACTED");
            }
        }
        let consumer = self.consumer.map(|c| {
            json!({
                "id": c.consumer_id,
                "username": c.username,
                "custom_id": c.custom_id,
            })
        });
        json!({
            "request": {
                "method": method,
                "uri": path_query,
                "url": format!("{scheme}://{host}{path_query}"),
                "querystring": query,
                "headers": request_headers,
                "size": self.request_size,
            },
            "response": {
                "status": self.status,
                "headers": headers_json(response_headers),
                "size": self.response_size,
            },
            "latencies": {
                "request": self.latency_request_ms,
                "proxy": self.latency_proxy_ms.map_or(-1, |v| v as i64),
                "kong": self.latency_kong_ms,
                "receive": 0,
            },
            "tries": self.tries,
            "client_ip": client_ip,
            "started_at": started_at,
            "upstream_uri": upstream_uri.unwrap_or(""),
            "source": self.source.as_str(),
            "route": self.route,
            "service": self.service,
            "consumer": consumer,
            "authenticated_entity": self.consumer.and_then(|c| c.credential_id.as_ref()).map(|id| json!({"id": id})),
            "workspace": "00000000-0000-0000-0000-000000000000",
        })
    }
}
