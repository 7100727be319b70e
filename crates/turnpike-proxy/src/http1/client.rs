//! The upstream side of the proxy for HTTP/1.1, written by hand for the request path: the
//! request head is encoded straight into one buffer, the response head parsed by `h1_parse`,
//! and the response body read from the socket by the body itself as the client pulls it — no
//! task and no channel per connection (hyper's pooled client costs a task hop per request).
//! WebSocket upgrades still go through hyper's client (`pool::Pool::connect_hyper`).

use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderName, HeaderValue};
use http::{Method, StatusCode, Version};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};

use crate::body::request::RequestBody;
use crate::http1::chunked::{self, Chunk, Decoded};
use crate::http1::parse;
pub use crate::http1::raw_head::RawHead;
use crate::upstream::connect::Stream;
use crate::upstream::pool::{PeerKey, Pool, Pooled};
use crate::worker::deadline::Deadlines;

/// Response heads larger than this are refused (nginx's proxy_buffer_size is 4-8k; be generous).
const MAX_HEAD: usize = 64 * 1024;
const MAX_HEADERS: usize = 128;
const READ_CHUNK: usize = 16 * 1024;

/// Headers the proxy sets on the upstream request, replacing the client's of the same name
/// (`None`: the client's is dropped); the first is always Host. Written straight into the
/// request head, which saves a header-map insert per header; merged into the map for upgrades.
#[derive(Debug)]
pub struct Overrides {
    list: smallvec::SmallVec<[(HeaderName, Option<HeaderValue>); 12]>,
    /// False when no client header can share a name with these but Host (the parser saw none
    /// of the others' names): each client header is then compared with Host alone.
    others_may_clash: bool,
}

impl Overrides {
    pub fn new(others_may_clash: bool) -> Overrides {
        Overrides {
            list: smallvec::smallvec![(header::HOST, None)],
            others_may_clash,
        }
    }

    /// Whether a client header other than Host can share a name with these.
    pub fn set_others_may_clash(&mut self, may: bool) {
        self.others_may_clash = may;
    }

    /// Whether the client's header `name` is replaced by one of these.
    #[inline]
    fn replaces(&self, name: &HeaderName) -> bool {
        if self.others_may_clash {
            self.list.iter().any(|(n, _)| n == name)
        } else {
            name == header::HOST
        }
    }
}

impl std::ops::Deref for Overrides {
    type Target = smallvec::SmallVec<[(HeaderName, Option<HeaderValue>); 12]>;
    fn deref(&self) -> &Self::Target {
        &self.list
    }
}

impl std::ops::DerefMut for Overrides {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.list
    }
}

/// A service's write and read timeouts for one exchange.
#[derive(Clone, Copy)]
pub struct Timeouts {
    pub write: Duration,
    pub read: Duration,
}

/// An upstream HTTP/1.1 connection, idle in a pool or carrying one request.
pub struct Conn {
    stream: Stream,
    /// Bytes read from the upstream and not consumed yet.
    buf: BytesMut,
    /// The request head being written; kept to reuse its allocation.
    head: Vec<u8>,
    /// The end-to-end headers of the response being read (until its body is done).
    pub raw: RawHead,
    pub key: PeerKey,
    /// Requests carried, including the current one.
    pub used: u64,
}

#[derive(Debug)]
pub enum SendError {
    /// Nothing of the request reached a live upstream (a pooled connection was already
    /// closed): the request can go on another connection. The body is handed back.
    Retry(Option<ClientBody>),
    /// The request went out but no byte of a response came back: the read timed out or the
    /// connection failed first. `resend` holds what sending it again takes (no body, or the
    /// buffered body) or `None` when a streamed body is gone.
    Unanswered {
        timed_out: bool,
        resend: Option<Option<ClientBody>>,
    },
    /// The response head started but did not finish in time.
    Timeout,
    Failed(io::Error),
    /// The client's body could not be read (it stalled past client_body_timeout, or the client
    /// went away): the upstream got an incomplete request and the connection is dropped.
    ClientBody {
        timed_out: bool,
    },
    /// The client's body passed the size limit a plugin set (request-size-limiting): the
    /// upstream got an incomplete request (the stream was cut), and the client gets 413.
    BodyTooLarge,
}

/// A client's request body on its way upstream, with the most bytes it may carry (set by
/// request-size-limiting; checked as it streams).
#[derive(Debug)]
pub struct ClientBody {
    pub source: BodySource,
    pub limit: Option<u64>,
}

/// Where the body comes from: streamed from the client, or read whole already (a plugin
/// needed it; it goes with its Content-Length).
#[derive(Debug)]
pub enum BodySource {
    Stream(RequestBody),
    Buffered(bytes::Bytes),
    /// Read whole before the upstream was chosen (the route's request_buffering): sent with
    /// its Content-Length, and again on a retry.
    Spooled(crate::body::spool::Spool),
}

impl ClientBody {
    pub fn is_empty(&self) -> bool {
        match &self.source {
            BodySource::Stream(s) => s.is_end_stream(),
            BodySource::Buffered(b) => b.is_empty(),
            BodySource::Spooled(s) => s.is_empty(),
        }
    }
}

/// Reads and discards what is left of a refused client body, within bounds, so the client
/// (still sending) can read the error instead of meeting a reset: nginx's lingering close.
async fn drain(body: &mut RequestBody) {
    const MAX_BYTES: usize = 4 << 20;
    const MAX_TIME: Duration = Duration::from_secs(2);
    let _ = tokio::time::timeout(MAX_TIME, async {
        let mut seen = 0;
        while let Some(Ok(frame)) = body.frame().await {
            seen += frame.data_ref().map_or(0, |d| d.len());
            if seen > MAX_BYTES {
                break;
            }
        }
    })
    .await;
}

fn other(msg: &str) -> io::Error {
    io::Error::other(msg.to_string())
}

impl Pooled for Conn {
    fn key(&self) -> PeerKey {
        self.key
    }
    fn used(&self) -> u64 {
        self.used
    }
    fn reused(&mut self) {
        self.used += 1;
    }
    fn idle_alive(&mut self) -> bool {
        Conn::idle_alive(self)
    }
}

impl Conn {
    pub fn new(stream: Stream, key: PeerKey) -> Conn {
        Conn {
            stream,
            buf: BytesMut::with_capacity(READ_CHUNK),
            head: Vec::with_capacity(1024),
            raw: RawHead::default(),
            key,
            used: 1,
        }
    }

    /// True when an idle connection still looks usable: nothing to read and not closed.
    pub fn idle_alive(&mut self) -> bool {
        if !self.buf.is_empty() {
            return false;
        }
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut probe = [0u8; 1];
        let mut rb = ReadBuf::new(&mut probe);
        matches!(
            Pin::new(&mut self.stream).poll_read(&mut cx, &mut rb),
            Poll::Pending
        )
    }

    /// One write attempt without waiting: `None` when the socket would block.
    fn try_write_now(&mut self, data: &[u8]) -> Option<io::Result<usize>> {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match Pin::new(&mut self.stream).poll_write(&mut cx, data) {
            Poll::Ready(r) => Some(r),
            Poll::Pending => None,
        }
    }

    /// Writes all of `data`, arming the write timeout only when the socket would block.
    async fn write_all(&mut self, data: &[u8], timeout: Duration) -> io::Result<()> {
        let mut data = data;
        while !data.is_empty() {
            let n = match self.try_write_now(data) {
                Some(r) => r?,
                None => match tokio::time::timeout(timeout, self.stream.write(data)).await {
                    Ok(r) => r?,
                    Err(_) => {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "upstream write timed out",
                        ))
                    }
                },
            };
            if n == 0 {
                return Err(io::Error::new(io::ErrorKind::WriteZero, "upstream closed"));
            }
            data = &data[n..];
        }
        Ok(())
    }

    /// Sends a request and reads the response head. `body` is `None` for a request without
    /// a body. Returns the response head and how its body is framed.
    pub async fn send(
        &mut self,
        req: &http::request::Parts,
        body: Option<ClientBody>,
        overrides: &Overrides,
        timeouts: Timeouts,
        deadlines: &Rc<Deadlines>,
    ) -> Result<(http::response::Parts, Framing), SendError> {
        let Timeouts {
            write: write_timeout,
            read: read_timeout,
        } = timeouts;
        let reused = self.used > 1;
        // The head, in one buffer.
        let mut head = std::mem::take(&mut self.head);
        head.clear();
        head.extend_from_slice(req.method.as_str().as_bytes());
        head.push(b' ');
        head.extend_from_slice(
            req.uri
                .path_and_query()
                .map(|p| p.as_str())
                .unwrap_or("/")
                .as_bytes(),
        );
        head.extend_from_slice(b" HTTP/1.1\r\n");
        for (name, value) in &req.headers {
            // A header the proxy sets replaces the client's.
            if overrides.replaces(name) {
                continue;
            }
            head.extend_from_slice(name.as_str().as_bytes());
            head.extend_from_slice(b": ");
            head.extend_from_slice(value.as_bytes());
            head.extend_from_slice(b"\r\n");
        }
        for (name, value) in overrides.iter() {
            if let Some(value) = value {
                head.extend_from_slice(name.as_str().as_bytes());
                head.extend_from_slice(b": ");
                head.extend_from_slice(value.as_bytes());
                head.extend_from_slice(b"\r\n");
            }
        }
        let chunked = body.is_some() && !req.headers.contains_key(header::CONTENT_LENGTH);
        if chunked {
            head.extend_from_slice(b"transfer-encoding: chunked\r\n");
        }
        head.extend_from_slice(b"\r\n");
        let written = self.write_all(&head, write_timeout).await;
        self.head = head;
        if let Err(e) = written {
            return Err(if reused && e.kind() != io::ErrorKind::TimedOut {
                SendError::Retry(body)
            } else {
                SendError::Failed(e)
            });
        }
        let had_body = body.is_some();
        // What a retry needs, kept before the body is consumed (a streamed body cannot be).
        let resend = match &body {
            None => Some(None),
            Some(ClientBody {
                source: BodySource::Buffered(data),
                limit,
            }) => Some(Some(ClientBody {
                source: BodySource::Buffered(data.clone()),
                limit: *limit,
            })),
            Some(ClientBody {
                source: BodySource::Spooled(spool),
                limit,
            }) => Some(Some(ClientBody {
                source: BodySource::Spooled(spool.clone()),
                limit: *limit,
            })),
            Some(_) => None,
        };
        if let Some(ClientBody {
            source: BodySource::Buffered(data),
            limit,
        }) = &body
        {
            if limit.is_some_and(|l| data.len() as u64 > l) {
                return Err(SendError::BodyTooLarge);
            }
            self.write_all(data, write_timeout)
                .await
                .map_err(SendError::Failed)?;
        } else if let Some(ClientBody {
            source: BodySource::Spooled(spool),
            limit,
        }) = &body
        {
            if limit.is_some_and(|l| spool.len() > l) {
                return Err(SendError::BodyTooLarge);
            }
            let mut at = 0u64;
            while let Some(piece) = spool.piece_at(at).await.map_err(SendError::Failed)? {
                at += piece.len() as u64;
                self.write_all(&piece, write_timeout)
                    .await
                    .map_err(SendError::Failed)?;
            }
        } else if let Some(ClientBody {
            source: BodySource::Stream(mut body),
            limit: body_limit,
        }) = body
        {
            let mut sent: u64 = 0;
            while let Some(frame) = body.frame().await {
                let frame = frame.map_err(|e| SendError::ClientBody {
                    timed_out: e
                        .downcast_ref::<io::Error>()
                        .is_some_and(|e| e.kind() == io::ErrorKind::TimedOut),
                })?;
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                if data.is_empty() {
                    continue;
                }
                // Checked before the bytes go out, so the upstream never sees more than the
                // limit; a chunked body is cut before its terminating chunk, so the upstream
                // never takes it for a complete request.
                sent += data.len() as u64;
                if body_limit.is_some_and(|l| sent > l) {
                    drain(&mut body).await;
                    return Err(SendError::BodyTooLarge);
                }
                if chunked {
                    let mut size = Vec::with_capacity(18);
                    chunked::push_size_line(&mut size, data.len());
                    self.write_all(&size, write_timeout)
                        .await
                        .map_err(SendError::Failed)?;
                    self.write_all(&data, write_timeout)
                        .await
                        .map_err(SendError::Failed)?;
                    self.write_all(b"\r\n", write_timeout)
                        .await
                        .map_err(SendError::Failed)?;
                } else {
                    self.write_all(&data, write_timeout)
                        .await
                        .map_err(SendError::Failed)?;
                }
            }
            if chunked {
                self.write_all(chunked::LAST_CHUNK, write_timeout)
                    .await
                    .map_err(SendError::Failed)?;
            }
        }
        match deadlines
            .timeout(read_timeout, self.read_head(&req.method))
            .await
        {
            Err(_) if self.buf.is_empty() => Err(SendError::Unanswered {
                timed_out: true,
                resend,
            }),
            Err(_) => Err(SendError::Timeout),
            Ok(Ok(r)) => Ok(r),
            // A pooled connection closed by the upstream before any response byte: a request
            // without a body can safely go again on a fresh connection.
            Ok(Err(HeadError::ClosedBeforeResponse)) if reused && !had_body => {
                Err(SendError::Retry(None))
            }
            Ok(Err(HeadError::ClosedBeforeResponse)) => Err(SendError::Unanswered {
                timed_out: false,
                resend,
            }),
            Ok(Err(HeadError::Io(e))) => Err(SendError::Failed(e)),
        }
    }

    async fn fill(&mut self) -> io::Result<usize> {
        self.buf.reserve(READ_CHUNK);
        std::future::poll_fn(|cx| {
            tokio_util::io::poll_read_buf(Pin::new(&mut self.stream), cx, &mut self.buf)
        })
        .await
    }

    async fn read_head(
        &mut self,
        method: &Method,
    ) -> Result<(http::response::Parts, Framing), HeadError> {
        let mut seen_bytes = !self.buf.is_empty();
        loop {
            if !self.buf.is_empty() {
                seen_bytes = true;
                if let Some(parsed) = parse_head(&mut self.buf, method, &mut self.raw)? {
                    match parsed {
                        Parsed::Informational => continue,
                        Parsed::Head(parts, framing) => return Ok((parts, framing)),
                    }
                }
            }
            let n = self.fill().await.map_err(|e| {
                if seen_bytes {
                    HeadError::Io(e)
                } else {
                    HeadError::ClosedBeforeResponse
                }
            })?;
            if n == 0 {
                return Err(if seen_bytes {
                    HeadError::Io(other("upstream closed mid-head"))
                } else {
                    HeadError::ClosedBeforeResponse
                });
            }
        }
    }
}

pub(crate) enum HeadError {
    ClosedBeforeResponse,
    Io(io::Error),
}

impl From<io::Error> for HeadError {
    fn from(e: io::Error) -> Self {
        HeadError::Io(e)
    }
}

pub(crate) enum Parsed {
    /// A 1xx interim response, skipped.
    Informational,
    Head(http::response::Parts, Framing),
}

/// How a response body is delimited, and whether the connection can be reused after it.
#[derive(Debug, Clone, Copy)]
pub struct Framing {
    pub kind: FramingKind,
    pub keep_alive: bool,
    /// The head had headers named like Kong's own (X-Kong-*): the proxy replaces them in the
    /// header map instead of writing its own beside them.
    pub named_kong_headers: bool,
}

#[derive(Debug, Clone, Copy)]
pub enum FramingKind {
    Empty,
    Length(u64),
    Chunked,
    UntilClose,
}

/// Parses a response head from the front of `buf`; `None` when it is not complete yet.
pub(crate) fn parse_head(
    buf: &mut BytesMut,
    method: &Method,
    raw: &mut RawHead,
) -> Result<Option<Parsed>, HeadError> {
    // Header lines as offsets into the head's bytes: values are sliced from them, not copied.
    let mut ranges: smallvec::SmallVec<[parse::Field; 16]> = smallvec::SmallVec::new();
    let (line, len) = match parse::response(buf, MAX_HEADERS, |f| ranges.push(f)) {
        Ok(Some(parsed)) => parsed,
        Ok(None) => {
            if buf.len() > MAX_HEAD {
                return Err(HeadError::Io(other("upstream response head too large")));
            }
            return Ok(None);
        }
        Err(e) => {
            return Err(HeadError::Io(other(&format!(
                "invalid upstream response: {e}"
            ))))
        }
    };
    let status = StatusCode::from_u16(line.code)
        .map_err(|_| HeadError::Io(other("invalid upstream status")))?;
    let version = if line.minor == 0 {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    let head = buf.split_to(len).freeze();
    if status.is_informational() && status != StatusCode::SWITCHING_PROTOCOLS {
        return Ok(Some(Parsed::Informational));
    }
    // Hop-by-hop headers (RFC 9110 §7.6.1) are consumed here, never kept: the response
    // handed to the client side carries only end-to-end headers. Those are kept as ranges
    // into the head's bytes (`RawHead`), not in a header map: the HTTP/1.1 client side writes
    // them out as they came (no hash, no value objects), and a map is built from them only
    // when something needs one (`RawHead::merge_into`).
    raw.clear();
    raw.bytes = head;
    let mut chunked = false;
    let mut length: Option<u64> = None;
    let mut conn_close = version == Version::HTTP_10;
    let mut named_by_connection: smallvec::SmallVec<[(usize, usize); 2]> =
        smallvec::SmallVec::new();
    let mut seen = 0u32;
    for parse::Field {
        name_start: ns,
        name_end: ne,
        value_start: vs,
        value_end: ve,
    } in ranges
    {
        let name = &raw.bytes[ns..ne];
        let value = &raw.bytes[vs..ve];
        if let Some((_, known, bit)) = crate::http1::header_names::known_name(name) {
            seen |= bit;
            if bit & crate::http1::header_names::seen::HOP_BY_HOP != 0 {
                if *known == header::TRANSFER_ENCODING {
                    chunked = value
                        .rsplit(|b| *b == b',')
                        .next()
                        .is_some_and(|last| last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
                } else if *known == header::CONNECTION {
                    for t in value.split(|b| *b == b',') {
                        let t = t.trim_ascii();
                        if t.eq_ignore_ascii_case(b"close") {
                            conn_close = true;
                        } else if t.eq_ignore_ascii_case(b"keep-alive") {
                            if version == Version::HTTP_10 {
                                conn_close = false;
                            }
                        } else if !t.is_empty() && !t.eq_ignore_ascii_case(b"upgrade") {
                            let at = t.as_ptr() as usize - raw.bytes.as_ptr() as usize;
                            named_by_connection.push((at, at + t.len()));
                        }
                    }
                }
                continue;
            } else if *known == header::CONTENT_LENGTH {
                let n = std::str::from_utf8(value)
                    .ok()
                    .and_then(|s| s.trim().parse::<u64>().ok());
                match (n, length) {
                    (Some(n), None) => length = Some(n),
                    (Some(n), Some(prev)) if n == prev => {}
                    _ => return Err(HeadError::Io(other("invalid upstream content-length"))),
                }
            } else if *known == header::DATE {
                raw.has_date = true;
            }
        }
        raw.lines.push([ns as u32, ne as u32, vs as u32, ve as u32]);
    }
    // Whether the client gets the upstream's Content-Length line (the body's framing uses
    // `length` either way).
    let mut length_line = length.is_some();
    if !named_by_connection.is_empty() {
        let bytes = &raw.bytes;
        raw.lines.retain(|l| {
            let name = &bytes[l[0] as usize..l[1] as usize];
            !named_by_connection
                .iter()
                .any(|&(s, e)| bytes[s..e].eq_ignore_ascii_case(name))
        });
        // What the lines say must hold for the lines left: a Date or Content-Length named by
        // Connection is gone, and the client side writes its own.
        let kept = |n: &[u8]| raw.names().any(|x| x.eq_ignore_ascii_case(n));
        let (date_kept, length_kept) = (kept(b"date"), kept(b"content-length"));
        raw.has_date &= date_kept;
        length_line &= length_kept;
    }
    // A body framed by transfer-encoding has no content-length (RFC 9112 §6.3).
    if chunked && length.is_some() {
        let bytes = &raw.bytes;
        raw.lines.retain(|l| {
            !bytes[l[0] as usize..l[1] as usize].eq_ignore_ascii_case(b"content-length")
        });
        length = None;
    }
    raw.content_length = length.filter(|_| length_line);
    let kind = if *method == Method::HEAD
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        FramingKind::Empty
    } else if chunked {
        FramingKind::Chunked
    } else if let Some(n) = length {
        if n == 0 {
            FramingKind::Empty
        } else {
            FramingKind::Length(n)
        }
    } else {
        FramingKind::UntilClose
    };
    let keep_alive = !conn_close && !matches!(kind, FramingKind::UntilClose);
    let mut parts = http::Response::new(()).into_parts().0;
    parts.status = status;
    parts.version = version;
    Ok(Some(Parsed::Head(
        parts,
        Framing {
            kind,
            keep_alive,
            named_kong_headers: seen & crate::http1::header_names::seen::KONG != 0,
        },
    )))
}

/// Reads more upstream bytes into the connection's buffer, or returns from `poll_next`.
macro_rules! fill_or_return {
    ($self:ident, $conn:expr, $cx:expr) => {
        match UpstreamBody::poll_fill(
            $conn,
            $cx,
            &$self.deadlines,
            &mut $self.slot,
            $self.read_timeout,
        ) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Err(e)) => return Poll::Ready(Some(Err(e))),
            Poll::Ready(Ok(n)) => n,
        }
    };
}

/// The response body, read from the upstream connection as the client pulls it. At its end
/// the connection goes back to the worker's pool when it can be reused.
pub struct UpstreamBody {
    /// The response head had headers named like Kong's own (X-Kong-*).
    pub named_kong_headers: bool,
    conn: Option<Box<Conn>>,
    pool: Rc<Pool<Conn>>,
    /// The service's read timeout between two reads of the body, and its armed slot while a
    /// read waits.
    read_timeout: Duration,
    deadlines: Rc<Deadlines>,
    slot: Option<usize>,
    kind: FramingKind,
    chunk: Chunk,
    keep_alive: bool,
    done: bool,
}

impl UpstreamBody {
    pub fn new(
        conn: Box<Conn>,
        pool: Rc<Pool<Conn>>,
        framing: Framing,
        read_timeout: Duration,
        deadlines: Rc<Deadlines>,
    ) -> UpstreamBody {
        let mut b = UpstreamBody {
            named_kong_headers: framing.named_kong_headers,
            conn: Some(conn),
            pool,
            read_timeout,
            deadlines,
            slot: None,
            kind: framing.kind,
            chunk: Chunk::Size,
            keep_alive: framing.keep_alive,
            done: false,
        };
        // An empty body is done at once, but the connection stays until the body is polled
        // or dropped: it holds the response's headers (`raw_head`) until they are written.
        if matches!(framing.kind, FramingKind::Empty) {
            b.done = true;
        }
        b
    }

    fn finish(&mut self) {
        self.done = true;
        if let Some(mut conn) = self.conn.take() {
            if self.keep_alive {
                conn.raw.clear();
                self.pool.put(conn);
            }
        }
    }

    /// The response's end-to-end headers as the upstream sent them, until the body is read.
    pub fn raw_head(&self) -> Option<&RawHead> {
        self.conn.as_deref().map(|c| &c.raw)
    }

    pub fn raw_head_mut(&mut self) -> Option<&mut RawHead> {
        self.conn.as_deref_mut().map(|c| &mut c.raw)
    }

    /// Reads more of the body into the connection's buffer; a read that waits longer than the
    /// service's read timeout fails (the connection is then dropped, not pooled).
    fn poll_fill(
        conn: &mut Conn,
        cx: &mut Context<'_>,
        deadlines: &Deadlines,
        slot: &mut Option<usize>,
        read_timeout: Duration,
    ) -> Poll<io::Result<usize>> {
        conn.buf.reserve(READ_CHUNK);
        match tokio_util::io::poll_read_buf(Pin::new(&mut conn.stream), cx, &mut conn.buf) {
            Poll::Pending => {
                let s = *slot.get_or_insert_with(|| deadlines.arm(read_timeout));
                if deadlines.poll_expired(s, cx) {
                    deadlines.disarm(s);
                    *slot = None;
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "upstream read timed out",
                    )));
                }
                Poll::Pending
            }
            ready => {
                if let Some(s) = slot.take() {
                    deadlines.disarm(s);
                }
                ready
            }
        }
    }

    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<io::Result<Bytes>>> {
        loop {
            if self.done {
                if self.conn.is_some() {
                    // An empty body (see `new`): its connection goes back now.
                    self.finish();
                }
                return Poll::Ready(None);
            }
            let Some(conn) = self.conn.as_mut() else {
                return Poll::Ready(None);
            };
            match self.kind {
                FramingKind::Empty => {
                    self.finish();
                    return Poll::Ready(None);
                }
                FramingKind::Length(remaining) => {
                    if conn.buf.is_empty() {
                        match fill_or_return!(self, conn, cx) {
                            0 => return Poll::Ready(Some(Err(other("upstream closed mid-body")))),
                            _ => continue,
                        }
                    }
                    let n = remaining.min(conn.buf.len() as u64) as usize;
                    let data = conn.buf.split_to(n).freeze();
                    let left = remaining - n as u64;
                    self.kind = FramingKind::Length(left);
                    if left == 0 {
                        self.finish();
                    }
                    return Poll::Ready(Some(Ok(data)));
                }
                FramingKind::UntilClose => {
                    if conn.buf.is_empty() {
                        match fill_or_return!(self, conn, cx) {
                            0 => {
                                self.keep_alive = false;
                                self.finish();
                                return Poll::Ready(None);
                            }
                            _ => continue,
                        }
                    }
                    let data = conn.buf.split().freeze();
                    return Poll::Ready(Some(Ok(data)));
                }
                FramingKind::Chunked => match chunked::decode(&mut conn.buf, &mut self.chunk) {
                    Ok(Decoded::Data(data)) => return Poll::Ready(Some(Ok(data))),
                    Ok(Decoded::End) => {
                        self.finish();
                        return Poll::Ready(None);
                    }
                    Ok(Decoded::NeedMore) => match fill_or_return!(self, conn, cx) {
                        0 => return Poll::Ready(Some(Err(other("upstream closed mid-chunk")))),
                        _ => continue,
                    },
                    Err(e) => return Poll::Ready(Some(Err(e))),
                },
            }
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        self.get_mut()
            .poll_next(cx)
            .map(|o| o.map(|r| r.map(Frame::data)))
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }

    fn size_hint(&self) -> SizeHint {
        match self.kind {
            FramingKind::Length(n) if !self.done => SizeHint::with_exact(n),
            FramingKind::Empty => SizeHint::with_exact(0),
            _ if self.done => SizeHint::with_exact(0),
            _ => SizeHint::default(),
        }
    }
}

impl Drop for UpstreamBody {
    fn drop(&mut self) {
        if let Some(s) = self.slot.take() {
            self.deadlines.disarm(s);
        }
        if self.done {
            // An empty body never polled: its connection is reusable.
            self.finish();
        }
        // Dropped before its end (client gone): the connection is in an unknown state and is
        // closed with it rather than pooled.
        self.conn.take();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::pool::PoolSettings;
    use crate::worker::stats::WorkerStats;
    use tokio::io::AsyncWriteExt;

    fn head(text: &str, method: &Method) -> Result<Option<Parsed>, HeadError> {
        let mut buf = BytesMut::from(text.as_bytes());
        parse_head(&mut buf, method, &mut RawHead::default())
    }

    /// The head parsed, its kept headers merged into the map; and the raw head as encoded.
    fn parts(text: &str) -> (http::response::Parts, Framing) {
        parts_and_encoded(text).0
    }

    fn parts_and_encoded(text: &str) -> ((http::response::Parts, Framing), String) {
        let mut buf = BytesMut::from(text.as_bytes());
        let mut raw = RawHead::default();
        match parse_head(&mut buf, &Method::GET, &mut raw) {
            Ok(Some(Parsed::Head(mut p, f))) => {
                let mut encoded = Vec::new();
                raw.encode(&mut encoded);
                raw.merge_into(&mut p.headers);
                assert!(raw.lines.is_empty());
                ((p, f), String::from_utf8(encoded).unwrap())
            }
            _ => panic!("expected a complete head"),
        }
    }

    #[test]
    fn raw_heads_are_written_as_they_came_without_hop_by_hop_headers() {
        let (_, encoded) = parts_and_encoded(
            "HTTP/1.1 200 OK\r\nServer: up\r\nDate: x\r\nConnection: keep-alive, X-Secret\r\nX-Secret: 1\r\nContent-Type: text/plain\r\nContent-Length: 5\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\n\r\n",
        );
        assert_eq!(
            encoded,
            "Server: up\r\nDate: x\r\nContent-Type: text/plain\r\nContent-Length: 5\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\n"
        );
        // Bare LF line ends, trailing blanks and a chunked body's Content-Length.
        let (_, encoded) = parts_and_encoded(
            "HTTP/1.1 200 OK\nA:1\nB:  2  \r\nTransfer-Encoding: chunked\r\nContent-Length: 9\r\nC: 3\r\n\r\n",
        );
        assert_eq!(encoded, "A:1\r\nB:  2\r\nC: 3\r\n");
        let mut raw = RawHead::default();
        let mut buf = BytesMut::from(
            &b"HTTP/1.1 304 Not Modified\r\nDate: d\r\nContent-Length: 7\r\n\r\n"[..],
        );
        assert!(parse_head(&mut buf, &Method::GET, &mut raw).is_ok());
        assert_eq!(raw.content_length, Some(7));
        assert!(raw.has_date);
        assert_eq!(
            raw.names().collect::<Vec<_>>(),
            [&b"Date"[..], b"Content-Length"]
        );
        // Date and Content-Length named by Connection: dropped, and not counted as sent (the
        // client side then writes its own); the body is still framed by the length.
        let mut raw = RawHead::default();
        let mut buf = BytesMut::from(
            &b"HTTP/1.1 200 OK\r\nConnection: Date, Content-Length\r\nDate: d\r\nContent-Length: 3\r\nX: y\r\n\r\n"[..],
        );
        match parse_head(&mut buf, &Method::GET, &mut raw) {
            Ok(Some(Parsed::Head(_, f))) => assert!(matches!(f.kind, FramingKind::Length(3))),
            _ => panic!("expected a complete head"),
        }
        assert_eq!(raw.names().collect::<Vec<_>>(), [&b"X"[..]]);
        assert!(!raw.has_date && raw.content_length.is_none());
    }

    #[test]
    fn response_heads() {
        let (p, f) = parts("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: keep-alive, X-Secret\r\nX-Secret: 1\r\nKeep-Alive: timeout=5\r\nX-Kept: y\r\n\r\n");
        assert_eq!(p.status, 200);
        assert!(matches!(f.kind, FramingKind::Length(5)) && f.keep_alive);
        // Hop-by-hop headers and those named by Connection never reach the client side.
        assert!(p.headers.get("connection").is_none() && p.headers.get("keep-alive").is_none());
        assert!(p.headers.get("x-secret").is_none());
        assert_eq!(p.headers["x-kept"], "y");
        assert_eq!(p.headers["content-length"], "5");

        let (p, f) =
            parts("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 9\r\n\r\n");
        assert!(matches!(f.kind, FramingKind::Chunked));
        assert!(
            p.headers.get("content-length").is_none()
                && p.headers.get("transfer-encoding").is_none()
        );

        let (_, f) = parts("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\n");
        assert!(!f.keep_alive);
        let (_, f) = parts("HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\n");
        assert!(!f.keep_alive, "HTTP/1.0 closes unless it says keep-alive");
        let (_, f) =
            parts("HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\n");
        assert!(f.keep_alive);
        let (_, f) = parts("HTTP/1.1 200 OK\r\n\r\n");
        assert!(matches!(f.kind, FramingKind::UntilClose) && !f.keep_alive);
        let (_, f) = parts("HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n");
        assert!(matches!(f.kind, FramingKind::Empty));
        match head(
            "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n",
            &Method::HEAD,
        ) {
            Ok(Some(Parsed::Head(_, f))) => assert!(matches!(f.kind, FramingKind::Empty)),
            _ => panic!(),
        }
        assert!(matches!(
            head("HTTP/1.1 100 Continue\r\n\r\n", &Method::GET),
            Ok(Some(Parsed::Informational))
        ));
        assert!(matches!(
            head("HTTP/1.1 200 OK\r\nContent-Le", &Method::GET),
            Ok(None)
        ));
        for bad in [
            "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
            "NOPE\r\n\r\n",
            "HTTP/1.1 99999 X\r\n\r\n",
        ] {
            assert!(
                matches!(head(bad, &Method::GET), Err(HeadError::Io(_))),
                "{bad:?}"
            );
        }
    }

    /// Serves `pieces` one write at a time on a real socket and reads one response through a
    /// `Conn`; returns the body and whether the connection went back to the pool.
    async fn exchange(pieces: Vec<&'static [u8]>) -> (Result<Vec<u8>, String>, usize) {
        exchange_holding(pieces, Duration::from_millis(200)).await
    }

    /// Like `exchange`, the upstream keeping the connection open `hold` after its last piece.
    async fn exchange_holding(
        pieces: Vec<&'static [u8]>,
        hold: Duration,
    ) -> (Result<Vec<u8>, String>, usize) {
        tokio::task::LocalSet::new()
            .run_until(exchange_inner(pieces, hold))
            .await
    }

    async fn exchange_inner(
        pieces: Vec<&'static [u8]>,
        hold: Duration,
    ) -> (Result<Vec<u8>, String>, usize) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut req = [0u8; 1024];
            let _ = tokio::io::AsyncReadExt::read(&mut s, &mut req).await;
            for p in pieces {
                s.write_all(p).await.unwrap();
                s.flush().await.unwrap();
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            tokio::time::sleep(hold).await;
        });
        let stats = std::sync::Arc::new(WorkerStats::default());
        let pool = Pool::new(
            PoolSettings {
                size: 4,
                max_requests: 100,
                idle_timeout: Duration::from_secs(60),
            },
            stats,
            crate::worker::deadline::Deadlines::new(),
        );
        let key = PeerKey {
            peer: 0,
            tls: None,
            dns: 0,
        };
        let stream = pool
            .open(key.peer, addr, None, Duration::from_secs(1))
            .await
            .unwrap();
        let mut conn = Box::new(Conn::new(stream, key));
        let req = http::Request::get("/")
            .header("host", "x")
            .body(())
            .unwrap()
            .into_parts()
            .0;
        let (_, framing) = match conn
            .send(
                &req,
                None,
                &Overrides::new(true),
                Timeouts {
                    write: Duration::from_secs(1),
                    read: Duration::from_secs(1),
                },
                &crate::worker::deadline::Deadlines::new(),
            )
            .await
        {
            Ok(x) => x,
            Err(e) => return (Err(format!("{e:?}")), 0),
        };
        let deadlines = crate::worker::deadline::Deadlines::new();
        let ticker = tokio::task::spawn_local(deadlines.clone().run());
        let body = UpstreamBody::new(
            conn,
            pool.clone(),
            framing,
            Duration::from_millis(100),
            deadlines,
        );
        let collected = http_body_util::BodyExt::collect(body)
            .await
            .map(|b| b.to_bytes().to_vec())
            .map_err(|e| e.to_string());
        ticker.abort();
        (collected, pool.idle_count())
    }

    #[tokio::test]
    async fn chunked_bodies_split_anywhere_are_decoded() {
        let (body, idle) = exchange(vec![
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5",
            b";ext=1\r\nhel",
            b"lo\r",
            b"\n6\r\n world\r\n0\r\nTrailer: x\r\n",
            b"\r\n",
        ])
        .await;
        assert_eq!(body.unwrap(), b"hello world");
        assert_eq!(
            idle, 1,
            "a complete chunked body returns the connection to the pool"
        );
    }

    #[tokio::test]
    async fn length_bodies_and_truncation() {
        let (body, idle) = exchange(vec![
            b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n01234",
            b"56789",
        ])
        .await;
        assert_eq!(body.unwrap(), b"0123456789");
        assert_eq!(idle, 1);
        // The upstream closes after 3 of 10 bytes: an error, and the connection is not reused.
        let (body, idle) =
            exchange(vec![b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"]).await;
        assert!(body.is_err());
        assert_eq!(idle, 0);
        let (body, idle) = exchange(vec![
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        ])
        .await;
        assert!(body.is_err(), "invalid chunk size");
        assert_eq!(idle, 0);
        // Read until close: complete at EOF, never pooled.
        // (The upstream closes 20 ms after its last byte, well within the 100 ms read timeout.)
        let (body, idle) = exchange_holding(
            vec![b"HTTP/1.0 200 OK\r\n\r\nall of it"],
            Duration::from_millis(20),
        )
        .await;
        assert_eq!(body.unwrap(), b"all of it");
        assert_eq!(idle, 0);
    }

    #[tokio::test]
    async fn a_stalled_body_times_out_instead_of_hanging() {
        let (body, idle) = exchange_holding(
            vec![b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"],
            Duration::from_secs(5),
        )
        .await;
        // Without the timeout the body would fail only when the upstream closes, 5 s later,
        // with "closed mid-body".
        let err = body.unwrap_err();
        assert!(err.contains("timed out"), "{err}");
        assert_eq!(idle, 0, "a timed-out connection is not pooled");
    }
}
