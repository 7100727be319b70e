//! Kong's core entities with their defaults and validation rules (Kong
//! `kong/db/schema/entities/*.lua`), read from one JSON object each.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Map, Value};

use super::fields::{check_host, split_host_port, Fields, REQUIRED};

/// A foreign key as Kong shows it: `{"id": "..."}`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ForeignKey {
    pub id: String,
}

pub const SERVICE_PROTOCOLS: &[&str] = &[
    "grpc",
    "grpcs",
    "http",
    "https",
    "tcp",
    "tls",
    "tls_passthrough",
    "udp",
    "ws",
    "wss",
];
pub const ROUTE_PROTOCOLS: &[&str] = &[
    "grpc",
    "grpcs",
    "http",
    "https",
    "tcp",
    "tls",
    "tls_passthrough",
    "udp",
    "ws",
    "wss",
];
const MAX_TIMEOUT: i64 = 2_147_483_646;

#[derive(Debug, Clone, Serialize)]
pub struct Service {
    pub id: String,
    pub created_at: i64,
    pub updated_at: i64,
    pub name: Option<String>,
    pub retries: u16,
    pub protocol: String,
    pub host: String,
    pub port: u16,
    pub path: Option<String>,
    pub connect_timeout: u32,
    pub write_timeout: u32,
    pub read_timeout: u32,
    pub tags: Option<Vec<String>>,
    pub client_certificate: Option<ForeignKey>,
    pub tls_verify: Option<bool>,
    pub tls_verify_depth: Option<u8>,
    pub ca_certificates: Option<Vec<String>>,
    pub enabled: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct Route {
    pub id: String,
    pub created_at: i64,
    pub updated_at: i64,
    pub name: Option<String>,
    pub protocols: Vec<String>,
    pub methods: Option<Vec<String>>,
    pub hosts: Option<Vec<String>>,
    pub paths: Option<Vec<String>>,
    pub headers: Option<BTreeMap<String, Vec<String>>>,
    pub https_redirect_status_code: u16,
    pub regex_priority: i64,
    pub strip_path: bool,
    pub path_handling: String,
    pub preserve_host: bool,
    pub request_buffering: bool,
    pub response_buffering: bool,
    pub snis: Option<Vec<String>>,
    pub sources: Option<Vec<Value>>,
    pub destinations: Option<Vec<Value>>,
    pub tags: Option<Vec<String>>,
    pub service: Option<ForeignKey>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Upstream {
    pub id: String,
    pub created_at: i64,
    pub updated_at: i64,
    pub name: String,
    pub algorithm: String,
    pub hash_on: String,
    pub hash_fallback: String,
    pub hash_on_header: Option<String>,
    pub hash_fallback_header: Option<String>,
    pub hash_on_cookie: Option<String>,
    pub hash_on_cookie_path: String,
    pub hash_on_query_arg: Option<String>,
    pub hash_fallback_query_arg: Option<String>,
    pub hash_on_uri_capture: Option<String>,
    pub hash_fallback_uri_capture: Option<String>,
    pub slots: u32,
    pub healthchecks: Value,
    pub tags: Option<Vec<String>>,
    pub host_header: Option<String>,
    pub client_certificate: Option<ForeignKey>,
    pub use_srv_name: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct Target {
    pub id: String,
    /// Targets carry millisecond timestamps (Kong's `auto_timestamp_ms`).
    pub created_at: f64,
    pub updated_at: f64,
    pub upstream: ForeignKey,
    pub target: String,
    pub weight: u32,
    pub tags: Option<Vec<String>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Consumer {
    pub id: String,
    pub created_at: i64,
    pub updated_at: i64,
    pub username: Option<String>,
    pub custom_id: Option<String>,
    pub tags: Option<Vec<String>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Plugin {
    pub id: String,
    pub created_at: i64,
    pub updated_at: i64,
    pub name: String,
    pub instance_name: Option<String>,
    pub route: Option<ForeignKey>,
    pub service: Option<ForeignKey>,
    pub consumer: Option<ForeignKey>,
    pub config: Value,
    pub protocols: Vec<String>,
    pub enabled: bool,
    pub tags: Option<Vec<String>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Certificate {
    pub id: String,
    pub created_at: i64,
    pub updated_at: i64,
    pub cert: String,
    pub key: String,
    pub cert_alt: Option<String>,
    pub key_alt: Option<String>,
    pub tags: Option<Vec<String>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Sni {
    pub id: String,
    pub created_at: i64,
    pub updated_at: i64,
    pub name: String,
    pub certificate: ForeignKey,
    pub tags: Option<Vec<String>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CaCertificate {
    pub id: String,
    pub created_at: i64,
    pub updated_at: i64,
    pub cert: String,
    pub cert_digest: Option<String>,
    pub tags: Option<Vec<String>>,
}

/// A credential of one of the auth plugins' tables; its own fields are kept as a JSON object
/// (their meaning belongs to the plugin that reads them).
#[derive(Debug, Clone, Serialize)]
pub struct Credential {
    #[serde(skip)]
    pub kind: CredentialKind,
    pub id: String,
    pub created_at: i64,
    pub consumer: ForeignKey,
    #[serde(flatten)]
    pub fields: Map<String, Value>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CredentialKind {
    KeyAuth,
    BasicAuth,
    Acl,
    Jwt,
    HmacAuth,
    OAuth2,
}

/// (field, required, auto-generated) for each credential table, after Kong's `daos.lua` files.
pub struct CredentialSpec {
    pub table: &'static str,
    pub kind: CredentialKind,
    pub cache_key: &'static [&'static str],
    pub fields: &'static [(&'static str, FieldKind)],
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum FieldKind {
    Required,
    Optional,
    /// Generated when absent (Kong's `auto = true`).
    Auto,
    Int,
    StrArray,
    Bool,
}

pub const CREDENTIALS: &[CredentialSpec] = &[
    CredentialSpec {
        table: "keyauth_credentials",
        kind: CredentialKind::KeyAuth,
        cache_key: &["key"],
        fields: &[("key", FieldKind::Auto), ("ttl", FieldKind::Int)],
    },
    CredentialSpec {
        table: "basicauth_credentials",
        kind: CredentialKind::BasicAuth,
        cache_key: &["username"],
        fields: &[
            ("username", FieldKind::Required),
            ("password", FieldKind::Required),
        ],
    },
    CredentialSpec {
        table: "acls",
        kind: CredentialKind::Acl,
        cache_key: &["consumer", "group"],
        fields: &[("group", FieldKind::Required)],
    },
    CredentialSpec {
        table: "jwt_secrets",
        kind: CredentialKind::Jwt,
        cache_key: &["key"],
        fields: &[
            ("key", FieldKind::Auto),
            ("secret", FieldKind::Auto),
            ("algorithm", FieldKind::Optional),
            ("rsa_public_key", FieldKind::Optional),
        ],
    },
    CredentialSpec {
        table: "hmacauth_credentials",
        kind: CredentialKind::HmacAuth,
        cache_key: &["username"],
        fields: &[
            ("username", FieldKind::Required),
            ("secret", FieldKind::Auto),
        ],
    },
    CredentialSpec {
        table: "oauth2_credentials",
        kind: CredentialKind::OAuth2,
        cache_key: &["client_id"],
        fields: &[
            ("name", FieldKind::Required),
            ("client_id", FieldKind::Auto),
            ("client_secret", FieldKind::Auto),
            ("hash_secret", FieldKind::Bool),
            ("redirect_uris", FieldKind::StrArray),
            ("client_type", FieldKind::Optional),
        ],
    },
];

/// Reads the common `id`; a missing id is filled in by the loader.
pub(crate) fn read_id(f: &mut Fields, generated: &str) -> String {
    f.uuid("id").unwrap_or_else(|| generated.to_string())
}

fn timestamps(f: &mut Fields, now: i64) -> (i64, i64) {
    let c = f.int("created_at", 0, i64::MAX, Some(now)).unwrap_or(now);
    let u = f.int("updated_at", 0, i64::MAX, Some(c)).unwrap_or(c);
    (c, u)
}

/// Parses a service, including Kong's `url` shorthand (protocol, host, port, path).
pub fn service(map: &Map<String, Value>, id: &str, now: i64) -> (Service, Vec<(String, String)>) {
    let mut f = Fields::new(map);
    let id = read_id(&mut f, id);
    let (created_at, updated_at) = timestamps(&mut f, now);
    let name = f.name("name");
    let mut protocol = f
        .one_of("protocol", SERVICE_PROTOCOLS, Some("http"))
        .unwrap();
    let mut host = f.str("host");
    let mut port = f.int("port", 0, 65535, None);
    let mut path = f.str("path");
    if let Some(url) = f.str("url") {
        match parse_url(&url) {
            Ok(u) => {
                protocol = u.scheme;
                host = Some(u.host);
                port = Some(u.port.map(i64::from).unwrap_or(if protocol == "https" {
                    443
                } else {
                    80
                }));
                path = u.path;
            }
            Err(e) => f.err("url", e),
        }
    } else if host.is_none() {
        f.err("host", REQUIRED);
    }
    if let Some(h) = &host {
        if let Err(e) = check_host(h, false, false) {
            f.err("host", e);
        }
    }
    if let Some(p) = &path {
        if !p.starts_with('/') {
            f.err("path", "should start with: /");
        } else if p.contains("//") {
            f.err("path", "must not have empty segments");
        }
    }
    let retries = f.int("retries", 0, 32767, Some(5)).unwrap() as u16;
    let connect_timeout = f
        .int("connect_timeout", 1, MAX_TIMEOUT, Some(60000))
        .unwrap() as u32;
    let write_timeout = f.int("write_timeout", 1, MAX_TIMEOUT, Some(60000)).unwrap() as u32;
    let read_timeout = f.int("read_timeout", 1, MAX_TIMEOUT, Some(60000)).unwrap() as u32;
    let tags = f.tags();
    let client_certificate = f.raw("client_certificate").map(foreign_ref_value);
    let tls_verify = f.opt_bool("tls_verify");
    let tls_verify_depth = f.int("tls_verify_depth", 0, 64, None).map(|d| d as u8);
    let ca_certificates = f.str_array("ca_certificates");
    if let Some(cas) = &ca_certificates {
        for (i, c) in cas.iter().enumerate() {
            if uuid::Uuid::parse_str(c).is_err() {
                f.err(
                    format!("ca_certificates.{}", i + 1),
                    "expected a valid UUID",
                );
            }
        }
    }
    let enabled = f.bool("enabled", true);
    let stream_or_grpc = matches!(
        protocol.as_str(),
        "tcp" | "tls" | "udp" | "grpc" | "grpcs" | "tls_passthrough"
    );
    if stream_or_grpc && path.is_some() {
        f.err("path", "value must be null");
    }
    if !matches!(protocol.as_str(), "https" | "tls" | "wss" | "grpcs") {
        if client_certificate.is_some() {
            f.err("client_certificate", "value must be null");
        }
        if tls_verify.is_some() {
            f.err("tls_verify", "value must be null");
        }
        if tls_verify_depth.is_some() {
            f.err("tls_verify_depth", "value must be null");
        }
        if ca_certificates.is_some() {
            f.err("ca_certificates", "value must be null");
        }
    }
    let errors = f.finish();
    let svc = Service {
        id,
        created_at,
        updated_at,
        name,
        retries,
        protocol,
        host: host.unwrap_or_default(),
        port: port.unwrap_or(80) as u16,
        path,
        connect_timeout,
        write_timeout,
        read_timeout,
        tags,
        client_certificate: client_certificate.map(|id| ForeignKey { id }),
        tls_verify,
        tls_verify_depth,
        ca_certificates,
        enabled,
    };
    (svc, errors)
}

/// A reference written as a string (name or id) or an object with `id` or `name`; the loader
/// resolves it. Kept as written until then.
pub(crate) fn foreign_ref_value(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Object(o) => o
            .get("id")
            .or_else(|| o.get("name"))
            .or_else(|| o.get("username"))
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string(),
        other => other.to_string(),
    }
}

pub struct ParsedUrl {
    pub scheme: String,
    pub host: String,
    pub port: Option<u16>,
    pub path: Option<String>,
}

pub fn parse_url(url: &str) -> Result<ParsedUrl, String> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| "missing scheme in url".to_string())?;
    let scheme = scheme.to_ascii_lowercase();
    if !SERVICE_PROTOCOLS.contains(&scheme.as_str()) {
        return Err(format!("expected one of: {}", SERVICE_PROTOCOLS.join(", ")));
    }
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], Some(rest[i..].to_string())),
        None => (rest, None),
    };
    if authority.is_empty() {
        return Err("missing host in url".into());
    }
    let (host, port) = split_host_port(authority);
    let port = match port {
        Some(p) => Some(
            p.parse::<u16>()
                .map_err(|_| format!("invalid port number: {p}"))?,
        ),
        None => None,
    };
    Ok(ParsedUrl {
        scheme,
        host: host.to_string(),
        port,
        path,
    })
}

const HTTP_ROUTE_FIELDS_MSG: &str = "must set one of 'methods', 'hosts', 'headers', 'paths'";

pub fn route(
    map: &Map<String, Value>,
    id: &str,
    now: i64,
) -> (Route, Option<String>, Vec<(String, String)>) {
    let mut f = Fields::new(map);
    let id = read_id(&mut f, id);
    let (created_at, updated_at) = timestamps(&mut f, now);
    let name = f.name("name");
    let protocols = f
        .str_set("protocols")
        .unwrap_or_else(|| vec!["http".into(), "https".into()]);
    for (i, p) in protocols.iter().enumerate() {
        if !ROUTE_PROTOCOLS.contains(&p.as_str()) {
            f.err(
                format!("protocols.{}", i + 1),
                format!("expected one of: {}", ROUTE_PROTOCOLS.join(", ")),
            );
        }
    }
    let methods = f.str_set("methods");
    if let Some(ms) = &methods {
        for (i, m) in ms.iter().enumerate() {
            if m.is_empty() || !m.chars().all(|c| c.is_ascii_uppercase()) {
                f.err(format!("methods.{}", i + 1), format!("invalid value: {m}"));
            }
        }
    }
    let hosts = f.str_array("hosts");
    if let Some(hs) = &hosts {
        for (i, h) in hs.iter().enumerate() {
            if let Err(e) = check_host(h, true, true) {
                f.err(format!("hosts.{}", i + 1), e);
            }
        }
    }
    let paths = f.str_array("paths");
    if let Some(ps) = &paths {
        for (i, p) in ps.iter().enumerate() {
            if let Some(re) = p.strip_prefix('~') {
                if !re.starts_with('/') {
                    f.err(
                        format!("paths.{}", i + 1),
                        "should start with: / (fixed path) or ~/ (regex path)",
                    );
                } else if let Err(e) = regex::Regex::new(re) {
                    f.err(
                        format!("paths.{}", i + 1),
                        format!("invalid regex: '{re}' ({e})"),
                    );
                }
            } else if !p.starts_with('/') {
                f.err(
                    format!("paths.{}", i + 1),
                    "should start with: / (fixed path) or ~/ (regex path)",
                );
            } else if p.contains("//") {
                f.err(format!("paths.{}", i + 1), "must not have empty segments");
            }
        }
    }
    let headers = match f.raw("headers") {
        None => None,
        Some(Value::Object(o)) => {
            let mut out = BTreeMap::new();
            for (k, v) in o {
                if k.eq_ignore_ascii_case("host") {
                    f.err(
                        "headers",
                        "cannot contain 'host' header, which must be specified in the 'hosts' attribute",
                    );
                    continue;
                }
                if k.is_empty() || !k.bytes().all(|b| b.is_ascii_graphic() && b != b':') {
                    f.err(format!("headers.{k}"), "invalid header name");
                    continue;
                }
                match v {
                    Value::Array(vals)
                        if !vals.is_empty() && vals.iter().all(|x| x.is_string()) =>
                    {
                        let vals: Vec<String> = vals
                            .iter()
                            .map(|x| x.as_str().unwrap().to_string())
                            .collect();
                        for val in &vals {
                            if let Some(re) = val.strip_prefix("~*") {
                                if let Err(e) = regex::Regex::new(re) {
                                    f.err(
                                        format!("headers.{k}"),
                                        format!("invalid regex: '{re}' ({e})"),
                                    );
                                }
                            }
                        }
                        out.insert(k.to_ascii_lowercase(), vals);
                    }
                    Value::String(s) => {
                        out.insert(k.to_ascii_lowercase(), vec![s.clone()]);
                    }
                    _ => f.err(format!("headers.{k}"), "expected an array of strings"),
                }
            }
            Some(out)
        }
        Some(_) => {
            f.err("headers", "expected a map");
            None
        }
    };
    let https_redirect_status_code = f
        .int("https_redirect_status_code", 0, 999, Some(426))
        .unwrap();
    if ![426, 301, 302, 307, 308].contains(&https_redirect_status_code) {
        f.err(
            "https_redirect_status_code",
            "expected one of: 426, 301, 302, 307, 308",
        );
    }
    let regex_priority = f
        .int("regex_priority", i64::MIN, i64::MAX, Some(0))
        .unwrap();
    let strip_path = f.bool("strip_path", true);
    let path_handling = f
        .one_of("path_handling", &["v0", "v1"], Some("v0"))
        .unwrap();
    let preserve_host = f.bool("preserve_host", false);
    let request_buffering = f.bool("request_buffering", true);
    let response_buffering = f.bool("response_buffering", true);
    let snis = f.str_set("snis");
    if let Some(s) = &snis {
        for (i, n) in s.iter().enumerate() {
            if let Err(e) = check_host(n, true, false) {
                f.err(format!("snis.{}", i + 1), e);
            }
        }
    }
    let array = |f: &mut Fields, name: &'static str| match f.raw(name) {
        None => None,
        Some(Value::Array(a)) => Some(a.clone()),
        Some(_) => {
            f.err(name, "expected an array");
            None
        }
    };
    let sources = array(&mut f, "sources");
    let destinations = array(&mut f, "destinations");
    let tags = f.tags();
    let service = f.raw("service").map(foreign_ref_value);
    // Kong's router-flavor specific fields; not valid under traditional_compatible.
    if f.is_set("expression") {
        f.raw("expression");
        f.err("expression", "unknown field");
    }
    if f.is_set("priority") {
        f.raw("priority");
        f.err("priority", "unknown field");
    }

    let is_http = protocols.iter().any(|p| p == "http" || p == "https");
    let non_empty = |o: &Option<Vec<String>>| o.as_ref().is_some_and(|v| !v.is_empty());
    let has_headers = headers.as_ref().is_some_and(|h| !h.is_empty());
    if is_http {
        let any = non_empty(&methods) || non_empty(&hosts) || non_empty(&paths) || has_headers;
        if !(any || protocols.iter().any(|p| p == "https") && non_empty(&snis)) {
            let msg = if protocols.iter().any(|p| p == "https") {
                format!("{HTTP_ROUTE_FIELDS_MSG}, 'snis' when 'protocols' is 'https'")
            } else {
                format!("{HTTP_ROUTE_FIELDS_MSG} when 'protocols' is 'http'")
            };
            f.err("@entity", msg);
        }
    }
    if non_empty(&snis)
        && !protocols
            .iter()
            .any(|p| matches!(p.as_str(), "grpcs" | "https" | "tls" | "tls_passthrough"))
    {
        f.err("snis", "'snis' can only be set when 'protocols' is 'grpcs', 'https', 'tls' or 'tls_passthrough'");
    }
    let groups: [&[&str]; 4] = [
        &["http", "https", "ws", "wss"],
        &["tcp", "tls", "udp"],
        &["tls_passthrough"],
        &["grpc", "grpcs"],
    ];
    let group_of = |p: &str| groups.iter().position(|g| g.contains(&p));
    if let Some(first) = protocols.first().and_then(|p| group_of(p)) {
        if protocols
            .iter()
            .any(|p| group_of(p).is_some_and(|g| g != first))
        {
            f.err("protocols", "mixing protocol types is not allowed");
        }
    }
    let errors = f.finish();
    let r = Route {
        id,
        created_at,
        updated_at,
        name,
        protocols,
        methods,
        hosts,
        paths,
        headers,
        https_redirect_status_code: https_redirect_status_code as u16,
        regex_priority,
        strip_path,
        path_handling,
        preserve_host,
        request_buffering,
        response_buffering,
        snis,
        sources,
        destinations,
        tags,
        service: None,
    };
    (r, service, errors)
}

pub const ALGORITHMS: &[&str] = &[
    "round-robin",
    "consistent-hashing",
    "least-connections",
    "latency",
];
pub const HASH_ON: &[&str] = &[
    "none",
    "consumer",
    "ip",
    "header",
    "cookie",
    "path",
    "query_arg",
    "uri_capture",
];

pub fn upstream(map: &Map<String, Value>, id: &str, now: i64) -> (Upstream, Vec<(String, String)>) {
    let mut f = Fields::new(map);
    let id = read_id(&mut f, id);
    let (created_at, updated_at) = timestamps(&mut f, now);
    let name = f.req_str("name").unwrap_or_default();
    if !name.is_empty() {
        let (h, port) = split_host_port(&name);
        if port.is_some() {
            f.err("name", format!("Invalid name ('{name}'); no port allowed"));
        } else if h.parse::<std::net::IpAddr>().is_ok() {
            f.err(
                "name",
                format!("Invalid name ('{name}'); no ip addresses allowed"),
            );
        } else if let Err(e) = check_host(&name, false, false) {
            f.err("name", e);
        }
    }
    let algorithm = f
        .one_of("algorithm", ALGORITHMS, Some("round-robin"))
        .unwrap();
    let hash_on = f.one_of("hash_on", HASH_ON, Some("none")).unwrap();
    let hash_fallback = f.one_of("hash_fallback", HASH_ON, Some("none")).unwrap();
    let hash_on_header = f.str("hash_on_header");
    let hash_fallback_header = f.str("hash_fallback_header");
    let hash_on_cookie = f.str("hash_on_cookie");
    let hash_on_cookie_path = f.str("hash_on_cookie_path").unwrap_or_else(|| "/".into());
    let hash_on_query_arg = f.str("hash_on_query_arg");
    let hash_fallback_query_arg = f.str("hash_fallback_query_arg");
    let hash_on_uri_capture = f.str("hash_on_uri_capture");
    let hash_fallback_uri_capture = f.str("hash_fallback_uri_capture");
    let slots = f.int("slots", 10, 65536, Some(10000)).unwrap() as u32;
    // Kong fills the whole record with its defaults (what decK expects back).
    let healthchecks = match crate::schema::validate(
        super::healthchecks::FIELDS,
        f.raw("healthchecks").unwrap_or(&Value::Null),
    ) {
        Ok(v) => v,
        Err(errs) => {
            for (at, m) in errs {
                let at = if at.is_empty() {
                    "healthchecks".to_string()
                } else {
                    format!("healthchecks.{at}")
                };
                f.err(&at, m);
            }
            Value::Null
        }
    };
    let tags = f.tags();
    let host_header = f.str("host_header");
    if let Some(h) = &host_header {
        if let Err(e) = check_host(h, false, false) {
            f.err("host_header", e);
        }
    }
    let client_certificate = f.raw("client_certificate").map(foreign_ref_value);
    let use_srv_name = f.bool("use_srv_name", false);
    if hash_on == "header" && hash_on_header.is_none() {
        f.err("hash_on_header", REQUIRED);
    }
    if hash_fallback == "header" && hash_fallback_header.is_none() {
        f.err("hash_fallback_header", REQUIRED);
    }
    if hash_on == "cookie" && hash_on_cookie.is_none() {
        f.err("hash_on_cookie", REQUIRED);
    }
    if hash_on == "query_arg" && hash_on_query_arg.is_none() {
        f.err("hash_on_query_arg", REQUIRED);
    }
    if hash_on == "uri_capture" && hash_on_uri_capture.is_none() {
        f.err("hash_on_uri_capture", REQUIRED);
    }
    if hash_on == "none" && hash_fallback != "none" {
        f.err("hash_fallback", "must be 'none' when 'hash_on' is 'none'");
    }
    if hash_on == "cookie" && hash_fallback != "none" {
        f.err("hash_fallback", "must be 'none' when 'hash_on' is 'cookie'");
    }
    if hash_on != "none"
        && hash_on == hash_fallback
        && !matches!(hash_on.as_str(), "header" | "query_arg" | "uri_capture")
    {
        f.err("hash_fallback", "must be different from 'hash_on'");
    }
    let errors = f.finish();
    let u = Upstream {
        id,
        created_at,
        updated_at,
        name,
        algorithm,
        hash_on,
        hash_fallback,
        hash_on_header,
        hash_fallback_header,
        hash_on_cookie,
        hash_on_cookie_path,
        hash_on_query_arg,
        hash_fallback_query_arg,
        hash_on_uri_capture,
        hash_fallback_uri_capture,
        slots,
        healthchecks,
        tags,
        host_header,
        client_certificate: client_certificate.map(|id| ForeignKey { id }),
        use_srv_name,
    };
    (u, errors)
}

/// Normalises a target to `host:port`, with Kong's default port 8000.
pub fn normalize_target(t: &str) -> Result<String, String> {
    let (host, port) = split_host_port(t);
    check_host(host, false, false)
        .map_err(|_| format!("Invalid target ('{t}'); not a valid hostname or ip address"))?;
    let port = match port {
        Some(p) => p
            .parse::<u16>()
            .map_err(|_| format!("Invalid target ('{t}'); not a valid port"))?,
        None => 8000,
    };
    let host = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_string()
    };
    Ok(format!("{host}:{port}"))
}

/// `now_ms`: the time in milliseconds. Kong stamps targets in seconds with a millisecond
/// fraction (`1732490000.123`), unlike other entities' whole seconds.
pub fn target(
    map: &Map<String, Value>,
    id: &str,
    now_ms: i64,
) -> (Target, Option<String>, Vec<(String, String)>) {
    let mut f = Fields::new(map);
    let id = read_id(&mut f, id);
    let now = now_ms as f64 / 1000.0;
    let created_at = f.raw("created_at").and_then(|v| v.as_f64()).unwrap_or(now);
    let updated_at = f
        .raw("updated_at")
        .and_then(|v| v.as_f64())
        .unwrap_or(created_at);
    let raw_target = f.req_str("target").unwrap_or_default();
    let target = if raw_target.is_empty() {
        String::new()
    } else {
        match normalize_target(&raw_target) {
            Ok(t) => t,
            Err(e) => {
                f.err("target", e);
                raw_target
            }
        }
    };
    let weight = f.int("weight", 0, 65535, Some(100)).unwrap() as u32;
    let tags = f.tags();
    let upstream = f.raw("upstream").map(foreign_ref_value);
    let errors = f.finish();
    (
        Target {
            id,
            created_at,
            updated_at,
            upstream: ForeignKey { id: String::new() },
            target,
            weight,
            tags,
        },
        upstream,
        errors,
    )
}

pub fn consumer(map: &Map<String, Value>, id: &str, now: i64) -> (Consumer, Vec<(String, String)>) {
    let mut f = Fields::new(map);
    let id = read_id(&mut f, id);
    let (created_at, updated_at) = timestamps(&mut f, now);
    let username = f.str("username");
    let custom_id = f.str("custom_id");
    let tags = f.tags();
    if username.is_none()
        && custom_id.is_none()
        && !f
            .errors
            .iter()
            .any(|(k, _)| k == "username" || k == "custom_id")
    {
        f.err(
            "@entity",
            "at least one of these fields must be non-empty: 'custom_id', 'username'",
        );
    }
    let errors = f.finish();
    (
        Consumer {
            id,
            created_at,
            updated_at,
            username,
            custom_id,
            tags,
        },
        errors,
    )
}

pub struct PluginRefs {
    pub route: Option<String>,
    pub service: Option<String>,
    pub consumer: Option<String>,
}

pub fn plugin(
    map: &Map<String, Value>,
    id: &str,
    now: i64,
) -> (Plugin, PluginRefs, Vec<(String, String)>) {
    let mut f = Fields::new(map);
    let id = read_id(&mut f, id);
    let (created_at, updated_at) = timestamps(&mut f, now);
    let name = f.req_str("name").unwrap_or_default();
    let instance_name = f.name("instance_name");
    let config = match f.raw("config") {
        None => Value::Object(Map::new()),
        Some(v @ Value::Object(_)) => v.clone(),
        Some(_) => {
            f.err("config", "expected a record");
            Value::Object(Map::new())
        }
    };
    let protocols = f.str_set("protocols").unwrap_or_else(|| {
        ["grpc", "grpcs", "http", "https"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    });
    for (i, p) in protocols.iter().enumerate() {
        if !ROUTE_PROTOCOLS.contains(&p.as_str()) {
            f.err(
                format!("protocols.{}", i + 1),
                format!("expected one of: {}", ROUTE_PROTOCOLS.join(", ")),
            );
        }
    }
    let enabled = f.bool("enabled", true);
    let tags = f.tags();
    let refs = PluginRefs {
        route: f.raw("route").map(foreign_ref_value),
        service: f.raw("service").map(foreign_ref_value),
        consumer: f.raw("consumer").map(foreign_ref_value),
    };
    let errors = f.finish();
    let p = Plugin {
        id,
        created_at,
        updated_at,
        name,
        instance_name,
        route: None,
        service: None,
        consumer: None,
        config,
        protocols,
        enabled,
        tags,
    };
    (p, refs, errors)
}

fn check_pem(f: &mut Fields, field: &'static str, value: &Option<String>, what: &str) {
    if let Some(v) = value {
        if !(v.contains("-----BEGIN") && v.contains(what)) {
            f.err(
                field,
                format!(
                    "invalid {}: not a PEM-encoded {}",
                    field.trim_end_matches("_alt"),
                    what.to_ascii_lowercase()
                ),
            );
        }
    }
}

pub fn certificate(
    map: &Map<String, Value>,
    id: &str,
    now: i64,
) -> (Certificate, Option<Vec<String>>, Vec<(String, String)>) {
    let mut f = Fields::new(map);
    let id = read_id(&mut f, id);
    let (created_at, updated_at) = timestamps(&mut f, now);
    let cert = f.req_str("cert");
    let key = f.req_str("key");
    let cert_alt = f.str("cert_alt");
    let key_alt = f.str("key_alt");
    check_pem(&mut f, "cert", &cert, "CERTIFICATE");
    check_pem(&mut f, "key", &key, "PRIVATE KEY");
    check_pem(&mut f, "cert_alt", &cert_alt, "CERTIFICATE");
    check_pem(&mut f, "key_alt", &key_alt, "PRIVATE KEY");
    if cert_alt.is_some() != key_alt.is_some() {
        f.err(
            "@entity",
            "all or none of these fields must be set: 'cert_alt', 'key_alt'",
        );
    }
    // What the TLS stack will load, checked now: a pair it refuses is a schema violation
    // here, never a stored entity that the data plane fails on.
    for (cf, kf, c, k) in [
        ("cert", "key", &cert, &key),
        ("cert_alt", "key_alt", &cert_alt, &key_alt),
    ] {
        if let (Some(c), Some(k)) = (c, k) {
            if c.contains("-----BEGIN") && k.contains("-----BEGIN") {
                match super::pem::certified_key(c, k) {
                    Ok(_) => {}
                    Err(e @ super::pem::PemError::Cert(_)) => f.err(cf, e.to_string()),
                    Err(e @ super::pem::PemError::Key(_)) => f.err(kf, e.to_string()),
                    Err(e @ super::pem::PemError::Mismatch) => f.err("@entity", e.to_string()),
                }
            }
        }
    }
    let tags = f.tags();
    // `snis` here is transient: plain names that become sni entities. Nested sni objects are
    // handled by the loader (they are entities of their own).
    let sni_names = match map.get("snis") {
        Some(Value::Array(a)) if a.iter().all(|v| v.is_string()) => {
            f.known(&["snis"]);
            let names: Vec<String> = a.iter().map(|v| v.as_str().unwrap().to_string()).collect();
            for (i, n) in names.iter().enumerate() {
                if let Err(e) = check_host(n, true, false) {
                    f.err(format!("snis.{}", i + 1), e);
                }
            }
            Some(names)
        }
        Some(Value::Array(_)) => {
            f.known(&["snis"]);
            None
        }
        _ => None,
    };
    let errors = f.finish();
    let c = Certificate {
        id,
        created_at,
        updated_at,
        cert: cert.unwrap_or_default(),
        key: key.unwrap_or_default(),
        cert_alt,
        key_alt,
        tags,
    };
    (c, sni_names, errors)
}

pub fn sni(
    map: &Map<String, Value>,
    id: &str,
    now: i64,
) -> (Sni, Option<String>, Vec<(String, String)>) {
    let mut f = Fields::new(map);
    let id = read_id(&mut f, id);
    let (created_at, updated_at) = timestamps(&mut f, now);
    let name = f.req_str("name").unwrap_or_default();
    if !name.is_empty() {
        if let Err(e) = check_host(&name, true, false) {
            f.err("name", e);
        }
    }
    let tags = f.tags();
    let certificate = f.raw("certificate").map(foreign_ref_value);
    let errors = f.finish();
    (
        Sni {
            id,
            created_at,
            updated_at,
            name: name.to_ascii_lowercase(),
            certificate: ForeignKey { id: String::new() },
            tags,
        },
        certificate,
        errors,
    )
}

pub fn ca_certificate(
    map: &Map<String, Value>,
    id: &str,
    now: i64,
) -> (CaCertificate, Vec<(String, String)>) {
    let mut f = Fields::new(map);
    let id = read_id(&mut f, id);
    let (created_at, updated_at) = timestamps(&mut f, now);
    let cert = f.req_str("cert");
    check_pem(&mut f, "cert", &cert, "CERTIFICATE");
    if let Some(c) = cert.as_deref().filter(|c| c.contains("-----BEGIN")) {
        if let Err(e) = super::pem::ca_certificate(c) {
            f.err("cert", e.to_string());
        }
    }
    let cert_digest = f.str("cert_digest");
    let tags = f.tags();
    let errors = f.finish();
    (
        CaCertificate {
            id,
            created_at,
            updated_at,
            cert: cert.unwrap_or_default(),
            cert_digest,
            tags,
        },
        errors,
    )
}

/// Reads a credential of the given table; returns its fields (with generated values filled in)
/// and the consumer reference when written at the top level.
pub fn credential(
    spec: &CredentialSpec,
    map: &Map<String, Value>,
    id: &str,
    now: i64,
) -> (Credential, Option<String>, Vec<(String, String)>) {
    let mut f = Fields::new(map);
    let id = read_id(&mut f, id);
    let created_at = f.int("created_at", 0, i64::MAX, Some(now)).unwrap_or(now);
    let mut fields = Map::new();
    for (name, kind) in spec.fields {
        let v = match kind {
            FieldKind::Required => f.req_str(name).map(Value::String),
            FieldKind::Optional => f.str(name).map(Value::String),
            FieldKind::Auto => Some(Value::String(f.str(name).unwrap_or_else(random_secret))),
            FieldKind::Int => f.int(name, 0, 100_000_000, None).map(Value::from),
            FieldKind::Bool => Some(Value::Bool(f.bool(name, false))),
            FieldKind::StrArray => f.str_array(name).map(Value::from),
        };
        fields.insert(name.to_string(), v.unwrap_or(Value::Null));
    }
    if let Some(t) = f.tags() {
        fields.insert("tags".into(), Value::from(t));
    } else {
        fields.insert("tags".into(), Value::Null);
    }
    let consumer = f.raw("consumer").map(foreign_ref_value);
    let errors = f.finish();
    (
        Credential {
            kind: spec.kind,
            id,
            created_at,
            consumer: ForeignKey { id: String::new() },
            fields,
        },
        consumer,
        errors,
    )
}

/// Kong generates 32 hex characters of randomness for auto credential fields.
fn random_secret() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}
