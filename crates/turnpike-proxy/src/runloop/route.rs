//! Finding the request's route (the router compiled with the snapshot), then what nginx and
//! Kong decide as soon as the route is known: the log phase's bookkeeping, the HTTPS
//! redirect of an HTTPS-only route, and `client_max_body_size` for a declared length.

use http::header::{self, HeaderMap, HeaderValue};
use http::request::Parts;
use http::{Response, StatusCode};
use turnpike_plugins::log::{RequestDetails, Source};
use turnpike_router::RequestView;

use crate::runloop::body::ProxyBody;
use crate::runloop::ctx::{Ended, RequestCtx};
use crate::runloop::errors::{self, own_response};
use crate::runloop::forward::{client_ip, request_protocol};
use crate::runloop::log::{head_size, LogState};
use crate::runloop::session::{Session, Target};
use crate::snapshot::{Snapshot, LOG_HEADERS};
use crate::worker::ctx::{ConnInfo, WorkerCtx};

/// Finds the request's route (`Session::matched`), or answers the request here.
pub fn run(s: &mut Session<'_>) -> Result<(), Ended> {
    let (ctx, snap, conn, parts, t) = (s.ctx, s.snap, s.conn, &s.parts, &s.target);
    let rc = &mut *s.rc;
    let host = t.host();
    let authority = t.authority();
    let path = t.path();
    let view = RequestView {
        method: parts.method.as_str(),
        host,
        // Kong's `net.dst.port`: the Host's port, else the listener's.
        port: host_port(authority, host).unwrap_or(conn.local_port),
        path,
        headers: &parts.headers,
        sni: conn.sni.as_deref(),
        authority,
        query: t.query(),
        tls: conn.tls,
        peer: Some(conn.peer),
        local_ip: conn.local_ip,
        protocol: None,
    };
    let Some(m) = snap
        .router
        .find_cached(&view, &mut ctx.route_cache.borrow_mut())
    else {
        return Err(Box::new(rc.error(
            ctx,
            StatusCode::NOT_FOUND,
            errors::NO_ROUTE,
        )));
    };
    let route = m.route;
    let log = snap.routes[route.route_index()].log;
    if log != 0 {
        if log & crate::snapshot::LOG_TRIES != 0 {
            // A log plugin reads the balancer's tries: they are recorded without an
            // instrumentation.
            rc.spans
                .get_or_insert_with(|| Box::new(turnpike_plugins::spans::Spans::new(0, rc.start)))
                .record_tries = true;
        }
        rc.log = Some(log_state(
            snap,
            conn,
            parts,
            (t, host),
            route.route_index(),
            route.service_index(),
            rc,
        ));
    }

    if route.grpc != 0 {
        grpc_checks(ctx, conn, parts, route.grpc, rc)?;
    } else if !conn.tls && !route.accepts_http {
        // A plain-HTTP request on an HTTPS-only route: Kong's 426 or the configured redirect.
        if route.https_redirect_status_code == 426 {
            let mut r = rc.error(ctx, StatusCode::UPGRADE_REQUIRED, errors::USE_HTTPS);
            r.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
            r.headers_mut().insert(
                header::UPGRADE,
                HeaderValue::from_static("TLS/1.2, HTTP/1.1"),
            );
            return Err(Box::new(r));
        }
        let pq = t.path_and_query();
        let mut r = Response::new(ProxyBody::empty());
        *r.status_mut() = StatusCode::from_u16(route.https_redirect_status_code)
            .unwrap_or(StatusCode::MOVED_PERMANENTLY);
        if let Ok(v) = HeaderValue::from_str(&format!("https://{host}{pq}")) {
            r.headers_mut().insert(header::LOCATION, v);
        }
        return Err(Box::new(own_response(ctx, r, rc.start)));
    }

    // nginx's client_max_body_size, checked before any plugin runs (nginx checks it when it
    // picks the location): a declared length above it is refused before a byte is read.
    let max_body = ctx.gateway.settings.client_max_body_size;
    if max_body != 0 && declared_length(&parts.headers).is_some_and(|n| n > max_body) {
        return Err(Box::new(rc.error(
            ctx,
            StatusCode::PAYLOAD_TOO_LARGE,
            errors::PAYLOAD_TOO_LARGE,
        )));
    }
    s.matched = Some(m);
    Ok(())
}

/// Kong's checks once a gRPC route matched (`runloop/handler.lua`, access phase): a gRPC
/// request over HTTP/1 gets 426, a request that is not gRPC 415, and a cleartext gRPC request
/// on a route that lists only `grpcs` gRPC's Canceled (with HTTP 200, as Kong answers it).
fn grpc_checks(
    ctx: &WorkerCtx,
    conn: &ConnInfo,
    parts: &Parts,
    grpc: u8,
    rc: &RequestCtx,
) -> Result<(), Ended> {
    let is_grpc_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    if !is_grpc_type {
        return Err(Box::new(rc.error(
            ctx,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            errors::NON_GRPC,
        )));
    }
    if parts.version != http::Version::HTTP_2 {
        let mut r = rc.error(ctx, StatusCode::UPGRADE_REQUIRED, errors::USE_HTTP2);
        r.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        r.headers_mut()
            .insert(header::UPGRADE, HeaderValue::from_static("HTTP/2"));
        return Err(Box::new(r));
    }
    if grpc & turnpike_router::GRPC == 0 && !conn.tls {
        let mut r = errors::grpc_response(StatusCode::OK, Some(errors::GRPCS_ONLY), true);
        r.headers_mut()
            .insert(&errors::GRPC_STATUS, HeaderValue::from_static("1"));
        return Err(Box::new(own_response(ctx, r, rc.start)));
    }
    Ok(())
}

/// What the log phase will need, gathered now that the route (and its log plugins) is known.
// The snapshot as the worker holds it (see `WorkerCtx`): the log state keeps a clone.
#[allow(clippy::redundant_allocation)]
fn log_state(
    snap: &std::rc::Rc<std::sync::Arc<Snapshot>>,
    conn: &ConnInfo,
    parts: &Parts,
    (t, host): (&Target, &str),
    route: usize,
    service: Option<usize>,
    rc: &RequestCtx,
) -> Box<LogState> {
    let content_length = declared_length(&parts.headers).unwrap_or(0);
    let start_line = parts.method.as_str().len() + t.path_and_query().len() + 10;
    let details = (snap.routes[route].log & LOG_HEADERS != 0).then(|| {
        Box::new(RequestDetails {
            started_at: std::time::SystemTime::now() - rc.start.elapsed(),
            client_ip: client_ip(conn, &parts.headers),
            method: parts.method.clone(),
            uri: t.orig_uri.clone(),
            host: host.to_string(),
            tls: conn.tls,
            tls_info: conn.tls_info,
            request_headers: HeaderMap::new(),
            response_headers: HeaderMap::new(),
            upstream_uri: None,
        })
    });
    Box::new(LogState {
        snap: snap.clone(),
        route,
        service,
        protocol: request_protocol(conn),
        start: rc.start,
        request_id: rc.request_id.clone(),
        details,
        request_size: head_size(start_line, &parts.headers) + content_length,
        consumer: None,
        upstream_latency: None,
        source: Source::Error,
        status: 0,
        response_size: 0,
        ctx: Default::default(),
        spans: None,
    })
}

/// The request's Content-Length, when it declares one.
pub fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

/// The port after `host` in the Host as sent (`host` is its lower-cased start, as
/// [`host_without_port`](crate::runloop::session::host_without_port) gives it). Parsed by hand: `str::split_once` and `u16::from_str`
/// cost 220 instructions a request (callgrind, the plain-proxy gate).
#[inline]
fn host_port(authority: &str, host: &str) -> Option<u16> {
    let digits = authority.as_bytes().get(host.len()..)?.strip_prefix(b":")?;
    if digits.is_empty() || digits.len() > 5 {
        return None;
    }
    let mut n: u32 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        n = n * 10 + (d - b'0') as u32;
    }
    u16::try_from(n).ok()
}

/// Records the router's run (the `router` instrumentation) from `start` to now.
#[inline]
pub fn router_span(rc: &mut RequestCtx, start: Option<std::time::Instant>) {
    if let (Some(t), Some(s)) = (start, rc.spans.as_deref_mut()) {
        s.router = Some((t, std::time::Instant::now()));
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_host_port_is_read_after_the_host() {
        use super::host_port;
        assert_eq!(host_port("a.test:8000", "a.test"), Some(8000));
        assert_eq!(host_port("a.test", "a.test"), None);
        assert_eq!(host_port("a.test:", "a.test"), None);
        assert_eq!(host_port("a.test:99999", "a.test"), None);
        assert_eq!(host_port("a.test:8x", "a.test"), None);
        assert_eq!(host_port("[::1]:443", "[::1]"), Some(443));
    }
}
