//! The upstream's response: its head parsed (`http1::parse`) with the end-to-end headers kept
//! as they came (`RawHead`), how its body is framed, and the body itself, read from the
//! connection as the client pulls it, which goes back to its pool once the body is done.

use super::*;

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
