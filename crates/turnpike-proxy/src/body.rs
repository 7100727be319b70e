//! The response body type of the proxy: the upstream's body streamed through (returning the
//! upstream connection to its keepalive pool when the body ends), or a body we produced.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use crate::pool::PoolReturn;

pub enum ProxyBody {
    Upstream {
        inner: Incoming,
        pool_return: Option<PoolReturn>,
    },
    Full(Option<Bytes>),
}

impl ProxyBody {
    pub fn full(b: Bytes) -> Self {
        ProxyBody::Full(Some(b))
    }

    pub fn empty() -> Self {
        ProxyBody::Full(None)
    }

    /// Streams an upstream body; the connection goes back to the pool when it ends.
    pub fn upstream(inner: Incoming, pool_return: Option<PoolReturn>) -> Self {
        let mut b = ProxyBody::Upstream { inner, pool_return };
        b.release_if_done();
        b
    }

    fn release_if_done(&mut self) {
        if let ProxyBody::Upstream { inner, pool_return } = self {
            if inner.is_end_stream() {
                if let Some(r) = pool_return.take() {
                    r.release();
                }
            }
        }
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        match this {
            ProxyBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            ProxyBody::Upstream { inner, pool_return } => {
                let r = Pin::new(&mut *inner).poll_frame(cx);
                match &r {
                    Poll::Ready(None) => {
                        if let Some(p) = pool_return.take() {
                            p.release();
                        }
                    }
                    Poll::Ready(Some(Ok(_))) => this.release_if_done(),
                    // An upstream error: the connection is not reusable; dropping it closes it.
                    Poll::Ready(Some(Err(_))) => {
                        pool_return.take();
                    }
                    Poll::Pending => {}
                }
                r
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ProxyBody::Full(b) => b.is_none(),
            ProxyBody::Upstream { inner, .. } => inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ProxyBody::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            ProxyBody::Full(None) => SizeHint::with_exact(0),
            ProxyBody::Upstream { inner, .. } => inner.size_hint(),
        }
    }
}
