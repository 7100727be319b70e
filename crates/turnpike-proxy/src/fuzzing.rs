//! Entry points for the coverage-guided fuzz targets in `fuzz/` (feature `fuzzing`): the
//! hand-written code every hostile byte goes through. Each panics only on a real defect
//! (a crash in the code under test, or a property below that does not hold).

use bytes::BytesMut;
use http::Method;

use crate::http1::chunked::{self, Chunk, Decoded};

/// A client's request head, as the HTTP/1 server parses it (grammar, framing, Host): any
/// bytes give a head, a refusal or "more needed", never a panic; a head it accepts has one
/// valid Host in HTTP/1.1 and at most one Content-Length.
pub fn request_head(data: &[u8]) {
    let shared = crate::http1::server::detached_shared();
    let mut buf = BytesMut::from(data);
    if let Ok(Some(head)) =
        crate::http1::server::parse_head::<crate::http1::server::Http1Body>(&mut buf, &shared)
    {
        let h = head.request.headers();
        assert!(h.get_all(http::header::CONTENT_LENGTH).iter().count() <= 1);
        let hosts: Vec<_> = h.get_all(http::header::HOST).iter().collect();
        assert!(hosts.len() <= 1);
        if head.request.version() == http::Version::HTTP_11 {
            assert_eq!(hosts.len(), 1);
        }
        for v in hosts {
            assert!(crate::http1::authority::valid_host(v.as_bytes()));
        }
    }
}

/// An upstream's response head, as the HTTP/1 client parses it (for GET and HEAD).
pub fn response_head(data: &[u8]) {
    for method in [Method::GET, Method::HEAD] {
        let mut buf = BytesMut::from(data);
        let mut raw = crate::http1::client::RawHead::default();
        let _ = crate::http1::client::parse_head(&mut buf, &method, &mut raw);
    }
}

/// Chunked bodies, both directions. The first byte picks how the input is cut into reads;
/// decoding must give the same verdict and bytes however the input arrives. Then the input's
/// bytes, encoded as the proxy encodes them, must decode to themselves.
pub fn chunked(data: &[u8]) {
    let Some((&cut, rest)) = data.split_first() else {
        return;
    };
    let whole = decode_all(rest, rest.len().max(1));
    let pieces = decode_all(rest, usize::from(cut % 16) + 1);
    assert_eq!(
        whole, pieces,
        "the same bytes read in pieces decode differently"
    );
    // Encode `rest` in chunks of varying size, then decode.
    let mut wire = Vec::new();
    let mut at = 0;
    let mut size = usize::from(cut) + 1;
    while at < rest.len() {
        let n = size.min(rest.len() - at);
        chunked::encode_chunk(&mut wire, &rest[at..at + n]);
        at += n;
        size = size * 7 % 251 + 1;
    }
    wire.extend_from_slice(chunked::LAST_CHUNK);
    let (body, end) = decode_all(&wire, wire.len());
    assert_eq!(end, Some(true), "an encoded body decodes to its end");
    assert_eq!(body, rest, "an encoded body decodes to its bytes");
}

/// Decodes `input` fed `step` bytes at a time: the data and whether the body ended
/// (`Some(true)`), was refused (`Some(false)`) or needs more (`None`).
fn decode_all(input: &[u8], step: usize) -> (Vec<u8>, Option<bool>) {
    let mut buf = BytesMut::new();
    let mut state = Chunk::Size;
    let mut out = Vec::new();
    let mut fed = 0;
    loop {
        match chunked::decode(&mut buf, &mut state) {
            Ok(Decoded::Data(d)) => out.extend_from_slice(&d),
            Ok(Decoded::End) => return (out, Some(true)),
            Err(_) => return (out, Some(false)),
            Ok(Decoded::NeedMore) => {
                if fed == input.len() {
                    return (out, None);
                }
                let n = step.min(input.len() - fed);
                buf.extend_from_slice(&input[fed..fed + n]);
                fed += n;
            }
        }
    }
}

/// `h1_parse` held to httparse's verdicts (see `h1_parse::differential`).
pub fn h1_differential(data: &[u8]) {
    let _ = crate::http1::parse::differential::agrees(data);
}
