//! Certificates and keys as the data plane loads them, checked when they are written: an
//! entity the data plane would refuse gets Kong's schema violation at the Admin API (or in a
//! declarative file) instead of being stored and failing later.

use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use x509_parser::prelude::{FromDer, X509Certificate};

/// Why a certificate and key pair does not load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PemError {
    Cert(String),
    Key(String),
    Mismatch,
    /// What makes a certificate unfit as a CA (an entity-level error, as Kong reports it).
    Ca(String),
}

impl std::fmt::Display for PemError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PemError::Cert(e) | PemError::Key(e) | PemError::Ca(e) => f.write_str(e),
            PemError::Mismatch => f.write_str("certificate does not match key"),
        }
    }
}

/// A PEM certificate chain, every certificate parsed as X.509 (v1, v2 or v3: Kong reads
/// them with OpenSSL, which takes them all; a chain verifier's v3-only parse is not the test).
pub fn certificates(pem: &str) -> Result<Vec<CertificateDer<'static>>, PemError> {
    let certs: Vec<CertificateDer<'static>> = rustls_pemfile::certs(&mut pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| PemError::Cert(format!("invalid certificate: {e}")))?;
    if certs.is_empty() {
        return Err(PemError::Cert(
            "invalid certificate: no certificate found in PEM".into(),
        ));
    }
    for c in &certs {
        parse(c)?;
    }
    Ok(certs)
}

/// One certificate's X.509 structure.
fn parse<'a>(der: &'a CertificateDer<'_>) -> Result<X509Certificate<'a>, PemError> {
    match X509Certificate::from_der(der) {
        Ok(([], cert)) => Ok(cert),
        Ok(_) => Err(PemError::Cert(
            "invalid certificate: trailing data after the certificate".into(),
        )),
        // The parser's own error text names ASN.1 tags; the operator needs to know the PEM's
        // content is not a certificate.
        Err(_) => Err(PemError::Cert(
            "invalid certificate: not a well-formed X.509 certificate".into(),
        )),
    }
}

/// A PEM private key.
pub fn private_key(pem: &str) -> Result<PrivateKeyDer<'static>, PemError> {
    rustls_pemfile::private_key(&mut pem.as_bytes())
        .map_err(|e| PemError::Key(format!("invalid key: {e}")))?
        .ok_or_else(|| PemError::Key("invalid key: no private key found in PEM".into()))
}

/// Parses a PEM certificate chain and private key into a signing key, checking that every
/// certificate parses as X.509 and that the leaf's public key is the key's.
pub fn certified_key(cert_pem: &str, key_pem: &str) -> Result<Arc<CertifiedKey>, PemError> {
    let certs = certificates(cert_pem)?;
    let key = private_key(key_pem)?;
    let signing = rustls::crypto::ring::sign::any_supported_type(&key)
        .map_err(|_| PemError::Key("invalid key: unsupported key type".into()))?;
    // The leaf's SubjectPublicKeyInfo against the key's (rustls' own `keys_match` parses the
    // leaf with webpki, which refuses X.509 v1).
    if let Some(spki) = signing.public_key() {
        let leaf = parse(&certs[0])?;
        if leaf.tbs_certificate.subject_pki.raw != spki.as_ref() {
            return Err(PemError::Mismatch);
        }
    }
    Ok(Arc::new(CertifiedKey::new(certs, signing)))
}

/// A CA certificate (Kong's `ca_certificates` entity check): one certificate, not expired,
/// with the CA basic constraint. The error is the entity's (`@entity`), as Kong reports it.
pub fn ca_certificate(pem: &str) -> Result<(), PemError> {
    let certs = certificates(pem)?;
    if certs.len() > 1 {
        return Err(PemError::Ca(
            "please submit only one certificate at a time".into(),
        ));
    }
    let cert = parse(&certs[0])?;
    if cert.validity().not_after.timestamp() < now() {
        return Err(PemError::Ca(
            "certificate expired, \"Not After\" time is in the past".into(),
        ));
    }
    let is_ca = matches!(cert.basic_constraints(), Ok(Some(bc)) if bc.value.ca);
    if !is_ca {
        return Err(PemError::Ca(
            "certificate does not appear to be a CA because it is missing the \"CA\" basic constraint".into(),
        ));
    }
    Ok(())
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts() {
        let a = rcgen::KeyPair::generate().unwrap();
        let b = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["a.example".into()])
            .unwrap()
            .self_signed(&a)
            .unwrap()
            .pem();
        assert!(certified_key(&cert, &a.serialize_pem()).is_ok());
        assert_eq!(
            certified_key(&cert, &b.serialize_pem()).err(),
            Some(PemError::Mismatch)
        );
        assert!(matches!(
            certified_key(
                "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
                &a.serialize_pem()
            ),
            Err(PemError::Cert(_))
        ));
        assert!(matches!(
            certified_key(
                &cert,
                "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"
            ),
            Err(PemError::Key(_))
        ));
    }

    const V1_CERT: &str = include_str!("../../testdata/x509-v1-cert.pem");
    const V1_KEY: &str = include_str!("../../testdata/x509-v1-key.pem");

    #[test]
    fn x509_v1_certificates_load_and_keep_clear_errors() {
        let ck = certified_key(V1_CERT, V1_KEY).expect("a v1 certificate loads");
        assert_eq!(ck.cert.len(), 1);
        let other = rcgen::KeyPair::generate().unwrap();
        assert_eq!(
            certified_key(V1_CERT, &other.serialize_pem()).err(),
            Some(PemError::Mismatch)
        );
        // Garbage inside a PEM: Kong's message shape, no Rust debug text.
        let e = certified_key(
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
            V1_KEY,
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("invalid certificate: "), "{e}");
        assert_eq!(
            e,
            "invalid certificate: not a well-formed X.509 certificate"
        );
        // Not a CA: Kong's entity message.
        assert_eq!(
            ca_certificate(V1_CERT).unwrap_err().to_string(),
            "certificate does not appear to be a CA because it is missing the \"CA\" basic constraint"
        );
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = p.self_signed(&key).unwrap().pem();
        assert_eq!(ca_certificate(&ca), Ok(()));
        assert_eq!(
            ca_certificate(&format!("{ca}{ca}"))
                .unwrap_err()
                .to_string(),
            "please submit only one certificate at a time"
        );
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.not_before = rcgen::date_time_ymd(2000, 1, 1);
        p.not_after = rcgen::date_time_ymd(2001, 1, 1);
        let old = p.self_signed(&key).unwrap().pem();
        assert_eq!(
            ca_certificate(&old).unwrap_err().to_string(),
            "certificate expired, \"Not After\" time is in the past"
        );
    }
}
