//! TLS with SNI certificates, HTTP/2, WebSocket, streamed bodies and upstream keepalive reuse.

mod common;
use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full, StreamBody};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn sni_config(up: &Upstream) -> String {
    let (ca, ka) = cert_for("a.test");
    let (cb, kb) = cert_for("b.test");
    let y = |s: &str| serde_json::to_string(s).unwrap();
    format!(
        "_format_version: '3.0'\nservices: [{{name: s, url: '{}', routes: [{{paths: [/]}}]}}]\ncertificates:\n- cert: {}\n  key: {}\n  snis: [a.test]\n- cert: {}\n  key: {}\n  snis: ['*.b.test']\n",
        up.url(),
        y(&ca),
        y(&ka),
        y(&cb),
        y(&kb)
    )
}

fn common_name(der: &[u8]) -> String {
    // The CN is the only printable run after the CN OID (2.5.4.3) in these certificates.
    let oid = [0x55, 0x04, 0x03];
    let i = der.windows(3).position(|w| w == oid).expect("CN oid");
    let len = der[i + 4] as usize;
    String::from_utf8_lossy(&der[i + 5..i + 5 + len]).to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn tls_certificate_is_chosen_by_sni() {
    let up = Upstream::start("one");
    let gw = Gateway::with_config(&sni_config(&up)).start();
    let (r, cert, _) = get_tls(gw.proxy_tls, "a.test", "/x", false).await;
    assert_eq!(r.status, 200);
    assert_eq!(common_name(&cert), "a.test");
    let (_, cert, _) = get_tls(gw.proxy_tls, "deep.b.test", "/x", false).await;
    assert_eq!(common_name(&cert), "b.test");
    // Unknown name: the default certificate, self-signed under the prefix as Kong does.
    let (_, cert, _) = get_tls(gw.proxy_tls, "other.test", "/x", false).await;
    assert_eq!(common_name(&cert), "localhost");
    assert!(gw
        .dir
        .path()
        .join("prefix/ssl/turnpike-default.crt")
        .exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn http2_over_tls_alpn_and_h2c_prior_knowledge() {
    let up = Upstream::start("one");
    let gw = Gateway::with_config(&format!(
        "_format_version: '3.0'\nservices: [{{name: s, url: '{}', routes: [{{paths: [/]}}]}}]\n",
        up.url()
    ))
    .start_h2();
    let (r, _, alpn) = get_tls(gw.proxy_tls, "localhost", "/over-h2", true).await;
    assert_eq!(alpn.as_deref(), Some(&b"h2"[..]));
    assert_eq!(r.status, 200);
    let j = r.json();
    assert_eq!(j["uri"], "/over-h2");
    assert_eq!(j["headers"]["x-forwarded-host"], "localhost");
    // h2c with prior knowledge on a plain listener that has the http2 flag.
    let stream = tokio::net::TcpStream::connect(gw.proxy).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let resp = sender
        .send_request(
            http::Request::get("http://localhost/h2c")
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.version(), http::Version::HTTP_2);
    assert_eq!(collect(resp).await.json()["uri"], "/h2c");
    // The same listener still speaks HTTP/1.1.
    assert_eq!(get(gw.proxy, "localhost", "/h1").await.json()["uri"], "/h1");
}

#[tokio::test(flavor = "multi_thread")]
async fn websocket_upgrade_is_spliced() {
    let up = Upstream::start("one");
    let gw = Gateway::with_config(&format!(
        "_format_version: '3.0'\nservices: [{{name: s, url: '{}', routes: [{{paths: [/ws], strip_path: false}}]}}]\n",
        up.url()
    ))
    .start();
    let mut s = tokio::net::TcpStream::connect(gw.proxy).await.unwrap();
    s.write_all(
        b"GET /ws HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
    )
    .await
    .unwrap();
    let mut buf = vec![0u8; 4096];
    let mut head = Vec::new();
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut buf).await.unwrap();
        assert!(
            n > 0,
            "connection closed during upgrade: {:?}",
            String::from_utf8_lossy(&head)
        );
        head.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
    assert!(text.starts_with("http/1.1 101"), "{text}");
    assert!(text.contains("upgrade: websocket"), "{text}");
    // After the upgrade the bytes flow both ways through the gateway.
    for msg in [&b"hello"[..], &b"second frame"[..]] {
        s.write_all(msg).await.unwrap();
        let mut got = vec![0u8; msg.len()];
        s.read_exact(&mut got).await.unwrap();
        assert_eq!(got, msg);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn large_and_chunked_bodies_stream_both_ways() {
    let up = Upstream::start("one");
    let gw = Gateway::with_config(&format!(
        "_format_version: '3.0'\nservices: [{{name: s, url: '{}', routes: [{{paths: [/], strip_path: false}}]}}]\n",
        up.url()
    ))
    .start();
    // A 32 MiB chunked upload (no content-length) in 64 KiB chunks.
    let chunk = Bytes::from(vec![7u8; 64 * 1024]);
    let chunks: Vec<Result<hyper::body::Frame<Bytes>, std::convert::Infallible>> = (0..512)
        .map(|_| Ok(hyper::body::Frame::data(chunk.clone())))
        .collect();
    let body = StreamBody::new(futures_util::stream::iter(chunks));
    let r = send(gw.proxy, req("POST", "/upload").body(body).unwrap()).await;
    assert_eq!(r.status, 200);
    let j = r.json();
    assert_eq!(j["body_len"], 32 * 1024 * 1024);
    assert_eq!(j["headers"]["transfer-encoding"], "chunked");
    // A 64 MiB download, streamed from the upstream.
    let (mut sender, _conn) = h1_client(gw.proxy).await;
    let resp = sender
        .send_request(
            req("GET", "/bytes/67108864")
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let mut total = 0usize;
    while let Some(f) = body.frame().await {
        if let Ok(d) = f.unwrap().into_data() {
            total += d.len();
        }
    }
    assert_eq!(total, 64 * 1024 * 1024);
}

#[tokio::test(flavor = "multi_thread")]
async fn upstream_connections_are_reused() {
    let up = Upstream::start("one");
    let yaml = format!(
        "_format_version: '3.0'\nservices: [{{name: s, url: '{}', routes: [{{paths: [/]}}]}}]\n",
        up.url()
    );
    let gw = Gateway::with_config(&yaml).start();
    for _ in 0..200 {
        assert_eq!(get(gw.proxy, "localhost", "/").await.status, 200);
    }
    let st = gw.status().await;
    assert_eq!(st["upstream"]["requests"], 200);
    // Two workers: at most one connection each with sequential requests.
    let opened = st["upstream"]["connections_opened"].as_u64().unwrap();
    assert!(opened <= 2, "opened {opened} connections for 200 requests");
    assert_eq!(
        up.connections.load(std::sync::atomic::Ordering::SeqCst) as u64,
        opened
    );
    // The same per peer (published by the workers once a second).
    let peer = up.addr.to_string();
    let mut seen = serde_json::Value::Null;
    assert!(
        eventually(std::time::Duration::from_secs(5), async || {
            let st = gw.status().await;
            seen = st["upstream"]["peers"].clone();
            seen.as_array().is_some_and(|a| {
                a.iter().any(|p| {
                    p["peer"] == peer.as_str()
                        && p["requests"] == 200
                        && p["connections_opened"] == opened
                })
            })
        })
        .await,
        "per-peer figures for {peer}: {seen}"
    );
    let ratio = st["upstream"]["reuse_ratio"].as_f64().unwrap();
    assert!(ratio >= 0.99, "reuse ratio {ratio}");
    drop(gw);

    // With the pool disabled every request opens a connection: what the default saves.
    let up = Upstream::start("one");
    let yaml = format!(
        "_format_version: '3.0'\nservices: [{{name: s, url: '{}', routes: [{{paths: [/]}}]}}]\n",
        up.url()
    );
    let gw = Gateway::with_config(&yaml)
        .env("TURNPIKE_UPSTREAM_KEEPALIVE_POOL_SIZE", "0")
        .start();
    for _ in 0..20 {
        assert_eq!(get(gw.proxy, "localhost", "/").await.status, 200);
    }
    assert_eq!(gw.status().await["upstream"]["connections_opened"], 20);

    // upstream_keepalive_max_requests bounds the requests per connection.
    let up = Upstream::start("one");
    let yaml = format!(
        "_format_version: '3.0'\nservices: [{{name: s, url: '{}', routes: [{{paths: [/]}}]}}]\n",
        up.url()
    );
    let gw = Gateway::with_config(&yaml)
        .env("TURNPIKE_UPSTREAM_KEEPALIVE_MAX_REQUESTS", "5")
        .env("TURNPIKE_NGINX_WORKER_PROCESSES", "1")
        .start();
    for _ in 0..20 {
        assert_eq!(get(gw.proxy, "localhost", "/").await.status, 200);
    }
    assert_eq!(gw.status().await["upstream"]["connections_opened"], 4);
}

#[tokio::test(flavor = "multi_thread")]
async fn client_keepalive_requests_limit_closes_the_connection() {
    let up = Upstream::start("one");
    let yaml = format!(
        "_format_version: '3.0'\nservices: [{{name: s, url: '{}', routes: [{{paths: [/]}}]}}]\n",
        up.url()
    );
    let gw = Gateway::with_config(&yaml)
        .env("TURNPIKE_NGINX_HTTP_KEEPALIVE_REQUESTS", "3")
        .start();
    let (mut sender, conn) = h1_client(gw.proxy).await;
    for i in 1..=3 {
        sender.ready().await.unwrap();
        let r = collect(
            sender
                .send_request(req("GET", "/").body(Full::new(Bytes::new())).unwrap())
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(r.status, 200);
        assert_eq!(
            r.header("connection") == Some("close"),
            i == 3,
            "request {i}"
        );
    }
    // The gateway closes the connection after the third response.
    tokio::time::timeout(std::time::Duration::from_secs(5), conn)
        .await
        .expect("connection closed")
        .unwrap()
        .unwrap();
}

fn thp_enabled(pid: u32) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("THP_enabled:"))
        .expect("the kernel reports THP_enabled in /proc/PID/status")
        .trim()
        .to_string()
}

/// Huge pages zeroed on allocation bursts held new connections for 100-200 ms (BENCHMARKS.md):
/// the gateway turns them off for itself unless the operator asks for them.
#[test]
fn transparent_huge_pages_are_off_unless_asked_for() {
    let up = Upstream::start("one");
    let yaml = format!(
        "_format_version: '3.0'\nservices: [{{name: s, url: '{}', routes: [{{paths: [/]}}]}}]\n",
        up.url()
    );
    let gw = Gateway::with_config(&yaml).start();
    assert_eq!(thp_enabled(gw.pid()), "0");
    let gw = Gateway::with_config(&yaml)
        .env("MIMALLOC_ALLOW_THP", "1")
        .start();
    assert_eq!(thp_enabled(gw.pid()), "1");
}
