//! Writing a response: its head encoded into one buffer (the upstream's raw header lines,
//! the map's, then the headers kept outside the map), with the start of its body, framed by
//! length, chunks or close.

use crate::http1::server::conn::*;
use std::cell::RefCell;
use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{Response, StatusCode, Version};
use http_body::{Body, SizeHint};
use http_body_util::BodyExt;

use crate::http1::chunked::{self};
use crate::http1::raw_head::RawHead;

/// Response bytes gathered before a write; a larger body frame is written as it is.
pub(crate) const WRITE_GATHER: usize = 16 * 1024;

/// A response body the server can write: its frames, and the upstream's raw header lines
/// when it is an upstream's body still on its connection (written before the map's).
pub trait ResponseBody: Body<Data = Bytes, Error: std::fmt::Display> + Unpin {
    fn raw_head(&self) -> Option<&RawHead>;
}

thread_local! {
    /// Response buffers lent to connections while they write (an idle connection holds none).
    static OUT_POOL: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// Buffers kept in a worker's pool; more are freed when returned.
pub(crate) const OUT_POOL_MAX: usize = 256;
/// A response buffer grown beyond this is freed instead of pooled.
pub(crate) const OUT_KEEP_MAX: usize = 2 * WRITE_GATHER;

/// A response buffer from the worker's pool, returned there when dropped.
pub(crate) struct OutBuf(Vec<u8>);

impl OutBuf {
    fn take() -> OutBuf {
        OutBuf(
            OUT_POOL
                .with(|p| p.borrow_mut().pop())
                .unwrap_or_else(|| Vec::with_capacity(1024)),
        )
    }
}

impl Drop for OutBuf {
    fn drop(&mut self) {
        let mut v = std::mem::take(&mut self.0);
        if v.capacity() <= OUT_KEEP_MAX {
            v.clear();
            // `try_with`: a connection dropped while the thread exits finds no pool.
            let _ = OUT_POOL.try_with(|p| {
                let mut p = p.borrow_mut();
                if p.len() < OUT_POOL_MAX {
                    p.push(v);
                }
            });
        }
    }
}

thread_local! {
    /// The Date header's value, formatted once per second.
    static DATE: RefCell<(u64, [u8; 29])> = const { RefCell::new((0, [b' '; 29])) };
}

pub(crate) fn push_date(out: &mut Vec<u8>) {
    let now = turnpike_plugins::now_secs();
    DATE.with(|d| {
        let mut d = d.borrow_mut();
        if d.0 != now {
            let t = std::time::UNIX_EPOCH + Duration::from_secs(now);
            let s = httpdate::fmt_http_date(t);
            if s.len() == 29 {
                d.1.copy_from_slice(s.as_bytes());
                d.0 = now;
            }
        }
        out.extend_from_slice(b"date: ");
        out.extend_from_slice(&d.1);
        out.extend_from_slice(b"\r\n");
    });
}

pub(crate) fn push_decimal(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// Kong's headers for one response; written into the HTTP/1.1 head after the map's.
pub type KongHeaders = smallvec::SmallVec<[(HeaderName, HeaderValue); 5]>;

/// A response's headers that go straight into its HTTP/1.1 head, after the map's: no hash,
/// no insert (see `runloop::handle`).
#[derive(Default)]
pub struct OutsideHeaders {
    /// The plugins' (their header_filter phase), no two of the same name, none named like
    /// the upstream's or the map's.
    pub plugins: Vec<(HeaderName, HeaderValue)>,
    /// Kong's own (Via, X-Kong-*).
    pub kong: KongHeaders,
}

impl OutsideHeaders {
    pub fn clear(&mut self) {
        // Dropped, not kept: the list is the plugins' own allocation, made per request.
        self.plugins = Vec::new();
        self.kong.clear();
    }
}

/// How a response body is delimited on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    None,
    Length(u64),
    Chunked,
    /// HTTP/1.0 without a known length: the body ends when the connection closes.
    Close,
}

/// A response's headers kept outside its header map (no hash, no insert), written around
/// the map's.
pub(crate) struct Unmapped<'a> {
    /// The upstream's end-to-end headers as it sent them, written before the map's.
    pub(crate) upstream: Option<&'a RawHead>,
    /// The plugins' and Kong's own (see `runloop::handle`), written after the map's.
    pub(crate) outside: &'a OutsideHeaders,
}

/// Encodes a response head into `out`; returns the body's framing and whether the connection
/// must close after this response.
pub(crate) fn encode_head(
    out: &mut Vec<u8>,
    parts: &http::response::Parts,
    unmapped: Unmapped<'_>,
    hint: &SizeHint,
    head_request: bool,
    client_version: Version,
    keep_alive: bool,
) -> (Framing, bool) {
    let status = parts.status;
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    let mut close = !keep_alive;
    let mut length: Option<u64> = None;
    let mut has_date = false;
    let mut has_connection = false;
    // The upstream's headers as it sent them, first (never hop-by-hop ones).
    if let Some(raw) = unmapped.upstream {
        raw.encode(out);
        length = raw.content_length;
        has_date = raw.has_date;
    }
    for (name, value) in &parts.headers {
        if name == header::TRANSFER_ENCODING {
            // The body is framed here, whatever the handler's headers said.
            continue;
        } else if name == header::CONTENT_LENGTH {
            length = std::str::from_utf8(value.as_bytes())
                .ok()
                .and_then(|s| s.parse().ok());
        } else if name == header::DATE {
            has_date = true;
        } else if name == header::CONNECTION {
            has_connection = true;
            close |= has_token(value.as_bytes(), b"close");
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    let outside = unmapped.outside;
    for (name, value) in outside.plugins.iter().chain(outside.kong.iter()) {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if !has_date {
        push_date(out);
    }
    let no_body = head_request
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED;
    let framing = if no_body {
        Framing::None
    } else if let Some(n) = length {
        Framing::Length(n)
    } else if let Some(n) = hint.exact() {
        out.extend_from_slice(b"content-length: ");
        push_decimal(out, n);
        out.extend_from_slice(b"\r\n");
        Framing::Length(n)
    } else if client_version == Version::HTTP_11 {
        out.extend_from_slice(b"transfer-encoding: chunked\r\n");
        Framing::Chunked
    } else {
        close = true;
        Framing::Close
    };
    if !has_connection && status != StatusCode::SWITCHING_PROTOCOLS {
        if close {
            out.extend_from_slice(b"connection: close\r\n");
        } else if client_version == Version::HTTP_10 {
            out.extend_from_slice(b"connection: keep-alive\r\n");
        }
    }
    out.extend_from_slice(b"\r\n");
    (framing, close)
}

/// Writes a response: head and body, gathered into as few writes as the body allows. Returns
/// whether the connection can carry another request.
pub(crate) async fn write_response<B: ResponseBody>(
    shared: &Shared,
    resp: Response<B>,
    // Headers for this response kept outside its map; emptied here.
    extra: &RefCell<OutsideHeaders>,
    head_request: bool,
    client_version: Version,
    keep_alive: bool,
) -> io::Result<bool> {
    let (parts, mut body) = resp.into_parts();
    let mut out = OutBuf::take();
    let out = &mut out.0;
    let (framing, mut close) = {
        let mut extra = extra.borrow_mut();
        let encoded = encode_head(
            out,
            &parts,
            Unmapped {
                upstream: body.raw_head(),
                outside: &extra,
            },
            &body.size_hint(),
            head_request,
            client_version,
            keep_alive,
        );
        extra.clear();
        encoded
    };
    drop(parts);
    let mut remaining = match framing {
        Framing::Length(n) => n,
        _ => u64::MAX,
    };
    // The body was cut short (upstream error, or more bytes than announced): nothing more is
    // written and the connection closes. Not `close`, which only says the connection ends
    // after this response (Connection: close, HTTP/1.0) and must still carry the whole body.
    let mut cut = false;
    if framing == Framing::None {
        // Ends the request (its guard) before the write, as the body would.
        drop(body);
    } else {
        loop {
            // A frame at hand is gathered with the head; only a body that has to wait gets
            // what is gathered so far written first.
            let next = match poll_fn(|cx| Poll::Ready(Pin::new(&mut body).poll_frame(cx))).await {
                Poll::Ready(f) => f,
                Poll::Pending => {
                    if !out.is_empty() {
                        shared.write_all(out).await?;
                        shared.flush().await?;
                        out.clear();
                    }
                    body.frame().await
                }
            };
            let data = match next {
                None => break,
                Some(Err(e)) => {
                    // Cut short: the client sees a truncated body (no last chunk, or fewer
                    // bytes than announced) and the connection closes.
                    tracing::debug!("response body failed: {e}");
                    close = true;
                    cut = true;
                    remaining = 0;
                    break;
                }
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(d) if !d.is_empty() => d,
                    _ => continue,
                },
            };
            let data = if remaining < data.len() as u64 {
                // More than announced: what fits is sent and the connection closes.
                close = true;
                cut = true;
                data.slice(..remaining.min(data.len() as u64) as usize)
            } else {
                data
            };
            if let Framing::Length(_) = framing {
                remaining -= data.len() as u64;
            }
            if framing == Framing::Chunked {
                chunked::push_size_line(out, data.len());
            }
            if data.len() >= WRITE_GATHER {
                shared.write_all(out).await?;
                out.clear();
                shared.write_all(&data).await?;
            } else {
                out.extend_from_slice(&data);
            }
            if framing == Framing::Chunked {
                out.extend_from_slice(b"\r\n");
            }
            if out.len() >= WRITE_GATHER {
                shared.write_all(out).await?;
                out.clear();
            }
            if cut {
                break;
            }
        }
        drop(body);
        match framing {
            Framing::Chunked if !cut => out.extend_from_slice(chunked::LAST_CHUNK),
            Framing::Length(_) if remaining != 0 => close = true,
            _ => {}
        }
    }
    if !out.is_empty() {
        shared.write_all(out).await?;
        out.clear();
    }
    shared.flush().await?;
    Ok(!close)
}

/// The value of a Connection header: does it list `token`?
pub(crate) fn has_token(v: &[u8], token: &[u8]) -> bool {
    v.split(|b| *b == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token))
}
