//! request-size-limiting on the real binary: declared lengths refused up front, and bodies
//! without a Content-Length (chunked) counted as they stream and cut at the limit.

use crate::common::*;
use bytes::Bytes;
use http_body_util::{Full, StreamBody};
use hyper::body::Frame;
use serde_json::json;

/// A body sent chunked (no Content-Length): `n` bytes in 100-byte frames.
fn chunked(
    n: usize,
) -> StreamBody<impl futures_util::Stream<Item = Result<Frame<Bytes>, std::convert::Infallible>>> {
    let frames: Vec<Result<Frame<Bytes>, std::convert::Infallible>> = (0..n.div_ceil(100))
        .map(|i| Ok(Frame::data(Bytes::from(vec![b'x'; 100.min(n - i * 100)]))))
        .collect();
    StreamBody::new(futures_util::stream::iter(frames))
}

#[tokio::test]
async fn request_bodies_are_limited_even_when_chunked() {
    let up = Upstream::start("size");
    let gw = Gateway::with_config(&format!(
        r#"_format_version: "3.0"
services:
- name: svc
  url: {url}
  routes:
  - name: limited
    paths: [/limited]
    plugins:
    - name: request-size-limiting
      config: {{allowed_payload_size: 1, size_unit: kilobytes}}
  - name: strict
    paths: [/strict]
    plugins:
    - name: request-size-limiting
      config: {{require_content_length: true}}
"#,
        url = up.url()
    ))
    .start();
    let p = gw.proxy;
    let too_large = json!({"message": "Request size limit exceeded"});
    // Declared lengths.
    let r = send(
        p,
        req("POST", "/limited")
            .body(Full::new(Bytes::from(vec![b'x'; 1024])))
            .unwrap(),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["body_len"], 1024);
    let before = up.connections.load(std::sync::atomic::Ordering::SeqCst);
    let r = send(
        p,
        req("POST", "/limited")
            .body(Full::new(Bytes::from(vec![b'x'; 1025])))
            .unwrap(),
    )
    .await;
    assert_eq!((r.status, r.json()), (413, too_large.clone()));
    // Refused before any upstream connection was opened.
    assert_eq!(
        up.connections.load(std::sync::atomic::Ordering::SeqCst),
        before
    );

    // Chunked: under the limit it goes through whole; over it, 413 and the upstream never
    // gets a complete request.
    let r = send(p, req("POST", "/limited").body(chunked(1000)).unwrap()).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["body_len"], 1000);
    // Read whole first (the route's request_buffering, Kong's default), it goes upstream with
    // its length, as nginx sends it.
    assert_eq!(r.json()["headers"]["content-length"], "1000");
    let r = send(p, req("POST", "/limited").body(chunked(50_000)).unwrap()).await;
    assert_eq!(
        (r.status, &r.json()["message"]),
        (413, &too_large["message"])
    );
    // The gateway is fine afterwards.
    let r = send(p, req("POST", "/limited").body(chunked(10)).unwrap()).await;
    assert_eq!((r.status, r.json()["body_len"].as_u64()), (200, Some(10)));

    // require_content_length.
    let r = send(p, req("POST", "/strict").body(chunked(10)).unwrap()).await;
    assert_eq!(
        (r.status, r.json()),
        (
            411,
            json!({"message": "A valid Content-Length header is required"})
        )
    );
    let r = send(
        p,
        req("POST", "/strict")
            .body(Full::new(Bytes::from_static(b"abc")))
            .unwrap(),
    )
    .await;
    assert_eq!(r.status, 200);

    // Bad configs are Kong-shaped violations.
    let r = send(
        gw.admin,
        req("POST", "/schemas/plugins/validate")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(
                json!({"name": "request-size-limiting", "config": {"size_unit": "gigabytes"}})
                    .to_string(),
            )))
            .unwrap(),
    )
    .await;
    assert_eq!(r.status, 400);
    assert_eq!(
        r.json()["fields"]["config"]["size_unit"],
        "expected one of: megabytes, kilobytes, bytes"
    );
}
