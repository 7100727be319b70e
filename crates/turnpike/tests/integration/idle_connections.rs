//! Idle keep-alive connections: what each one costs the gateway in memory, and that a
//! connection which has given back its request-path state (after `ACTIVE_LINGER`, 1 s) still
//! serves requests, including a head that arrives in pieces around that moment.

use crate::common::*;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn config(up: &Upstream) -> String {
    format!(
        "_format_version: '3.0'\nservices: [{{name: s, url: '{}', routes: [{{paths: [/]}}]}}]\n",
        up.url()
    )
}

/// Reads one response with a Content-Length body (the test upstream's `/sized` path).
async fn read_response(s: &mut TcpStream) -> String {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut chunk))
            .await
            .expect("a response within 10 s")
            .unwrap();
        assert!(
            n > 0,
            "closed mid-response: {}",
            String::from_utf8_lossy(&buf)
        );
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf).to_string();
        if let Some(end) = text.find("\r\n\r\n") {
            let len = text[..end]
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse::<usize>().unwrap())
                })
                .expect("content-length");
            if buf.len() >= end + 4 + len {
                return text;
            }
        }
    }
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// A thousand keep-alive connections that each made a request and then went quiet cost the
/// gateway under 3 KiB each (measured ~1.5 KiB in this debug build, 1.3 KiB in a release
/// build; nginx: ~0.5 KiB). Before the connection's task stopped keeping room for a TLS stream,
/// a request head and its own arguments twice, and the Kong headers' slot moved from the
/// connection to the worker: ~4.2 KiB in this debug build, 3.9 KiB in a release build; before the request path's state was boxed and the read and
/// write buffers were freed or pooled while idle: ~19 KiB in this debug build, ~18.7 KiB in a
/// release build (`bench/idle-connections.sh`). Freed memory is returned to the system at once
/// (`MIMALLOC_PURGE_DELAY=0`), so RSS shows what the idle connections hold, not what the
/// allocator keeps for later.
#[tokio::test(flavor = "multi_thread")]
async fn idle_keepalive_connections_hold_little_memory() {
    let up = Upstream::start("one");
    let gw = Gateway::with_config(&config(&up))
        .env("MIMALLOC_PURGE_DELAY", "0")
        .start();
    let pid = gw.pid();
    // Warm up (the first request builds per-worker state: pools, tables).
    for _ in 0..20 {
        let mut s = TcpStream::connect(gw.proxy).await.unwrap();
        s.write_all(b"GET /sized HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        read_response(&mut s).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = rss_kib(pid);
    const N: usize = 1000;
    let mut conns = Vec::with_capacity(N);
    for _ in 0..N {
        let mut s = TcpStream::connect(gw.proxy).await.unwrap();
        s.write_all(b"GET /sized HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let r = read_response(&mut s).await;
        assert!(r.starts_with("HTTP/1.1 200"), "{r}");
        conns.push(s);
    }
    // Past the linger (1 s) and a deadline tick: every connection is idle.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let after = rss_kib(pid);
    let per_conn = after.saturating_sub(before) * 1024 / N as u64;
    eprintln!("RSS {before} KiB -> {after} KiB: {per_conn} bytes per idle connection");
    assert!(
        per_conn < 3 * 1024,
        "{per_conn} bytes per idle keep-alive connection"
    );
    // They are all still open and usable.
    for s in conns.iter_mut().step_by(100) {
        s.write_all(b"GET /sized HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let r = read_response(s).await;
        assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    }
}

/// A connection goes quiet between requests and back; a request head that arrives in two
/// pieces across that moment is still read whole, and a client that never finishes its head
/// is still closed by the keep-alive timeout.
#[tokio::test(flavor = "multi_thread")]
async fn connections_serve_requests_across_the_linger() {
    let up = Upstream::start("one");
    let gw = Gateway::with_config(&config(&up))
        .env("TURNPIKE_NGINX_HTTP_KEEPALIVE_TIMEOUT", "4s")
        .start();
    let mut s = TcpStream::connect(gw.proxy).await.unwrap();
    for pause_ms in [0u64, 1500, 200, 1500] {
        tokio::time::sleep(Duration::from_millis(pause_ms)).await;
        s.write_all(b"GET /sized HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let r = read_response(&mut s).await;
        assert!(r.starts_with("HTTP/1.1 200"), "after {pause_ms} ms: {r}");
    }
    // Half a head, a pause past the linger, the rest.
    s.write_all(b"GET /sized HTTP/1.1\r\nHo").await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    s.write_all(b"st: x\r\n\r\n").await.unwrap();
    let r = read_response(&mut s).await;
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    // An unfinished head is still closed by the keep-alive timeout (4 s): the linger hands
    // the connection back instead of ending it, and the timeout still applies there. (That the
    // linger's end does not close it is shown above: the split head was answered.)
    s.write_all(b"GET /sized HTTP/1.1\r\n").await.unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(15), s.read_to_end(&mut rest))
        .await
        .expect("closed by the keep-alive timeout")
        .unwrap();
    assert!(
        rest.is_empty(),
        "no response to an unfinished head: {rest:?}"
    );
    assert!(!gw.log_text().contains("panicked"), "{}", gw.log_text());
}
