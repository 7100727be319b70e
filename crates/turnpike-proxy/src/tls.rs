//! TLS: server certificates (SNI → certificate from the `certificates`/`snis` entities, a
//! default certificate otherwise, generated under the prefix when `ssl_cert` is not given, as
//! Kong does) and upstream client configurations.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use rustc_hash::FxHashMap;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::ResolvesServerCert;
use rustls::sign::CertifiedKey;

use turnpike_config::conf::TlsConf;
use turnpike_config::declarative::pem;
use turnpike_plugins::tls_client::NoVerify;

pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Parses a PEM certificate chain and private key into a signing key (checked as the Admin
/// API checks it on write).
pub fn certified_key(cert_pem: &str, key_pem: &str) -> Result<Arc<CertifiedKey>, String> {
    pem::certified_key(cert_pem, key_pem).map_err(|e| e.to_string())
}

fn private_key(pem: &str) -> Result<PrivateKeyDer<'static>, String> {
    pem::private_key(pem).map_err(|e| e.to_string())
}

/// Certificates selected by SNI, compiled with each configuration snapshot.
#[derive(Default)]
pub struct CertStore {
    exact: FxHashMap<String, Arc<CertifiedKey>>,
    /// `*.example.com` stored as `.example.com`.
    suffix: Vec<(String, Arc<CertifiedKey>)>,
    /// `example.*` stored as `example.`.
    prefix: Vec<(String, Arc<CertifiedKey>)>,
}

impl CertStore {
    pub fn build(config: &turnpike_config::Config) -> Result<CertStore, String> {
        let mut problems = Vec::new();
        let store = CertStore::build_skipping(config, &mut problems);
        match problems.into_iter().next() {
            Some(p) => Err(p),
            None => Ok(store),
        }
    }

    /// Like `build`, leaving out the certificates that do not load (their SNIs get the
    /// default certificate), each named in `problems`.
    pub fn build_skipping(
        config: &turnpike_config::Config,
        problems: &mut Vec<String>,
    ) -> CertStore {
        let mut keys: FxHashMap<&str, Arc<CertifiedKey>> = FxHashMap::default();
        for c in &config.certificates {
            // A PEM written as a `{vault://...}` reference is read from its vault here.
            use turnpike_config::declarative::vault;
            let pem = |s| vault::resolved(s, &config.records, &vault::process_env);
            let (cert, key) = match (pem(&c.cert), pem(&c.key)) {
                (Ok(cert), Ok(key)) => (cert, key),
                (Err(e), _) | (_, Err(e)) => {
                    problems.push(format!("certificate {}: {e}", c.id));
                    continue;
                }
            };
            match certified_key(&cert, &key) {
                Ok(k) => {
                    keys.insert(c.id.as_str(), k);
                }
                Err(e) => problems.push(format!("certificate {}: {e}", c.id)),
            }
        }
        let mut store = CertStore::default();
        for sni in &config.snis {
            let Some(k) = keys.get(sni.certificate.id.as_ref()) else {
                continue;
            };
            if let Some(s) = sni.name.strip_prefix('*') {
                store.suffix.push((s.to_string(), k.clone()));
            } else if let Some(p) = sni.name.strip_suffix('*') {
                store.prefix.push((p.to_string(), k.clone()));
            } else {
                store.exact.insert(sni.name.clone(), k.clone());
            }
        }
        // Longest wildcard first, so the most specific one wins.
        store.suffix.sort_by_key(|e| std::cmp::Reverse(e.0.len()));
        store.prefix.sort_by_key(|e| std::cmp::Reverse(e.0.len()));
        store
    }

    pub fn find(&self, name: &str) -> Option<Arc<CertifiedKey>> {
        if let Some(k) = self.exact.get(name) {
            return Some(k.clone());
        }
        if let Some((_, k)) = self
            .suffix
            .iter()
            .find(|(s, _)| name.len() > s.len() && name.ends_with(s.as_str()))
        {
            return Some(k.clone());
        }
        self.prefix
            .iter()
            .find(|(p, _)| name.len() > p.len() && name.starts_with(p.as_str()))
            .map(|(_, k)| k.clone())
    }
}

/// TLS session state shared by the proxy's listeners: the session cache (`ssl_session_cache_size`)
/// and, with `ssl_session_tickets`, the ticket keys (rotated by rustls).
pub struct Sessions {
    cache: Arc<dyn rustls::server::StoresServerSessions>,
    ticketer: Option<Arc<dyn rustls::server::ProducesTickets>>,
}

impl Sessions {
    pub fn new(conf: &TlsConf) -> Sessions {
        Sessions {
            cache: rustls::server::ServerSessionMemoryCache::new(conf.session_cache_entries),
            ticketer: if conf.session_tickets {
                rustls::crypto::ring::Ticketer::new().ok()
            } else {
                None
            },
        }
    }
}

/// The crypto provider with the TLS 1.2 suites `conf` allows, in its order (TLS 1.3's are
/// kept whole).
fn provider_for(conf: &TlsConf) -> rustls::crypto::CryptoProvider {
    let mut p = rustls::crypto::ring::default_provider();
    if let Some(wanted) = &conf.tls12_suites {
        let all = std::mem::take(&mut p.cipher_suites);
        let name = |s: &rustls::SupportedCipherSuite| format!("{:?}", s.suite());
        p.cipher_suites = all
            .iter()
            .filter(|s| s.tls13().is_some())
            .cloned()
            .collect();
        for w in wanted {
            if let Some(s) = all.iter().find(|s| s.tls13().is_none() && name(s) == *w) {
                p.cipher_suites.push(*s);
            }
        }
    }
    p
}

/// A server configuration picking certificates with `certs` (the snapshot's, by SNI), serving
/// the protocols and suites of `conf`.
pub fn server_config(
    certs: Arc<dyn ResolvesServerCert>,
    http2: bool,
    conf: &TlsConf,
    sessions: &Sessions,
) -> Arc<rustls::ServerConfig> {
    let mut versions: Vec<&'static rustls::SupportedProtocolVersion> = Vec::new();
    if conf.tls13 {
        versions.push(&rustls::version::TLS13);
    }
    if conf.tls12 {
        versions.push(&rustls::version::TLS12);
    }
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(provider_for(conf)))
        .with_protocol_versions(&versions)
        .expect("the configuration checks leave at least one version with its suites")
        .with_no_client_auth()
        .with_cert_resolver(certs);
    cfg.alpn_protocols = if http2 {
        vec![b"h2".to_vec(), b"http/1.1".to_vec()]
    } else {
        vec![b"http/1.1".to_vec()]
    };
    cfg.ignore_client_order = conf.prefer_server_ciphers;
    cfg.session_storage = sessions.cache.clone();
    if let Some(t) = &sessions.ticketer {
        cfg.ticketer = t.clone();
    }
    Arc::new(cfg)
}

/// Loads the default certificate: `ssl_cert`/`ssl_cert_key` when given (paths or PEM content),
/// otherwise a self-signed one generated once under `<prefix>/ssl/`.
pub fn default_certificate(
    prefix: &Path,
    cert: Option<&str>,
    key: Option<&str>,
) -> Result<Arc<CertifiedKey>, String> {
    let read = |v: &str| -> Result<String, String> {
        if v.contains("-----BEGIN") {
            Ok(v.to_string())
        } else {
            std::fs::read_to_string(v).map_err(|e| format!("cannot read {v}: {e}"))
        }
    };
    if let (Some(c), Some(k)) = (cert, key) {
        return certified_key(&read(c)?, &read(k)?);
    }
    let dir = prefix.join("ssl");
    let cert_path = dir.join("turnpike-default.crt");
    let key_path = dir.join("turnpike-default.key");
    if cert_path.exists() && key_path.exists() {
        return certified_key(
            &read(cert_path.to_str().unwrap())?,
            &read(key_path.to_str().unwrap())?,
        );
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let key = rcgen::KeyPair::generate().map_err(|e| e.to_string())?;
    let mut params =
        rcgen::CertificateParams::new(vec!["localhost".to_string()]).map_err(|e| e.to_string())?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "localhost");
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "Turnpike");
    let cert = params.self_signed(&key).map_err(|e| e.to_string())?;
    std::fs::write(&cert_path, cert.pem())
        .map_err(|e| format!("cannot write {}: {e}", cert_path.display()))?;
    write_private(&key_path, &key.serialize_pem())?;
    certified_key(&cert.pem(), &key.serialize_pem())
}

fn write_private(path: &Path, content: &str) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    f.write_all(content.as_bytes()).map_err(|e| e.to_string())
}

/// The client configuration shared by every service without verification or client
/// certificate; one instance for the process so pooled connections survive reloads.
pub fn unverified_client_config() -> Arc<rustls::ClientConfig> {
    static CFG: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
    CFG.get_or_init(|| {
        let p = provider();
        let mut c = rustls::ClientConfig::builder_with_provider(p.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerify::new(p)))
            .with_no_client_auth();
        c.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(c)
    })
    .clone()
}

/// A client configuration for a service with `tls_verify`, `ca_certificates` or a
/// `client_certificate`.
pub fn client_config(
    verify: bool,
    ca_pems: &[&str],
    client_cert: Option<(&str, &str)>,
) -> Result<Arc<rustls::ClientConfig>, String> {
    if !verify && client_cert.is_none() {
        return Ok(unverified_client_config());
    }
    let p = provider();
    let builder = rustls::ClientConfig::builder_with_provider(p.clone())
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = if verify {
        let mut roots = rustls::RootCertStore::empty();
        if ca_pems.is_empty() {
            for c in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(c);
            }
        } else {
            for pem in ca_pems {
                for c in rustls_pemfile::certs(&mut pem.as_bytes()) {
                    let c = c.map_err(|e| format!("invalid CA certificate: {e}"))?;
                    roots
                        .add(c)
                        .map_err(|e| format!("invalid CA certificate: {e}"))?;
                }
            }
        }
        builder.with_root_certificates(roots)
    } else {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerify::new(p)))
    };
    let mut cfg = match client_cert {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let certs: Vec<CertificateDer<'static>> = rustls_pemfile::certs(&mut cert.as_bytes())
                .collect::<Result<_, _>>()
                .map_err(|e| format!("invalid client certificate: {e}"))?;
            builder
                .with_client_auth_cert(certs, private_key(key)?)
                .map_err(|e| format!("invalid client certificate: {e}"))?
        }
    };
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// A server connection's TLS as Kong's log serializer shows it: the version as
/// `ngx.ssl.get_tls1_version_str` names it and the cipher by OpenSSL's name (nginx's
/// `$ssl_cipher`), for the suites rustls offers.
pub fn tls_info(state: &rustls::CommonState) -> Option<turnpike_plugins::log::TlsInfo> {
    use rustls::CipherSuite as C;
    let version = match state.protocol_version()? {
        rustls::ProtocolVersion::TLSv1_3 => "TLSv1.3",
        rustls::ProtocolVersion::TLSv1_2 => "TLSv1.2",
        _ => return None,
    };
    let cipher = match state.negotiated_cipher_suite()?.suite() {
        C::TLS13_AES_256_GCM_SHA384 => "TLS_AES_256_GCM_SHA384",
        C::TLS13_AES_128_GCM_SHA256 => "TLS_AES_128_GCM_SHA256",
        C::TLS13_CHACHA20_POLY1305_SHA256 => "TLS_CHACHA20_POLY1305_SHA256",
        C::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384 => "ECDHE-ECDSA-AES256-GCM-SHA384",
        C::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256 => "ECDHE-ECDSA-AES128-GCM-SHA256",
        C::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256 => "ECDHE-ECDSA-CHACHA20-POLY1305",
        C::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384 => "ECDHE-RSA-AES256-GCM-SHA384",
        C::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 => "ECDHE-RSA-AES128-GCM-SHA256",
        C::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256 => "ECDHE-RSA-CHACHA20-POLY1305",
        _ => "UNKNOWN",
    };
    Some(turnpike_plugins::log::TlsInfo {
        version,
        cipher,
        client_verify: "NONE",
    })
}
