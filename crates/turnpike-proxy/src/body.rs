//! The response body type of the proxy: the upstream's body read straight from the upstream
//! connection (HTTP/1.1, returning the connection to its pool at the end), an upgraded or
//! otherwise hyper-driven body, or a body we produced.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use crate::h1::UpstreamBody;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub enum ProxyBody {
    Upstream(UpstreamBody),
    Hyper(Incoming),
    Full(Option<Bytes>),
}

impl ProxyBody {
    pub fn full(b: Bytes) -> Self {
        ProxyBody::Full(Some(b))
    }

    pub fn empty() -> Self {
        ProxyBody::Full(None)
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            ProxyBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            ProxyBody::Upstream(u) => Pin::new(u)
                .poll_frame(cx)
                .map(|o| o.map(|r| r.map_err(Into::into))),
            ProxyBody::Hyper(i) => Pin::new(i)
                .poll_frame(cx)
                .map(|o| o.map(|r| r.map_err(Into::into))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ProxyBody::Full(b) => b.is_none(),
            ProxyBody::Upstream(u) => u.is_end_stream(),
            ProxyBody::Hyper(i) => i.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ProxyBody::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            ProxyBody::Full(None) => SizeHint::with_exact(0),
            ProxyBody::Upstream(u) => u.size_hint(),
            ProxyBody::Hyper(i) => i.size_hint(),
        }
    }
}
