//! A client connection's state shared by the connection loop and the request body being
//! read: its socket, read buffer, body framing, `100 Continue` and body timeout; the request
//! body type; and the connection handed over after an upgrade.

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::http1::chunked::{self, Chunk, Decoded};
use crate::worker::deadline::Deadlines;

pub(crate) const READ_CHUNK: usize = 8 * 1024;

/// A client connection's byte stream: TCP or TLS over TCP.
pub trait Io: AsyncRead + AsyncWrite + Unpin {}
impl<T: AsyncRead + AsyncWrite + Unpin> Io for T {}

/// How much of the current request's body is still to be read from the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyState {
    Length(u64),
    Chunked(Chunk),
    Done,
    /// The body could not be read (client gone, bad chunked coding): the connection ends.
    Failed,
}

/// The connection's socket and read buffer, shared by the connection loop and the request body
/// being read. Both live on the worker's thread, and neither holds a borrow across an await.
pub(crate) struct Shared {
    pub(crate) io: RefCell<Box<dyn Io>>,
    pub(crate) rbuf: RefCell<BytesMut>,
    pub(crate) body: Cell<BodyState>,
    /// An `Expect: 100-continue` not answered yet: answered when the body is first read, so a
    /// request refused before that (401, 413) never makes the client send its body.
    pub(crate) expect_continue: Cell<bool>,
    /// Bytes of the interim "100 Continue" written so far.
    pub(crate) continue_sent: Cell<usize>,
    /// nginx's client_body_timeout: a body read that waits longer fails (408), armed only
    /// while a read waits.
    pub(crate) body_timeout: Duration,
    pub(crate) body_slot: Cell<Option<usize>>,
    pub(crate) deadlines: Rc<Deadlines>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        if let Some(s) = self.body_slot.take() {
            self.deadlines.disarm(s);
        }
    }
}

pub(crate) const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

thread_local! {
    /// The worker's read buffer for connections that hold none: an idle keep-alive connection
    /// keeps no buffer of its own (as nginx frees its header buffer); the bytes that wake it are
    /// read here and copied into a buffer it then keeps while it is active.
    static SCRATCH: RefCell<Box<[u8]>> = RefCell::new(vec![0u8; READ_CHUNK].into_boxed_slice());
}

impl Shared {
    pub(crate) fn poll_fill(&self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
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
    pub(crate) fn release_rbuf(&self) {
        let mut rbuf = self.rbuf.borrow_mut();
        if rbuf.is_empty() && rbuf.capacity() != 0 {
            *rbuf = BytesMut::new();
        }
    }

    pub(crate) fn poll_write(&self, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut **self.io.borrow_mut()).poll_write(cx, data)
    }

    pub(crate) fn poll_continue(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
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
    pub(crate) fn poll_fill_timed(&self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
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
    pub(crate) fn poll_body(&self, cx: &mut Context<'_>) -> Poll<Option<io::Result<Bytes>>> {
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

    pub(crate) async fn write_all(&self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            let n = poll_fn(|cx| self.poll_write(cx, data)).await?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            data = &data[n..];
        }
        Ok(())
    }

    pub(crate) async fn flush(&self) -> io::Result<()> {
        poll_fn(|cx| Pin::new(&mut **self.io.borrow_mut()).poll_flush(cx)).await
    }
}

/// A request body read from the client's connection as the request path pulls it.
pub struct Http1Body {
    pub(crate) shared: Rc<Shared>,
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
    pub(crate) io: Box<dyn Io>,
    pub(crate) pending: Bytes,
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
