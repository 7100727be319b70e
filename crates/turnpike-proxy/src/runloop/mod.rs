//! The request path, in the order a request meets it: route → (plugins, from the plugins issue)
//! → balancer → upstream pool → response headers.

use std::borrow::Cow;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Uri, Version};
use hyper::body::Incoming;
use turnpike_plugins::log::Source;
use turnpike_plugins::{Access, AccessRequest};
use turnpike_router::{normalize_path, upstream_uri, RequestView};

use crate::body::RequestBody;
use body::{BodyKind, ProxyBody, RequestGuard};
pub mod body;
pub mod body_filter;
pub mod errors;
pub mod log;

use crate::http1::client::{BodySource, ClientBody, Conn, SendError, UpstreamBody};
use crate::http1::server::{KongHeaders, Limits, OutsideHeaders, PendingUpgrade, Refused, Service};
use crate::runloop::log::LogState;
use crate::snapshot::{Destination, Peer, ServiceInfo};
use crate::upstream::connect::{self, ConnectError};
use crate::upstream::health::Outcome;
use crate::upstream::pool::PeerKey;
use crate::worker::ctx::{ConnInfo, WorkerCtx};
use errors::error_response;

use crate::http1::header_names::names;
use crate::http1::header_names::seen;

/// The most a request body read whole for a plugin may hold (Kong buffers to disk beyond its
/// client_body_buffer_size; we refuse instead of holding unbounded bodies in memory).
const PLUGIN_BODY_MAX: usize = 8 << 20;

static X_KONG_REQUEST_ID: HeaderName = names::X_KONG_REQUEST_ID;
static X_KONG_PROXY_LATENCY: HeaderName = names::X_KONG_PROXY_LATENCY;
static X_KONG_UPSTREAM_LATENCY: HeaderName = names::X_KONG_UPSTREAM_LATENCY;
static X_KONG_RESPONSE_LATENCY: HeaderName = names::X_KONG_RESPONSE_LATENCY;
static X_KONG_UPSTREAM_STATUS: HeaderName = names::X_KONG_UPSTREAM_STATUS;
static X_FORWARDED_FOR: HeaderName = names::X_FORWARDED_FOR;
static X_FORWARDED_PROTO: HeaderName = names::X_FORWARDED_PROTO;
static X_FORWARDED_HOST: HeaderName = names::X_FORWARDED_HOST;
static X_FORWARDED_PORT: HeaderName = names::X_FORWARDED_PORT;
static X_FORWARDED_PATH: HeaderName = names::X_FORWARDED_PATH;
static X_FORWARDED_PREFIX: HeaderName = names::X_FORWARDED_PREFIX;
static X_REAL_IP: HeaderName = names::X_REAL_IP;
static KEEP_ALIVE: HeaderName = names::KEEP_ALIVE;
static PROXY_CONNECTION: HeaderName = names::PROXY_CONNECTION;

/// Hop-by-hop headers (RFC 9110 §7.6.1) are never forwarded, nor any header the Connection
/// header names. One pass over the names finds which are present; only those are removed, and
/// the usual tokens of Connection (keep-alive, close, upgrade) name nothing more to remove.
fn strip_hop_by_hop(h: &mut HeaderMap, keep_upgrade: bool) {
    let hop: [&HeaderName; 7] = [
        &header::CONNECTION,
        &KEEP_ALIVE,
        &PROXY_CONNECTION,
        &header::TE,
        &header::TRAILER,
        &header::TRANSFER_ENCODING,
        &header::PROXY_AUTHENTICATE,
    ];
    let mut present = 0u8;
    let mut upgrade_present = false;
    for name in h.keys() {
        if let Some(i) = hop.iter().position(|n| *n == name) {
            present |= 1 << i;
        } else if name == header::UPGRADE {
            upgrade_present = true;
        }
    }
    let mut extra: smallvec::SmallVec<[HeaderName; 2]> = smallvec::SmallVec::new();
    if present & 1 != 0 {
        for v in h.get_all(header::CONNECTION) {
            for token in v.to_str().unwrap_or("").split(',') {
                let t = token.trim();
                if t.eq_ignore_ascii_case("keep-alive")
                    || t.eq_ignore_ascii_case("close")
                    || t.eq_ignore_ascii_case("upgrade")
                    || t.is_empty()
                {
                    continue;
                }
                if let Ok(n) = HeaderName::from_bytes(t.as_bytes()) {
                    extra.push(n);
                }
            }
        }
    }
    for (i, name) in hop.iter().enumerate() {
        if present & (1 << i) != 0 && !(keep_upgrade && i == 0) {
            h.remove(*name);
        }
    }
    if upgrade_present && !keep_upgrade {
        h.remove(header::UPGRADE);
    }
    for n in extra {
        h.remove(&n);
    }
}

fn is_upgrade(req: &Request<RequestBody>) -> bool {
    req.version() == Version::HTTP_11
        && req.headers().contains_key(header::UPGRADE)
        && req
            .headers()
            .get(header::CONNECTION)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| {
                v.split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
            })
}

/// A latency header value in milliseconds. Values under 1000 ms come from a table of static
/// strings built once: no allocation per request.
fn ms(d: Duration) -> HeaderValue {
    static SMALL: std::sync::OnceLock<Vec<HeaderValue>> = std::sync::OnceLock::new();
    let n = d.as_millis() as u64;
    if n < 1000 {
        let table = SMALL.get_or_init(|| {
            (0..1000u64)
                .map(|i| HeaderValue::from_static(Box::leak(i.to_string().into_boxed_str())))
                .collect()
        });
        return table[n as usize].clone();
    }
    HeaderValue::from(n)
}

/// A client connection's requests, as the HTTP/1.1 server hands them over.
pub struct Connection {
    pub ctx: Rc<WorkerCtx>,
    pub info: Rc<ConnInfo>,
}

impl Service for Connection {
    type RequestBody = RequestBody;
    type ResponseBody = ProxyBody;

    async fn call(
        &self,
        request: Request<RequestBody>,
        seen: u32,
        upgrade: Option<PendingUpgrade>,
    ) -> Response<ProxyBody> {
        match handle(self.ctx.clone(), self.info.clone(), request, seen, upgrade).await {
            Ok(r) => r,
            Err(never) => match never {},
        }
    }

    fn refusal(&self, why: Refused) -> Response<ProxyBody> {
        errors::refusal(&self.ctx, why)
    }

    #[inline]
    fn outside_headers(&self) -> &std::cell::RefCell<OutsideHeaders> {
        &self.ctx.response_extra
    }

    #[inline]
    fn closing(&self) -> bool {
        self.ctx.closing.get()
    }

    #[inline]
    fn last_active(&self) -> Instant {
        self.info.last_active.get()
    }

    #[inline]
    fn deadlines(&self) -> &Rc<crate::worker::deadline::Deadlines> {
        &self.ctx.deadlines
    }

    fn limits(&self) -> Limits {
        let s = &self.ctx.gateway.settings;
        Limits {
            keepalive_timeout: s.keepalive_timeout,
            client_body_timeout: s.client_body_timeout,
            max_header_size: s.max_header_size,
        }
    }
}

/// Entry point for every request a worker receives.
/// `seen`: which groups of header names the request carries (`header_names::seen::ALL` when
/// no parser said); `upgrade`: where an HTTP/1.1 upgrade request's connection comes once a
/// 101 is written.
pub async fn handle(
    ctx: Rc<WorkerCtx>,
    conn: Rc<ConnInfo>,
    req: Request<RequestBody>,
    seen: u32,
    upgrade: Option<PendingUpgrade>,
) -> Result<Response<ProxyBody>, Infallible> {
    let start = Instant::now();
    ctx.stats.requests.inc();
    // In flight until the response body is done: the keepalive timeout does not run meanwhile.
    let guard = RequestGuard::new(conn.clone(), ctx.clone());
    let request_id = ctx.request_id();
    let settings = &ctx.gateway.settings;
    // Response headers the route's plugins asked for (their header_filter phase).
    let access = ctx.access_log.as_ref().map(|_| {
        Box::new(crate::worker::access_log::AccessRecord::new(
            start,
            client_ip(&conn, req.headers()),
            &req,
            &request_id,
        ))
    });
    let mut tail = Tail::default();
    let mut resp = route_and_proxy(
        &ctx,
        &conn,
        (req, seen, upgrade),
        &request_id,
        start,
        &mut tail,
    )
    .await;
    let Tail {
        plugin_headers,
        log,
        mut kong,
        upstream_named_kong,
        filters,
        from_upstream,
        mut plugin_ctx,
    } = tail;
    if settings.headers.request_id {
        kong.push((X_KONG_REQUEST_ID.clone(), request_id));
    }
    // Kong's own headers go straight into an HTTP/1.1 response head (no header-map insert, no
    // hash) unless something needs them in the map: HTTP/2, a log phase that reads the
    // response headers, a header_filter phase (plugins see and may change Kong's headers, as
    // Kong sets them before its plugins' header_filter), or an upstream or a plugin that set
    // headers of those names.
    let plugin_named_kong = plugin_headers
        .iter()
        .any(|(k, _)| k == header::VIA || k.as_str().starts_with("x-kong-"));
    let head_direct = conn.http1
        && log.is_none()
        && filters.is_empty()
        && !upstream_named_kong
        && !plugin_named_kong;
    // The same holds for the upstream's headers, which are also kept out of the map (as it
    // sent them) unless a plugin sets one of their names: a plugin's header replaces the
    // upstream's, which takes the map.
    let plugin_replaces_upstream = || {
        resp.body().raw_head().is_some_and(|raw| {
            raw.names().any(|n| {
                plugin_headers
                    .iter()
                    .any(|(k, _)| n.eq_ignore_ascii_case(k.as_str().as_bytes()))
            })
        })
    };
    if !head_direct || (!plugin_headers.is_empty() && plugin_replaces_upstream()) {
        let (mut parts, mut body) = resp.into_parts();
        // Room for the plugins' headers too: a map that regrows costs ~900 instructions.
        body.merge_raw_head(&mut parts.headers, plugin_headers.len());
        resp = Response::from_parts(parts, body);
    }
    let h = resp.headers_mut();
    // Set for every request, so that nothing of an earlier one's is left in the slot.
    let mut outside = ctx.response_extra.borrow_mut();
    if head_direct {
        // The plugins' headers too, unless the map holds one of their names (a plugin's
        // header replaces it) or a plugin set a name twice (the last one counts).
        let distinct = || {
            plugin_headers
                .iter()
                .enumerate()
                .all(|(i, (k, _))| plugin_headers[i + 1..].iter().all(|(o, _)| o != k))
        };
        if h.is_empty() && distinct() {
            outside.plugins = plugin_headers;
        } else {
            outside.plugins = Vec::new();
            for (k, v) in plugin_headers {
                h.insert(k, v);
            }
        }
        outside.kong = kong;
    } else {
        outside.clear();
        // In the map, in this order: Kong's proxy headers (Via appended, the others replacing
        // an upstream's), the plugins' (replacing those), the request id last.
        let mut rid = None;
        for (k, v) in kong {
            if k == X_KONG_REQUEST_ID {
                rid = Some(v);
            } else if k == header::VIA {
                h.append(k, v);
            } else {
                h.insert(k, v);
            }
        }
        for (k, v) in plugin_headers {
            h.insert(k, v);
        }
        if let Some(v) = rid {
            h.insert(X_KONG_REQUEST_ID.clone(), v);
        }
    }
    // The header_filter phase, in PRIORITY order; the body filters it asks for (the
    // body_filter phase) wrap the body.
    if !filters.is_empty() {
        let (mut parts, mut body) = resp.into_parts();
        let mut head = turnpike_plugins::ResponseHead {
            status: parts.status,
            headers: &mut parts.headers,
            from_upstream,
            ctx: &mut plugin_ctx,
        };
        let body_filters: Vec<_> = filters
            .iter()
            .filter_map(|f| f.header_filter(&mut head))
            .collect();
        parts.status = head.status;
        if !body_filters.is_empty() {
            body.filter(body_filters);
        }
        resp = Response::from_parts(parts, body);
    }
    let h = resp.headers_mut();
    // Client keepalive_requests: close the connection after that many requests (HTTP/1).
    let n = conn.requests.get() + 1;
    conn.requests.set(n);
    if conn.http1 && settings.keepalive_requests > 0 && n >= settings.keepalive_requests {
        h.insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    let mut guard = guard;
    if let Some(mut a) = access {
        a.status = resp.status().as_u16();
        guard.access = Some(a);
    }
    if let Some(mut l) = log {
        l.ctx = plugin_ctx;
        // The response as it leaves: its status, head and (counted as it streams) body.
        l.status = resp.status().as_u16();
        if let Some(d) = l.details.as_deref_mut() {
            d.response_headers = resp.headers().clone();
        }
        l.response_size = crate::runloop::log::head_size(12, resp.headers());
        guard.log = Some(l);
    }
    resp.body_mut().set_guard(guard);
    Ok(resp)
}

/// The request's protocol as plugins' `protocols` name it (`PROTO_*`).
fn request_protocol(conn: &ConnInfo) -> u8 {
    if conn.tls {
        crate::snapshot::PROTO_HTTPS
    } else {
        crate::snapshot::PROTO_HTTP
    }
}

/// A plugin's own response (Kong's `kong.response.exit`).
fn exit_response(
    ctx: &WorkerCtx,
    e: turnpike_plugins::Exit,
    start: Instant,
) -> Response<ProxyBody> {
    let mut r = Response::new(ProxyBody::full(e.body));
    *r.status_mut() = e.status;
    for (k, v) in e.headers {
        r.headers_mut().insert(k, v);
    }
    own_response(ctx, r, start)
}

/// A response Turnpike produced itself (error, redirect): Kong adds Server and
/// X-Kong-Response-Latency to these.
fn own_response(
    ctx: &WorkerCtx,
    mut r: Response<ProxyBody>,
    start: Instant,
) -> Response<ProxyBody> {
    let s = &ctx.gateway.settings;
    if s.headers.server {
        r.headers_mut()
            .insert(header::SERVER, s.server_value.clone());
    }
    if s.headers.response_latency {
        r.headers_mut()
            .insert(X_KONG_RESPONSE_LATENCY.clone(), ms(start.elapsed()));
    }
    r
}

fn kong_error(
    ctx: &WorkerCtx,
    status: StatusCode,
    msg: &str,
    rid: &HeaderValue,
    accept: Option<&HeaderValue>,
    start: Instant,
) -> Response<ProxyBody> {
    own_response(
        ctx,
        error_response(status, msg, rid.to_str().unwrap_or(""), accept),
        start,
    )
}

/// What the request path hands back besides the response.
#[derive(Default)]
struct Tail {
    /// Response headers the route's plugins asked for (their header_filter phase).
    plugin_headers: Vec<(HeaderName, HeaderValue)>,
    /// The log phase's state, when the route has log plugins.
    log: Option<Box<LogState>>,
    /// Kong's own response headers (Via, X-Kong-*), in the order Kong sends them.
    kong: KongHeaders,
    /// The upstream's response had headers named like Kong's own (they are replaced).
    upstream_named_kong: bool,
    /// The configs of the route's plugins with a header_filter phase, for the consumer the
    /// access phase named (empty unless the route has such a plugin).
    filters: Vec<Arc<dyn turnpike_plugins::Handler>>,
    /// The response is the upstream's (not the gateway's or a plugin's own).
    from_upstream: bool,
    /// What the request's plugins keep between phases (Kong's `kong.ctx`).
    plugin_ctx: turnpike_plugins::PluginCtx,
}

/// The configs of a chain that filter responses, as they apply to this consumer and protocol.
fn response_filters(
    chain: &[crate::snapshot::Slot],
    consumer: Option<&turnpike_plugins::Identity>,
    protocol: u8,
) -> Vec<Arc<dyn turnpike_plugins::Handler>> {
    let consumer = consumer.map(|c| c.consumer_id.as_str());
    chain
        .iter()
        .filter_map(|s| s.handler_for(consumer, protocol))
        .filter(|h| h.filters_response())
        .cloned()
        .collect()
}

async fn route_and_proxy(
    ctx: &Rc<WorkerCtx>,
    conn: &ConnInfo,
    // The request, and where its connection comes if it upgrades.
    (req, seen, client_upgrade): (Request<RequestBody>, u32, Option<PendingUpgrade>),
    rid: &HeaderValue,
    start: Instant,
    tail: &mut Tail,
) -> Response<ProxyBody> {
    let Tail {
        plugin_headers,
        log,
        kong,
        upstream_named_kong,
        filters,
        from_upstream,
        plugin_ctx,
    } = tail;
    let snap = ctx.snapshot();
    let upgrade = client_upgrade.is_some() && is_upgrade(&req);
    let client_version = req.version();
    let (mut parts, body) = req.into_parts();
    // Only for an error response; not looked up when the parser saw no Accept header.
    let headers_seen = seen;
    let accept = if headers_seen & seen::ACCEPT != 0 {
        parts.headers.get(header::ACCEPT).cloned()
    } else {
        None
    };
    let accept = accept.as_ref();
    // The original URI is kept aside: its path is borrowed while the upstream URI is built.
    let orig_uri = std::mem::take(&mut parts.uri);
    let path = normalize_path(orig_uri.path());
    // A replacement query and path for the upstream, from a plugin.
    let mut upstream_query: Option<String> = None;
    let mut upstream_path: Option<String> = None;
    let mut upstream_host: Option<HeaderValue> = None;
    // Kong's rewrite phase: global plugins only, before the router, which sees what they did.
    if !snap.global_rewrite.is_empty() {
        let protocol = request_protocol(conn);
        let client_ip = client_ip(conn, &parts.headers);
        let mut req = AccessRequest::new(
            parts.method.as_str(),
            &path,
            orig_uri.query(),
            &mut parts.headers,
            plugin_headers,
            conn.tls,
            client_ip,
            plugin_ctx,
        );
        for b in snap.global_rewrite.iter() {
            if b.protocols & protocol == 0 {
                continue;
            }
            if let Some(e) = b.handler.rewrite(&mut req) {
                return exit_response(ctx, e, start);
            }
        }
        upstream_query = req.upstream_query;
        upstream_path = req.upstream_path;
        upstream_host = req.upstream_host;
    }
    let host_value = parts.headers.get(header::HOST).cloned();
    let host = match orig_uri.authority() {
        Some(a) => Some(a.as_str()),
        None => host_value.as_ref().and_then(|v| v.to_str().ok()),
    }
    .map(host_without_port)
    .unwrap_or(Cow::Borrowed(""));

    let view = RequestView {
        method: parts.method.as_str(),
        host: &host,
        port: conn.local_port,
        path: &path,
        headers: &parts.headers,
        sni: conn.sni.as_deref(),
    };
    let Some(m) = snap.router.find(&view) else {
        return kong_error(
            ctx,
            StatusCode::NOT_FOUND,
            errors::NO_ROUTE,
            rid,
            accept,
            start,
        );
    };
    let route = m.route;
    if snap.chains_log[route.route_index] != 0 {
        let content_length = declared_length(&parts.headers).unwrap_or(0);
        let start_line = parts.method.as_str().len()
            + orig_uri.path_and_query().map_or(1, |p| p.as_str().len())
            + 10;
        let details = (snap.chains_log[route.route_index] & crate::snapshot::LOG_HEADERS != 0)
            .then(|| {
                Box::new(turnpike_plugins::log::RequestDetails {
                    started_at: std::time::SystemTime::now() - start.elapsed(),
                    client_ip: client_ip(conn, &parts.headers),
                    method: parts.method.clone(),
                    uri: orig_uri.clone(),
                    host: host.to_string(),
                    tls: conn.tls,
                    request_headers: HeaderMap::new(),
                    response_headers: HeaderMap::new(),
                    upstream_uri: None,
                })
            });
        *log = Some(Box::new(LogState {
            snap: snap.clone(),
            route: route.route_index,
            service: route.service_index,
            protocol: request_protocol(conn),
            start,
            details,
            request_size: crate::runloop::log::head_size(start_line, &parts.headers)
                + content_length,
            consumer: None,
            upstream_latency: None,
            source: Source::Error,
            status: 0,
            response_size: 0,
            tries: 0,
            ctx: Default::default(),
        }));
    }

    // A plain-HTTP request on an HTTPS-only route: Kong's 426 or the configured redirect.
    if !conn.tls && !route.accepts_http {
        if route.https_redirect_status_code == 426 {
            let mut r = kong_error(
                ctx,
                StatusCode::UPGRADE_REQUIRED,
                errors::USE_HTTPS,
                rid,
                accept,
                start,
            );
            r.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
            r.headers_mut().insert(
                header::UPGRADE,
                HeaderValue::from_static("TLS/1.2, HTTP/1.1"),
            );
            return r;
        }
        let pq = orig_uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
        let mut r = Response::new(ProxyBody::empty());
        *r.status_mut() = StatusCode::from_u16(route.https_redirect_status_code)
            .unwrap_or(StatusCode::MOVED_PERMANENTLY);
        if let Ok(v) = HeaderValue::from_str(&format!("https://{host}{pq}")) {
            r.headers_mut().insert(header::LOCATION, v);
        }
        return own_response(ctx, r, start);
    }

    // nginx's client_max_body_size, checked before any plugin runs (nginx checks it when it
    // picks the location): a declared length above it is refused before a byte is read.
    let settings = &ctx.gateway.settings;
    let max_body = settings.client_max_body_size;
    if max_body != 0 && declared_length(&parts.headers).is_some_and(|n| n > max_body) {
        return kong_error(
            ctx,
            StatusCode::PAYLOAD_TOO_LARGE,
            errors::PAYLOAD_TOO_LARGE,
            rid,
            accept,
            start,
        );
    }

    // The access phase of the route's plugins; one of them may answer instead of the upstream.
    let chain = &snap.chains[route.route_index];
    let mut body_limit: Option<u64> = None;
    let mut consumer: Option<Arc<turnpike_plugins::Identity>> = None;
    let mut body = BodySource::Stream(body);
    if !chain.is_empty() {
        // A plugin that reads the body (key-auth's key_in_body) gets it whole, read here
        // within a bound; the upstream then gets those bytes.
        let mut buffered = None;
        if snap.chains_want_body[route.route_index] && !upgrade {
            if let BodySource::Stream(stream) = body {
                use http_body_util::BodyExt;
                match http_body_util::Limited::new(stream, PLUGIN_BODY_MAX)
                    .collect()
                    .await
                {
                    Ok(b) => buffered = Some(b.to_bytes()),
                    Err(e) => {
                        let timed_out = e
                            .downcast_ref::<std::io::Error>()
                            .is_some_and(|e| e.kind() == std::io::ErrorKind::TimedOut);
                        let (status, msg) = if e.is::<http_body_util::LengthLimitError>() {
                            (StatusCode::PAYLOAD_TOO_LARGE, errors::BODY_TOO_LARGE)
                        } else if timed_out {
                            (StatusCode::REQUEST_TIMEOUT, errors::REQUEST_TIMEOUT)
                        } else {
                            (StatusCode::BAD_REQUEST, errors::BAD_BODY)
                        };
                        return kong_error(ctx, status, msg, rid, accept, start);
                    }
                }
                body = BodySource::Buffered(bytes::Bytes::new());
            }
        }
        let client_ip = client_ip(conn, &parts.headers);
        let mut access = AccessRequest {
            upstream_query: upstream_query.take(),
            body: buffered,
            route_id: &snap.config.routes[route.route_index].id,
            service_id: route
                .service_index
                .map(|i| snap.config.services[i].id.as_str()),
            upstream_path: upstream_path.take(),
            upstream_host: upstream_host.take(),
            ..AccessRequest::new(
                parts.method.as_str(),
                &path,
                orig_uri.query(),
                &mut parts.headers,
                plugin_headers,
                conn.tls,
                client_ip,
                plugin_ctx,
            )
        };
        let protocol = request_protocol(conn);
        for slot in chain.iter() {
            let consumer = access.consumer.as_deref().map(|c| c.consumer_id.as_str());
            let Some(plugin) = slot.handler_for(consumer, protocol) else {
                continue;
            };
            let exit = match plugin.access(&mut access) {
                Access::Continue => None,
                Access::Exit(e) => Some(e),
                // Only a plugin that has to wait pays for the future.
                wait @ Access::Wait(_) => {
                    turnpike_plugins::run_access_from(wait, &mut access).await
                }
            };
            if let Some(e) = exit {
                if snap.chains_filter[route.route_index] {
                    *filters = response_filters(chain, access.consumer.as_deref(), protocol);
                }
                if let Some(l) = log.as_deref_mut() {
                    l.source = Source::Exit;
                    l.consumer = access.consumer.clone();
                    if let Some(d) = l.details.as_deref_mut() {
                        d.request_headers =
                            with_identity(access.headers, access.consumer.as_deref());
                    }
                }
                return exit_response(ctx, e, start);
            }
        }
        upstream_query = access.upstream_query;
        upstream_path = access.upstream_path;
        upstream_host = access.upstream_host;
        body_limit = access.body_limit;
        consumer = access.consumer;
        if snap.chains_filter[route.route_index] {
            *filters = response_filters(chain, consumer.as_deref(), protocol);
        }
        if matches!(body, BodySource::Buffered(_)) {
            // What the plugins leave is what goes upstream, with its length.
            let b = access.body.unwrap_or_default();
            parts.headers.remove(header::TRANSFER_ENCODING);
            parts
                .headers
                .insert(header::CONTENT_LENGTH, HeaderValue::from(b.len()));
            body = BodySource::Buffered(b);
        }
        if let Some(l) = log.as_deref_mut() {
            l.consumer = consumer.clone();
            // As the plugins left them (a hidden credential is not logged).
            if let Some(d) = l.details.as_deref_mut() {
                d.request_headers = with_identity(&parts.headers, consumer.as_deref());
            }
        }
    }

    // Kong's request_buffering (the default): the whole body is read before an upstream is
    // chosen and connected to, so a slow client holds no upstream connection and the
    // upstream never gets a request its client abandoned.
    // A body is held to client_max_body_size as well as to a plugin's limit
    // (request-size-limiting), whether it is buffered or streamed.
    let limit = match (body_limit, max_body) {
        (l, 0) => l,
        (Some(l), m) => Some(l.min(m)),
        (None, m) => Some(m),
    };
    let plugin_bound = body_limit.is_some() && limit == body_limit;
    if route.request_buffering && !upgrade {
        if let BodySource::Stream(stream) = &mut body {
            if !http_body::Body::is_end_stream(stream) {
                let read = crate::body::spool::read(
                    stream,
                    limit.unwrap_or(0),
                    settings.client_body_buffer_size,
                    &settings.client_body_temp,
                )
                .await;
                match read {
                    Ok(spool) => {
                        parts.headers.remove(header::TRANSFER_ENCODING);
                        parts
                            .headers
                            .insert(header::CONTENT_LENGTH, HeaderValue::from(spool.len()));
                        body = BodySource::Spooled(spool);
                    }
                    Err(e) => {
                        use crate::body::spool::SpoolError;
                        let (status, msg) = match e {
                            SpoolError::TooLarge if plugin_bound => {
                                (StatusCode::PAYLOAD_TOO_LARGE, errors::BODY_TOO_LARGE)
                            }
                            SpoolError::TooLarge => {
                                (StatusCode::PAYLOAD_TOO_LARGE, errors::PAYLOAD_TOO_LARGE)
                            }
                            SpoolError::TimedOut => {
                                (StatusCode::REQUEST_TIMEOUT, errors::REQUEST_TIMEOUT)
                            }
                            SpoolError::Unreadable => (StatusCode::BAD_REQUEST, errors::BAD_BODY),
                            SpoolError::Storage => {
                                (StatusCode::INTERNAL_SERVER_ERROR, errors::UNEXPECTED)
                            }
                        };
                        return kong_error(ctx, status, msg, rid, accept, start);
                    }
                }
            }
        }
    }

    let Some(si) = route.service_index else {
        return kong_error(
            ctx,
            StatusCode::SERVICE_UNAVAILABLE,
            errors::NO_SERVICE,
            rid,
            accept,
            start,
        );
    };
    let service = &snap.services[si];

    // The upstream request: origin-form URI, hop-by-hop headers removed, Kong's X-Forwarded-*.
    let mut up_path = match upstream_path {
        // A plugin set the upstream path (kong.service.request.set_path).
        Some(p) => p,
        None => upstream_uri(
            service.path.as_deref(),
            &path,
            m.matched_len,
            route.strip_path,
            route.path_handling_v1,
        ),
    };
    match upstream_query.as_deref() {
        // A plugin rewrote the query (e.g. removed a credential); empty means none.
        Some("") => {}
        Some(q) => {
            up_path.push('?');
            up_path.push_str(q);
        }
        None => {
            if let Some(q) = orig_uri.query() {
                up_path.push('?');
                up_path.push_str(q);
            }
        }
    }
    let Ok(uri) = Uri::try_from(up_path) else {
        return kong_error(
            ctx,
            StatusCode::BAD_REQUEST,
            "Bad request",
            rid,
            accept,
            start,
        );
    };
    parts.uri = uri;
    parts.version = Version::HTTP_11;
    // What the parser saw of the request's names still holds unless a plugin ran (one may have
    // set any header).
    let headers_seen = if chain.is_empty() && snap.global_rewrite.is_empty() {
        headers_seen
    } else {
        seen::ALL
    };
    if headers_seen & seen::HOP_BY_HOP != 0 {
        strip_hop_by_hop(&mut parts.headers, upgrade);
    }
    let prefix = m
        .matched_len
        .filter(|_| route.strip_path)
        .map(|n| &path[..n]);
    // Slot 0 is the Host header, set per attempt by `send_upstream`. Unless the client sent
    // X-Forwarded-*, X-Real-IP or X-Kong-Request-Id (or a plugin ran, which may have set any
    // header), Host is the only proxy-set name a client header can have.
    let mut overrides = Overrides::new(headers_seen & (seen::FORWARDED | seen::KONG) != 0);
    forwarded_headers(
        conn,
        (headers_seen & seen::FORWARDED != 0).then_some(&parts.headers),
        &host,
        host_value.as_ref(),
        &path,
        prefix,
        &mut overrides,
    );
    if ctx.gateway.settings.headers_upstream_request_id {
        overrides.push((X_KONG_REQUEST_ID.clone(), Some(rid.clone())));
    }
    // Who the consumer is (X-Consumer-ID, ...), replacing what the client sent. The headers
    // to drop are listed only when the client sent one of those names (one pass over its
    // header names tells), which keeps `overrides` on the stack.
    if let Some(who) = consumer.as_deref() {
        let ids = who.upstream_headers();
        let spoofed = parts
            .headers
            .keys()
            .any(|k| ids.iter().any(|(name, _)| *name == k));
        for (name, value) in ids {
            if value.is_some() || spoofed {
                overrides.push(((*name).clone(), value.clone()));
            }
        }
    }
    let preserved_host = if upstream_host.is_some() {
        upstream_host
    } else if route.preserve_host {
        host_value.or_else(|| {
            orig_uri
                .authority()
                .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        })
    } else {
        None
    };
    let up_start = Instant::now();
    let proxy_latency = up_start - start;
    // What a balancer may hash on; the client address only when a balancer may need it.
    let call = Call {
        preserved_host,
        upgrade,
        consumer_id: consumer.as_deref().map(|c| c.consumer_id.as_str()),
        client_ip: match service.destination {
            Destination::Balanced(_) => Some(client_ip(conn, &parts.headers)),
            _ => None,
        },
        path: &path,
        query: orig_uri.query(),
        captures: m.captures.as_deref(),
        set_cookie: std::cell::Cell::new(None),
    };
    if let Some(d) = log.as_deref_mut().and_then(|l| l.details.as_deref_mut()) {
        d.upstream_uri = Some(parts.uri.clone());
    }
    let sent = send_upstream(
        ctx,
        service,
        &mut parts,
        ClientBody {
            source: body,
            limit,
        },
        &mut overrides,
        &call,
    )
    .await;
    let (mut parts, body) = match sent {
        // Our HTTP/1.1 exchange never stores hop-by-hop headers.
        Ok(Upstreamed::H1(parts, body)) => {
            *upstream_named_kong = body.named_kong_headers;
            let mut body = ProxyBody::new(BodyKind::Upstream(body));
            let mut parts = parts;
            if route.response_buffering && parts.status != StatusCode::SWITCHING_PROTOCOLS {
                body.read_ahead(&mut parts.headers, &settings.proxy_temp);
            }
            (parts, body)
        }
        Ok(Upstreamed::Hyper(mut resp)) => {
            // WebSocket: splice the two upgraded connections together.
            if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
                if let Some(client_upgrade) = client_upgrade {
                    let upstream_upgrade = hyper::upgrade::on(&mut resp);
                    tokio::task::spawn_local(async move {
                        if let (Ok(mut c), Ok(u)) = (client_upgrade.await, upstream_upgrade.await) {
                            let mut u = hyper_util::rt::TokioIo::new(u);
                            let _ = tokio::io::copy_bidirectional(&mut c, &mut u).await;
                        }
                    });
                    let (parts, _) = resp.into_parts();
                    return Response::from_parts(parts, ProxyBody::empty());
                }
            }
            let (mut parts, body) = resp.into_parts();
            strip_hop_by_hop(&mut parts.headers, false);
            *upstream_named_kong = true;
            (parts, ProxyBody::new(BodyKind::Hyper(body)))
        }
        Err(e) => {
            let (status, msg) = match e {
                UpstreamError::BodyTooLarge => {
                    (StatusCode::PAYLOAD_TOO_LARGE, errors::BODY_TOO_LARGE)
                }
                UpstreamError::Timeout => (StatusCode::GATEWAY_TIMEOUT, errors::TIMED_OUT),
                UpstreamError::ClientBody { timed_out: true } => {
                    (StatusCode::REQUEST_TIMEOUT, errors::REQUEST_TIMEOUT)
                }
                UpstreamError::ClientBody { timed_out: false } => {
                    (StatusCode::BAD_REQUEST, errors::BAD_REQUEST)
                }
                UpstreamError::NoPeer => (StatusCode::SERVICE_UNAVAILABLE, errors::NO_PEER),
                UpstreamError::NameResolution => {
                    (StatusCode::SERVICE_UNAVAILABLE, errors::NAME_RESOLUTION)
                }
                UpstreamError::Failed => (StatusCode::BAD_GATEWAY, errors::BAD_GATEWAY),
            };
            return kong_error(ctx, status, msg, rid, accept, start);
        }
    };
    *from_upstream = true;
    let upstream_latency = up_start.elapsed();
    if let Some(l) = log.as_deref_mut() {
        l.source = Source::Service;
        l.upstream_latency = Some(upstream_latency);
        l.tries = 1;
    }
    parts.version = client_version;
    if let Some(c) = call.set_cookie.take() {
        parts.headers.append(header::SET_COOKIE, c);
    }
    let s = &ctx.gateway.settings;
    if s.headers.via {
        kong.push((header::VIA, s.via_value.clone()));
    }
    if s.headers.upstream_latency {
        kong.push((X_KONG_UPSTREAM_LATENCY.clone(), ms(upstream_latency)));
    }
    if s.headers.proxy_latency {
        kong.push((X_KONG_PROXY_LATENCY.clone(), ms(proxy_latency)));
    }
    if s.headers.upstream_status {
        kong.push((
            X_KONG_UPSTREAM_STATUS.clone(),
            HeaderValue::from(parts.status.as_u16()),
        ));
    }
    Response::from_parts(parts, body)
}

/// The request's Content-Length, when it declares one.
fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

/// `host[:port]` → lower-case host (allocates only when the host has upper-case letters).
fn host_without_port(raw: &str) -> Cow<'_, str> {
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

pub use crate::http1::client::Overrides;

/// The request headers as the upstream gets them from the plugins, for log plugins (Kong logs
/// what `set_header` left): the client's with the consumer's identity headers over them.
fn with_identity(h: &HeaderMap, who: Option<&turnpike_plugins::Identity>) -> HeaderMap {
    let mut h = h.clone();
    for (name, value) in who.map(|w| w.upstream_headers()).unwrap_or_default() {
        match value {
            Some(v) => {
                h.insert(*name, v.clone());
            }
            None => {
                h.remove(*name);
            }
        }
    }
    h
}

fn apply_overrides(h: &mut HeaderMap, overrides: &Overrides) {
    for (name, value) in overrides.iter() {
        match value {
            Some(v) => {
                h.insert(name.clone(), v.clone());
            }
            None => {
                h.remove(name);
            }
        }
    }
}

/// The client's address as Kong's `kong.client.get_forwarded_ip` sees it: the X-Real-IP sent by
/// a trusted proxy (`trusted_ips`), the connection's peer otherwise.
fn client_ip(conn: &ConnInfo, h: &HeaderMap) -> std::net::IpAddr {
    if conn.trusted {
        if let Some(ip) = h
            .get(&X_REAL_IP)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok())
        {
            return ip;
        }
    }
    conn.peer.ip()
}

/// Kong's X-Forwarded-* and X-Real-IP: taken from the client only when it is in
/// `trusted_ips`, otherwise set from the connection (values computed once per connection).
fn forwarded_headers(
    conn: &ConnInfo,
    // The client's headers; `None` when it sent no X-Forwarded-* or X-Real-IP (nothing to
    // look up).
    sent: Option<&HeaderMap>,
    host: &str,
    host_value: Option<&HeaderValue>,
    path: &str,
    prefix: Option<&str>,
    out: &mut Overrides,
) {
    let xff = match sent
        .and_then(|h| h.get(&X_FORWARDED_FOR))
        .and_then(|v| v.to_str().ok())
    {
        Some(prev) if !prev.is_empty() => {
            HeaderValue::from_str(&format!("{prev}, {}", conn.peer.ip())).ok()
        }
        _ => Some(conn.ip_value.clone()),
    };
    if xff.is_some() {
        out.push((X_FORWARDED_FOR.clone(), xff));
    }
    let trusted = conn.trusted;
    // Only a trusted client's own values are kept; the map is not even consulted otherwise.
    let keep = |name: &HeaderName| trusted && sent.is_some_and(|h| h.contains_key(name));
    if !keep(&X_FORWARDED_PROTO) {
        out.push((
            X_FORWARDED_PROTO.clone(),
            Some(HeaderValue::from_static(if conn.tls {
                "https"
            } else {
                "http"
            })),
        ));
    }
    if !keep(&X_FORWARDED_HOST) {
        // The client's Host header is reused as is when it carries no port (no copy).
        let v = match host_value {
            Some(v) if v.as_bytes() == host.as_bytes() => Some(v.clone()),
            _ => HeaderValue::from_str(host).ok(),
        };
        out.push((X_FORWARDED_HOST.clone(), v));
    }
    if !keep(&X_FORWARDED_PORT) {
        out.push((X_FORWARDED_PORT.clone(), Some(conn.port_value.clone())));
    }
    if !keep(&X_FORWARDED_PATH) {
        out.push((X_FORWARDED_PATH.clone(), HeaderValue::from_str(path).ok()));
    }
    match prefix {
        Some(p) if !keep(&X_FORWARDED_PREFIX) => {
            out.push((X_FORWARDED_PREFIX.clone(), HeaderValue::from_str(p).ok()))
        }
        None if !trusted => out.push((X_FORWARDED_PREFIX.clone(), None)),
        _ => {}
    }
    if !keep(&X_REAL_IP) {
        out.push((X_REAL_IP.clone(), Some(conn.ip_value.clone())));
    }
}

/// What the upstream exchange needs to know of the request besides its head and body.
struct Call<'a> {
    preserved_host: Option<HeaderValue>,
    upgrade: bool,
    consumer_id: Option<&'a str>,
    client_ip: Option<std::net::IpAddr>,
    path: &'a str,
    query: Option<&'a str>,
    captures: Option<&'a [(Option<String>, String)]>,
    /// A cookie the balancer wants set on the response (hash_on = cookie).
    set_cookie: std::cell::Cell<Option<HeaderValue>>,
}

/// Methods that may be sent again after the upstream got them without answering (RFC 9110
/// §9.2.2; POST and PATCH are not).
fn idempotent(m: &http::Method) -> bool {
    matches!(
        *m,
        http::Method::GET
            | http::Method::HEAD
            | http::Method::PUT
            | http::Method::DELETE
            | http::Method::OPTIONS
            | http::Method::TRACE
    )
}

/// A failed connection attempt, as health checks count it.
fn connect_outcome(e: &ConnectError) -> Outcome {
    match e {
        ConnectError::Timeout => Outcome::Timeout,
        _ => Outcome::TcpFailure,
    }
}

enum UpstreamError {
    /// The client's body passed a plugin's size limit.
    BodyTooLarge,
    /// The client's body stalled (408) or broke off (400) on its way upstream.
    ClientBody {
        timed_out: bool,
    },
    Timeout,
    Failed,
    NoPeer,
    NameResolution,
}

/// The address a new connection to `peer` goes to (from the DNS cache for host names).
async fn resolve(peer: &Peer) -> Result<SocketAddr, UpstreamError> {
    if let Some(a) = peer.addr {
        return Ok(a);
    }
    match &peer.dns {
        Some(name) => name.address(peer.port).await.map_err(|e| {
            tracing::debug!("dns: no address for {}: {e:?}", peer.host);
            UpstreamError::NameResolution
        }),
        None => Err(UpstreamError::NameResolution),
    }
}

/// What the upstream answered: a response read by our own HTTP/1.1 exchange (its body still
/// on the connection), or hyper's response for an upgrade.
enum Upstreamed {
    H1(http::response::Parts, UpstreamBody),
    Hyper(Response<Incoming>),
}

/// Why an upgrade request did not get a response from hyper.
enum Upgrade {
    /// The connection could not be opened (counted, maybe retried, by the caller).
    Connect(ConnectError),
    Failed(UpstreamError),
}

type UpgradeSent = Result<Result<Response<Incoming>, hyper::Error>, tokio::time::error::Elapsed>;

/// An upgrade request (WebSocket) goes through hyper's client, which hands over the upgraded
/// connection after a 101.
async fn send_upgrade(
    ctx: &Rc<WorkerCtx>,
    service: &ServiceInfo,
    peer: &Peer,
    tls: connect::TlsParams<'_>,
    parts: &mut http::request::Parts,
    body: &mut Option<ClientBody>,
    overrides: &Overrides,
) -> Result<UpgradeSent, Upgrade> {
    let addr = resolve(peer).await.map_err(Upgrade::Failed)?;
    let stream = ctx
        .pool
        .open(peer.id, addr, tls, service.connect_timeout)
        .await
        .map_err(Upgrade::Connect)?;
    let mut sender = connect::hyper_client(stream)
        .await
        .map_err(Upgrade::Connect)?;
    ctx.stats.upstream_requests.inc();
    ctx.pool.tallies.request(peer.id);
    apply_overrides(&mut parts.headers, overrides);
    // Upgrades never have their body read by a plugin (see `route_and_proxy`).
    let Some(ClientBody {
        source: BodySource::Stream(stream),
        ..
    }) = body.take()
    else {
        return Err(Upgrade::Failed(UpstreamError::Failed));
    };
    let placeholder = Request::new(()).into_parts().0;
    let req = Request::from_parts(std::mem::replace(parts, placeholder), stream);
    Ok(tokio::time::timeout(service.read_timeout, sender.send_request(req)).await)
}

/// Sends the request to the service's upstream, retrying up to `service.retries` times, on
/// the next target when the service is balanced: on connection failures (nothing was sent),
/// and on timeouts or closed connections before any response byte when the request is
/// idempotent and its body (if any) is still at hand. A pooled connection found closed is
/// replaced without counting a failure, and a request without a body is sent again when a
/// reused connection closed before answering.
async fn send_upstream(
    ctx: &Rc<WorkerCtx>,
    service: &ServiceInfo,
    // By reference (as `overrides`): moved in, they would be held twice in this future.
    parts: &mut http::request::Parts,
    body: ClientBody,
    overrides: &mut Overrides,
    call: &Call<'_>,
) -> Result<Upstreamed, UpstreamError> {
    let upgrade = call.upgrade;
    // Upgrades keep their body for hyper's client; our exchange takes `None` for no body.
    let mut body = if !upgrade && body.is_empty() {
        None
    } else {
        Some(body)
    };
    let mut failures = 0u32;
    // Balanced targets tried so far (a retry goes to another one where there is one).
    let mut tried: smallvec::SmallVec<[usize; 4]> = smallvec::SmallVec::new();
    loop {
        let (peer, balancer_host, picked) = match &service.destination {
            Destination::Direct(p) => (p, None, None),
            Destination::Balanced(b) => {
                let req = crate::upstream::balancer::Request {
                    consumer_id: call.consumer_id,
                    client_ip: call
                        .client_ip
                        .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)),
                    headers: &parts.headers,
                    path: call.path,
                    query: call.query,
                    captures: call.captures,
                };
                match b.pick(&req, failures, &tried) {
                    Some(p) => {
                        if let Some(c) = p.set_cookie {
                            call.set_cookie.set(Some(c));
                        }
                        tried.push(p.index);
                        (p.peer, b.host_header.clone(), Some((b, p.index)))
                    }
                    None => return Err(UpstreamError::NoPeer),
                }
            }
            Destination::Unsupported(proto) => {
                tracing::error!("service protocol '{proto}' is not proxied over HTTP");
                return Err(UpstreamError::Failed);
            }
            Destination::Broken(why) => {
                tracing::error!("{why}");
                return Err(UpstreamError::Failed);
            }
        };
        // Counted as done (for least-connections and latency) when the response head arrives
        // or the attempt fails.
        let started = picked.is_some().then(Instant::now);
        // `None`: not the target's doing (a pooled connection found closed, a body too large).
        let finish = |outcome: Option<Outcome>| {
            if let Some((b, i)) = picked {
                let elapsed = started
                    .filter(|_| matches!(outcome, Some(Outcome::Status(_))))
                    .map(|t| t.elapsed());
                match outcome {
                    Some(o) => b.report(i, o, elapsed),
                    None => b.done(i, None),
                }
            }
        };
        let host_value = call
            .preserved_host
            .clone()
            .or(balancer_host)
            .unwrap_or_else(|| peer.host_header.clone());
        overrides[0].1 = Some(host_value);
        let key = PeerKey {
            peer: peer.id,
            tls: service.tls.as_ref().map(|cfg| Arc::as_ptr(cfg) as usize),
            dns: peer.dns.as_ref().map_or(0, |n| n.generation()),
        };
        // TLS parameters are only needed to open a connection: built there, not per request.
        let tls = || {
            service
                .tls
                .as_ref()
                .map(|cfg| (cfg, peer.server_name.clone()))
        };
        let connect_failed = |e: ConnectError, failures: &mut u32| {
            *failures += 1;
            tracing::debug!("connect to {}:{} failed: {e:?}", peer.host, peer.port);
            (*failures > service.retries).then_some(match e {
                ConnectError::Timeout => UpstreamError::Timeout,
                _ => UpstreamError::Failed,
            })
        };

        if upgrade {
            // Boxed: hyper's handshake and exchange are large futures, and only upgrades
            // (WebSocket) take this path; every other request's future stays small.
            let sent = Box::pin(send_upgrade(
                ctx,
                service,
                peer,
                tls(),
                parts,
                &mut body,
                overrides,
            ))
            .await;
            match sent {
                Err(Upgrade::Connect(e)) => {
                    finish(Some(connect_outcome(&e)));
                    match connect_failed(e, &mut failures) {
                        Some(err) => return Err(err),
                        None => continue,
                    }
                }
                Err(Upgrade::Failed(e)) => return Err(e),
                Ok(sent) => {
                    finish(Some(match &sent {
                        Ok(Ok(resp)) => Outcome::Status(resp.status().as_u16()),
                        Ok(Err(_)) => Outcome::TcpFailure,
                        Err(_) => Outcome::Timeout,
                    }));
                    return match sent {
                        Err(_) => Err(UpstreamError::Timeout),
                        Ok(Ok(resp)) => Ok(Upstreamed::Hyper(resp)),
                        Ok(Err(e)) => {
                            tracing::debug!(
                                "upstream {}:{} failed during upgrade: {e}",
                                peer.host,
                                peer.port
                            );
                            Err(UpstreamError::Failed)
                        }
                    };
                }
            }
        }

        let mut conn = match ctx.pool.checkout(&key) {
            Some(c) => c,
            // Only a new connection needs the address: resolve here, not per request.
            // Boxed: opening a connection (TCP, maybe TLS) is a large future and rare with
            // keep-alive; the request's own future stays small without it.
            None => match Box::pin(ctx.pool.open(
                peer.id,
                resolve(peer).await?,
                tls(),
                service.connect_timeout,
            ))
            .await
            {
                // Boxed once per connection: the request path moves it around by pointer.
                Ok(stream) => Box::new(Conn::new(stream, key)),
                Err(e) => {
                    finish(Some(connect_outcome(&e)));
                    match connect_failed(e, &mut failures) {
                        Some(err) => return Err(err),
                        None => continue,
                    }
                }
            },
        };
        ctx.stats.upstream_requests.inc();
        ctx.pool.tallies.request(peer.id);
        match conn
            .send(
                parts,
                body.take(),
                overrides,
                crate::http1::client::Timeouts {
                    write: service.write_timeout,
                    read: service.read_timeout,
                },
                &ctx.deadlines,
            )
            .await
        {
            Ok((rparts, framing)) => {
                finish(Some(Outcome::Status(rparts.status.as_u16())));
                return Ok(Upstreamed::H1(
                    rparts,
                    UpstreamBody::new(
                        conn,
                        ctx.pool.clone(),
                        framing,
                        service.read_timeout,
                        ctx.deadlines.clone(),
                    ),
                ));
            }
            Err(SendError::Retry(b)) => {
                finish(None);
                // Not a failure of the target (a pooled connection had closed): same target.
                tried.pop();
                body = b
            }
            // nginx's `proxy_next_upstream error timeout` as Kong runs it: no response byte
            // came back, so the request may go to the next target, unless it is not
            // idempotent (it may have taken effect) or its streamed body is gone.
            Err(SendError::Unanswered { timed_out, resend }) => {
                finish(Some(if timed_out {
                    Outcome::Timeout
                } else {
                    Outcome::TcpFailure
                }));
                failures += 1;
                tracing::debug!(
                    "upstream {}:{} gave no response ({})",
                    peer.host,
                    peer.port,
                    if timed_out { "timeout" } else { "closed" }
                );
                match resend {
                    Some(b) if idempotent(&parts.method) && failures <= service.retries => body = b,
                    _ if timed_out => return Err(UpstreamError::Timeout),
                    _ => return Err(UpstreamError::Failed),
                }
            }
            Err(SendError::Timeout) => {
                finish(Some(Outcome::Timeout));
                return Err(UpstreamError::Timeout);
            }
            Err(SendError::BodyTooLarge) => {
                finish(None);
                return Err(UpstreamError::BodyTooLarge);
            }
            Err(SendError::ClientBody { timed_out }) => {
                finish(None);
                return Err(UpstreamError::ClientBody { timed_out });
            }
            Err(SendError::Failed(e)) => {
                finish(Some(Outcome::TcpFailure));
                tracing::debug!("upstream {}:{} failed: {e}", peer.host, peer.port);
                return Err(UpstreamError::Failed);
            }
        }
    }
}
