//! Kong's stream proxy: `stream_listen`, routes with `protocols: [tcp]` matched on
//! `destinations` and `sources`, `tcp` services (direct or balanced, connect failures
//! retried on the next target), bytes passed both ways with half-closes kept, and a
//! connection no route takes closed.

use std::net::SocketAddr;

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::common::*;

/// A TCP server: echoes what it reads (then closes its side after the client's EOF), or,
/// with `send`, writes that many bytes first and closes.
async fn tcp_server(send: Option<usize>) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else {
                return;
            };
            tokio::spawn(async move {
                match send {
                    None => {
                        let (mut r, mut w) = s.split();
                        let _ = tokio::io::copy(&mut r, &mut w).await;
                        let _ = w.shutdown().await;
                    }
                    Some(n) => {
                        let chunk = vec![7u8; 64 * 1024];
                        let mut left = n;
                        while left > 0 {
                            let k = left.min(chunk.len());
                            if s.write_all(&chunk[..k]).await.is_err() {
                                return;
                            }
                            left -= k;
                        }
                        let _ = s.shutdown().await;
                    }
                }
            });
        }
    });
    addr
}

/// Until the gateway's stream listener at `at` takes connections.
async fn listening(at: SocketAddr) {
    assert!(
        eventually(std::time::Duration::from_secs(10), async || {
            TcpStream::connect(at).await.is_ok()
        })
        .await,
        "nothing listens on {at}"
    );
}

fn checksum(data: &[u8]) -> u64 {
    data.iter()
        .fold(0u64, |a, b| a.wrapping_mul(31).wrapping_add(*b as u64))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_streams_are_routed_and_spliced() {
    let echo = tcp_server(None).await;
    let source = tcp_server(Some(16 << 20)).await;
    let (_dead_socket, dead) = dead_port();
    let (echo_port, source_port, balanced_port, unrouted_port) =
        (free_port(), free_port(), free_port(), free_port());
    let doc = json!({
        "_format_version": "3.0",
        "upstreams": [{"name": "pool", "targets": [
            {"target": format!("127.0.0.1:{dead}")},
            {"target": echo.to_string()},
        ]}],
        "services": [
            {"name": "echo", "url": format!("tcp://{echo}"), "routes": [
                {"name": "to-echo", "protocols": ["tcp"], "destinations": [{"port": echo_port}]},
            ]},
            {"name": "source", "url": format!("tcp://{source}"), "routes": [
                {"name": "to-source", "protocols": ["tcp"], "destinations": [{"ip": "127.0.0.1", "port": source_port}]},
            ]},
            {"name": "balanced", "url": "tcp://pool", "routes": [
                {"name": "to-pool", "protocols": ["tcp"], "destinations": [{"port": balanced_port}],
                 "sources": [{"ip": "127.0.0.0/8"}]},
            ]},
        ],
    });
    let listen = [echo_port, source_port, balanced_port, unrouted_port]
        .map(|p| format!("127.0.0.1:{p}"))
        .join(", ");
    let mut gw = Gateway::with_config(&doc.to_string())
        .env("TURNPIKE_STREAM_LISTEN", &listen)
        .start();
    let at = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));
    for port in [echo_port, source_port, balanced_port, unrouted_port] {
        listening(at(port)).await;
    }

    // 8 MiB each way at once, then the client's half-close: every byte comes back, in order,
    // and the upstream's close reaches the client.
    let data: Vec<u8> = (0..8u32 << 20).map(|i| (i % 251) as u8).collect();
    let s = TcpStream::connect(at(echo_port)).await.unwrap();
    let (mut r, mut w) = s.into_split();
    let sent = data.clone();
    let writer = tokio::spawn(async move {
        w.write_all(&sent).await.unwrap();
        w.shutdown().await.unwrap();
    });
    let mut back = Vec::new();
    r.read_to_end(&mut back).await.unwrap();
    writer.await.unwrap();
    assert_eq!(back.len(), data.len());
    assert_eq!(checksum(&back), checksum(&data));

    // A short exchange after a half-close, as a request/response protocol does it.
    let mut s = TcpStream::connect(at(echo_port)).await.unwrap();
    s.write_all(b"hello").await.unwrap();
    s.shutdown().await.unwrap();
    let mut back = Vec::new();
    s.read_to_end(&mut back).await.unwrap();
    assert_eq!(back, b"hello");

    // A download the upstream ends with its close: 16 MiB, all of it.
    let mut s = TcpStream::connect(at(source_port)).await.unwrap();
    let mut got = Vec::new();
    s.read_to_end(&mut got).await.unwrap();
    assert_eq!(got.len(), 16 << 20);

    // A balanced service: the dead target is retried on the live one, every time.
    for i in 0..4 {
        let mut s = TcpStream::connect(at(balanced_port)).await.unwrap();
        let msg = format!("ping {i}");
        s.write_all(msg.as_bytes()).await.unwrap();
        s.shutdown().await.unwrap();
        let mut back = String::new();
        s.read_to_string(&mut back).await.unwrap();
        assert_eq!(back, msg);
    }

    // No route for this listener: the connection is closed, nothing is answered.
    let mut s = TcpStream::connect(at(unrouted_port)).await.unwrap();
    let _ = s.write_all(b"x").await;
    let mut buf = Vec::new();
    let n = tokio::time::timeout(std::time::Duration::from_secs(5), s.read_to_end(&mut buf))
        .await
        .expect("closed at once");
    assert_eq!(n.unwrap_or(0), 0);
    assert!(
        gw.log_text().contains("no Route found"),
        "{}",
        gw.log_text()
    );

    assert!(!gw.log_text().contains("panicked"));

    // A stream still open does not hold the gateway up when it stops: it is closed.
    let mut open = TcpStream::connect(at(echo_port)).await.unwrap();
    open.write_all(b"still here").await.unwrap();
    let mut buf = [0u8; 10];
    open.read_exact(&mut buf).await.unwrap();
    gw.signal("TERM");
    let stopped = eventually(std::time::Duration::from_secs(10), async || {
        matches!(gw.child.try_wait(), Ok(Some(_)))
    })
    .await;
    assert!(stopped, "the gateway did not stop with a stream open");
    let mut rest = Vec::new();
    assert_eq!(open.read_to_end(&mut rest).await.unwrap_or(0), 0);
}

/// Kong's `stream_listen` syntax: what it cannot serve is refused at start, with why.
#[test]
fn stream_listen_refuses_what_it_does_not_serve() {
    for (value, expect) in [
        (
            "127.0.0.1:7000 udp ssl",
            "'ssl' cannot be set on a 'udp' listener",
        ),
        ("127.0.0.1:7000 http2", "unknown listen flag 'http2'"),
    ] {
        let (ok, out) = run(&["doctor"], &[("TURNPIKE_STREAM_LISTEN", value)]);
        assert!(!ok, "{value}: {out}");
        assert!(out.contains(expect), "{value}: {out}");
    }
}

/// A TLS echo server with `cert`/`key`: what it decrypts it echoes.
async fn tls_echo_server(cert: &str, key: &str) -> SocketAddr {
    use rustls::pki_types::pem::PemObject;
    let certs = pem_certs(cert);
    let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap();
    let cfg = rustls::ServerConfig::builder_with_provider(turnpike_proxy::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(cfg));
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = l.accept().await else { return };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(s).await else {
                    return;
                };
                let (mut r, mut w) = tokio::io::split(tls);
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    });
    addr
}

/// One exchange over plain TCP: `msg`, a half-close, and what came back before the close
/// (nothing when the connection is refused or closed at once).
async fn tcp_exchange(addr: SocketAddr, msg: &[u8]) -> Vec<u8> {
    let Ok(mut s) = TcpStream::connect(addr).await else {
        return Vec::new();
    };
    let _ = s.write_all(msg).await;
    let _ = s.shutdown().await;
    let mut back = Vec::new();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), s.read_to_end(&mut back)).await;
    back
}

/// One exchange over TLS with `sni`: what came back, and the certificate the client saw.
async fn tls_exchange(addr: SocketAddr, sni: &str, msg: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
    let tcp = TcpStream::connect(addr).await.ok()?;
    let name = rustls::pki_types::ServerName::try_from(sni.to_string()).unwrap();
    let mut tls = tls_client(&[]).connect(name, tcp).await.ok()?;
    let cert = tls.get_ref().1.peer_certificates()?[0].to_vec();
    tls.write_all(msg).await.ok()?;
    tls.shutdown().await.ok()?;
    let mut back = Vec::new();
    let _ = tls.read_to_end(&mut back).await;
    Some((back, cert))
}

/// TLS streams: `tls` routes terminated with the certificate chosen by SNI (to a `tcp` or a
/// `tls` service), `tls_passthrough` routed on the ClientHello's SNI and passed through
/// encrypted, and what no route takes (an unknown name, bytes that are not TLS) closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_streams_terminate_or_pass_through_by_sni() {
    let echo = tcp_server(None).await;
    let (up_cert, up_key) = cert_for("pass.test");
    let tls_echo = tls_echo_server(&up_cert, &up_key).await;
    let (db_cert, db_key) = cert_for("db.test");
    let (o_cert, o_key) = cert_for("origin.test");
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("sessions.log");
    let doc = json!({
        "_format_version": "3.0",
        "services": [
            {"name": "plain", "url": format!("tcp://{echo}"), "routes": [
                {"name": "db", "protocols": ["tls"], "snis": ["db.test"],
                 "plugins": [{"name": "file-log", "protocols": ["tls"],
                              "config": {"path": log_path.to_string_lossy()}}]},
            ]},
            {"name": "tls-up", "url": format!("tls://{tls_echo}"), "routes": [
                {"name": "origin", "protocols": ["tls"], "snis": ["origin.test"]},
            ]},
            {"name": "raw", "url": format!("tcp://{tls_echo}"), "routes": [
                {"name": "pass", "protocols": ["tls_passthrough"], "snis": ["pass.test"],
                 "plugins": [{"name": "file-log", "protocols": ["tls_passthrough"],
                              "config": {"path": log_path.to_string_lossy()}}]},
            ]},
        ],
        "certificates": [
            {"cert": db_cert, "key": db_key, "snis": [{"name": "db.test"}]},
            {"cert": o_cert, "key": o_key, "snis": [{"name": "origin.test"}]},
        ],
    });
    let gw = Gateway::with_config(&doc.to_string())
        .env("TURNPIKE_STREAM_LISTEN", &format!("127.0.0.1:{port} ssl"))
        .start();
    let at = SocketAddr::from(([127, 0, 0, 1], port));
    listening(at).await;
    let der = |pem: &str| pem_certs(pem)[0].to_vec();

    // Terminated with db.test's certificate; the plain upstream gets the plain bytes.
    let (back, cert) = tls_exchange(at, "db.test", b"select 1")
        .await
        .expect("db.test");
    assert_eq!(back, b"select 1");
    assert_eq!(cert, der(&db_cert));
    // Terminated, then TLS again to a `tls` service.
    let (back, cert) = tls_exchange(at, "origin.test", b"over tls twice")
        .await
        .expect("origin.test");
    assert_eq!(back, b"over tls twice");
    assert_eq!(cert, der(&o_cert));
    // Passed through: the client's TLS session is with the upstream itself.
    let (back, cert) = tls_exchange(at, "pass.test", b"end to end")
        .await
        .expect("pass.test");
    assert_eq!(back, b"end to end");
    assert_eq!(cert, der(&up_cert));
    // Kong's stream entry: `session.tls` for the session the gateway terminated, none for
    // the one it passed through (nginx saw no TLS of its own there).
    let entries = json_lines(&log_path, 2).await;
    let by_route = |name: &str| {
        entries
            .iter()
            .find(|e| e["route"]["name"] == name)
            .unwrap_or_else(|| panic!("{name}: {entries:?}"))
    };
    let db = &by_route("db")["session"];
    assert_eq!(db["tls"]["version"], "TLSv1.3", "{db}");
    assert!(
        db["tls"]["cipher"].as_str().unwrap().starts_with("TLS_"),
        "{db}"
    );
    assert_eq!(db["tls"]["client_verify"], "NONE", "{db}");
    assert!(by_route("pass")["session"].get("tls").is_none());
    // A name no route has, and bytes that are not TLS: closed.
    assert!(tls_exchange(at, "unknown.test", b"x").await.is_none());
    let mut s = TcpStream::connect(at).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let n = tokio::time::timeout(std::time::Duration::from_secs(5), s.read_to_end(&mut buf))
        .await
        .expect("closed");
    assert_eq!(n.unwrap_or(0), 0);
    // Bad input: a ClientHello without SNI (a client that names the server by address) is
    // closed with a log line; the listener keeps serving.
    assert!(tls_exchange(at, "127.0.0.1", b"x").await.is_none());
    let (back, _) = tls_exchange(at, "pass.test", b"still here")
        .await
        .expect("pass.test after the bad input");
    assert_eq!(back, b"still here");
    let log = gw.log_text();
    assert!(log.contains("sni unknown.test"), "{log}");
    assert!(log.contains("no sni"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
}

/// nginx's `proxy_timeout` as Kong sets it from the service's timeouts: a stream on which
/// nothing moves for that long is closed; one that keeps moving stays open past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_streams_close_after_the_services_timeout() {
    let echo = tcp_server(None).await;
    let port = free_port();
    let doc = json!({
        "_format_version": "3.0",
        "services": [{"name": "s", "url": format!("tcp://{echo}"),
                      "read_timeout": 1000, "write_timeout": 1000, "routes": [
            {"name": "r", "protocols": ["tcp"], "destinations": [{"port": port}]},
        ]}],
    });
    let _gw = Gateway::with_config(&doc.to_string())
        .env("TURNPIKE_STREAM_LISTEN", &format!("127.0.0.1:{port}"))
        .start();
    let at = SocketAddr::from(([127, 0, 0, 1], port));
    listening(at).await;
    // Busy for 2 s (twice the timeout), a message every 100 ms: still open.
    let mut busy = TcpStream::connect(at).await.unwrap();
    let mut buf = [0u8; 4];
    for _ in 0..20 {
        busy.write_all(b"ping").await.unwrap();
        busy.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // Idle: closed by the gateway within a few timeouts.
    let mut idle = TcpStream::connect(at).await.unwrap();
    idle.write_all(b"once").await.unwrap();
    idle.read_exact(&mut buf).await.unwrap();
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        idle.read_to_end(&mut rest),
    )
    .await;
    assert!(matches!(closed, Ok(Ok(0)) | Ok(Err(_))), "{closed:?}");
}

/// UDP streams: a session per client address, answers back from the listener's address, a
/// session idle past the service's timeout ended (the next datagram opens a new one), and a
/// client no route takes dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_datagrams_are_proxied_by_client_session() {
    use tokio::net::UdpSocket;
    // The upstream echoes each datagram prefixed with the address it came from.
    let echo = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let echo_addr = echo.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = [0u8; 2048];
        loop {
            let Ok((n, from)) = echo.recv_from(&mut buf).await else {
                return;
            };
            let mut out = format!("{from}|").into_bytes();
            out.extend_from_slice(&buf[..n]);
            let _ = echo.send_to(&out, from).await;
        }
    });
    let (port, unrouted) = (free_port(), free_port());
    let doc = json!({
        "_format_version": "3.0",
        "services": [{"name": "dns", "url": format!("udp://{echo_addr}"),
                      "read_timeout": 500, "write_timeout": 500, "routes": [
            {"name": "r", "protocols": ["udp"], "destinations": [{"port": port}]},
        ]}],
    });
    let gw = Gateway::with_config(&doc.to_string())
        .env(
            "TURNPIKE_STREAM_LISTEN",
            &format!("127.0.0.1:{port} udp reuseport, 127.0.0.1:{unrouted} udp"),
        )
        .start();
    let at = SocketAddr::from(([127, 0, 0, 1], port));
    let ask = |c: std::sync::Arc<UdpSocket>, to: SocketAddr, msg: &'static str| async move {
        c.send_to(msg.as_bytes(), to).await.unwrap();
        let mut buf = [0u8; 2048];
        let (n, from) =
            tokio::time::timeout(std::time::Duration::from_secs(2), c.recv_from(&mut buf))
                .await
                .ok()?
                .ok()?;
        assert_eq!(from, to, "the answer comes from the listener's address");
        let text = String::from_utf8_lossy(&buf[..n]).to_string();
        let (src, body) = text.split_once('|').unwrap();
        Some((src.to_string(), body.to_string()))
    };
    let a = std::sync::Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap());
    let b = std::sync::Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap());
    // The listener may take a moment to come up.
    let mut first = None;
    for _ in 0..50 {
        first = ask(a.clone(), at, "a1").await;
        if first.is_some() {
            break;
        }
    }
    let (a_src, body) = first.expect("an answer through the gateway");
    assert_eq!(body, "a1");
    // Each client is its own session (its own upstream source), kept across datagrams.
    let (a_src2, body) = ask(a.clone(), at, "a2").await.unwrap();
    assert_eq!((a_src2.as_str(), body.as_str()), (a_src.as_str(), "a2"));
    let (b_src, body) = ask(b.clone(), at, "b1").await.unwrap();
    assert_eq!(body, "b1");
    assert_ne!(b_src, a_src);
    // Idle past the service's timeout: the session ended; the next datagram opens another.
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    let (a_src3, body) = ask(a.clone(), at, "a3").await.unwrap();
    assert_eq!(body, "a3");
    assert_ne!(a_src3, a_src, "a new session after the idle timeout");
    // No route for that listener: nothing comes back.
    let unrouted_at = SocketAddr::from(([127, 0, 0, 1], unrouted));
    assert!(ask(a.clone(), unrouted_at, "x").await.is_none());
    assert!(gw.log_text().contains("udp client"), "{}", gw.log_text());
    assert!(!gw.log_text().contains("panicked"));
}

/// `router_flavor = expressions` on the stream listeners: `tcp` routes matched by their
/// `expression` over `net.*` (by `priority`, an expression route above a translated
/// traditional one), `tls` routes by `tls.sni`, `tls_passthrough` routed on the ClientHello,
/// and a connection no expression takes closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expression_stream_routes_are_matched_by_the_expressions_flavor() {
    let echo = tcp_server(None).await;
    let source = tcp_server(Some(5)).await;
    let (up_cert, up_key) = cert_for("pass.test");
    let tls_echo = tls_echo_server(&up_cert, &up_key).await;
    let (db_cert, db_key) = cert_for("db.test");
    let (tcp_port, other_port, tls_port) = (free_port(), free_port(), free_port());
    let doc = json!({
        "_format_version": "3.0",
        "services": [
            {"name": "echo", "url": format!("tcp://{echo}"), "routes": [
                {"name": "any-port", "protocols": ["tcp"], "priority": 1,
                 "expression": format!("net.dst.port == {tcp_port} || net.dst.port == {other_port}")},
                {"name": "db", "protocols": ["tls"],
                 "expression": "tls.sni == \"db.test\""},
            ]},
            {"name": "source", "url": format!("tcp://{source}"), "routes": [
                // Above any-port for loopback clients on tcp_port only.
                {"name": "loopback", "protocols": ["tcp"], "priority": 10,
                 "expression": format!("net.dst.port == {tcp_port} && net.src.ip in 127.0.0.0/8")},
            ]},
            {"name": "raw", "url": format!("tcp://{tls_echo}"), "routes": [
                {"name": "pass", "protocols": ["tls_passthrough"],
                 "expression": "tls.sni =^ \".pass.test\" || tls.sni == \"pass.test\""},
            ]},
        ],
        "certificates": [
            {"cert": db_cert, "key": db_key, "snis": [{"name": "db.test"}]},
        ],
    });
    let gw = Gateway::with_config(&doc.to_string())
        .env("TURNPIKE_ROUTER_FLAVOR", "expressions")
        .env(
            "TURNPIKE_STREAM_LISTEN",
            &format!("127.0.0.1:{tcp_port}, 127.0.0.1:{other_port}, 127.0.0.1:{tls_port} ssl"),
        )
        .start();
    let at = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));
    for port in [tcp_port, other_port, tls_port] {
        listening(at(port)).await;
    }
    let exchange = |port: u16, msg: &'static [u8]| tcp_exchange(at(port), msg);
    // priority 10 takes loopback clients on tcp_port: the source answers 5 bytes of 7.
    assert_eq!(exchange(tcp_port, b"hello").await, vec![7u8; 5]);
    // On the other port only the priority-1 route matches: the echo.
    assert_eq!(exchange(other_port, b"hello").await, b"hello");
    // TLS: terminated for db.test by its expression, passed through for *.pass.test.
    let der = |pem: &str| pem_certs(pem)[0].to_vec();
    let (back, cert) = tls_exchange(at(tls_port), "db.test", b"select 1")
        .await
        .expect("db.test");
    assert_eq!((back.as_slice(), cert), (&b"select 1"[..], der(&db_cert)));
    let (back, cert) = tls_exchange(at(tls_port), "a.pass.test", b"end to end")
        .await
        .expect("a.pass.test");
    assert_eq!((back.as_slice(), cert), (&b"end to end"[..], der(&up_cert)));
    // No expression takes this name.
    assert!(tls_exchange(at(tls_port), "other.test", b"x")
        .await
        .is_none());
    let log = gw.log_text();
    assert!(log.contains("sni other.test"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
}

/// The same through the Admin API on a database: a stream expression route added at run
/// time takes connections, and a PATCH of its expression moves them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expression_stream_routes_through_the_admin_api() {
    let echo = tcp_server(None).await;
    let source = tcp_server(Some(3)).await;
    let port = free_port();
    let gw = Gateway::sqlite()
        .env("KONG_ROUTER_FLAVOR", "expressions")
        .env("TURNPIKE_STREAM_LISTEN", &format!("127.0.0.1:{port}"))
        .start();
    let at = SocketAddr::from(([127, 0, 0, 1], port));
    listening(at).await;
    for (name, url) in [
        ("echo", format!("tcp://{echo}")),
        ("source", format!("tcp://{source}")),
    ] {
        let r = gw
            .admin("POST", "/services", Some(json!({"name": name, "url": url})))
            .await;
        assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    }
    let r = gw
        .admin(
            "POST",
            "/services/echo/routes",
            Some(json!({"name": "e", "protocols": ["tcp"],
                        "expression": format!("net.dst.port == {port}")})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let r = gw
        .admin(
            "POST",
            "/services/source/routes",
            Some(json!({"name": "s", "protocols": ["tcp"], "priority": 2,
                        "expression": "net.src.ip == 192.0.2.1"})),
        )
        .await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    // Kong's message for an http field on a stream route.
    let r = gw
        .admin(
            "POST",
            "/services/echo/routes",
            Some(json!({"protocols": ["tcp"], "expression": "http.path == \"/\""})),
        )
        .await;
    assert_eq!(r.status, 400);
    assert!(
        String::from_utf8_lossy(&r.body).contains("Unknown LHS field"),
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    let exchange = || tcp_exchange(at, b"ping");
    let echoed = eventually(std::time::Duration::from_secs(10), async || {
        exchange().await == b"ping"
    })
    .await;
    assert!(echoed, "the echo route takes the connection");
    // The source route now takes every loopback client, above the echo's priority 0.
    let r = gw
        .admin(
            "PATCH",
            "/routes/s",
            Some(json!({"expression": "net.src.ip in 127.0.0.0/8"})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let moved = eventually(std::time::Duration::from_secs(10), async || {
        exchange().await == vec![7u8; 3]
    })
    .await;
    assert!(moved, "the patched route takes the connection");
    assert!(!gw.log_text().contains("panicked"));
}
