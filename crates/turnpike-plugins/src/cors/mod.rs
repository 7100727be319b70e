//! cors (PRIORITY 2000): answers CORS preflight requests itself and adds the CORS headers to
//! the other responses, after Kong's handler: the allowed origin is `*`, the one configured
//! origin, or the request's Origin when it matches the list (exactly, or a pattern).

mod schema;

use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderName, HeaderValue, StatusCode};
use regex::Regex;
use serde_json::Value;

use crate::{Access, AccessRequest, BuildContext, Exit, Handler, PluginSpec};

pub struct Cors;

/// Kong treats an origin with regex characters as a pattern, anything else as a literal.
pub(crate) fn is_pattern(origin: &str) -> bool {
    origin.contains(['^', '$', '(', ')', '[', ']', '{', '}', '|', '\\', '+', '?'])
        || origin.contains(".*")
}

enum Origin {
    Exact(String),
    Pattern(Regex),
}

struct Configured {
    /// No list, or `*` in it: any origin.
    any: bool,
    origins: Vec<Origin>,
    /// The one literal origin, sent whatever the request's Origin (Kong does the same).
    single: Option<HeaderValue>,
    headers: Option<HeaderValue>,
    exposed: Option<HeaderValue>,
    methods: HeaderValue,
    max_age: Option<HeaderValue>,
    credentials: bool,
    private_network: bool,
    preflight_continue: bool,
    allow_origin_absent: bool,
}

static PRIVATE_NETWORK_REQUEST: HeaderName =
    HeaderName::from_static("access-control-request-private-network");
static PRIVATE_NETWORK_ALLOW: HeaderName =
    HeaderName::from_static("access-control-allow-private-network");

fn joined(items: &Option<Vec<String>>) -> Option<HeaderValue> {
    let items = items.as_deref().filter(|i| !i.is_empty())?;
    HeaderValue::from_str(&items.join(",")).ok()
}

impl PluginSpec for Cors {
    fn name(&self) -> &'static str {
        "cors"
    }
    fn priority(&self) -> i32 {
        2000
    }
    /// Kong's `protocols = typedefs.protocols_http`.
    fn http_only(&self) -> bool {
        true
    }
    fn allows_consumer(&self) -> bool {
        false
    }
    fn fields(&self) -> &'static [crate::schema::Field] {
        schema::FIELDS
    }
    fn entity_checks(&self, config: &Value) -> Vec<(String, String)> {
        schema::entity_checks(config)
    }
    fn build(&self, config: &Value, _ctx: &BuildContext) -> Result<Arc<dyn Handler>, String> {
        let c: schema::Config = crate::typed(config)?;
        let list: Vec<&str> = c.origins.iter().flatten().map(String::as_str).collect();
        let any = list.is_empty() || list.contains(&"*");
        let mut origins = Vec::new();
        for o in &list {
            origins.push(if is_pattern(o) {
                Origin::Pattern(Regex::new(&format!("^(?:{o})$")).map_err(|e| e.to_string())?)
            } else {
                Origin::Exact(o.to_string())
            });
        }
        let single = match (list.as_slice(), any) {
            ([one], false) if !is_pattern(one) => HeaderValue::from_str(one).ok(),
            _ => None,
        };
        Ok(Arc::new(Configured {
            any,
            origins,
            single,
            headers: joined(&c.headers),
            exposed: joined(&c.exposed_headers),
            methods: joined(&c.methods).unwrap_or(HeaderValue::from_static(
                "GET,HEAD,PUT,PATCH,POST,DELETE,OPTIONS,TRACE,CONNECT",
            )),
            max_age: c.max_age.map(|m| HeaderValue::from(m as u64)),
            credentials: c.credentials,
            private_network: c.private_network,
            preflight_continue: c.preflight_continue,
            allow_origin_absent: c.allow_origin_absent,
        }))
    }
}

impl Configured {
    /// Access-Control-Allow-Origin (and Vary) for this request, with credentials.
    fn origin_headers(&self, req: &AccessRequest<'_>, out: &mut Vec<(HeaderName, HeaderValue)>) {
        let origin = req.headers.get(header::ORIGIN);
        let allowed = if self.any {
            if self.credentials {
                // `*` is not allowed with credentials: echo the origin.
                origin.cloned()
            } else {
                Some(HeaderValue::from_static("*"))
            }
        } else if let Some(one) = &self.single {
            Some(one.clone())
        } else {
            origin
                .and_then(|o| o.to_str().ok())
                .filter(|o| {
                    self.origins.iter().any(|m| match m {
                        Origin::Exact(e) => e == o,
                        Origin::Pattern(re) => re.is_match(o),
                    })
                })
                .and_then(|o| HeaderValue::from_str(o).ok())
        };
        if let Some(v) = allowed {
            let echoed = v != "*";
            out.push((header::ACCESS_CONTROL_ALLOW_ORIGIN, v));
            if echoed {
                out.push((header::VARY, HeaderValue::from_static("Origin")));
            }
        }
        if self.credentials {
            out.push((
                header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
                HeaderValue::from_static("true"),
            ));
        }
    }
}

impl Handler for Configured {
    fn phases(&self) -> crate::Phases {
        crate::Phases::ACCESS
    }
    fn access(&self, req: &mut AccessRequest<'_>) -> Access {
        if !self.allow_origin_absent && !req.headers.contains_key(header::ORIGIN) {
            return Access::Continue;
        }
        let preflight = req.method == "OPTIONS"
            && req
                .headers
                .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
        if preflight && !self.preflight_continue {
            let mut headers = Vec::new();
            self.origin_headers(req, &mut headers);
            let allow_headers = self.headers.clone().or_else(|| {
                req.headers
                    .get(header::ACCESS_CONTROL_REQUEST_HEADERS)
                    .cloned()
            });
            if let Some(h) = allow_headers {
                headers.push((header::ACCESS_CONTROL_ALLOW_HEADERS, h));
            }
            headers.push((header::ACCESS_CONTROL_ALLOW_METHODS, self.methods.clone()));
            if let Some(m) = &self.max_age {
                headers.push((header::ACCESS_CONTROL_MAX_AGE, m.clone()));
            }
            if self.private_network
                && req
                    .headers
                    .get(&PRIVATE_NETWORK_REQUEST)
                    .is_some_and(|v| v == "true")
            {
                headers.push((
                    PRIVATE_NETWORK_ALLOW.clone(),
                    HeaderValue::from_static("true"),
                ));
            }
            return Access::Exit(Exit {
                status: StatusCode::OK,
                headers,
                body: Bytes::new(),
            });
        }
        let mut headers = Vec::new();
        self.origin_headers(req, &mut headers);
        if let Some(e) = &self.exposed {
            headers.push((header::ACCESS_CONTROL_EXPOSE_HEADERS, e.clone()));
        }
        req.response_headers.extend(headers);
        Access::Continue
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::validate;
    use serde_json::json;

    fn run(
        config: Value,
        method: &'static str,
        headers: &[(&str, &str)],
    ) -> (Access, Vec<(HeaderName, HeaderValue)>) {
        let full = validate(schema::FIELDS, &config).unwrap();
        assert!(schema::entity_checks(&full).is_empty());
        let h = Cors
            .build(
                &full,
                &crate::BuildContext::new(&Default::default(), &crate::Runtime::new()),
            )
            .unwrap();
        let mut t = crate::TestRequest::new();
        t.method = method;
        for (k, v) in headers {
            t.headers.insert(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        let a = t.run(h.as_ref());
        (a, t.response_headers)
    }

    fn get<'a>(h: &'a [(HeaderName, HeaderValue)], name: &str) -> Option<&'a str> {
        h.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.to_str().unwrap())
    }

    #[test]
    fn origins_any_single_list_and_patterns() {
        let (_, h) = run(json!({}), "GET", &[("origin", "https://a.test")]);
        assert_eq!(get(&h, "access-control-allow-origin"), Some("*"));
        let (_, h) = run(
            json!({"origins": ["https://one.test"]}),
            "GET",
            &[("origin", "https://x.test")],
        );
        assert_eq!(
            get(&h, "access-control-allow-origin"),
            Some("https://one.test")
        );
        let cfg = json!({"origins": ["https://a.test", "https://.*\\.b\\.test"], "credentials": true, "exposed_headers": ["X-Id"]});
        let (_, h) = run(cfg.clone(), "GET", &[("origin", "https://x.b.test")]);
        assert_eq!(
            get(&h, "access-control-allow-origin"),
            Some("https://x.b.test")
        );
        assert_eq!(get(&h, "vary"), Some("Origin"));
        assert_eq!(get(&h, "access-control-allow-credentials"), Some("true"));
        assert_eq!(get(&h, "access-control-expose-headers"), Some("X-Id"));
        let (_, h) = run(cfg, "GET", &[("origin", "https://evil.test")]);
        assert_eq!(get(&h, "access-control-allow-origin"), None);
    }

    #[test]
    fn preflight_is_answered() {
        let (a, _) = run(
            json!({"origins": ["*"], "max_age": 600, "headers": ["X-A", "X-B"]}),
            "OPTIONS",
            &[
                ("origin", "https://a.test"),
                ("access-control-request-method", "PUT"),
            ],
        );
        let Access::Exit(e) = a else {
            panic!("preflight not answered")
        };
        assert_eq!(e.status, 200);
        assert_eq!(
            get(&e.headers, "access-control-allow-methods"),
            Some("GET,HEAD,PUT,PATCH,POST,DELETE,OPTIONS,TRACE,CONNECT")
        );
        assert_eq!(
            get(&e.headers, "access-control-allow-headers"),
            Some("X-A,X-B")
        );
        assert_eq!(get(&e.headers, "access-control-max-age"), Some("600"));
        let (a, _) = run(
            json!({"preflight_continue": true}),
            "OPTIONS",
            &[("access-control-request-method", "PUT")],
        );
        assert!(matches!(a, Access::Continue));
    }
}
