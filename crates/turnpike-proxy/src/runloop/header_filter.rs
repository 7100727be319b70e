//! Kong's header_filter phase: Kong's own response headers (Via, X-Kong-*), the plugins'
//! headers, then the plugins' `header_filter` in PRIORITY order, whose body filters wrap the
//! body (the body_filter phase). Headers that nothing reads or replaces stay out of the
//! header map and go straight into an HTTP/1.1 head (`http1::server::OutsideHeaders`).

use http::header::{self, HeaderName, HeaderValue};
use http::Response;

use crate::http1::header_names::names;
use crate::runloop::body::ProxyBody;
use crate::runloop::ctx::RequestCtx;
use crate::runloop::errors::ms;
use crate::runloop::session::Session;

pub static X_KONG_REQUEST_ID: HeaderName = names::X_KONG_REQUEST_ID;
static X_KONG_PROXY_LATENCY: HeaderName = names::X_KONG_PROXY_LATENCY;
static X_KONG_UPSTREAM_LATENCY: HeaderName = names::X_KONG_UPSTREAM_LATENCY;
static X_KONG_UPSTREAM_STATUS: HeaderName = names::X_KONG_UPSTREAM_STATUS;

/// Runs the header_filter phase over the response.
pub fn run(s: &mut Session<'_>, resp: &mut Response<ProxyBody>) {
    let (ctx, conn) = (s.ctx, s.conn);
    let rc = &mut *s.rc;
    let settings = &ctx.gateway.settings;
    let plugin_headers = std::mem::take(&mut rc.plugin_headers);
    // Kong's own headers go straight into an HTTP/1.1 response head (no header-map insert, no
    // hash) unless something needs them in the map: HTTP/2, a log phase that reads the
    // response headers (a log plugin that does not, as metrics and tracing, leaves them out
    // of the map), a header_filter phase (plugins see and may change Kong's headers, as
    // Kong sets them before its plugins' header_filter), or an upstream or a plugin that set
    // headers of those names.
    let plugin_named_kong = plugin_headers
        .iter()
        .any(|(k, _)| k == header::VIA || k.as_str().starts_with("x-kong-"));
    // Compression needs the map only for a response it may compress (or mark with Vary):
    // one below gzip_min_length, a 304, a HEAD, goes out as if gzip were off.
    let gzip = rc.gzip.filter(|g| {
        settings.gzip.as_ref().is_some_and(|conf| {
            let length = match resp.body().raw_head() {
                Some(raw) => raw.content_length,
                None => resp
                    .headers()
                    .get(header::CONTENT_LENGTH)
                    .and_then(|v| v.to_str().ok()?.parse().ok()),
            };
            crate::runloop::gzip::may_apply(conf, g, resp.status(), length)
        })
    });
    let head_direct = conn.http1
        && rc.log.as_deref().is_none_or(|l| l.details.is_none())
        && rc.filters.is_empty()
        && gzip.is_none()
        && !rc.upstream_named_kong
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
        let (mut parts, mut body) = take(resp).into_parts();
        // Room for the plugins' headers too: a map that regrows costs ~900 instructions.
        body.merge_raw_head(&mut parts.headers, plugin_headers.len());
        *resp = Response::from_parts(parts, body);
    }
    // Set for every request, so that nothing of an earlier one's is left in the slot.
    let mut outside = ctx.response_extra.borrow_mut();
    if head_direct {
        let h = resp.headers_mut();
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
        // Written in the slot itself: no list moved per request.
        let kong = &mut outside.kong;
        kong.clear();
        kong_headers(settings, resp.status(), rc, |k, v| kong.push((k, v)));
        if settings.headers.request_id {
            kong.push((X_KONG_REQUEST_ID.clone(), rc.request_id.clone()));
        }
    } else {
        outside.clear();
        // In the map, in this order: Kong's proxy headers (Via appended, the others replacing
        // an upstream's), the plugins' (replacing those), the request id last.
        let status = resp.status();
        let h = resp.headers_mut();
        kong_headers(settings, status, rc, |k, v| {
            if k == header::VIA {
                h.append(k, v);
            } else {
                h.insert(k, v);
            }
        });
        for (k, v) in plugin_headers {
            h.insert(k, v);
        }
        if settings.headers.request_id {
            h.insert(X_KONG_REQUEST_ID.clone(), rc.request_id.clone());
        }
    }
    drop(outside);
    // The plugins' header_filter, in PRIORITY order; the body filters it asks for (the
    // body_filter phase) wrap the body.
    if !rc.filters.is_empty() {
        let (mut parts, mut body) = take(resp).into_parts();
        let mut head = turnpike_plugins::ResponseHead {
            status: parts.status,
            headers: &mut parts.headers,
            from_upstream: rc.from_upstream,
            consumer: rc.consumer.as_deref(),
            ctx: &mut rc.plugin_ctx,
            buffered: rc.buffered.as_ref(),
        };
        let timed = rc
            .spans
            .as_deref()
            .is_some_and(|s| s.has(turnpike_plugins::spans::PLUGIN_HEADER_FILTER));
        let mut body_filters = Vec::new();
        for f in &rc.filters {
            let t = timed.then(std::time::Instant::now);
            body_filters.extend(f.handler.header_filter(&mut head));
            if let (Some(t), Some(s)) = (t, rc.spans.as_deref_mut()) {
                s.plugin("header_filter", f.name, t);
            }
        }
        parts.status = head.status;
        if !body_filters.is_empty() {
            body.filter(body_filters);
        }
        *resp = Response::from_parts(parts, body);
    }
    // Response compression, after the plugins (nginx's gzip filter runs after Kong's).
    if let (Some(g), Some(conf)) = (gzip, settings.gzip.as_ref()) {
        let (mut parts, mut body) = take(resp).into_parts();
        let length = parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if crate::runloop::gzip::apply(conf, &g, parts.status, &mut parts.headers) {
            body.filter(vec![Box::new(crate::runloop::gzip::Encoder::new(
                conf.level,
                &ctx.gzip_encoders,
                length,
            ))]);
        }
        *resp = Response::from_parts(parts, body);
    }
    // Client keepalive_requests: close the connection after that many requests (HTTP/1).
    let n = conn.requests.get() + 1;
    conn.requests.set(n);
    if conn.http1 && settings.keepalive_requests > 0 && n >= settings.keepalive_requests {
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    if let Some(l) = rc.log.as_deref_mut() {
        l.response_size = head_size(resp, head_direct.then(|| ctx.response_extra.borrow()));
    }
}

/// The response head's size as it will be written, for the log entry: the map's headers and,
/// when the head goes out directly, the upstream's kept lines, the plugins' and Kong's.
fn head_size(
    resp: &Response<ProxyBody>,
    outside: Option<std::cell::Ref<'_, crate::http1::server::OutsideHeaders>>,
) -> u64 {
    let mut size = crate::runloop::log::head_size(12, resp.headers());
    if let Some(outside) = outside {
        let fields = |list: &[(HeaderName, HeaderValue)]| -> u64 {
            list.iter()
                .map(|(k, v)| (k.as_str().len() + v.len() + 4) as u64)
                .sum()
        };
        size += resp.body().raw_head().map_or(0, |r| {
            r.lines
                .iter()
                .map(|l| u64::from(l[1] - l[0] + l[3] - l[2] + 4))
                .sum()
        }) + fields(&outside.plugins)
            + fields(&outside.kong);
    }
    size
}

/// Kong's proxy headers for a response from the upstream (Via, X-Kong-Upstream-Latency,
/// X-Kong-Proxy-Latency, X-Kong-Upstream-Status), in the order Kong sends them, as the
/// node's `headers` property asks; the request id is the caller's, last.
fn kong_headers(
    settings: &crate::state::Settings,
    status: http::StatusCode,
    rc: &RequestCtx,
    mut put: impl FnMut(HeaderName, HeaderValue),
) {
    if !rc.from_upstream {
        return;
    }
    let s = &settings.headers;
    if s.via {
        // Kong's proxy_http_version: 2 to a grpc/grpcs upstream, 1.1 otherwise.
        static VIA_H2: HeaderValue =
            HeaderValue::from_static(concat!("2 turnpike/", env!("CARGO_PKG_VERSION")));
        let via = if rc.grpc_upstream {
            VIA_H2.clone()
        } else {
            settings.via_value.clone()
        };
        put(header::VIA, via);
    }
    if s.upstream_latency {
        put(X_KONG_UPSTREAM_LATENCY.clone(), ms(rc.upstream_latency));
    }
    if s.proxy_latency {
        put(X_KONG_PROXY_LATENCY.clone(), ms(rc.proxy_latency));
    }
    if s.upstream_status {
        put(
            X_KONG_UPSTREAM_STATUS.clone(),
            HeaderValue::from(status.as_u16()),
        );
    }
}

/// The response, leaving an empty one in its place (to take it apart and put it back).
fn take(resp: &mut Response<ProxyBody>) -> Response<ProxyBody> {
    std::mem::replace(resp, Response::new(ProxyBody::empty()))
}
