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
    /// Kong's error response, in the shape the client accepts, with Kong's headers for a
    /// response the gateway produced.
    pub fn error(&self, ctx: &WorkerCtx, status: StatusCode, msg: &str) -> Response<ProxyBody> {
        own_response(
            ctx,
            error_response(
                status,
                msg,
                self.request_id.to_str().unwrap_or(""),
                self.accept.as_ref(),
            ),
            self.start,
        )
    }
}

/// A plugin's own response (Kong's `kong.response.exit`).
pub fn exit_response(
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
