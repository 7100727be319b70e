//! HTTP/2 connections to upstreams (gRPC services: h2c for `grpc`, TLS with ALPN h2 for
//! `grpcs`), one per peer per worker, every request of the worker to that peer multiplexed
//! on it as nginx's `grpc_pass` keeps them: no lock, no atomic. A connection that closed (the
//! upstream went away, sent GOAWAY, or stayed idle past hyper's keep-alive checks) is replaced
//! by the next request to the peer; the peer's `SETTINGS_MAX_CONCURRENT_STREAMS` bounds what
//! one connection carries at once (requests beyond it wait for a stream).

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::time::{Duration, Instant};

use hyper::client::conn::http2::{Builder, SendRequest};
use hyper_util::rt::{TokioIo, TokioTimer};
use rustc_hash::FxHashMap;

use crate::upstream::connect::{ConnectError, Stream};
use crate::upstream::pool::PeerKey;

/// Runs hyper's connection tasks on the worker's own thread.
#[derive(Clone, Copy)]
struct Local;

impl<F: Future + 'static> hyper::rt::Executor<F> for Local {
    fn execute(&self, fut: F) {
        tokio::task::spawn_local(fut);
    }
}

/// How often an idle HTTP/2 connection is pinged, and how long its answer may take: a peer
/// that vanished without a FIN is found within this, not at the next request's timeout.
const KEEPALIVE: Duration = Duration::from_secs(30);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection and when a request last took it.
struct Entry<B> {
    sender: SendRequest<B>,
    used: Cell<Instant>,
}

/// A worker's HTTP/2 upstream connections, by peer. A connection no request took for
/// `idle_timeout` (`upstream_keepalive_idle_timeout`) is let go: its key may never come back
/// (a config change makes new TLS settings, a DNS change a new generation), and the
/// keep-alive pings would otherwise hold it open for ever.
pub struct H2Pool<B> {
    conns: RefCell<FxHashMap<PeerKey, Entry<B>>>,
    idle_timeout: Duration,
}

impl<B> H2Pool<B> {
    pub fn new(idle_timeout: Duration) -> Self {
        H2Pool {
            conns: RefCell::default(),
            idle_timeout,
        }
    }
}

impl<B> H2Pool<B>
where
    B: http_body::Body + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    /// The open connection to `key`, if there is one that can take a request.
    pub fn get(&self, key: &PeerKey) -> Option<SendRequest<B>> {
        let mut conns = self.conns.borrow_mut();
        match conns.get(key) {
            Some(e) if !e.sender.is_closed() => {
                e.used.set(Instant::now());
                Some(e.sender.clone())
            }
            Some(_) => {
                conns.remove(key);
                None
            }
            None => None,
        }
    }

    /// Starts HTTP/2 on `stream` (just opened to `key`) and keeps the connection for the
    /// requests after this one.
    pub async fn handshake(
        &self,
        key: PeerKey,
        stream: Stream,
    ) -> Result<SendRequest<B>, ConnectError> {
        let (sender, conn) = Builder::new(Local)
            .timer(TokioTimer::new())
            .keep_alive_interval(KEEPALIVE)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .handshake(TokioIo::new(stream))
            .await
            .map_err(ConnectError::Handshake)?;
        tokio::task::spawn_local(async move {
            if let Err(e) = conn.await {
                tracing::debug!("upstream HTTP/2 connection ended: {e}");
            }
        });
        let entry = Entry {
            sender: sender.clone(),
            used: Cell::new(Instant::now()),
        };
        self.conns.borrow_mut().insert(key, entry);
        Ok(sender)
    }

    /// Forgets closed connections and lets go of those idle past the timeout (run
    /// periodically by the worker): hyper closes a connection once its last sender is gone and
    /// its streams are done.
    pub fn sweep(&self) {
        let timeout = self.idle_timeout;
        self.conns
            .borrow_mut()
            .retain(|_, e| !e.sender.is_closed() && e.used.get().elapsed() <= timeout);
    }

    pub fn len(&self) -> usize {
        self.conns.borrow().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::Empty;

    /// A connection idle past the timeout is let go, and the upstream sees it close.
    #[test]
    fn idle_connections_are_let_go() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        tokio::task::LocalSet::new().block_on(&rt, async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let served = tokio::task::spawn_local(async move {
                let (s, _) = listener.accept().await.unwrap();
                let svc = hyper::service::service_fn(|_req| async {
                    Ok::<_, std::convert::Infallible>(http::Response::new(
                        Empty::<bytes::Bytes>::new(),
                    ))
                });
                let _ = hyper::server::conn::http2::Builder::new(Local)
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
            let pool: H2Pool<Empty<bytes::Bytes>> = H2Pool::new(Duration::from_millis(50));
            let key = PeerKey {
                peer: 1,
                tls: None,
                dns: 0,
            };
            let tcp = crate::upstream::connect::tcp(addr, Duration::from_secs(1))
                .await
                .unwrap();
            let mut sender = pool.handshake(key, Stream::Plain(tcp)).await.unwrap();
            let req = http::Request::builder()
                .uri(format!("http://{addr}/"))
                .body(Empty::new())
                .unwrap();
            assert_eq!(sender.send_request(req).await.unwrap().status(), 200);
            drop(sender);
            pool.sweep();
            assert!(pool.get(&key).is_some(), "kept while in use");
            tokio::time::sleep(Duration::from_millis(120)).await;
            pool.sweep();
            assert!(pool.is_empty());
            // The upstream's side of the connection ends once the pool let go of it.
            tokio::time::timeout(Duration::from_secs(5), served)
                .await
                .expect("the connection closed")
                .unwrap();
        });
    }
}
