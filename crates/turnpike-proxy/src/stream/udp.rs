//! UDP streams (`stream_listen ... udp`, routes with `protocols: [udp]`, `udp` services), as
//! nginx's stream module proxies datagrams: each client address (IP and port) is a session
//! with its own socket connected to the service's peer; the client's datagrams go out on it,
//! the peer's answers come back from the listener's address; a session with no datagram
//! either way for the service's `read_timeout` ends (nginx's `proxy_timeout`). Sessions are
//! bounded per listener socket: a flood of client addresses past the bound is dropped, with a
//! log line, instead of taking every file descriptor. A udp route's plugins (the configs whose
//! `protocols` list `udp`) run as on TCP sessions: `preread` before the session opens (a
//! refusal drops the datagram; the client's next one is a new session, refused again, as
//! nginx's), and the log phase once the session ends, with the bytes each way.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;
use tokio::net::UdpSocket;

use crate::snapshot::{Snapshot, PROTO_UDP};
use crate::worker::ctx::WorkerCtx;

/// The most sessions one listener socket keeps at once.
pub const MAX_SESSIONS: usize = 16 * 1024;

/// The largest datagram (UDP's own limit).
const MAX_DATAGRAM: usize = 65_536;

type Sessions = Rc<RefCell<FxHashMap<SocketAddr, Rc<Session>>>>;

struct Session {
    upstream: UdpSocket,
    last: std::cell::Cell<Instant>,
    /// What the log phase needs, when the route has plugins for udp sessions.
    log: Option<Box<Logged>>,
}

/// A session's route (kept by its index in the snapshot it was found in) and what its log
/// entry is made of.
struct Logged {
    snap: Arc<Snapshot>,
    route: usize,
    client: SocketAddr,
    local: SocketAddr,
    session: super::Session,
}

impl Session {
    /// Counts a datagram from the client, sent on to the peer.
    fn upstreamed(&self, n: usize, sent: bool) {
        if let Some(l) = &self.log {
            let c = &l.session.counts;
            tally(&c.client_read, &c.upstream_written, n, sent);
        }
    }

    /// Counts an answer from the peer, sent back to the client.
    fn answered(&self, n: usize, sent: bool) {
        if let Some(l) = &self.log {
            let c = &l.session.counts;
            tally(&c.upstream_read, &c.client_written, n, sent);
        }
    }

    /// The session's log phase, once it has ended.
    fn log(&self) {
        let Some(l) = &self.log else {
            return;
        };
        let Some(route) = l.snap.streams.get(l.route) else {
            return;
        };
        let plugins = super::session_plugins(route, PROTO_UDP);
        super::log_session(&plugins, &l.snap, route, (l.client, l.local), &l.session);
    }
}

/// A datagram of `n` bytes read on one side, and written on the other when `sent`.
fn tally(read: &std::cell::Cell<u64>, written: &std::cell::Cell<u64>, n: usize, sent: bool) {
    read.set(read.get() + n as u64);
    if sent {
        written.set(written.get() + n as u64);
    }
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
            let sent = s.upstream.send(&buf[..n]).await.is_ok();
            s.upstreamed(n, sent);
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
        let Some(session) = open(&ctx, peer, local, n).await else {
            continue;
        };
        let sent = session.0.upstream.send(&buf[..n]).await.is_ok();
        session.0.upstreamed(n, sent);
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
    first: usize,
) -> Option<(Rc<Session>, Duration)> {
    let snap = ctx.snapshot();
    let Some(index) =
        snap.streams
            .find_index(peer, local, crate::snapshot::streams::Transport::Udp)
    else {
        tracing::info!("stream: no Route found with those values (udp client {peer}, on {local})");
        return None;
    };
    let route = snap.streams.get(index)?;
    let plugins = super::session_plugins(route, PROTO_UDP);
    let mut session = super::Session::new();
    if let Some(status) = super::preread(&plugins, peer, route) {
        session.status = status;
        session.counts.client_read.set(first as u64);
        super::log_session(&plugins, &snap, route, (peer, local), &session);
        return None;
    }
    let service = snap.services.get(route.service)?;
    let unreachable = |session: &mut super::Session| {
        session.status = 502;
        session.counts.client_read.set(first as u64);
        super::log_session(&plugins, &snap, route, (peer, local), session);
    };
    let choosing = Instant::now();
    let Some((target, _)) = super::pick(service, peer, 0, &[], route) else {
        unreachable(&mut session);
        return None;
    };
    let addr = target.address().await;
    session.tried(target, addr, choosing);
    let Some(addr) = addr else {
        if let Some(t) = session.tries.last_mut() {
            t.failed = true;
        }
        unreachable(&mut session);
        return None;
    };
    let bind: SocketAddr = if addr.is_ipv6() {
        "[::]:0".parse().ok()?
    } else {
        "0.0.0.0:0".parse().ok()?
    };
    let upstream = UdpSocket::bind(bind).await.ok()?;
    if let Err(e) = upstream.connect(addr).await {
        if let Some(t) = session.tries.last_mut() {
            t.failed = true;
        }
        tracing::error!("stream udp: cannot reach {addr}: {e}");
        unreachable(&mut session);
        return None;
    }
    session.connected = Some(Instant::now());
    ctx.stats.upstream_requests.inc();
    let idle = service.read_timeout().max(service.write_timeout());
    let log = (!plugins.is_empty()).then(|| {
        Box::new(Logged {
            snap: Arc::clone(&snap),
            route: index,
            client: peer,
            local,
            session,
        })
    });
    Some((
        Rc::new(Session {
            upstream,
            last: std::cell::Cell::new(Instant::now()),
            log,
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
                let sent = listener.send_to(&buf[..n], client).await.is_ok();
                session.answered(n, sent);
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
    session.log();
}
