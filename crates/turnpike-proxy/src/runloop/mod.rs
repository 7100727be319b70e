//! The request path as Kong's phases, in the order a request meets them (Kong's
//! `kong/init.lua`, Pingora's `ProxyHttp`): [`rewrite`] (global plugins, before the router),
//! [`route`], [`access`] (the route's plugins, then the body read), [`forward`] (the
//! upstream request), [`balancer`] (peer, connection, retries), [`response`] (the upstream's
//! response read whole, when a plugin asks: Kong's buffered proxying), [`header_filter`],
//! [`body_filter`] and [`log`] (when the response body is done). Each phase takes the
//! request's [`session::Session`] (the request, what the router matched, and the
//! [`ctx::RequestCtx`] carried from one phase to the next).

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
pub mod response;
pub mod rewrite;
pub mod route;
pub mod session;

use std::rc::Rc;
use std::time::Instant;

use http::{Request, Response};

use crate::body::RequestBody;
use crate::http1::client::{BodySource, Overrides};
use crate::http1::server::{Limits, OutsideHeaders, PendingUpgrade, Refused, Service};
use crate::worker::ctx::{ConnInfo, WorkerCtx};
use body::{ProxyBody, RequestGuard};
use ctx::{Ended, RequestCtx};
use session::{Session, Target};

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
    let snap = ctx.snapshot();
    // An upgrade the client asked for, on a connection that can take it.
    let upgrade = upgrade.filter(|_| forward::is_upgrade(&req));
    let (mut parts, body) = req.into_parts();
    // The session lives in this block and is dropped where it stands at its end (passing it
    // to `drop` would first move its ~1.5 KB: 172 instructions a request, measured).
    let mut resp = {
        // Built in place (a constructor returning it would move it once more).
        let mut s = Session {
            ctx: &ctx,
            conn: &conn,
            snap: &snap,
            // The original URI is kept aside; the upstream's is set by the forward phase.
            target: Target::new(std::mem::take(&mut parts.uri)),
            client_version: parts.version,
            parts,
            body: BodySource::Stream(body),
            client_upgrade: upgrade,
            matched: None,
            overrides: Overrides::new(false),
            preserved_host: None,
            rc: &mut rc,
        };
        let mut resp = match proxy(&mut s).await {
            Ok(r) => r,
            Err(r) => *r,
        };
        if response::wanted(&s, &resp) {
            response::run(&mut s, &mut resp).await;
        }
        header_filter::run(&mut s, &mut resp);
        resp
    };
    arm_log(&mut resp, guard, &mut rc);
    resp
}

/// From the request to the upstream's response (or the gateway's own): Kong's phases in
/// their order, each over the request's session.
async fn proxy(s: &mut Session<'_>) -> Result<Response<ProxyBody>, Ended> {
    s.rc.note_accept(&s.parts.headers);
    s.rc.note_grpc(s.parts.version, &s.parts.headers);
    if !s.snap.global_rewrite.is_empty() {
        rewrite::run(s).await?;
    }
    // The router's view of the Host is what the rewrite phase left.
    s.target.note_host(&s.parts);
    let router_start = turnpike_plugins::spans::start(&s.rc.spans, turnpike_plugins::spans::ROUTER);
    let routed = route::run(s);
    route::router_span(s.rc, router_start);
    routed?;
    // Only a route with plugins pays for the access phase's future.
    let route = s.matched().route;
    if !s.snap.routes[route.route_index()].chain.is_empty() {
        access::run(s).await?;
    }
    access::read_body(s).await?;
    forward::run(s)?;
    balancer::run(s).await
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
