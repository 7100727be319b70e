//! Listeners and workers: one OS thread per worker, each with its own current-thread tokio
//! runtime, its own `SO_REUSEPORT` listening sockets (the kernel spreads connections), its own
//! upstream pool and counters. A connection never leaves the worker that accepted it.

use std::future::Future;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use turnpike_config::conf::ListenAddr;

use crate::body::{Http2Body, RequestBody};
use crate::http1::server;
use crate::runloop;
use crate::state::{Gateway, SniResolver};
use crate::tls;
use crate::worker::ctx::{ConnInfo, WorkerCtx};
use crate::worker::proxy_protocol;

/// Runs hyper's HTTP/2 stream tasks on the worker's own thread.
#[derive(Clone, Copy)]
pub struct LocalExec;

impl<F: Future + 'static> hyper::rt::Executor<F> for LocalExec {
    fn execute(&self, fut: F) {
        tokio::task::spawn_local(fut);
    }
}

/// A listening address bound for every worker.
pub struct BoundListener {
    pub spec: ListenAddr,
    /// One socket per worker (SO_REUSEPORT), or one shared socket cloned per worker.
    pub sockets: Vec<std::net::TcpListener>,
    /// A `udp` stream listener's sockets instead: one per worker with `reuseport` (the
    /// kernel keeps a client's datagrams on one of them), else one, for the first worker (a
    /// client's session must live in one worker).
    pub udp: Vec<std::net::UdpSocket>,
}

fn bind_udp(spec: &ListenAddr) -> std::io::Result<std::net::UdpSocket> {
    let domain = if spec.addr.is_ipv6() {
        Domain::IPV6
    } else {
        Domain::IPV4
    };
    let s = Socket::new(domain, Type::DGRAM, Some(Protocol::UDP))?;
    s.set_reuse_address(true)?;
    if spec.reuseport {
        s.set_reuse_port(true)?;
    }
    if spec.addr.is_ipv6() {
        s.set_only_v6(true)?;
    }
    s.bind(&spec.addr.into())?;
    s.set_nonblocking(true)?;
    Ok(s.into())
}

fn somaxconn() -> Option<u32> {
    std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn bind_one(
    spec: &ListenAddr,
    reuseport: bool,
    backlog: u32,
) -> std::io::Result<std::net::TcpListener> {
    let domain = if spec.addr.is_ipv6() {
        Domain::IPV6
    } else {
        Domain::IPV4
    };
    let s = Socket::new(domain, Type::STREAM, Some(Protocol::TCP))?;
    s.set_reuse_address(true)?;
    if reuseport {
        s.set_reuse_port(true)?;
    }
    if spec.addr.is_ipv6() {
        s.set_only_v6(true)?;
    }
    s.set_nodelay(true)?;
    s.bind(&spec.addr.into())?;
    s.listen(backlog.min(i32::MAX as u32) as i32)?;
    s.set_nonblocking(true)?;
    Ok(s.into())
}

/// Binds every listen address for `workers` workers. The backlog is clamped to the kernel's
/// `net.core.somaxconn`, with a warning, since the kernel would silently clamp it anyway.
pub fn bind(
    specs: &[ListenAddr],
    workers: usize,
    warnings: &mut Vec<String>,
) -> std::io::Result<Vec<BoundListener>> {
    let max = somaxconn();
    let mut out = Vec::new();
    for spec in specs {
        if spec.udp {
            let first = bind_udp(spec)?;
            let mut spec = spec.clone();
            spec.addr = first.local_addr()?;
            let mut udp = vec![first];
            if spec.reuseport {
                for _ in 1..workers {
                    udp.push(bind_udp(&spec)?);
                }
            }
            out.push(BoundListener {
                spec,
                sockets: Vec::new(),
                udp,
            });
            continue;
        }
        let mut backlog = spec.backlog;
        if let Some(m) = max {
            if backlog > m {
                warnings.push(format!(
                    "listen backlog {backlog} for {} exceeds net.core.somaxconn ({m}); using {m} (raise it with: sysctl -w net.core.somaxconn={backlog})",
                    spec.addr
                ));
                backlog = m;
            }
        }
        let mut sockets = Vec::with_capacity(workers);
        if spec.reuseport && workers > 1 {
            let first = bind_one(spec, true, backlog)?;
            // Port 0 means "any": the other workers must share the port the first one got.
            let mut spec2 = spec.clone();
            spec2.addr = first.local_addr()?;
            sockets.push(first);
            for _ in 1..workers {
                sockets.push(bind_one(&spec2, true, backlog)?);
            }
        } else {
            let s = bind_one(spec, spec.reuseport, backlog)?;
            for _ in 1..workers {
                sockets.push(s.try_clone()?);
            }
            sockets.push(s);
        }
        let mut spec = spec.clone();
        spec.addr = sockets[0].local_addr()?;
        out.push(BoundListener {
            spec,
            sockets,
            udp: Vec::new(),
        });
    }
    Ok(out)
}

/// Starts the workers; each serves every listener until `shutdown` turns true, then stops
/// accepting, lets open connections finish (graceful HTTP/1 and HTTP/2 shutdown) and exits.
/// `release_memory`: hands the calling thread's freed memory back to the system (the
/// allocator's collect); a worker calls it once it has gone quiet after serving requests.
pub fn start_workers(
    gateway: Arc<Gateway>,
    listeners: Vec<BoundListener>,
    workers: usize,
    shutdown: watch::Receiver<bool>,
    release_memory: fn(),
) -> Vec<std::thread::JoinHandle<()>> {
    let mut per_worker: Vec<Vec<(ListenAddr, std::net::TcpListener)>> =
        (0..workers).map(|_| Vec::new()).collect();
    let mut udp_per_worker: Vec<Vec<(ListenAddr, std::net::UdpSocket)>> =
        (0..workers).map(|_| Vec::new()).collect();
    for l in listeners {
        for (i, s) in l.sockets.into_iter().enumerate() {
            per_worker[i].push((l.spec.clone(), s));
        }
        for (i, s) in l.udp.into_iter().enumerate() {
            udp_per_worker[i % workers.max(1)].push((l.spec.clone(), s));
        }
    }
    // One session cache and one ticket key for both listener kinds and every worker, so a
    // session resumes whichever of them the client reaches next.
    let sessions = tls::Sessions::new(&gateway.settings.tls);
    let tls_h1 = tls::server_config(
        Arc::new(SniResolver {
            gateway: gateway.clone(),
        }),
        false,
        &gateway.settings.tls,
        &sessions,
    );
    let tls_h2 = tls::server_config(
        Arc::new(SniResolver {
            gateway: gateway.clone(),
        }),
        true,
        &gateway.settings.tls,
        &sessions,
    );
    per_worker
        .into_iter()
        .zip(udp_per_worker)
        .enumerate()
        .map(|(i, (socks, udp))| {
            let gateway = gateway.clone();
            let shutdown = shutdown.clone();
            let (tls_h1, tls_h2) = (tls_h1.clone(), tls_h2.clone());
            std::thread::Builder::new()
                .name(format!("turnpike-worker-{i}"))
                .spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .expect("worker runtime");
                    let local = tokio::task::LocalSet::new();
                    local.block_on(
                        &rt,
                        worker_main(
                            i,
                            gateway,
                            (socks, udp),
                            shutdown,
                            (tls_h1, tls_h2),
                            release_memory,
                        ),
                    );
                })
                .expect("spawn worker thread")
        })
        .collect()
}

/// When a worker has gone quiet: what a burst of traffic freed (the buffers and request
/// states of connections that have gone idle) goes back to the system two sweeper ticks (1 s)
/// after the last request, past the connections' linger (`h1_server::ACTIVE_LINGER`).
/// mimalloc returns freed pages only from later allocations, which a quiet worker does not
/// make: without this its memory stays near the burst's peak (measured, BENCHMARKS.md).
struct QuietWatch {
    requests: u64,
    quiet_ticks: u32,
}

impl QuietWatch {
    const TICKS: u32 = 2;

    fn new(requests: u64) -> QuietWatch {
        QuietWatch {
            requests,
            quiet_ticks: 0,
        }
    }

    /// One tick with the worker's request count so far; true once per quiet spell, on its
    /// `TICKS`th tick without a request.
    fn tick(&mut self, requests: u64) -> bool {
        if requests != self.requests {
            self.requests = requests;
            self.quiet_ticks = 0;
            return false;
        }
        self.quiet_ticks = self.quiet_ticks.saturating_add(1);
        self.quiet_ticks == Self::TICKS
    }
}

/// A worker's TCP listeners and UDP stream sockets.
type WorkerSockets = (
    Vec<(ListenAddr, std::net::TcpListener)>,
    Vec<(ListenAddr, std::net::UdpSocket)>,
);

async fn worker_main(
    index: usize,
    gateway: Arc<Gateway>,
    (sockets, udp): WorkerSockets,
    shutdown: watch::Receiver<bool>,
    (tls_h1, tls_h2): (Arc<rustls::ServerConfig>, Arc<rustls::ServerConfig>),
    release_memory: fn(),
) {
    let stats = gateway.stats.workers[index].clone();
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1)
        ^ ((index as u64 + 1) << 48)
        ^ std::process::id() as u64;
    let access_log = gateway.settings.access_log.clone();
    let deadlines = crate::worker::deadline::Deadlines::new();
    let ctx = Rc::new(WorkerCtx::new(gateway, stats, seed, deadlines, access_log));
    let ticker = tokio::task::spawn_local(ctx.deadlines.clone().run());
    // TLS stream listeners negotiate no application protocol (a client offering one, as MQTT
    // clients may, is not refused for it).
    let tls_stream = {
        let mut cfg = (*tls_h1).clone();
        cfg.alpn_protocols.clear();
        Arc::new(cfg)
    };
    // Idle upstream connections past their timeout are closed even when no request comes.
    let sweeper = {
        let ctx = ctx.clone();
        tokio::task::spawn_local(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            let mut quiet = QuietWatch::new(ctx.stats.requests.get());
            loop {
                tick.tick().await;
                // Lets go of a replaced snapshot even when no request comes (the reaper then
                // frees it).
                drop(ctx.snapshot());
                ctx.pool.sweep();
                ctx.h2.sweep();
                if let Some(log) = &ctx.access_log {
                    log.flush();
                }
                if quiet.tick(ctx.stats.requests.get()) {
                    release_memory();
                }
            }
        })
    };
    let mut accept_loops = Vec::new();
    for (spec, sock) in udp {
        let sock = tokio::net::UdpSocket::from_std(sock).expect("register UDP listener");
        accept_loops.push(tokio::task::spawn_local(crate::stream::udp::serve(
            ctx.clone(),
            sock,
            spec.addr,
            shutdown.clone(),
        )));
    }
    for (spec, sock) in sockets {
        let listener = TcpListener::from_std(sock).expect("register listener");
        let ctx = ctx.clone();
        let shutdown = shutdown.clone();
        let tls_cfg = if spec.ssl && spec.stream {
            Some(tls_stream.clone())
        } else if spec.ssl {
            Some(if spec.http2 {
                tls_h2.clone()
            } else {
                tls_h1.clone()
            })
        } else {
            None
        };
        accept_loops.push(tokio::task::spawn_local(accept_loop(
            ctx, listener, spec, tls_cfg, shutdown,
        )));
    }
    for l in accept_loops {
        let _ = l.await;
    }
    // HTTP/1 connections waiting for a request close now; those serving one close after it.
    ctx.closing.set(true);
    ctx.deadlines.expire_idle();
    // Stopped accepting: wait for this worker's open connections to finish.
    while ctx.stats.connections_active.load(Ordering::Relaxed) > 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    sweeper.abort();
    ticker.abort();
    if let Some(log) = &ctx.access_log {
        log.flush();
    }
}

async fn accept_loop(
    ctx: Rc<WorkerCtx>,
    listener: TcpListener,
    spec: ListenAddr,
    tls_cfg: Option<Arc<rustls::ServerConfig>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let acceptor = tls_cfg.map(tokio_rustls::TlsAcceptor::from);
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = shutdown.wait_for(|s| *s) => return,
        };
        let (stream, peer) = match accepted {
            Ok(x) => x,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!("accept on {} failed: {e}", spec.addr);
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        ctx.stats.connections_accepted.inc();
        ctx.stats.connections_active.fetch_add(1, Ordering::Relaxed);
        if spec.stream {
            let active = Active(ctx.clone());
            let local = stream.local_addr().unwrap_or(spec.addr);
            let shutdown = shutdown.clone();
            let acceptor = acceptor.clone();
            let proxy_protocol = spec.proxy_protocol;
            tokio::task::spawn_local(async move {
                let mut stream = stream;
                let mut peer = peer;
                if proxy_protocol {
                    // nginx's stream realip: a trusted balancer's PROXY header names the client.
                    match proxy_protocol::read_header(&mut stream).await {
                        Ok(Some(client)) if active.0.gateway.settings.is_trusted(peer.ip()) => {
                            peer = client
                        }
                        Ok(_) => {}
                        Err(e) => {
                            tracing::info!(
                                "stream: {e} while reading PROXY protocol, client: {peer}"
                            );
                            return;
                        }
                    }
                }
                crate::stream::serve(active.0.clone(), stream, (peer, local), acceptor, shutdown)
                    .await;
                drop(active);
            });
            continue;
        }
        let ctx = ctx.clone();
        let acceptor = acceptor.clone();
        let shutdown = shutdown.clone();
        let flags = (spec.http2, spec.proxy_protocol);
        let local_port = spec.addr.port();
        tokio::task::spawn_local(serve_connection(
            ctx, stream, peer, local_port, acceptor, flags, shutdown,
        ));
        // One accept, then the connections already open get a turn (nginx's multi_accept off):
        // in a burst of new connections the first ones are served while the rest are accepted,
        // instead of all being accepted first and answered together at the end.
        tokio::task::yield_now().await;
    }
}

/// Counts a connection as active (`connections_active`) until it is dropped, however its
/// task ends.
struct Active(Rc<WorkerCtx>);

impl Drop for Active {
    fn drop(&mut self) {
        self.0
            .stats
            .connections_active
            .fetch_sub(1, Ordering::Relaxed);
    }
}

/// A connection's task. Not an `async fn`: one of those keeps its arguments twice in its
/// future (as passed and as moved into its body), and every connection's task is as large as
/// its future while the connection sits idle; an `async move` block keeps them once.
#[allow(clippy::manual_async_fn)]
fn serve_connection(
    ctx: Rc<WorkerCtx>,
    mut stream: TcpStream,
    mut peer: SocketAddr,
    local_port: u16,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    (http2, proxy_protocol): (bool, bool),
    shutdown: watch::Receiver<bool>,
) -> impl std::future::Future<Output = ()> {
    // Made here, not in the block: the block then holds the context once, in the guard.
    let active = Active(ctx);
    async move {
        let ctx = &active.0;
        let trusted = ctx.gateway.settings.is_trusted(peer.ip());
        // The PROXY header comes first, before a TLS handshake; the client it names is the
        // connection's with `real_ip_header = proxy_protocol` and a trusted balancer.
        let mut real_ip_header = true;
        let mut realip_remote = None;
        if proxy_protocol {
            match Box::pin(proxy_protocol::read_header(&mut stream)).await {
                Ok(named) => {
                    if ctx.gateway.settings.real_ip_proxy_protocol {
                        real_ip_header = false;
                        if let Some(client) = named.filter(|_| trusted) {
                            realip_remote = Some(peer.ip());
                            peer = client;
                        }
                    }
                }
                Err(e) => {
                    tracing::info!("{e} while reading PROXY protocol, client: {peer}");
                    return;
                }
            }
        }
        let local_ip = stream.local_addr().ok().map(|a| a.ip());
        match acceptor {
            None => {
                // With the http2 flag a plain listener also speaks h2c with prior knowledge: the
                // client's first bytes tell which.
                // Boxed: its timer would otherwise set the size of every connection's task.
                let h2c = http2
                    && Box::pin(starts_with_h2_preface(
                        &stream,
                        ctx.gateway.settings.keepalive_timeout,
                    ))
                    .await;
                let mut info = ConnInfo::new(peer, local_port, false, None, !h2c, trusted);
                info.local_ip = local_ip;
                info.real_ip_header = real_ip_header;
                info.realip_remote = realip_remote;
                let info = Rc::new(info);
                // The HTTP/2 path's state is boxed: every connection's task is as large as its
                // largest path, and most connections are HTTP/1.1 ones that sit idle.
                if h2c {
                    Box::pin(serve_h2(ctx, TokioIo::new(stream), info, shutdown)).await
                } else {
                    server::serve(
                        &runloop::Connection {
                            ctx: ctx.clone(),
                            info,
                        },
                        Box::new(stream),
                    )
                    .await
                }
            }
            Some(acceptor) => {
                // Boxed, as the HTTP/2 path: the handshake's state is needed only while it runs.
                // The stream is boxed as it comes out of the handshake: held by value in this
                // future, its 1.2 KiB would stay in every connection's task even after it moved
                // on (a moved-from local keeps its room in the future), plain ones included.
                let tls = match Box::pin(tokio::time::timeout(
                    Duration::from_secs(60),
                    acceptor.accept(stream),
                ))
                .await
                {
                    Ok(Ok(s)) => Box::new(s),
                    _ => return,
                };
                let (_, session) = tls.get_ref();
                let sni = session.server_name().map(|s| s.to_ascii_lowercase());
                let h2 = session.alpn_protocol() == Some(b"h2");
                let mut info = ConnInfo::new(peer, local_port, true, sni, !h2, trusted);
                info.tls_info = crate::tls::tls_info(session);
                info.local_ip = local_ip;
                info.real_ip_header = real_ip_header;
                info.realip_remote = realip_remote;
                let info = Rc::new(info);
                if h2 {
                    Box::pin(serve_h2(ctx, TokioIo::new(*tls), info, shutdown)).await
                } else {
                    server::serve(
                        &runloop::Connection {
                            ctx: ctx.clone(),
                            info,
                        },
                        tls,
                    )
                    .await
                }
            }
        }
    }
}

/// Resolves when the connection has had no request in flight for `timeout` since its last
/// request ended (or since it opened): nginx's keepalive_timeout for idle connections and a
/// bound on how long a client may take to send a request head (slow clients are dropped).
async fn idle_watch(
    info: &ConnInfo,
    deadlines: &crate::worker::deadline::Deadlines,
    timeout: Duration,
) {
    loop {
        let idle_for = deadlines
            .coarse_now()
            .saturating_duration_since(info.last_active.get());
        let wait = if info.in_flight.get() > 0 {
            timeout
        } else if idle_for >= timeout {
            return;
        } else {
            timeout - idle_for
        };
        tokio::time::sleep(wait.max(crate::worker::deadline::TICK)).await;
    }
}

const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Peeks at the first bytes of a plain connection: true when they are HTTP/2's preface.
async fn starts_with_h2_preface(stream: &TcpStream, wait: Duration) -> bool {
    let mut buf = [0u8; 24];
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let n = match tokio::time::timeout_at(deadline, stream.peek(&mut buf)).await {
            Ok(Ok(n)) => n,
            _ => return false,
        };
        if n == 0 || buf[..n] != H2_PREFACE[..n] {
            return false;
        }
        if n == H2_PREFACE.len() {
            return true;
        }
        // A partial preface: wait for more bytes.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Serves HTTP/2 with hyper until the connection ends or stays idle past the keepalive
/// timeout; when the worker shuts down, lets it finish its in-flight streams first.
/// The HTTP/2 connection window a client gets (per connection; each stream keeps hyper's
/// 1 MiB). h2 closes a connection (GOAWAY ENHANCE_YOUR_CALM, `too_many_data_frames`) when
/// the DATA frames under 256 bytes it holds unread cost more than half this window in framing
/// overhead: gRPC streams of small messages, read by the worker a little after the connection
/// took them off the socket, passed that bound at hyper's 1 MiB (`bench/grpc.sh`'s streaming
/// calls: 50 bidirectional streams of 69-byte messages on one connection lost a quarter of
/// their calls); at 8 MiB they do not, and a stream still holds at most its own window.
const H2_CONNECTION_WINDOW: u32 = 8 << 20;

async fn serve_h2<I>(
    ctx: &Rc<WorkerCtx>,
    io: I,
    info: Rc<ConnInfo>,
    mut shutdown: watch::Receiver<bool>,
) where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let svc = {
        let ctx = ctx.clone();
        let info = info.clone();
        service_fn(move |req: http::Request<hyper::body::Incoming>| {
            let (ctx, info) = (ctx.clone(), info.clone());
            async move {
                // `:authority` and a Host header that differ are malformed (RFC 9113
                // §8.3.1): one host is routed and forwarded, or the request is refused.
                let (mut parts, body) = req.into_parts();
                if crate::http1::authority::settle_host(
                    &parts.uri,
                    &mut parts.headers,
                    false,
                    false,
                )
                .is_err()
                {
                    return Ok(runloop::errors::refusal(
                        &ctx,
                        crate::http1::server::Refused::BadRequest,
                    ));
                }
                let req =
                    http::Request::from_parts(parts, RequestBody::Http2(Http2Body::new(body)));
                Ok::<_, std::convert::Infallible>(
                    runloop::handle(ctx, info, req, crate::http1::header_names::seen::ALL, None)
                        .await,
                )
            }
        })
    };
    let timeout = ctx.gateway.settings.keepalive_timeout;
    let conn = hyper::server::conn::http2::Builder::new(LocalExec)
        .timer(TokioTimer::new())
        .initial_connection_window_size(H2_CONNECTION_WINDOW)
        .serve_connection(io, svc);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => return,
        _ = idle_watch(&info, &ctx.deadlines, timeout) => return,
        _ = shutdown.wait_for(|s| *s) => conn.as_mut().graceful_shutdown(),
    }
    let _ = conn.await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_is_released_once_per_quiet_spell() {
        let mut w = QuietWatch::new(0);
        // Quiet from the start (no traffic yet): released once, on the second tick.
        let fired: Vec<bool> = [0, 0, 0, 0].iter().map(|&n| w.tick(n)).collect();
        assert_eq!(fired, [false, true, false, false]);
        // Traffic, then quiet: once more, two ticks after the last request.
        let fired: Vec<bool> = [5, 9, 9, 9, 9, 12, 12, 12]
            .iter()
            .map(|&n| w.tick(n))
            .collect();
        assert_eq!(
            fired,
            [false, false, false, true, false, false, false, true]
        );
    }
}
