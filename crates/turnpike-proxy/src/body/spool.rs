//! Request bodies read whole before an upstream is chosen and connected to: a route's
//! `request_buffering` (Kong's default, nginx's `proxy_request_buffering on`). A slow client
//! then holds no upstream connection, and the upstream never receives a request cut off by a
//! client that gave up. Memory per request is bounded as nginx bounds it: the first
//! `client_body_buffer_size` bytes stay in memory, the rest go to an unlinked temporary file
//! under `<prefix>/client_body_temp` (gone when the last reference is dropped, even on a
//! crash). A spooled body can be sent again, so a retry to another target carries it too.

use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use http_body::Body;
use http_body_util::BodyExt;

use crate::body::request::RequestBody;

/// A body read whole: its first bytes in memory, the rest (if any) in a file.
#[derive(Debug, Clone)]
pub struct Spool {
    pub head: Bytes,
    file: Option<Arc<std::fs::File>>,
    file_len: u64,
}

/// Why a body could not be spooled.
#[derive(Debug, PartialEq, Eq)]
pub enum SpoolError {
    /// Larger than client_max_body_size.
    TooLarge,
    /// The client stalled past client_body_timeout.
    TimedOut,
    /// The client went away or sent a malformed body.
    Unreadable,
    /// The temporary file could not be written.
    Storage,
}

/// Bytes per read from the file when the body is sent.
const READ_CHUNK: usize = 64 * 1024;

impl Spool {
    pub fn len(&self) -> u64 {
        self.head.len() as u64 + self.file_len
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether part of the body went to a file.
    pub fn on_disk(&self) -> bool {
        self.file.is_some()
    }

    /// The piece of the body that starts at byte `at` (`None` past the end): the in-memory
    /// part whole, then the file in reads of 64 KiB on the blocking pool.
    pub async fn piece_at(&self, at: u64) -> io::Result<Option<Bytes>> {
        let head = self.head.len() as u64;
        if at < head {
            return Ok(Some(self.head.slice(at as usize..)));
        }
        let (Some(file), off) = (&self.file, at - head) else {
            return Ok(None);
        };
        if off >= self.file_len {
            return Ok(None);
        }
        let n = READ_CHUNK.min((self.file_len - off) as usize);
        let file = file.clone();
        tokio::task::spawn_blocking(move || {
            let mut buf = vec![0u8; n];
            file.read_exact_at(&mut buf, off)
                .map(|()| Some(Bytes::from(buf)))
        })
        .await
        .map_err(io::Error::other)?
    }
}

/// Reads `body` whole: at most `max` bytes (0: no limit), `in_memory` of them in memory and
/// the rest in a temporary file created in `dir`. The body's own read deadline
/// (client_body_timeout) applies to every read.
pub async fn read(
    body: &mut RequestBody,
    max: u64,
    in_memory: usize,
    dir: &Path,
) -> Result<Spool, SpoolError> {
    let mut head = BytesMut::new();
    let mut file: Option<Arc<std::fs::File>> = None;
    let mut file_len = 0u64;
    let mut total = 0u64;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            let timed_out = e
                .downcast_ref::<io::Error>()
                .is_some_and(|e| e.kind() == io::ErrorKind::TimedOut);
            if timed_out {
                SpoolError::TimedOut
            } else {
                SpoolError::Unreadable
            }
        })?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        total += data.len() as u64;
        if max != 0 && total > max {
            return Err(SpoolError::TooLarge);
        }
        match &file {
            Some(f) => {
                write_at(f, data.clone(), file_len).await?;
                file_len += data.len() as u64;
            }
            None if head.len() + data.len() <= in_memory => head.extend_from_slice(&data),
            None => {
                // Past the memory share: the rest of this piece and all that follow go to
                // the file.
                let keep = in_memory - head.len();
                head.extend_from_slice(&data[..keep]);
                let f = open_temp(dir).await?;
                write_at(&f, data.slice(keep..), 0).await?;
                file_len += (data.len() - keep) as u64;
                file = Some(f);
            }
        }
        if body.is_end_stream() {
            break;
        }
    }
    Ok(Spool {
        head: head.freeze(),
        file,
        file_len,
    })
}

/// An unlinked temporary file in `dir` (made if missing): gone with its last handle. Request
/// bodies (here) and response bodies (`readahead`) spill to these.
pub fn temp_file(dir: &Path) -> io::Result<std::fs::File> {
    std::fs::create_dir_all(dir)?;
    tempfile::tempfile_in(dir)
}

async fn open_temp(dir: &Path) -> Result<Arc<std::fs::File>, SpoolError> {
    let dir = dir.to_path_buf();
    let f = tokio::task::spawn_blocking(move || temp_file(&dir))
        .await
        .map_err(|_| SpoolError::Storage)?
        .map_err(|e| {
            tracing::error!("cannot buffer a request body to a file: {e}");
            SpoolError::Storage
        })?;
    Ok(Arc::new(f))
}

/// Writes `data` at `offset` on the blocking pool.
async fn write_at(f: &Arc<std::fs::File>, data: Bytes, offset: u64) -> Result<(), SpoolError> {
    let f = f.clone();
    tokio::task::spawn_blocking(move || f.write_all_at(&data, offset))
        .await
        .map_err(|_| SpoolError::Storage)?
        .map_err(|e| {
            tracing::error!("cannot buffer a request body to a file: {e}");
            SpoolError::Storage
        })
}
