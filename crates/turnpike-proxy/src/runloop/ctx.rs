//! The request's own state, carried from one phase to the next (Pingora's `CTX`, Kong's
//! `ngx.ctx`): typed fields, no string-keyed map.

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::header::{HeaderName, HeaderValue};
use http::HeaderMap;
use turnpike_plugins::{Identity, PluginCtx, UpstreamRequest};

use crate::http1::header_names::seen;
use crate::runloop::log::LogState;
use crate::worker::access_log::AccessRecord;

/// The response that ends a request in a phase (a plugin's exit, Kong's error), boxed: the
/// phases' `Ok` values stay small as they are returned, and only an early answer allocates.
pub type Ended = Box<http::Response<crate::runloop::body::ProxyBody>>;

/// One request's state across the phases.
pub struct RequestCtx {
    pub start: Instant,
    pub request_id: HeaderValue,
    /// Which groups of header names the request carries (`header_names::seen`), as the
    /// HTTP/1.1 parser saw them; `seen::ALL` (look everything up) for HTTP/2.
    pub seen: u32,
    /// The client's Accept header, for the shape of an error response (looked up only when
    /// the parser saw one).
    pub accept: Option<HeaderValue>,
    /// Response headers the route's plugins asked for (their header_filter phase).
    pub plugin_headers: Vec<(HeaderName, HeaderValue)>,
    /// What the request's plugins keep between phases (Kong's `kong.ctx`).
    pub plugin_ctx: PluginCtx,
    /// What the rewrite and access phases' plugins changed of the request sent upstream
    /// (its method, path, query, Host, and the most body bytes it may get).
    pub upstream: UpstreamRequest,
    /// Who the access phase authenticated.
    pub consumer: Option<Arc<Identity>>,
    /// The configs of the route's plugins with a header_filter phase, for the consumer the
    /// access phase named (empty unless the route has such a plugin).
    pub filters: Vec<crate::snapshot::Bound>,
    /// The upstream's body, read whole by the response phase (buffered proxying).
    pub buffered: Option<bytes::Bytes>,
    /// The response is the upstream's (not the gateway's or a plugin's own).
    pub from_upstream: bool,
    /// The upstream's response had headers named like Kong's own (they are replaced).
    pub upstream_named_kong: bool,
    /// Time from the request's start to the upstream call, and the upstream's (the head).
    pub proxy_latency: Duration,
    pub upstream_latency: Duration,
    /// The log phase's state, when the route has log plugins.
    pub log: Option<Box<LogState>>,
    /// The access-log line's data, when the access log is on.
    pub access_record: Option<Box<AccessRecord>>,
    /// What response compression needs of the request, when `nginx_proxy_gzip` is on.
    pub gzip: Option<crate::runloop::gzip::GzipRequest>,
    /// The router, plugin phases and balancer tries, when `tracing_instrumentations` asks.
    pub spans: Option<Box<turnpike_plugins::spans::Spans>>,
    /// A gRPC request (HTTP/2, `Content-Type: application/grpc*`, Kong's `is_grpc_request`):
    /// the gateway's own answers are gRPC ones.
    pub grpc: bool,
    /// The upstream is a gRPC service (HTTP/2): Kong's Via then says `2`.
    pub grpc_upstream: bool,
}

impl RequestCtx {
    pub fn new(start: Instant, request_id: HeaderValue, seen_names: u32) -> RequestCtx {
        RequestCtx {
            start,
            request_id,
            seen: seen_names,
            accept: None,
            plugin_headers: Vec::new(),
            plugin_ctx: PluginCtx::default(),
            upstream: UpstreamRequest::default(),
            consumer: None,
            filters: Vec::new(),
            buffered: None,
            from_upstream: false,
            upstream_named_kong: false,
            proxy_latency: Duration::ZERO,
            upstream_latency: Duration::ZERO,
            gzip: None,
            spans: None,
            log: None,
            access_record: None,
            grpc: false,
            grpc_upstream: false,
        }
    }

    /// Notes whether the request is a gRPC one (only an HTTP/2 request can be).
    #[inline]
    pub fn note_grpc(&mut self, version: http::Version, headers: &HeaderMap) {
        if version == http::Version::HTTP_2 {
            self.grpc = headers
                .get(http::header::CONTENT_TYPE)
                .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
        }
    }

    /// Keeps the request's Accept header for an error response's shape.
    pub fn note_accept(&mut self, headers: &HeaderMap) {
        if self.seen & seen::ACCEPT != 0 {
            self.accept = headers.get(http::header::ACCEPT).cloned();
        }
    }
}
