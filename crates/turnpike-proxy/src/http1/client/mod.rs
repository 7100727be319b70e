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

mod response;
#[cfg(test)]
mod tests;

pub(crate) use response::parse_head;
pub use response::{Framing, FramingKind, UpstreamBody};
use response::{HeadError, Parsed};
