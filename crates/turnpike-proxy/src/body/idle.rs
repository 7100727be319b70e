//! A response body that must keep arriving: nginx's `grpc_read_timeout` (Kong sets it from the
//! service's `read_timeout`) counts between two successive reads from the upstream, not over
//! the whole response. A streaming gRPC call whose upstream goes quiet for longer than that is
//! ended with an error: the client's stream is reset (as nginx resets an HTTP/2 stream whose
//! upstream timed out after its head was sent), and dropping the upstream body cancels the
//! upstream's stream.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use crate::body::request::{boxed, BoxError};

/// Why the body ended early: the upstream sent nothing for the read timeout.
#[derive(Debug)]
pub struct ReadTimedOut(pub Duration);

impl std::fmt::Display for ReadTimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "upstream timed out (110: Connection timed out) while reading upstream ({} ms without a frame)",
            self.0.as_millis()
        )
    }
}

impl std::error::Error for ReadTimedOut {}

/// `inner`, failing when no frame comes for `every`. A frame only notes its time; the timer is
/// moved when it fires early (a frame came meanwhile), so a fast stream costs a clock read a
/// frame, not a timer re-registration.
pub struct ReadIdle<B> {
    inner: B,
    every: Duration,
    last: Instant,
    timer: Pin<Box<Sleep>>,
}

impl<B> ReadIdle<B> {
    pub fn new(inner: B, every: Duration) -> Self {
        ReadIdle {
            inner,
            every,
            last: Instant::now(),
            timer: Box::pin(tokio::time::sleep(every)),
        }
    }
}

impl<B> Body for ReadIdle<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            if frame.is_some() {
                this.last = Instant::now();
            }
            return boxed(Poll::Ready(frame));
        }
        loop {
            if this.timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            let due = this.last + this.every;
            if due <= Instant::now() {
                let e = ReadTimedOut(this.every);
                tracing::error!("{e}");
                return Poll::Ready(Some(Err(Box::new(e))));
            }
            // A frame came since the timer was set: wait from that frame on.
            this.timer.as_mut().reset(due);
        }
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

    /// A body whose frames come after the given gaps.
    struct Gaps {
        left: std::vec::IntoIter<u64>,
        wait: Option<Pin<Box<Sleep>>>,
    }

    impl Body for Gaps {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            if self.wait.is_none() {
                let Some(ms) = self.left.next() else {
                    return Poll::Ready(None);
                };
                self.wait = Some(Box::pin(tokio::time::sleep(Duration::from_millis(ms))));
            }
            match self.wait.as_mut().unwrap().as_mut().poll(cx) {
                Poll::Ready(()) => {
                    self.wait = None;
                    Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"x")))))
                }
                Poll::Pending => Poll::Pending,
            }
        }
    }

    fn gaps(ms: Vec<u64>) -> ReadIdle<Gaps> {
        let body = Gaps {
            left: ms.into_iter(),
            wait: None,
        };
        ReadIdle::new(body, Duration::from_millis(200))
    }

    /// Frames 50 ms apart pass a 200 ms timeout whatever the whole body takes; a gap of
    /// 400 ms ends it with the error, after the frames that came.
    #[tokio::test(start_paused = true)]
    async fn the_timer_counts_between_frames() {
        let mut ok = gaps(vec![50; 10]);
        let mut n = 0;
        while let Some(f) = ok.frame().await {
            assert!(f.is_ok());
            n += 1;
        }
        assert_eq!(n, 10);

        let mut slow = gaps(vec![50, 400, 50]);
        assert!(slow.frame().await.unwrap().is_ok());
        let e = slow.frame().await.unwrap().unwrap_err();
        assert!(e.to_string().contains("upstream timed out"), "{e}");
    }
}
