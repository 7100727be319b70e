//! A worker's own state, which every request it serves reads (its pool, counters, clock,
//! snapshot cache, request ids), and what the request path knows of a client connection.

use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::http1::client::Conn;
use crate::http1::server::OutsideHeaders;
use crate::snapshot::Snapshot;
use crate::state::Gateway;
use crate::upstream::pool::Pool;
use crate::worker::access_log::{AccessLog, Writer};
use crate::worker::deadline::Deadlines;
use crate::worker::stats::WorkerStats;

/// Everything a worker's request path uses, owned by that worker.
/// The snapshot is held as `Rc<Arc<_>>` on purpose: cloning the `Rc` per request is a plain
/// increment, while cloning the `Arc` would bounce its counter's cache line between workers.
#[allow(clippy::redundant_allocation)]
pub struct WorkerCtx {
    pub gateway: Arc<Gateway>,
    pub pool: Rc<Pool<Conn>>,
    /// HTTP/2 connections to gRPC upstreams, one per peer.
    pub h2: crate::upstream::h2::H2Pool<crate::body::request::H2RequestBody>,
    pub stats: Arc<WorkerStats>,
    /// Coarse timeouts for the request path (upstream read timeouts).
    pub deadlines: Rc<Deadlines>,
    /// The worker's access-log buffer, when `proxy_access_log` is on.
    pub access_log: Option<Writer>,
    /// The worker is shutting down: HTTP/1 connections close after their current request.
    pub closing: Cell<bool>,
    /// Headers of an HTTP/1.1 response kept outside its map (see `runloop::handle`): set as
    /// `handle` returns and taken as the response head is encoded, with no await between
    /// (`server::serve_active`), so one slot per worker serves all its connections; held
    /// per connection, its ~400 bytes would stay with every idle one.
    pub response_extra: RefCell<OutsideHeaders>,
    /// Deflate states for response compression, reused from one response to the next.
    pub gzip_encoders: crate::runloop::gzip::EncoderPool,
    /// The worker's route matches, found and not, for routers where a match costs more
    /// than a look-up (Kong's per-worker match cache; see `turnpike_router::MatchCache`).
    pub route_cache: RefCell<turnpike_router::MatchCache>,
    snapshot: RefCell<(u64, Rc<Arc<Snapshot>>)>,
    ids: RequestIds,
}

impl WorkerCtx {
    pub fn new(
        gateway: Arc<Gateway>,
        stats: Arc<WorkerStats>,
        seed: u64,
        deadlines: Rc<Deadlines>,
        access_log: Option<Arc<AccessLog>>,
    ) -> WorkerCtx {
        WorkerCtx {
            pool: Pool::new(gateway.settings.pool, stats.clone(), deadlines.clone()),
            h2: crate::upstream::h2::H2Pool::new(gateway.settings.pool.idle_timeout),
            snapshot: RefCell::new((u64::MAX, Rc::new(gateway.snapshot.load_full()))),
            gateway,
            stats,
            ids: RequestIds::new(seed),
            closing: Cell::new(false),
            response_extra: RefCell::default(),
            gzip_encoders: Default::default(),
            route_cache: RefCell::default(),
            deadlines,
            access_log: access_log.map(Writer::new),
        }
    }

    /// The current snapshot. The shared pointer is only touched when the generation changed;
    /// otherwise this is a relaxed load and a non-atomic reference-count bump.
    #[inline]
    pub fn snapshot(&self) -> Rc<Arc<Snapshot>> {
        let gen = self.gateway.generation.load(Ordering::Acquire);
        let mut cached = self.snapshot.borrow_mut();
        if cached.0 != gen {
            *cached = (gen, Rc::new(self.gateway.snapshot.load_full()));
        }
        cached.1.clone()
    }

    /// 32 hex characters of per-worker pseudo-randomness (wyrand), like Kong's request ids.
    pub fn request_id(&self) -> http::HeaderValue {
        self.ids.next()
    }
}

/// A worker's request ids, made IDS_PER_BLOCK at a time into one buffer and handed out as
/// slices of it: a reference-count bump per request instead of an allocation (measured: ~220
/// instructions per request fewer).
struct RequestIds {
    rng: Cell<u64>,
    block: RefCell<bytes::Bytes>,
}

impl RequestIds {
    fn new(seed: u64) -> RequestIds {
        RequestIds {
            rng: Cell::new(seed),
            block: RefCell::new(bytes::Bytes::new()),
        }
    }

    fn next(&self) -> http::HeaderValue {
        let mut block = self.block.borrow_mut();
        if block.is_empty() {
            *block = self.fill();
        }
        let id = block.split_to(ID_LEN);
        // SAFETY: lower-case hex digits only, all valid in a header value.
        unsafe { http::HeaderValue::from_maybe_shared_unchecked(id) }
    }

    fn fill(&self) -> bytes::Bytes {
        // Each byte's two hex digits, looked up at once.
        const PAIRS: [[u8; 2]; 256] = {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            let mut t = [[0u8; 2]; 256];
            let mut i = 0;
            while i < 256 {
                t[i] = [HEX[i >> 4], HEX[i & 0xf]];
                i += 1;
            }
            t
        };
        let mut block = vec![0u8; ID_LEN * IDS_PER_BLOCK];
        // One 64-bit draw (wyrand) per 16 digits, two per id.
        for digits in block.chunks_exact_mut(16) {
            let s = self.rng.get().wrapping_add(0xa076_1d64_78bd_642f);
            self.rng.set(s);
            let t = (s as u128).wrapping_mul((s ^ 0xe703_7ed1_a0b4_28db) as u128);
            let v = ((t >> 64) as u64) ^ (t as u64);
            for (pair, byte) in digits.chunks_exact_mut(2).zip(v.to_le_bytes()) {
                pair.copy_from_slice(&PAIRS[byte as usize]);
            }
        }
        bytes::Bytes::from(block)
    }
}

const ID_LEN: usize = 32;
const IDS_PER_BLOCK: usize = 128;

/// Per-connection facts the request path needs.
pub struct ConnInfo {
    pub peer: SocketAddr,
    pub local_port: u16,
    /// The address the client reached (Kong's `net.dst.ip`), when the socket tells.
    pub local_ip: Option<std::net::IpAddr>,
    pub tls: bool,
    /// The TLS version and cipher, for the log (`request.tls`).
    pub tls_info: Option<turnpike_plugins::log::TlsInfo>,
    pub sni: Option<String>,
    pub http1: bool,
    pub trusted: bool,
    /// A trusted peer's X-Real-IP names the client (nginx's `real_ip_header X-Real-IP`);
    /// false when the PROXY protocol header did (`real_ip_header = proxy_protocol`).
    pub real_ip_header: bool,
    /// The connection's own peer when a PROXY header named another client (nginx's
    /// `$realip_remote_addr`: the balancer, which X-Forwarded-For appends).
    pub realip_remote: Option<std::net::IpAddr>,
    pub requests: Cell<u64>,
    /// Requests being handled on this connection right now.
    pub in_flight: Cell<u32>,
    /// When a request last ended or a response byte was last written (coarse clock): the
    /// keepalive/header timeout counts from there.
    pub last_active: Cell<std::time::Instant>,
    /// The client's IP and the local port as header values, built once per connection.
    pub ip_value: http::HeaderValue,
    pub port_value: http::HeaderValue,
}

impl ConnInfo {
    pub fn new(
        peer: SocketAddr,
        local_port: u16,
        tls: bool,
        sni: Option<String>,
        http1: bool,
        trusted: bool,
    ) -> ConnInfo {
        ConnInfo {
            peer,
            local_port,
            local_ip: None,
            tls,
            tls_info: None,
            sni,
            http1,
            trusted,
            real_ip_header: true,
            realip_remote: None,
            requests: Cell::new(0),
            in_flight: Cell::new(0),
            last_active: Cell::new(std::time::Instant::now()),
            ip_value: http::HeaderValue::from_str(&peer.ip().to_string())
                .expect("an IP is a valid header value"),
            port_value: http::HeaderValue::from(local_port),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_32_hex_digits_and_distinct_across_blocks() {
        let ids = RequestIds::new(42);
        let all: Vec<String> = (0..IDS_PER_BLOCK * 3 + 5)
            .map(|_| ids.next().to_str().unwrap().to_string())
            .collect();
        for id in &all {
            assert_eq!(id.len(), 32, "{id}");
            assert!(id
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
        }
        let distinct: std::collections::HashSet<_> = all.iter().collect();
        assert_eq!(distinct.len(), all.len());
        // Another worker's seed gives other ids.
        assert_ne!(RequestIds::new(43).next(), RequestIds::new(42).next());
    }
}
