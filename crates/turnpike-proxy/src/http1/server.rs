//! The client side of HTTP/1.1, written by hand as the upstream side is (`h1.rs`): the request
//! head is parsed (`h1_parse`) straight into the request, the response head is encoded into
//! one buffer together with the start of its body, and a keep-alive connection costs one read
//! and one write per request with no timer per request: the keep-alive (and request-head)
//! timeout is a coarse deadline armed only while the connection waits for bytes. hyper's server
//! connection cost ~8.8k instructions per request around our handler (BENCHMARKS.md). HTTP/2
//! stays on hyper (`server.rs`).

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri, Version};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::http1::chunked::{self, Chunk, Decoded};
use crate::http1::parse;
use crate::http1::raw_head::RawHead;
use crate::worker::deadline::Deadlines;

/// What the HTTP/1.1 server asks of whoever serves a connection's requests (the request
/// path, `runloop::Connection`). The server never imports it, as Pingora's protocols never
/// import its proxy; every method is monomorphised, so the indirection costs nothing.
pub trait Service {
    /// The request body `call` gets, made from the connection's body reader.
    type RequestBody: From<Http1Body>;
    /// The response body written back.
    type ResponseBody: ResponseBody;

    /// Serves one request. `seen`: which groups of header names it carries
    /// (`header_names::seen`, as the parser saw them); `upgrade`: where the connection goes
    /// once a 101 is written, for a request that asks to upgrade.
    fn call(
        &self,
        request: Request<Self::RequestBody>,
        seen: u32,
        upgrade: Option<PendingUpgrade>,
    ) -> impl std::future::Future<Output = Response<Self::ResponseBody>>;

    /// The answer to a request head that is refused (the connection then closes).
    fn refusal(&self, why: Refused) -> Response<Self::ResponseBody>;

    /// Where the headers of the response `call` returned that are kept outside its map wait
    /// to be written: set as `call` returns and emptied as the head is encoded, with no await
    /// between, so one slot per worker serves all its connections (held per connection, its
    /// ~400 bytes would stay with every idle one).
    fn outside_headers(&self) -> &RefCell<OutsideHeaders>;

    /// The worker is shutting down: the connection closes after its current request.
    fn closing(&self) -> bool;

    /// When a request on this connection last ended (the keep-alive timeout counts from there).
    fn last_active(&self) -> std::time::Instant;

    /// The worker's coarse clock and deadlines.
    fn deadlines(&self) -> &Rc<Deadlines>;

    fn limits(&self) -> Limits;
}

/// A response body the server can write: its frames, and the upstream's raw header lines
/// when it is an upstream's body still on its connection (written before the map's).
pub trait ResponseBody: Body<Data = Bytes, Error: std::fmt::Display> + Unpin {
    fn raw_head(&self) -> Option<&RawHead>;
}

/// The connection's bounds, from the node's properties.
#[derive(Clone, Copy)]
pub struct Limits {
    /// nginx's keepalive_timeout (and client_header_timeout).
    pub keepalive_timeout: Duration,
    /// nginx's client_body_timeout.
    pub client_body_timeout: Duration,
    /// Request heads larger than this get 431.
    pub max_header_size: usize,
}

/// hyper's default: more header fields than this get 431.
const MAX_HEADERS: usize = 100;
const READ_CHUNK: usize = 8 * 1024;
/// Response bytes gathered before a write; a larger body frame is written as it is.
const WRITE_GATHER: usize = 16 * 1024;
/// What is read and discarded of a request body the handler left unread (a 404 to a POST)
/// before the connection is closed instead of reused.
const DRAIN_MAX: usize = 64 * 1024;
const DRAIN_TIME: Duration = Duration::from_secs(2);

/// A client connection's byte stream: TCP or TLS over TCP.
pub trait Io: AsyncRead + AsyncWrite + Unpin {}
impl<T: AsyncRead + AsyncWrite + Unpin> Io for T {}

/// How much of the current request's body is still to be read from the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BodyState {
    Length(u64),
    Chunked(Chunk),
    Done,
    /// The body could not be read (client gone, bad chunked coding): the connection ends.
    Failed,
}

/// The connection's socket and read buffer, shared by the connection loop and the request body
/// being read. Both live on the worker's thread, and neither holds a borrow across an await.
pub(crate) struct Shared {
    io: RefCell<Box<dyn Io>>,
    rbuf: RefCell<BytesMut>,
    body: Cell<BodyState>,
    /// An `Expect: 100-continue` not answered yet: answered when the body is first read, so a
    /// request refused before that (401, 413) never makes the client send its body.
    expect_continue: Cell<bool>,
    /// Bytes of the interim "100 Continue" written so far.
    continue_sent: Cell<usize>,
    /// nginx's client_body_timeout: a body read that waits longer fails (408), armed only
    /// while a read waits.
    body_timeout: Duration,
    body_slot: Cell<Option<usize>>,
    deadlines: Rc<Deadlines>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        if let Some(s) = self.body_slot.take() {
            self.deadlines.disarm(s);
        }
    }
}

const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

thread_local! {
    /// The worker's read buffer for connections that hold none: an idle keep-alive connection
    /// keeps no buffer of its own (as nginx frees its header buffer); the bytes that wake it are
    /// read here and copied into a buffer it then keeps while it is active.
    static SCRATCH: RefCell<Box<[u8]>> = RefCell::new(vec![0u8; READ_CHUNK].into_boxed_slice());
    /// Response buffers lent to connections while they write (an idle connection holds none).
    static OUT_POOL: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// Buffers kept in a worker's pool; more are freed when returned.
const OUT_POOL_MAX: usize = 256;
/// A response buffer grown beyond this is freed instead of pooled.
const OUT_KEEP_MAX: usize = 2 * WRITE_GATHER;

/// A response buffer from the worker's pool, returned there when dropped.
struct OutBuf(Vec<u8>);

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

impl Shared {
    fn poll_fill(&self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        let mut io = self.io.borrow_mut();
        let mut rbuf = self.rbuf.borrow_mut();
        if rbuf.capacity() == 0 && self.body.get() == BodyState::Done {
            // Waiting for a request head without a buffer of its own (idle since its last
            // request): read into the worker's, keep what came. Bodies read into their own.
            return SCRATCH.with(|scratch| {
                let mut scratch = scratch.borrow_mut();
                let mut rb = tokio::io::ReadBuf::new(&mut scratch[..]);
                std::task::ready!(Pin::new(&mut **io).poll_read(cx, &mut rb))?;
                let got = rb.filled();
                if !got.is_empty() {
                    // A whole buffer: the requests that follow while the connection is active
                    // are read straight into it (a request's space is reclaimed once it is done).
                    rbuf.reserve(READ_CHUNK.max(got.len()));
                    rbuf.extend_from_slice(got);
                }
                Poll::Ready(Ok(got.len()))
            });
        }
        if rbuf.capacity() - rbuf.len() < 1024 {
            rbuf.reserve(READ_CHUNK);
        }
        tokio_util::io::poll_read_buf(Pin::new(&mut **io), cx, &mut *rbuf)
    }

    /// Frees the read buffer of a connection that has no unread bytes (it has gone idle).
    fn release_rbuf(&self) {
        let mut rbuf = self.rbuf.borrow_mut();
        if rbuf.is_empty() && rbuf.capacity() != 0 {
            *rbuf = BytesMut::new();
        }
    }

    fn poll_write(&self, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut **self.io.borrow_mut()).poll_write(cx, data)
    }

    fn poll_continue(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.continue_sent.get() < CONTINUE.len() {
            let n = std::task::ready!(self.poll_write(cx, &CONTINUE[self.continue_sent.get()..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.continue_sent.set(self.continue_sent.get() + n);
        }
        std::task::ready!(Pin::new(&mut **self.io.borrow_mut()).poll_flush(cx))?;
        self.expect_continue.set(false);
        Poll::Ready(Ok(()))
    }

    /// `poll_fill` for the body, within the body timeout.
    fn poll_fill_timed(&self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        match self.poll_fill(cx) {
            Poll::Pending => {
                let s = match self.body_slot.get() {
                    Some(s) => s,
                    None => {
                        let s = self.deadlines.arm(self.body_timeout);
                        self.body_slot.set(Some(s));
                        s
                    }
                };
                if self.deadlines.poll_expired(s, cx) {
                    self.deadlines.disarm(s);
                    self.body_slot.set(None);
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "client body timed out",
                    )));
                }
                Poll::Pending
            }
            ready => {
                if let Some(s) = self.body_slot.take() {
                    self.deadlines.disarm(s);
                }
                ready
            }
        }
    }

    /// The next piece of the request body.
    fn poll_body(&self, cx: &mut Context<'_>) -> Poll<Option<io::Result<Bytes>>> {
        if self.expect_continue.get() {
            if let Err(e) = std::task::ready!(self.poll_continue(cx)) {
                self.body.set(BodyState::Failed);
                return Poll::Ready(Some(Err(e)));
            }
        }
        loop {
            let got = match self.body.get() {
                BodyState::Done => return Poll::Ready(None),
                BodyState::Failed => {
                    return Poll::Ready(Some(Err(io::Error::other("request body unreadable"))))
                }
                BodyState::Length(remaining) => {
                    let mut rbuf = self.rbuf.borrow_mut();
                    if rbuf.is_empty() {
                        Decoded::NeedMore
                    } else {
                        let n = remaining.min(rbuf.len() as u64) as usize;
                        let data = rbuf.split_to(n).freeze();
                        let left = remaining - n as u64;
                        self.body.set(if left == 0 {
                            BodyState::Done
                        } else {
                            BodyState::Length(left)
                        });
                        Decoded::Data(data)
                    }
                }
                BodyState::Chunked(mut c) => {
                    let decoded = chunked::decode(&mut self.rbuf.borrow_mut(), &mut c);
                    match decoded {
                        Ok(Decoded::End) => {
                            self.body.set(BodyState::Done);
                            return Poll::Ready(None);
                        }
                        Ok(d) => {
                            self.body.set(BodyState::Chunked(c));
                            d
                        }
                        Err(e) => {
                            self.body.set(BodyState::Failed);
                            return Poll::Ready(Some(Err(e)));
                        }
                    }
                }
            };
            match got {
                Decoded::Data(d) => return Poll::Ready(Some(Ok(d))),
                Decoded::End => return Poll::Ready(None),
                Decoded::NeedMore => match std::task::ready!(self.poll_fill_timed(cx)) {
                    Ok(0) => {
                        self.body.set(BodyState::Failed);
                        return Poll::Ready(Some(Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "client closed mid-body",
                        ))));
                    }
                    Ok(_) => continue,
                    Err(e) => {
                        self.body.set(BodyState::Failed);
                        return Poll::Ready(Some(Err(e)));
                    }
                },
            }
        }
    }

    async fn write_all(&self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            let n = poll_fn(|cx| self.poll_write(cx, data)).await?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            data = &data[n..];
        }
        Ok(())
    }

    async fn flush(&self) -> io::Result<()> {
        poll_fn(|cx| Pin::new(&mut **self.io.borrow_mut()).poll_flush(cx)).await
    }
}

/// A request body read from the client's connection as the request path pulls it.
pub struct Http1Body {
    shared: Rc<Shared>,
}

impl Body for Http1Body {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        self.shared
            .poll_body(cx)
            .map(|o| o.map(|r| r.map(Frame::data)))
    }

    fn is_end_stream(&self) -> bool {
        self.shared.body.get() == BodyState::Done
    }

    fn size_hint(&self) -> SizeHint {
        match self.shared.body.get() {
            BodyState::Length(n) => SizeHint::with_exact(n),
            BodyState::Done => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}

impl std::fmt::Debug for Http1Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Http1Body({:?})", self.shared.body.get())
    }
}

/// A client connection handed over after a 101 response (WebSocket): its socket, with the
/// bytes the client sent after its request head read first.
pub struct Upgraded {
    io: Box<dyn Io>,
    pending: Bytes,
}

impl AsyncRead for Upgraded {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.pending.is_empty() {
            let n = this.pending.len().min(buf.remaining());
            buf.put_slice(&this.pending.split_to(n));
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut *this.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Upgraded {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut *self.get_mut().io).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.get_mut().io).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut *self.get_mut().io).poll_shutdown(cx)
    }
}

/// Where the upgraded connection goes once the 101 response is written.
pub type PendingUpgrade = tokio::sync::oneshot::Receiver<Upgraded>;

/// What the request head says about the connection and the body.
pub(crate) struct Head<B> {
    pub(crate) request: Request<B>,
    /// Which groups of names the request's headers include (`header_names::seen`).
    seen: u32,
    body: BodyState,
    keep_alive: bool,
    expect_continue: bool,
    upgrade: bool,
}

/// Why a request head was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    BadRequest,
    TooLarge,
}

/// The value of a Connection header: does it list `token`?
fn has_token(v: &[u8], token: &[u8]) -> bool {
    v.split(|b| *b == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token))
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
    let mut map = HeaderMap::with_capacity(fields.len());
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
enum HeadRead<B> {
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
fn read_head<'a, S: Service>(
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
struct ReadHead<'a, S: Service> {
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

thread_local! {
    /// The Date header's value, formatted once per second.
    static DATE: RefCell<(u64, [u8; 29])> = const { RefCell::new((0, [b' '; 29])) };
}

fn push_date(out: &mut Vec<u8>) {
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

fn push_decimal(out: &mut Vec<u8>, mut n: u64) {
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
enum Framing {
    None,
    Length(u64),
    Chunked,
    /// HTTP/1.0 without a known length: the body ends when the connection closes.
    Close,
}

/// A response's headers kept outside its header map (no hash, no insert), written around
/// the map's.
struct Unmapped<'a> {
    /// The upstream's end-to-end headers as it sent them, written before the map's.
    upstream: Option<&'a RawHead>,
    /// The plugins' and Kong's own (see `runloop::handle`), written after the map's.
    outside: &'a OutsideHeaders,
}

/// Encodes a response head into `out`; returns the body's framing and whether the connection
/// must close after this response.
fn encode_head(
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
async fn write_response<B: ResponseBody>(
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

/// Reads and discards what the handler left of a request body, within bounds; false when the
/// connection cannot be reused (too much left, too slow, or unreadable).
async fn drain_body<S: Service>(svc: &S, shared: &Shared) -> bool {
    let mut seen = 0usize;
    let drained = svc
        .deadlines()
        .timeout(DRAIN_TIME, async {
            // A client that waits for 100 Continue never sends a body it was not asked for.
            if shared.expect_continue.get() {
                return false;
            }
            loop {
                match poll_fn(|cx| shared.poll_body(cx)).await {
                    None => return true,
                    Some(Ok(d)) => {
                        seen += d.len();
                        if seen > DRAIN_MAX {
                            return false;
                        }
                    }
                    Some(Err(_)) => return false,
                }
            }
        })
        .await;
    matches!(drained, Ok(true))
}

/// How long a connection that has served a request keeps its request-path state (boxed, see
/// `serve`) while waiting for the next one. A client sending back-to-back requests never gives
/// it up; one that pauses longer gives it back and waits in the connection's small state.
const ACTIVE_LINGER: Duration = Duration::from_secs(1);

/// What ended a run of requests served by `serve_active`.
enum Next {
    /// No request for `ACTIVE_LINGER`: back to waiting in the small state.
    Quiet,
    Close,
    /// The connection was handed to an upgrade (WebSocket); nothing more to do here.
    Upgraded,
}

/// What a connection does with the head it waited for: each boxed (see `serve`).
enum Step<A, R> {
    Serve(Pin<Box<A>>),
    Refuse(Pin<Box<R>>),
}

/// Serves HTTP/1.1 (and 1.0) requests on a connection until it closes.
///
/// Memory per idle connection is what an operator with many keep-alive clients pays for: a
/// connection's task is as large as its largest state, and the request path's state (routing,
/// plugins, the upstream exchange) is several KiB. So a connection waits for a request here,
/// in a small state, and serves requests in a boxed future (`serve_active`) that it keeps
/// while the client keeps sending; the box is built once per run of requests, not per request.
pub async fn serve<S: Service>(svc: &S, io: Box<dyn Io>) {
    let limits = svc.limits();
    // A head larger than this gets 431 (hyper's buffer floor was 8 KiB; kept).
    let max_head = limits.max_header_size.max(8192);
    let shared = Rc::new(Shared {
        io: RefCell::new(io),
        // Allocated when the first bytes come (see `poll_fill`).
        rbuf: RefCell::new(BytesMut::new()),
        body: Cell::new(BodyState::Done),
        expect_continue: Cell::new(false),
        continue_sent: Cell::new(0),
        body_timeout: limits.client_body_timeout,
        body_slot: Cell::new(None),
        deadlines: svc.deadlines().clone(),
    });
    loop {
        // The head goes into its box within the match arm: bound to a local of this function
        // instead, it would keep its ~300 bytes of room in this (idle) state after it moved.
        let step = match read_head(svc, &shared, max_head, None).await {
            HeadRead::Head(h) => Step::Serve(Box::pin(serve_active(svc, &shared, max_head, h))),
            HeadRead::Close | HeadRead::Quiet => break,
            // Boxed: a refusal is rare, and its write would otherwise size the idle state.
            HeadRead::Refused(why) => Step::Refuse(Box::pin(refuse(svc, &shared, why))),
        };
        match step {
            Step::Serve(active) => match active.await {
                Next::Quiet => shared.release_rbuf(),
                Next::Close => break,
                Next::Upgraded => return,
            },
            Step::Refuse(refusal) => {
                refusal.await;
                break;
            }
        }
    }
    // Sends TLS close_notify, or FIN, after the last response.
    let _ = poll_fn(|cx| Pin::new(&mut **shared.io.borrow_mut()).poll_shutdown(cx)).await;
}

/// Answers a refused request head with Kong's error; the connection then closes.
async fn refuse<S: Service>(svc: &S, shared: &Shared, why: Refused) {
    let r = svc.refusal(why);
    let _ = write_response(
        shared,
        r,
        // Not the worker's slot: a refusal never went through `Service::call`.
        &RefCell::default(),
        false,
        Version::HTTP_11,
        false,
    )
    .await;
}

/// Serves `head`'s request and those that follow it until the connection closes, upgrades, or
/// has no request for `ACTIVE_LINGER`.
async fn serve_active<S: Service>(
    svc: &S,
    shared: &Rc<Shared>,
    max_head: usize,
    head: Head<S::RequestBody>,
) -> Next {
    let mut head = head;
    loop {
        let Head {
            request,
            seen,
            body,
            keep_alive,
            expect_continue,
            upgrade,
        } = head;
        shared.body.set(body);
        shared
            .expect_continue
            .set(expect_continue && body != BodyState::Done);
        shared.continue_sent.set(0);
        let head_request = request.method() == Method::HEAD;
        let version = request.version();
        let (upgrade_tx, upgrade_rx) = if upgrade {
            let (tx, rx) = tokio::sync::oneshot::channel();
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        let resp = svc.call(request, seen, upgrade_rx).await;
        let switching = resp.status() == StatusCode::SWITCHING_PROTOCOLS;
        let reusable = match write_response(
            shared,
            resp,
            svc.outside_headers(),
            head_request,
            version,
            keep_alive && !svc.closing(),
        )
        .await
        {
            Ok(r) => r,
            Err(_) => return Next::Close,
        };
        if switching {
            if let Some(tx) = upgrade_tx {
                let io =
                    std::mem::replace(&mut *shared.io.borrow_mut(), Box::new(tokio::io::empty()));
                let pending = shared.rbuf.borrow_mut().split().freeze();
                let _ = tx.send(Upgraded { io, pending });
            }
            return Next::Upgraded;
        }
        if !reusable || svc.closing() {
            return Next::Close;
        }
        if shared.body.get() != BodyState::Done && !drain_body(svc, shared).await {
            return Next::Close;
        }
        head = match read_head(svc, shared, max_head, Some(ACTIVE_LINGER)).await {
            HeadRead::Head(h) => h,
            HeadRead::Quiet => return Next::Quiet,
            HeadRead::Close => return Next::Close,
            HeadRead::Refused(why) => {
                refuse(svc, shared, why).await;
                return Next::Close;
            }
        };
    }
}

/// A connection state with no connection behind it: for parsing heads outside a server (unit
/// tests and the fuzz targets).
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) fn detached_shared() -> Rc<Shared> {
    Rc::new(Shared {
        io: RefCell::new(Box::new(tokio::io::empty())),
        rbuf: RefCell::new(BytesMut::new()),
        body: Cell::new(BodyState::Done),
        expect_continue: Cell::new(false),
        continue_sent: Cell::new(0),
        body_timeout: Duration::from_secs(60),
        body_slot: Cell::new(None),
        deadlines: crate::worker::deadline::Deadlines::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared() -> Rc<Shared> {
        detached_shared()
    }

    fn parse(text: &[u8]) -> Result<Option<Head<Http1Body>>, Refused> {
        let mut buf = BytesMut::from(text);
        parse_head(&mut buf, &shared())
    }

    #[test]
    fn request_heads() {
        let h = parse(b"POST /a?b=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nX-A: 1\r\nX-A: 2\r\n\r\nhello")
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
        let h =
            parse(b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n")
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
}
