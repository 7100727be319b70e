//! request-termination (PRIORITY 2): answers every request with a fixed response instead of
//! proxying it; with `trigger`, only requests carrying that header or query argument.

mod schema;

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, StatusCode};
use serde_json::{json, Value};

use crate::{Access, AccessRequest, Exit, Handler, PluginSpec};

pub struct RequestTermination;

/// Kong's messages for the statuses it knows, when no `message` is configured.
fn default_message(status: u16) -> Option<&'static str> {
    Some(match status {
        401 => "Unauthorized",
        404 => "Not found",
        405 => "Method not allowed",
        500 => "An unexpected error occurred",
        502 => "Bad Gateway",
        503 => "Service unavailable",
        _ => return None,
    })
}

struct Configured {
    status: StatusCode,
    /// The response body and its content type, built once.
    body: Bytes,
    content_type: Option<HeaderValue>,
    echo: bool,
    message: Option<String>,
    trigger: Option<http::HeaderName>,
    trigger_arg: Option<String>,
}

impl PluginSpec for RequestTermination {
    fn name(&self) -> &'static str {
        "request-termination"
    }
    fn priority(&self) -> i32 {
        2
    }
    /// Kong's `protocols = typedefs.protocols_http`.
    fn http_only(&self) -> bool {
        true
    }
    fn fields(&self) -> &'static [crate::schema::Field] {
        schema::FIELDS
    }
    fn entity_checks(&self, config: &Value) -> Vec<(String, String)> {
        schema::entity_checks(config)
    }
    fn build(
        &self,
        config: &Value,
        _ctx: &crate::BuildContext,
    ) -> Result<Arc<dyn Handler>, String> {
        let c: schema::Config = crate::typed(config)?;
        let code = c.status_code;
        let status = StatusCode::from_u16(code).map_err(|e| e.to_string())?;
        let message = c
            .message
            .or_else(|| default_message(code).map(String::from));
        let (body, content_type) = match c.body {
            Some(b) => (
                Bytes::from(b),
                Some(
                    HeaderValue::from_str(
                        c.content_type
                            .as_deref()
                            .unwrap_or("application/json; charset=utf-8"),
                    )
                    .map_err(|_| "invalid content_type".to_string())?,
                ),
            ),
            None => match &message {
                Some(m) => (
                    Bytes::from(serde_json::to_vec(&json!({ "message": m })).unwrap_or_default()),
                    Some(HeaderValue::from_static("application/json; charset=utf-8")),
                ),
                None => (Bytes::new(), None),
            },
        };
        let trigger = c.trigger;
        Ok(Arc::new(Configured {
            status,
            body,
            content_type,
            echo: c.echo,
            message,
            trigger: trigger
                .as_deref()
                .and_then(|t| http::HeaderName::from_bytes(t.as_bytes()).ok()),
            trigger_arg: trigger,
        }))
    }
}

impl Handler for Configured {
    fn phases(&self) -> crate::Phases {
        crate::Phases::ACCESS
    }
    fn access(&self, req: &mut AccessRequest<'_>) -> Access {
        if let Some(arg) = &self.trigger_arg {
            let by_header = self
                .trigger
                .as_ref()
                .is_some_and(|h| req.header(h).is_some());
            if !by_header && req.query_arg(arg).is_none() {
                return Access::Continue;
            }
        }
        if self.echo {
            let headers: serde_json::Map<String, Value> = req
                .headers
                .iter()
                .map(|(k, v)| {
                    (
                        k.as_str().to_string(),
                        Value::from(v.to_str().unwrap_or("")),
                    )
                })
                .collect();
            let echo = json!({
                "message": self.message,
                "request": {
                    "scheme": if req.tls { "https" } else { "http" },
                    "method": req.method,
                    "path": req.path,
                    "query": req.query,
                    "headers": headers,
                },
            });
            let mut e = Exit::message(self.status, "");
            e.body = Bytes::from(serde_json::to_vec(&echo).unwrap_or_default());
            return Access::Exit(e);
        }
        Access::Exit(Exit {
            status: self.status,
            headers: self
                .content_type
                .iter()
                .map(|v| (http::header::CONTENT_TYPE, v.clone()))
                .collect(),
            body: self.body.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::validate;

    fn run(config: Value, headers: &[(&str, &str)], query: Option<&'static str>) -> Option<Exit> {
        let full = validate(schema::FIELDS, &config).unwrap();
        assert!(schema::entity_checks(&full).is_empty());
        let h = RequestTermination
            .build(
                &full,
                &crate::BuildContext::new(&Default::default(), &crate::Runtime::new()),
            )
            .unwrap();
        let mut t = crate::TestRequest::new();
        t.query = query;
        for (k, v) in headers {
            t.headers.insert(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        match t.run(h.as_ref()) {
            Access::Continue => None,
            Access::Exit(e) => Some(e),
            Access::Wait(_) => unreachable!("TestRequest::run waits"),
        }
    }

    #[test]
    fn kong_defaults_and_bodies() {
        let e = run(json!({}), &[], None).unwrap();
        assert_eq!(e.status, 503);
        assert_eq!(&e.body[..], br#"{"message":"Service unavailable"}"#);
        let e = run(json!({"status_code": 418}), &[], None).unwrap();
        assert!(e.body.is_empty());
        let e = run(json!({"status_code": 403, "message": "no"}), &[], None).unwrap();
        assert_eq!(&e.body[..], br#"{"message":"no"}"#);
        let e = run(
            json!({"status_code": 200, "body": "<h1>hi</h1>", "content_type": "text/html"}),
            &[],
            None,
        )
        .unwrap();
        assert_eq!(&e.body[..], b"<h1>hi</h1>");
        assert_eq!(e.headers[0].1, "text/html");
    }

    #[test]
    fn trigger_by_header_or_query() {
        let cfg = json!({"trigger": "x-stop"});
        assert!(run(cfg.clone(), &[], None).is_none());
        assert!(run(cfg.clone(), &[("x-stop", "1")], None).is_some());
        assert!(run(cfg, &[], Some("a=1&x-stop")).is_some());
    }

    #[test]
    fn conflicting_fields_are_refused() {
        let full = validate(schema::FIELDS, &json!({"message": "a", "body": "b"})).unwrap();
        assert!(!schema::entity_checks(&full).is_empty());
        let full = validate(schema::FIELDS, &json!({"content_type": "text/plain"})).unwrap();
        assert!(!schema::entity_checks(&full).is_empty());
    }
}
