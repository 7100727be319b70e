//! The PROXY protocol on listeners flagged `proxy_protocol` (Kong's `proxy_listen` and
//! `stream_listen` flag): HAProxy in front (`send-proxy`, `send-proxy-v2`, started by the
//! test from the system's binary) and raw headers written by hand; the client a trusted
//! balancer names is the request's client (X-Real-IP, X-Forwarded-For, ip-restriction,
//! stream `sources`) with `real_ip_header = proxy_protocol`, as nginx's realip module makes
//! it; a connection without a header is closed.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::*;

/// HAProxy in TCP mode on a free port, forwarding to `to` with a PROXY header (`send-proxy`
/// or `send-proxy-v2`); killed on drop.
struct Haproxy {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Haproxy {
    fn start(to: SocketAddr, send: &str) -> Haproxy {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let cfg = dir.path().join("haproxy.cfg");
        std::fs::write(
            &cfg,
            format!(
                "global\n  maxconn 100\ndefaults\n  mode tcp\n  timeout connect 5s\n  \
                 timeout client 30s\n  timeout server 30s\nfrontend f\n  bind 127.0.0.1:{port}\n  \
                 default_backend b\nbackend b\n  server gw {to} {send}\n"
            ),
        )
        .unwrap();
        let child = Command::new("haproxy")
            .arg("-f")
            .arg(&cfg)
            .arg("-db")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start haproxy (Debian's haproxy package)");
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        for _ in 0..200 {
            if std::net::TcpStream::connect(addr).is_ok() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Haproxy {
            child,
            port,
            _dir: dir,
        }
    }
}

/// curl from a chosen local address (`127.0.0.x`), through `url`: the upstream's echo.
fn curl_from(source: &str, url: &str, extra: &[&str]) -> Value {
    let out = Command::new("curl")
        .args(["-sk", "--interface", source])
        .args(extra)
        .arg(url)
        .output()
        .expect("run curl");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {:?} {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// A raw request after `header`: the answer's bytes (empty when the connection is closed).
async fn raw(addr: SocketAddr, header: &[u8], request: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut bytes = header.to_vec();
    bytes.extend_from_slice(request);
    let _ = s.write_all(&bytes).await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), s.read_to_end(&mut out)).await;
    out
}

fn echoed(answer: &[u8]) -> Value {
    let text = String::from_utf8_lossy(answer);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("");
    // The test upstream's body may come chunked: its JSON object is the line that opens it.
    let line = body.lines().find(|l| l.starts_with('{')).unwrap_or(body);
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {text}"))
}

const GET: &[u8] =
    b"GET /echo HTTP/1.1\r\nHost: pp.test\r\nX-Real-IP: 6.6.6.6\r\nConnection: close\r\n\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trusted_balancers_proxy_header_names_the_client() {
    let up = Upstream::start("pp");
    let doc = json!({
        "_format_version": "3.0",
        "services": [{"name": "s", "url": format!("http://{}", up.addr), "routes": [
            {"name": "r", "paths": ["/echo"]},
            {"name": "guarded", "paths": ["/guarded"], "plugins": [
                {"name": "ip-restriction", "config": {"allow": ["127.0.0.5"]}}]},
        ]}],
    });
    let gw = Gateway::with_config(&doc.to_string())
        .proxy_flags("proxy_protocol")
        .env("TURNPIKE_REAL_IP_HEADER", "proxy_protocol")
        .env("TURNPIKE_TRUSTED_IPS", "127.0.0.1")
        .start();

    // v1, written by hand: the header's client, not the peer's address nor its X-Real-IP.
    let answer = raw(
        gw.proxy,
        b"PROXY TCP4 203.0.113.7 127.0.0.1 51234 8000\r\n",
        GET,
    )
    .await;
    let seen = echoed(&answer);
    assert_eq!(seen["headers"]["x-real-ip"], "203.0.113.7", "{seen}");
    assert_eq!(seen["headers"]["x-forwarded-for"], "203.0.113.7");
    // A client's own X-Forwarded-For gets the balancer appended (nginx's
    // `$realip_remote_addr`), as Kong's runloop builds it.
    let with_xff = b"GET /echo HTTP/1.1\r\nHost: pp.test\r\nX-Forwarded-For: 10.9.9.9\r\nConnection: close\r\n\r\n";
    let seen = echoed(
        &raw(
            gw.proxy,
            b"PROXY TCP4 203.0.113.7 127.0.0.1 51234 8000\r\n",
            with_xff,
        )
        .await,
    );
    assert_eq!(seen["headers"]["x-forwarded-for"], "10.9.9.9, 127.0.0.1");
    assert_eq!(seen["headers"]["x-real-ip"], "203.0.113.7");
    // v1 over IPv6, and `UNKNOWN` (a balancer's health check): the peer stays the client.
    let seen = echoed(&raw(gw.proxy, b"PROXY TCP6 2001:db8::7 ::1 4000 8000\r\n", GET).await);
    assert_eq!(seen["headers"]["x-real-ip"], "2001:db8::7");
    let seen = echoed(&raw(gw.proxy, b"PROXY UNKNOWN\r\n", GET).await);
    assert_eq!(seen["headers"]["x-real-ip"], "127.0.0.1");
    // No header, or a broken one: closed without an answer, as nginx closes it.
    assert!(raw(gw.proxy, b"", GET).await.is_empty());
    assert!(raw(gw.proxy, b"PROXY TCP4 nonsense\r\n", GET)
        .await
        .is_empty());

    // HAProxy in front, v1 and v2, curl connecting from 127.0.0.5: plain and TLS listeners.
    for send in ["send-proxy", "send-proxy-v2"] {
        let plain = Haproxy::start(gw.proxy, send);
        let seen = curl_from(
            "127.0.0.5",
            &format!("http://127.0.0.1:{}/echo", plain.port),
            &["-H", "x-real-ip: 6.6.6.6"],
        );
        assert_eq!(seen["headers"]["x-real-ip"], "127.0.0.5", "{send}: {seen}");
        let tls = Haproxy::start(gw.proxy_tls, send);
        let seen = curl_from(
            "127.0.0.5",
            &format!("https://127.0.0.1:{}/echo", tls.port),
            &[],
        );
        assert_eq!(seen["headers"]["x-real-ip"], "127.0.0.5", "{send} over TLS");
        assert_eq!(seen["headers"]["x-forwarded-proto"], "https");
        // Plugins see the same client: ip-restriction lets 127.0.0.5 through, not .6.
        let ok = Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "--interface"])
            .arg("127.0.0.5")
            .arg(format!("http://127.0.0.1:{}/guarded", plain.port))
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&ok.stdout), "200");
        let refused = Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "--interface"])
            .arg("127.0.0.6")
            .arg(format!("http://127.0.0.1:{}/guarded", plain.port))
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&refused.stdout), "403");
    }
    assert!(!gw.log_text().contains("panicked"));
}

/// A balancer not in `trusted_ips`, or `real_ip_header` left at X-Real-IP: the header is
/// read (and must be there) but the client stays the peer; and `real_ip_header =
/// proxy_protocol` without a listener flagged for it is a configuration error, as in Kong.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_balancer_names_no_one() {
    let up = Upstream::start("pp-untrusted");
    let doc = json!({
        "_format_version": "3.0",
        "services": [{"name": "s", "url": format!("http://{}", up.addr), "routes": [{"name": "r", "paths": ["/echo"]}]}],
    })
    .to_string();
    let header = b"PROXY TCP4 203.0.113.7 127.0.0.1 51234 8000\r\n";
    let untrusted = Gateway::with_config(&doc)
        .proxy_flags("proxy_protocol")
        .env("TURNPIKE_REAL_IP_HEADER", "proxy_protocol")
        .start();
    let seen = echoed(&raw(untrusted.proxy, header, GET).await);
    assert_eq!(seen["headers"]["x-real-ip"], "127.0.0.1");
    let by_header = Gateway::with_config(&doc)
        .proxy_flags("proxy_protocol")
        .env("TURNPIKE_TRUSTED_IPS", "127.0.0.1")
        .start();
    let seen = echoed(&raw(by_header.proxy, header, GET).await);
    assert_eq!(seen["headers"]["x-real-ip"], "6.6.6.6");
    let out = Command::new(bin())
        .args(["config", "parse", "/dev/null"])
        .env("TURNPIKE_REAL_IP_HEADER", "proxy_protocol")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("proxy_protocol"),
        "{err}"
    );
}

/// A stream listener flagged `proxy_protocol`: the route's `sources` match the client the
/// trusted balancer names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_routes_see_the_client_a_proxy_header_names() {
    let echo = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let echo_addr = echo.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = echo.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    });
    let port = free_port();
    let doc = json!({
        "_format_version": "3.0",
        "services": [{"name": "echo", "url": format!("tcp://{echo_addr}"), "routes": [
            {"name": "from-lb-clients", "protocols": ["tcp"],
             "sources": [{"ip": "203.0.113.0/24"}], "destinations": [{"port": port}]},
        ]}],
    });
    let gw = Gateway::with_config(&doc.to_string())
        .env(
            "TURNPIKE_STREAM_LISTEN",
            &format!("127.0.0.1:{port} proxy_protocol"),
        )
        .env("TURNPIKE_TRUSTED_IPS", "127.0.0.1")
        .start();
    let at = SocketAddr::from(([127, 0, 0, 1], port));
    assert!(
        eventually(std::time::Duration::from_secs(10), async || {
            TcpStream::connect(at).await.is_ok()
        })
        .await
    );
    // The header's client is in the route's sources; the bytes after the header are the
    // stream's, passed on untouched.
    let back = raw(
        at,
        b"PROXY TCP4 203.0.113.9 127.0.0.1 5000 6000\r\n",
        b"ping",
    )
    .await;
    assert_eq!(back, b"ping");
    // A client outside them (the peer itself) is routed nowhere; no header: closed.
    assert!(raw(
        at,
        b"PROXY TCP4 198.51.100.1 127.0.0.1 5000 6000\r\n",
        b"ping"
    )
    .await
    .is_empty());
    assert!(raw(at, b"", b"ping").await.is_empty());
    assert!(!gw.log_text().contains("panicked"));
}
