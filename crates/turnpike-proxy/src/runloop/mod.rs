//! The request path as Kong's phases, in the order a request meets them (Kong's
//! `kong/init.lua`, Pingora's `ProxyHttp`): [`rewrite`] (global plugins, before the router),
//! [`route`], [`access`] (the route's plugins, then the body read), [`forward`] (the
//! upstream request), [`balancer`] (peer, connection, retries), [`header_filter`],
//! [`body_filter`] and [`log`] (when the response body is done). One [`ctx::RequestCtx`]
//! carries the request's state from one phase to the next.

pub mod access;
pub mod balancer;
pub mod body;
pub mod body_filter;
pub mod ctx;
pub mod errors;
pub mod forward;
pub mod gzip;
pub mod header_filter;
pub mod log;
pub mod rewrite;
pub mod route;

use std::rc::Rc;
use std::time::Instant;

use http::header;
use http::{Request, Response, StatusCode};
use turnpike_plugins::log::Source;
use turnpike_router::normalize_path;

use crate::body::idle::ReadIdle;
use crate::body::RequestBody;
use crate::http1::client::{BodySource, ClientBody};
use crate::http1::server::{Limits, OutsideHeaders, PendingUpgrade, Refused, Service};
use crate::snapshot::Destination;
use crate::worker::ctx::{ConnInfo, WorkerCtx};
use balancer::{Call, UpstreamError, Upstreamed};
use body::{BodyKind, ProxyBody, RequestGuard};
use ctx::RequestCtx;
use ctx::Target;
use errors::exit_response;
use route::host_without_port;

/// A client connection's requests, as the HTTP/1.1 server hands them over.
pub struct Connection {
    pub ctx: Rc<WorkerCtx>,
    pub info: Rc<ConnInfo>,
}

impl Service for Connection {
    type RequestBody = RequestBody;
    type ResponseBody = ProxyBody;

    // `handle`'s own future, not one wrapping it: a wrapper would copy it in.
    #[inline]
    fn call(
        &self,
        request: Request<RequestBody>,
        seen: u32,
        upgrade: Option<PendingUpgrade>,
    ) -> impl std::future::Future<Output = Response<ProxyBody>> {
        handle(self.ctx.clone(), self.info.clone(), request, seen, upgrade)
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
) -> Response<ProxyBody> {
    let start = Instant::now();
    ctx.stats.requests.inc();
    // In flight until the response body is done: the keepalive timeout does not run meanwhile.
    let guard = RequestGuard::new(conn.clone(), ctx.clone());
    let mut rc = RequestCtx::new(start, ctx.request_id(), seen);
    let trace_spans = ctx.gateway.settings.trace_spans;
    if trace_spans != 0 {
        rc.spans = Some(Box::new(turnpike_plugins::spans::Spans::new(
            trace_spans,
            start,
        )));
    }
    rc.gzip = ctx
        .gateway
        .settings
        .gzip
        .as_ref()
        .map(|g| gzip::request(g, &req));
    rc.access_record = ctx.access_log.as_ref().map(|_| {
        Box::new(crate::worker::access_log::AccessRecord::new(
            start,
            forward::client_ip(&conn, req.headers()),
            &req,
            &rc.request_id,
        ))
    });
    let mut resp = proxy(&ctx, &conn, (req, upgrade), &mut rc).await;
    header_filter::run(&ctx, &conn, &mut resp, &mut rc);
    arm_log(&mut resp, guard, &mut rc);
    resp
}

/// From the request to the upstream's response (or the gateway's own): rewrite, route,
/// access, the upstream request, the balancer and the exchange.
async fn proxy(
    ctx: &Rc<WorkerCtx>,
    conn: &ConnInfo,
    // The request, and where its connection comes if it upgrades.
    (req, client_upgrade): (Request<RequestBody>, Option<PendingUpgrade>),
    rc: &mut RequestCtx,
) -> Response<ProxyBody> {
    let snap = ctx.snapshot();
    let upgrade = client_upgrade.is_some() && forward::is_upgrade(&req);
    let client_version = req.version();
    let (mut parts, body) = req.into_parts();
    rc.note_accept(&parts.headers);
    rc.note_grpc(client_version, &parts.headers);
    // The original URI is kept aside: its path is borrowed while the upstream URI is built.
    let orig_uri = std::mem::take(&mut parts.uri);
    let path = normalize_path(orig_uri.path());

    if let Some(e) = rewrite::run(&snap, conn, &mut parts, (&path, orig_uri.query()), rc) {
        return exit_response(ctx, e, rc.start, rc.grpc);
    }

    let host_value = parts.headers.get(header::HOST).cloned();
    let authority = match orig_uri.authority() {
        Some(a) => Some(a.as_str()),
        None => host_value.as_ref().and_then(|v| v.to_str().ok()),
    }
    .unwrap_or("");
    let host = host_without_port(authority);
    let target = Target {
        orig_uri: &orig_uri,
        path: &path,
        host: &host,
        authority,
    };
    let router_start = turnpike_plugins::spans::start(&rc.spans, turnpike_plugins::spans::ROUTER);
    let m = match route::run(ctx, &snap, conn, &parts, &target, rc) {
        Ok(m) => m,
        Err(r) => {
            route::router_span(rc, router_start);
            return *r;
        }
    };
    route::router_span(rc, router_start);
    let route = m.route;

    let mut body = BodySource::Stream(body);
    let query = orig_uri.query();
    // Only a route with plugins pays for the access phase's future.
    let plugins = !snap.routes[route.route_index()].chain.is_empty();
    if plugins {
        if let Err(r) = access::run(
            ctx,
            &snap,
            conn,
            route,
            &mut parts,
            (
                &path,
                query,
                orig_uri.path_and_query().map_or("/", |pq| pq.as_str()),
                m.captures.as_deref(),
            ),
            &mut body,
            upgrade,
            rc,
        )
        .await
        {
            return *r;
        }
    }
    let limit = access::body_limit(ctx, rc);
    // A gRPC upstream gets the body as it streams (client and bidirectional streaming
    // calls): Kong's `@grpc` location buffers nothing.
    let grpc_service = route
        .service_index()
        .is_some_and(|si| snap.services[si].grpc);
    rc.grpc_upstream = grpc_service;
    if !grpc_service && access::buffers_body(route, &body, upgrade) {
        if let Err(r) = access::buffer_body(ctx, &mut parts, &mut body, limit, rc).await {
            return *r;
        }
    }

    let Some(si) = route.service_index() else {
        return rc.error(ctx, StatusCode::SERVICE_UNAVAILABLE, errors::NO_SERVICE);
    };
    let service = &snap.services[si];
    let plugins_ran = plugins || !snap.global_rewrite.is_empty();
    // Slot 0 is the Host header, set per attempt by `balancer::send`.
    let mut overrides = crate::http1::client::Overrides::new(false);
    let preserved_host = match forward::run(
        ctx,
        conn,
        (&m, service),
        &mut parts,
        &target,
        host_value.as_ref(),
        (plugins_ran, upgrade),
        &mut overrides,
        rc,
    ) {
        Ok(h) => h,
        Err(r) => return *r,
    };

    let up_start = Instant::now();
    rc.proxy_latency = up_start - rc.start;
    // What a balancer may hash on; the client address only when a balancer may need it.
    let call = Call {
        preserved_host,
        upgrade,
        consumer_id: rc.consumer.as_deref().map(|c| c.consumer_id()),
        client_ip: match service.destination {
            Destination::Balanced(_) => Some(forward::client_ip(conn, &parts.headers)),
            _ => None,
        },
        path: &path,
        query,
        captures: m.captures.as_deref(),
        set_cookie: std::cell::Cell::new(None),
        spans: rc.spans.as_deref(),
    };
    let sent = balancer::send(
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
            rc.upstream_named_kong = body.named_kong_headers;
            let mut body = ProxyBody::new(BodyKind::Upstream(body));
            let mut parts = parts;
            if route.response_buffering && parts.status != StatusCode::SWITCHING_PROTOCOLS {
                body.read_ahead(&mut parts.headers, &ctx.gateway.settings.proxy_temp);
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
            forward::strip_hop_by_hop(&mut parts.headers, false);
            rc.upstream_named_kong = true;
            let body = if grpc_service {
                // nginx's grpc_read_timeout: between two reads, not over the whole call.
                BodyKind::Grpc(ReadIdle::new(body, service.read_timeout()))
            } else {
                BodyKind::Hyper(body)
            };
            (parts, ProxyBody::new(body))
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
            return match e {
                // nginx's own errors, answered by Kong's error handler.
                UpstreamError::Failed | UpstreamError::Timeout => rc.proxy_error(ctx, status, msg),
                _ => rc.error(ctx, status, msg),
            };
        }
    };
    rc.from_upstream = true;
    rc.upstream_latency = up_start.elapsed();
    if let Some(l) = rc.log.as_deref_mut() {
        l.source = Source::Service;
        l.upstream_latency = Some(rc.upstream_latency);
    }
    parts.version = client_version;
    if let Some(c) = call.set_cookie.take() {
        parts.headers.append(header::SET_COOKIE, c);
    }
    Response::from_parts(parts, body)
}

/// Hands the request's log phase and access-log line to its guard, which the response body
/// carries: they run when the body is done (or dropped). What they need is taken out of the
/// request's state (by reference: moving the whole state in cost a copy of it per request).
fn arm_log(resp: &mut Response<ProxyBody>, mut guard: RequestGuard, rc: &mut RequestCtx) {
    if let Some(mut a) = rc.access_record.take() {
        a.status = resp.status().as_u16();
        guard.access = Some(a);
    }
    if let Some(mut l) = rc.log.take() {
        l.ctx = std::mem::take(&mut rc.plugin_ctx);
        l.spans = rc.spans.take();
        // The response as it leaves: its status, head and (counted as it streams) body.
        l.status = resp.status().as_u16();
        if let Some(d) = l.details.as_deref_mut() {
            d.response_headers = resp.headers().clone();
        }
        guard.log = Some(l);
    }
    resp.body_mut().set_guard(guard);
}
