//! Certificates, SNIs and CA certificates, checked as the TLS stack will load them.

use serde_json::{Map, Value};

use super::super::fields::{check_host, Fields};
use super::*;

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
                match super::super::pem::certified_key(c, k) {
                    Ok(_) => {}
                    Err(e @ super::super::pem::PemError::Cert(_)) => f.err(cf, e.to_string()),
                    Err(e @ super::super::pem::PemError::Key(_)) => f.err(kf, e.to_string()),
                    Err(
                        e @ (super::super::pem::PemError::Mismatch
                        | super::super::pem::PemError::Ca(_)),
                    ) => f.err("@entity", e.to_string()),
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
            certificate: ForeignKey::new(String::new()),
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
        match super::super::pem::ca_certificate(c) {
            Ok(()) => {}
            Err(e @ super::super::pem::PemError::Ca(_)) => f.err("@entity", e.to_string()),
            Err(e) => f.err("cert", e.to_string()),
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
