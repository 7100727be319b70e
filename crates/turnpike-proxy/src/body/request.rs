//! A client's request body as the request path reads it, whichever protocol carries it.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use crate::http1::server::Http1Body;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A polled frame with its error boxed (the bodies here differ in their error types).
pub(crate) fn boxed<E: Into<BoxError>>(
    p: Poll<Option<Result<Frame<Bytes>, E>>>,
) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
    p.map(|o| o.map(|r| r.map_err(Into::into)))
}

/// A client's request body: read by our HTTP/1.1 server side, or by hyper's HTTP/2.
#[derive(Debug)]
pub enum RequestBody {
    Http1(Http1Body),
    Http2(Http2Body),
}

/// An HTTP/2 request body. Dropped unread (a 404, a 401 or a 413 answered before the upload
/// ended), it is read away on a task of its own, as nginx discards a request body: hyper would
/// otherwise reset the stream (`RST_STREAM`) under a client still sending, and clients such as
/// curl then lose the response they were sent. Bounded as the HTTP/1 lingering close is: 5 s a
/// frame, 30 s in all.
#[derive(Debug)]
pub struct Http2Body(Option<Incoming>);

impl Http2Body {
    pub fn new(body: Incoming) -> Http2Body {
        Http2Body(Some(body))
    }
}

impl Drop for Http2Body {
    fn drop(&mut self) {
        let Some(body) = self.0.take() else { return };
        if body.is_end_stream() {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(discard(body));
        }
    }
}

/// Reads and drops what is left of a body, within the lingering bounds.
async fn discard(mut body: Incoming) {
    use crate::http1::server::{LINGER_TIME, LINGER_TIMEOUT};
    use http_body_util::BodyExt;
    let until = tokio::time::Instant::now() + LINGER_TIME;
    loop {
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return;
        }
        match tokio::time::timeout(left.min(LINGER_TIMEOUT), body.frame()).await {
            Ok(Some(Ok(_))) => {}
            _ => return,
        }
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            RequestBody::Http1(b) => boxed(Pin::new(b).poll_frame(cx)),
            RequestBody::Http2(Http2Body(Some(b))) => boxed(Pin::new(b).poll_frame(cx)),
            RequestBody::Http2(Http2Body(None)) => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RequestBody::Http1(b) => b.is_end_stream(),
            RequestBody::Http2(Http2Body(b)) => b.as_ref().is_none_or(|b| b.is_end_stream()),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RequestBody::Http1(b) => b.size_hint(),
            RequestBody::Http2(Http2Body(b)) => b
                .as_ref()
                .map_or(SizeHint::with_exact(0), |b| b.size_hint()),
        }
    }
}

impl From<Http1Body> for RequestBody {
    fn from(b: Http1Body) -> Self {
        RequestBody::Http1(b)
    }
}

/// A request body as an HTTP/2 upstream (a gRPC service) gets it: streamed from the client as
/// it comes (held to the request's size limit), or read whole already (a plugin needed it).
pub type H2RequestBody = http_body_util::Either<Limited<RequestBody>, http_body_util::Full<Bytes>>;

/// A streamed body held to a size: the frame that would take it past `limit` bytes is not
/// passed on; the body ends in an error instead (hyper then resets the upstream's stream, so
/// the upstream never takes a cut message for a whole one), and `exceeded` says why.
/// request-size-limiting and `client_max_body_size` on a body with no declared length (a
/// gRPC call's), checked as it streams rather than by reading it whole first.
pub struct Limited<B> {
    inner: B,
    left: u64,
    /// Set past the limit; `None` when there is no limit (no flag is made per call then).
    exceeded: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
}

impl<B> Limited<B> {
    /// Held to `limit` when there is one: the flag it sets past it comes back with it.
    pub fn new(
        inner: B,
        limit: Option<u64>,
    ) -> (
        Limited<B>,
        Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    ) {
        let exceeded =
            limit.map(|_| std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)));
        let body = Limited {
            inner,
            left: limit.unwrap_or(u64::MAX),
            exceeded: exceeded.clone(),
        };
        (body, exceeded)
    }
}

impl<B: Body<Data = Bytes, Error = BoxError> + Unpin> Body for Limited<B> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let Some(data) = frame.data_ref() {
                let n = data.len() as u64;
                if n > this.left {
                    this.left = 0;
                    if let Some(flag) = &this.exceeded {
                        flag.store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                    return Poll::Ready(Some(Err("request body too large".into())));
                }
                this.left -= n;
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use std::sync::atomic::Ordering;

    /// Frames of a body, one at a time.
    struct Frames(std::collections::VecDeque<Bytes>);

    impl Body for Frames {
        type Data = Bytes;
        type Error = BoxError;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
            Poll::Ready(self.0.pop_front().map(|b| Ok(Frame::data(b))))
        }
    }

    fn frames(sizes: &[usize]) -> Frames {
        Frames(sizes.iter().map(|&n| Bytes::from(vec![b'x'; n])).collect())
    }

    #[tokio::test]
    async fn a_body_is_passed_whole_up_to_its_limit_and_cut_past_it() {
        let (whole, flag) = Limited::new(frames(&[4, 6]), Some(10));
        assert_eq!(whole.collect().await.unwrap().to_bytes().len(), 10);
        let flag = flag.expect("a flag for a limit");
        assert!(!flag.load(Ordering::Relaxed));

        let (mut over, flag) = Limited::new(frames(&[4, 6, 1]), Some(10));
        for _ in 0..2 {
            assert!(over.frame().await.unwrap().is_ok());
        }
        assert!(
            over.frame().await.unwrap().is_err(),
            "the 11th byte is not passed on"
        );
        assert!(flag.unwrap().load(Ordering::Relaxed));

        let (unbounded, flag) = Limited::new(frames(&[1 << 20, 1 << 20]), None);
        assert!(flag.is_none(), "no limit, no flag");
        assert_eq!(unbounded.collect().await.unwrap().to_bytes().len(), 2 << 20);
    }
}
