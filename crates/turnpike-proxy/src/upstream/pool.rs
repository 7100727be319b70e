//! Upstream keepalive pools, one per worker (as nginx and Envoy keep them): no lock and no
//! atomic on the request path. Bounded by `upstream_keepalive_pool_size` idle connections per
//! peer, `upstream_keepalive_max_requests` per connection and `upstream_keepalive_idle_timeout`.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::body::RequestBody;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use rustc_hash::FxHashMap;
use tokio::net::TcpStream;

use crate::http1::client::{Conn, Stream};
use crate::worker::deadline::Deadlines;
use crate::worker::stats::{PeerTallies, WorkerStats};

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

struct Idle {
    conn: Box<Conn>,
    since: Instant,
}

pub struct Pool {
    idle: RefCell<FxHashMap<PeerKey, Vec<Idle>>>,
    settings: PoolSettings,
    stats: Arc<WorkerStats>,
    /// Connections opened and requests sent per peer (the reuse ratio per target).
    pub tallies: PeerTallies,
    /// The worker's coarse clock (one tick's precision): idle times are timed against a
    /// timeout of seconds, and reading it is a load where `Instant::now` is a clock read.
    clock: Rc<Deadlines>,
}

#[derive(Debug)]
pub enum ConnectError {
    Timeout,
    Refused(std::io::Error),
    Tls(std::io::Error),
    Handshake(hyper::Error),
}

/// TLS parameters of an upstream connection: the client configuration and the server name.
pub type TlsParams<'a> = Option<(
    &'a Arc<rustls::ClientConfig>,
    rustls::pki_types::ServerName<'static>,
)>;

impl Pool {
    pub fn new(settings: PoolSettings, stats: Arc<WorkerStats>, clock: Rc<Deadlines>) -> Rc<Pool> {
        Rc::new(Pool {
            idle: RefCell::new(FxHashMap::default()),
            settings,
            stats,
            tallies: PeerTallies::default(),
            clock,
        })
    }

    /// The most recently used live idle connection to `key`, if any.
    pub fn checkout(&self, key: &PeerKey) -> Option<Box<Conn>> {
        let mut idle = self.idle.borrow_mut();
        let list = idle.get_mut(key)?;
        let now = self.clock.coarse_now();
        while let Some(mut c) = list.pop() {
            if now.saturating_duration_since(c.since) > self.settings.idle_timeout
                || !c.conn.idle_alive()
            {
                continue;
            }
            c.conn.used += 1;
            return Some(c.conn);
        }
        None
    }

    /// Takes a connection back after its response was read to the end.
    pub fn put(&self, conn: Box<Conn>) {
        if self.settings.size == 0 || conn.used >= self.settings.max_requests {
            return;
        }
        let mut idle = self.idle.borrow_mut();
        let list = idle.entry(conn.key).or_default();
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

    /// Opens a TCP connection, then TLS when `tls` is given.
    async fn open(
        &self,
        addr: SocketAddr,
        tls: TlsParams<'_>,
        connect_timeout: Duration,
    ) -> Result<Stream, ConnectError> {
        let tcp = match tokio::time::timeout(connect_timeout, TcpStream::connect(addr)).await {
            Err(_) => return Err(ConnectError::Timeout),
            Ok(Err(e)) => return Err(ConnectError::Refused(e)),
            Ok(Ok(s)) => s,
        };
        let _ = tcp.set_nodelay(true);
        self.stats.upstream_connections_opened.inc();
        match tls {
            None => Ok(Stream::Plain(tcp)),
            Some((cfg, name)) => {
                let connector = tokio_rustls::TlsConnector::from(cfg.clone());
                match tokio::time::timeout(connect_timeout, connector.connect(name, tcp)).await {
                    Err(_) => Err(ConnectError::Timeout),
                    Ok(Err(e)) => Err(ConnectError::Tls(e)),
                    Ok(Ok(s)) => Ok(Stream::Tls(Box::new(s))),
                }
            }
        }
    }

    /// A new connection for the request path's own HTTP/1.1 exchange.
    pub async fn connect(
        &self,
        key: PeerKey,
        addr: SocketAddr,
        tls: TlsParams<'_>,
        connect_timeout: Duration,
    ) -> Result<Box<Conn>, ConnectError> {
        let stream = self.open(addr, tls, connect_timeout).await?;
        self.tallies.opened(key.peer);
        // Boxed once per connection: the request path moves it around by pointer.
        Ok(Box::new(Conn::new(stream, key)))
    }

    /// A new connection driven by hyper's client, for requests that upgrade (WebSocket); it
    /// is never pooled.
    pub async fn connect_hyper(
        &self,
        peer: u64,
        addr: SocketAddr,
        tls: TlsParams<'_>,
        connect_timeout: Duration,
    ) -> Result<SendRequest<RequestBody>, ConnectError> {
        let stream = self.open(addr, tls, connect_timeout).await?;
        self.tallies.opened(peer);
        let (sender, conn) = hyper::client::conn::http1::Builder::new()
            .handshake(TokioIo::new(stream))
            .await
            .map_err(ConnectError::Handshake)?;
        tokio::task::spawn_local(async move {
            let _ = conn.with_upgrades().await;
        });
        Ok(sender)
    }
}
