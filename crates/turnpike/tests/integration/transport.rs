//! TLS with SNI certificates, HTTP/2, WebSocket, streamed bodies and upstream keepalive reuse.

use crate::common::*;
use bytes::Bytes;
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

/// OpenSSL clients (wrk, `openssl s_client`) put the IP address they connect to in SNI;
/// rustls ignores it with a warning. At the default log level that warning is not written:
/// under `wrk -H "Connection: close"` it was one line per handshake, 4,000 a second.
#[tokio::test(flavor = "multi_thread")]
async fn an_ip_address_in_sni_is_served_without_a_log_line() {
    let up = Upstream::start("up");
    let gw = Gateway::with_config(&format!(
        "_format_version: '3.0'\nservices: [{{name: s, url: '{}', routes: [{{paths: [/]}}]}}]\n",
        up.url()
    ))
    .env("TURNPIKE_LOG_LEVEL", "warn")
    .start();
    let addr = gw.proxy_tls.to_string();
    let text = tokio::task::spawn_blocking(move || {
        s_client(&addr, &["-servername", "127.0.0.1", "-quiet"])
    })
    .await
    .unwrap();
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    // The log is written as events happen; give it a moment.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let log = gw.log_text();
    assert!(!log.contains("Illegal SNI"), "{log}");
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
    // The upstream's headers, which an HTTP/1.1 client gets as they came, are in the map.
    assert_eq!(r.header("x-upstream"), Some("one"));
    let j = r.json();
    assert_eq!(j["uri"], "/over-h2");
    assert_eq!(j["headers"]["x-forwarded-host"], "localhost");
    // h2c with prior knowledge on a plain listener that has the http2 flag.
    let mut sender = h2c_client(gw.proxy).await;
    let resp = sender
        .send_request(
            http::Request::get("http://localhost/h2c")
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.version(), http::Version::HTTP_2);
    assert_eq!(resp.headers()["x-upstream"], "one");
    assert_eq!(resp.headers()["content-type"], "application/json");
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
        "_format_version: '3.0'\nservices: [{{name: s, url: '{}', routes: [{{paths: [/], strip_path: false}}, {{paths: [/stream], strip_path: false, request_buffering: false}}]}}]\n",
        up.url()
    ))
    .start();
    // A 32 MiB chunked upload (no content-length) in 64 KiB chunks: read whole first (Kong's
    // default request_buffering; past 8 KiB in a temporary file) and sent with its length;
    // on a route with request_buffering off, streamed as it came.
    let chunk = Bytes::from(vec![7u8; 64 * 1024]);
    for (path, framing) in [
        ("/upload", "content-length"),
        ("/stream", "transfer-encoding"),
    ] {
        let chunks: Vec<Result<hyper::body::Frame<Bytes>, std::convert::Infallible>> = (0..512)
            .map(|_| Ok(hyper::body::Frame::data(chunk.clone())))
            .collect();
        let body = StreamBody::new(futures_util::stream::iter(chunks));
        let r = send(gw.proxy, req("POST", path).body(body).unwrap()).await;
        assert_eq!(r.status, 200);
        let j = r.json();
        assert_eq!(j["body_len"], 32 * 1024 * 1024);
        // The upstream's checksum of what it received: every byte, in order.
        let sum = (0..32 * 1024 * 1024).fold(0u64, |a, _| a.wrapping_mul(31).wrapping_add(7));
        assert_eq!(j["body_sum"], sum, "{path}");
        let want = if framing == "content-length" {
            serde_json::json!("33554432")
        } else {
            serde_json::json!("chunked")
        };
        assert_eq!(j["headers"][framing], want, "{path}");
    }
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

/// One service with one route on `/api` (path kept) to `up`.
fn api_route(up: &Upstream) -> String {
    format!(
        "_format_version: '3.0'\nservices: [{{name: s, url: '{}', routes: [{{paths: [/api], strip_path: false}}]}}]\n",
        up.url()
    )
}

/// The responses in what a connection returned, each from its status code on.
fn responses_in(out: &str) -> Vec<&str> {
    out.split("HTTP/1.1 ").skip(1).collect()
}

/// Writes `parts` to a new connection one by one (waiting `gap` between them) and returns
/// everything read until the gateway closes it.
async fn raw_exchange(addr: std::net::SocketAddr, parts: &[&[u8]]) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    for p in parts {
        s.write_all(p).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let mut out = Vec::new();
    tokio::time::timeout(std::time::Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .expect("the gateway closes the connection")
        .unwrap();
    String::from_utf8_lossy(&out).to_string()
}

/// The HTTP/1.1 server side's wire behaviour: pipelining, HEAD, HTTP/1.0 keep-alive, 100
/// Continue, chunked uploads with trailers, request bodies left unread, and framing that
/// cannot be trusted.
#[tokio::test(flavor = "multi_thread")]
async fn http1_wire_behaviour() {
    let up = Upstream::start("one");
    let gw = Gateway::with_config(&api_route(&up)).start();

    // Three pipelined requests in one write, the middle one HEAD: answered in order, the HEAD
    // response without its body (the next status line follows its head directly).
    let out = raw_exchange(
        gw.proxy,
        &[b"GET /api/1 HTTP/1.1\r\nHost: x\r\n\r\nHEAD /api/2 HTTP/1.1\r\nHost: x\r\n\r\nGET /api/3 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"],
    )
    .await;
    let responses = responses_in(&out);
    assert_eq!(responses.len(), 3, "{out}");
    assert!(
        responses[0].starts_with("200") && responses[0].contains("\"/api/1\""),
        "{out}"
    );
    assert!(
        responses[1].starts_with("200") && responses[1].ends_with("\r\n\r\n"),
        "{out}"
    );
    assert!(
        responses[2].starts_with("200") && responses[2].contains("\"/api/3\""),
        "{out}"
    );
    assert!(
        responses[2]
            .to_ascii_lowercase()
            .contains("connection: close"),
        "{out}"
    );

    // HTTP/1.0 with keep-alive: confirmed when the length is known (the gateway's own 404),
    // and the connection carries a second request; a body of unknown length (this upstream
    // streams its answers) can only be delimited by closing the connection.
    let out = raw_exchange(
        gw.proxy,
        &[
            b"GET /nowhere HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
            b"GET /api/b HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
            b"GET /api/c HTTP/1.0\r\n\r\n",
        ],
    )
    .await;
    let responses = responses_in(&out);
    assert_eq!(responses.len(), 2, "{out}");
    let first = responses[0].to_ascii_lowercase();
    assert!(
        first.starts_with("404") && first.contains("connection: keep-alive"),
        "{out}"
    );
    assert!(first.contains("content-length: "), "{out}");
    let second = responses[1].to_ascii_lowercase();
    assert!(
        second.starts_with("200") && second.contains("connection: close"),
        "{out}"
    );
    assert!(
        second.contains("\"/api/b\"") && !second.contains("transfer-encoding"),
        "{out}"
    );

    // Expect: 100-continue: the interim response comes before the body is sent.
    let mut s = tokio::net::TcpStream::connect(gw.proxy).await.unwrap();
    s.write_all(
        b"POST /api/up HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n",
    )
    .await
    .unwrap();
    let mut interim = [0u8; 25];
    tokio::time::timeout(
        std::time::Duration::from_secs(5),
        s.read_exact(&mut interim),
    )
    .await
    .expect("100 Continue before the body")
    .unwrap();
    assert_eq!(&interim, b"HTTP/1.1 100 Continue\r\n\r\n");
    s.write_all(b"hello").await.unwrap();
    // Until the upstream's JSON has come whole, however the reads split the response.
    let mut got = Vec::new();
    let mut buf = vec![0u8; 4096];
    while !got.ends_with(b"}") && !got.ends_with(b"0\r\n\r\n") {
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed early: {:?}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&got);
    assert!(
        text.starts_with("HTTP/1.1 200") && text.contains("\"body_len\":5"),
        "{text}"
    );

    // A chunked upload with a trailer field; then a POST to no route, whose body the gateway
    // reads and discards so that the connection carries the next request.
    let out = raw_exchange(
        gw.proxy,
        &[
            b"POST /api/c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel",
            b"lo\r\n6;ext=1\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n",
            b"POST /nowhere HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n0123456789",
            b"GET /api/after HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        ],
    )
    .await;
    let responses = responses_in(&out);
    assert_eq!(responses.len(), 3, "{out}");
    assert!(
        responses[0].starts_with("200") && responses[0].contains("\"body_len\":11"),
        "{out}"
    );
    assert!(
        responses[1].starts_with("404") && responses[1].contains("no Route matched"),
        "{out}"
    );
    assert!(
        responses[2].starts_with("200") && responses[2].contains("\"/api/after\""),
        "{out}"
    );

    // Framing that cannot be trusted (request smuggling): 400 in Kong's shape, then close.
    for bad in [
        &b"POST /api HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n"[..],
        &b"POST /api HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n"[..],
    ] {
        let out = raw_exchange(gw.proxy, &[bad]).await;
        assert!(out.starts_with("HTTP/1.1 400"), "{out}");
        assert!(out.contains("\"message\":\"Bad request\""), "{out}");
        assert_eq!(out.matches("HTTP/1.1").count(), 1, "{out}");
    }
    assert!(!gw.log_text().contains("panicked"), "{}", gw.log_text());
}

/// A worker that stops closes its idle keep-alive connections at once instead of waiting
/// for their keep-alive timeout.
#[tokio::test(flavor = "multi_thread")]
async fn shutdown_closes_idle_keepalive_connections() {
    let up = Upstream::start("one");
    let gw = Gateway::with_config(&format!(
        "_format_version: '3.0'\nservices: [{{name: s, url: '{}', routes: [{{paths: [/]}}]}}]\n",
        up.url()
    ))
    .start();
    let mut s = tokio::net::TcpStream::connect(gw.proxy).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    // The whole response (its head says how long it is), however the reads split it.
    let mut got = Vec::new();
    let mut buf = vec![0u8; 4096];
    loop {
        let n = s.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed early: {got:?}");
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got).to_ascii_lowercase();
        if let Some(end) = text.find("\r\n\r\n") {
            let len: Option<usize> = text
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .and_then(|v| v.trim().parse().ok());
            let whole = match len {
                Some(len) => got.len() >= end + 4 + len,
                None => got.ends_with(b"0\r\n\r\n"),
            };
            if whole {
                break;
            }
        }
    }
    assert!(got.starts_with(b"HTTP/1.1 200"));
    gw.signal("TERM");
    let mut rest = Vec::new();
    tokio::time::timeout(std::time::Duration::from_secs(10), s.read_to_end(&mut rest))
        .await
        .expect("closed well before the 60 s keep-alive timeout")
        .unwrap();
    assert!(rest.is_empty(), "no further bytes: {rest:?}");
}

/// A client that stops sending its request body gets 408 after `client_body_timeout`
/// (nginx's client_body_timeout, Kong's message) instead of holding the upstream request open.
#[tokio::test(flavor = "multi_thread")]
async fn a_stalled_request_body_gets_408() {
    let up = Upstream::start("one");
    let gw = Gateway::with_config(&format!(
        "_format_version: '3.0'\nservices: [{{name: s, url: '{}', routes: [{{paths: [/]}}]}}]\n",
        up.url()
    ))
    .env("TURNPIKE_NGINX_HTTP_CLIENT_BODY_TIMEOUT", "2s")
    .start();
    let mut s = tokio::net::TcpStream::connect(gw.proxy).await.unwrap();
    s.write_all(b"POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc")
        .await
        .unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(std::time::Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .expect("answered and closed well within 10 s")
        .unwrap();
    let out = String::from_utf8_lossy(&out);
    assert!(out.starts_with("HTTP/1.1 408"), "{out}");
    assert!(out.contains("\"message\":\"Request timeout\""), "{out}");
    // A body that keeps coming, however slowly, is not cut.
    let mut s = tokio::net::TcpStream::connect(gw.proxy).await.unwrap();
    s.write_all(b"POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    for b in [b"a", b"b", b"c", b"d"] {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        s.write_all(b).await.unwrap();
    }
    let mut out = Vec::new();
    tokio::time::timeout(std::time::Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .unwrap()
        .unwrap();
    let out = String::from_utf8_lossy(&out);
    assert!(
        out.starts_with("HTTP/1.1 200") && out.contains("\"body_len\":4"),
        "{out}"
    );
}

/// Headers written as clients write them (any case) are recognised by the HTTP/1.1 parser's
/// name table: hop-by-hop headers and those the Connection header names are stripped, the
/// client's X-Forwarded-For is extended, and Accept picks the error format.
#[tokio::test(flavor = "multi_thread")]
async fn request_headers_in_any_case_are_recognised() {
    let up = Upstream::start("one");
    let gw = Gateway::with_config(&api_route(&up)).start();
    let out = raw_exchange(
        gw.proxy,
        &[b"GET /api HTTP/1.1\r\nHost: x\r\nX-FORWARDED-FOR: 1.2.3.4\r\nX-Real-IP: 9.9.9.9\r\nX-Kong-Request-Id: client\r\nKeep-Alive: timeout=5\r\nTE: trailers\r\nX-Secret: s\r\nConnection: X-Secret\r\n\r\nGET /nowhere HTTP/1.1\r\nHost: x\r\nACCEPT: text/html\r\nConnection: close\r\n\r\n"],
    )
    .await;
    let responses = responses_in(&out);
    assert_eq!(responses.len(), 2, "{out}");
    let body = &responses[0][responses[0].find('{').unwrap()..];
    let body = &body[..=body.rfind('}').unwrap()];
    let j: serde_json::Value = serde_json::from_str(body).unwrap();
    let h = &j["headers"];
    assert_eq!(h["x-forwarded-for"], "1.2.3.4, 127.0.0.1", "{h}");
    // An untrusted client's X-Real-IP and X-Kong-Request-Id are replaced, not passed along.
    assert_eq!(h["x-real-ip"], "127.0.0.1", "{h}");
    assert_eq!(h["x-kong-request-id"].as_str().unwrap().len(), 32, "{h}");
    for gone in ["keep-alive", "te", "x-secret", "connection"] {
        assert!(h.get(gone).is_none(), "{gone} forwarded: {h}");
    }
    assert!(responses[1].starts_with("404"), "{out}");
    assert!(responses[1].contains("text/html"), "{out}");
}

/// Kong's own response headers are written once per response, and replace an upstream's
/// headers of the same names, whether they go straight into the HTTP/1.1 head or through the
/// header map (HTTP/2).
#[tokio::test(flavor = "multi_thread")]
async fn kong_response_headers_replace_the_upstreams() {
    let up = Upstream::start("one");
    let gw = Gateway::with_config(&format!(
        "_format_version: '3.0'\nservices: [{{name: s, url: '{}', routes: [{{paths: [/]}}]}}]\n",
        up.url()
    ))
    .start();
    for path in ["/plain", "/kong-named"] {
        let out = raw_exchange(
            gw.proxy,
            &[format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes()],
        )
        .await
        .to_ascii_lowercase();
        for name in [
            "via",
            "x-kong-upstream-latency",
            "x-kong-proxy-latency",
            "x-kong-request-id",
        ] {
            assert_eq!(
                out.matches(&format!("\r\n{name}: ")).count(),
                1,
                "{name} in {out}"
            );
        }
        assert!(
            !out.contains("from-upstream") && !out.contains(": 999\r\n"),
            "{out}"
        );
    }
    drop(gw);
    // A plugin that sets a header of one of those names (correlation-id echoing its id as
    // X-Kong-Proxy-Latency) replaces Kong's, as before: one such header, the plugin's value.
    let gw = Gateway::with_config(&format!(
        "_format_version: '3.0'\nservices: [{{name: s, url: '{}', routes: [{{paths: [/], plugins: [{{name: correlation-id, config: {{header_name: X-Kong-Proxy-Latency, echo_downstream: true}}}}]}}]}}]\n",
        up.url()
    ))
    .start();
    let (out, values) = header_values(gw.proxy, "/", "x-kong-proxy-latency").await;
    assert_eq!(values.len(), 1, "{out}");
    assert!(
        values[0].contains('-'),
        "the plugin's id, not a latency: {out}"
    );
}

/// One `GET path` on a new connection: the whole exchange, lower-cased, and the values of the
/// response header `name` (lower-case), in order.
async fn header_values(
    proxy: std::net::SocketAddr,
    path: &str,
    name: &str,
) -> (String, Vec<String>) {
    let out = raw_exchange(
        proxy,
        &[format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes()],
    )
    .await
    .to_ascii_lowercase();
    let prefix = format!("{name}: ");
    let values = out
        .split("\r\n")
        .filter_map(|l| l.strip_prefix(prefix.as_str()))
        .map(str::to_string)
        .collect();
    (out, values)
}

/// The upstream's headers go to an HTTP/1.1 client as the upstream sent them, except that a
/// plugin's response header replaces the upstream's of the same name (Kong's
/// `kong.response.set_header`).
#[tokio::test(flavor = "multi_thread")]
async fn plugin_response_headers_replace_the_upstreams() {
    let up = Upstream::start("from-upstream");
    let gw = Gateway::with_config(&format!(
        "_format_version: '3.0'\nservices: [{{name: s, url: '{}', routes: [{{paths: [/echo], plugins: [{{name: correlation-id, config: {{header_name: X-Upstream, echo_downstream: true}}}}]}}, {{paths: [/]}}]}}]\n",
        up.url()
    ))
    .start();
    let (out, values) = header_values(gw.proxy, "/echo", "x-upstream").await;
    assert_eq!(values.len(), 1, "{out}");
    assert_ne!(values[0], "from-upstream", "the plugin's id: {out}");
    // Without the plugin: the upstream's own header, once, and its content type.
    let (out, values) = header_values(gw.proxy, "/other", "x-upstream").await;
    assert_eq!(values, ["from-upstream"], "{out}");
    assert_eq!(
        out.matches("\r\ncontent-type: application/json\r\n")
            .count(),
        1,
        "{out}"
    );
}

/// Two plugins setting a response header of the same name: the client gets one, the last
/// one set (correlation-id runs first, at its higher priority, then rate-limiting).
#[tokio::test(flavor = "multi_thread")]
async fn a_response_header_set_by_two_plugins_is_sent_once() {
    let up = Upstream::start("one");
    let gw = Gateway::with_config(&format!(
        "_format_version: '3.0'\nservices: [{{name: s, url: '{}', routes: [{{paths: [/], plugins: [{{name: correlation-id, config: {{header_name: X-RateLimit-Limit-Minute, echo_downstream: true}}}}, {{name: rate-limiting, config: {{minute: 7}}}}]}}]}}]\n",
        up.url()
    ))
    .start();
    let (out, values) = header_values(gw.proxy, "/", "x-ratelimit-limit-minute").await;
    assert_eq!(values, ["7"], "{out}");
}

/// `openssl s_client` against `addr` with `args`, sending one request; its whole output
/// (the response and session details, then what it wrote to stderr).
fn s_client(addr: &str, args: &[&str]) -> String {
    let out = std::process::Command::new("openssl")
        .args([
            "s_client",
            "-connect",
            addr,
            "-servername",
            "localhost",
            "-ign_eof",
        ])
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin
                .take()
                .unwrap()
                .write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")?;
            c.wait_with_output()
        })
        .expect("openssl s_client");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Kong's TLS properties: `ssl_cipher_suite` (modern: TLS 1.3 only; custom: `ssl_protocols`
/// and `ssl_ciphers`), and resumption through the shared session cache, with or without
/// `ssl_session_tickets`; a bad value stops the start with a clear error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kong_tls_properties_shape_what_the_proxy_serves() {
    let up = Upstream::start("tls-props");
    let config = format!(
        "_format_version: '3.0'\nservices: [{{name: s, url: '{}', routes: [{{paths: [/]}}]}}]\n",
        up.url()
    );
    let modern = Gateway::with_config(&config)
        .env("TURNPIKE_SSL_CIPHER_SUITE", "modern")
        .start();
    let custom = Gateway::with_config(&config)
        .env("TURNPIKE_SSL_CIPHER_SUITE", "custom")
        .env("TURNPIKE_SSL_PROTOCOLS", "TLSv1.2")
        .env(
            "TURNPIKE_SSL_CIPHERS",
            "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256",
        )
        .env("TURNPIKE_SSL_SESSION_TICKETS", "off")
        .start();
    let (m, c) = (modern.proxy_tls.to_string(), custom.proxy_tls.to_string());
    tokio::task::spawn_blocking(move || {
        let out = s_client(&m, &["-tls1_3"]);
        assert!(
            out.contains("New, TLSv1.3") && out.contains("HTTP/1.1 200"),
            "{out}"
        );
        let out = s_client(&m, &["-tls1_2"]);
        assert!(
            !out.contains("HTTP/1.1 200"),
            "modern refuses TLS 1.2: {out}"
        );

        let out = s_client(&c, &["-tls1_3"]);
        assert!(
            !out.contains("HTTP/1.1 200"),
            "custom TLSv1.2 refuses TLS 1.3: {out}"
        );
        let out = s_client(&c, &["-tls1_2"]);
        assert!(
            out.contains("New, TLSv1.2, Cipher is ECDHE-ECDSA-AES128-GCM-SHA256"),
            "{out}"
        );
        let out = s_client(&c, &["-tls1_2", "-cipher", "ECDHE-ECDSA-AES256-GCM-SHA384"]);
        assert!(!out.contains("HTTP/1.1 200"), "a suite left out: {out}");

        // Resumption: by ticket (TLS 1.3, tickets on) and by the session cache (TLS 1.2,
        // tickets off), on the next connection.
        let dir = tempfile::tempdir().unwrap();
        for (addr, version) in [(&m, "-tls1_3"), (&c, "-tls1_2")] {
            let sess = dir.path().join(format!("{version}.pem"));
            let sess = sess.to_str().unwrap();
            let first = s_client(addr, &[version, "-sess_out", sess]);
            assert!(first.contains("New,"), "{first}");
            let again = s_client(addr, &[version, "-sess_in", sess]);
            assert!(again.contains("Reused,"), "{version}: {again}");
        }
    })
    .await
    .unwrap();

    for (k, v, expect) in [
        ("TURNPIKE_SSL_CIPHER_SUITE", "strong", "ssl_cipher_suite"),
        (
            "TURNPIKE_SSL_SESSION_CACHE_SIZE",
            "0",
            "ssl_session_cache_size",
        ),
    ] {
        let (ok, out) = run(&["config", "parse", "/dev/null"], &[(k, v)]);
        assert!(!ok && out.contains(expect), "{k}={v}: {out}");
    }
}

/// A client still uploading a body the gateway answered without reading (here a 404 to a
/// 16 MiB POST) finishes its upload and reads the answer, as from nginx's lingering close: the
/// gateway shuts its side and reads what still comes before closing, rather than resetting the
/// connection under the client (which lost the response: a broken pipe while writing).
#[tokio::test(flavor = "multi_thread")]
async fn an_unread_upload_is_read_away_before_the_connection_closes() {
    let up = Upstream::start("one");
    let gw = Gateway::with_config(&api_route(&up)).start();
    let mut s = tokio::net::TcpStream::connect(gw.proxy).await.unwrap();
    let size = 16 << 20;
    s.write_all(
        format!("POST /nowhere HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let chunk = vec![b'a'; 64 << 10];
    let mut sent = 0;
    while sent < size {
        s.write_all(&chunk)
            .await
            .unwrap_or_else(|e| panic!("the upload broke after {sent} bytes: {e}"));
        sent += chunk.len();
    }
    let mut out = Vec::new();
    tokio::time::timeout(std::time::Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .expect("the gateway closes the connection")
        .unwrap();
    let out = String::from_utf8_lossy(&out);
    assert!(out.starts_with("HTTP/1.1 404"), "{out}");
    assert!(out.contains("no Route matched"), "{out}");
}

/// An HTTP/2 upload answered before it ends (here a 404 to a 1 MiB POST) reaches curl: the
/// rest of the body is read away, as nginx discards it. hyper reset the stream under the
/// client instead (`RST_STREAM`), and curl reported "(92) Stream error in the HTTP/2 framing
/// layer" without the response.
#[tokio::test(flavor = "multi_thread")]
async fn an_http2_upload_answered_early_reaches_curl() {
    let up = Upstream::start("one");
    let gw = Gateway::with_config(&format!(
        "_format_version: '3.0'\nservices: [{{name: s, url: '{}', routes: [{{paths: [/up]}}]}}]\n",
        up.url()
    ))
    .start_h2();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("upload");
    std::fs::write(&file, vec![b'x'; 1 << 20]).unwrap();
    let data = format!("@{}", file.display());
    let curl = |args: Vec<String>| {
        let out = std::process::Command::new("curl")
            .args([
                "-sS",
                "-o",
                "/dev/null",
                "-w",
                "%{http_version} %{http_code}",
            ])
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    for (how, args) in [
        (
            "h2c",
            vec![
                "--http2-prior-knowledge".to_string(),
                format!("http://{}/nowhere", gw.proxy),
            ],
        ),
        (
            "h2 over TLS",
            vec![
                "--http2".to_string(),
                "-k".to_string(),
                format!("https://{}/nowhere", gw.proxy_tls),
            ],
        ),
    ] {
        let mut a = vec!["--data-binary".to_string(), data.clone()];
        a.extend(args);
        let (code, out, err) = tokio::task::spawn_blocking({
            let a = a.clone();
            move || curl(a)
        })
        .await
        .unwrap();
        assert_eq!((code, out.as_str()), (Some(0), "2 404"), "{how}: {err}");
    }
    // The same upload to a route is proxied whole.
    let url = format!("http://{}/up", gw.proxy);
    let (code, out, err) = tokio::task::spawn_blocking(move || {
        curl(vec![
            "--http2-prior-knowledge".to_string(),
            "--data-binary".to_string(),
            data,
            url,
        ])
    })
    .await
    .unwrap();
    assert_eq!((code, out.as_str()), (Some(0), "2 200"), "{err}");
}

/// An HTTP/2 upload of many small DATA frames to an upstream that reads slowly: the frames
/// wait in the gateway's HTTP/2 buffers (up to the stream's window) while the upstream holds
/// back, and h2 counts each frame under 256 bytes against a budget of half the connection
/// window (GOAWAY ENHANCE_YOUR_CALM `too_many_data_frames` past it). At hyper's default
/// 1 MiB connection window that budget was spent by some 2,700 waiting 64-byte frames and the
/// connection was closed under the client; the gateway's 8 MiB window holds a full stream
/// window of them (this is what gRPC client streams of small messages do).
#[tokio::test(flavor = "multi_thread")]
async fn many_small_http2_frames_wait_for_a_slow_upstream() {
    // The upstream: reads nothing for 2 s, then the whole chunked body, then answers.
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                tokio::time::sleep(std::time::Duration::from_secs(2)).await;
                let mut got = Vec::new();
                let mut buf = vec![0u8; 1 << 16];
                while !got.ends_with(b"0\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let answer = format!("{}", got.len());
                let _ = s
                    .write_all(
                        format!(
                            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{answer}",
                            answer.len()
                        )
                        .as_bytes(),
                    )
                    .await;
            });
        }
    });
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
services:
- name: slow-reader
  url: http://{up}
  routes: [{{name: upload, paths: [/upload], request_buffering: false}}]
"#
    ))
    .start_h2();
    // 8 MiB in 64-byte frames: enough to fill the kernel's socket buffers towards the
    // upstream, then a stream window's worth waiting in the gateway.
    const FRAMES: usize = 128 * 1024;
    let frames = futures_util::stream::iter((0..FRAMES).map(|_| {
        Ok::<_, std::io::Error>(hyper::body::Frame::data(Bytes::from_static(&[b'x'; 64])))
    }));
    let mut sender = h2c_client::<StreamBody<_>>(gw.proxy).await;
    let req = hyper::Request::post(format!("http://{}/upload", gw.proxy))
        .body(StreamBody::new(frames))
        .unwrap();
    let resp = tokio::time::timeout(std::time::Duration::from_secs(60), sender.send_request(req))
        .await
        .expect("answered in time")
        .expect("the connection stays open");
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    // The upstream got every byte (64 B a frame, in chunks of its framing).
    let got: usize = std::str::from_utf8(&body).unwrap().parse().unwrap();
    assert!(got > FRAMES * 64, "{got}");
    assert!(!gw.log_text().contains("too_many_data_frames"));
}
