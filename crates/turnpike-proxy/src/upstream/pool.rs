//! Upstream keepalive pools, one per worker (as nginx and Envoy keep them): no lock and no
//! atomic on the request path. Bounded by `upstream_keepalive_pool_size` idle connections per
//! peer, `upstream_keepalive_max_requests` per connection and `upstream_keepalive_idle_timeout`.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;

use crate::upstream::connect::{self, ConnectError, Stream, TlsParams};
use crate::worker::deadline::Deadlines;
use crate::worker::stats::{PeerTallies, WorkerStats};

/// A connection a pool can keep: where it goes, how many requests it carried, whether it is
/// still usable while idle.
pub trait Pooled {
    fn key(&self) -> PeerKey;
    /// Requests carried, including the current one.
    fn used(&self) -> u64;
    /// Taken from the pool for one more request.
    fn reused(&mut self);
    /// Nothing to read and not closed.
    fn idle_alive(&mut self) -> bool;
}

/// Where a pooled connection goes: the peer (host:port, see `snapshot::Peer::id`) and, for
/// TLS, the client configuration it was made with (a connection is only reused for the same).
/// Host names are resolved when a connection is opened (from the `dns` cache), never per
/// request.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct PeerKey {
    pub peer: u64,
    pub tls: Option<usize>,
    /// The generation of the peer's DNS answer (see `dns::Name::generation`): once the name's
    /// addresses change, connections opened before are no longer picked (they idle out).
    pub dns: u64,
}

#[derive(Clone, Copy, Debug)]
pub struct PoolSettings {
    pub size: usize,
    pub max_requests: u64,
    pub idle_timeout: Duration,
}

struct Idle<C> {
    conn: Box<C>,
    since: Instant,
}

pub struct Pool<C> {
    idle: RefCell<FxHashMap<PeerKey, Vec<Idle<C>>>>,
    settings: PoolSettings,
    stats: Arc<WorkerStats>,
    /// Connections opened and requests sent per peer (the reuse ratio per target).
    pub tallies: PeerTallies,
    /// The worker's coarse clock (one tick's precision): idle times are timed against a
    /// timeout of seconds, and reading it is a load where `Instant::now` is a clock read.
    clock: Rc<Deadlines>,
}

impl<C: Pooled> Pool<C> {
    pub fn new(
        settings: PoolSettings,
        stats: Arc<WorkerStats>,
        clock: Rc<Deadlines>,
    ) -> Rc<Pool<C>> {
        Rc::new(Pool {
            idle: RefCell::new(FxHashMap::default()),
            settings,
            stats,
            tallies: PeerTallies::default(),
            clock,
        })
    }

    /// The most recently used live idle connection to `key`, if any.
    pub fn checkout(&self, key: &PeerKey) -> Option<Box<C>> {
        let mut idle = self.idle.borrow_mut();
        let list = idle.get_mut(key)?;
        let now = self.clock.coarse_now();
        while let Some(mut c) = list.pop() {
            if now.saturating_duration_since(c.since) > self.settings.idle_timeout
                || !c.conn.idle_alive()
            {
                continue;
            }
            c.conn.reused();
            return Some(c.conn);
        }
        None
    }

    /// Takes a connection back after its response was read to the end.
    pub fn put(&self, conn: Box<C>) {
        if self.settings.size == 0 || conn.used() >= self.settings.max_requests {
            return;
        }
        let mut idle = self.idle.borrow_mut();
        let list = idle.entry(conn.key()).or_default();
        if list.len() >= self.settings.size {
            // Keep the warmest connections; close the one idle the longest.
            list.remove(0);
        }
        list.push(Idle {
            conn,
            since: self.clock.coarse_now(),
        });
    }

    /// Closes idle connections past the idle timeout or closed by the upstream (run
    /// periodically by the worker).
    pub fn sweep(&self) {
        self.tallies.publish(&self.stats);
        let timeout = self.settings.idle_timeout;
        self.idle.borrow_mut().retain(|_, list| {
            list.retain_mut(|c| c.since.elapsed() <= timeout && c.conn.idle_alive());
            !list.is_empty()
        });
        self.stats.pool_idle.store(
            self.idle_count() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    pub fn idle_count(&self) -> usize {
        self.idle.borrow().values().map(|v| v.len()).sum()
    }

    /// Opens a connection to `peer` at `addr` (TCP, then TLS when `tls` is given), counted
    /// for the worker and the peer; what it carries is the caller's.
    pub async fn open(
        &self,
        peer: u64,
        addr: SocketAddr,
        tls: TlsParams<'_>,
        connect_timeout: Duration,
    ) -> Result<Stream, ConnectError> {
        let tcp = connect::tcp(addr, connect_timeout).await?;
        self.stats.upstream_connections_opened.inc();
        let stream = connect::secure(tcp, tls, connect_timeout).await?;
        self.tallies.opened(peer);
        Ok(stream)
    }
}
