//! UDP streams (`stream_listen ... udp`, routes with `protocols: [udp]`, `udp` services), as
//! nginx's stream module proxies datagrams: each client address (IP and port) is a session
//! with its own socket connected to the service's peer; the client's datagrams go out on it,
//! the peer's answers come back from the listener's address; a session with no datagram
//! either way for the service's `read_timeout` ends (nginx's `proxy_timeout`). Sessions are
//! bounded per listener socket: a flood of client addresses past the bound is dropped, with a
//! log line, instead of taking every file descriptor.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;
use tokio::net::UdpSocket;

use crate::worker::ctx::WorkerCtx;

/// The most sessions one listener socket keeps at once.
pub const MAX_SESSIONS: usize = 16 * 1024;

/// The largest datagram (UDP's own limit).
const MAX_DATAGRAM: usize = 65_536;

type Sessions = Rc<RefCell<FxHashMap<SocketAddr, Rc<Session>>>>;

struct Session {
    upstream: UdpSocket,
    last: std::cell::Cell<Instant>,
}

/// Serves one UDP listener socket until the worker shuts down.
pub async fn serve(
    ctx: Rc<WorkerCtx>,
    sock: UdpSocket,
    local: SocketAddr,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let sock = Rc::new(sock);
    let sessions: Sessions = Rc::default();
    let mut buf = vec![0u8; MAX_DATAGRAM];
    let mut refused_logged = false;
    loop {
        let (n, peer) = tokio::select! {
            r = sock.recv_from(&mut buf) => match r {
                Ok(x) => x,
                Err(e) => {
                    // An ICMP error for an earlier send, and the like: not this socket's end.
                    tracing::debug!("stream udp {local}: {e}");
                    continue;
                }
            },
            _ = shutdown.wait_for(|s| *s) => return,
        };
        let existing = sessions.borrow().get(&peer).cloned();
        if let Some(s) = existing {
            s.last.set(Instant::now());
            let _ = s.upstream.send(&buf[..n]).await;
            continue;
        }
        if sessions.borrow().len() >= MAX_SESSIONS {
            if !refused_logged {
                tracing::warn!(
                    "stream udp {local}: {MAX_SESSIONS} sessions open, datagrams from new clients dropped"
                );
                refused_logged = true;
            }
            continue;
        }
        refused_logged = false;
        let Some(session) = open(&ctx, peer, local).await else {
            continue;
        };
        let _ = session.0.upstream.send(&buf[..n]).await;
        sessions.borrow_mut().insert(peer, session.0.clone());
        tokio::task::spawn_local(answers(
            session.0,
            session.1,
            sock.clone(),
            peer,
            sessions.clone(),
            shutdown.clone(),
        ));
    }
}

/// A new session for `peer`: its route, the service's peer, a socket connected to it; and
/// the session's idle timeout.
async fn open(
    ctx: &WorkerCtx,
    peer: SocketAddr,
    local: SocketAddr,
) -> Option<(Rc<Session>, Duration)> {
    let snap = ctx.snapshot();
    let Some(route) = snap
        .streams
        .find(peer, local, crate::snapshot::streams::Transport::Udp)
    else {
        tracing::info!("stream: no Route found with those values (udp client {peer}, on {local})");
        return None;
    };
    let service = snap.services.get(route.service)?;
    let (target, _) = super::pick(service, peer, 0, &[], route)?;
    let addr = target.address().await?;
    let bind: SocketAddr = if addr.is_ipv6() {
        "[::]:0".parse().ok()?
    } else {
        "0.0.0.0:0".parse().ok()?
    };
    let upstream = UdpSocket::bind(bind).await.ok()?;
    if let Err(e) = upstream.connect(addr).await {
        tracing::error!("stream udp: cannot reach {addr}: {e}");
        return None;
    }
    ctx.stats.upstream_requests.inc();
    let idle = service.read_timeout().max(service.write_timeout());
    Some((
        Rc::new(Session {
            upstream,
            last: std::cell::Cell::new(Instant::now()),
        }),
        idle,
    ))
}

/// The peer's answers to one session, sent back to its client, until the session is idle
/// past `idle` or the worker stops; then the session is forgotten.
async fn answers(
    session: Rc<Session>,
    idle: Duration,
    listener: Rc<UdpSocket>,
    client: SocketAddr,
    sessions: Sessions,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; MAX_DATAGRAM];
    loop {
        let deadline = tokio::time::Instant::from_std(session.last.get() + idle);
        tokio::select! {
            // An error (ECONNREFUSED: nothing listens there) leaves the session on, as
            // nginx's goes on until its timeout.
            r = session.upstream.recv(&mut buf) => if let Ok(n) = r {
                session.last.set(Instant::now());
                let _ = listener.send_to(&buf[..n], client).await;
            },
            _ = tokio::time::sleep_until(deadline) => {
                if session.last.get() + idle <= Instant::now() {
                    break;
                }
            }
            _ = shutdown.wait_for(|s| *s) => break,
        }
    }
    sessions.borrow_mut().remove(&client);
}
