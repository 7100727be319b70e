//! An upstream (its balancer and health checks) and its targets.

use serde_json::{Map, Value};

use super::super::fields::{check_host, split_host_port, Fields, REQUIRED};
use super::*;

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
        super::super::healthchecks::FIELDS,
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
        client_certificate: client_certificate.map(ForeignKey::new),
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
            upstream: ForeignKey::new(String::new()),
            target,
            weight,
            tags,
        },
        upstream,
        errors,
    )
}
