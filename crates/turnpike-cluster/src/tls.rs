//! The cluster's mutual TLS, as Kong sets it up (`kong/clustering/tls.lua`, the
//! `kong_cluster_listener` template):
//! - `shared`: both sides hold the same certificate. The control plane asks for a client
//!   certificate without checking it against a CA and then requires its SHA-256 digest to be
//!   its own certificate's; the data plane trusts that one certificate and asks for the name
//!   `kong_clustering`.
//! - `pki`: the control plane verifies the data plane's chain against `cluster_ca_cert`; the
//!   data plane verifies the control plane's against it too, for `cluster_server_name` (or the
//!   control plane's host).

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};
use sha2::{Digest, Sha256};
use turnpike_config::conf::{ClusterConf, ClusterMtls};
use turnpike_config::declarative::pem;

/// The name a data plane asks for in shared mode.
pub const SHARED_SERVER_NAME: &str = "kong_clustering";

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The node's cluster certificate chain and key, read as X.509 rather than by a chain
/// verifier: a version 1 certificate (as older tools make) is taken too.
pub struct Identity {
    pub chain: Vec<CertificateDer<'static>>,
    certified: Arc<rustls::sign::CertifiedKey>,
}

impl Identity {
    pub fn from_conf(conf: &ClusterConf) -> Result<Identity, String> {
        let chain = pem::certificates(&conf.cert).map_err(|e| format!("cluster_cert: {e}"))?;
        pem::private_key(&conf.cert_key).map_err(|e| format!("cluster_cert_key: {e}"))?;
        let certified = pem::certified_key(&conf.cert, &conf.cert_key)
            .map_err(|e| format!("cluster_cert_key: {e}"))?;
        Ok(Identity { chain, certified })
    }

    /// The SHA-256 digest of the leaf certificate (what shared mode compares).
    pub fn digest(&self) -> [u8; 32] {
        digest(&self.chain[0])
    }
}

/// The server side's one certificate.
#[derive(Debug)]
struct Always(Arc<rustls::sign::CertifiedKey>);

impl rustls::server::ResolvesServerCert for Always {
    fn resolve(
        &self,
        _hello: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        Some(self.0.clone())
    }
}

pub fn digest(cert: &CertificateDer<'_>) -> [u8; 32] {
    Sha256::digest(cert.as_ref()).into()
}

fn roots(ca_pem: &str) -> Result<rustls::RootCertStore, String> {
    let mut roots = rustls::RootCertStore::empty();
    for c in pem::certificates(ca_pem).map_err(|e| format!("cluster_ca_cert: {e}"))? {
        roots
            .add(c)
            .map_err(|e| format!("cluster_ca_cert: not a usable CA certificate ({e})"))?;
    }
    Ok(roots)
}

/// The control plane's TLS: its certificate, and the client certificate asked for as the mode
/// says. In shared mode the digest is compared after the handshake ([`Identity::digest`]).
pub fn server_config(conf: &ClusterConf) -> Result<Arc<rustls::ServerConfig>, String> {
    let id = Identity::from_conf(conf)?;
    let provider = provider();
    let verifier: Arc<dyn ClientCertVerifier> = match conf.mtls {
        ClusterMtls::Shared => Arc::new(AnyClientCert(provider.clone())),
        ClusterMtls::Pki => {
            let ca = conf
                .ca_cert
                .as_deref()
                .ok_or("cluster_ca_cert is not set")?;
            rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots(ca)?),
                provider.clone(),
            )
            .build()
            .map_err(|e| format!("cluster_ca_cert: {e}"))?
        }
    };
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(Arc::new(Always(id.certified)));
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// The data plane's TLS to its control plane, and the name it asks for.
pub fn client_config(
    conf: &ClusterConf,
) -> Result<(Arc<rustls::ClientConfig>, ServerName<'static>), String> {
    let id = Identity::from_conf(conf)?;
    let provider = provider();
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let (builder, name) = match conf.mtls {
        ClusterMtls::Shared => (
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(SameCert {
                    cert: id.chain[0].clone(),
                    provider,
                })),
            SHARED_SERVER_NAME.to_string(),
        ),
        ClusterMtls::Pki => {
            let ca = conf
                .ca_cert
                .as_deref()
                .ok_or("cluster_ca_cert is not set")?;
            let name = conf
                .server_name
                .clone()
                .unwrap_or_else(|| host_of(&conf.control_plane).to_string());
            (builder.with_root_certificates(roots(ca)?), name)
        }
    };
    let cfg = builder
        .with_client_cert_resolver(Arc::new(rustls::sign::SingleCertAndKey::from(id.certified)));
    let name =
        ServerName::try_from(name.clone()).map_err(|_| format!("'{name}' is not a server name"))?;
    Ok((Arc::new(cfg), name))
}

/// The host of `host:port` (`[v6]:port` too).
pub fn host_of(addr: &str) -> &str {
    if let Some(rest) = addr.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    addr.rsplit_once(':').map_or(addr, |(h, _)| h)
}

/// A certificate's SubjectPublicKeyInfo, read as X.509 (any version).
fn leaf_spki(
    cert: &CertificateDer<'_>,
) -> Result<rustls::pki_types::SubjectPublicKeyInfoDer<'static>, rustls::Error> {
    let (_, c) = x509_parser::parse_x509_certificate(cert.as_ref())
        .map_err(|_| rustls::Error::InvalidCertificate(rustls::CertificateError::BadEncoding))?;
    Ok(rustls::pki_types::SubjectPublicKeyInfoDer::from(
        c.tbs_certificate.subject_pki.raw.to_vec(),
    ))
}

/// A certificate's notAfter, in seconds since the epoch.
pub fn expiry(cert: &CertificateDer<'_>) -> Option<i64> {
    let (_, c) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    Some(c.validity().not_after.timestamp())
}

/// The handshake's signature checks with the provider's algorithms, the same for both
/// verifiers below (they differ in which certificates they take, not in how a signature is
/// checked).
macro_rules! signature_checks {
    ($provider:tt) => {
        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            verify_tls12_signature(
                message,
                cert,
                dss,
                &self.$provider.signature_verification_algorithms,
            )
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            // The peer's key read from its certificate as X.509 (webpki refuses version 1).
            let spki = leaf_spki(cert)?;
            rustls::crypto::verify_tls13_signature_with_raw_key(
                message,
                &spki,
                dss,
                &self.$provider.signature_verification_algorithms,
            )
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.$provider
                .signature_verification_algorithms
                .supported_schemes()
        }
    };
}

/// Shared mode's client side: the control plane must present the very certificate this node
/// holds.
#[derive(Debug)]
struct SameCert {
    cert: CertificateDer<'static>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for SameCert {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if end_entity.as_ref() == self.cert.as_ref() {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    signature_checks!(provider);
}

/// Shared mode's server side (nginx's `ssl_verify_client optional_no_ca`): any client
/// certificate is taken by the handshake (its signature still checked); the control plane
/// compares it with its own afterwards.
#[derive(Debug)]
struct AnyClientCert(Arc<CryptoProvider>);

impl ClientCertVerifier for AnyClientCert {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    signature_checks!(0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_of_addresses() {
        assert_eq!(host_of("cp.example.com:8005"), "cp.example.com");
        assert_eq!(host_of("[::1]:8005"), "::1");
        assert_eq!(host_of("cp"), "cp");
    }
}
