//! grpc-gateway (PRIORITY 998): REST clients call a gRPC service through the gateway, as
//! Kong's `kong/plugins/grpc-gateway/{handler,deco}.lua` do it. The service's `.proto` file
//! (`proto`) says, in each method's `google.api.http` option, which HTTP method and path
//! template reach it; a request matching one becomes that method's gRPC call:
//! - the message is built from the path's variables, then the JSON body (`body: "*"` merges
//!   it, `body: "field"` puts it in that field) or, without `body`, the query arguments
//!   (dotted names into nested messages; a bool from anything but `0` and `false` is true);
//! - it goes upstream framed, as `POST /<package>.<Service>/<Method>` with
//!   `Content-Type: application/grpc` and `TE: trailers`, without the query;
//! - the answer's messages come back as JSON objects one after the other (Kong's
//!   concatenation, not an array), `Content-Type: application/json`, and a `grpc-status`
//!   header (a trailers-only answer: an error) becomes the HTTP status of Kong's table.
//!
//! The file is compiled when the config is built ([`crate::grpc_proto`]), and each binding's
//! template compiled to a regex then, not per request.

mod schema;

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use http::{header, HeaderName, HeaderValue, Method as HttpMethod, StatusCode};
use prost::Message as _;
use prost_reflect::{DynamicMessage, MessageDescriptor};
use regex::Regex;
use serde_json::{Map, Value};

use crate::grpc_proto::{self, json};
use crate::{Access, AccessRequest, BodyFilter, Exit, Handler, PluginSpec, ResponseHead};

pub struct GrpcGateway;

impl PluginSpec for GrpcGateway {
    fn name(&self) -> &'static str {
        "grpc-gateway"
    }
    fn priority(&self) -> i32 {
        998
    }
    fn fields(&self) -> &'static [crate::schema::Field] {
        schema::FIELDS
    }
    fn build(&self, config: &Value, ctx: &crate::BuildContext) -> Result<Arc<dyn Handler>, String> {
        let c: schema::Config = crate::typed(config)?;
        let endpoints = match &c.proto {
            None => None,
            Some(path) => {
                let proto = ctx
                    .runtime
                    .protos
                    .load(path)
                    .map_err(|e| format!("failed to load the .proto file {e}"))?;
                Some(Endpoints::new(&proto)?)
            }
        };
        Ok(Arc::new(Configured { endpoints }))
    }
}

struct Configured {
    /// `None` without a `proto`: every request is Kong's 400.
    endpoints: Option<Endpoints>,
}

/// One binding: what a matching request becomes.
struct Endpoint {
    regex: Regex,
    /// The template's variables, in the order of the regex's groups.
    vars: Vec<String>,
    rewrite_path: String,
    input: MessageDescriptor,
    output: MessageDescriptor,
    body: Option<String>,
}

/// A matched path's variables, (name, value) in the template's order.
type PathVars = Vec<(String, String)>;

/// The bindings by HTTP method, each list in the file's order (Kong's `info[method]`).
struct Endpoints {
    by_method: Vec<(&'static str, Vec<Endpoint>)>,
}

impl Endpoints {
    fn new(proto: &grpc_proto::Proto) -> Result<Endpoints, String> {
        let mut by_method: Vec<(&'static str, Vec<Endpoint>)> = Vec::new();
        for m in &proto.methods {
            for rule in &m.http {
                let (re, vars) = template_regex(&rule.template)
                    .map_err(|e| format!("{}: path template '{}': {e}", m.path, rule.template))?;
                let regex = Regex::new(&re).map_err(|e| format!("{}: {e}", m.path))?;
                let endpoint = Endpoint {
                    regex,
                    vars,
                    rewrite_path: m.path.clone(),
                    input: m.input.clone(),
                    output: m.output.clone(),
                    body: rule.body.clone(),
                };
                match by_method.iter_mut().find(|(k, _)| *k == rule.method) {
                    Some((_, list)) => list.push(endpoint),
                    None => by_method.push((rule.method, vec![endpoint])),
                }
            }
        }
        Ok(Endpoints { by_method })
    }

    /// The endpoint for a request, with the values of its path variables; Kong's error text
    /// when none (`Unknown method "put"`, `Unknown path "/x"`).
    fn find(&self, method: &str, path: &str) -> Result<(&Endpoint, PathVars), String> {
        let Some((_, list)) = self.by_method.iter().find(|(k, _)| *k == method) else {
            return Err(format!("Unknown method {}", grpc_proto::lua_quote(method)));
        };
        for e in list {
            if let Some(c) = e.regex.captures(path) {
                let vars = e
                    .vars
                    .iter()
                    .enumerate()
                    .map(|(i, name)| {
                        let v = c.get(i + 1).map_or("", |m| m.as_str());
                        (name.clone(), crate::form::percent_decode(v))
                    })
                    .collect();
                return Ok((e, vars));
            }
        }
        Err(format!("Unknown path {}", grpc_proto::lua_quote(path)))
    }
}

/// A path template (`/v1/{name=messages/*}/items/{id}:verb`) as a regex with one group per
/// variable: `*` is one segment, `**` any number, a variable without a pattern one segment
/// (Kong's `parse_options_path`; literals are matched as text here, where Kong's regex left
/// their `.` matching any character).
fn template_regex(template: &str) -> Result<(String, Vec<String>), String> {
    fn segments(s: &str) -> String {
        s.split('/')
            .map(|seg| match seg {
                "*" => "[^/]+".to_string(),
                "**" => ".+".to_string(),
                lit => regex::escape(lit),
            })
            .collect::<Vec<_>>()
            .join("/")
    }
    let mut re = String::from("^");
    let mut vars = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        re.push_str(&segments(&rest[..open]));
        let close = rest[open..]
            .find('}')
            .map(|c| c + open)
            .ok_or("a '{' without its '}'")?;
        let inner = &rest[open + 1..close];
        let (name, pattern) = inner.split_once('=').unwrap_or((inner, "*"));
        let ident = |s: &str| {
            !s.is_empty()
                && s.bytes()
                    .all(|c| c.is_ascii_alphanumeric() || b"-_.~".contains(&c))
        };
        if !ident(name) || pattern.is_empty() {
            return Err(format!("bad variable '{{{inner}}}'"));
        }
        vars.push(name.to_string());
        re.push('(');
        re.push_str(&segments(pattern));
        re.push(')');
        rest = &rest[close + 1..];
    }
    re.push_str(&segments(rest));
    re.push('$');
    Ok((re, vars))
}

/// `value` at the dotted `path` of the JSON payload for a message of type `desc`, when every
/// name on the way is a field (Kong's `add_to_table`: an argument naming no field is left
/// out); a bool field reads `0` and `false` as false.
fn add_arg(payload: &mut Map<String, Value>, desc: &MessageDescriptor, path: &str, value: Value) {
    let mut names = path.split('.').peekable();
    let mut table = payload;
    let mut desc = desc.clone();
    while let Some(name) = names.next() {
        let Some(fd) = desc.get_field_by_name(name) else {
            return;
        };
        if names.peek().is_none() {
            let v = match (fd.kind(), value) {
                (prost_reflect::Kind::Bool, Value::String(s)) => {
                    Value::Bool(s != "0" && s != "false")
                }
                (_, v) => v,
            };
            table.insert(name.to_string(), v);
            return;
        }
        let prost_reflect::Kind::Message(next) = fd.kind() else {
            return;
        };
        desc = next;
        let slot = table
            .entry(name.to_string())
            .or_insert_with(|| Value::Object(Map::new()));
        if !slot.is_object() {
            *slot = Value::Object(Map::new());
        }
        table = slot.as_object_mut().expect("an object just put there");
    }
}

/// Query arguments as `ngx.req.get_uri_args` gives them: a name given once has its value, a
/// name given more than once the list of them, a name without `=` is `true`.
fn query_args(query: &str) -> Vec<(String, Value)> {
    let mut out: Vec<(String, Value)> = Vec::new();
    for kv in query.split('&').filter(|kv| !kv.is_empty()) {
        let (k, v) = match kv.split_once('=') {
            Some((k, v)) => (
                crate::form::percent_decode(k),
                Value::String(crate::form::percent_decode(v)),
            ),
            None => (crate::form::percent_decode(kv), Value::Bool(true)),
        };
        match out.iter_mut().find(|(name, _)| *name == k) {
            Some((_, Value::Array(list))) => list.push(v),
            Some((_, first)) => *first = Value::Array(vec![first.take(), v]),
            None => out.push((k, v)),
        }
    }
    out
}

/// What the access phase leaves for the response: the method's output type.
struct Call {
    output: MessageDescriptor,
}

static ALLOW_ORIGIN: HeaderName = header::ACCESS_CONTROL_ALLOW_ORIGIN;

fn bad_request(text: impl Into<String>) -> Access {
    let text = text.into();
    tracing::info!("grpc-gateway: {text}");
    Access::Exit(Exit::text(StatusCode::BAD_REQUEST, text))
}

impl Handler for Configured {
    fn phases(&self) -> crate::Phases {
        crate::Phases::ACCESS | crate::Phases::RESPONSE
    }

    fn wants_body(&self) -> bool {
        true
    }

    fn access(&self, req: &mut AccessRequest<'_>) -> Access {
        req.response_headers
            .push((ALLOW_ORIGIN.clone(), HeaderValue::from_static("*")));
        if req.method == "OPTIONS" {
            return Access::Exit(grpc_proto::preflight(
                "application/json",
                HeaderValue::from_static("*"),
                "GET,POST,PATCH,DELETE",
                "content-type",
            ));
        }
        let Some(endpoints) = &self.endpoints else {
            return bad_request("transcoding requests require a .proto file defining the service");
        };
        let method = req.method.to_ascii_lowercase();
        let (endpoint, vars) = match endpoints.find(&method, req.path) {
            Ok(found) => found,
            Err(e) => return bad_request(format!("failed to transcode .proto file {e}")),
        };
        let mut payload = Map::new();
        for (name, value) in vars {
            add_arg(&mut payload, &endpoint.input, &name, Value::String(value));
        }
        let body = req.body.take().unwrap_or_default();
        match &endpoint.body {
            Some(field) if !body.is_empty() => {
                let decoded: Value = match serde_json::from_slice(&body) {
                    Ok(v) => v,
                    Err(e) => {
                        let why = json::cjson_error(&body).unwrap_or_else(|| e.to_string());
                        return bad_request(format!("decode json err: {why}"));
                    }
                };
                if field != "*" {
                    payload.insert(field.clone(), decoded);
                } else {
                    match decoded {
                        Value::Object(o) => payload.extend(o),
                        // A list is a Lua table too: its numbered keys name no field.
                        Value::Array(_) => {}
                        _ => return bad_request("body must be a table"),
                    }
                }
            }
            Some(_) => {}
            None => {
                for (k, v) in query_args(req.query.unwrap_or("")) {
                    add_arg(&mut payload, &endpoint.input, &k, v);
                }
            }
        }
        let msg = match json::from_json(&endpoint.input, &Value::Object(payload)) {
            Ok(m) => m,
            Err(e) => {
                tracing::error!("grpc-gateway: {e}");
                return bad_request("failed to encode payload");
            }
        };
        req.body = Some(Bytes::from(grpc_proto::frame(0, &msg.encode_to_vec())));
        req.headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        req.headers
            .insert(header::TE, HeaderValue::from_static("trailers"));
        req.upstream.path = Some(endpoint.rewrite_path.clone());
        req.upstream.query = Some(String::new());
        req.upstream.method = Some(HttpMethod::POST);
        req.ctx.insert(Call {
            output: endpoint.output.clone(),
        });
        Access::Continue
    }

    fn header_filter(&self, resp: &mut ResponseHead<'_>) -> Option<Box<dyn BodyFilter>> {
        let output = resp.ctx.get::<Call>()?.output.clone();
        resp.headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(code) = resp
            .headers
            .get("grpc-status")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<i64>().ok())
        {
            resp.status = http_status(code);
        }
        if !resp.from_upstream {
            return None;
        }
        resp.headers.remove(header::CONTENT_LENGTH);
        Some(Box::new(Downstream {
            output,
            pending: BytesMut::new(),
        }))
    }
}

/// Kong's `grpc_status_map` (google/rpc/code.proto to HTTP); 500 for anything else.
fn http_status(code: i64) -> StatusCode {
    let s = match code {
        0 => 200,
        1 => 499,
        3 | 9 | 11 => 400,
        4 => 504,
        5 => 404,
        6 | 10 => 409,
        7 => 403,
        8 => 429,
        14 => 503,
        16 => 401,
        _ => {
            if !matches!(code, 2 | 12 | 13 | 15) {
                tracing::warn!("grpc-gateway: unable to map grpc-status {code} to an HTTP status");
            }
            500
        }
    };
    StatusCode::from_u16(s).expect("a valid status")
}

/// The upstream's messages as JSON, each as soon as its frame is whole; at the end, what
/// never made a whole frame goes out as it came (Kong's `get_raw_downstream_body`).
struct Downstream {
    output: MessageDescriptor,
    pending: BytesMut,
}

impl BodyFilter for Downstream {
    fn filter(&mut self, piece: Bytes, eof: bool) -> Bytes {
        self.pending.extend_from_slice(&piece);
        let mut out = Vec::new();
        while let Some((_, msg, used)) = grpc_proto::unframe(&self.pending) {
            match DynamicMessage::decode(self.output.clone(), msg) {
                Ok(m) => {
                    if let Ok(text) = serde_json::to_vec(&json::to_json(&m)) {
                        out.extend_from_slice(&text);
                    }
                }
                Err(e) => tracing::error!(
                    "grpc-gateway: the upstream's message is not a {}: {e}",
                    self.output.full_name()
                ),
            }
            let _ = self.pending.split_to(used);
        }
        if eof && out.is_empty() {
            return self.pending.split().freeze();
        }
        Bytes::from(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_compile_as_kongs_parse_options_path() {
        let (re, vars) = template_regex("/v1/messages/{greeting}").unwrap();
        assert_eq!(re, "^/v1/messages/([^/]+)$");
        assert_eq!(vars, ["greeting"]);
        let (re, vars) = template_regex("/v1/messages/legacy/{greeting=**}").unwrap();
        assert_eq!(re, "^/v1/messages/legacy/(.+)$");
        assert_eq!(vars, ["greeting"]);
        let (re, vars) = template_regex("/v1/{name=shelves/*/books/*}:publish").unwrap();
        assert_eq!(re, r"^/v1/(shelves/[^/]+/books/[^/]+):publish$");
        assert_eq!(vars, ["name"]);
        let (re, _) = template_regex("/v1.0/*/x").unwrap();
        assert_eq!(re, r"^/v1\.0/[^/]+/x$");
        assert!(template_regex("/v1/{oops").is_err());
        assert!(template_regex("/v1/{a b}").is_err());
    }

    #[test]
    fn query_arguments_as_ngx_gives_them() {
        assert_eq!(
            query_args("a=1&b&a=2&c=x%20y"),
            vec![
                ("a".to_string(), serde_json::json!(["1", "2"])),
                ("b".to_string(), Value::Bool(true)),
                ("c".to_string(), Value::String("x y".into())),
            ]
        );
    }

    #[test]
    fn grpc_statuses_map_to_kongs_http_statuses() {
        let table = [
            (0, 200),
            (1, 499),
            (2, 500),
            (3, 400),
            (4, 504),
            (5, 404),
            (6, 409),
            (7, 403),
            (8, 429),
            (9, 400),
            (10, 409),
            (11, 400),
            (12, 500),
            (13, 500),
            (14, 503),
            (15, 500),
            (16, 401),
            (17, 500),
        ];
        for (grpc, http) in table {
            assert_eq!(http_status(grpc).as_u16(), http, "grpc-status {grpc}");
        }
    }
}
