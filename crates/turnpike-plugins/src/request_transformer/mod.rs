//! request-transformer (PRIORITY 801): changes the request on its way to the upstream, as
//! Kong's `access.lua` does, in Kong's order: the upstream path (`replace.uri`), the method
//! (`http_method`; a form body joins the query for GET, HEAD and TRACE), then headers, body
//! (JSON, URL-encoded or multipart form) and querystring, each by remove, rename, replace, add and append.
//!
//! Values may be templates (`$(headers.x)`, `$(query_params.y)`, `$(uri_captures.z)`,
//! `template.rs`), rendered from the request as it arrived. Header names, literal values and
//! templates are compiled when the config is built; a request whose route has no body
//! operation is not read whole.

mod schema;
mod template;

use std::borrow::Cow;
use std::sync::Arc;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, CONTENT_TYPE, HOST};
use serde_json::{Map, Value};

use crate::multipart::{self, Multipart};
use crate::{Access, AccessRequest, BuildContext, Handler, PluginSpec};
use template::{Env, Template};

pub struct RequestTransformer;

impl PluginSpec for RequestTransformer {
    fn name(&self) -> &'static str {
        "request-transformer"
    }
    fn priority(&self) -> i32 {
        801
    }
    fn fields(&self) -> &'static [crate::schema::Field] {
        schema::FIELDS
    }
    fn entity_checks(&self, config: &Value) -> Vec<(String, String)> {
        schema::entity_checks(config)
    }
    fn build(&self, config: &Value, _ctx: &BuildContext) -> Result<Arc<dyn Handler>, String> {
        Ok(Arc::new(Configured::new(config)?))
    }
}

/// `name:value` as Kong's `iter` splits it (`^([^:]+):*(.-)$`); an empty value is none.
fn split(entry: &str) -> (&str, Option<&str>) {
    match entry.split_once(':') {
        Some((n, v)) => {
            let v = v.trim_start_matches(':');
            (n, (!v.is_empty()).then_some(v))
        }
        None => (entry, None),
    }
}

/// One `name:value` operation: the value compiled, and as a header value when it is fixed.
struct Pair {
    name: String,
    header: Option<HeaderName>,
    value: Template,
    fixed: Option<String>,
    fixed_header: Option<HeaderValue>,
}

impl Pair {
    fn list(entries: &[String], headers: bool) -> Result<Vec<Pair>, String> {
        let mut out = Vec::new();
        for e in entries {
            let (name, Some(value)) = split(e) else {
                continue;
            };
            let value = Template::parse(value)?;
            let fixed = value.literal();
            out.push(Pair {
                header: if headers {
                    Some(
                        HeaderName::from_bytes(name.trim().as_bytes())
                            .map_err(|_| format!("invalid header name: {name}"))?,
                    )
                } else {
                    None
                },
                fixed_header: fixed.as_deref().and_then(|f| HeaderValue::from_str(f).ok()),
                name: name.to_string(),
                value,
                fixed,
            });
        }
        Ok(out)
    }

    fn render<'s>(&'s self, env: &Env<'_>) -> Cow<'s, str> {
        match &self.fixed {
            Some(f) => Cow::Borrowed(f),
            None => Cow::Owned(self.value.render(env)),
        }
    }

    fn header_value(&self, env: &Env<'_>) -> Option<HeaderValue> {
        match &self.fixed_header {
            Some(v) => Some(v.clone()),
            None => HeaderValue::from_str(&self.render(env)).ok(),
        }
    }
}

#[derive(Default)]
struct Part {
    remove: Vec<String>,
    rename: Vec<Pair>,
    replace: Vec<Pair>,
    add: Vec<Pair>,
    append: Vec<Pair>,
}

impl Part {
    fn is_empty(&self) -> bool {
        self.remove.is_empty()
            && self.rename.is_empty()
            && self.replace.is_empty()
            && self.add.is_empty()
            && self.append.is_empty()
    }
}

struct Configured {
    /// Whether some value is a template (the request's headers are then kept as they came).
    templated: bool,
    method: Option<http::Method>,
    uri: Option<Template>,
    headers: Part,
    remove_headers: Vec<HeaderName>,
    query: Part,
    body: Part,
}

impl Configured {
    fn new(config: &Value) -> Result<Configured, String> {
        let c: schema::Config = crate::typed(config)?;
        let part =
            |pick: fn(&schema::Ops) -> &Vec<String>, headers: bool| -> Result<Part, String> {
                Ok(Part {
                    remove: pick(&c.remove)
                        .iter()
                        .map(|n| split(n).0.to_string())
                        .collect(),
                    rename: Pair::list(pick(&c.rename), false)?,
                    replace: Pair::list(pick(&c.replace), headers)?,
                    add: Pair::list(pick(&c.add), headers)?,
                    append: Pair::list(pick(&c.append), headers)?,
                })
            };
        let headers = part(|o| &o.headers, true)?;
        let remove_headers = headers
            .remove
            .iter()
            .map(|n| {
                HeaderName::from_bytes(n.trim().as_bytes())
                    .map_err(|_| format!("invalid header name: {n}"))
            })
            .collect::<Result<_, _>>()?;
        let query = part(|o| &o.querystring, false)?;
        let body = part(|o| &o.body, false)?;
        let templated = c.replace.uri.is_some()
            || [&headers, &query, &body].iter().any(|p| {
                [&p.rename, &p.replace, &p.add, &p.append]
                    .iter()
                    .any(|l| l.iter().any(|x| x.fixed.is_none()))
            });
        Ok(Configured {
            templated,
            method: c
                .http_method
                .as_deref()
                .map(|m| http::Method::from_bytes(m.as_bytes()).map_err(|e| e.to_string()))
                .transpose()?,
            uri: c.replace.uri.as_deref().map(Template::parse).transpose()?,
            headers,
            remove_headers,
            query,
            body,
        })
    }

    fn moves_form_to_query(&self) -> bool {
        matches!(
            self.method.as_ref().map(http::Method::as_str),
            Some("GET" | "HEAD" | "TRACE")
        )
    }
}

/// Kong's `append_value`: a second value makes a list.
fn append_value(old: Option<Value>, value: &str) -> Value {
    match old {
        Some(Value::Array(mut a)) => {
            a.push(Value::from(value));
            Value::Array(a)
        }
        Some(v @ (Value::String(_) | Value::Number(_) | Value::Bool(_))) => {
            Value::Array(vec![v, Value::from(value)])
        }
        _ => Value::Array(vec![Value::from(value)]),
    }
}

/// The operations of `part` on a map of names to values (JSON fields, form or query
/// arguments), `has_content`: whether there was a body to take from (Kong removes, renames
/// and replaces only then). Returns whether anything changed.
fn apply(part: &Part, env: &Env<'_>, m: &mut Map<String, Value>, has_content: bool) -> bool {
    let mut changed = false;
    if has_content {
        for name in &part.remove {
            changed |= m.shift_remove(name).is_some();
        }
        for p in &part.rename {
            if let Some(v) = m.shift_remove(&p.name) {
                m.insert(p.render(env).into_owned(), v);
                changed = true;
            }
        }
        for p in &part.replace {
            if let Some(slot) = m.get_mut(&p.name) {
                *slot = Value::from(p.render(env).into_owned());
                changed = true;
            }
        }
    }
    for p in &part.add {
        if !m.contains_key(&p.name) {
            m.insert(p.name.clone(), Value::from(p.render(env).into_owned()));
            changed = true;
        }
    }
    for p in &part.append {
        let old = m.shift_remove(&p.name);
        m.insert(p.name.clone(), append_value(old, &p.render(env)));
        changed = true;
    }
    changed
}

/// Form or query arguments as a map (a name given twice holds a list; a bare name `true`).
fn args(text: &str) -> Map<String, Value> {
    let mut m = Map::new();
    for kv in text.split('&').filter(|kv| !kv.is_empty()) {
        let (k, v) = match kv.split_once('=') {
            Some((k, v)) => (
                crate::form::percent_decode(k),
                Value::from(crate::form::percent_decode(v)),
            ),
            None => (crate::form::percent_decode(kv), Value::Bool(true)),
        };
        let merged = match m.shift_remove(&k) {
            None => v,
            Some(Value::Array(mut a)) => {
                a.push(v);
                Value::Array(a)
            }
            Some(old) => Value::Array(vec![old, v]),
        };
        m.insert(k, merged);
    }
    m
}

/// Kong's `encode_args`: sorted by name, values escaped, a list as repeated names, `true` as a
/// bare name.
fn encode_args(m: &Map<String, Value>) -> String {
    let mut names: Vec<&String> = m.keys().collect();
    names.sort();
    let mut out = Vec::new();
    for k in names {
        let key = crate::form::escape(k);
        let mut one = |v: &Value| match v {
            Value::Bool(true) => out.push(key.clone()),
            Value::Bool(false) | Value::Null => {}
            Value::String(s) => out.push(format!("{key}={}", crate::form::escape(s))),
            other => out.push(format!("{key}={}", crate::form::escape(&other.to_string()))),
        };
        match &m[k] {
            Value::Array(a) => a.iter().for_each(&mut one),
            v => one(v),
        }
    }
    out.join("&")
}

enum BodyKind<'h> {
    Json,
    Form,
    /// `multipart/form-data`, with its boundary.
    Multipart(&'h str),
    Other,
}

fn body_kind(headers: &http::HeaderMap) -> BodyKind<'_> {
    let raw = headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let ct = raw.to_ascii_lowercase();
    if ct.contains("application/json") {
        BodyKind::Json
    } else if ct.contains("application/x-www-form-urlencoded") {
        BodyKind::Form
    } else if let Some(b) = multipart::boundary(raw) {
        BodyKind::Multipart(b)
    } else {
        BodyKind::Other
    }
}

/// Kong's `transform_multipart_body`: rename, remove and replace (only with content), then
/// add; `append` does not apply to multipart bodies. A replaced field moves to the end, as
/// Kong's delete-then-set does. Returns the new body when anything changed; a body that is
/// not well-formed multipart is left as it came.
fn apply_multipart(part: &Part, env: &Env<'_>, raw: &[u8], boundary: &str) -> Option<Vec<u8>> {
    let has_content = !raw.is_empty();
    let mut m = if has_content {
        Multipart::parse(raw, boundary)?
    } else {
        Multipart::empty(boundary)
    };
    let mut changed = false;
    if has_content {
        for p in &part.rename {
            if let Some(v) = m.get(&p.name).map(|x| x.value.to_vec()) {
                m.set_simple(&p.render(env), v);
                m.delete(&p.name);
                changed = true;
            }
        }
        for name in &part.remove {
            m.delete(name);
            changed = true;
        }
        for p in &part.replace {
            if m.get(&p.name).is_some() {
                m.delete(&p.name);
                m.set_simple(&p.name, p.render(env).into_owned().into_bytes());
                changed = true;
            }
        }
    }
    for p in &part.add {
        if m.get(&p.name).is_none() {
            m.set_simple(&p.name, p.render(env).into_owned().into_bytes());
            changed = true;
        }
    }
    changed.then(|| m.encode())
}

impl Configured {
    fn transform_headers(&self, req: &mut AccessRequest<'_>, env: &Env<'_>) {
        let h = &self.headers;
        // Values first: templates read the request as it arrived.
        let replace: Vec<Option<HeaderValue>> =
            h.replace.iter().map(|p| p.header_value(env)).collect();
        let add: Vec<Option<HeaderValue>> = h.add.iter().map(|p| p.header_value(env)).collect();
        let append: Vec<Option<HeaderValue>> =
            h.append.iter().map(|p| p.header_value(env)).collect();
        let renames: Vec<Cow<'_, str>> = h.rename.iter().map(|p| p.render(env)).collect();
        let headers = &mut *req.headers;
        for name in &self.remove_headers {
            headers.remove(name);
        }
        for (p, new) in h.rename.iter().zip(&renames) {
            let Ok(new) = HeaderName::from_bytes(new.trim().as_bytes()) else {
                continue;
            };
            let old = p.name.to_ascii_lowercase();
            if old == new.as_str() {
                continue;
            }
            let values: Vec<HeaderValue> = headers.get_all(old.as_str()).iter().cloned().collect();
            if values.is_empty() {
                continue;
            }
            headers.remove(old.as_str());
            for v in values {
                headers.append(new.clone(), v);
            }
        }
        for (p, v) in h.replace.iter().zip(replace) {
            let (Some(name), Some(v)) = (&p.header, v) else {
                continue;
            };
            if *name == HOST {
                // The Host the upstream gets.
                req.upstream.host = Some(v);
            } else if headers.contains_key(name) {
                headers.insert(name.clone(), v);
            }
        }
        for (p, v) in h.add.iter().zip(add) {
            let (Some(name), Some(v)) = (&p.header, v) else {
                continue;
            };
            if *name != HOST && !headers.contains_key(name) {
                headers.insert(name.clone(), v);
            }
        }
        for (p, v) in h.append.iter().zip(append) {
            let (Some(name), Some(v)) = (&p.header, v) else {
                continue;
            };
            if *name != HOST {
                headers.append(name.clone(), v);
            }
        }
    }
}

impl Handler for Configured {
    fn phases(&self) -> crate::Phases {
        crate::Phases::ACCESS
    }

    fn wants_body(&self) -> bool {
        !self.body.is_empty() || self.moves_form_to_query()
    }

    fn access(&self, req: &mut AccessRequest<'_>) -> Access {
        // The request as it arrived, for templates (a copy only when some value needs it).
        let original = if self.templated {
            req.headers.clone()
        } else {
            http::HeaderMap::new()
        };
        // The query as the client sent it (changes go to `upstream_query`, not here).
        let original_query: Option<&str> = req.query;
        let env = Env {
            headers: &original,
            query: original_query,
            captures: req.captures,
        };
        if let Some(uri) = &self.uri {
            req.upstream.path = Some(uri.render(&env));
        }
        let mut query = req
            .upstream
            .query
            .clone()
            .or_else(|| req.query.map(String::from));
        let mut query_changed = false;
        if let Some(m) = &self.method {
            req.upstream.method = Some(m.clone());
            if self.moves_form_to_query() && matches!(body_kind(req.headers), BodyKind::Form) {
                let form = req
                    .body
                    .as_ref()
                    .and_then(|b| std::str::from_utf8(b).ok())
                    .map(args)
                    .unwrap_or_default();
                if !form.is_empty() {
                    let mut q = args(query.as_deref().unwrap_or(""));
                    for (k, v) in form {
                        let merged = match q.shift_remove(&k) {
                            None => v,
                            Some(Value::Array(mut a)) => {
                                a.push(v);
                                Value::Array(a)
                            }
                            Some(old) => Value::Array(vec![old, v]),
                        };
                        q.insert(k, merged);
                    }
                    query = Some(encode_args(&q));
                    query_changed = true;
                }
            }
        }
        self.transform_headers(req, &env);
        if !self.body.is_empty() {
            let raw = req.body.clone().unwrap_or_default();
            let has_content = !raw.is_empty();
            let out = match body_kind(req.headers) {
                BodyKind::Json => {
                    let m = if has_content {
                        match serde_json::from_slice::<Value>(&raw) {
                            Ok(Value::Object(m)) => Some(m),
                            _ => None,
                        }
                    } else {
                        Some(Map::new())
                    };
                    m.and_then(|mut m| {
                        apply(&self.body, &env, &mut m, has_content)
                            .then(|| serde_json::to_vec(&m).unwrap_or_default())
                    })
                }
                BodyKind::Form => {
                    let mut m = std::str::from_utf8(&raw).map(args).unwrap_or_default();
                    apply(&self.body, &env, &mut m, has_content)
                        .then(|| encode_args(&m).into_bytes())
                }
                BodyKind::Multipart(boundary) => apply_multipart(&self.body, &env, &raw, boundary),
                BodyKind::Other => None,
            };
            if let Some(b) = out {
                // The proxy sends it with its new length.
                req.body = Some(Bytes::from(b));
            }
        }
        if !self.query.is_empty() {
            let mut q = args(query.as_deref().unwrap_or(""));
            apply(&self.query, &env, &mut q, true);
            query = Some(encode_args(&q));
            query_changed = true;
        }
        if query_changed {
            req.upstream.query = query;
        }
        Access::Continue
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_round_trip_sorted_as_kong_encodes_them() {
        let m = args("b=2&a=x%20y&flag&b=3");
        assert_eq!(m["b"], serde_json::json!(["2", "3"]));
        assert_eq!(m["flag"], true);
        assert_eq!(encode_args(&m), "a=x%20y&b=2&b=3&flag");
    }

    #[test]
    fn append_makes_lists() {
        assert_eq!(append_value(None, "a"), serde_json::json!(["a"]));
        assert_eq!(
            append_value(Some(Value::from("x")), "a"),
            serde_json::json!(["x", "a"])
        );
        assert_eq!(
            append_value(Some(serde_json::json!(["x"])), "a"),
            serde_json::json!(["x", "a"])
        );
    }
}
