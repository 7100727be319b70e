//! The stream proxy (Kong's `stream_listen`, nginx's `stream {}`): TCP connections routed by
//! Kong's stream routes (`protocols: [tcp]`, `sources`, `destinations`) to a `tcp` service's
//! peer (its host, or a target its upstream's balancer picks), then the bytes passed both
//! ways until both sides are done. Beside the HTTP path, sharing the upstream layer (peers,
//! balancers, health, DNS, connecting) and never importing the HTTP request path.

use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Instant;

use http::HeaderMap;
use tokio::net::TcpStream;

use crate::snapshot::{Destination, Peer};
use crate::upstream::connect::{self, ConnectError};
use crate::upstream::health::Outcome;
use crate::worker::ctx::WorkerCtx;

/// Serves one stream connection accepted on `local`: routed, connected to the service's peer
/// (retried on the next target as Kong's balancer does), then spliced. A connection no route
/// takes is closed, as Kong's stream subsystem does, with a log line.
///
/// When the worker shuts down, a connection still open is closed: a stream has no request
/// boundary to finish at (nginx closes them at `worker_shutdown_timeout`).
pub async fn serve(
    ctx: Rc<WorkerCtx>,
    mut client: TcpStream,
    (peer, local): (SocketAddr, SocketAddr),
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let snap = ctx.snapshot();
    let Some(route) = snap.streams.find(peer, local) else {
        tracing::info!("stream: no Route found with those values (client {peer}, on {local})");
        return;
    };
    let Some(service) = snap.services.get(route.service) else {
        return;
    };
    let started = Instant::now();
    let mut failures = 0u32;
    let mut tried: smallvec::SmallVec<[usize; 4]> = smallvec::SmallVec::new();
    let upstream = loop {
        let (target, picked) = match &service.destination {
            Destination::Direct(p) => (p, None),
            Destination::Balanced(b) => {
                let headers = HeaderMap::new();
                let req = crate::upstream::balancer::Request {
                    consumer_id: None,
                    client_ip: peer.ip(),
                    headers: &headers,
                    path: "",
                    query: None,
                    captures: None,
                };
                match b.pick(&req, failures, &tried) {
                    Some(p) => {
                        tried.push(p.index);
                        (p.peer, Some((b.clone(), p.index)))
                    }
                    None => {
                        tracing::error!("stream: failure to get a peer from the ring-balancer");
                        return;
                    }
                }
            }
            Destination::Unsupported(_) | Destination::Broken(_) => {
                tracing::error!("stream: service {} cannot be proxied", route.service);
                return;
            }
        };
        match connect_to(target, service.connect_timeout).await {
            Ok(s) => {
                if let Some((b, i)) = &picked {
                    b.report(*i, Outcome::Status(200), Some(started.elapsed()));
                }
                break s;
            }
            Err(e) => {
                if let Some((b, i)) = &picked {
                    b.report(
                        *i,
                        match e {
                            ConnectError::Timeout => Outcome::Timeout,
                            _ => Outcome::TcpFailure,
                        },
                        None,
                    );
                }
                failures += 1;
                tracing::debug!(
                    "stream: connect to {}:{} failed: {e:?}",
                    target.host,
                    target.port
                );
                if failures > service.retries {
                    tracing::error!(
                        "stream: upstream {}:{} unreachable after {failures} tries",
                        target.host,
                        target.port
                    );
                    return;
                }
            }
        }
    };
    ctx.stats.upstream_requests.inc();
    let mut upstream = upstream;
    // Each direction is shut down for writing when the other side's reads end, so a client
    // that half-closes still gets every byte of the answer (and the other way round).
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {}
        _ = shutdown.wait_for(|s| *s) => {}
    }
}

async fn connect_to(peer: &Peer, timeout: std::time::Duration) -> Result<TcpStream, ConnectError> {
    let addr = match peer.addr {
        Some(a) => a,
        None => match &peer.dns {
            Some(name) => name
                .address(peer.port)
                .await
                .map_err(|_| ConnectError::Refused(std::io::ErrorKind::NotFound.into()))?,
            None => return Err(ConnectError::Refused(std::io::ErrorKind::NotFound.into())),
        },
    };
    connect::tcp(addr, timeout).await
}
