//! Admin API request bodies as Kong reads them: JSON, or forms (`application/x-www-form-urlencoded`
//! and `multipart/form-data`, as curl's `--data` and `--form` send them) whose flat
//! `a.b=1`, `a[]=x`, `a[1]=x` names become nested JSON, with values typed by the field they
//! fill (an entity's, a plugin's config schema, an upstream's healthchecks record).

use serde_json::{json, Map, Value};
use turnpike_config::entity::FieldKind;
use turnpike_store::crud::url_pairs;

use crate::{message, Resp};
use http::StatusCode;

/// A request body as a JSON object: JSON, or form-encoded the way Kong reads forms
/// (`a.b=1`, `a[]=x`, `a[1]=x`), with values typed by the field they fill.
#[allow(clippy::result_large_err)] // the error is the response itself, built once per request
pub fn parse_body(content_type: Option<&str>, body: &[u8]) -> Result<Map<String, Value>, Resp> {
    let Ok(text) = std::str::from_utf8(body) else {
        return Err(message(
            StatusCode::BAD_REQUEST,
            "Cannot parse request body: invalid UTF-8",
        ));
    };
    let ct = content_type.unwrap_or("").to_ascii_lowercase();
    if text.trim().is_empty() {
        return Ok(Map::new());
    }
    if ct.starts_with("application/x-www-form-urlencoded") {
        return Ok(form_to_json(&url_pairs(text)));
    }
    if ct.starts_with("multipart/form-data") {
        // Kong's documented `curl -F rsa_public_key=@key.pem`: each part is a form field,
        // a file's contents its value.
        return match multipart_pairs(content_type.unwrap_or(""), text) {
            Some(pairs) => Ok(form_to_json(&pairs)),
            None => Err(message(
                StatusCode::BAD_REQUEST,
                "Cannot parse multipart body",
            )),
        };
    }
    if ct.starts_with("multipart/") {
        return Err(message(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "only multipart/form-data bodies are supported; send JSON or a form",
        ));
    }
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(message(
            StatusCode::BAD_REQUEST,
            "Cannot parse JSON body: expected an object",
        )),
        Err(_) => Err(message(StatusCode::BAD_REQUEST, "Cannot parse JSON body")),
    }
}

/// The (name, value) pairs of a `multipart/form-data` body (RFC 7578); `None` when it is not
/// one.
pub(crate) fn multipart_pairs(content_type: &str, body: &str) -> Option<Vec<(String, String)>> {
    let boundary = content_type.split(';').find_map(|p| {
        let (k, v) = p.trim().split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case("boundary")
            .then(|| v.trim().trim_matches('"').to_string())
    })?;
    if boundary.is_empty() {
        return None;
    }
    let delimiter = format!("--{boundary}");
    let mut pairs = Vec::new();
    let mut parts = body.split(delimiter.as_str());
    parts.next()?; // the preamble
    let mut closed = false;
    for part in parts {
        if part.starts_with("--") {
            closed = true;
            break;
        }
        let part = part
            .strip_prefix("\r\n")
            .or_else(|| part.strip_prefix('\n'))?;
        let (head, content) = part
            .split_once("\r\n\r\n")
            .or_else(|| part.split_once("\n\n"))?;
        let content = content
            .strip_suffix("\r\n")
            .or_else(|| content.strip_suffix('\n'))
            .unwrap_or(content);
        let name = head.lines().find_map(|line| {
            let (h, v) = line.split_once(':')?;
            if !h.trim().eq_ignore_ascii_case("content-disposition") {
                return None;
            }
            v.split(';').find_map(|p| {
                let (k, v) = p.trim().split_once('=')?;
                (k.trim() == "name").then(|| v.trim().trim_matches('"').to_string())
            })
        })?;
        pairs.push((name, content.to_string()));
    }
    closed.then_some(pairs)
}

const INT_FIELDS: &[&str] = &[
    "port",
    "retries",
    "connect_timeout",
    "write_timeout",
    "read_timeout",
    "regex_priority",
    "https_redirect_status_code",
    "weight",
    "slots",
    "tls_verify_depth",
    "ttl",
    "priority",
];
const BOOL_FIELDS: &[&str] = &[
    "strip_path",
    "preserve_host",
    "request_buffering",
    "response_buffering",
    "enabled",
    "tls_verify",
    "hash_secret",
    "use_srv_name",
];
const ARRAY_FIELDS: &[&str] = &[
    "hosts",
    "paths",
    "methods",
    "protocols",
    "snis",
    "tags",
    "ca_certificates",
    "redirect_uris",
];

/// Whether a body is a form (its values are all text, typed by the schema they fill).
pub(crate) fn is_form(content_type: Option<&str>) -> bool {
    let ct = content_type.unwrap_or("").to_ascii_lowercase();
    ct.starts_with("application/x-www-form-urlencoded") || ct.starts_with("multipart/form-data")
}

/// In a plugin's config sent as a form, a single value for an array field is an array of one
/// (Kong's `arguments.decode` infers it from the schema): `--data config.scopes=email`.
/// `schema` is the plugin's schema as `/schemas/plugins/{name}` shows it.
pub fn form_arrays(config: &mut Map<String, Value>, fields: &Value) {
    for f in fields.as_array().into_iter().flatten() {
        let Some((name, def)) = f.as_object().and_then(|o| o.iter().next()) else {
            continue;
        };
        let Some(v) = config.get_mut(name) else {
            continue;
        };
        match (def["type"].as_str(), v) {
            (Some("array" | "set"), v @ (Value::String(_) | Value::Number(_) | Value::Bool(_))) => {
                *v = Value::Array(vec![v.take()]);
            }
            (Some("record"), Value::Object(inner)) => form_arrays(inner, &def["fields"]),
            _ => {}
        }
    }
}

/// A plugin entity written as a form (`curl -d expires_in=7200`, as Kong's docs write it):
/// its own fields typed by their kind, as Kong's `arguments.decode` types them by the
/// entity's schema. A value that does not read as its kind is left as text, for the schema's
/// own message.
pub fn form_fields(body: &mut Map<String, Value>, fields: &[(&str, FieldKind)]) {
    for (name, kind) in fields {
        let Some(v) = body.get_mut(*name) else {
            continue;
        };
        let Value::String(raw) = &*v else {
            if let (FieldKind::StrArray, Value::Number(_) | Value::Bool(_)) = (kind, &*v) {
                *v = Value::Array(vec![v.take()]);
            }
            continue;
        };
        let typed = match kind {
            FieldKind::Int | FieldKind::Integer => raw.trim().parse::<i64>().ok().map(Value::from),
            FieldKind::Bool => match raw.as_str() {
                "true" => Some(Value::Bool(true)),
                "false" => Some(Value::Bool(false)),
                _ => None,
            },
            FieldKind::StrArray => Some(Value::Array(vec![v.take()])),
            FieldKind::Required | FieldKind::Optional | FieldKind::Auto => None,
        };
        if let Some(t) = typed {
            *v = t;
        }
    }
}

/// Turns form pairs into a JSON object, typing values the way Kong's schema would.
pub fn form_to_json(pairs: &[(String, String)]) -> Map<String, Value> {
    let mut root = Value::Object(Map::new());
    for (key, raw) in pairs {
        // a.b[1].c[] -> ["a", "b", "1", "c", ""]
        let mut parts: Vec<String> = Vec::new();
        for dotted in key.split('.') {
            let mut rest = dotted;
            if let Some(i) = rest.find('[') {
                parts.push(rest[..i].to_string());
                rest = &rest[i..];
                while let Some(end) = rest.find(']') {
                    parts.push(rest[1..end].to_string());
                    rest = &rest[end + 1..];
                    if !rest.starts_with('[') {
                        break;
                    }
                }
            } else {
                parts.push(rest.to_string());
            }
        }
        let top = parts[0].clone();
        let value = if top == "config" {
            // Plugin configs: numbers and booleans as such (the plugin schema decides).
            typed(raw)
        } else if top == "healthchecks" {
            // An upstream's `--data healthchecks.active.healthy.interval=5`: typed by the
            // healthchecks record, as Kong's `arguments.decode` types it by the schema.
            healthcheck_value(&parts, raw)
        } else if parts.len() == 1 && INT_FIELDS.contains(&top.as_str()) {
            raw.parse::<i64>()
                .map(Value::from)
                .unwrap_or_else(|_| Value::String(raw.clone()))
        } else if parts.len() == 1 && BOOL_FIELDS.contains(&top.as_str()) {
            match raw.as_str() {
                "true" => Value::Bool(true),
                "false" => Value::Bool(false),
                _ => Value::String(raw.clone()),
            }
        } else {
            Value::String(raw.clone())
        };
        // A single value for an array field is an array of one.
        if parts.len() == 1 && ARRAY_FIELDS.contains(&top.as_str()) {
            parts.push(String::new());
        }
        // Inside `healthchecks`, the status lists and each header's values are arrays.
        if top == "healthchecks"
            && (parts.last().is_some_and(|p| p == "http_statuses")
                || parts.len() >= 2 && parts[parts.len() - 2] == "headers")
        {
            parts.push(String::new());
        }
        insert_path(&mut root, &parts, value);
    }
    match root {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// A form value inside an upstream's `healthchecks`: its text fields (`type`, `http_path`,
/// `https_sni`, header values) stay text; the rest are numbers and booleans (intervals,
/// timeouts, counts, statuses, `https_verify_certificate`).
fn healthcheck_value(parts: &[String], raw: &str) -> Value {
    let text = parts.iter().any(|p| p == "headers")
        || matches!(
            parts.last().map(String::as_str),
            Some("type" | "http_path" | "https_sni")
        );
    if text {
        Value::String(raw.to_string())
    } else {
        typed(raw)
    }
}

fn typed(raw: &str) -> Value {
    if let Ok(i) = raw.parse::<i64>() {
        return Value::from(i);
    }
    if let Ok(f) = raw.parse::<f64>() {
        return json!(f);
    }
    match raw {
        "true" => Value::Bool(true),
        "false" => Value::Bool(false),
        _ => Value::String(raw.to_string()),
    }
}

fn insert_path(node: &mut Value, parts: &[String], value: Value) {
    let (head, rest) = (&parts[0], &parts[1..]);
    if rest.is_empty() {
        match node {
            // A name given again (`config.scopes=a&config.scopes=b`, as curl's repeated
            // `--data` sends it) collects its values, as Kong's form arguments do.
            Value::Object(m) => match m.get_mut(head.as_str()) {
                Some(Value::Array(a)) => a.push(value),
                Some(old) => {
                    let first = old.take();
                    *old = Value::Array(vec![first, value]);
                }
                None => {
                    m.insert(head.clone(), value);
                }
            },
            Value::Array(a) => a.push(value),
            _ => {}
        }
        return;
    }
    // The container `head` names: an array when the next part is `` or a number.
    let next_is_index = rest[0].is_empty() || rest[0].parse::<usize>().is_ok();
    let child = match node {
        Value::Object(m) => m.entry(head.clone()).or_insert_with(|| {
            if next_is_index {
                Value::Array(Vec::new())
            } else {
                Value::Object(Map::new())
            }
        }),
        _ => return,
    };
    if next_is_index {
        if let Value::Array(a) = child {
            if rest.len() == 1 {
                a.push(value);
            } else {
                // a[1].b: an object element per index.
                let idx = rest[0].parse::<usize>().unwrap_or(a.len() + 1).max(1) - 1;
                while a.len() <= idx {
                    a.push(Value::Object(Map::new()));
                }
                insert_path(&mut a[idx], &rest[1..], value);
            }
        }
    } else {
        insert_path(child, rest, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(s: &str) -> Vec<(String, String)> {
        url_pairs(s)
    }

    fn tables() -> turnpike_store::schema::Tables {
        turnpike_store::schema::Tables::new(&turnpike_plugins::bundled())
    }

    #[test]
    fn kong_documented_form_arrays() {
        // `--data config.scopes=email --data config.scopes=phone`: repeated names collect.
        let m = form_to_json(&pairs(
            "name=oauth2&config.scopes=email&config.scopes=phone&config.scopes=address",
        ));
        assert_eq!(m["config"]["scopes"], json!(["email", "phone", "address"]));
        // One value for an array field becomes an array of one, by the plugin's schema.
        let mut m = form_to_json(&pairs("name=oauth2&config.scopes=email&config.realm=r"));
        let schema = turnpike_config::declarative::PluginRegistry::schema_json(
            &turnpike_plugins::bundled(),
            "oauth2",
        )
        .unwrap();
        let fields = schema["fields"]
            .as_array()
            .unwrap()
            .iter()
            .find_map(|f| f.get("config"))
            .unwrap()["fields"]
            .clone();
        form_arrays(m["config"].as_object_mut().unwrap(), &fields);
        assert_eq!(m["config"]["scopes"], json!(["email"]));
        assert_eq!(m["config"]["realm"], "r");
    }

    #[test]
    fn plugin_entity_forms_are_typed_by_their_fields() {
        let tables = tables();
        let token = tables.plugin_entity("oauth2_tokens").unwrap();
        let mut m = form_to_json(&pairs("credential.id=c&expires_in=7200&ttl=60&scope=1"));
        form_fields(&mut m, token.fields);
        assert_eq!(m["expires_in"], 7200);
        assert_eq!(m["ttl"], 60);
        assert_eq!(m["scope"], "1", "a text field stays text");
        // Not a number: left as written, for the schema's own message.
        let mut m = form_to_json(&pairs("expires_in=soon"));
        form_fields(&mut m, token.fields);
        assert_eq!(m["expires_in"], "soon");
        let app = tables.plugin_entity("oauth2_credentials").unwrap();
        let mut m = form_to_json(&pairs("name=a&redirect_uris=https://x/cb&hash_secret=true"));
        form_fields(&mut m, app.fields);
        assert_eq!(m["redirect_uris"], json!(["https://x/cb"]));
        assert_eq!(m["hash_secret"], true);
    }

    #[test]
    fn multipart_forms_as_curl_sends_them() {
        let body = "--XyZ\r\nContent-Disposition: form-data; name=\"algorithm\"\r\n\r\nRS256\r\n--XyZ\r\nContent-Disposition: form-data; name=\"rsa_public_key\"; filename=\"pub.pem\"\r\nContent-Type: application/octet-stream\r\n\r\n-----BEGIN PUBLIC KEY-----\nAB\n-----END PUBLIC KEY-----\n\r\n--XyZ--\r\n";
        let m = parse_body(Some("multipart/form-data; boundary=XyZ"), body.as_bytes()).unwrap();
        assert_eq!(m["algorithm"], "RS256");
        assert_eq!(
            m["rsa_public_key"],
            "-----BEGIN PUBLIC KEY-----\nAB\n-----END PUBLIC KEY-----\n"
        );
        // Unterminated, or without a boundary: 400, not a half-read body.
        assert!(parse_body(
            Some("multipart/form-data; boundary=XyZ"),
            b"--XyZ\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\n1"
        )
        .is_err());
        assert!(parse_body(Some("multipart/form-data"), body.as_bytes()).is_err());
    }

    #[test]
    fn upstream_healthchecks_as_a_form_are_typed_by_their_record() {
        let m = form_to_json(&pairs(
            "name=u&healthchecks.active.healthy.interval=5&healthchecks.active.unhealthy.interval=0.5\
             &healthchecks.active.concurrency=3&healthchecks.active.http_path=/200\
             &healthchecks.active.type=https&healthchecks.active.https_sni=10.0.0.1\
             &healthchecks.active.https_verify_certificate=false\
             &healthchecks.active.healthy.http_statuses=200&healthchecks.passive.unhealthy.http_statuses=500\
             &healthchecks.passive.unhealthy.http_statuses=503&healthchecks.active.headers.x-n=1\
             &healthchecks.threshold=25",
        ));
        let h = &m["healthchecks"];
        assert_eq!(h["active"]["healthy"]["interval"], 5);
        assert_eq!(h["active"]["unhealthy"]["interval"], 0.5);
        assert_eq!(h["active"]["concurrency"], 3);
        assert_eq!(h["active"]["http_path"], "/200");
        assert_eq!(h["active"]["type"], "https");
        assert_eq!(h["active"]["https_sni"], "10.0.0.1");
        assert_eq!(h["active"]["https_verify_certificate"], false);
        assert_eq!(h["active"]["healthy"]["http_statuses"], json!([200]));
        assert_eq!(
            h["passive"]["unhealthy"]["http_statuses"],
            json!([500, 503])
        );
        assert_eq!(h["active"]["headers"]["x-n"], json!(["1"]));
        assert_eq!(h["threshold"], 25);
    }

    #[test]
    fn forms_become_typed_json() {
        let m = form_to_json(&pairs(
            "name=svc&port=8080&retries=x&paths[]=/a&paths[]=/b&hosts=h.com&service.id=abc&config.minute=5&config.policy=local&strip_path=false&tags[1]=t",
        ));
        assert_eq!(
            Value::Object(m),
            json!({"name": "svc", "port": 8080, "retries": "x", "paths": ["/a", "/b"], "hosts": ["h.com"],
                   "service": {"id": "abc"}, "config": {"minute": 5, "policy": "local"},
                   "strip_path": false, "tags": ["t"]})
        );
    }
}
