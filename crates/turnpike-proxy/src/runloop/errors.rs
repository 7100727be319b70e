//! Responses Turnpike produces itself, in Kong's shapes: JSON `{"message": ..., "request_id": ...}`
//! by default, HTML, XML or plain text when the client's Accept header asks for them (Kong
//! `kong/tools/http.lua`, `kong/error_handlers.lua`).

use crate::http1::server::Refused;
use crate::worker::ctx::WorkerCtx;
use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use std::time::{Duration, Instant};

use crate::runloop::ctx::RequestCtx;

use crate::runloop::body::ProxyBody;

pub const NO_ROUTE: &str = "no Route matched with those values";
pub const BAD_GATEWAY: &str = "An invalid response was received from the upstream server";
pub const TIMED_OUT: &str = "The upstream server is timed out";
pub const NO_PEER: &str = "failure to get a peer from the ring-balancer";
pub const NAME_RESOLUTION: &str = "name resolution failed";
pub const UNEXPECTED: &str = "An unexpected error occurred";
pub const NO_SERVICE: &str = "no Service found with those values";
pub const USE_HTTPS: &str = "Please use HTTPS protocol";
/// A gRPC request over HTTP/1 on a gRPC route.
pub const USE_HTTP2: &str = "Please use HTTP2 protocol";
/// A request that is not gRPC on a gRPC route.
pub const NON_GRPC: &str = "Non-gRPC request matched gRPC route";
/// A cleartext gRPC request on a grpcs-only route.
pub const GRPCS_ONLY: &str = "gRPC request matched gRPCs route";
/// request-size-limiting's message, for a body found too large while it streams.
pub const BODY_TOO_LARGE: &str = "Request size limit exceeded";
/// A request body larger than nginx_http_client_max_body_size (Kong's error handler for 413).
pub const PAYLOAD_TOO_LARGE: &str = "Payload too large";
/// A request head that could not be parsed (Kong's error handler for 400).
pub const BAD_REQUEST: &str = "Bad request";
/// A request body that stalled past client_body_timeout (Kong's error handler for 408).
pub const REQUEST_TIMEOUT: &str = "Request timeout";
/// A request head too large (nginx's 494, which Kong names so).
pub const HEADER_TOO_LARGE: &str = "Request header or cookie too large";
/// A request body that could not be read whole for a plugin.
pub const BAD_BODY: &str = "Bad request: the request body could not be read";

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Format {
    Json,
    Html,
    Xml,
    Text,
}

fn format_for(accept: Option<&HeaderValue>) -> Format {
    let Some(a) = accept.and_then(|v| v.to_str().ok()) else {
        return Format::Json;
    };
    // The first media type the client lists that we can produce wins, as in Kong.
    for part in a.split(',') {
        let mt = part
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        match mt.as_str() {
            "application/json" | "application/*" | "*/*" => return Format::Json,
            "text/html" | "application/xhtml+xml" => return Format::Html,
            "application/xml" | "text/xml" => return Format::Xml,
            "text/plain" | "text/*" => return Format::Text,
            _ => {}
        }
    }
    Format::Json
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Builds an error response for `status` with Kong's message.
pub fn error_response(
    status: StatusCode,
    message: &str,
    request_id: &str,
    accept: Option<&HeaderValue>,
) -> Response<ProxyBody> {
    let (ctype, body) = match format_for(accept) {
        Format::Json => (
            "application/json; charset=utf-8",
            format!(
                "{{\n  \"message\":{},\n  \"request_id\":\"{}\"\n}}",
                serde_json::Value::from(message),
                request_id
            ),
        ),
        Format::Html => (
            "text/html; charset=utf-8",
            format!(
                "<!doctype html>\n<html>\n  <head>\n    <meta charset=\"utf-8\">\n    <title>Error</title>\n  </head>\n  <body>\n    <h1>Error</h1>\n    <p>{}.</p>\n    <p>request_id: {}</p>\n  </body>\n</html>\n",
                escape(message),
                request_id
            ),
        ),
        Format::Xml => (
            "application/xml; charset=utf-8",
            format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<error>\n  <message>{}</message>\n  <requestid>{}</requestid>\n</error>\n",
                escape(message),
                request_id
            ),
        ),
        Format::Text => ("text/plain; charset=utf-8", format!("{message}\nrequest_id: {request_id}\n")),
    };
    let mut r = Response::new(ProxyBody::full(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(ctype));
    r
}

static X_KONG_RESPONSE_LATENCY: http::HeaderName =
    crate::http1::header_names::names::X_KONG_RESPONSE_LATENCY;

/// A latency header value in milliseconds. Values under 1000 ms come from a table of static
/// strings built once: no allocation per request.
pub fn ms(d: Duration) -> HeaderValue {
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

impl RequestCtx {
    /// Kong's error response (`kong.response.error`), in the shape the client accepts, with
    /// Kong's headers for a response the gateway produced. A gRPC client gets gRPC's shape,
    /// the message dropped for the status's canonical name, as Kong does.
    pub fn error(&self, ctx: &WorkerCtx, status: StatusCode, msg: &str) -> Response<ProxyBody> {
        let r = if self.grpc {
            grpc_response(status, None, true)
        } else {
            error_response(
                status,
                msg,
                self.request_id.to_str().unwrap_or(""),
                self.accept.as_ref(),
            )
        };
        own_response(ctx, r, self.start)
    }

    /// An error nginx raises (the upstream failed, timed out) as Kong's error handler
    /// answers it: for a gRPC client, with the handler's message as `grpc-message`.
    pub fn proxy_error(
        &self,
        ctx: &WorkerCtx,
        status: StatusCode,
        msg: &str,
    ) -> Response<ProxyBody> {
        if self.grpc {
            let handler_msg = match status.as_u16() {
                502 => BAD_GATEWAY,
                503 => "The upstream server is currently unavailable",
                504 => "The upstream server is timing out",
                _ => msg,
            };
            return own_response(
                ctx,
                grpc_response(status, Some(handler_msg), false),
                self.start,
            );
        }
        self.error(ctx, status, msg)
    }
}

/// Kong's HTTP status → gRPC status (`kong/pdk/response.lua`: 200 → 0, 400 → 3, 500 → 13
/// fall in their ranges).
pub fn grpc_status(status: u16) -> u8 {
    match status {
        401 => 16,
        403 => 7,
        404 => 5,
        409 => 6,
        429 => 8,
        499 => 1,
        501 => 12,
        503 => 14,
        504 => 4,
        500..=599 => 13,
        400..=499 => 3,
        200..=299 => 0,
        _ => 2,
    }
}

/// gRPC's canonical status names, as Kong writes them in `grpc-message`.
pub const GRPC_MESSAGES: [&str; 17] = [
    "OK",
    "Canceled",
    "Unknown",
    "InvalidArgument",
    "DeadlineExceeded",
    "NotFound",
    "AlreadyExists",
    "PermissionDenied",
    "ResourceExhausted",
    "FailedPrecondition",
    "Aborted",
    "OutOfRange",
    "Unimplemented",
    "Internal",
    "Unavailable",
    "DataLoss",
    "Unauthenticated",
];

/// The gateway's own answer to a gRPC client (Kong's `send` for a gRPC request): the HTTP
/// status kept, `grpc-status` from it, `grpc-message` the given message or the status's
/// canonical name, an empty body. `content_type`: `kong.response.error` sets
/// `application/grpc`; `kong.response.exit` sets none.
pub fn grpc_response(
    status: StatusCode,
    message: Option<&str>,
    content_type: bool,
) -> Response<ProxyBody> {
    let code = grpc_status(status.as_u16());
    let mut r = Response::new(ProxyBody::empty());
    *r.status_mut() = status;
    let h = r.headers_mut();
    if content_type {
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
    }
    h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("0"));
    h.insert(GRPC_STATUS.clone(), HeaderValue::from(code as u16));
    let message = message
        .and_then(|m| HeaderValue::from_str(m).ok())
        .unwrap_or_else(|| HeaderValue::from_static(GRPC_MESSAGES[code as usize]));
    h.insert(GRPC_MESSAGE.clone(), message);
    r
}

pub static GRPC_STATUS: http::HeaderName = http::HeaderName::from_static("grpc-status");
pub static GRPC_MESSAGE: http::HeaderName = http::HeaderName::from_static("grpc-message");

/// A plugin's own response (Kong's `kong.response.exit`). To a gRPC client, an error exit is
/// a gRPC one: Kong's plugins answer errors with `kong.response.error`, whose message a gRPC
/// client gets as the status's canonical name.
pub fn exit_response(
    ctx: &WorkerCtx,
    e: turnpike_plugins::Exit,
    start: Instant,
    grpc: bool,
) -> Response<ProxyBody> {
    if grpc && e.status.as_u16() >= 400 {
        let mut r = grpc_response(e.status, None, true);
        for (k, v) in e.headers {
            if k != header::CONTENT_TYPE {
                put_exit_header(r.headers_mut(), k, v);
            }
        }
        return own_response(ctx, r, start);
    }
    let mut r = Response::new(ProxyBody::full(e.body));
    *r.status_mut() = e.status;
    for (k, v) in e.headers {
        put_exit_header(r.headers_mut(), k, v);
    }
    own_response(ctx, r, start)
}

/// An exit's header: a later one of a name replaces the earlier (a plugin's Content-Type
/// over the default), but every Set-Cookie is kept (a session's chunks, its remember cookie).
fn put_exit_header(h: &mut http::HeaderMap, k: http::HeaderName, v: http::HeaderValue) {
    if k == header::SET_COOKIE {
        h.append(k, v);
    } else {
        h.insert(k, v);
    }
}

/// A response Turnpike produced itself (error, redirect): Kong adds Server and
/// X-Kong-Response-Latency to these.
pub fn own_response(
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

/// A refused request head gets Kong's error in JSON, and the connection closes.
pub fn refusal(ctx: &WorkerCtx, why: Refused) -> Response<ProxyBody> {
    let (status, msg) = match why {
        Refused::BadRequest => (StatusCode::BAD_REQUEST, BAD_REQUEST),
        Refused::TooLarge => (
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            HEADER_TOO_LARGE,
        ),
    };
    let rid = ctx.request_id();
    let mut r = error_response(status, msg, rid.to_str().unwrap_or(""), None);
    let s = &ctx.gateway.settings;
    if s.headers.server {
        r.headers_mut()
            .insert(header::SERVER, s.server_value.clone());
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_selects_the_format() {
        assert_eq!(format_for(None), Format::Json);
        assert_eq!(
            format_for(Some(&HeaderValue::from_static(
                "text/html,application/xhtml+xml"
            ))),
            Format::Html
        );
        assert_eq!(
            format_for(Some(&HeaderValue::from_static("application/xml;q=0.9"))),
            Format::Xml
        );
        assert_eq!(
            format_for(Some(&HeaderValue::from_static("text/plain"))),
            Format::Text
        );
        assert_eq!(
            format_for(Some(&HeaderValue::from_static("image/png"))),
            Format::Json
        );
    }

    #[test]
    fn grpc_statuses_follow_kongs_table() {
        let pairs = [
            (200, 0),
            (204, 0),
            (400, 3),
            (401, 16),
            (403, 7),
            (404, 5),
            (409, 6),
            (413, 3),
            (429, 8),
            (499, 1),
            (500, 13),
            (501, 12),
            (502, 13),
            (503, 14),
            (504, 4),
            (302, 2),
        ];
        for (http, grpc) in pairs {
            assert_eq!(grpc_status(http), grpc, "{http}");
        }
        let r = grpc_response(StatusCode::SERVICE_UNAVAILABLE, None, true);
        assert_eq!(r.status(), 503);
        assert_eq!(r.headers()["grpc-status"], "14");
        assert_eq!(r.headers()["grpc-message"], "Unavailable");
        assert_eq!(r.headers()["content-type"], "application/grpc");
        assert_eq!(r.headers()["content-length"], "0");
        let r = grpc_response(StatusCode::BAD_GATEWAY, Some(BAD_GATEWAY), false);
        assert_eq!(r.headers()["grpc-message"], BAD_GATEWAY);
        assert!(!r.headers().contains_key("content-type"));
    }

    #[test]
    fn html_escapes_messages() {
        let r = error_response(
            StatusCode::NOT_FOUND,
            "<b>",
            "id",
            Some(&HeaderValue::from_static("text/html")),
        );
        assert_eq!(
            r.headers()[header::CONTENT_TYPE],
            "text/html; charset=utf-8"
        );
    }
}
