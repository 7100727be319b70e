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
        assert!(
            eventually(std::time::Duration::from_secs(10), async || {
                TcpStream::connect(at(port)).await.is_ok()
            })
            .await
        );
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

/// Kong's `stream_listen` syntax: flags it does not serve yet are refused at start, with why.
#[test]
fn stream_listen_refuses_what_it_does_not_serve() {
    for (value, expect) in [
        (
            "127.0.0.1:7000 ssl",
            "'ssl' stream listeners are not supported yet",
        ),
        (
            "127.0.0.1:7000 udp",
            "'udp' listeners are not supported yet",
        ),
        ("127.0.0.1:7000 http2", "unknown listen flag 'http2'"),
    ] {
        let (ok, out) = run(&["doctor"], &[("TURNPIKE_STREAM_LISTEN", value)]);
        assert!(!ok, "{value}: {out}");
        assert!(out.contains(expect), "{value}: {out}");
    }
}
