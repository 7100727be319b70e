use super::conn::*;
use super::head::*;
use super::response::*;
use super::serve::detached_shared;
use super::service::*;
use crate::http1::chunked;
use crate::http1::chunked::Chunk;
use bytes::BytesMut;
use http::header::{self, HeaderValue};
use http::{Method, Response, StatusCode, Version};
use http_body::SizeHint;
use std::rc::Rc;

fn shared() -> Rc<Shared> {
    detached_shared()
}

fn parse(text: &[u8]) -> Result<Option<Head<Http1Body>>, Refused> {
    let mut buf = BytesMut::from(text);
    parse_head(&mut buf, &shared())
}

#[test]
fn request_heads() {
    let h = parse(
        b"POST /a?b=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nX-A: 1\r\nX-A: 2\r\n\r\nhello",
    )
    .unwrap()
    .unwrap();
    assert_eq!(h.request.method(), Method::POST);
    assert_eq!(h.request.uri().path(), "/a");
    assert_eq!(h.request.uri().query(), Some("b=1"));
    assert_eq!(h.request.headers().get_all("x-a").iter().count(), 2);
    assert_eq!(h.body, BodyState::Length(5));
    assert!(h.keep_alive && !h.upgrade && !h.expect_continue);

    let h = parse(b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n")
        .unwrap()
        .unwrap();
    assert!(h.keep_alive);
    assert_eq!(h.request.version(), Version::HTTP_10);
    let h = parse(b"GET / HTTP/1.0\r\n\r\n").unwrap().unwrap();
    assert!(!h.keep_alive);
    let h = parse(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .unwrap()
        .unwrap();
    assert!(!h.keep_alive);
    let h = parse(
        b"GET /ws HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, Upgrade\r\nUpgrade: websocket\r\n\r\n",
    )
    .unwrap()
    .unwrap();
    assert!(h.upgrade);
    let h = parse(
        b"PUT / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\nExpect: 100-continue\r\n\r\n",
    )
    .unwrap()
    .unwrap();
    assert_eq!(h.body, BodyState::Chunked(Chunk::Size));
    assert!(h.expect_continue);
    assert!(parse(b"GET / HTTP/1.1\r\nHost: x\r\n").unwrap().is_none());
}

#[test]
fn refused_heads() {
    let bad: &[&[u8]] = &[
        b"GARBAGE\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
        b"GET / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
        b"GET / HTTP/1.1\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a.example/evil\r\n\r\n",
    ];
    for b in bad {
        assert_eq!(
            parse(b).err(),
            Some(Refused::BadRequest),
            "{}",
            String::from_utf8_lossy(b)
        );
    }
    let mut many = b"GET / HTTP/1.1\r\n".to_vec();
    for i in 0..=MAX_HEADERS {
        many.extend_from_slice(format!("X-{i}: v\r\n").as_bytes());
    }
    many.extend_from_slice(b"\r\n");
    assert_eq!(parse(&many).err(), Some(Refused::TooLarge));
    // Same lengths repeated are allowed, and kept as one.
    let h = parse(b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n")
        .unwrap()
        .unwrap();
    assert_eq!(
        h.request.headers().get_all("content-length").iter().count(),
        1
    );
    // An absolute-form target's host replaces the Host header.
    let h = parse(b"GET http://a.example/p HTTP/1.1\r\nHost: b.example\r\n\r\n")
        .unwrap()
        .unwrap();
    assert_eq!(h.request.headers()["host"], "a.example");
}

fn head_of(
    resp: Response<()>,
    hint: SizeHint,
    head_request: bool,
    v: Version,
) -> (String, Framing, bool) {
    let (parts, _) = resp.into_parts();
    let mut out = Vec::new();
    let (f, close) = encode_head(
        &mut out,
        &parts,
        Unmapped {
            upstream: None,
            outside: &Default::default(),
        },
        &hint,
        head_request,
        v,
        true,
    );
    (String::from_utf8(out).unwrap(), f, close)
}

fn exact(n: u64) -> SizeHint {
    SizeHint::with_exact(n)
}

#[test]
fn response_framing() {
    let ok = || Response::new(());
    let (h, f, close) = head_of(ok(), exact(2), false, Version::HTTP_11);
    assert!(h.starts_with("HTTP/1.1 200 OK\r\n"), "{h}");
    assert!(
        h.contains("content-length: 2\r\n") && h.contains("date: "),
        "{h}"
    );
    assert_eq!((f, close), (Framing::Length(2), false));

    // A body of unknown length: chunked for HTTP/1.1 (the handler's own framing header is
    // not kept), until close for HTTP/1.0.
    let mut r = ok();
    r.headers_mut()
        .insert(header::TRANSFER_ENCODING, HeaderValue::from_static("gzip"));
    let (h, f, close) = head_of(r, SizeHint::default(), false, Version::HTTP_11);
    assert!(
        h.contains("transfer-encoding: chunked\r\n") && !h.contains("gzip"),
        "{h}"
    );
    assert_eq!((f, close), (Framing::Chunked, false));
    let (h, f, close) = head_of(ok(), SizeHint::default(), false, Version::HTTP_10);
    assert!(h.contains("connection: close\r\n"), "{h}");
    assert_eq!((f, close), (Framing::Close, true));

    // HEAD and 304: no framing added, the upstream's Content-Length kept.
    let mut r = ok();
    r.headers_mut()
        .insert(header::CONTENT_LENGTH, HeaderValue::from_static("1234"));
    let (h, f, _) = head_of(r, exact(0), true, Version::HTTP_11);
    assert!(h.contains("content-length: 1234\r\n"), "{h}");
    assert_eq!(f, Framing::None);
    let mut r = ok();
    *r.status_mut() = StatusCode::NOT_MODIFIED;
    let (h, f, _) = head_of(r, exact(0), false, Version::HTTP_11);
    assert!(!h.contains("content-length"), "{h}");
    assert_eq!(f, Framing::None);

    // Connection: close from the handler (keepalive_requests) ends the connection; an
    // HTTP/1.0 keep-alive is confirmed; an upstream Date is kept, not doubled.
    let mut r = ok();
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    assert!(head_of(r, exact(0), false, Version::HTTP_11).2);
    let (h, _, close) = head_of(ok(), exact(0), false, Version::HTTP_10);
    assert!(h.contains("connection: keep-alive\r\n") && !close, "{h}");
    let mut r = ok();
    r.headers_mut().insert(
        header::DATE,
        HeaderValue::from_static("Sun, 06 Nov 1994 08:49:37 GMT"),
    );
    let (h, _, _) = head_of(r, exact(0), false, Version::HTTP_11);
    assert_eq!(h.matches("date: ").count(), 1, "{h}");
}

#[test]
fn decimal_and_hex() {
    let mut out = Vec::new();
    push_decimal(&mut out, 0);
    out.push(b' ');
    push_decimal(&mut out, 18_446_744_073_709_551_615);
    out.push(b' ');
    chunked::push_size_line(&mut out, 0x1f40);
    assert_eq!(out, b"0 18446744073709551615 1f40\r\n");
}
