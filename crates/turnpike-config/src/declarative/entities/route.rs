//! A route: what it matches and how it forwards.

use serde_json::{Map, Value};

use super::super::fields::{check_host, Fields};
use super::*;

use crate::atc::{self, RouterFlavor};

/// Kong's bound on `priority`: 2^46 - 1.
pub const MAX_PRIORITY: i64 = (1 << 46) - 1;

const HTTP_ROUTE_FIELDS_MSG: &str = "must set one of 'methods', 'hosts', 'headers', 'paths'";

/// Reads a route as Kong's schema for `flavor` does: `expression` and `priority` exist only
/// under `expressions`, and the ATC flavors check the route as Kong's `validate_route` does.
pub fn route(
    map: &Map<String, Value>,
    id: &str,
    now: i64,
    flavor: RouterFlavor,
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
    // Kong's subschema of the first protocol: gRPC routes default `strip_path` to false and
    // refuse true (`routes_subschemas.lua`).
    let first_grpc = f
        .raw("protocols")
        .and_then(|v| v.as_array())
        .and_then(|a| a.first())
        .and_then(|p| p.as_str())
        .is_some_and(|p| p == "grpc" || p == "grpcs");
    let strip_path = if first_grpc {
        let v = f.bool("strip_path", false);
        if v {
            f.err(
                "strip_path",
                "cannot set 'strip_path' when 'protocols' is 'grpc' or 'grpcs'",
            );
        }
        v
    } else {
        f.bool("strip_path", true)
    };
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
    for (name, list) in [("sources", &sources), ("destinations", &destinations)] {
        for (i, v) in list.iter().flatten().enumerate() {
            check_net(&mut f, name, i + 1, v);
        }
    }
    let tags = f.tags();
    let service = f.raw("service").map(foreign_ref_value);
    // Kong's router-flavor specific fields: in its schema only under `expressions`.
    let expression = if flavor == RouterFlavor::Expressions {
        let expression = f.str("expression");
        let priority = f.int("priority", 0, MAX_PRIORITY, Some(0)).unwrap();
        Some(Box::new(ExpressionFields {
            expression,
            priority: priority as u64,
        }))
    } else {
        for name in ["expression", "priority"] {
            if f.is_set(name) {
                f.known(&["expression", "priority"]);
                f.err(name, "unknown field");
            }
        }
        None
    };
    let has_expression = expression.as_ref().is_some_and(|e| e.expression.is_some());

    let is_http = protocols.iter().any(|p| p == "http" || p == "https");
    let non_empty = |o: &Option<Vec<String>>| o.as_ref().is_some_and(|v| !v.is_empty());
    let has_headers = headers.as_ref().is_some_and(|h| !h.is_empty());
    if is_http {
        let any = non_empty(&methods) || non_empty(&hosts) || non_empty(&paths) || has_headers;
        if !(any || has_expression || protocols.iter().any(|p| p == "https") && non_empty(&snis)) {
            let or_expression = if expression.is_some() {
                ", 'expression'"
            } else {
                ""
            };
            let msg = if protocols.iter().any(|p| p == "https") {
                format!(
                    "{HTTP_ROUTE_FIELDS_MSG}, 'snis'{or_expression} when 'protocols' is 'https'"
                )
            } else {
                format!("{HTTP_ROUTE_FIELDS_MSG}{or_expression} when 'protocols' is 'http'")
            };
            f.err("@entity", msg);
        }
    }
    subschema_checks(
        &mut f,
        &protocols,
        (&methods, &hosts, &paths, has_headers, &snis),
        (&sources, &destinations),
        expression.is_some(),
        has_expression,
    );
    if flavor.is_atc() && f.errors.is_empty() {
        let others = non_empty(&snis)
            || sources.as_ref().is_some_and(|v| !v.is_empty())
            || destinations.as_ref().is_some_and(|v| !v.is_empty())
            || non_empty(&methods)
            || non_empty(&hosts)
            || non_empty(&paths)
            || has_headers;
        if let Some(e) = validate_route(
            expression.as_deref(),
            others,
            regex_priority,
            protocols.first(),
        ) {
            f.err("@entity", e);
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
        methods: methods.map(Shared::from),
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
        tags: tags.map(Shared::from),
        service: None,
        expression,
    };
    (r, service, errors)
}

/// One `sources` / `destinations` element: Kong's record of an `ip` (an IP or a CIDR range)
/// and a `port`, at least one of them (`typedefs.sources`).
fn check_net(f: &mut Fields, name: &str, index: usize, v: &Value) {
    let Some(o) = v.as_object() else {
        f.err(format!("{name}.{index}"), "expected a record");
        return;
    };
    let ip = o.get("ip").filter(|v| !v.is_null());
    let port = o.get("port").filter(|v| !v.is_null());
    if ip.is_none() && port.is_none() {
        f.err(
            format!("{name}.{index}"),
            "at least one of these fields must be non-empty: 'ip', 'port'",
        );
    }
    match ip {
        Some(Value::String(s)) if crate::conf::parse_cidr(s).is_none() => f.err(
            format!("{name}.{index}.ip"),
            format!("invalid ip or cidr range: '{s}'"),
        ),
        Some(Value::String(_)) | None => {}
        Some(_) => f.err(format!("{name}.{index}.ip"), "expected a string"),
    }
    match port {
        Some(Value::Number(n)) if n.as_u64().is_some_and(|p| p <= 65535) => {}
        Some(Value::Number(_)) => f.err(
            format!("{name}.{index}.port"),
            "value should be between 0 and 65535",
        ),
        None => {}
        Some(_) => f.err(format!("{name}.{index}.port"), "expected an integer"),
    }
    for k in o.keys() {
        if k != "ip" && k != "port" {
            f.err(format!("{name}.{index}.{k}"), "unknown field");
        }
    }
}

type Traditional<'a> = (
    &'a Option<Vec<String>>,
    &'a Option<Vec<String>>,
    &'a Option<Vec<String>>,
    bool,
    &'a Option<Vec<String>>,
);

/// Kong's route subschemas (`kong/db/schema/entities/routes_subschemas.lua`), chosen by the
/// first protocol, for what the HTTP check above does not cover: the gRPC and stream ones,
/// and `sources`/`destinations` on HTTP routes. `expressions`: the flavor has the field
/// (it re-allows sources and destinations on HTTP and gRPC routes); `has_expression`: the
/// route sets it.
fn subschema_checks(
    f: &mut Fields,
    protocols: &Protocols,
    (methods, hosts, paths, has_headers, snis): Traditional<'_>,
    (sources, destinations): (&Option<Vec<Value>>, &Option<Vec<Value>>),
    expressions: bool,
    has_expression: bool,
) {
    let set = |o: &Option<Vec<String>>| o.as_ref().is_some_and(|v| !v.is_empty());
    let set_v = |o: &Option<Vec<Value>>| o.as_ref().is_some_and(|v| !v.is_empty());
    let or_expression = if expressions { ", 'expression'" } else { "" };
    match protocols.first() {
        Some("http" | "https" | "ws" | "wss") if !expressions => {
            for (name, v) in [("sources", sources), ("destinations", destinations)] {
                if set_v(v) {
                    f.err(
                        name,
                        format!("cannot set '{name}' when 'protocols' is 'http' or 'https'"),
                    );
                }
            }
        }
        Some(first @ ("grpc" | "grpcs")) => {
            if set(methods) {
                f.err(
                    "methods",
                    "cannot set 'methods' when 'protocols' is 'grpc' or 'grpcs'",
                );
            }
            if !expressions {
                for (name, v) in [("sources", sources), ("destinations", destinations)] {
                    if set_v(v) {
                        f.err(
                            name,
                            format!("cannot set '{name}' when 'protocols' is 'grpc' or 'grpcs'"),
                        );
                    }
                }
            }
            let grpcs = protocols.iter().any(|p| p == "grpcs");
            let any = set(hosts) || has_headers || set(paths) || (grpcs && set(snis));
            if !any && !has_expression {
                let (fields, proto) = if grpcs {
                    ("'hosts', 'headers', 'paths', 'snis'", "grpcs")
                } else {
                    ("'hosts', 'headers', 'paths'", first)
                };
                f.err(
                    "@entity",
                    format!(
                        "must set one of {fields}{or_expression} when 'protocols' is '{proto}'"
                    ),
                );
            }
        }
        Some("tcp" | "tls" | "udp" | "tls_passthrough") => {
            let why = "when 'protocols' is 'tcp', 'tls', 'tls_passthrough' or 'udp'";
            for (name, v) in [("methods", methods), ("hosts", hosts), ("paths", paths)] {
                if set(v) {
                    f.err(name, format!("cannot set '{name}' {why}"));
                }
            }
            if has_headers {
                f.err("headers", format!("cannot set 'headers' {why}"));
            }
            let plain = protocols.iter().any(|p| matches!(p, "tcp" | "tls" | "udp"));
            let passthrough = protocols.iter().any(|p| p == "tls_passthrough");
            if plain && !(set_v(sources) || set_v(destinations) || set(snis) || has_expression) {
                f.err(
                    "@entity",
                    format!(
                        "must set one of 'sources', 'destinations', 'snis'{or_expression} when 'protocols' is 'tcp', 'tls' or 'udp'"
                    ),
                );
            }
            if passthrough && !(set(snis) || has_expression) {
                f.err(
                    "@entity",
                    "must set snis when 'protocols' is 'tls_passthrough'",
                );
            }
        }
        _ => {}
    }
}

/// Kong's `validate_route` (`kong/db/schema/entities/routes.lua`) under the ATC flavors: an
/// expression excludes the traditional fields and a regex priority, a priority needs an
/// expression, and the expression must compile against the schema of the route's first
/// protocol. The message, when there is one, is Kong's.
fn validate_route(
    e: Option<&ExpressionFields>,
    others: bool,
    regex_priority: i64,
    first_protocol: Option<&str>,
) -> Option<String> {
    let expression = e.and_then(|e| e.expression.as_deref());
    let priority = e.map_or(0, |e| e.priority);
    let fields = "'methods', 'hosts', 'paths', 'headers', 'snis', 'sources' or 'destinations'";
    if expression.is_some() && others {
        return Some(format!(
            "{}cannot set 'expression' with {fields} simultaneously",
            atc::FAILED
        ));
    }
    if expression.is_some() && regex_priority != 0 {
        return Some(format!(
            "{}cannot set 'regex_priority' with 'expression' simultaneously",
            atc::FAILED
        ));
    }
    if others && priority != 0 {
        return Some(format!(
            "{}cannot set 'priority' with {fields} simultaneously",
            atc::FAILED
        ));
    }
    let expression = expression?;
    let amended = atc::amend(expression);
    atc::parse(&amended, atc::schema_for(first_protocol))
        .err()
        .map(|e| format!("{}{e}", atc::FAILED))
}
