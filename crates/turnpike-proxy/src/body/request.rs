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
    Http2(Incoming),
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
            RequestBody::Http2(b) => boxed(Pin::new(b).poll_frame(cx)),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RequestBody::Http1(b) => b.is_end_stream(),
            RequestBody::Http2(b) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RequestBody::Http1(b) => b.size_hint(),
            RequestBody::Http2(b) => b.size_hint(),
        }
    }
}

impl From<Http1Body> for RequestBody {
    fn from(b: Http1Body) -> Self {
        RequestBody::Http1(b)
    }
}
