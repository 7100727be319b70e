//! HTTP/2 connections to upstreams (gRPC services: h2c for `grpc`, TLS with ALPN h2 for
//! `grpcs`), one per peer per worker, every request of the worker to that peer multiplexed
//! on it as nginx's `grpc_pass` keeps them: no lock, no atomic. A connection that closed (the
//! upstream went away, sent GOAWAY, or stayed idle past hyper's keep-alive checks) is replaced
//! by the next request to the peer; the peer's `SETTINGS_MAX_CONCURRENT_STREAMS` bounds what
//! one connection carries at once (requests beyond it wait for a stream).

use std::cell::RefCell;
use std::future::Future;
use std::time::Duration;

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

/// A worker's HTTP/2 upstream connections, by peer.
pub struct H2Pool<B> {
    conns: RefCell<FxHashMap<PeerKey, SendRequest<B>>>,
}

impl<B> Default for H2Pool<B> {
    fn default() -> Self {
        H2Pool {
            conns: RefCell::default(),
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
            Some(s) if !s.is_closed() => Some(s.clone()),
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
        self.conns.borrow_mut().insert(key, sender.clone());
        Ok(sender)
    }

    /// Forgets closed connections (run periodically by the worker).
    pub fn sweep(&self) {
        self.conns.borrow_mut().retain(|_, s| !s.is_closed());
    }

    pub fn len(&self) -> usize {
        self.conns.borrow().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
