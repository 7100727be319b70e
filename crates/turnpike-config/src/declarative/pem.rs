//! Certificates and keys as the data plane loads them, checked when they are written: an
//! entity the data plane would refuse gets Kong's schema violation at the Admin API (or in a
//! declarative file) instead of being stored and failing later.

use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;

/// Why a certificate and key pair does not load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PemError {
    Cert(String),
    Key(String),
    Mismatch,
}

impl std::fmt::Display for PemError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PemError::Cert(e) | PemError::Key(e) => f.write_str(e),
            PemError::Mismatch => f.write_str("certificate does not match key"),
        }
    }
}

/// A PEM certificate chain.
pub fn certificates(pem: &str) -> Result<Vec<CertificateDer<'static>>, PemError> {
    let certs: Vec<CertificateDer<'static>> = rustls_pemfile::certs(&mut pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| PemError::Cert(format!("invalid certificate: {e}")))?;
    if certs.is_empty() {
        return Err(PemError::Cert(
            "invalid certificate: no certificate found in PEM".into(),
        ));
    }
    Ok(certs)
}

/// A PEM private key.
pub fn private_key(pem: &str) -> Result<PrivateKeyDer<'static>, PemError> {
    rustls_pemfile::private_key(&mut pem.as_bytes())
        .map_err(|e| PemError::Key(format!("invalid key: {e}")))?
        .ok_or_else(|| PemError::Key("invalid key: no private key found in PEM".into()))
}

/// Parses a PEM certificate chain and private key into a signing key, checking that the
/// leaf certificate parses as the TLS stack reads it (X.509 v3) and matches the key.
pub fn certified_key(cert_pem: &str, key_pem: &str) -> Result<Arc<CertifiedKey>, PemError> {
    let certs = certificates(cert_pem)?;
    let key = private_key(key_pem)?;
    let signing = rustls::crypto::ring::sign::any_supported_type(&key)
        .map_err(|e| PemError::Key(format!("invalid key: {e}")))?;
    let ck = CertifiedKey::new(certs, signing);
    match ck.keys_match() {
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {}
        Err(rustls::Error::InconsistentKeys(_)) => return Err(PemError::Mismatch),
        Err(e) => return Err(PemError::Cert(format!("invalid certificate: {e}"))),
    }
    Ok(Arc::new(ck))
}

/// A CA certificate as an upstream TLS client's trust anchor: it must parse as one.
pub fn ca_certificate(pem: &str) -> Result<(), PemError> {
    let mut roots = rustls::RootCertStore::empty();
    for c in certificates(pem)? {
        roots
            .add(c)
            .map_err(|e| PemError::Cert(format!("invalid certificate: {e}")))?;
    }
    Ok(())
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
}
