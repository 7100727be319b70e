//! Differential conformance against nginx: the same raw requests go through Turnpike and
//! through nginx (the reference, configured as Kong configures it: HTTP/1.1 upstream
//! keepalive, request and response buffering on, no body size limit), both in front of one raw
//! upstream started here. What the client receives (status, decoded body bytes, framing, the
//! upstream's end-to-end headers) and what the upstream receives (method, target, body bytes)
//! must agree, case by case. Where Turnpike differs from nginx on purpose, the case says why.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::common::{free_port, Gateway};

// ---------------------------------------------------------------------------------------------
// The upstream: raw HTTP/1.1, so that it can answer with every framing a real server uses
// (including close-delimited bodies, trailers, 1xx and an early close, which hyper won't send).

mod servers;

use servers::*;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Framing {
    Length,
    Chunked,
    Close,
    None,
}

#[derive(Debug, Clone)]
struct Got {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    framing: Framing,
    /// The body ended before its framing said it would (truncated).
    incomplete: bool,
}

/// Parses responses from `raw` (everything one connection sent, to its close). `head` marks
/// which responses answer HEAD requests (no body whatever the headers say).
fn parse_responses(raw: &[u8], head: &[bool]) -> Vec<Got> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < raw.len() {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut resp = httparse::Response::new(&mut headers);
        let n = match resp.parse(&raw[at..]) {
            Ok(httparse::Status::Complete(n)) => n,
            _ => break,
        };
        let status = resp.code.unwrap();
        let hs: Vec<(String, String)> = resp
            .headers
            .iter()
            .map(|h| {
                (
                    h.name.to_ascii_lowercase(),
                    String::from_utf8_lossy(h.value).to_string(),
                )
            })
            .collect();
        at += n;
        if (100..200).contains(&status) {
            out.push(Got {
                status,
                headers: hs,
                body: Vec::new(),
                framing: Framing::None,
                incomplete: false,
            });
            continue;
        }
        let is_head =
            head.get(out.iter().filter(|g: &&Got| g.status >= 200).count()) == Some(&true);
        let get = |k: &str| hs.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        let mut got = Got {
            status,
            headers: hs.clone(),
            body: Vec::new(),
            framing: Framing::None,
            incomplete: false,
        };
        if is_head || status == 204 || status == 304 {
        } else if get("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
            got.framing = Framing::Chunked;
            loop {
                let Some(i) = raw[at..].windows(2).position(|w| w == b"\r\n") else {
                    got.incomplete = true;
                    at = raw.len();
                    break;
                };
                let line = std::str::from_utf8(&raw[at..at + i]).unwrap_or("x");
                let size = usize::from_str_radix(line.split(';').next().unwrap().trim(), 16);
                at += i + 2;
                match size {
                    Ok(0) => {
                        // Trailers end at a blank line.
                        match raw[at..].windows(2).position(|w| w == b"\r\n") {
                            Some(0) => at += 2,
                            _ => match raw[at..].windows(4).position(|w| w == b"\r\n\r\n") {
                                Some(j) => at += j + 4,
                                None => got.incomplete = true,
                            },
                        }
                        break;
                    }
                    Ok(size) if at + size + 2 <= raw.len() => {
                        got.body.extend_from_slice(&raw[at..at + size]);
                        at += size + 2;
                    }
                    _ => {
                        got.body.extend_from_slice(&raw[at.min(raw.len())..]);
                        got.incomplete = true;
                        at = raw.len();
                        break;
                    }
                }
            }
        } else if let Some(len) = get("content-length") {
            got.framing = Framing::Length;
            let len: usize = len.trim().parse().unwrap();
            let end = (at + len).min(raw.len());
            got.body.extend_from_slice(&raw[at..end]);
            got.incomplete = end - at < len;
            at = end;
        } else {
            got.framing = Framing::Close;
            got.body.extend_from_slice(&raw[at..]);
            at = raw.len();
        }
        out.push(got);
    }
    out
}

/// One client connection: writes `parts` in turn (`Pause` between them), then reads to the
/// end of the connection (or `limit`).
#[derive(Clone)]
enum Part {
    Bytes(Vec<u8>),
    Pause(Duration),
    /// Waits for an interim `100 Continue` before the next part (a client honouring Expect).
    AwaitContinue,
}

async fn exchange(addr: SocketAddr, parts: &[Part], slow_reader: bool) -> (Vec<u8>, bool) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut got = Vec::new();
    for p in parts {
        match p {
            Part::Bytes(b) => s.write_all(b).await.unwrap(),
            Part::Pause(d) => tokio::time::sleep(*d).await,
            Part::AwaitContinue => {
                let mut chunk = [0u8; 4096];
                let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
                while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tokio::time::timeout_at(deadline, s.read(&mut chunk)).await {
                        Ok(Ok(n)) if n > 0 => got.extend_from_slice(&chunk[..n]),
                        _ => break,
                    }
                }
            }
        }
    }
    let mut chunk = vec![0u8; if slow_reader { 1024 } else { 65536 }];
    let read_all = async {
        loop {
            match s.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&chunk[..n]),
            }
            if slow_reader {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    };
    let closed = tokio::time::timeout(Duration::from_secs(20), read_all)
        .await
        .is_ok();
    (got, closed)
}

/// A case: what the client sends, which responses answer HEAD, and how Turnpike may differ.
struct Case {
    name: &'static str,
    parts: Vec<Part>,
    head: Vec<bool>,
    slow_reader: bool,
    /// Where nginx is no reference: why, and the final responses Turnpike must give instead
    /// (as `summary` shows them).
    not_nginx: Option<(&'static str, &'static [&'static str])>,
}

fn case(name: &'static str, parts: Vec<Part>) -> Case {
    Case {
        name,
        parts,
        head: Vec::new(),
        slow_reader: false,
        not_nginx: None,
    }
}

fn b(s: &str) -> Part {
    Part::Bytes(s.as_bytes().to_vec())
}

fn post(version: &str, extra: &str, body: &[u8]) -> Vec<u8> {
    let mut v = format!(
        "POST /echo HTTP/{version}\r\nHost: h.example\r\nContent-Length: {}\r\n{extra}\r\n",
        body.len()
    )
    .into_bytes();
    v.extend_from_slice(body);
    v
}

fn chunked_body(body: &[u8], size: usize) -> Vec<u8> {
    let mut v = Vec::new();
    for c in body.chunks(size) {
        v.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
        v.extend_from_slice(c);
        v.extend_from_slice(b"\r\n");
    }
    v.extend_from_slice(b"0\r\n\r\n");
    v
}

fn cases() -> Vec<Case> {
    let big = pattern(100_000);
    let ten_mb = pattern(10 << 20);
    let mut cs = vec![
        case("1.0 length", vec![b("GET /len/100000 HTTP/1.0\r\nHost: h.example\r\n\r\n")]),
        case("1.0 chunked upstream", vec![b("GET /chunked/100000 HTTP/1.0\r\nHost: h.example\r\n\r\n")]),
        case("1.0 close-delimited upstream", vec![b("GET /close/100000 HTTP/1.0\r\nHost: h.example\r\n\r\n")]),
        case("1.0 keep-alive then close", vec![b("GET /len/30000 HTTP/1.0\r\nHost: h.example\r\nConnection: keep-alive\r\n\r\nGET /len/20000 HTTP/1.0\r\nHost: h.example\r\n\r\n")]),
        case("1.1 close, length", vec![b("GET /len/100000 HTTP/1.1\r\nHost: h.example\r\nConnection: close\r\n\r\n")]),
        case("1.1 close, chunked upstream", vec![b("GET /chunked/100000 HTTP/1.1\r\nHost: h.example\r\nConnection: close\r\n\r\n")]),
        case("1.1 close-delimited upstream", vec![b("GET /close/100000 HTTP/1.1\r\nHost: h.example\r\nConnection: close\r\n\r\n")]),
        case("1.1 trailers", vec![b("GET /trailers/50000 HTTP/1.1\r\nHost: h.example\r\nConnection: close\r\n\r\n")]),
        Case {
            not_nginx: Some((
                "nginx 1.22 cannot read an upstream's interim responses: it answers nothing \
                 until proxy_read_timeout; the 1xx belong to the upstream's hop and the final \
                 response is what the client gets",
                &["200 Length 3000 bytes"],
            )),
            ..case("1.1 interim 1xx from upstream", vec![b("GET /interim/3000 HTTP/1.1\r\nHost: h.example\r\nConnection: close\r\n\r\n")])
        },
        case("1.1 204 and 304", vec![b("GET /204 HTTP/1.1\r\nHost: h.example\r\n\r\nGET /304 HTTP/1.1\r\nHost: h.example\r\nConnection: close\r\n\r\n")]),
        case("1.1 upstream closes early", vec![b("GET /early/100000 HTTP/1.1\r\nHost: h.example\r\nConnection: close\r\n\r\n")]),
        case(
            "absolute-form target with another Host",
            vec![b("GET http://abs.example/len/10 HTTP/1.1\r\nHost: other.example\r\nConnection: close\r\n\r\n")],
        ),
        case(
            "1.1 pipelined",
            vec![b("GET /len/10 HTTP/1.1\r\nHost: h.example\r\n\r\nGET /chunked/40000 HTTP/1.1\r\nHost: h.example\r\n\r\nGET /len/70000 HTTP/1.1\r\nHost: h.example\r\nConnection: close\r\n\r\n")],
        ),
    ];
    cs.push(Case {
        name: "HEAD",
        parts: vec![b("HEAD /len/1000 HTTP/1.1\r\nHost: h.example\r\n\r\nHEAD /chunked/1000 HTTP/1.1\r\nHost: h.example\r\nConnection: close\r\n\r\n")],
        head: vec![true, true],
        slow_reader: false,
        not_nginx: None,
    });
    cs.push(Case {
        name: "slow reader, 1 MB",
        parts: vec![b(
            "GET /len/1000000 HTTP/1.1\r\nHost: h.example\r\nConnection: close\r\n\r\n",
        )],
        head: Vec::new(),
        slow_reader: true,
        not_nginx: None,
    });
    for n in [0usize, 1, 100_000] {
        cs.push(case(
            ["POST length 0", "POST length 1", "POST length 100000"]
                [(n > 0) as usize + (n > 1) as usize],
            vec![Part::Bytes(post("1.1", "Connection: close\r\n", &big[..n]))],
        ));
    }
    cs.push(case(
        "POST 1.0 length 100000",
        vec![Part::Bytes(post("1.0", "", &big))],
    ));
    cs.push(case(
        "POST length 10 MB",
        vec![Part::Bytes(post("1.1", "Connection: close\r\n", &ten_mb))],
    ));
    let mut chunked = b"POST /echo HTTP/1.1\r\nHost: h.example\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n".to_vec();
    chunked.extend_from_slice(&chunked_body(&big, 3000));
    cs.push(case("POST chunked 100000", vec![Part::Bytes(chunked)]));
    let mut chunked0 = b"POST /echo HTTP/1.1\r\nHost: h.example\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n".to_vec();
    chunked0.extend_from_slice(b"0\r\n\r\n");
    cs.push(case("POST chunked empty", vec![Part::Bytes(chunked0)]));
    let head = format!(
        "POST /echo HTTP/1.1\r\nHost: h.example\r\nContent-Length: {}\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n",
        big.len()
    );
    cs.push(case(
        "POST Expect: 100-continue",
        vec![b(&head), Part::AwaitContinue, Part::Bytes(big.clone())],
    ));
    let mut slow = vec![b("POST /echo HTTP/1.1\r\nHost: h.example\r\nContent-Length: 3000\r\nConnection: close\r\n\r\n")];
    for c in big[..3000].chunks(1000) {
        slow.push(Part::Pause(Duration::from_millis(150)));
        slow.push(Part::Bytes(c.to_vec()));
    }
    cs.push(case("POST slow writer", slow));
    cs.push(case(
        "keep-alive POSTs",
        vec![
            Part::Bytes(post("1.1", "", &big[..5000])),
            Part::Bytes(post("1.1", "Connection: close\r\n", &big[..7000])),
        ],
    ));
    cs
}

/// The upstream's headers that reach the client unchanged (not Kong's, not framing).
fn end_to_end(g: &Got) -> Vec<(String, String)> {
    let mut v: Vec<_> = g
        .headers
        .iter()
        .filter(|(k, _)| matches!(k.as_str(), "x-up" | "content-type" | "etag" | "link"))
        .cloned()
        .collect();
    v.sort();
    v
}

fn summary(g: &Got) -> String {
    format!(
        "{} {:?}{} {} bytes",
        g.status,
        g.framing,
        if g.incomplete { " incomplete" } else { "" },
        g.body.len()
    )
}

/// The raw upstream, nginx in front of it, and Turnpike in front of it with one route that
/// keeps the client's Host (so both proxies send the upstream the same one).
fn beside_nginx() -> (RawUpstream, Nginx, Gateway) {
    let up = RawUpstream::start();
    let nginx = Nginx::start(up.addr);
    let gw = Gateway::with_config(&format!(
        "_format_version: '3.0'\nservices: [{{name: s, url: 'http://{}', routes: [{{paths: [/], preserve_host: true}}]}}]\n",
        up.addr
    ))
    .start();
    (up, nginx, gw)
}

#[tokio::test(flavor = "multi_thread")]
async fn conformance_with_nginx() {
    let (up, nginx, gw) = beside_nginx();
    let mut failures = Vec::new();
    for c in cases() {
        if let Some((_why, expected)) = c.not_nginx {
            let (raw, closed) = exchange(gw.proxy, &c.parts, c.slow_reader).await;
            up.log.take();
            let got: Vec<String> = parse_responses(&raw, &c.head)
                .iter()
                .filter(|g| g.status >= 200)
                .map(summary)
                .collect();
            if !closed || got != expected {
                failures.push(format!(
                    "{}: turnpike {got:?} (closed: {closed}), expected {expected:?}",
                    c.name
                ));
            }
            continue;
        }
        let (raw_ng, closed_ng) = exchange(nginx.addr, &c.parts, c.slow_reader).await;
        let seen_ng = up.log.take();
        let (raw_tp, closed_tp) = exchange(gw.proxy, &c.parts, c.slow_reader).await;
        let seen_tp = up.log.take();
        let ng = parse_responses(&raw_ng, &c.head);
        let tp = parse_responses(&raw_tp, &c.head);
        assert!(
            closed_ng,
            "{}: nginx did not close the connection: {:?}",
            c.name,
            String::from_utf8_lossy(&raw_ng[..raw_ng.len().min(600)])
        );
        // Interim responses: nginx forwards none; neither may we (the upstream's 1xx answer its
        // own hop). A client's Expect gets one 100 Continue from each proxy itself.
        let finals = |v: &[Got]| {
            v.iter()
                .filter(|g| g.status >= 200)
                .cloned()
                .collect::<Vec<_>>()
        };
        let (ngf, tpf) = (finals(&ng), finals(&tp));
        let mut diffs = Vec::new();
        if !closed_tp {
            diffs.push("the connection stayed open after the last response".to_string());
        }
        if ngf.len() != tpf.len() {
            diffs.push(format!(
                "responses: nginx {:?}, turnpike {:?}",
                ngf.iter().map(summary).collect::<Vec<_>>(),
                tpf.iter().map(summary).collect::<Vec<_>>()
            ));
        }
        for (i, (n, t)) in ngf.iter().zip(&tpf).enumerate() {
            if n.status != t.status
                || n.body != t.body
                || n.incomplete != t.incomplete
                || n.framing != t.framing
                || end_to_end(n) != end_to_end(t)
            {
                diffs.push(format!(
                    "response {i}: nginx {} {:?}, turnpike {} {:?}",
                    summary(n),
                    end_to_end(n),
                    summary(t),
                    end_to_end(t)
                ));
            }
        }
        // What the upstream received: same requests, same body bytes, same host.
        let key = |v: &[Received]| {
            v.iter()
                .map(|r| {
                    (
                        r.method.clone(),
                        r.target.clone(),
                        r.body.len(),
                        r.body.clone(),
                        r.host.clone(),
                    )
                })
                .collect::<Vec<_>>()
        };
        if key(&seen_ng) != key(&seen_tp) {
            let short = |v: &[Received]| {
                v.iter()
                    .map(|r| {
                        format!(
                            "{} {} {}B host={}",
                            r.method,
                            r.target,
                            r.body.len(),
                            r.host
                        )
                    })
                    .collect::<Vec<_>>()
            };
            diffs.push(format!(
                "upstream received: nginx {:?}, turnpike {:?}",
                short(&seen_ng),
                short(&seen_tp)
            ));
        }
        if !diffs.is_empty() {
            failures.push(format!("{}:\n  {}", c.name, diffs.join("\n  ")));
        }
    }
    assert!(
        failures.is_empty(),
        "differs from nginx:\n{}",
        failures.join("\n")
    );
}

/// Request heads nginx refuses with 400 are refused by Turnpike too, before anything reaches
/// the upstream; two equal Content-Length lines reach the upstream as one.
#[tokio::test(flavor = "multi_thread")]
async fn lenient_heads_are_refused_like_nginx() {
    let (up, nginx, gw) = beside_nginx();
    let refused = [
        ("two different Host headers", "GET /len/1 HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\n\r\n"),
        ("two equal Host headers", "GET /len/1 HTTP/1.1\r\nHost: a.example\r\nHost: a.example\r\n\r\n"),
        ("HTTP/1.1 without Host", "GET /len/1 HTTP/1.1\r\nX-A: b\r\n\r\n"),
        ("Host with a space and userinfo", "GET /len/1 HTTP/1.1\r\nHost: a b@c\r\n\r\n"),
        ("Host with a path", "GET /len/1 HTTP/1.1\r\nHost: a.example/evil\r\n\r\n"),
        ("empty Host", "GET /len/1 HTTP/1.1\r\nHost: \r\n\r\n"),
        ("differing Content-Length", "POST /echo HTTP/1.1\r\nHost: a.example\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab"),
    ];
    for (name, raw) in refused {
        for (who, addr) in [("nginx", nginx.addr), ("turnpike", gw.proxy)] {
            let (out, _) = exchange(addr, &[b(raw)], false).await;
            let got = parse_responses(&out, &[]);
            assert_eq!(
                got.first().map(|g| g.status),
                Some(400),
                "{who}, {name}: {}",
                String::from_utf8_lossy(&out)
            );
        }
        assert!(up.log.take().is_empty(), "{name}: reached the upstream");
    }
    // Stricter than nginx on purpose: a backslash is no character of a host and a port is
    // digits (RFC 3986); upstreams that read `\\` as a path separator, or parse the port, are
    // fooled by what nginx lets through.
    for host in ["a.example\\evil", "a.example:8x", "a.example:99999999"] {
        let raw = format!("GET /len/1 HTTP/1.1\r\nHost: {host}\r\n\r\n");
        let (out, _) = exchange(gw.proxy, &[b(&raw)], false).await;
        assert_eq!(parse_responses(&out, &[])[0].status, 400, "{host}");
    }
    // Turnpike's 400 is Kong's error body.
    let (out, _) = exchange(gw.proxy, &[b(refused[0].1)], false).await;
    let got = parse_responses(&out, &[]);
    assert!(
        String::from_utf8_lossy(&got[0].body).contains("\"message\":\"Bad request\""),
        "{}",
        String::from_utf8_lossy(&out)
    );
    // Accepted by both.
    let accepted = [
        "GET /len/1 HTTP/1.0\r\n\r\n",
        "GET /len/1 HTTP/1.1\r\nHost: [::1]:8000\r\nConnection: close\r\n\r\n",
        "GET /len/1 HTTP/1.1\r\nHost: Under_Score.example\r\nConnection: close\r\n\r\n",
    ];
    for raw in accepted {
        for (who, addr) in [("nginx", nginx.addr), ("turnpike", gw.proxy)] {
            let (out, _) = exchange(addr, &[b(raw)], false).await;
            let got = parse_responses(&out, &[]);
            assert_eq!(
                got.first().map(|g| g.status),
                Some(200),
                "{who}, {raw:?}: {out:?}"
            );
            assert_eq!(up.log.take().len(), 1, "{who}, {raw:?}");
        }
    }
    // Equal Content-Length lines are one length (RFC 9110 §8.6 lets a recipient take them as
    // one; nginx refuses them): the upstream gets one line, never two.
    let raw = "POST /echo HTTP/1.1\r\nHost: a.example\r\nContent-Length: 2\r\nContent-Length: 2\r\nConnection: close\r\n\r\nab";
    let (out, _) = exchange(gw.proxy, &[b(raw)], false).await;
    assert_eq!(parse_responses(&out, &[])[0].status, 200, "{out:?}");
    let seen = up.log.take();
    assert_eq!((seen[0].length_lines, &seen[0].body[..]), (1, &b"ab"[..]));
}

/// The host a request is routed by is the host the upstream receives: an absolute-form target
/// wins over the Host header (RFC 9112 §3.2.2), and over HTTP/2 an `:authority` and a `host`
/// that differ are refused (RFC 9113 §8.3.1). Before, `GET http://public.example/secret` with
/// `Host: admin.example` was routed to the open route and forwarded as `admin.example`.
#[tokio::test(flavor = "multi_thread")]
async fn one_host_is_routed_and_forwarded() {
    let up = RawUpstream::start();
    let gw = Gateway::with_config(&format!(
        r#"_format_version: '3.0'
services:
  - name: s
    url: 'http://{}'
    routes:
      - name: public
        hosts: [public.example]
        preserve_host: true
      - name: admin
        hosts: [admin.example]
        preserve_host: true
        plugins:
          - name: key-auth
consumers:
  - username: alice
    keyauth_credentials: [{{key: secret-key}}]
"#,
        up.addr
    ))
    .start_h2();
    // The admin route needs a key.
    let (out, _) = exchange(
        gw.proxy,
        &[b(
            "GET /len/1 HTTP/1.1\r\nHost: admin.example\r\nConnection: close\r\n\r\n",
        )],
        false,
    )
    .await;
    assert_eq!(parse_responses(&out, &[])[0].status, 401);
    // Absolute form: routed by, and forwarded as, the target's host.
    let (out, _) = exchange(
        gw.proxy,
        &[b("GET http://public.example/len/1 HTTP/1.1\r\nHost: admin.example\r\nConnection: close\r\n\r\n")],
        false,
    )
    .await;
    assert_eq!(parse_responses(&out, &[])[0].status, 200, "{out:?}");
    let seen = up.log.take();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].host, "public.example",
        "the upstream gets the routed host"
    );
    // The other way round, the key is still asked for.
    let (out, _) = exchange(
        gw.proxy,
        &[b("GET http://admin.example/len/1 HTTP/1.1\r\nHost: public.example\r\nConnection: close\r\n\r\n")],
        false,
    )
    .await;
    assert_eq!(parse_responses(&out, &[])[0].status, 401, "{out:?}");
    assert!(up.log.take().is_empty());
    // HTTP/2 (h2c): :authority and host that differ are malformed; equal ones pass.
    let mut sender = crate::common::h2c_client(gw.proxy).await;
    for (host, status) in [("admin.example", 400), ("public.example", 200)] {
        let resp = sender
            .send_request(
                http::Request::get("http://public.example/len/1")
                    .header("host", host)
                    .body(http_body_util::Empty::<bytes::Bytes>::new())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), status, "h2 with host {host}");
    }
    let seen = up.log.take();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].host, "public.example");
}

/// response_buffering (Kong's route default): the upstream's response is read as fast as the
/// upstream sends it, so a client that reads slowly (or not yet) does not hold the upstream
/// back; with it off, the upstream waits for the client. The client still gets every byte.
#[tokio::test(flavor = "multi_thread")]
async fn slow_readers_do_not_hold_the_upstream() {
    let up = RawUpstream::start();
    let gw = Gateway::with_config(&format!(
        "_format_version: '3.0'\nservices: [{{name: s, url: 'http://{}', routes: [{{paths: [/], strip_path: false}}, {{paths: [/stream], strip_path: true, response_buffering: false}}]}}]\n",
        up.addr
    ))
    .start();
    // 48 MB: more than loopback socket buffers hold, so an upstream that had to wait for this
    // client could not have finished writing.
    const N: usize = 48 << 20;
    for (path, buffered) in [
        (format!("/len/{N}"), true),
        (format!("/stream/chunked/{N}"), false),
    ] {
        let before = up.log.1.load(std::sync::atomic::Ordering::SeqCst);
        let mut s = TcpStream::connect(gw.proxy).await.unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        // Read nothing until the upstream has written it all. Buffered: it gets there (the
        // bound only keeps a broken build from hanging). Streamed: it cannot while nobody
        // reads, whatever the machine's speed; two seconds show that it has not.
        let done = || up.log.1.load(std::sync::atomic::Ordering::SeqCst) > before;
        let finished = if buffered {
            crate::common::eventually(Duration::from_secs(60), async || done()).await
        } else {
            tokio::time::sleep(Duration::from_secs(2)).await;
            done()
        };
        assert_eq!(
            finished, buffered,
            "{path}: upstream finished before the client read"
        );
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(60), s.read_to_end(&mut out))
            .await
            .unwrap()
            .unwrap();
        let got = parse_responses(&out, &[]);
        assert_eq!(got.len(), 1, "{path}");
        assert!(!got[0].incomplete, "{path}");
        assert!(got[0].body == pattern(N), "{path}: body differs");
        up.log.take();
    }
    // The temporary files are gone with their responses.
    let temp = gw.dir.path().join("prefix/proxy_temp");
    assert_eq!(std::fs::read_dir(&temp).map(|d| d.count()).unwrap_or(0), 0);
}
