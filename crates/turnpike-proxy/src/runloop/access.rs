//! Kong's access phase: the route's plugins in PRIORITY order (the consumer's own configs
//! where it has them); one may answer instead of the upstream. A plugin that reads the body
//! gets it whole first; after the plugins, the route's `request_buffering` reads the body
//! before an upstream is chosen.

use http::header::{self, HeaderMap, HeaderValue};
use http::request::Parts;
use http::StatusCode;
use turnpike_plugins::log::Source;
use turnpike_plugins::{spans, Access, AccessRequest, Identity};
use turnpike_router::RouteEntry;

use crate::body::spool::{self, SpoolError};
use crate::http1::client::BodySource;
use crate::runloop::ctx::{Ended, RequestCtx};
use crate::runloop::errors::{self, exit_response};
use crate::runloop::forward::{client_ip, request_protocol};
use crate::runloop::session::Session;
use crate::snapshot::{Bound, Slot};
use crate::worker::ctx::WorkerCtx;

/// The most a request body read whole for a plugin may hold (Kong buffers to disk beyond its
/// client_body_buffer_size; we refuse instead of holding unbounded bodies in memory).
const PLUGIN_BODY_MAX: usize = 8 << 20;

/// Runs the route's access phase over the request's head and body.
pub async fn run(s: &mut Session<'_>) -> Result<(), Ended> {
    let (ctx, snap, conn) = (s.ctx, s.snap, s.conn);
    let m = s
        .matched
        .as_ref()
        .expect("the access phase runs on a route");
    let (route, captures) = (m.route, m.captures.as_deref());
    let compiled = &snap.routes[route.route_index()];
    let chain = &compiled.chain;
    let rc = &mut *s.rc;
    // A plugin that reads the body (key-auth's key_in_body) gets it whole, read here
    // within a bound; the upstream then gets those bytes.
    let mut buffered = None;
    if compiled.want_body && s.client_upgrade.is_none() {
        if let BodySource::Stream(stream) =
            std::mem::replace(&mut s.body, BodySource::Buffered(bytes::Bytes::new()))
        {
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
                    return Err(Box::new(rc.error(ctx, status, msg)));
                }
            }
        }
    }
    let parts = &mut s.parts;
    let client_ip = client_ip(conn, &parts.headers);
    let protocol = request_protocol(conn);
    let chain_filters = compiled.filter;
    let mut access = AccessRequest {
        target: s.target.path_and_query(),
        version: parts.version,
        body: buffered,
        route_id: &compiled.route.id,
        service_id: route
            .service_index()
            .map(|i| snap.config.services[i].id.as_ref()),
        trusted: conn.trusted,
        server_port: conn.local_port,
        client_port: conn.peer.port(),
        request_id: Some(&rc.request_id),
        started: Some(rc.start),
        captures,
        ..AccessRequest::new(
            parts.method.as_str(),
            s.target.path(),
            s.target.query(),
            &mut parts.headers,
            &mut rc.plugin_headers,
            conn.tls,
            client_ip,
            &mut rc.plugin_ctx,
            &mut rc.upstream,
        )
    };
    let timed = rc
        .spans
        .as_deref()
        .is_some_and(|s| s.has(spans::PLUGIN_ACCESS));
    for slot in chain.iter() {
        let consumer = access.consumer.as_deref().map(|c| c.consumer_id());
        let Some(bound) = slot.bound_for(consumer, protocol) else {
            continue;
        };
        let t = timed.then(std::time::Instant::now);
        let exit = match bound.handler.access(&mut access) {
            Access::Continue => None,
            Access::Exit(e) => Some(e),
            // Only a plugin that has to wait pays for the future.
            wait @ Access::Wait(_) => turnpike_plugins::run_access_from(wait, &mut access).await,
        };
        if let Some(t) = t {
            if let Some(s) = rc.spans.as_deref_mut() {
                s.plugin("access", bound.name, t);
            }
        }
        if let Some(e) = exit {
            if chain_filters {
                rc.filters = response_filters(chain, access.consumer.as_deref(), protocol);
            }
            if let Some(l) = rc.log.as_deref_mut() {
                l.source = Source::Exit;
                l.consumer = access.consumer.clone();
                if let Some(d) = l.details.as_deref_mut() {
                    d.request_headers = with_identity(access.headers, access.consumer.as_deref());
                }
            }
            return Err(Box::new(exit_response(ctx, e, rc.start, rc.grpc)));
        }
    }
    let consumer = access.consumer;
    let plugin_body = access.body;
    if chain_filters {
        rc.filters = response_filters(chain, consumer.as_deref(), protocol);
    }
    if matches!(s.body, BodySource::Buffered(_)) {
        // What the plugins leave is what goes upstream, with its length.
        let b = plugin_body.unwrap_or_default();
        parts.headers.remove(header::TRANSFER_ENCODING);
        parts
            .headers
            .insert(header::CONTENT_LENGTH, HeaderValue::from(b.len()));
        s.body = BodySource::Buffered(b);
    }
    if let Some(l) = rc.log.as_deref_mut() {
        l.consumer = consumer.clone();
        // As the plugins left them (a hidden credential is not logged).
        if let Some(d) = l.details.as_deref_mut() {
            d.request_headers = with_identity(&parts.headers, consumer.as_deref());
        }
    }
    rc.consumer = consumer;
    if let Some(m) = rc.upstream.method.take() {
        parts.method = m;
    }
    Ok(())
}

/// After the plugins, the body as the upstream gets it: a gRPC service's streams as it comes
/// (Kong's `@grpc` location buffers nothing: client and bidirectional streaming calls); for
/// others, the route's `request_buffering` reads it whole first (`read_whole`).
pub async fn read_body(s: &mut Session<'_>) -> Result<(), Ended> {
    let route = s.matched().route;
    let grpc_service = route
        .service_index()
        .is_some_and(|si| s.snap.services[si].grpc);
    s.rc.grpc_upstream = grpc_service;
    if grpc_service || !buffers_body(route, &s.body, s.upgrade()) {
        return Ok(());
    }
    let limit = body_limit(s.ctx, s.rc);
    read_whole(s.ctx, &mut s.parts, &mut s.body, limit, s.rc).await
}

/// The most body bytes the upstream may get: client_max_body_size and a plugin's
/// (request-size-limiting), whichever is lower, whether the body is buffered or streamed.
pub fn body_limit(ctx: &WorkerCtx, rc: &RequestCtx) -> Option<u64> {
    match (
        rc.upstream.body_limit,
        ctx.gateway.settings.client_max_body_size,
    ) {
        (l, 0) => l,
        (Some(l), m) => Some(l.min(m)),
        (None, m) => Some(m),
    }
}

/// Whether the route's request_buffering reads this request's body before the upstream is
/// chosen: a streamed body not at its end yet, on a request that does not upgrade.
fn buffers_body(route: &RouteEntry, body: &BodySource, upgrade: bool) -> bool {
    route.request_buffering
        && !upgrade
        && matches!(body, BodySource::Stream(s) if !http_body::Body::is_end_stream(s))
}

/// Kong's request_buffering (the default): the whole body is read before an upstream is
/// chosen and connected to, so a slow client holds no upstream connection and the upstream
/// never gets a request its client abandoned. Held to `limit` (`body_limit`).
async fn read_whole(
    ctx: &WorkerCtx,
    parts: &mut Parts,
    body: &mut BodySource,
    limit: Option<u64>,
    rc: &RequestCtx,
) -> Result<(), Ended> {
    let BodySource::Stream(stream) = body else {
        return Ok(());
    };
    let settings = &ctx.gateway.settings;
    let plugin_bound = rc.upstream.body_limit.is_some() && limit == rc.upstream.body_limit;
    let read = spool::read(
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
            *body = BodySource::Spooled(spool);
            Ok(())
        }
        Err(e) => {
            let (status, msg) = match e {
                SpoolError::TooLarge if plugin_bound => {
                    (StatusCode::PAYLOAD_TOO_LARGE, errors::BODY_TOO_LARGE)
                }
                SpoolError::TooLarge => (StatusCode::PAYLOAD_TOO_LARGE, errors::PAYLOAD_TOO_LARGE),
                SpoolError::TimedOut => (StatusCode::REQUEST_TIMEOUT, errors::REQUEST_TIMEOUT),
                SpoolError::Unreadable => (StatusCode::BAD_REQUEST, errors::BAD_BODY),
                SpoolError::Storage => (StatusCode::INTERNAL_SERVER_ERROR, errors::UNEXPECTED),
            };
            Err(Box::new(rc.error(ctx, status, msg)))
        }
    }
}

/// The configs of a chain that filter responses, as they apply to this consumer and protocol.
fn response_filters(chain: &[Slot], consumer: Option<&Identity>, protocol: u8) -> Vec<Bound> {
    let consumer = consumer.map(|c| c.consumer_id());
    chain
        .iter()
        .filter_map(|s| s.bound_for(consumer, protocol))
        .filter(|b| b.handler.phases().has(turnpike_plugins::Phases::RESPONSE))
        .cloned()
        .collect()
}

/// The request headers as the upstream gets them from the plugins, for log plugins (Kong logs
/// what `set_header` left): the client's with the consumer's identity headers over them.
fn with_identity(h: &HeaderMap, who: Option<&Identity>) -> HeaderMap {
    let mut h = h.clone();
    for (name, value) in who.into_iter().flat_map(|w| w.upstream_headers()) {
        match value {
            Some(v) => {
                h.insert(name, v);
            }
            None => {
                h.remove(name);
            }
        }
    }
    h
}
