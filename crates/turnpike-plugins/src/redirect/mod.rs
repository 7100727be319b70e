//! redirect (PRIORITY 779, Kong 3.9): answers every request with `status_code` (301) and a
//! `Location`, body `redirecting`, as Kong's `handler.lua` does. `incoming_path`: `ignore`
//! (the location as written), `keep` (the location's scheme and host with the request's path
//! and query) or `merge` (the location's path joined with the request's, the request's query
//! arguments overridden by the location's). The location is split once, when the config is
//! built. `keep_incoming_path` (Kong 3.8's boolean) is read as `incoming_path`.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, StatusCode};
use serde::Deserialize;
use serde_json::Value;

use crate::schema::{Default, Field, Type};
use crate::{Access, AccessRequest, Exit, Handler, PluginSpec};

pub struct Redirect;

#[derive(Deserialize)]
struct Config {
    status_code: u16,
    location: String,
    incoming_path: String,
}

const FIELDS: &[Field] = &[
    Field::new("status_code", Type::Integer { min: 100, max: 599 }).default(Default::Int(301)),
    Field::new("location", Type::String).required(),
    Field::new("incoming_path", Type::OneOf(&["ignore", "keep", "merge"]))
        .default(Default::Str("ignore")),
];

enum Incoming {
    Ignore(HeaderValue),
    Keep,
    Merge,
}

struct Configured {
    status: StatusCode,
    /// `scheme://host[:port]` of the location.
    origin: String,
    path: String,
    query: Vec<(String, String)>,
    incoming: Incoming,
}

/// Splits a URL into its origin (`scheme://authority`), path and query.
fn split_url(url: &str) -> (&str, &str, &str) {
    let after_scheme = url.find("://").map_or(0, |i| i + 3);
    let path_at = url[after_scheme..]
        .find(['/', '?', '#'])
        .map_or(url.len(), |i| i + after_scheme);
    let (origin, rest) = url.split_at(path_at);
    let rest = rest.split('#').next().unwrap_or("");
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    (origin, path, query)
}

/// `k=v` pairs as Kong's merge reads them (both sides non-empty).
fn pairs(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter_map(|kv| kv.split_once('='))
        .filter(|(k, v)| !k.is_empty() && !v.is_empty())
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

impl PluginSpec for Redirect {
    fn name(&self) -> &'static str {
        "redirect"
    }
    fn priority(&self) -> i32 {
        779
    }
    /// Kong's `protocols = typedefs.protocols_http`.
    fn http_only(&self) -> bool {
        true
    }
    fn fields(&self) -> &'static [Field] {
        FIELDS
    }
    fn shorthands(&self, config: &mut Value) {
        if let Some(m) = config.as_object_mut() {
            if let Some(keep) = m.remove("keep_incoming_path") {
                let v = if keep == true { "keep" } else { "ignore" };
                m.entry("incoming_path").or_insert(Value::from(v));
            }
        }
    }
    fn build(
        &self,
        config: &Value,
        _ctx: &crate::BuildContext,
    ) -> Result<Arc<dyn Handler>, String> {
        let c: Config = crate::typed(config)?;
        let (origin, path, query) = split_url(&c.location);
        let incoming = match c.incoming_path.as_str() {
            "keep" => Incoming::Keep,
            "merge" => Incoming::Merge,
            _ => Incoming::Ignore(
                HeaderValue::from_str(&c.location).map_err(|_| "location: invalid URL")?,
            ),
        };
        Ok(Arc::new(Configured {
            status: StatusCode::from_u16(c.status_code).map_err(|e| e.to_string())?,
            origin: origin.to_string(),
            path: path.to_string(),
            query: pairs(query),
            incoming,
        }))
    }
}

impl Configured {
    fn location(&self, req: &AccessRequest<'_>) -> Option<HeaderValue> {
        let target = if req.target.is_empty() {
            req.path
        } else {
            req.target
        };
        let (_, req_path, req_query) = split_url(target);
        let (path, query) = match &self.incoming {
            Incoming::Ignore(v) => return Some(v.clone()),
            Incoming::Keep => (req_path.to_string(), req_query.to_string()),
            Incoming::Merge => {
                let path = format!(
                    "{}/{}",
                    self.path.trim_end_matches('/'),
                    req_path.trim_start_matches('/')
                );
                let mut args = pairs(req_query);
                for (k, v) in &self.query {
                    args.retain(|(rk, _)| rk != k);
                    args.push((k.clone(), v.clone()));
                }
                let q: Vec<String> = args.iter().map(|(k, v)| format!("{k}={v}")).collect();
                (path, q.join("&"))
            }
        };
        let mut url = format!("{}{}", self.origin, path);
        if !query.is_empty() {
            url.push('?');
            url.push_str(&query);
        }
        HeaderValue::from_str(&url).ok()
    }
}

impl Handler for Configured {
    fn phases(&self) -> crate::Phases {
        crate::Phases::ACCESS
    }
    fn access(&self, req: &mut AccessRequest<'_>) -> Access {
        let mut e = Exit {
            status: self.status,
            headers: Vec::new(),
            body: Bytes::from_static(b"redirecting"),
        };
        if let Some(l) = self.location(req) {
            e.headers.push((http::header::LOCATION, l));
        }
        Access::Exit(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_into_origin_path_and_query() {
        assert_eq!(
            split_url("https://ex.test:8443/a/b?x=1#f"),
            ("https://ex.test:8443", "/a/b", "x=1")
        );
        assert_eq!(split_url("https://ex.test"), ("https://ex.test", "", ""));
        assert_eq!(split_url("someapp://path/x"), ("someapp://path", "/x", ""));
        assert_eq!(split_url("/only?q=1"), ("", "/only", "q=1"));
    }
}
