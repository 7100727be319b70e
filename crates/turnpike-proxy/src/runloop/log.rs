//! The log phase on the request path: what is gathered about a request whose route has a
//! plugin with a log phase, and running those plugins once the response body is done (when
//! the request's guard drops). Routes without such a plugin gather nothing.

use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::HeaderMap;
use turnpike_plugins::log::{LogEntry, RequestDetails, Source};
use turnpike_plugins::Identity;

use crate::snapshot::Snapshot;

/// A request being followed for the log phase.
pub struct LogState {
    pub snap: Rc<Arc<Snapshot>>,
    pub route: usize,
    pub service: Option<usize>,
    pub protocol: u8,
    pub start: Instant,
    /// The request's id (`X-Kong-Request-Id`).
    pub request_id: http::HeaderValue,
    /// Only for chains whose log plugins want the full entry (`LOG_HEADERS`).
    pub details: Option<Box<RequestDetails>>,
    pub request_size: u64,
    pub consumer: Option<Arc<Identity>>,
    pub upstream_latency: Option<Duration>,
    pub source: Source,
    pub status: u16,
    pub response_size: u64,
    /// What the request's plugins kept between phases (Kong's `kong.ctx`).
    pub ctx: turnpike_plugins::PluginCtx,
    /// The tracing instrumentations' record, when on.
    pub spans: Option<Box<turnpike_plugins::spans::Spans>>,
}

/// Bytes of a message head on the wire: start line and headers.
pub fn head_size(start_line: usize, headers: &HeaderMap) -> u64 {
    let fields: usize = headers
        .iter()
        .map(|(n, v)| n.as_str().len() + v.len() + 4)
        .sum();
    (start_line + 2 + fields + 2) as u64
}

impl LogState {
    /// Runs the log phase of the route's plugins (the consumer's configs where they have one).
    pub fn finish(self) {
        let snap = &self.snap;
        let request_ms = self.start.elapsed().as_millis() as u64;
        let proxy_ms = self.upstream_latency.map(|d| d.as_millis() as u64);
        let entry = LogEntry {
            details: self.details.as_deref(),
            request_id: &self.request_id,
            request_size: self.request_size,
            status: self.status,
            response_size: self.response_size,
            source: self.source,
            latency_request_ms: request_ms,
            latency_proxy_ms: proxy_ms,
            latency_kong_ms: request_ms.saturating_sub(proxy_ms.unwrap_or(0)),
            route: &snap.routes[self.route].route,
            service: self.service.map(|i| &snap.config.services[i]),
            consumer: self.consumer.as_deref(),
            ctx: Some(&self.ctx),
            spans: self.spans.as_deref(),
        };
        let consumer = self.consumer.as_deref().map(|c| c.consumer_id());
        for slot in snap.routes[self.route].chain.iter() {
            if let Some(h) = slot.handler_for(consumer, self.protocol) {
                if h.phases().has(turnpike_plugins::Phases::LOG) {
                    h.log(&entry);
                }
            }
        }
    }
}
