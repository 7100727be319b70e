//! Kong's balancer phase and the exchange with the upstream: the peer (the service's host, or
//! a target its upstream's balancer picks), a pooled or new connection, the request sent
//! and the response head read, with Kong's retries (`retries`, next target) and the
//! outcome reported to the balancer's health checks.

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use http::header::HeaderMap;
use http::header::HeaderValue;
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use turnpike_plugins::log::Source;

use crate::body::idle::ReadIdle;
use crate::http1::client::{BodySource, ClientBody, Conn, Overrides, SendError, UpstreamBody};
use crate::runloop::body::{BodyKind, ProxyBody};
use crate::runloop::ctx::Ended;
use crate::runloop::session::Session;
use crate::runloop::{access, errors, forward};
use crate::snapshot::{Destination, Peer, ServiceInfo};
use crate::upstream::connect::{self, ConnectError};
use crate::upstream::health::Outcome;
use crate::upstream::pool::PeerKey;
use crate::worker::ctx::WorkerCtx;

pub fn apply_overrides(h: &mut HeaderMap, overrides: &Overrides) {
    for (name, value) in overrides.iter() {
        match value {
            Some(v) => {
                h.insert(name.clone(), v.clone());
            }
            None => {
                h.remove(name);
            }
        }
    }
}

/// What the upstream exchange needs to know of the request besides its head and body.
pub struct Call<'a> {
    pub preserved_host: Option<HeaderValue>,
    pub upgrade: bool,
    pub consumer_id: Option<&'a str>,
    pub client_ip: Option<std::net::IpAddr>,
    pub path: &'a str,
    pub query: Option<&'a str>,
    pub captures: Option<&'a [(Option<String>, String)]>,
    /// A cookie the balancer wants set on the response (hash_on = cookie).
    pub set_cookie: std::cell::Cell<Option<HeaderValue>>,
    /// The request's record for tracing, when one is kept: each try's peer and times go there
    /// when they are recorded (the `balancer` instrumentation, or a log plugin that reads
    /// them), each try's look-up of a host name with `dns_query`.
    pub spans: Option<&'a turnpike_plugins::spans::Spans>,
    /// The peer a plugin chose (`kong.service.set_target`): every try goes there.
    pub target: Option<&'a Peer>,
}

impl Call<'_> {
    fn tries(&self) -> Option<&Tries> {
        self.spans.filter(|s| s.record_tries).map(|s| &s.tries)
    }
}

type Tries = std::cell::RefCell<Vec<turnpike_plugins::spans::TrySpan>>;

/// A try begins (recorded only when `tries` is): `picking`, when the peer's choice began.
fn try_begins(tries: Option<&Tries>, peer: &Peer, picking: Option<Instant>) {
    if let (Some(t), Some(picking)) = (tries, picking) {
        t.borrow_mut().push(turnpike_plugins::spans::TrySpan {
            start: picking,
            picked: Instant::now(),
            end: None,
            ip: peer.addr.map(|a| a.ip()),
            host: peer.host.clone(),
            port: peer.port,
            failed: None,
        });
    }
}

/// A try ends: the one that answered ends with the response; a failed one now, as Kong's 502
/// (504 for a timeout); one that was not the target's doing (`None`) is not a try.
fn try_ends(tries: Option<&Tries>, o: Option<&Outcome>) {
    let Some(t) = tries else {
        return;
    };
    let mut t = t.borrow_mut();
    let failed = match o {
        None => {
            t.pop();
            return;
        }
        Some(Outcome::Status(_)) => return,
        Some(Outcome::Timeout) => 504,
        Some(Outcome::TcpFailure) => 502,
    };
    if let Some(last) = t.last_mut() {
        last.end = Some(Instant::now());
        last.failed = Some(failed);
    }
}

/// Methods that may be sent again after the upstream got them without answering (RFC 9110
/// §9.2.2; POST and PATCH are not).
fn idempotent(m: &http::Method) -> bool {
    matches!(
        *m,
        http::Method::GET
            | http::Method::HEAD
            | http::Method::PUT
            | http::Method::DELETE
            | http::Method::OPTIONS
            | http::Method::TRACE
    )
}

/// A failed connection attempt, as health checks count it.
fn connect_outcome(e: &ConnectError) -> Outcome {
    match e {
        ConnectError::Timeout => Outcome::Timeout,
        _ => Outcome::TcpFailure,
    }
}

pub enum UpstreamError {
    /// The client's body passed a plugin's size limit.
    BodyTooLarge,
    /// The client's body stalled (408) or broke off (400) on its way upstream.
    ClientBody {
        timed_out: bool,
    },
    Timeout,
    Failed,
    NoPeer,
    NameResolution,
}

/// The address a new connection to `peer` goes to (from the DNS cache for host names).
async fn resolve(peer: &Peer) -> Result<SocketAddr, UpstreamError> {
    peer.address().await.ok_or(UpstreamError::NameResolution)
}

/// What the upstream answered: a response read by our own HTTP/1.1 exchange (its body still
/// on the connection), or hyper's response for an upgrade.
pub enum Upstreamed {
    H1(http::response::Parts, UpstreamBody),
    Hyper(Response<Incoming>),
}

/// Why an upgrade request did not get a response from hyper.
enum Upgrade {
    /// The connection could not be opened (counted, maybe retried, by the caller).
    Connect(ConnectError),
    Failed(UpstreamError),
}

type UpgradeSent = Result<Result<Response<Incoming>, hyper::Error>, tokio::time::error::Elapsed>;

/// An upgrade request (WebSocket) goes through hyper's client, which hands over the upgraded
/// connection after a 101.
async fn send_upgrade(
    ctx: &Rc<WorkerCtx>,
    service: &ServiceInfo,
    peer: &Peer,
    tls: connect::TlsParams<'_>,
    parts: &mut http::request::Parts,
    body: &mut Option<ClientBody>,
    overrides: &Overrides,
) -> Result<UpgradeSent, Upgrade> {
    let addr = resolve(peer).await.map_err(Upgrade::Failed)?;
    let stream = ctx
        .pool
        .open(peer.id, addr, tls, service.connect_timeout())
        .await
        .map_err(Upgrade::Connect)?;
    let mut sender = connect::hyper_client(stream)
        .await
        .map_err(Upgrade::Connect)?;
    ctx.stats.upstream_requests.inc();
    ctx.pool.tallies.request(peer.id);
    apply_overrides(&mut parts.headers, overrides);
    // Upgrades never have their body read by a plugin (see `access::run`).
    let Some(ClientBody {
        source: BodySource::Stream(stream),
        ..
    }) = body.take()
    else {
        return Err(Upgrade::Failed(UpstreamError::Failed));
    };
    let placeholder = Request::new(()).into_parts().0;
    let req = Request::from_parts(std::mem::replace(parts, placeholder), stream);
    Ok(tokio::time::timeout(service.read_timeout(), sender.send_request(req)).await)
}

/// A request to a gRPC service goes over the worker's HTTP/2 connection to the peer (opened
/// when there is none): `:authority` is the Host the request would have carried, `:path`
/// the client's, the body streamed both ways as it comes.
#[allow(clippy::too_many_arguments)]
async fn send_h2(
    ctx: &Rc<WorkerCtx>,
    service: &ServiceInfo,
    peer: &Peer,
    key: PeerKey,
    tls: connect::TlsParams<'_>,
    parts: &mut http::request::Parts,
    body: &mut Option<ClientBody>,
    overrides: &Overrides,
) -> Result<UpgradeSent, Upgrade> {
    use crate::body::request::{H2RequestBody, Limited};
    use http_body_util::{Either, Full};
    let mut sender = match ctx.h2.get(&key) {
        Some(s) => s,
        None => {
            let addr = resolve(peer).await.map_err(Upgrade::Failed)?;
            let stream = ctx
                .pool
                .open(peer.id, addr, tls, service.connect_timeout())
                .await
                .map_err(Upgrade::Connect)?;
            ctx.h2
                .handshake(key, stream)
                .await
                .map_err(Upgrade::Connect)?
        }
    };
    ctx.stats.upstream_requests.inc();
    ctx.pool.tallies.request(peer.id);
    apply_overrides(&mut parts.headers, overrides);
    let Some(authority) = parts.headers.remove(http::header::HOST) else {
        return Err(Upgrade::Failed(UpstreamError::Failed));
    };
    let scheme = if service.https { "https" } else { "http" };
    let uri = format!(
        "{scheme}://{}{}",
        authority.to_str().unwrap_or(""),
        parts.uri.path_and_query().map_or("/", |p| p.as_str())
    );
    parts.uri = match http::Uri::try_from(uri) {
        Ok(u) => u,
        Err(_) => return Err(Upgrade::Failed(UpstreamError::Failed)),
    };
    parts.version = http::Version::HTTP_2;
    let mut exceeded = None;
    let body: H2RequestBody = match body.take().map(|b| (b.source, b.limit)) {
        None => Either::Right(Full::default()),
        Some((BodySource::Stream(s), limit)) => {
            let (limited, flag) = Limited::new(s, limit);
            exceeded = flag;
            Either::Left(limited)
        }
        Some((BodySource::Buffered(b), _)) => Either::Right(Full::new(b)),
        Some((BodySource::Spooled(_), _)) => {
            tracing::error!("a spooled request body is not sent to an HTTP/2 upstream");
            return Err(Upgrade::Failed(UpstreamError::Failed));
        }
    };
    let placeholder = Request::new(()).into_parts().0;
    let req = Request::from_parts(std::mem::replace(parts, placeholder), body);
    let sent = tokio::time::timeout(service.read_timeout(), sender.send_request(req)).await;
    // Past the limit before the upstream answered: the client is told so (413, or its gRPC
    // status); the upstream's stream was reset. Once it answered, its response goes on and
    // ends in a reset, as nginx's does.
    let over = exceeded.is_some_and(|f| f.load(std::sync::atomic::Ordering::Relaxed));
    if over && !matches!(sent, Ok(Ok(_))) {
        return Err(Upgrade::Failed(UpstreamError::BodyTooLarge));
    }
    Ok(sent)
}

/// Kong's balancer phase, over the request as the forward phase left it: the upstream's
/// response (its body still arriving), or the gateway's own answer when no peer answered.
pub async fn run(s: &mut Session<'_>) -> Result<Response<ProxyBody>, Ended> {
    let (ctx, snap, conn) = (s.ctx, s.snap, s.conn);
    let m = s
        .matched
        .as_ref()
        .expect("the balancer phase runs on a route");
    let route = m.route;
    let Some(si) = route.service_index() else {
        return Err(Box::new(s.rc.error(
            ctx,
            StatusCode::SERVICE_UNAVAILABLE,
            errors::NO_SERVICE,
        )));
    };
    let service = &snap.services[si];
    let limit = access::body_limit(ctx, s.rc);
    let up_start = Instant::now();
    let rc = &mut *s.rc;
    rc.proxy_latency = up_start - rc.start;
    let upgrade = s.client_upgrade.is_some();
    // A plugin's own target (Kong's `kong.service.set_target`), numbered and resolved as a
    // service's host is.
    let target = rc
        .upstream
        .target
        .take()
        .map(|(host, port)| ctx.gateway.upstreams.peer(&host, port, service.https));
    // What a balancer may hash on; the client address only when a balancer may need it.
    let call = Call {
        preserved_host: s.preserved_host.take(),
        upgrade,
        consumer_id: rc.consumer.as_deref().map(|c| c.consumer_id()),
        client_ip: match service.destination {
            Destination::Balanced(_) => Some(forward::client_ip(conn, &s.parts.headers)),
            _ => None,
        },
        path: s.target.path(),
        query: s.target.query(),
        captures: m.captures.as_deref(),
        set_cookie: std::cell::Cell::new(None),
        spans: rc.spans.as_deref(),
        target: target.as_ref(),
    };
    let body = std::mem::replace(&mut s.body, BodySource::Buffered(bytes::Bytes::new()));
    let sent = send(
        ctx,
        service,
        &mut s.parts,
        ClientBody {
            source: body,
            limit,
        },
        &mut s.overrides,
        &call,
    )
    .await;
    let set_cookie = call.set_cookie.take();
    drop(call);
    let (mut parts, body) = match sent {
        // Our HTTP/1.1 exchange never stores hop-by-hop headers.
        Ok(Upstreamed::H1(parts, body)) => {
            rc.upstream_named_kong = body.named_kong_headers;
            let mut body = ProxyBody::new(BodyKind::Upstream(body));
            let mut parts = parts;
            if route.response_buffering && parts.status != StatusCode::SWITCHING_PROTOCOLS {
                body.read_ahead(&mut parts.headers, &ctx.gateway.settings.proxy_temp);
            }
            (parts, body)
        }
        Ok(Upstreamed::Hyper(mut resp)) => {
            // WebSocket: splice the two upgraded connections together.
            if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
                if let Some(client_upgrade) = s.client_upgrade.take() {
                    let upstream_upgrade = hyper::upgrade::on(&mut resp);
                    tokio::task::spawn_local(async move {
                        if let (Ok(mut c), Ok(u)) = (client_upgrade.await, upstream_upgrade.await) {
                            let mut u = hyper_util::rt::TokioIo::new(u);
                            let _ = tokio::io::copy_bidirectional(&mut c, &mut u).await;
                        }
                    });
                    let (parts, _) = resp.into_parts();
                    return Ok(Response::from_parts(parts, ProxyBody::empty()));
                }
            }
            let (mut parts, body) = resp.into_parts();
            forward::strip_hop_by_hop(&mut parts.headers, false);
            rc.upstream_named_kong = true;
            let body = if rc.grpc_upstream {
                // nginx's grpc_read_timeout: between two reads, not over the whole call.
                BodyKind::Grpc(ReadIdle::new(body, service.read_timeout()))
            } else {
                BodyKind::Hyper(body)
            };
            (parts, ProxyBody::new(body))
        }
        Err(e) => {
            let (status, msg) = match e {
                UpstreamError::BodyTooLarge => {
                    (StatusCode::PAYLOAD_TOO_LARGE, errors::BODY_TOO_LARGE)
                }
                UpstreamError::Timeout => (StatusCode::GATEWAY_TIMEOUT, errors::TIMED_OUT),
                UpstreamError::ClientBody { timed_out: true } => {
                    (StatusCode::REQUEST_TIMEOUT, errors::REQUEST_TIMEOUT)
                }
                UpstreamError::ClientBody { timed_out: false } => {
                    (StatusCode::BAD_REQUEST, errors::BAD_REQUEST)
                }
                UpstreamError::NoPeer => (StatusCode::SERVICE_UNAVAILABLE, errors::NO_PEER),
                UpstreamError::NameResolution => {
                    (StatusCode::SERVICE_UNAVAILABLE, errors::NAME_RESOLUTION)
                }
                UpstreamError::Failed => (StatusCode::BAD_GATEWAY, errors::BAD_GATEWAY),
            };
            return Err(Box::new(match e {
                // nginx's own errors, answered by Kong's error handler.
                UpstreamError::Failed | UpstreamError::Timeout => rc.proxy_error(ctx, status, msg),
                _ => rc.error(ctx, status, msg),
            }));
        }
    };
    rc.from_upstream = true;
    rc.upstream_latency = up_start.elapsed();
    if let Some(l) = rc.log.as_deref_mut() {
        l.source = Source::Service;
        l.upstream_latency = Some(rc.upstream_latency);
    }
    parts.version = s.client_version;
    if let Some(c) = set_cookie {
        parts.headers.append(http::header::SET_COOKIE, c);
    }
    Ok(Response::from_parts(parts, body))
}

/// Sends the request to the service's upstream, retrying up to `service.retries` times, on
/// the next target when the service is balanced: on connection failures (nothing was sent),
/// and on timeouts or closed connections before any response byte when the request is
/// idempotent and its body (if any) is still at hand. A pooled connection found closed is
/// replaced without counting a failure, and a request without a body is sent again when a
/// reused connection closed before answering.
pub async fn send(
    ctx: &Rc<WorkerCtx>,
    service: &ServiceInfo,
    // By reference (as `overrides`): moved in, they would be held twice in this future.
    parts: &mut http::request::Parts,
    body: ClientBody,
    overrides: &mut Overrides,
    call: &Call<'_>,
) -> Result<Upstreamed, UpstreamError> {
    let upgrade = call.upgrade;
    if service.stream {
        tracing::error!("service protocol 'tcp' is not proxied over HTTP");
        return Err(UpstreamError::Failed);
    }
    // Upgrades keep their body for hyper's client; our exchange takes `None` for no body.
    let mut body = if !upgrade && body.is_empty() {
        None
    } else {
        Some(body)
    };
    let mut failures = 0u32;
    // Balanced targets tried so far (a retry goes to another one where there is one).
    let mut tried: smallvec::SmallVec<[usize; 4]> = smallvec::SmallVec::new();
    loop {
        let tries = call.tries();
        let picking = tries.map(|_| Instant::now());
        let (peer, balancer_host, picked) = match (call.target, &service.destination) {
            (Some(p), _) => (p, None, None),
            (None, Destination::Direct(p)) => (&**p, None, None),
            (None, Destination::Balanced(b)) => {
                let req = crate::upstream::balancer::Request {
                    consumer_id: call.consumer_id,
                    client_ip: call
                        .client_ip
                        .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)),
                    headers: &parts.headers,
                    path: call.path,
                    query: call.query,
                    captures: call.captures,
                };
                match b.pick(&req, failures, &tried) {
                    Some(p) => {
                        if let Some(c) = p.set_cookie {
                            call.set_cookie.set(Some(c));
                        }
                        tried.push(p.index);
                        (p.peer, b.host_header.clone(), Some((b, p.index)))
                    }
                    None => return Err(UpstreamError::NoPeer),
                }
            }
            (None, Destination::Unsupported(proto)) => {
                tracing::error!("service protocol '{proto}' is not proxied over HTTP");
                return Err(UpstreamError::Failed);
            }
            (None, Destination::Broken(why)) => {
                tracing::error!("{why}");
                return Err(UpstreamError::Failed);
            }
        };
        // Counted as done (for least-connections and latency) when the response head arrives
        // or the attempt fails.
        let started = picked.is_some().then(Instant::now);
        try_begins(tries, peer, picking);
        // Kong's `kong.dns`: each try to a host name looks it up (here, the node's DNS cache;
        // a connection from the pool needs no address, so only this instrumentation asks).
        let dns = call
            .spans
            .filter(|s| s.has(turnpike_plugins::spans::DNS_QUERY));
        if let (Some(spans), Some(name)) = (dns, &peer.dns) {
            let start = Instant::now();
            let found = Box::pin(name.address(peer.port)).await;
            spans
                .dns
                .borrow_mut()
                .push(turnpike_plugins::spans::DnsSpan {
                    start,
                    end: Instant::now(),
                    domain: peer.host.clone(),
                    port: peer.port,
                    ip: found.ok().map(|a| a.ip()),
                });
        }
        // `None`: not the target's doing (a pooled connection found closed, a body too large).
        let finish = |outcome: Option<Outcome>| {
            try_ends(tries, outcome.as_ref());
            if let Some((b, i)) = picked {
                let elapsed = started
                    .filter(|_| matches!(outcome, Some(Outcome::Status(_))))
                    .map(|t| t.elapsed());
                match outcome {
                    Some(o) => b.report(i, o, elapsed),
                    None => b.done(i, None),
                }
            }
        };
        let host_value = call
            .preserved_host
            .clone()
            .or(balancer_host)
            .unwrap_or_else(|| peer.host_header.clone());
        overrides[0].1 = Some(host_value);
        let key = PeerKey {
            peer: peer.id,
            tls: service.tls.as_ref().map(|cfg| Arc::as_ptr(cfg) as usize),
            dns: peer.dns.as_ref().map_or(0, |n| n.generation()),
        };
        // TLS parameters are only needed to open a connection: built there, not per request.
        let tls = || {
            service
                .tls
                .as_ref()
                .map(|cfg| (cfg, peer.server_name.clone()))
        };
        let connect_failed = |e: ConnectError, failures: &mut u32| {
            *failures += 1;
            tracing::debug!("connect to {}:{} failed: {e:?}", peer.host, peer.port);
            (*failures > service.retries).then_some(match e {
                ConnectError::Timeout => UpstreamError::Timeout,
                _ => UpstreamError::Failed,
            })
        };

        if upgrade || service.grpc {
            // Boxed: hyper's handshake and exchange are large futures, and only upgrades
            // (WebSocket) and gRPC take this path; every other request's future stays small.
            let sent = if service.grpc {
                Box::pin(send_h2(
                    ctx,
                    service,
                    peer,
                    key,
                    tls(),
                    parts,
                    &mut body,
                    overrides,
                ))
                .await
            } else {
                Box::pin(send_upgrade(
                    ctx,
                    service,
                    peer,
                    tls(),
                    parts,
                    &mut body,
                    overrides,
                ))
                .await
            };
            match sent {
                Err(Upgrade::Connect(e)) => {
                    finish(Some(connect_outcome(&e)));
                    match connect_failed(e, &mut failures) {
                        Some(err) => return Err(err),
                        None => continue,
                    }
                }
                Err(Upgrade::Failed(e)) => return Err(e),
                Ok(sent) => {
                    finish(Some(match &sent {
                        Ok(Ok(resp)) => Outcome::Status(resp.status().as_u16()),
                        Ok(Err(_)) => Outcome::TcpFailure,
                        Err(_) => Outcome::Timeout,
                    }));
                    return match sent {
                        Err(_) => Err(UpstreamError::Timeout),
                        Ok(Ok(resp)) => Ok(Upstreamed::Hyper(resp)),
                        Ok(Err(e)) => {
                            tracing::debug!(
                                "upstream {}:{} failed (upgrade or HTTP/2): {e}",
                                peer.host,
                                peer.port
                            );
                            Err(UpstreamError::Failed)
                        }
                    };
                }
            }
        }

        let mut conn = match ctx.pool.checkout(&key) {
            Some(c) => c,
            // Only a new connection needs the address: resolve here, not per request.
            // Boxed: opening a connection (TCP, maybe TLS) is a large future and rare with
            // keep-alive; the request's own future stays small without it.
            None => match Box::pin(ctx.pool.open(
                peer.id,
                resolve(peer).await?,
                tls(),
                service.connect_timeout(),
            ))
            .await
            {
                // Boxed once per connection: the request path moves it around by pointer.
                Ok(stream) => Box::new(Conn::new(stream, key)),
                Err(e) => {
                    finish(Some(connect_outcome(&e)));
                    match connect_failed(e, &mut failures) {
                        Some(err) => return Err(err),
                        None => continue,
                    }
                }
            },
        };
        ctx.stats.upstream_requests.inc();
        ctx.pool.tallies.request(peer.id);
        match conn
            .send(
                parts,
                body.take(),
                overrides,
                crate::http1::client::Timeouts {
                    write: service.write_timeout(),
                    read: service.read_timeout(),
                },
                &ctx.deadlines,
            )
            .await
        {
            Ok((rparts, framing)) => {
                finish(Some(Outcome::Status(rparts.status.as_u16())));
                return Ok(Upstreamed::H1(
                    rparts,
                    UpstreamBody::new(
                        conn,
                        ctx.pool.clone(),
                        framing,
                        service.read_timeout(),
                        ctx.deadlines.clone(),
                    ),
                ));
            }
            Err(SendError::Retry(b)) => {
                finish(None);
                // Not a failure of the target (a pooled connection had closed): same target.
                tried.pop();
                body = b
            }
            // nginx's `proxy_next_upstream error timeout` as Kong runs it: no response byte
            // came back, so the request may go to the next target, unless it is not
            // idempotent (it may have taken effect) or its streamed body is gone.
            Err(SendError::Unanswered { timed_out, resend }) => {
                finish(Some(if timed_out {
                    Outcome::Timeout
                } else {
                    Outcome::TcpFailure
                }));
                failures += 1;
                tracing::debug!(
                    "upstream {}:{} gave no response ({})",
                    peer.host,
                    peer.port,
                    if timed_out { "timeout" } else { "closed" }
                );
                match resend {
                    Some(b) if idempotent(&parts.method) && failures <= service.retries => body = b,
                    _ if timed_out => return Err(UpstreamError::Timeout),
                    _ => return Err(UpstreamError::Failed),
                }
            }
            Err(SendError::Timeout) => {
                finish(Some(Outcome::Timeout));
                return Err(UpstreamError::Timeout);
            }
            Err(SendError::BodyTooLarge) => {
                finish(None);
                return Err(UpstreamError::BodyTooLarge);
            }
            Err(SendError::ClientBody { timed_out }) => {
                finish(None);
                return Err(UpstreamError::ClientBody { timed_out });
            }
            Err(SendError::Failed(e)) => {
                finish(Some(Outcome::TcpFailure));
                tracing::debug!("upstream {}:{} failed: {e}", peer.host, peer.port);
                return Err(UpstreamError::Failed);
            }
        }
    }
}
