//! Kong's body_filter phase: the response body passes through the body filters the plugins'
//! header_filter phase asked for, in PRIORITY order, each one's output the next one's input.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame};
use turnpike_plugins::BodyFilter;

use crate::body::BoxError;

/// A body and the body filters it goes through, in the plugins' PRIORITY order.
pub struct Filtered<B> {
    inner: B,
    filters: Vec<Box<dyn BodyFilter>>,
    ended: bool,
}

impl<B: Body<Data = Bytes, Error = BoxError> + Unpin> Filtered<B> {
    pub fn new(inner: B, filters: Vec<Box<dyn BodyFilter>>) -> Self {
        Filtered {
            inner,
            filters,
            ended: false,
        }
    }

    /// The last filter has seen the end of the body.
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// Each filter's output is the next one's input.
    fn run(&mut self, mut piece: Bytes, eof: bool) -> Bytes {
        for f in &mut self.filters {
            piece = f.filter(piece, eof);
        }
        piece
    }

    pub fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        loop {
            if self.ended {
                return Poll::Ready(None);
            }
            match std::task::ready!(Pin::new(&mut self.inner).poll_frame(cx)) {
                Some(Ok(frame)) => {
                    // Trailers are the filters' to read, and dropped: they described the body
                    // before it was filtered.
                    let data = match frame.into_data() {
                        Ok(d) => d,
                        Err(frame) => {
                            if let Ok(t) = frame.into_trailers() {
                                for f in &mut self.filters {
                                    f.trailers(&t);
                                }
                            }
                            continue;
                        }
                    };
                    let out = self.run(data, false);
                    if !out.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(out))));
                    }
                }
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => {
                    self.ended = true;
                    let out = self.run(Bytes::new(), true);
                    return Poll::Ready((!out.is_empty()).then(|| Ok(Frame::data(out))));
                }
            }
        }
    }
}
