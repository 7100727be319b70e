//! Kong's `request_buffering` (the route default) and nginx's client body limits: a body is
//! read whole before an upstream is chosen and connected to, in bounded memory (a file past
//! `client_body_buffer_size`), refused past `client_max_body_size`, and cut by the body
//! timeout; slow or abandoning clients cost the upstream nothing.

use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::*;

fn config(up: &Upstream) -> String {
    format!(
        "_format_version: '3.0'\nservices: [{{name: s, url: '{}', routes: [{{name: buffered, paths: [/b]}}, {{name: streamed, paths: [/s], request_buffering: false}}]}}]\n",
        up.url()
    )
}

async fn read_all(s: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).to_string()
}

/// Slow clients that send part of a body and give up: with buffering, no upstream connection
/// is opened while they trickle, and the upstream never receives their cut-off requests.
/// Without it (request_buffering: false), each one holds an upstream request open.
#[tokio::test(flavor = "multi_thread")]
async fn slow_and_abandoned_bodies_never_reach_the_upstream() {
    let up = Upstream::start("buffered");
    let gw = Gateway::with_config(&config(&up)).start();
    const CLIENTS: usize = 50;
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let mut s = TcpStream::connect(gw.proxy).await.unwrap();
        s.write_all(b"POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nfirst bytes")
            .await
            .unwrap();
        clients.push(s);
    }
    for s in &mut clients {
        s.write_all(b" and a few more").await.unwrap();
    }
    // Give the gateway every chance to (wrongly) forward what it has.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        up.connections.load(SeqCst),
        0,
        "upstream connections opened"
    );
    drop(clients);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        up.connections.load(SeqCst),
        0,
        "abandoned bodies reached the upstream"
    );

    // A slow client that finishes gets its whole body through.
    let mut s = TcpStream::connect(gw.proxy).await.unwrap();
    s.write_all(b"POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    for piece in [&b"ab"[..], b"cd", b"ef"] {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(
            up.connections.load(SeqCst),
            0,
            "connected before the body was whole"
        );
        s.write_all(piece).await.unwrap();
    }
    let out = read_all(&mut s).await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(out.contains("\"body_len\":6"), "{out}");

    // The same slow client on a streaming route (its own upstream, so that no pooled
    // connection hides the new request) opens the upstream request at once.
    let up2 = Upstream::start("streamed");
    let gw2 = Gateway::with_config(&config(&up2)).start();
    let mut s = TcpStream::connect(gw2.proxy).await.unwrap();
    s.write_all(b"POST /s HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\n\r\nab")
        .await
        .unwrap();
    assert!(
        eventually(Duration::from_secs(10), async || up2
            .connections
            .load(SeqCst)
            > 0)
        .await,
        "request_buffering: false streams"
    );
}

/// Bodies past client_body_buffer_size go through a temporary file and arrive whole; bodies
/// past client_max_body_size get 413 (declared or found while reading, chunked too), and the
/// upstream sees nothing of them.
#[tokio::test(flavor = "multi_thread")]
async fn body_size_limits_and_temporary_files() {
    let up = Upstream::start("limits");
    let gw = Gateway::with_config(&config(&up))
        .env("TURNPIKE_NGINX_HTTP_CLIENT_MAX_BODY_SIZE", "1m")
        .env("TURNPIKE_NGINX_HTTP_CLIENT_BODY_BUFFER_SIZE", "4k")
        .start();
    // 900 KiB chunked, in odd pieces: spooled (4 KiB in memory, the rest in a file) and sent
    // with its length.
    let body: Vec<u8> = (0..900 * 1024).map(|i| (i % 251) as u8).collect();
    let mut wire =
        b"POST /b HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            .to_vec();
    for c in body.chunks(3001) {
        wire.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
        wire.extend_from_slice(c);
        wire.extend_from_slice(b"\r\n");
    }
    wire.extend_from_slice(b"0\r\n\r\n");
    let mut s = TcpStream::connect(gw.proxy).await.unwrap();
    s.write_all(&wire).await.unwrap();
    let out = read_all(&mut s).await;
    let sum = body
        .iter()
        .fold(0u64, |a, b| a.wrapping_mul(31).wrapping_add(*b as u64));
    assert!(
        out.starts_with("HTTP/1.1 200"),
        "{}",
        &out[..out.len().min(300)]
    );
    assert!(
        out.contains(&format!("\"body_len\":{}", body.len())),
        "{out}"
    );
    assert!(out.contains(&format!("\"body_sum\":{sum}")), "{out}");
    assert!(out.contains("\"content-length\":\"921600\""), "{out}");
    // The temporary files live under the prefix, and are gone once sent.
    let temp = gw.dir.path().join("prefix/client_body_temp");
    assert!(temp.is_dir(), "{temp:?}");
    assert_eq!(std::fs::read_dir(&temp).unwrap().count(), 0);

    let connections = up.connections.load(SeqCst);
    // Declared too large: refused before a byte of the body is read.
    let mut s = TcpStream::connect(gw.proxy).await.unwrap();
    s.write_all(
        b"POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 2000000\r\nExpect: 100-continue\r\n\r\n",
    )
    .await
    .unwrap();
    let out = read_all(&mut s).await;
    assert!(out.starts_with("HTTP/1.1 413"), "{out}");
    assert!(!out.contains("100 Continue"), "{out}");
    assert!(out.contains("\"message\":\"Payload too large\""), "{out}");
    // Found too large while reading (chunked), on both kinds of route.
    for path in ["/b", "/s"] {
        let mut s = TcpStream::connect(gw.proxy).await.unwrap();
        let mut wire = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        )
        .into_bytes();
        let piece = vec![b'z'; 64 * 1024];
        for _ in 0..20 {
            wire.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
            wire.extend_from_slice(&piece);
            wire.extend_from_slice(b"\r\n");
        }
        wire.extend_from_slice(b"0\r\n\r\n");
        let _ = s.write_all(&wire).await;
        let out = read_all(&mut s).await;
        assert!(out.starts_with("HTTP/1.1 413"), "{path}: {out}");
    }
    // The buffered route never reached the upstream with a too-large body.
    assert!(up.connections.load(SeqCst) <= connections + 1);
}

/// A buffered body that stalls past client_body_timeout gets 408, and the upstream nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_stalled_buffered_body_gets_408_and_no_upstream_request() {
    let up = Upstream::start("stalled");
    let gw = Gateway::with_config(&config(&up))
        .env("TURNPIKE_NGINX_HTTP_CLIENT_BODY_TIMEOUT", "1s")
        .start();
    let mut s = TcpStream::connect(gw.proxy).await.unwrap();
    s.write_all(b"POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc")
        .await
        .unwrap();
    let out = read_all(&mut s).await;
    assert!(out.starts_with("HTTP/1.1 408"), "{out}");
    assert!(out.contains("\"message\":\"Request timeout\""), "{out}");
    assert_eq!(up.connections.load(SeqCst), 0);
}
