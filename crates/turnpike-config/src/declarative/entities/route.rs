//! A route: what it matches and how it forwards.

use serde_json::{Map, Value};

use super::super::fields::{check_host, Fields};
use super::*;

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
    let protocols = match f.str_set("protocols") {
        None => Protocols::http(),
        Some(names) => {
            for (i, p) in names.iter().enumerate() {
                if !ROUTE_PROTOCOLS.contains(&p.as_str()) {
                    f.err(
                        format!("protocols.{}", i + 1),
                        format!("expected one of: {}", ROUTE_PROTOCOLS.join(", ")),
                    );
                }
            }
            Protocols::from_names(names.iter().map(String::as_str))
        }
    };
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
    let path_handling = match f.one_of("path_handling", &["v0", "v1"], Some("v0")) {
        Some(v) if v == "v1" => PathHandling::V1,
        _ => PathHandling::V0,
    };
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
            .any(|p| matches!(p, "grpcs" | "https" | "tls" | "tls_passthrough"))
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
    if let Some(first) = protocols.first().and_then(group_of) {
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
        methods: methods.map(List::from),
        hosts: hosts.map(List::from),
        paths: paths.map(List::from),
        headers: headers.map(Box::new),
        https_redirect_status_code: https_redirect_status_code as u16,
        regex_priority,
        strip_path,
        path_handling,
        preserve_host,
        request_buffering,
        response_buffering,
        snis: snis.map(List::from),
        sources: sources.map(List::from),
        destinations: destinations.map(List::from),
        tags: tags.map(List::from),
        service: None,
    };
    (r, service, errors)
}
