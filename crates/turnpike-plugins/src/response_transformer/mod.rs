//! response-transformer (PRIORITY 800): changes the response on its way to the client. Its
//! header_filter phase removes, renames, replaces, adds and appends headers (in that order, as
//! Kong does); when JSON fields are to change and the response is JSON, its body_filter phase
//! gathers the body and rewrites it at its end (remove, rename, replace, add, append).
//!
//! Everything a request needs is parsed when the config is built: header names and values,
//! JSON field names and their typed values. A body larger than `BODY_MAX` is passed on as it
//! came (with a warning) instead of being held in memory whole.

mod schema;

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderName, HeaderValue};
use serde_json::{Map, Value};

use crate::{BodyFilter, Handler, PluginSpec, ResponseHead};

pub struct ResponseTransformer;

/// The most body bytes gathered for a JSON rewrite; a larger body goes out unchanged.
const BODY_MAX: usize = 8 * 1024 * 1024;

impl PluginSpec for ResponseTransformer {
    fn name(&self) -> &'static str {
        "response-transformer"
    }
    fn priority(&self) -> i32 {
        800
    }
    /// Kong's `protocols = typedefs.protocols_http`.
    fn http_only(&self) -> bool {
        true
    }
    fn fields(&self) -> &'static [crate::schema::Field] {
        schema::FIELDS
    }
    fn build(
        &self,
        config: &Value,
        _ctx: &crate::BuildContext,
    ) -> Result<Arc<dyn Handler>, String> {
        Ok(Arc::new(Configured::new(config)?))
    }
}

/// `name:value` as Kong's transformers split it (`^([^:]+):*(.-)$`): the name before the first
/// colon, the value after the colons that follow it; an empty value is none.
fn split_entry(entry: &str) -> (&str, Option<&str>) {
    match entry.split_once(':') {
        Some((name, rest)) => {
            let value = rest.trim_start_matches(':');
            (name, (!value.is_empty()).then_some(value))
        }
        None => (entry, None),
    }
}

fn header_name(name: &str) -> Result<HeaderName, String> {
    HeaderName::from_bytes(name.trim().as_bytes())
        .map_err(|_| format!("invalid header name: {name}"))
}

fn header_value(name: &str, value: &str) -> Result<HeaderValue, String> {
    HeaderValue::from_str(value).map_err(|_| format!("invalid value for header {name}: {value}"))
}

/// `name:value` header entries with a value, parsed.
fn header_pairs(ops: &schema::Ops) -> Result<Vec<(HeaderName, HeaderValue)>, String> {
    let mut out = Vec::new();
    for entry in &ops.headers {
        if let (name, Some(value)) = split_entry(entry) {
            out.push((header_name(name)?, header_value(name, value)?));
        }
    }
    Ok(out)
}

/// A JSON value from a config string, as Kong writes it: a string unless `json_types` says
/// number (skipped when not a number) or boolean (`true` only for "true").
fn typed_value(value: &str, ty: Option<&str>) -> Option<Value> {
    match ty {
        Some("number") => {
            let v = value.trim();
            if let Ok(i) = v.parse::<i64>() {
                Some(Value::from(i))
            } else {
                v.parse::<f64>()
                    .ok()
                    .and_then(serde_json::Number::from_f64)
                    .map(Value::Number)
            }
        }
        Some("boolean") => Some(Value::Bool(value == "true")),
        _ => Some(Value::String(value.to_string())),
    }
}

/// `name:value` JSON entries with their `json_types`, parsed; entries without a usable value
/// are dropped, as Kong skips them.
fn json_pairs(ops: &schema::Ops) -> Vec<(String, Value)> {
    ops.json
        .iter()
        .enumerate()
        .filter_map(|(i, entry)| {
            let (name, value) = split_entry(entry);
            let v = typed_value(value?, ops.json_types.get(i).map(String::as_str))?;
            Some((name.to_string(), v))
        })
        .collect()
}

struct Configured {
    remove_headers: Vec<HeaderName>,
    rename_headers: Vec<(HeaderName, HeaderName)>,
    replace_headers: Vec<(HeaderName, HeaderValue)>,
    add_headers: Vec<(HeaderName, HeaderValue)>,
    append_headers: Vec<(HeaderName, HeaderValue)>,
    /// The JSON rewrite, when any JSON field is to change.
    json: Option<Arc<JsonRewrite>>,
}

#[derive(Debug, Default)]
struct JsonRewrite {
    remove: Vec<String>,
    rename: Vec<(String, String)>,
    replace: Vec<(String, Value)>,
    add: Vec<(String, Value)>,
    append: Vec<(String, Value)>,
}

impl Configured {
    fn new(config: &Value) -> Result<Configured, String> {
        let c: schema::Config = crate::typed(config)?;
        let remove_headers = c
            .remove
            .headers
            .iter()
            .map(|h| header_name(h))
            .collect::<Result<_, _>>()?;
        let mut rename_headers = Vec::new();
        for entry in &c.rename.headers {
            if let (old, Some(new)) = split_entry(entry) {
                rename_headers.push((header_name(old)?, header_name(new)?));
            }
        }
        let json = JsonRewrite {
            remove: c.remove.json.clone(),
            rename: c
                .rename
                .json
                .iter()
                .filter_map(|e| match split_entry(e) {
                    (old, Some(new)) => Some((old.to_string(), new.to_string())),
                    _ => None,
                })
                .collect(),
            replace: json_pairs(&c.replace),
            add: json_pairs(&c.add),
            append: json_pairs(&c.append),
        };
        // Kong's is_body_transform_set: any JSON entry at all, even one without a value.
        let any_json = [&c.remove, &c.rename, &c.replace, &c.add, &c.append]
            .iter()
            .any(|r| !r.json.is_empty());
        Ok(Configured {
            remove_headers,
            rename_headers,
            replace_headers: header_pairs(&c.replace)?,
            add_headers: header_pairs(&c.add)?,
            append_headers: header_pairs(&c.append)?,
            json: any_json.then(|| Arc::new(json)),
        })
    }
}

/// Whether a Content-Type names JSON: `application/json`, or a `+json` type
/// (`application/problem+json`), in any of its comma-separated values.
fn is_json(content_type: Option<&HeaderValue>) -> bool {
    let Some(ct) = content_type.and_then(|v| v.to_str().ok()) else {
        return false;
    };
    ct.split(',').any(|t| {
        let media = t
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        match media.split_once('/') {
            Some(("application", sub)) => sub == "json" || sub.ends_with("+json"),
            _ => false,
        }
    })
}

impl Handler for Configured {
    fn phases(&self) -> crate::Phases {
        crate::Phases::RESPONSE
    }

    fn header_filter(&self, resp: &mut ResponseHead<'_>) -> Option<Box<dyn BodyFilter>> {
        let h = &mut *resp.headers;
        for name in &self.remove_headers {
            h.remove(name);
        }
        for (old, new) in &self.rename_headers {
            if h.contains_key(old) {
                let values: Vec<HeaderValue> = h.get_all(old).iter().cloned().collect();
                h.remove(old);
                h.remove(new);
                for v in values {
                    h.append(new.clone(), v);
                }
            }
        }
        for (name, value) in &self.replace_headers {
            if h.contains_key(name) {
                h.insert(name.clone(), value.clone());
            }
        }
        for (name, value) in &self.add_headers {
            if !h.contains_key(name) {
                h.insert(name.clone(), value.clone());
            }
        }
        for (name, value) in &self.append_headers {
            h.append(name.clone(), value.clone());
        }
        let json = self.json.as_ref()?;
        if !is_json(h.get(header::CONTENT_TYPE)) {
            return None;
        }
        // The body is going to change: its length is not known before its end.
        h.remove(header::CONTENT_LENGTH);
        Some(Box::new(JsonBody {
            rewrite: json.clone(),
            gathered: BytesMut::new(),
            passing: false,
        }))
    }
}

/// Gathers a JSON body and answers the rewritten one at its end.
struct JsonBody {
    rewrite: Arc<JsonRewrite>,
    gathered: BytesMut,
    /// Past `BODY_MAX`: what was gathered went out, the rest goes out as it comes.
    passing: bool,
}

impl BodyFilter for JsonBody {
    fn filter(&mut self, piece: Bytes, eof: bool) -> Bytes {
        if self.passing {
            return piece;
        }
        if self.gathered.len() + piece.len() > BODY_MAX {
            tracing::warn!(
                "response-transformer: body larger than {BODY_MAX} bytes, sent unchanged"
            );
            self.passing = true;
            self.gathered.extend_from_slice(&piece);
            return std::mem::take(&mut self.gathered).freeze();
        }
        self.gathered.extend_from_slice(&piece);
        if !eof {
            return Bytes::new();
        }
        let body = std::mem::take(&mut self.gathered).freeze();
        match self.rewrite.apply(&body) {
            Some(rewritten) => Bytes::from(rewritten),
            None => {
                tracing::warn!(
                    "response-transformer: body transform failed: failed parsing json body"
                );
                body
            }
        }
    }
}

impl JsonRewrite {
    /// The rewritten body, or `None` when the body is not a JSON object.
    fn apply(&self, body: &[u8]) -> Option<Vec<u8>> {
        let mut doc: Map<String, Value> = serde_json::from_slice(body).ok()?;
        for name in &self.remove {
            doc.remove(name);
        }
        for (old, new) in &self.rename {
            if let Some(v) = doc.remove(old) {
                doc.insert(new.clone(), v);
            }
        }
        for (name, v) in &self.replace {
            if let Some(slot) = doc.get_mut(name) {
                *slot = v.clone();
            }
        }
        for (name, v) in &self.add {
            // Kong adds where the field is absent or falsy (null, false).
            if matches!(
                doc.get(name),
                None | Some(Value::Null) | Some(Value::Bool(false))
            ) {
                doc.insert(name.clone(), v.clone());
            }
        }
        for (name, v) in &self.append {
            let appended = match doc.remove(name) {
                Some(Value::Array(mut a)) => {
                    a.push(v.clone());
                    a
                }
                Some(s @ Value::String(_)) => vec![s, v.clone()],
                _ => vec![v.clone()],
            };
            doc.insert(name.clone(), Value::Array(appended));
        }
        serde_json::to_vec(&doc).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, StatusCode};
    use serde_json::json;

    fn configured(config: Value) -> Configured {
        let config = crate::schema::validate(schema::FIELDS, &config).expect("valid config");
        Configured::new(&config).expect("builds")
    }

    fn filter(
        c: &Configured,
        headers: &mut HeaderMap,
        body: &[&str],
    ) -> (Option<String>, HeaderMap) {
        let mut head = ResponseHead {
            status: StatusCode::OK,
            headers,
            from_upstream: true,
            consumer: None,
            ctx: &mut crate::PluginCtx::default(),
            buffered: None,
        };
        let out = c.header_filter(&mut head).map(|mut f| {
            let mut out = Vec::new();
            for piece in body {
                out.extend_from_slice(&f.filter(Bytes::copy_from_slice(piece.as_bytes()), false));
            }
            out.extend_from_slice(&f.filter(Bytes::new(), true));
            String::from_utf8(out).unwrap()
        });
        (out, headers.clone())
    }

    #[test]
    fn entries_split_as_kong_splits_them() {
        assert_eq!(split_entry("a:b"), ("a", Some("b")));
        assert_eq!(split_entry("p3:value:3"), ("p3", Some("value:3")));
        assert_eq!(split_entry("a::b"), ("a", Some("b")));
        assert_eq!(split_entry("a:"), ("a", None));
        assert_eq!(split_entry("a"), ("a", None));
    }

    #[test]
    fn headers_in_kong_order() {
        let c = configured(json!({
            "remove": {"headers": ["x-remove", "Via"]},
            "rename": {"headers": ["x-old:x-new"]},
            "replace": {"headers": ["x-replace:new", "x-absent:never"]},
            "add": {"headers": ["x-add:added", "x-present:ignored"]},
            "append": {"headers": ["x-append:second"]},
        }));
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("x-remove", "1"),
            ("via", "kong/3.9.1"),
            ("x-old", "a"),
            ("x-old", "b"),
            ("x-replace", "old"),
            ("x-present", "kept"),
            ("x-append", "first"),
            ("content-length", "2"),
        ] {
            h.append(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        let (body, h) = filter(&c, &mut h, &["{}"]);
        assert_eq!(body, None, "no JSON change: the body is not filtered");
        assert!(h.get("x-remove").is_none() && h.get("via").is_none());
        assert!(h.get("x-old").is_none());
        let renamed: Vec<_> = h.get_all("x-new").iter().collect();
        assert_eq!(renamed, ["a", "b"]);
        assert_eq!(h["x-replace"], "new");
        assert!(h.get("x-absent").is_none());
        assert_eq!(h["x-add"], "added");
        assert_eq!(h["x-present"], "kept");
        let appended: Vec<_> = h.get_all("x-append").iter().collect();
        assert_eq!(appended, ["first", "second"]);
        assert_eq!(h["content-length"], "2");
    }

    #[test]
    fn json_bodies_in_kong_order() {
        let c = configured(json!({
            "remove": {"json": ["secret"]},
            "rename": {"json": ["old:new"]},
            "replace": {"json": ["count:7", "absent:x"], "json_types": ["number", "string"]},
            "add": {"json": ["flag:true", "name:ignored", "nothing:"], "json_types": ["boolean"]},
            "append": {"json": ["tags:b", "single:two", "fresh:one"]},
        }));
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json; charset=utf-8"),
        );
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("99"));
        let (body, h) = filter(
            &c,
            &mut h,
            &[
                r#"{"secret":"s","old":1,"count":"3","name":"n","#,
                r#""tags":["a"],"single":"one"}"#,
            ],
        );
        let got: Value = serde_json::from_str(&body.expect("filtered")).unwrap();
        assert_eq!(
            got,
            json!({"new": 1, "count": 7, "name": "n", "flag": true,
                   "tags": ["a", "b"], "single": ["one", "two"], "fresh": ["one"]})
        );
        assert!(
            h.get(header::CONTENT_LENGTH).is_none(),
            "the length changes"
        );
    }

    #[test]
    fn bodies_that_are_not_json_objects_pass_unchanged() {
        let c = configured(json!({"add": {"json": ["a:1"]}}));
        let json_type = || {
            let mut h = HeaderMap::new();
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            h
        };
        assert_eq!(
            filter(&c, &mut json_type(), &["[1,2]"]).0.as_deref(),
            Some("[1,2]")
        );
        assert_eq!(
            filter(&c, &mut json_type(), &["not json"]).0.as_deref(),
            Some("not json")
        );
        // Not JSON by its type: no body filter, the length stays.
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("2"));
        let (body, h) = filter(&c, &mut h, &["{}"]);
        assert_eq!(body, None);
        assert_eq!(h[header::CONTENT_LENGTH], "2");
        assert!(is_json(Some(&HeaderValue::from_static(
            "application/problem+json"
        ))));
        assert!(!is_json(Some(&HeaderValue::from_static("text/json-ish"))));
    }

    #[test]
    fn a_body_past_the_bound_goes_out_unchanged() {
        let c = configured(json!({"add": {"json": ["a:1"]}}));
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        let mut head = ResponseHead {
            status: StatusCode::OK,
            headers: &mut h,
            from_upstream: true,
            consumer: None,
            ctx: &mut crate::PluginCtx::default(),
            buffered: None,
        };
        let mut f = c.header_filter(&mut head).unwrap();
        let half = Bytes::from(vec![b' '; BODY_MAX / 2 + 1]);
        assert!(f.filter(half.clone(), false).is_empty(), "gathered");
        let out = f.filter(half.clone(), false);
        assert_eq!(out.len(), 2 * half.len(), "what was gathered goes out");
        assert_eq!(f.filter(Bytes::from_static(b"x"), false), "x");
        assert!(f.filter(Bytes::new(), true).is_empty());
    }

    #[test]
    fn invalid_configs_are_refused() {
        let e = crate::schema::validate(
            schema::FIELDS,
            &json!({"add": {"headers": ["no-colon"], "json_types": ["date"]}}),
        )
        .unwrap_err();
        assert!(e.contains(&("add.headers.1".into(), "invalid value: no-colon".into())));
        assert!(e.contains(&(
            "add.json_types.1".into(),
            "expected one of: boolean, number, string".into()
        )));
        let config =
            crate::schema::validate(schema::FIELDS, &json!({"add": {"headers": ["bad name:v"]}}))
                .unwrap();
        assert!(Configured::new(&config).is_err());
    }
}
