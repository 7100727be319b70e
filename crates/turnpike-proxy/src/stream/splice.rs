//! Bytes passed between two TCP sockets by the kernel (splice(2) through a pipe), as nginx
//! cannot and HAProxy does: a plain `tcp` session (or `tls_passthrough`) to a `tcp` service
//! never copies its payload through user space. Each direction owns a pipe: the source's
//! bytes are spliced into it, then out of it into the destination, until the source ends
//! (its end is passed on as a half-close) or fails.

use std::cell::Cell;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Instant;

use tokio::io::Interest;
use tokio::net::TcpStream;

/// How much one splice moves at most (the pipe is grown to this where the system allows;
/// Linux's default pipe holds 64 KiB).
const CHUNK: usize = 256 * 1024;

/// A pipe for one direction: (read end, write end), both non-blocking.
struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
}

impl Pipe {
    fn new() -> io::Result<Pipe> {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: `fds` has room for the two descriptors pipe2 writes.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both descriptors were just opened and are owned by nothing else.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // A larger pipe means fewer splices for a bulk transfer; a refusal (the system's
        // pipe-max-size, or the user's pipe quota) leaves the default.
        // SAFETY: F_SETPIPE_SZ on a pipe we own.
        unsafe { libc::fcntl(write.as_raw_fd(), libc::F_SETPIPE_SZ, CHUNK as libc::c_int) };
        Ok(Pipe { read, write })
    }
}

fn splice(from: RawFd, to: RawFd, len: usize) -> io::Result<usize> {
    // SAFETY: plain descriptors, no offsets (both ends are a socket or a pipe).
    let n = unsafe {
        libc::splice(
            from,
            std::ptr::null_mut(),
            to,
            std::ptr::null_mut(),
            len,
            libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
        )
    };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// What a direction reports as it goes: bytes read from its source and written to its
/// destination, and when bytes last moved (for the session's idle timeout).
pub struct Tally<'a> {
    pub read: &'a Cell<u64>,
    pub written: &'a Cell<u64>,
    pub last: &'a Cell<Instant>,
}

/// Splices `from`'s bytes into `to` until `from` ends; then shuts `to` for writing (the
/// half-close passed on). The pipe is emptied into `to` before `from` is read again, so a
/// `WouldBlock` on the read side is always the socket's.
async fn one_way(from: &TcpStream, to: &TcpStream, tally: Tally<'_>) -> io::Result<()> {
    let pipe = Pipe::new()?;
    loop {
        let n = loop {
            from.readable().await?;
            match from.try_io(Interest::READABLE, || {
                splice(from.as_raw_fd(), pipe.write.as_raw_fd(), CHUNK)
            }) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        };
        if n == 0 {
            // SAFETY: shutdown(2) of a socket we hold.
            unsafe { libc::shutdown(to.as_raw_fd(), libc::SHUT_WR) };
            return Ok(());
        }
        tally.read.set(tally.read.get() + n as u64);
        tally.last.set(Instant::now());
        let mut left = n;
        while left > 0 {
            to.writable().await?;
            match to.try_io(Interest::WRITABLE, || {
                splice(pipe.read.as_raw_fd(), to.as_raw_fd(), left)
            }) {
                Ok(m) => {
                    left -= m;
                    tally.written.set(tally.written.get() + m as u64);
                    tally.last.set(Instant::now());
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

/// Both directions at once, until both have ended (each passes its source's end on as a
/// half-close) or one fails (the caller then drops both sockets, as a copy would).
pub async fn both_ways(
    client: &TcpStream,
    upstream: &TcpStream,
    up: Tally<'_>,
    down: Tally<'_>,
) -> io::Result<()> {
    tokio::try_join!(
        one_way(client, upstream, up),
        one_way(upstream, client, down)
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    async fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let (b, _) = l.accept().await.unwrap();
        (a, b)
    }

    /// Sends `data` and half-closes while reading what comes back to its end.
    async fn talk(mut s: TcpStream, data: Vec<u8>) -> Vec<u8> {
        let (mut r, mut w) = s.split();
        let send = async {
            w.write_all(&data).await.unwrap();
            w.shutdown().await.unwrap();
        };
        let mut got = Vec::new();
        let (_, n) = tokio::join!(send, r.read_to_end(&mut got));
        n.unwrap();
        got
    }

    /// 8 MiB each way at once through two spliced sockets, every byte in order, the
    /// half-closes passed on, and the tallies right.
    #[tokio::test]
    async fn bytes_and_half_closes_pass_both_ways() {
        let (client, gw_client) = pair().await;
        let (gw_upstream, upstream) = pair().await;
        let counts: [Cell<u64>; 4] = Default::default();
        let last = Cell::new(Instant::now());
        let data: Vec<u8> = (0..8 << 20).map(|i| (i % 251) as u8).collect();
        let client_side = tokio::spawn(talk(client, data.clone()));
        let upstream_side = tokio::spawn(talk(upstream, data.clone()));
        both_ways(
            &gw_client,
            &gw_upstream,
            Tally {
                read: &counts[0],
                written: &counts[1],
                last: &last,
            },
            Tally {
                read: &counts[2],
                written: &counts[3],
                last: &last,
            },
        )
        .await
        .unwrap();
        assert!(client_side.await.unwrap() == data);
        assert!(upstream_side.await.unwrap() == data);
        for c in &counts {
            assert_eq!(c.get(), 8 << 20);
        }
    }
}
