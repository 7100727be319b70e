//! Upstream keepalive pools, one per worker (as nginx and Envoy keep them): no lock and no
//! atomic on the request path. Bounded by `upstream_keepalive_pool_size` idle connections per
//! peer, `upstream_keepalive_max_requests` per connection and `upstream_keepalive_idle_timeout`.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use rustc_hash::FxHashMap;
use tokio::net::TcpStream;

use crate::stats::WorkerStats;

/// Where a pooled connection goes: the address, and for TLS the client configuration and
/// server name it was made with (a connection is only reused for the same ones).
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct PeerKey {
    pub addr: SocketAddr,
    pub tls: Option<(usize, Arc<str>)>,
}

#[derive(Clone, Copy, Debug)]
pub struct PoolSettings {
    pub size: usize,
    pub max_requests: u64,
    pub idle_timeout: Duration,
}

struct Idle {
    sender: SendRequest<Incoming>,
    since: Instant,
    used: u64,
}

pub struct PooledConn {
    pub sender: SendRequest<Incoming>,
    pub key: PeerKey,
    /// Requests this connection has carried, including the current one.
    pub used: u64,
}

pub struct Pool {
    idle: RefCell<FxHashMap<PeerKey, Vec<Idle>>>,
    settings: PoolSettings,
    stats: Arc<WorkerStats>,
}

/// Hands a connection back to its pool when the response body has been read to the end.
pub struct PoolReturn {
    pool: Rc<Pool>,
    conn: PooledConn,
}

impl PoolReturn {
    pub fn new(pool: Rc<Pool>, conn: PooledConn) -> Self {
        PoolReturn { pool, conn }
    }

    pub fn release(self) {
        self.pool.put(self.conn);
    }
}

#[derive(Debug)]
pub enum ConnectError {
    Timeout,
    Refused(std::io::Error),
    Tls(std::io::Error),
    Handshake(hyper::Error),
}

impl Pool {
    pub fn new(settings: PoolSettings, stats: Arc<WorkerStats>) -> Rc<Pool> {
        Rc::new(Pool {
            idle: RefCell::new(FxHashMap::default()),
            settings,
            stats,
        })
    }

    /// The most recently used live idle connection to `key`, if any.
    pub fn checkout(&self, key: &PeerKey) -> Option<PooledConn> {
        let mut idle = self.idle.borrow_mut();
        let list = idle.get_mut(key)?;
        while let Some(c) = list.pop() {
            if c.sender.is_closed() || c.since.elapsed() > self.settings.idle_timeout {
                continue;
            }
            return Some(PooledConn {
                sender: c.sender,
                key: key.clone(),
                used: c.used + 1,
            });
        }
        None
    }

    fn put(&self, conn: PooledConn) {
        if self.settings.size == 0
            || conn.used >= self.settings.max_requests
            || conn.sender.is_closed()
        {
            return;
        }
        let mut idle = self.idle.borrow_mut();
        let list = idle.entry(conn.key).or_default();
        if list.len() >= self.settings.size {
            // Keep the warmest connections; close the one idle the longest.
            list.remove(0);
        }
        list.push(Idle {
            sender: conn.sender,
            since: Instant::now(),
            used: conn.used,
        });
    }

    /// Drops idle connections past the idle timeout (run periodically by the worker).
    pub fn sweep(&self) {
        let timeout = self.settings.idle_timeout;
        self.idle.borrow_mut().retain(|_, list| {
            list.retain(|c| !c.sender.is_closed() && c.since.elapsed() <= timeout);
            !list.is_empty()
        });
    }

    pub fn idle_count(&self) -> usize {
        self.idle.borrow().values().map(|v| v.len()).sum()
    }

    /// Opens a new connection (TCP, then TLS when `tls` is given) and starts its HTTP/1.1
    /// client task on this worker.
    pub async fn connect(
        &self,
        key: &PeerKey,
        tls: Option<(
            &Arc<rustls::ClientConfig>,
            rustls::pki_types::ServerName<'static>,
        )>,
        connect_timeout: Duration,
    ) -> Result<PooledConn, ConnectError> {
        let tcp = match tokio::time::timeout(connect_timeout, TcpStream::connect(key.addr)).await {
            Err(_) => return Err(ConnectError::Timeout),
            Ok(Err(e)) => return Err(ConnectError::Refused(e)),
            Ok(Ok(s)) => s,
        };
        let _ = tcp.set_nodelay(true);
        self.stats.upstream_connections_opened.inc();
        let builder = hyper::client::conn::http1::Builder::new();
        let sender = match tls {
            None => {
                let (sender, conn) = builder
                    .handshake(TokioIo::new(tcp))
                    .await
                    .map_err(ConnectError::Handshake)?;
                tokio::task::spawn_local(async move {
                    let _ = conn.with_upgrades().await;
                });
                sender
            }
            Some((cfg, name)) => {
                let connector = tokio_rustls::TlsConnector::from(cfg.clone());
                let stream =
                    match tokio::time::timeout(connect_timeout, connector.connect(name, tcp)).await
                    {
                        Err(_) => return Err(ConnectError::Timeout),
                        Ok(Err(e)) => return Err(ConnectError::Tls(e)),
                        Ok(Ok(s)) => s,
                    };
                let (sender, conn) = builder
                    .handshake(TokioIo::new(stream))
                    .await
                    .map_err(ConnectError::Handshake)?;
                tokio::task::spawn_local(async move {
                    let _ = conn.with_upgrades().await;
                });
                sender
            }
        };
        Ok(PooledConn {
            sender,
            key: key.clone(),
            used: 1,
        })
    }
}
