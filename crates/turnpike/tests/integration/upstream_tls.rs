//! Upstream TLS (service protocol https): verification off by default as in Kong, on with
//! `tls_verify` against `ca_certificates`, client certificates; and retries across targets.

use std::sync::Arc;

use crate::common::*;
use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;

/// A TLS upstream with a certificate for `name` signed by its own CA; answers with the CN of the
/// client certificate it was shown, if any.
struct TlsUpstream {
    addr: std::net::SocketAddr,
    ca_pem: String,
    rt: Option<tokio::runtime::Runtime>,
}

impl Drop for TlsUpstream {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

fn start_tls_upstream(name: &str, client_ca: Option<&str>) -> TlsUpstream {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "test CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec![name.to_string()]).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let cert = params.signed_by(&key, &ca, &ca_key).unwrap();

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(pem) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in pem_certs(pem) {
                roots.add(c).unwrap();
            }
            let v = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                Arc::new(rustls::crypto::ring::default_provider()),
            )
            .build()
            .unwrap();
            builder.with_client_cert_verifier(v)
        }
    };
    let cfg = builder
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    std_listener.set_nonblocking(true).unwrap();
    let addr = std_listener.local_addr().unwrap();
    rt.spawn(async move {
        let listener = tokio::net::TcpListener::from_std(std_listener).unwrap();
        loop {
            let Ok((s, _)) = listener.accept().await else {
                continue;
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(s).await else {
                    return;
                };
                let client_cn = tls
                    .get_ref()
                    .1
                    .peer_certificates()
                    .map(|c| String::from_utf8_lossy(&c[0]).contains("gateway-client"))
                    .unwrap_or(false);
                let svc = service_fn(move |_req| async move {
                    Ok::<_, hyper::Error>(hyper::Response::new(Full::new(Bytes::from(
                        if client_cn {
                            "tls ok, client cert"
                        } else {
                            "tls ok"
                        },
                    ))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    TlsUpstream {
        addr,
        ca_pem: ca.pem(),
        rt: Some(rt),
    }
}

fn y(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn https_services_verify_only_when_asked() {
    let up = start_tls_upstream("localhost", None);
    // A CA of its own (Kong takes only certificates with the CA basic constraint as
    // ca_certificates), which did not sign the upstream's certificate.
    let other_ca = {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        p.distinguished_name
            .push(rcgen::DnType::CommonName, "unrelated CA");
        p.self_signed(&key).unwrap().pem()
    };
    let yaml = format!(
        r#"_format_version: "3.0"
ca_certificates:
  - id: 5d1b3a3e-0000-4000-8000-000000000001
    cert: {good}
  - id: 5d1b3a3e-0000-4000-8000-000000000002
    cert: {bad}
services:
  - name: no-verify
    url: https://localhost:{port}
    routes: [{{paths: [/plain]}}]
  - name: verified
    url: https://localhost:{port}
    tls_verify: true
    ca_certificates: [5d1b3a3e-0000-4000-8000-000000000001]
    routes: [{{paths: [/verified]}}]
  - name: wrong-ca
    url: https://localhost:{port}
    tls_verify: true
    ca_certificates: [5d1b3a3e-0000-4000-8000-000000000002]
    retries: 0
    routes: [{{paths: [/wrong-ca]}}]
"#,
        good = y(&up.ca_pem),
        bad = y(&other_ca),
        port = up.addr.port()
    );
    let gw = Gateway::with_config(&yaml).start();
    let r = get(gw.proxy, "localhost", "/plain").await;
    assert_eq!(
        (r.status, &r.body[..]),
        (200, &b"tls ok"[..]),
        "Kong's default: no verification"
    );
    let r = get(gw.proxy, "localhost", "/verified").await;
    assert_eq!((r.status, &r.body[..]), (200, &b"tls ok"[..]));
    let r = get(gw.proxy, "localhost", "/wrong-ca").await;
    assert_eq!(
        r.status, 502,
        "a certificate the CA did not sign is refused"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn client_certificate_is_presented_to_the_upstream() {
    // The gateway's client certificate, self-signed: the upstream trusts it directly.
    let (client_cert, client_key) = cert_for("gateway-client");
    let up = start_tls_upstream("localhost", Some(&client_cert));
    let yaml = format!(
        r#"_format_version: "3.0"
certificates:
  - id: 7c0c3a3e-0000-4000-8000-000000000001
    cert: {cert}
    key: {key}
services:
  - name: mtls
    url: https://localhost:{port}
    client_certificate: 7c0c3a3e-0000-4000-8000-000000000001
    routes: [{{paths: [/]}}]
  - name: no-client-cert
    url: https://localhost:{port}
    retries: 0
    routes: [{{paths: [/anon]}}]
"#,
        cert = y(&client_cert),
        key = y(&client_key),
        port = up.addr.port()
    );
    let gw = Gateway::with_config(&yaml).start();
    let r = get(gw.proxy, "localhost", "/").await;
    assert_eq!((r.status, &r.body[..]), (200, &b"tls ok, client cert"[..]));
    assert_eq!(get(gw.proxy, "localhost", "/anon").await.status, 502);
}

#[tokio::test(flavor = "multi_thread")]
async fn connection_failures_are_retried_on_another_target() {
    let up = Upstream::start("alive");
    let (_dead_socket, dead) = dead_port();
    let yaml = format!(
        "_format_version: '3.0'\nupstreams: [{{name: pair, targets: [{{target: '127.0.0.1:{dead}'}}, {{target: '{}'}}]}}]\nservices: [{{name: s, host: pair, retries: 1, routes: [{{paths: [/]}}]}}]\n",
        up.addr
    );
    let gw = Gateway::with_config(&yaml).start();
    // Every request succeeds: when round-robin picks the dead target, the retry goes to the
    // live one. The dead one is refused before any byte of the request is sent.
    for _ in 0..10 {
        let r = send(
            gw.proxy,
            req("POST", "/")
                .body(Full::new(Bytes::from("payload")))
                .unwrap(),
        )
        .await;
        assert_eq!(r.status, 200);
        assert_eq!(r.json()["body_len"], 7);
    }
}
