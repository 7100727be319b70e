//! Reading a request head: parsed straight into the request (values share the head's
//! bytes), and waiting for it within the keep-alive timeout as a small hand-written future.

use crate::http1::server::{conn::*, response::*, service::*};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::BytesMut;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Uri, Version};

use crate::http1::chunked::Chunk;
use crate::http1::parse;

/// hyper's default: more header fields than this get 431.
pub(crate) const MAX_HEADERS: usize = 100;

/// What the request head says about the connection and the body.
pub(crate) struct Head<B> {
    pub(crate) request: Request<B>,
    /// Which groups of names the request's headers include (`header_names::seen`).
    pub(crate) seen: u32,
    pub(crate) body: BodyState,
    pub(crate) keep_alive: bool,
    pub(crate) expect_continue: bool,
    pub(crate) upgrade: bool,
}

/// Parses a request head from the front of `rbuf` (consumed when complete); `None` while it
/// is incomplete. Header values and the target share the head's bytes (no copies).
pub(crate) fn parse_head<B: From<Http1Body>>(
    rbuf: &mut BytesMut,
    shared: &Rc<Shared>,
) -> Result<Option<Head<B>>, Refused> {
    let mut lines: smallvec::SmallVec<[parse::Field; 16]> = smallvec::SmallVec::new();
    let (line, len) = match parse::request(rbuf, MAX_HEADERS, |f| lines.push(f)) {
        Ok(Some(parsed)) => parsed,
        Ok(None) => return Ok(None),
        Err(parse::ParseError::TooManyHeaders) => return Err(Refused::TooLarge),
        Err(parse::ParseError::Invalid(_)) => return Err(Refused::BadRequest),
    };
    let method =
        Method::from_bytes(&rbuf[line.method.0..line.method.1]).map_err(|_| Refused::BadRequest)?;
    let version = if line.minor == 1 {
        Version::HTTP_11
    } else {
        Version::HTTP_10
    };
    let target = (line.target.0, line.target.1 - line.target.0);

    let mut length: Option<u64> = None;
    let mut chunked = false;
    let mut transfer_encoding = false;
    let mut close = false;
    let mut keep_alive_token = false;
    let mut upgrade_token = false;
    let mut upgrade_header = false;
    let mut expect_continue = false;
    let mut hosts = 0u32;
    // Names now, values once the head's bytes are frozen (then sliced, not copied).
    let mut fields: smallvec::SmallVec<[(HeaderName, usize, usize); 16]> =
        smallvec::SmallVec::with_capacity(lines.len());
    let mut seen = 0u32;
    for f in &lines {
        let (name, bit) = crate::http1::header_names::from_parsed(&rbuf[f.name_start..f.name_end])
            .map_err(|_| Refused::BadRequest)?;
        seen |= bit;
        let v = &rbuf[f.value_start..f.value_end];
        if name == header::CONTENT_LENGTH {
            let n = std::str::from_utf8(v)
                .ok()
                .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|s| s.parse::<u64>().ok())
                .ok_or(Refused::BadRequest)?;
            // Differing lengths are a smuggling attempt (RFC 9112 §6.3).
            if length.is_some_and(|l| l != n) {
                return Err(Refused::BadRequest);
            }
            if length.is_some() {
                // Equal repeats are one length: forwarded once.
                continue;
            }
            length = Some(n);
        } else if name == header::TRANSFER_ENCODING {
            transfer_encoding = true;
            // Only a body whose last coding is chunked can be delimited.
            chunked = v
                .rsplit(|b| *b == b',')
                .next()
                .is_some_and(|t| t.trim_ascii().eq_ignore_ascii_case(b"chunked"));
        } else if name == header::CONNECTION {
            close |= has_token(v, b"close");
            keep_alive_token |= has_token(v, b"keep-alive");
            upgrade_token |= has_token(v, b"upgrade");
        } else if name == header::UPGRADE {
            upgrade_header = true;
        } else if name == header::HOST {
            // One valid Host (RFC 9112 §3.2), checked here while the bytes are at hand.
            hosts += 1;
            if hosts > 1 || !crate::http1::authority::valid_host(v) {
                return Err(Refused::BadRequest);
            }
        } else if name == header::EXPECT {
            expect_continue = v.eq_ignore_ascii_case(b"100-continue");
        }
        fields.push((name, f.value_start, f.value_end - f.value_start));
    }
    // RFC 9112 §6.1/§6.3: a request with both framings, or a transfer coding that does not
    // end in chunked, cannot be delimited safely; HTTP/1.0 has no transfer codings.
    if transfer_encoding && (!chunked || length.is_some() || version == Version::HTTP_10) {
        return Err(Refused::BadRequest);
    }
    let head = rbuf.split_to(len).freeze();
    // Room for a few headers the plugins add (a tracing context, a transformer's): a full
    // map grows and rehashes on its next insert (~4,000 instructions for one traceparent).
    let mut map = HeaderMap::with_capacity(fields.len() + 4);
    for (name, at, n) in fields.drain(..) {
        let value = HeaderValue::from_maybe_shared(head.slice(at..at + n))
            .map_err(|_| Refused::BadRequest)?;
        map.append(name, value);
    }
    let uri = Uri::from_maybe_shared(head.slice(target.0..target.0 + target.1))
        .map_err(|_| Refused::BadRequest)?;
    // One host for routing and forwarding: the absolute-form target's, else the one valid
    // Host header (required in HTTP/1.1).
    if uri.authority().is_some() {
        crate::http1::authority::settle_host(&uri, &mut map, version == Version::HTTP_11, true)
            .map_err(|_| Refused::BadRequest)?;
    } else if hosts == 0 && version == Version::HTTP_11 {
        return Err(Refused::BadRequest);
    }
    let body = if chunked {
        BodyState::Chunked(Chunk::Size)
    } else {
        match length {
            Some(n) if n > 0 => BodyState::Length(n),
            _ => BodyState::Done,
        }
    };
    let mut request = Request::new(B::from(Http1Body {
        shared: shared.clone(),
    }));
    *request.method_mut() = method;
    *request.uri_mut() = uri;
    *request.version_mut() = version;
    *request.headers_mut() = map;
    Ok(Some(Head {
        request,
        seen,
        body,
        keep_alive: if version == Version::HTTP_11 {
            !close
        } else {
            keep_alive_token && !close
        },
        expect_continue: expect_continue && version == Version::HTTP_11,
        upgrade: upgrade_header && upgrade_token && version == Version::HTTP_11,
    }))
}

/// What waiting for the next request head gave.
// Returned and taken apart at once, never stored: boxing the head would cost an allocation per
// request.
#[allow(clippy::large_enum_variant)]
pub(crate) enum HeadRead<B> {
    Head(Head<B>),
    /// The connection should just close: client gone, keep-alive timeout, worker shutting
    /// down, or a partial head cut off by the timeout.
    Close,
    /// No byte came within the linger asked for (the keep-alive timeout has not passed).
    Quiet,
    Refused(Refused),
}

/// The next request head. `linger`: give up after this long without a byte (`Quiet`), within
/// the keep-alive timeout.
pub(crate) fn read_head<'a, S: Service>(
    svc: &'a S,
    shared: &'a Rc<Shared>,
    max_head: usize,
    linger: Option<Duration>,
) -> ReadHead<'a, S> {
    ReadHead {
        svc,
        shared,
        max_head,
        linger,
        slot: None,
    }
}

/// Waiting for a request head, written out as a future by hand: it is what every idle
/// connection's task holds, and at 64 bytes it is a third of what an `async fn` made of it
/// (which keeps its arguments twice, and its poll closure's references besides).
pub(crate) struct ReadHead<'a, S: Service> {
    svc: &'a S,
    shared: &'a Rc<Shared>,
    max_head: usize,
    linger: Option<Duration>,
    /// The armed deadline, and whether it is the linger's (shorter than the timeout's).
    slot: Option<(usize, bool)>,
}

impl<S: Service> ReadHead<'_, S> {
    fn poll_head(&mut self, cx: &mut Context<'_>) -> Poll<HeadRead<S::RequestBody>> {
        let (svc, shared) = (self.svc, self.shared);
        loop {
            {
                let mut rbuf = shared.rbuf.borrow_mut();
                if !rbuf.is_empty() {
                    match parse_head(&mut rbuf, shared) {
                        Ok(Some(h)) => return Poll::Ready(HeadRead::Head(h)),
                        Ok(None) if rbuf.len() >= self.max_head => {
                            return Poll::Ready(HeadRead::Refused(Refused::TooLarge))
                        }
                        Ok(None) => {}
                        Err(e) => return Poll::Ready(HeadRead::Refused(e)),
                    }
                } else if svc.closing() {
                    return Poll::Ready(HeadRead::Close);
                }
            }
            match shared.poll_fill(cx) {
                Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => return Poll::Ready(HeadRead::Close),
                Poll::Ready(Ok(_)) => continue,
                Poll::Pending => {
                    let deadlines = svc.deadlines();
                    // The timeout counts from the end of the last request (or the connection's
                    // start), as nginx's keepalive_timeout and client_header_timeout do.
                    let linger = self.linger;
                    let (s, lingering) = *self.slot.get_or_insert_with(|| {
                        let idle = deadlines
                            .coarse_now()
                            .saturating_duration_since(svc.last_active());
                        let left = svc.limits().keepalive_timeout.saturating_sub(idle);
                        match linger {
                            Some(l) if l < left => (deadlines.arm_idle(l), true),
                            _ => (deadlines.arm_idle(left), false),
                        }
                    });
                    if deadlines.poll_expired(s, cx) {
                        // The linger's end hands the connection back to `serve`, which waits
                        // out the rest of the timeout (for a partial head too); a worker
                        // shutting down (which expires idle deadlines early) closes.
                        return Poll::Ready(if lingering && !svc.closing() {
                            HeadRead::Quiet
                        } else {
                            HeadRead::Close
                        });
                    }
                    return Poll::Pending;
                }
            }
        }
    }

    fn disarm(&mut self) {
        if let Some((s, _)) = self.slot.take() {
            self.svc.deadlines().disarm(s);
        }
    }
}

impl<S: Service> std::future::Future for ReadHead<'_, S> {
    type Output = HeadRead<S::RequestBody>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let got = this.poll_head(cx);
        if got.is_ready() {
            this.disarm();
        }
        got
    }
}

impl<S: Service> Drop for ReadHead<'_, S> {
    /// A wait given up (the connection's task dropped) frees its deadline's slot too.
    fn drop(&mut self) {
        self.disarm();
    }
}
