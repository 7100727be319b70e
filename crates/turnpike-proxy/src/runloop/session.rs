//! One request as Kong's phases see it (Kong's `ngx.ctx` together with the request itself,
//! Pingora's `Session`): what it came on, the config snapshot it is served with, the request
//! as it came and as the phases leave it for the upstream, what the router matched, and the
//! state carried from one phase to the next. Every phase takes the session, and answers the
//! request instead (an `Ended`) when it ends it there; the gRPC path, an upgrade and a plain
//! request go through the same phases.

use std::borrow::Cow;
use std::rc::Rc;
use std::sync::Arc;

use http::header::{self, HeaderValue};
use http::request::Parts;
use http::Uri;
use turnpike_router::{normalize_path, Match};

use crate::http1::client::{BodySource, Overrides};
use crate::http1::server::PendingUpgrade;
use crate::runloop::ctx::RequestCtx;
use crate::snapshot::Snapshot;
use crate::worker::ctx::{ConnInfo, WorkerCtx};

/// A request's passage through the phases.
pub struct Session<'r> {
    /// The worker serving it, the connection it came on, the snapshot it is served with.
    pub ctx: &'r Rc<WorkerCtx>,
    pub conn: &'r ConnInfo,
    pub snap: &'r Rc<Arc<Snapshot>>,
    /// The request as it came: what the router and the phases after it match and log.
    pub target: Target,
    /// The request's head and body as the phases leave them for the upstream (the URI is
    /// the upstream's once the forward phase has run).
    pub parts: Parts,
    pub body: BodySource,
    /// The HTTP version the client spoke (the upstream request's is the forward phase's).
    pub client_version: http::Version,
    /// Where the client's connection comes once a 101 is written, for a request that asks
    /// to upgrade (WebSocket); `None` otherwise.
    pub client_upgrade: Option<PendingUpgrade>,
    /// The route and its captures: set by the route phase.
    pub matched: Option<Match<'r>>,
    /// The headers the gateway sets on the upstream request (the forward phase's; slot 0,
    /// Host, is set per attempt by the balancer phase), and the Host kept from the client or
    /// a plugin.
    pub overrides: Overrides,
    pub preserved_host: Option<HeaderValue>,
    /// The request's own state, which outlives the session (the log phase's part of it runs
    /// when the response body is done).
    pub rc: &'r mut RequestCtx,
}

impl<'r> Session<'r> {
    /// Whether this request upgrades its connection (it asked, and can).
    #[inline]
    pub fn upgrade(&self) -> bool {
        self.client_upgrade.is_some()
    }

    /// The route phase's match (the phases after it run only once there is one).
    #[inline]
    pub fn matched(&self) -> &Match<'r> {
        self.matched
            .as_ref()
            .expect("a phase after the route phase ran without a route")
    }
}

/// The request as the client sent it, read by the router and the phases after it.
pub struct Target {
    pub orig_uri: Uri,
    /// The path normalised, where normalising changed it (`orig_uri`'s path otherwise).
    normalized: Option<String>,
    /// The Host header as the rewrite phase left it.
    host_value: Option<HeaderValue>,
    /// The host without its port: its length at the start of `authority()`, or its
    /// lower-cased copy when the client wrote upper-case letters (found once, in
    /// `note_host`).
    host_len: usize,
    host_lower: Option<String>,
}

impl Target {
    #[inline]
    pub fn new(orig_uri: Uri) -> Target {
        let normalized = match normalize_path(orig_uri.path()) {
            Cow::Borrowed(_) => None,
            Cow::Owned(p) => Some(p),
        };
        Target {
            orig_uri,
            normalized,
            host_value: None,
            host_len: 0,
            host_lower: None,
        }
    }

    /// Takes the Host header as the rewrite phase's plugins left it (the router sees it).
    #[inline]
    pub fn note_host(&mut self, parts: &Parts) {
        self.host_value = parts.headers.get(header::HOST).cloned();
        match host_without_port(self.authority()) {
            Cow::Borrowed(h) => self.host_len = h.len(),
            Cow::Owned(h) => self.host_lower = Some(h),
        }
    }

    /// The normalised path.
    #[inline]
    pub fn path(&self) -> &str {
        self.normalized
            .as_deref()
            .unwrap_or_else(|| self.orig_uri.path())
    }

    #[inline]
    pub fn query(&self) -> Option<&str> {
        self.orig_uri.query()
    }

    /// The request target as sent (path and query, not normalised).
    #[inline]
    pub fn path_and_query(&self) -> &str {
        self.orig_uri.path_and_query().map_or("/", |pq| pq.as_str())
    }

    /// The Host header (rewrite's), when the request had one.
    #[inline]
    pub fn host_value(&self) -> Option<&HeaderValue> {
        self.host_value.as_ref()
    }

    /// The host as sent, port included: the URI's authority (HTTP/2, absolute form), else
    /// the Host header.
    #[inline]
    pub fn authority(&self) -> &str {
        match self.orig_uri.authority() {
            Some(a) => a.as_str(),
            None => self
                .host_value
                .as_ref()
                .and_then(|v| v.to_str().ok())
                .unwrap_or(""),
        }
    }

    /// The host, lower case, without its port.
    #[inline]
    pub fn host(&self) -> &str {
        match &self.host_lower {
            Some(h) => h,
            None => &self.authority()[..self.host_len],
        }
    }
}

/// `host[:port]` → lower-case host (allocates only when the host has upper-case letters).
pub fn host_without_port(raw: &str) -> Cow<'_, str> {
    let host = if let Some(rest) = raw.strip_prefix('[') {
        &raw[..rest.find(']').map(|i| i + 2).unwrap_or(raw.len())]
    } else {
        raw.rsplit_once(':').map(|(h, _)| h).unwrap_or(raw)
    };
    if host.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(host.to_ascii_lowercase())
    } else {
        Cow::Borrowed(host)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_target_reads_the_request_as_sent() {
        let t = Target::new(Uri::from_static("/a/../b//c?x=1"));
        assert_eq!(t.path(), normalize_path("/a/../b//c").as_ref());
        assert_eq!(t.query(), Some("x=1"));
        assert_eq!(t.path_and_query(), "/a/../b//c?x=1");
        let mut t = Target::new(Uri::from_static("/plain"));
        assert!(t.normalized.is_none(), "a clean path is not copied");
        let mut parts = http::Request::new(()).into_parts().0;
        parts
            .headers
            .insert(header::HOST, HeaderValue::from_static("Example.COM:8000"));
        t.note_host(&parts);
        assert_eq!(t.authority(), "Example.COM:8000");
        assert_eq!(t.host(), "example.com");
        // An absolute-form (or HTTP/2) authority wins over the Host header.
        let mut t = Target::new(Uri::from_static("http://other.test/x"));
        t.note_host(&parts);
        assert_eq!(t.authority(), "other.test");
    }
}
