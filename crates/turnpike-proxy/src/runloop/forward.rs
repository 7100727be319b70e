//! The upstream request, as Kong's access phase leaves it after the plugins
//! (`Kong.access` "after" in `runloop/handler.lua`): the upstream URI (the service's path,
//! `strip_path`, a plugin's path and query), hop-by-hop headers removed, Kong's
//! X-Forwarded-* and X-Real-IP, the request id, the consumer's identity headers and the Host
//! to send.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, StatusCode, Uri, Version};
use turnpike_router::upstream_uri;

use crate::body::RequestBody;
use crate::http1::client::Overrides;
use crate::http1::header_names::{names, seen};
use crate::runloop::ctx::Ended;
use crate::runloop::errors;
use crate::runloop::session::Session;
use crate::worker::ctx::ConnInfo;

static X_KONG_REQUEST_ID: HeaderName = names::X_KONG_REQUEST_ID;
static X_FORWARDED_FOR: HeaderName = names::X_FORWARDED_FOR;
static X_FORWARDED_PROTO: HeaderName = names::X_FORWARDED_PROTO;
static X_FORWARDED_HOST: HeaderName = names::X_FORWARDED_HOST;
static X_FORWARDED_PORT: HeaderName = names::X_FORWARDED_PORT;
static X_FORWARDED_PATH: HeaderName = names::X_FORWARDED_PATH;
static X_FORWARDED_PREFIX: HeaderName = names::X_FORWARDED_PREFIX;
static X_REAL_IP: HeaderName = names::X_REAL_IP;
static KEEP_ALIVE: HeaderName = names::KEEP_ALIVE;
static PROXY_CONNECTION: HeaderName = names::PROXY_CONNECTION;

/// Turns the client's request head into the upstream's; the headers the proxy sets go into
/// the session's `overrides` (slot 0, Host, is set per attempt) and the Host kept from the
/// client or a plugin into its `preserved_host`. When a plugin ran, it may have set any
/// header, so what the parser saw of the names no longer holds: the names are classified
/// again, in one pass.
#[inline]
pub fn run(s: &mut Session<'_>) -> Result<(), Ended> {
    let Some(si) = s.matched().route.service_index() else {
        return Err(Box::new(s.rc.error(
            s.ctx,
            StatusCode::SERVICE_UNAVAILABLE,
            errors::NO_SERVICE,
        )));
    };
    let (ctx, conn, snap, t) = (s.ctx, s.conn, s.snap, &s.target);
    let m = s
        .matched
        .as_ref()
        .expect("the forward phase runs on a route");
    let service = &snap.services[si];
    let parts = &mut s.parts;
    let overrides = &mut s.overrides;
    let upgrade = s.client_upgrade.is_some();
    let rc = &mut *s.rc;
    let plugins_ran =
        !snap.routes[m.route.route_index()].chain.is_empty() || !snap.global_rewrite.is_empty();
    let route = m.route;
    let path = t.path();
    let mut up_path = match rc.upstream.path.take() {
        // A plugin set the upstream path (kong.service.request.set_path).
        Some(p) => p,
        // nginx's grpc_pass sends the request's own path (no service path, no strip_path),
        // unless a plugin asked for the stripped one (grpc-web's pass_stripped_path).
        None if service.grpc
            && rc
                .plugin_ctx
                .get::<turnpike_plugins::PassStrippedPath>()
                .is_none() =>
        {
            t.orig_uri.path().to_string()
        }
        None => upstream_uri(
            service.path.as_deref(),
            path,
            m.matched_len,
            route.strip_path,
            route.path_handling_v1,
        ),
    };
    match rc.upstream.query.as_deref() {
        // A plugin rewrote the query (e.g. removed a credential); empty means none.
        Some("") => {}
        Some(q) => {
            up_path.push('?');
            up_path.push_str(q);
        }
        None => {
            if let Some(q) = t.query() {
                up_path.push('?');
                up_path.push_str(q);
            }
        }
    }
    let Ok(uri) = Uri::try_from(up_path) else {
        return Err(Box::new(rc.error(
            ctx,
            StatusCode::BAD_REQUEST,
            "Bad request",
        )));
    };
    parts.uri = uri;
    parts.version = Version::HTTP_11;
    let headers_seen = if plugins_ran {
        crate::http1::header_names::seen_in(&parts.headers)
    } else {
        rc.seen
    };
    if headers_seen & seen::HOP_BY_HOP != 0 {
        // Kong sends `TE: trailers` on when the client asked for trailers (the rest of TE is
        // hop-by-hop); gRPC servers want it.
        let te_trailers = service.grpc
            && parts.headers.get_all(header::TE).iter().any(|v| {
                v.to_str().is_ok_and(|s| {
                    s.split(',')
                        .any(|t| t.trim().eq_ignore_ascii_case("trailers"))
                })
            });
        strip_hop_by_hop(&mut parts.headers, upgrade);
        if te_trailers {
            parts
                .headers
                .insert(header::TE, HeaderValue::from_static("trailers"));
        }
    }
    let prefix = m
        .matched_len
        .filter(|_| route.strip_path)
        .map(|n| &path[..n]);
    // Slot 0 is the Host header, set per attempt by `balancer::send`. Unless the client sent
    // X-Forwarded-*, X-Real-IP or X-Kong-Request-Id (or a plugin ran, which may have set any
    // header), Host is the only proxy-set name a client header can have.
    overrides.set_others_may_clash(headers_seen & (seen::FORWARDED | seen::KONG) != 0);
    let host_value = t.host_value();
    forwarded_headers(
        conn,
        (headers_seen & seen::FORWARDED != 0).then_some(&parts.headers),
        t.host(),
        host_value,
        path,
        prefix,
        overrides,
    );
    if ctx.gateway.settings.headers_upstream_request_id {
        overrides.push((X_KONG_REQUEST_ID.clone(), Some(rc.request_id.clone())));
    }
    // Who the consumer is (X-Consumer-ID, ...), replacing what the client sent. The headers
    // to drop are listed only when the client sent one of those names (one pass over its
    // header names tells), which keeps `overrides` on the stack.
    if let Some(who) = rc.consumer.as_deref() {
        let spoofed = parts
            .headers
            .keys()
            .any(turnpike_plugins::Identity::is_identity_header);
        if spoofed {
            // The client's (or a plugin's) header of such a name is replaced, not kept beside.
            overrides.set_others_may_clash(true);
        }
        for (name, value) in who.upstream_headers() {
            if value.is_some() || spoofed {
                overrides.push((name.clone(), value));
            }
        }
    }
    s.preserved_host = if rc.upstream.host.is_some() {
        rc.upstream.host.take()
    } else if route.preserve_host {
        host_value.cloned().or_else(|| {
            t.orig_uri
                .authority()
                .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        })
    } else {
        None
    };
    if let Some(d) = rc.log.as_deref_mut().and_then(|l| l.details.as_deref_mut()) {
        d.upstream_uri = Some(parts.uri.clone());
    }
    Ok(())
}

/// Hop-by-hop headers (RFC 9110 §7.6.1) are never forwarded, nor any header the Connection
/// header names. One pass over the names finds which are present; only those are removed, and
/// the usual tokens of Connection (keep-alive, close, upgrade) name nothing more to remove.
pub fn strip_hop_by_hop(h: &mut HeaderMap, keep_upgrade: bool) {
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

pub fn is_upgrade(req: &Request<RequestBody>) -> bool {
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

/// The client's address as Kong's `kong.client.get_forwarded_ip` sees it: the X-Real-IP sent by
/// a trusted proxy (`trusted_ips`), the connection's peer otherwise.
pub fn client_ip(conn: &ConnInfo, h: &HeaderMap) -> std::net::IpAddr {
    if conn.trusted && conn.real_ip_header {
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
            let peer = conn.realip_remote.unwrap_or(conn.peer.ip());
            HeaderValue::from_str(&format!("{prev}, {peer}")).ok()
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
    // nginx's `X-Real-IP $remote_addr`: a trusted client's own X-Real-IP is its address
    // under `real_ip_header X-Real-IP`; under `proxy_protocol`, the PROXY header's is.
    if !(conn.real_ip_header && keep(&X_REAL_IP)) {
        out.push((X_REAL_IP.clone(), Some(conn.ip_value.clone())));
    }
}

/// The request's protocol as plugins' `protocols` name it (`PROTO_*`).
pub fn request_protocol(conn: &ConnInfo) -> u8 {
    if conn.tls {
        crate::snapshot::PROTO_HTTPS
    } else {
        crate::snapshot::PROTO_HTTP
    }
}
