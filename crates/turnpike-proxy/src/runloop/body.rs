//! The response body type of the proxy: the upstream's body read straight from the upstream
//! connection (HTTP/1.1, returning the connection to its pool at the end), an upgraded or
//! otherwise hyper-driven body, or a body we produced; and the request's guard, which ends
//! the request (its log phase, its access-log line) when the body is done.

use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use crate::body::idle::ReadIdle;
use crate::body::readahead::{self, ReadAhead};
use crate::body::request::{boxed, BoxError};
use crate::http1::client::{RawHead, UpstreamBody};
use crate::runloop::body_filter::Filtered;
use crate::runloop::log::LogState;
use crate::worker::access_log::AccessRecord;
use crate::worker::ctx::{ConnInfo, WorkerCtx};

pub enum BodyKind {
    Upstream(UpstreamBody),
    Hyper(Incoming),
    /// A gRPC upstream's body, ended when the upstream is quiet past the read timeout.
    Grpc(ReadIdle<Incoming>),
    Full(Option<Bytes>),
    /// A body passed through plugins' body_filter phases.
    Filtered(Box<Filtered<BodyKind>>),
    /// The upstream's body read ahead of the client (the route's response_buffering).
    ReadAhead(ReadAhead),
}

/// What each kind of body is: the `ProxyBody` around it only adds the request's guard.
impl Body for BodyKind {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            BodyKind::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            BodyKind::Upstream(u) => boxed(Pin::new(u).poll_frame(cx)),
            BodyKind::Hyper(i) => boxed(Pin::new(i).poll_frame(cx)),
            BodyKind::Grpc(i) => Pin::new(i).poll_frame(cx),
            BodyKind::Filtered(f) => f.poll_frame(cx),
            BodyKind::ReadAhead(r) => Pin::new(r).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            BodyKind::Full(b) => b.is_none(),
            BodyKind::Upstream(u) => u.is_end_stream(),
            BodyKind::Hyper(i) => i.is_end_stream(),
            BodyKind::Grpc(i) => i.is_end_stream(),
            BodyKind::Filtered(f) => f.ended(),
            BodyKind::ReadAhead(r) => r.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            BodyKind::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            BodyKind::Full(None) => SizeHint::with_exact(0),
            BodyKind::Upstream(u) => u.size_hint(),
            BodyKind::Hyper(i) => i.size_hint(),
            BodyKind::Grpc(i) => i.size_hint(),
            BodyKind::Filtered(_) => SizeHint::default(),
            BodyKind::ReadAhead(r) => r.size_hint(),
        }
    }
}

/// A response body, and the guard that marks its request finished when the body is done.
pub struct ProxyBody {
    kind: BodyKind,
    guard: Option<RequestGuard>,
}

/// Counts a request as in flight on its connection until its response body is dropped; then
/// records the time, from which the connection's keepalive timeout counts.
/// It also carries the request's log phase, if its route has one: run when the body is done.
pub struct RequestGuard {
    conn: Rc<ConnInfo>,
    ctx: Rc<WorkerCtx>,
    pub log: Option<Box<LogState>>,
    /// The access-log line's data, when the access log is on.
    pub access: Option<Box<AccessRecord>>,
    /// Response body bytes sent (counted only when a log reads them).
    sent: u64,
}

/// Adds to the worker's count of connections being served (owner-written: load and store).
fn writing(ctx: &WorkerCtx, by: i64) {
    let w = &ctx.stats.connections_writing;
    w.store(w.load(Ordering::Relaxed) + by, Ordering::Relaxed);
}

impl RequestGuard {
    pub fn new(conn: Rc<ConnInfo>, ctx: Rc<WorkerCtx>) -> Self {
        let n = conn.in_flight.get();
        if n == 0 {
            writing(&ctx, 1);
        }
        conn.in_flight.set(n + 1);
        RequestGuard {
            conn,
            ctx,
            log: None,
            access: None,
            sent: 0,
        }
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        let n = self.conn.in_flight.get().saturating_sub(1);
        self.conn.in_flight.set(n);
        if n == 0 {
            writing(&self.ctx, -1);
        }
        self.conn.last_active.set(self.ctx.deadlines.coarse_now());
        if let (Some(record), Some(writer)) = (self.access.take(), &self.ctx.access_log) {
            writer.record(&record, self.sent);
        }
        if let Some(mut log) = self.log.take() {
            log.response_size += self.sent;
            log.finish();
        }
    }
}

impl ProxyBody {
    pub fn new(kind: BodyKind) -> Self {
        ProxyBody { kind, guard: None }
    }

    pub fn full(b: Bytes) -> Self {
        ProxyBody::new(BodyKind::Full(Some(b)))
    }

    pub fn empty() -> Self {
        ProxyBody::new(BodyKind::Full(None))
    }

    /// Sends the body through these body filters (plugins' body_filter phases); its length
    /// is not known any more.
    pub fn filter(&mut self, filters: Vec<Box<dyn turnpike_plugins::BodyFilter>>) {
        debug_assert!(
            self.raw_head().is_none(),
            "raw upstream headers are merged into the map before the body is filtered"
        );
        let inner = std::mem::replace(&mut self.kind, BodyKind::Full(None));
        self.kind = BodyKind::Filtered(Box::new(Filtered::new(inner, filters)));
    }

    /// The upstream's end-to-end headers still kept as it sent them (`h1::RawHead`): the
    /// HTTP/1.1 client side writes them before the response's header map.
    pub fn raw_head(&self) -> Option<&RawHead> {
        match &self.kind {
            BodyKind::Upstream(u) => u.raw_head().filter(|r| !r.lines.is_empty()),
            _ => None,
        }
    }

    /// Moves the upstream's raw headers into `map`, ahead of what the map holds: for anything
    /// that reads or changes the response's headers (HTTP/2, plugins, log phases).
    /// `room`: headers to be added after (beside the proxy's own).
    pub fn merge_raw_head(&mut self, map: &mut http::HeaderMap, room: usize) {
        let BodyKind::Upstream(u) = &mut self.kind else {
            return;
        };
        let Some(raw) = u.raw_head_mut().filter(|r| !r.lines.is_empty()) else {
            return;
        };
        // Room for the headers the proxy adds (Via, latencies, request id).
        let added = std::mem::replace(
            map,
            http::HeaderMap::with_capacity(raw.lines.len() + map.len() + 5 + room),
        );
        raw.merge_into(map);
        let mut last = None;
        for (name, value) in added {
            if let Some(n) = name {
                last = Some(n);
            }
            if let Some(n) = &last {
                map.append(n.clone(), value);
            }
        }
    }

    /// Reads an upstream body ahead of the client (Kong's response_buffering), spilling to a
    /// file in `dir`; only bodies longer than the in-memory share, or of unknown length, for
    /// a short one is read whole by the first reads anyway. The upstream's raw headers are
    /// moved into `map` first (they live on the upstream connection, which the read-ahead
    /// gives back to its pool when the body is in).
    pub fn read_ahead(&mut self, map: &mut http::HeaderMap, dir: &std::path::Path) {
        let BodyKind::Upstream(u) = &self.kind else {
            return;
        };
        if u.is_end_stream()
            || u.size_hint()
                .exact()
                .is_some_and(|n| n <= readahead::MEM as u64)
        {
            return;
        }
        self.merge_raw_head(map, 0);
        let BodyKind::Upstream(u) = std::mem::replace(&mut self.kind, BodyKind::Full(None)) else {
            unreachable!("matched above");
        };
        self.kind = BodyKind::ReadAhead(ReadAhead::spawn(u, dir.to_path_buf()));
    }

    pub fn set_guard(&mut self, guard: RequestGuard) {
        self.guard = Some(guard);
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.kind).poll_frame(cx);
        // Bytes sent, for the log phase and the access log (only logged requests count).
        if let (Poll::Ready(Some(Ok(frame))), Some(g)) = (&polled, &mut this.guard) {
            if g.log.is_some() || g.access.is_some() {
                if let Some(data) = frame.data_ref() {
                    g.sent += data.len() as u64;
                }
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.kind.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.kind.size_hint()
    }
}

impl crate::http1::server::ResponseBody for ProxyBody {
    #[inline]
    fn raw_head(&self) -> Option<&RawHead> {
        ProxyBody::raw_head(self)
    }
}
