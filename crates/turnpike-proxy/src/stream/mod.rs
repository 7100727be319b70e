//! The stream proxy (Kong's `stream_listen`, nginx's `stream {}`): connections routed by
//! Kong's stream routes (`snapshot/streams.rs`: `tcp`, `tls`, `tls_passthrough`) to a `tcp`
//! or `tls` service's peer (its host, or a target its upstream's balancer picks), then the
//! bytes passed both ways until both sides are done. On a TLS listener the ClientHello's SNI
//! is read first (without consuming it): a `tls_passthrough` route gets the encrypted bytes
//! as they came, a `tls` route the decrypted ones (the certificate chosen by SNI from the
//! certificate store, as for HTTPS). Beside the HTTP path, sharing the upstream layer
//! (peers, balancers, health, DNS, connecting) and never importing the HTTP request path.

use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use http::HeaderMap;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

mod splice;
pub mod udp;

use crate::snapshot::streams::{StreamRoute, Transport};
use crate::snapshot::{
    Bound, Destination, Peer, ServiceInfo, PROTO_TCP, PROTO_TLS, PROTO_TLS_PASSTHROUGH,
};
use crate::upstream::connect::{self, ConnectError, Stream};
use crate::upstream::health::Outcome;
use crate::worker::ctx::WorkerCtx;

/// Each direction's buffer (allocated per connection, 64 KiB in all). `bench/streams.sh`, 1 GiB
/// each way beside nginx's stream module (16 KiB buffers): tokio's default 8 KiB gave 0.73x
/// nginx's upload and 0.64x its download throughput (a read and a write per 8 KiB); 32 KiB
/// gives 1.62x and 1.12x, 64 KiB 1.96x and 1.24x for twice the memory.
const COPY_BUFFER: usize = 32 * 1024;

/// How long a client may take to send its TLS ClientHello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves one stream connection accepted on `local` (`tls`: the listener's TLS acceptor, for
/// an `ssl` listener). A connection no route takes is closed, as Kong's stream subsystem
/// does, with a log line.
///
/// When the worker shuts down, a connection still open is closed: a stream has no request
/// boundary to finish at (nginx closes them at `worker_shutdown_timeout`).
pub async fn serve(
    ctx: Rc<WorkerCtx>,
    client: TcpStream,
    (peer, local): (SocketAddr, SocketAddr),
    tls: Option<tokio_rustls::TlsAcceptor>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let snap = ctx.snapshot();
    let sni = match &tls {
        None => None,
        Some(_) => match tokio::time::timeout(HELLO_TIMEOUT, peek_server_name(&client)).await {
            Ok(Ok(sni)) => Some(sni),
            _ => {
                tracing::info!("stream: no TLS ClientHello from {peer} (on {local})");
                return;
            }
        },
    };
    let transport = match &sni {
        None => Transport::Tcp,
        Some(name) => Transport::Tls(name.as_deref()),
    };
    let Some(route) = snap.streams.find(peer, local, transport) else {
        tracing::info!(
            "stream: no Route found with those values (client {peer}, on {local}{})",
            match &sni {
                Some(Some(n)) => format!(", sni {n}"),
                Some(None) => ", no sni".to_string(),
                None => String::new(),
            }
        );
        return;
    };
    let Some(service) = snap.services.get(route.service) else {
        return;
    };
    let mut session = Session::new();
    // The route's plugins for this session's protocol, in PRIORITY order.
    let protocol = match (&tls, route.passthrough) {
        (None, _) => PROTO_TCP,
        (Some(_), true) => PROTO_TLS_PASSTHROUGH,
        (Some(_), false) => PROTO_TLS,
    };
    let plugins = session_plugins(route, protocol);
    match preread(&plugins, peer, route) {
        Some(status) => session.status = status,
        None => match tls {
            Some(acceptor) if !route.passthrough => {
                let Ok(Ok(mut client)) =
                    tokio::time::timeout(HELLO_TIMEOUT, acceptor.accept(client)).await
                else {
                    tracing::debug!("stream: TLS handshake with {peer} failed");
                    return;
                };
                session.tls = crate::tls::tls_info(client.get_ref().1);
                proxy(
                    &ctx,
                    &mut client,
                    peer,
                    route,
                    service,
                    &mut shutdown,
                    &mut session,
                )
                .await
            }
            _ => {
                let mut client = client;
                proxy(
                    &ctx,
                    &mut client,
                    peer,
                    route,
                    service,
                    &mut shutdown,
                    &mut session,
                )
                .await
            }
        },
    }
    log_session(&plugins, &snap, route, (peer, local), &session);
}

/// The route's plugins for a session of `protocol` (a `PROTO_*` bit), in PRIORITY order.
fn session_plugins(route: &StreamRoute, protocol: u8) -> smallvec::SmallVec<[&Bound; 4]> {
    route
        .chain
        .iter()
        .filter_map(|slot| slot.bound_for(None, protocol))
        .collect()
}

/// Kong's preread phase: a plugin may refuse the session (nothing is sent back; the reason
/// goes to the log, as Kong's `kong.response.error` in the stream subsystem). The status of
/// a refusal.
fn preread(plugins: &[&Bound], peer: SocketAddr, route: &StreamRoute) -> Option<u16> {
    let exit = plugins.iter().find_map(|b| {
        b.handler
            .preread(&turnpike_plugins::StreamSession {
                client_ip: peer.ip(),
            })
            .err()
    })?;
    tracing::error!(
        "stream: unable to proxy stream connection, status: {}, err: {} (client {peer}, \
         route {})",
        exit.status,
        exit.message,
        route.id
    );
    Some(exit.status)
}

/// Kong's log phase of an ended session: its entry (Kong's stream serializer) to each of the
/// plugins' `stream_log`.
fn log_session(
    plugins: &[&Bound],
    snap: &crate::snapshot::Snapshot,
    route: &StreamRoute,
    (peer, local): (SocketAddr, SocketAddr),
    session: &Session,
) {
    if plugins.is_empty() {
        return;
    }
    let c = &session.counts;
    let entry = turnpike_plugins::log::StreamLogEntry {
        received: c.client_read.get(),
        sent: c.client_written.get(),
        upstream_sent: c.upstream_written.get(),
        upstream_received: c.upstream_read.get(),
        status: session.status,
        server_port: local.port(),
        latency_kong_ms: session
            .connected
            .map_or(0, |t| t.duration_since(session.started).as_millis() as u64),
        session_ms: session.started.elapsed().as_millis() as u64,
        route: &route.route,
        service: snap.config.services.get(route.service),
        client_ip: peer.ip(),
        started_at: session.started_at,
        tls: session.tls,
        tries: &session.tries,
    };
    for b in plugins {
        b.handler.stream_log(&entry);
    }
}

/// What a session's log entry is made of.
struct Session {
    started: Instant,
    started_at: std::time::SystemTime,
    counts: Counts,
    /// Kong's stream status: 200 proxied, a plugin's (403) refused, 502 no upstream.
    status: u16,
    /// When the service was connected.
    connected: Option<Instant>,
    /// The client's TLS, once the gateway terminated it.
    tls: Option<turnpike_plugins::log::TlsInfo>,
    /// The balancer's tries (Kong's `tries`).
    tries: Vec<turnpike_plugins::log::StreamTry>,
}

impl Session {
    /// Notes a balancer try: its peer (at `addr` once resolved), its choice begun at
    /// `choosing` and made now.
    fn tried(&mut self, peer: &Peer, addr: Option<SocketAddr>, choosing: Instant) {
        let since_start = choosing.saturating_duration_since(self.started);
        let start = self.started_at + since_start;
        self.tries.push(turnpike_plugins::log::StreamTry {
            ip: addr.map(|a| a.ip()),
            host: peer.host.clone(),
            port: addr.map_or(peer.port, |a| a.port()),
            start_ns: start
                .duration_since(std::time::SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64),
            latency_ns: choosing.elapsed().as_nanos() as u64,
            failed: false,
        });
    }

    fn new() -> Session {
        Session {
            started: Instant::now(),
            started_at: std::time::SystemTime::now(),
            counts: Counts::default(),
            status: 200,
            connected: None,
            tls: None,
            tries: Vec::new(),
        }
    }
}

/// Bytes moved each way, counted as they pass.
#[derive(Default)]
struct Counts {
    client_read: std::cell::Cell<u64>,
    client_written: std::cell::Cell<u64>,
    upstream_read: std::cell::Cell<u64>,
    upstream_written: std::cell::Cell<u64>,
}

/// Connects to the service (retrying on the next target as Kong's balancer does) and passes
/// the bytes both ways. Each direction is shut down for writing when the other side's reads
/// end, so a client that half-closes still gets every byte of the answer (and the other way
/// round). A connection on which nothing moves either way for the service's `read_timeout`
/// is closed (nginx's `proxy_timeout`, which Kong sets from the service's timeouts).
async fn proxy<C: AsyncRead + AsyncWrite + Unpin + 'static>(
    ctx: &WorkerCtx,
    client: &mut C,
    peer: SocketAddr,
    route: &StreamRoute,
    service: &ServiceInfo,
    shutdown: &mut tokio::sync::watch::Receiver<bool>,
    session: &mut Session,
) {
    let Some(mut upstream) = connect_service(service, peer, route, session).await else {
        session.status = 502;
        return;
    };
    session.connected = Some(Instant::now());
    ctx.stats.upstream_requests.inc();
    let last = std::cell::Cell::new(Instant::now());
    let idle = service.read_timeout().max(service.write_timeout());
    let c = &session.counts;
    // Two plain TCP sockets: the kernel moves the bytes (splice); else they are copied.
    let plain_client = (client as &mut dyn std::any::Any).downcast_mut::<TcpStream>();
    if let (Some(client), Stream::Plain(upstream)) = (plain_client, &upstream) {
        let spliced = splice::both_ways(
            client,
            upstream,
            splice::Tally {
                read: &c.client_read,
                written: &c.upstream_written,
                last: &last,
            },
            splice::Tally {
                read: &c.upstream_read,
                written: &c.client_written,
                last: &last,
            },
        );
        return until_idle(spliced, &last, idle, shutdown, route).await;
    }
    let mut client = Activity {
        inner: client,
        last: &last,
        read: &c.client_read,
        written: &c.client_written,
    };
    let mut upstream = Activity {
        inner: &mut upstream,
        last: &last,
        read: &c.upstream_read,
        written: &c.upstream_written,
    };
    let copy = tokio::io::copy_bidirectional_with_sizes(
        &mut client,
        &mut upstream,
        COPY_BUFFER,
        COPY_BUFFER,
    );
    until_idle(copy, &last, idle, shutdown, route).await
}

/// Runs a session's transfer until it ends, the worker stops, or nothing moved either way for
/// `idle` (since `last`).
async fn until_idle<F: std::future::Future>(
    transfer: F,
    last: &std::cell::Cell<Instant>,
    idle: Duration,
    shutdown: &mut tokio::sync::watch::Receiver<bool>,
    route: &StreamRoute,
) {
    tokio::pin!(transfer);
    loop {
        let deadline = tokio::time::Instant::from_std(last.get() + idle);
        tokio::select! {
            _ = &mut transfer => return,
            _ = shutdown.wait_for(|s| *s) => return,
            _ = tokio::time::sleep_until(deadline) => {
                if last.get() + idle <= Instant::now() {
                    tracing::debug!("stream: route {}: idle past {idle:?}, closed", route.id);
                    return;
                }
            }
        }
    }
}

/// A side of a stream that notes when bytes last moved through it (reads and writes) and
/// how many did each way.
struct Activity<'a, S> {
    inner: S,
    last: &'a std::cell::Cell<Instant>,
    read: &'a std::cell::Cell<u64>,
    written: &'a std::cell::Cell<u64>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Activity<'_, S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if n > 0 {
            self.last.set(Instant::now());
            self.read.set(self.read.get() + n as u64);
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Activity<'_, S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let r = std::pin::Pin::new(&mut self.inner).poll_write(cx, buf);
        if let std::task::Poll::Ready(Ok(n)) = r {
            self.written.set(self.written.get() + n as u64);
        }
        r
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

async fn connect_service(
    service: &ServiceInfo,
    client: SocketAddr,
    route: &StreamRoute,
    session: &mut Session,
) -> Option<Stream> {
    let started = Instant::now();
    let mut failures = 0u32;
    let mut tried: smallvec::SmallVec<[usize; 4]> = smallvec::SmallVec::new();
    loop {
        let choosing = Instant::now();
        let (target, picked) = pick(service, client, failures, &tried, route)?;
        if let Some(i) = picked {
            tried.push(i);
        }
        let tls = service
            .tls
            .as_ref()
            .map(|cfg| (cfg, target.server_name.clone()));
        let addr = target.address().await;
        session.tried(target, addr, choosing);
        let connected = match addr {
            Some(addr) => match connect::tcp(addr, service.connect_timeout()).await {
                Ok(tcp) => connect::secure(tcp, tls, service.connect_timeout()).await,
                Err(e) => Err(e),
            },
            None => Err(ConnectError::Refused(std::io::ErrorKind::NotFound.into())),
        };
        if connected.is_err() {
            if let Some(t) = session.tries.last_mut() {
                t.failed = true;
            }
        }
        match connected {
            Ok(s) => {
                if let (Destination::Balanced(b), Some(i)) = (&service.destination, picked) {
                    b.report(i, Outcome::Status(200), Some(started.elapsed()));
                }
                return Some(s);
            }
            Err(e) => {
                if let (Destination::Balanced(b), Some(i)) = (&service.destination, picked) {
                    let outcome = match e {
                        ConnectError::Timeout => Outcome::Timeout,
                        _ => Outcome::TcpFailure,
                    };
                    b.report(i, outcome, None);
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
                    return None;
                }
            }
        }
    }
}

/// The service's peer for a session from `client` (TCP and UDP alike): its host, or the
/// target its upstream's balancer picks on this attempt (`tried` left out where it can be),
/// with the target's index for health reports.
fn pick<'s>(
    service: &'s ServiceInfo,
    client: SocketAddr,
    attempt: u32,
    tried: &[usize],
    route: &StreamRoute,
) -> Option<(&'s Peer, Option<usize>)> {
    match &service.destination {
        Destination::Direct(p) => Some((&**p, None)),
        Destination::Balanced(b) => {
            let headers = HeaderMap::new();
            let req = crate::upstream::balancer::Request {
                consumer_id: None,
                client_ip: client.ip(),
                headers: &headers,
                path: "",
                query: None,
                captures: None,
            };
            match b.pick(&req, attempt, tried) {
                Some(p) => Some((p.peer, Some(p.index))),
                None => {
                    tracing::error!("stream: failure to get a peer from the ring-balancer");
                    None
                }
            }
        }
        Destination::Unsupported(_) | Destination::Broken(_) => {
            tracing::error!("stream: route {}: its service cannot be proxied", route.id);
            None
        }
    }
}

/// The server name of the ClientHello the client is sending, read without consuming it (the
/// bytes stay for the handshake, or for a passthrough upstream). `Err` when what comes is not
/// a ClientHello (or the connection ends first).
async fn peek_server_name(stream: &TcpStream) -> Result<Option<String>, ()> {
    // A ClientHello fits in a few records; 16 KiB plus headers covers any real one.
    let mut buf = vec![0u8; 16 * 1024 + 512];
    let mut last = 0;
    loop {
        let n = stream.peek(&mut buf).await.map_err(|_| ())?;
        if n == 0 {
            return Err(());
        }
        if n > last {
            last = n;
            match server_name_of(&buf[..n]) {
                Hello::Name(name) => return Ok(name),
                Hello::NotTls => return Err(()),
                Hello::Partial if n == buf.len() => return Err(()),
                Hello::Partial => {}
            }
        }
        // Part of the ClientHello only: wait for the rest.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

enum Hello {
    Name(Option<String>),
    Partial,
    NotTls,
}

/// Parses a ClientHello from the start of a connection's bytes with rustls.
fn server_name_of(bytes: &[u8]) -> Hello {
    let mut acceptor = rustls::server::Acceptor::default();
    let mut cursor = std::io::Cursor::new(bytes);
    while (cursor.position() as usize) < bytes.len() {
        match acceptor.read_tls(&mut cursor) {
            Ok(0) => break,
            Ok(_) => {}
            Err(_) => return Hello::NotTls,
        }
    }
    match acceptor.accept() {
        Ok(Some(accepted)) => Hello::Name(
            accepted
                .client_hello()
                .server_name()
                .map(|n| n.to_ascii_lowercase()),
        ),
        Ok(None) => Hello::Partial,
        Err(_) => Hello::NotTls,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_name_is_read_from_a_client_hello() {
        // A real ClientHello, written by rustls's client for "db.test".
        let cfg = crate::tls::unverified_client_config();
        let name = rustls::pki_types::ServerName::try_from("db.test").unwrap();
        let mut conn = rustls::ClientConnection::new(cfg, name).unwrap();
        let mut hello = Vec::new();
        conn.write_tls(&mut hello).unwrap();
        assert!(matches!(server_name_of(&hello), Hello::Name(Some(n)) if n == "db.test"));
        assert!(matches!(
            server_name_of(&hello[..hello.len() / 2]),
            Hello::Partial
        ));
        assert!(matches!(
            server_name_of(b"GET / HTTP/1.1\r\n\r\n"),
            Hello::NotTls
        ));
    }
}
