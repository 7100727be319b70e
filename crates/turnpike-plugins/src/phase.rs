//! The phase API: what a plugin sees of a request in each of Kong's phases (certificate,
//! rewrite/access, header_filter, body_filter, log) and how it answers.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

use crate::*;

/// What a plugin sees of a request in the access phase, and what it may change.
pub struct AccessRequest<'a> {
    pub method: &'a str,
    /// The normalised request path.
    pub path: &'a str,
    pub query: Option<&'a str>,
    /// The request target as the client sent it (path and query, not normalised; Kong's
    /// `get_path_with_query`); empty where unknown.
    pub target: &'a str,
    /// The client's HTTP version.
    pub version: http::Version,
    /// The request headers, as they will go upstream: plugins may add or remove some.
    pub headers: &'a mut HeaderMap,
    /// Headers to add to the response the client gets (upstream's or a plugin's), for plugins
    /// whose header_filter phase only adds headers.
    pub response_headers: &'a mut Vec<(HeaderName, HeaderValue)>,
    pub tls: bool,
    /// The port the request came in on (nginx's `$server_port`; 0 where unknown).
    pub server_port: u16,
    /// The client's port (`kong.client.get_port`; 0 where unknown).
    pub client_port: u16,
    /// The request's id (`kong.request.get_id`, X-Kong-Request-Id): read as text only when a
    /// plugin asks for it.
    pub request_id: Option<&'a HeaderValue>,
    /// When the request began (`kong.request.get_start_time`).
    pub started: Option<std::time::Instant>,
    /// The client's address: the connection's peer, or the X-Real-IP a trusted proxy sent.
    pub client_ip: std::net::IpAddr,
    /// Whether the connection's peer is one of `trusted_ips` (its X-Forwarded-* count).
    pub trusted: bool,
    /// The route's regex path captures, (name, value), numbered ones unnamed (Kong's
    /// `uri_captures`).
    pub captures: Option<&'a [(Option<String>, String)]>,
    /// Set by an authentication plugin; read by the plugins after it.
    pub consumer: Option<Arc<Identity>>,
    /// The whole request body, read before the chain runs when one of the route's plugins
    /// wants it ([`Handler::wants_body`]); a plugin may replace it (what goes upstream).
    pub body: Option<Bytes>,
    /// The matched route's id and its service's (empty and `None` in the rewrite phase,
    /// which runs before the router).
    pub route_id: &'a str,
    pub service_id: Option<&'a str>,
    /// What the request's plugins keep between phases (Kong's `kong.ctx`).
    pub ctx: &'a mut PluginCtx,
    /// What the plugins change of the request sent upstream (Kong's `kong.service.request`),
    /// the request's own across its phases.
    pub upstream: &'a mut UpstreamRequest,
}

/// What the plugins of a request's rewrite and access phases change of the request sent
/// upstream (Kong's `kong.service.request`): kept in the request's state, so each phase's
/// plugins and the forward phase after them read and write the same fields, never copies.
#[derive(Default, Debug)]
pub struct UpstreamRequest {
    /// A replacement for the request method (`kong.service.request.set_method`).
    pub method: Option<http::Method>,
    /// A replacement for the query string (e.g. a credential removed from it); empty means
    /// none.
    pub query: Option<String>,
    /// A replacement for the path (`kong.service.request.set_path`).
    pub path: Option<String>,
    /// The Host header, when a plugin set it (`kong.service.request.set_header` with Host):
    /// it wins over the route's `preserve_host` and the service's host.
    pub host: Option<HeaderValue>,
    /// The most body bytes the upstream may receive (request-size-limiting): a body without a
    /// Content-Length is counted as it streams and cut, with a 413, when it passes this.
    pub body_limit: Option<u64>,
    /// Where to connect instead of the service's host or upstream (`kong.service.set_target`).
    pub target: Option<(String, u16)>,
    /// The upstream's response is read whole before the response phases
    /// (`kong.service.request.enable_buffering`).
    pub buffered: bool,
}

/// Per-request state that plugins keep from one phase to the next (Kong's `kong.ctx.shared`
/// and `kong.ctx.plugin`): empty, and free, unless a plugin puts something there. Each value
/// is found by its type, which only the plugin that put it knows.
#[derive(Default)]
pub struct PluginCtx(Vec<Box<dyn std::any::Any>>);

impl PluginCtx {
    pub fn get<T: 'static>(&self) -> Option<&T> {
        self.0.iter().find_map(|b| b.downcast_ref::<T>())
    }

    pub fn get_mut<T: 'static>(&mut self) -> Option<&mut T> {
        self.0.iter_mut().find_map(|b| b.downcast_mut::<T>())
    }

    /// The value of type `T`, made with `make` if there is none yet.
    pub fn get_or_insert_with<T: 'static>(
        &mut self,
        make: impl FnOnce() -> Result<T, mlua::Error>,
    ) -> Result<&mut T, mlua::Error> {
        let i = match self.0.iter().position(|b| b.is::<T>()) {
            Some(i) => i,
            None => {
                self.0.push(Box::new(make()?));
                self.0.len() - 1
            }
        };
        Ok(self.0[i].downcast_mut::<T>().expect("checked type"))
    }

    pub fn insert<T: 'static>(&mut self, v: T) {
        match self.get_mut::<T>() {
            Some(old) => *old = v,
            None => self.0.push(Box::new(v)),
        }
    }
}

/// Put in the request's plugin context by a plugin that wants a gRPC service to get the
/// route's stripped path (grpc-web's `pass_stripped_path`, Kong's `ngx.req.set_uri`): a gRPC
/// upstream otherwise gets the request's own path, as nginx's `grpc_pass` sends it.
pub struct PassStrippedPath;

/// What a plugin's certificate phase sees of a TLS handshake (Kong runs only global plugins
/// there: no route is known yet).
pub struct CertificateRequest<'a> {
    /// The SNI the client sent, lower-cased.
    pub server_name: Option<&'a str>,
}

impl<'a> AccessRequest<'a> {
    /// The request as it arrives, before any plugin ran: no route (the rewrite phase's view),
    /// no consumer, nothing replaced. The access phase sets the route and what earlier phases
    /// changed on top of this.
    #[allow(clippy::too_many_arguments)] // the request's own facts, none derivable from another
    pub fn new(
        method: &'a str,
        path: &'a str,
        query: Option<&'a str>,
        headers: &'a mut HeaderMap,
        response_headers: &'a mut Vec<(HeaderName, HeaderValue)>,
        tls: bool,
        client_ip: std::net::IpAddr,
        ctx: &'a mut PluginCtx,
        upstream: &'a mut UpstreamRequest,
    ) -> Self {
        AccessRequest {
            method,
            path,
            query,
            target: "",
            version: http::Version::HTTP_11,
            headers,
            response_headers,
            tls,
            server_port: 0,
            client_port: 0,
            request_id: None,
            started: None,
            client_ip,
            trusted: false,
            captures: None,
            consumer: None,
            body: None,
            route_id: "",
            service_id: None,
            ctx,
            upstream,
        }
    }
}

impl AccessRequest<'_> {
    /// Kong's `set_consumer`: records the consumer; the upstream is told who it is by the
    /// identity's headers, which the proxy writes straight into the upstream request head
    /// (replacing what a client sent under those names). Inserting them into the header map
    /// instead cost ~1.5k instructions per request (three inserts and a map that grows:
    /// BENCHMARKS.md); a later authentication plugin's identity simply replaces this one.
    pub fn set_consumer(&mut self, who: Arc<Identity>) {
        self.consumer = Some(who);
    }

    /// A request header as the upstream will see it: the consumer's identity headers (set by
    /// an authentication plugin) over the client's.
    pub fn header(&self, name: &HeaderName) -> Option<std::borrow::Cow<'_, HeaderValue>> {
        if let Some(v) = self.consumer.as_deref().and_then(|c| c.header(name)) {
            return v.map(std::borrow::Cow::Owned);
        }
        self.headers.get(name).map(std::borrow::Cow::Borrowed)
    }
}

/// What plugins may consult while they are built: the snapshot's consumers and credentials,
/// indexed once per snapshot and only if some plugin asks.
impl AccessRequest<'_> {
    /// The first value of a query argument (not percent-decoded).
    pub fn query_arg(&self, name: &str) -> Option<&str> {
        self.query?.split('&').find_map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (k == name).then_some(v)
        })
    }
}

/// A response a plugin produces instead of proxying (Kong's `kong.response.exit`).
#[derive(Debug)]
pub struct Exit {
    pub status: StatusCode,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub body: Bytes,
}

impl Exit {
    /// `kong.response.exit(status, {message = ...})`: a JSON body with a message.
    pub fn message(status: StatusCode, message: &str) -> Exit {
        let body =
            serde_json::to_vec(&serde_json::json!({ "message": message })).unwrap_or_default();
        Exit {
            status,
            headers: vec![(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json; charset=utf-8"),
            )],
            body: Bytes::from(body),
        }
    }

    /// `kong.response.exit(status, "text")`: the text as the body, without a Content-Type
    /// (Kong's proxy server has `default_type ''`).
    pub fn text(status: StatusCode, text: impl Into<Bytes>) -> Exit {
        Exit {
            status,
            headers: Vec::new(),
            body: text.into(),
        }
    }
}

/// The outcome of a plugin's access phase.
pub enum Access {
    Continue,
    Exit(Exit),
    /// The plugin must wait (a Redis round trip, a password hash on the blocking pool): the
    /// proxy awaits the future, which borrows nothing from the request, then hands the request
    /// to what it returns. Plugins that never wait cost nothing for this.
    Wait(Pending),
}

/// What a waiting plugin does with the request once its wait is over.
pub type Resume = Box<dyn FnOnce(&mut AccessRequest<'_>) -> Access>;
/// A plugin's wait. Not `Send`: each worker runs its requests on its own thread.
pub type Pending = std::pin::Pin<Box<dyn std::future::Future<Output = Resume>>>;

/// The outcome of a plugin's response phase: done (with an exit replacing the response, or
/// not), or a wait after which the plugin goes on with the response.
pub enum Responded {
    Done(Option<Exit>),
    Wait(RespPending),
}

/// What a waiting plugin does with the response once its wait is over.
pub type RespResume = Box<dyn FnOnce(&mut ResponseHead<'_>) -> Responded>;
/// A response phase's wait (not `Send`: a worker's own).
pub type RespPending = std::pin::Pin<Box<dyn std::future::Future<Output = RespResume>>>;

/// Runs one plugin's response phase to its end, waiting as often as it asks.
pub async fn run_response(handler: &dyn Handler, resp: &mut ResponseHead<'_>) -> Option<Exit> {
    let mut outcome = handler.response_waiting(resp);
    loop {
        match outcome {
            Responded::Done(e) => return e,
            Responded::Wait(pending) => {
                let resume = pending.await;
                outcome = resume(resp);
            }
        }
    }
}

/// Runs one plugin's access phase to its end, waiting as often as it asks.
pub async fn run_access(handler: &dyn Handler, req: &mut AccessRequest<'_>) -> Option<Exit> {
    let outcome = handler.access(req);
    run_access_from(outcome, req).await
}

/// Carries on from a plugin's first outcome until it continues or exits.
pub async fn run_access_from(mut outcome: Access, req: &mut AccessRequest<'_>) -> Option<Exit> {
    loop {
        match outcome {
            Access::Continue => return None,
            Access::Exit(e) => return Some(e),
            Access::Wait(pending) => {
                let resume = pending.await;
                outcome = resume(req);
            }
        }
    }
}

/// What a plugin's header_filter phase sees of the response and may change: the upstream's
/// response, or one the gateway or a plugin produced (an exit, an error), with Kong's own
/// headers (Via, X-Kong-*) already in it, as Kong's runloop sets them before the plugins run.
pub struct ResponseHead<'a> {
    /// The status the client gets; a plugin may change it.
    pub status: StatusCode,
    pub headers: &'a mut HeaderMap,
    /// The response is the upstream's (false: the gateway's or a plugin's own).
    pub from_upstream: bool,
    /// Who the access phase authenticated (Kong's `kong.client.get_consumer` and
    /// `get_credential` in header_filter).
    pub consumer: Option<&'a Identity>,
    /// What the request's plugins keep between phases (Kong's `kong.ctx`).
    pub ctx: &'a mut PluginCtx,
    /// The upstream's whole body, when the response was buffered (Kong's buffered proxying:
    /// a plugin with a response phase, or `kong.service.request.enable_buffering`).
    pub buffered: Option<&'a Bytes>,
}

/// Kong's body_filter phase for one response: gets the body piece by piece and returns what
/// the client gets in its place (empty to hold it back); `eof` is true once, with an empty
/// piece, when the body has ended. A filter that rewrites the whole body gathers the pieces
/// and answers at `eof`. Built per response by `Handler::header_filter`, so routes and
/// responses that need none pay nothing.
pub trait BodyFilter {
    fn filter(&mut self, piece: Bytes, eof: bool) -> Bytes;
    /// The upstream's trailers (HTTP/2, gRPC), before the end of the body; they are not sent
    /// on to the client once the body is filtered.
    fn trailers(&mut self, _trailers: &http::HeaderMap) {}
}

/// A configured plugin instance.
/// The phases a plugin config runs in (the functions Kong's `handler.lua` defines), as one
/// set: the snapshot compiles per-phase lists from it, so a phase no config of a route has
/// costs that route nothing.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct Phases(u8);

impl Phases {
    pub const NONE: Phases = Phases(0);
    /// During a TLS handshake, for global plugins only.
    pub const CERTIFICATE: Phases = Phases(1);
    /// Before the router, for global plugins only.
    pub const REWRITE: Phases = Phases(2);
    pub const ACCESS: Phases = Phases(4);
    /// header_filter, and the body_filter it may return.
    pub const RESPONSE: Phases = Phases(8);
    pub const LOG: Phases = Phases(16);
    /// Kong's response phase: the upstream's response is read whole first (Kong's buffered
    /// proxying), then handed to [`Handler::response`] before the header_filter phase.
    pub const BUFFERED: Phases = Phases(32);

    pub const fn and(self, other: Phases) -> Phases {
        Phases(self.0 | other.0)
    }

    pub const fn has(self, phase: Phases) -> bool {
        self.0 & phase.0 == phase.0
    }
}

impl std::ops::BitOr for Phases {
    type Output = Phases;
    fn bitor(self, other: Phases) -> Phases {
        self.and(other)
    }
}

/// A stream session as the preread phase sees it.
pub struct StreamSession {
    /// The client's address (the one a trusted balancer's PROXY header named).
    pub client_ip: std::net::IpAddr,
}

/// Why a stream plugin closed the session: Kong's status and message.
pub struct StreamExit {
    pub status: u16,
    pub message: String,
}

/// A built plugin config: the phase functions it has (`phases`), each with a default that
/// does nothing, so a plugin writes only the ones it runs in.
pub trait Handler: Send + Sync {
    /// The phases this config runs in.
    fn phases(&self) -> Phases;
    /// Kong's preread phase, for a stream session (a config whose `protocols` list `tcp`,
    /// `tls`, `tls_passthrough` or `udp`), before the service is connected: an error closes
    /// the session with that status (Kong's `kong.response.error` in the stream subsystem
    /// sends nothing back at 400 and above; the message goes to the log).
    fn preread(&self, _session: &StreamSession) -> Result<(), StreamExit> {
        Ok(())
    }
    /// The log phase of a stream session, once it has ended.
    fn stream_log(&self, _entry: &crate::log::StreamLogEntry<'_>) {}
    /// Kong's certificate phase, during a TLS handshake, for global plugins only; an error
    /// aborts the handshake.
    fn certificate(&self, _hello: &CertificateRequest<'_>) -> Result<(), String> {
        Ok(())
    }
    /// Kong's rewrite phase, before the router, for global plugins only: it may change the
    /// request (which the router then sees) or answer it.
    fn rewrite(&self, _req: &mut AccessRequest<'_>) -> Option<Exit> {
        None
    }
    /// The rewrite phase as the proxy runs it: `rewrite`, unless the plugin may wait there
    /// (an operator's plugin calling out), which answers as `access` does.
    fn rewrite_waiting(&self, req: &mut AccessRequest<'_>) -> Access {
        match self.rewrite(req) {
            Some(e) => Access::Exit(e),
            None => Access::Continue,
        }
    }
    /// Kong's access phase, in PRIORITY order: may authenticate, change the request, or
    /// answer it (`Access::Exit`) instead of the upstream.
    fn access(&self, _req: &mut AccessRequest<'_>) -> Access {
        Access::Continue
    }
    /// Kong's header_filter phase, in PRIORITY order after the access phase, on every
    /// response of a request the plugin's route served; returns the response's body filter
    /// (Kong's body_filter phase) when the plugin changes the body.
    fn header_filter(&self, _resp: &mut ResponseHead<'_>) -> Option<Box<dyn BodyFilter>> {
        None
    }
    /// Kong's response phase, in PRIORITY order, for a config with [`Phases::BUFFERED`]: the
    /// upstream's response read whole (`resp.buffered` holds its body), before the
    /// header_filter phase; it may change the status and headers, or replace the response
    /// (an exit). Not run for the gateway's own responses, upgrades or gRPC.
    fn response(&self, _resp: &mut ResponseHead<'_>) -> Option<Exit> {
        None
    }
    /// The response phase as the proxy runs it: `response`, unless the plugin may wait there
    /// (an external plugin's server answering), which the proxy then awaits.
    fn response_waiting(&self, resp: &mut ResponseHead<'_>) -> Responded {
        Responded::Done(self.response(resp))
    }
    /// Whether this config reads the request body (key-auth's `key_in_body`): the proxy then
    /// reads the body before the route's chain runs. Costs nothing to routes that do not.
    fn wants_body(&self) -> bool {
        false
    }
    /// Whether this config's log phase reads the balancer's tries (`LogEntry::spans`: zipkin's
    /// balancer-try spans, the serialized entry's `tries`): the proxy then records them for
    /// the route's requests. The plugins that log the full entry do.
    fn log_tries(&self) -> bool {
        self.log_headers()
    }
    /// Kong's log phase, after the response went to the client. Must not block: a plugin
    /// that ships entries elsewhere queues them.
    fn log(&self, _entry: &log::LogEntry<'_>) {}
    /// Whether its log phase reads request and response headers (copied only then).
    fn log_headers(&self) -> bool {
        false
    }
}
