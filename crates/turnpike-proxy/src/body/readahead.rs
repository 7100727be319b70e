//! Kong's `response_buffering` (a route's default, nginx's `proxy_buffering on`): the upstream's
//! response body is read as fast as the upstream sends it, whatever the client's pace, so a
//! slow client does not hold the upstream connection (it goes back to its pool once the body is
//! in) and the upstream is not kept waiting. Memory is bounded as nginx bounds it: `MEM` bytes
//! in memory (nginx's `proxy_buffers 8 8k`), the rest in an unlinked temporary file under
//! `<prefix>/proxy_temp` of at most `MAX_FILE` unread bytes (nginx's
//! `proxy_max_temp_file_size 1024m`), past which reading the upstream waits for the client.
//! The client gets the bytes as soon as they come: nothing waits for the whole body.
//!
//! A task of the worker reads the upstream body into a shared state; the response body reads
//! from that state. Both run on the worker's thread (no locks). Temporary-file reads and writes
//! are synchronous, as nginx's are: a fresh temporary file is in the page cache.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;

use crate::body::request::BoxError;

/// In-memory read-ahead (nginx's `proxy_buffers 8 8k`).
pub const MEM: usize = 64 * 1024;
/// Unread bytes a temporary file may hold (nginx's `proxy_max_temp_file_size 1024m`).
const MAX_FILE: u64 = 1 << 30;
/// Bytes per read from the temporary file.
const READ_CHUNK: usize = 64 * 1024;

struct Spill {
    file: std::fs::File,
    written: u64,
    read: u64,
}

#[derive(Default)]
struct State {
    mem: VecDeque<Bytes>,
    mem_bytes: usize,
    spill: Option<Spill>,
    /// How the upstream body ended; `None` while it goes on.
    end: Option<Result<(), String>>,
    reader: Option<Waker>,
    writer: Option<Waker>,
    /// The client side dropped the body: stop reading the upstream.
    reader_gone: bool,
}

impl State {
    /// Whether reading the upstream must wait for the client: memory past its share goes to
    /// the file, so only the file can fill up.
    fn full(&self) -> bool {
        self.spill
            .as_ref()
            .is_some_and(|s| s.written - s.read >= MAX_FILE)
    }

    fn wake_reader(&mut self) {
        if let Some(w) = self.reader.take() {
            w.wake();
        }
    }
}

/// The client's side of a read-ahead response body.
pub struct ReadAhead {
    state: Rc<RefCell<State>>,
    hint: SizeHint,
    ended: bool,
}

impl ReadAhead {
    /// Starts reading `body` ahead on the current worker (a `LocalSet`), spilling to a file in
    /// `dir` past `MEM` bytes.
    pub fn spawn<B>(body: B, dir: PathBuf) -> ReadAhead
    where
        B: Body<Data = Bytes> + Unpin + 'static,
        B::Error: std::fmt::Display,
    {
        let hint = body.size_hint();
        let state = Rc::new(RefCell::new(State::default()));
        tokio::task::spawn_local(fill(body, state.clone(), dir));
        ReadAhead {
            state,
            hint,
            ended: false,
        }
    }
}

/// Reads the upstream body into `state` until it ends, fails, or the client goes away.
async fn fill<B>(mut body: B, state: Rc<RefCell<State>>, dir: PathBuf)
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    loop {
        // Room for more (or the client is gone)?
        let go_on = std::future::poll_fn(|cx| {
            let mut s = state.borrow_mut();
            if s.reader_gone {
                Poll::Ready(false)
            } else if s.full() {
                s.writer = Some(cx.waker().clone());
                Poll::Pending
            } else {
                Poll::Ready(true)
            }
        })
        .await;
        if !go_on {
            return;
        }
        let frame = body.frame().await;
        let mut s = state.borrow_mut();
        match frame {
            None => {
                s.end = Some(Ok(()));
                s.wake_reader();
                return;
            }
            Some(Err(e)) => {
                s.end = Some(Err(e.to_string()));
                s.wake_reader();
                return;
            }
            Some(Ok(frame)) => {
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                if data.is_empty() {
                    continue;
                }
                if s.spill.is_none() && s.mem_bytes + data.len() <= MEM.max(data.len()) {
                    s.mem_bytes += data.len();
                    s.mem.push_back(data);
                } else if let Err(e) = spill(&mut s, &data, &dir) {
                    tracing::error!("cannot buffer a response body to a file: {e}");
                    s.end = Some(Err(format!("response buffering: {e}")));
                    s.wake_reader();
                    return;
                }
                s.wake_reader();
            }
        }
    }
}

/// Appends `data` to the state's temporary file (made on first use).
fn spill(s: &mut State, data: &[u8], dir: &std::path::Path) -> std::io::Result<()> {
    if s.spill.is_none() {
        s.spill = Some(Spill {
            file: crate::body::spool::temp_file(dir)?,
            written: 0,
            read: 0,
        });
    }
    let sp = s.spill.as_mut().expect("made above");
    sp.file.write_all_at(data, sp.written)?;
    sp.written += data.len() as u64;
    Ok(())
}

impl Body for ReadAhead {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.ended {
            return Poll::Ready(None);
        }
        let mut s = this.state.borrow_mut();
        let piece = if let Some(b) = s.mem.pop_front() {
            s.mem_bytes -= b.len();
            Some(Ok(b))
        } else if let Some(sp) = s.spill.as_mut().filter(|sp| sp.read < sp.written) {
            let n = READ_CHUNK.min((sp.written - sp.read) as usize);
            let mut buf = vec![0u8; n];
            let read = sp.file.read_exact_at(&mut buf, sp.read);
            sp.read += n as u64;
            if sp.read == sp.written {
                // Drained: the next bytes may use memory again, and the file its start.
                sp.read = 0;
                sp.written = 0;
                let _ = sp.file.set_len(0);
            }
            Some(read.map(|()| Bytes::from(buf)))
        } else {
            None
        };
        if let Some(piece) = piece {
            if let Some(w) = s.writer.take() {
                w.wake();
            }
            return Poll::Ready(Some(piece.map(Frame::data).map_err(Into::into)));
        }
        match &s.end {
            Some(Ok(())) => {
                this.ended = true;
                Poll::Ready(None)
            }
            Some(Err(e)) => {
                this.ended = true;
                Poll::Ready(Some(Err(e.clone().into())))
            }
            None => {
                s.reader = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }

    fn size_hint(&self) -> SizeHint {
        self.hint
    }
}

impl Drop for ReadAhead {
    fn drop(&mut self) {
        let mut s = self.state.borrow_mut();
        s.reader_gone = true;
        if let Some(w) = s.writer.take() {
            w.wake();
        }
    }
}
