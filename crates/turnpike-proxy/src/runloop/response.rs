//! Kong's response phase (buffered proxying, `Kong.response` in `kong/init.lua`): when one of
//! the route's plugins has a `response` phase, or a plugin asked for it in the access phase
//! (`kong.service.request.enable_buffering`), the upstream's response is read whole before
//! anything goes to the client. The plugins' `response` then run in PRIORITY order over it:
//! they read its body (`kong.service.response.get_raw_body`), may change its status and
//! headers, or replace it (`kong.response.exit`). The header_filter phase follows with the
//! body whole and its length known.
//!
//! As in Kong, an upgrade is not buffered (the connection is the body); neither is gRPC,
//! whose calls stream (Kong's buffered location speaks HTTP/1.1 only).

use bytes::Bytes;
use http::{header, Method, Response, StatusCode};
use http_body_util::BodyExt;

use crate::runloop::body::ProxyBody;
use crate::runloop::errors;
use crate::runloop::session::Session;
use turnpike_plugins::Phases;

/// The most of an upstream's body the phase holds (Kong holds any size in memory); past it the
/// client gets Kong's 502 for a truncated buffered response, and a log line says why.
pub const MAX_BUFFERED: usize = 128 << 20;

/// Whether this request's response is read whole first: a response-phase plugin in its
/// chain, or buffering asked for; only for an upstream's response that is not an upgrade or
/// gRPC. Costs one length check for a route without response-filtering plugins.
#[inline]
pub fn wanted(s: &Session<'_>, resp: &Response<ProxyBody>) -> bool {
    let rc = &*s.rc;
    (rc.upstream.buffered
        || (!rc.filters.is_empty()
            && rc
                .filters
                .iter()
                .any(|b| b.handler.phases().has(Phases::BUFFERED))))
        && rc.from_upstream
        && !rc.grpc
        && !rc.grpc_upstream
        && resp.status() != StatusCode::SWITCHING_PROTOCOLS
}

/// Reads the upstream's body whole, runs the plugins' response phases over it, and leaves the
/// response with its body whole (or the plugin's own, or Kong's 502 if the body could not be
/// read).
pub async fn run(s: &mut Session<'_>, resp: &mut Response<ProxyBody>) {
    let (ctx, rc) = (s.ctx, &mut *s.rc);
    let (mut parts, mut body) =
        std::mem::replace(resp, Response::new(ProxyBody::empty())).into_parts();
    // The plugins read and change the upstream's headers: all of them in the map.
    body.merge_raw_head(&mut parts.headers, 0);
    let whole = match read_whole(body).await {
        Ok(b) => b,
        Err(why) => {
            tracing::error!("buffered proxying: the upstream's response was cut short: {why}");
            rc.from_upstream = false;
            *resp = rc.proxy_error(ctx, StatusCode::BAD_GATEWAY, errors::BAD_GATEWAY);
            return;
        }
    };
    let mut head = turnpike_plugins::ResponseHead {
        status: parts.status,
        headers: &mut parts.headers,
        from_upstream: true,
        consumer: rc.consumer.as_deref(),
        ctx: &mut rc.plugin_ctx,
        buffered: Some(&whole),
    };
    let mut exit = None;
    for b in &rc.filters {
        if !b.handler.phases().has(Phases::BUFFERED) {
            continue;
        }
        if let Some(e) = turnpike_plugins::run_response(b.handler.as_ref(), &mut head).await {
            exit = Some(e);
            break;
        }
    }
    parts.status = head.status;
    // The body stays readable by the header_filter phase (kong.service.response.get_raw_body),
    // an exit's too, as Kong keeps the buffered body in the request's context.
    rc.buffered = Some(whole.clone());
    // Framing is the proxy's to write, for the body the client gets.
    parts.headers.remove(header::TRANSFER_ENCODING);
    if let Some(e) = exit {
        // Kong's exit here keeps the upstream's headers (`kong.response.set_headers` ran
        // before the plugins), the exit's over them.
        parts.headers.remove(header::CONTENT_LENGTH);
        let mut r = errors::exit_response(ctx, e, rc.start, false);
        let own = std::mem::take(r.headers_mut());
        *r.headers_mut() = parts.headers;
        let mut last = None;
        for (name, value) in own {
            if let Some(n) = name {
                r.headers_mut().remove(&n);
                last = Some(n);
            }
            if let Some(n) = &last {
                r.headers_mut().append(n.clone(), value);
            }
        }
        rc.from_upstream = false;
        if let Some(l) = rc.log.as_deref_mut() {
            l.source = turnpike_plugins::log::Source::Exit;
        }
        *resp = r;
        return;
    }
    let bodiless = s.parts.method == Method::HEAD
        || parts.status.is_informational()
        || parts.status == StatusCode::NO_CONTENT
        || parts.status == StatusCode::NOT_MODIFIED;
    if !bodiless {
        parts.headers.insert(
            header::CONTENT_LENGTH,
            header::HeaderValue::from(whole.len()),
        );
    }
    *resp = Response::from_parts(parts, ProxyBody::full(whole));
}

/// The body, whole, within `MAX_BUFFERED` (trailers dropped: its length is known now).
async fn read_whole(body: ProxyBody) -> Result<Bytes, String> {
    http_body_util::Limited::new(body, MAX_BUFFERED)
        .collect()
        .await
        .map(|c| c.to_bytes())
        .map_err(|e| e.to_string())
}
