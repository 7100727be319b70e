//! A service: its URL or its parts, timeouts, TLS to the upstream.

use serde_json::{Map, Value};

use super::super::fields::{check_host, split_host_port, Fields, REQUIRED};
use super::*;

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
    // Kong 3.9: only https and tls services take TLS settings (a grpcs upstream is not
    // verified and presents no per-service certificate).
    if !matches!(protocol.as_str(), "https" | "tls" | "wss") {
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
        id: id.into(),
        created_at,
        updated_at,
        name,
        retries,
        protocol: SERVICE_PROTOCOLS
            .iter()
            .find(|p| **p == protocol)
            .copied()
            .unwrap_or("http"),
        host: host.unwrap_or_default().into(),
        port: port.unwrap_or(80) as u16,
        path: path.map(Into::into),
        connect_timeout,
        write_timeout,
        read_timeout,
        tags: tags.map(Shared::from),
        client_certificate: client_certificate.map(ForeignKey::new),
        tls_verify,
        tls_verify_depth,
        ca_certificates: ca_certificates.map(List::from),
        enabled,
    };
    (svc, errors)
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
