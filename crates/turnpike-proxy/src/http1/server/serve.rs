//! The connection loop: wait for a head in a small state, serve requests in a boxed one
//! while the client keeps sending, answer refused heads, drain what a handler left unread.

use crate::http1::server::{conn::*, head::*, response::*, service::*};
use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::pin::Pin;
use std::rc::Rc;
use std::time::Duration;

use bytes::BytesMut;
use http::{Method, StatusCode, Version};

/// What is read and discarded of a request body the handler left unread (a 404 to a POST)
/// before the connection is closed instead of reused.
pub(crate) const DRAIN_MAX: usize = 64 * 1024;
pub(crate) const DRAIN_TIME: Duration = Duration::from_secs(2);

/// Reads and discards what the handler left of a request body, within bounds; false when the
/// connection cannot be reused (too much left, too slow, or unreadable).
pub(crate) async fn drain_body<S: Service>(svc: &S, shared: &Shared) -> bool {
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
pub(crate) const ACTIVE_LINGER: Duration = Duration::from_secs(1);

/// What ended a run of requests served by `serve_active`.
pub(crate) enum Next {
    /// No request for `ACTIVE_LINGER`: back to waiting in the small state.
    Quiet,
    Close,
    /// The connection was handed to an upgrade (WebSocket); nothing more to do here.
    Upgraded,
}

/// What a connection does with the head it waited for: each boxed (see `serve`).
pub(crate) enum Step<A, R> {
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
    // A client still sending a body the gateway answered without reading (a 413, a 401 before
    // a large upload, a 404 to a POST): closing now would reset the connection under it, and a
    // reset can discard the response before the client reads it (curl: "Send failure: Broken
    // pipe"). Boxed: it is rare, and its buffer would otherwise size the idle state.
    if shared.body.get() != BodyState::Done && !shared.expect_continue.get() && !svc.closing() {
        Box::pin(linger(svc, &shared)).await;
    }
}

/// nginx's `lingering_time` and `lingering_timeout`: how long a closing connection keeps reading
/// and discarding what the client still sends, and how long it waits for each read.
pub(crate) const LINGER_TIME: Duration = Duration::from_secs(30);
pub(crate) const LINGER_TIMEOUT: Duration = Duration::from_secs(5);

/// nginx's lingering close: after the response and the shutdown of the write side, reads and
/// discards until the client closes, a read waits past [`LINGER_TIMEOUT`], or [`LINGER_TIME`]
/// has passed.
async fn linger<S: Service>(svc: &S, shared: &Shared) {
    let until = std::time::Instant::now() + LINGER_TIME;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let left = until.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return;
        }
        let read = poll_fn(|cx| {
            let mut rb = tokio::io::ReadBuf::new(&mut buf);
            match Pin::new(&mut **shared.io.borrow_mut()).poll_read(cx, &mut rb) {
                std::task::Poll::Ready(Ok(())) => std::task::Poll::Ready(Ok(rb.filled().len())),
                std::task::Poll::Ready(Err(e)) => std::task::Poll::Ready(Err(e)),
                std::task::Poll::Pending => std::task::Poll::Pending,
            }
        });
        match svc
            .deadlines()
            .timeout(left.min(LINGER_TIMEOUT), read)
            .await
        {
            Ok(Ok(n)) if n > 0 => {}
            _ => return,
        }
    }
}

/// Answers a refused request head with Kong's error; the connection then closes.
pub(crate) async fn refuse<S: Service>(svc: &S, shared: &Shared, why: Refused) {
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
pub(crate) async fn serve_active<S: Service>(
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
