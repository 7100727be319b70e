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
/// it comes, or read whole already (a plugin needed it).
pub type H2RequestBody = http_body_util::Either<RequestBody, http_body_util::Full<Bytes>>;
