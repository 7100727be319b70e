//! Response compression on the real binary, turned on as Kong users do it
//! (`nginx_proxy_gzip = on` and friends, here as KONG_* environment variables): what nginx's
//! gzip filter compresses and what it leaves alone, driven by curl as a user would and by a
//! raw HTTP/1.1 client for the HTTP/1.0 and streaming cases.

use std::io::Read;
use std::process::Command;

use crate::common::*;

fn gunzip(b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(b)
        .read_to_end(&mut out)
        .unwrap();
    out
}

/// `curl` with these arguments against the proxy: (head, body).
fn curl(args: &[&str]) -> (String, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let head = dir.path().join("head");
    let out = Command::new("curl")
        .args(["-s", "-D"])
        .arg(&head)
        .args(args)
        .output()
        .unwrap();
    (
        std::fs::read_to_string(&head)
            .unwrap_or_default()
            .to_ascii_lowercase(),
        out.stdout,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_are_compressed_as_nginx_compresses_them() {
    let up = Upstream::start("gz");
    let gw = Gateway::with_config(&format!(
        "_format_version: \"3.0\"\nservices:\n- name: s\n  url: {}\n  routes:\n  - paths: [/]\n",
        up.url()
    ))
    .env("KONG_NGINX_PROXY_GZIP", "on")
    .env("KONG_NGINX_PROXY_GZIP_TYPES", "application/json")
    .env("KONG_NGINX_PROXY_GZIP_VARY", "on")
    .env("KONG_NGINX_PROXY_GZIP_MIN_LENGTH", "100")
    .start();
    let url = |p: &str| format!("http://{}{p}", gw.proxy);

    // curl --compressed: gzip, no Content-Length, Vary, the JSON intact after decoding.
    let (head, body) = curl(&[
        "--compressed",
        "-H",
        "x-pad: 0123456789012345678901234567890123456789",
        &url("/echo"),
    ]);
    assert!(head.contains("content-encoding: gzip"), "{head}");
    assert!(head.contains("vary: accept-encoding"), "{head}");
    assert!(!head.contains("content-length"), "{head}");
    let seen: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(seen["uri"], "/echo");
    // Without --compressed curl asks for no encoding: identity, Vary all the same (nginx).
    let (head, body) = curl(&[
        "-H",
        "x-pad: 0123456789012345678901234567890123456789",
        &url("/echo"),
    ]);
    assert!(!head.contains("content-encoding"), "{head}");
    assert!(head.contains("vary: accept-encoding"), "{head}");
    assert!(serde_json::from_slice::<serde_json::Value>(&body).is_ok());
    // HTTP/1.0 (gzip_http_version 1.1): identity.
    let (head, _) = curl(&["--http1.0", "-H", "accept-encoding: gzip", &url("/echo")]);
    assert!(!head.contains("content-encoding"), "{head}");
    // Through a proxy (Via) with gzip_proxied off: identity.
    let (head, _) = curl(&[
        "-H",
        "accept-encoding: gzip",
        "-H",
        "via: 1.1 cdn",
        &url("/echo"),
    ]);
    assert!(!head.contains("content-encoding"), "{head}");
    // q=0 refuses gzip; HEAD gets no body to compress.
    let (head, _) = curl(&["-H", "accept-encoding: gzip;q=0", &url("/echo")]);
    assert!(!head.contains("content-encoding"), "{head}");
    let (head, _) = curl(&["-I", "-H", "accept-encoding: gzip", &url("/echo")]);
    assert!(!head.contains("content-encoding"), "{head}");
    // A type not listed (the streamed bytes have none) and a 500 stay as they are.
    let (head, body) = curl(&["--compressed", &url("/bytes/5000")]);
    assert!(
        !head.contains("content-encoding") && body.len() == 5000,
        "{head}"
    );
    let (head, _) = curl(&["--compressed", &url("/status/500")]);
    assert!(!head.contains("content-encoding"), "{head}");
    drop(gw);

    // Any type (`*`), a streamed 1 MB body: compressed as it streams, whole once decoded.
    let gw = Gateway::with_config(&format!(
        "_format_version: \"3.0\"\nservices:\n- name: s\n  url: {}\n  routes:\n  - paths: [/]\n",
        up.url()
    ))
    .env("KONG_NGINX_HTTP_GZIP", "on")
    .env("KONG_NGINX_HTTP_GZIP_TYPES", "*")
    .env("KONG_NGINX_PROXY_GZIP_COMP_LEVEL", "6")
    .start();
    let (head, body) = curl(&[
        "-H",
        "accept-encoding: gzip",
        &format!("http://{}/bytes/1048576", gw.proxy),
    ]);
    assert!(head.contains("content-encoding: gzip"), "{head}");
    assert!(head.contains("transfer-encoding: chunked"), "{head}");
    assert!(body.len() < 64 * 1024, "compressed: {} bytes", body.len());
    let plain = gunzip(&body);
    assert_eq!(plain.len(), 1 << 20);
    assert!(plain.iter().all(|b| *b == b'x'));
    // HTTP/2 (prior knowledge over cleartext is not served; TLS with ALPN is).
    let (head, body) = curl(&[
        "-k",
        "--http2",
        "--compressed",
        &format!("https://localhost:{}/echo", gw.proxy_tls.port()),
    ]);
    assert!(head.starts_with("http/2 200"), "{head}");
    assert!(head.contains("content-encoding: gzip"), "{head}");
    assert!(serde_json::from_slice::<serde_json::Value>(&body).is_ok());
}

#[tokio::test]
async fn bad_compression_properties_stop_the_start() {
    let (ok, out) = run(
        &["config", "parse", "/dev/null"],
        &[("KONG_NGINX_PROXY_GZIP", "yes")],
    );
    assert!(!ok && out.contains("nginx_proxy_gzip"), "{out}");
    let (ok, out) = run(
        &["config", "parse", "/dev/null"],
        &[
            ("KONG_NGINX_PROXY_GZIP", "on"),
            ("KONG_NGINX_PROXY_GZIP_PROXIED", "sometimes"),
        ],
    );
    assert!(!ok && out.contains("nginx_proxy_gzip_proxied"), "{out}");
}
