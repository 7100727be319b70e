//! request-size-limiting (PRIORITY 951): refuses request bodies above a size.
//!
//! A declared Content-Length is checked at once (413, or 417 when the client waits on
//! `Expect: 100-continue`, as Kong answers). A body without one (chunked, HTTP/2 data frames)
//! cannot be judged up front: Kong buffers it whole to measure it; here the limit travels with
//! the request and the proxy counts the body as it streams upstream, cutting it (and answering
//! 413) the moment it passes the limit. Memory stays bounded whatever the client sends, and the
//! upstream never receives a complete oversized request.

mod schema;

use std::sync::Arc;

use http::StatusCode;
use serde_json::Value;

use crate::{Access, AccessRequest, BuildContext, Exit, Handler, PluginSpec};

pub struct RequestSizeLimiting;

const TOO_LARGE: &str = "Request size limit exceeded";
const LENGTH_REQUIRED: &str = "A valid Content-Length header is required";

struct Configured {
    limit: u64,
    require_content_length: bool,
}

impl PluginSpec for RequestSizeLimiting {
    fn name(&self) -> &'static str {
        "request-size-limiting"
    }
    fn priority(&self) -> i32 {
        951
    }
    /// Kong's `protocols = typedefs.protocols_http`.
    fn http_only(&self) -> bool {
        true
    }
    fn fields(&self) -> &'static [crate::schema::Field] {
        schema::FIELDS
    }
    fn build(&self, config: &Value, _ctx: &BuildContext) -> Result<Arc<dyn Handler>, String> {
        let c: schema::Config = crate::typed(config)?;
        let unit: u64 = match c.size_unit.as_str() {
            "bytes" => 1,
            "kilobytes" => 1 << 10,
            _ => 1 << 20,
        };
        Ok(Arc::new(Configured {
            limit: c.allowed_payload_size.saturating_mul(unit),
            require_content_length: c.require_content_length,
        }))
    }
}

impl Handler for Configured {
    fn phases(&self) -> crate::Phases {
        crate::Phases::ACCESS
    }
    fn access(&self, req: &mut AccessRequest<'_>) -> Access {
        let declared = req
            .headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        match declared {
            Some(n) if n > self.limit => {
                let expects_continue = req
                    .headers
                    .get(http::header::EXPECT)
                    .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
                let status = if expects_continue {
                    StatusCode::EXPECTATION_FAILED
                } else {
                    StatusCode::PAYLOAD_TOO_LARGE
                };
                Access::Exit(Exit::message(status, TOO_LARGE))
            }
            Some(_) => Access::Continue,
            None if self.require_content_length => {
                Access::Exit(Exit::message(StatusCode::LENGTH_REQUIRED, LENGTH_REQUIRED))
            }
            None => {
                // The tightest of several limits wins (a plugin cannot be configured twice on
                // one route, but keep the rule simple and safe).
                req.upstream.body_limit = Some(
                    req.upstream
                        .body_limit
                        .map_or(self.limit, |l| l.min(self.limit)),
                );
                Access::Continue
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::validate;

    fn status(config: Value, headers: &[(&str, &str)]) -> Option<u16> {
        let full = validate(schema::FIELDS, &config).unwrap();
        let h = RequestSizeLimiting
            .build(
                &full,
                &crate::BuildContext::new(&Default::default(), &crate::Runtime::new()),
            )
            .unwrap();
        let mut t = crate::TestRequest::new();
        for (k, v) in headers {
            t.headers.insert(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                http::HeaderValue::from_str(v).unwrap(),
            );
        }
        match t.run(h.as_ref()) {
            Access::Continue => None,
            Access::Exit(e) => Some(e.status.as_u16()),
            Access::Wait(_) => unreachable!("TestRequest::run waits"),
        }
    }

    #[test]
    fn declared_lengths_and_units() {
        let kb = serde_json::json!({"allowed_payload_size": 1, "size_unit": "kilobytes"});
        assert_eq!(status(kb.clone(), &[("content-length", "1024")]), None);
        assert_eq!(status(kb.clone(), &[("content-length", "1025")]), Some(413));
        assert_eq!(
            status(
                kb.clone(),
                &[("content-length", "5000"), ("expect", "100-Continue")]
            ),
            Some(417)
        );
        assert_eq!(status(kb, &[]), None);
        let strict = serde_json::json!({"require_content_length": true});
        assert_eq!(status(strict.clone(), &[]), Some(411));
        assert_eq!(
            status(strict.clone(), &[("content-length", "x")]),
            Some(411)
        );
        assert_eq!(status(strict, &[("content-length", "10")]), None);
        assert_eq!(
            status(serde_json::json!({}), &[("content-length", "134217729")]),
            Some(413)
        );
    }
}
