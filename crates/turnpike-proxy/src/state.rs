//! The gateway's shared state: the current configuration snapshot (swapped atomically), the
//! settings derived from the node configuration, and the counters.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use turnpike_config::conf::{cidr_contains, parse_cidr, Conf, HeaderSet};
use turnpike_config::declarative::Changes;
use turnpike_config::Config;

use crate::snapshot::Snapshot;
use crate::upstream::pool::PoolSettings;
use crate::worker::stats::Stats;

pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// `release` or `debug`: how this binary was built.
pub const BUILD_PROFILE: &str = if cfg!(debug_assertions) {
    "debug"
} else {
    "release"
};

/// Settings the request path reads, fixed at start.
#[derive(Debug, Clone)]
pub struct Settings {
    pub headers: HeaderSet,
    pub headers_upstream_request_id: bool,
    pub keepalive_requests: u64,
    pub keepalive_timeout: Duration,
    pub client_body_timeout: Duration,
    /// Request bodies: the largest accepted (0: any), how much of a buffered one stays in
    /// memory, and where the rest goes (`<prefix>/client_body_temp`).
    pub client_max_body_size: u64,
    pub client_body_buffer_size: usize,
    pub client_body_temp: std::path::PathBuf,
    /// Where response bodies read ahead of slow clients spill (`<prefix>/proxy_temp`).
    pub proxy_temp: std::path::PathBuf,
    pub pool: PoolSettings,
    pub trusted_ips: Vec<(IpAddr, u8)>,
    /// `real_ip_header = proxy_protocol`: on a `proxy_protocol` listener the client is the
    /// one the trusted balancer's PROXY header names (and X-Real-IP is not read).
    pub real_ip_proxy_protocol: bool,
    pub max_header_size: usize,
    /// `turnpike/<version>` for Server and `1.1 turnpike/<version>` for Via, prebuilt header values (static bytes: cloning them touches no shared counter).
    pub server_value: http::HeaderValue,
    pub via_value: http::HeaderValue,
    /// `proxy_access_log`, opened by the caller (`None`: off).
    pub access_log: Option<Arc<crate::worker::access_log::AccessLog>>,
    /// What the TLS listeners serve (Kong's `ssl_*` properties).
    pub tls: turnpike_config::conf::TlsConf,
    /// Response compression (`nginx_proxy_gzip`), when on.
    pub gzip: Option<turnpike_config::conf::GzipConf>,
    /// The tracing instrumentations the request path records (`turnpike_plugins::spans`
    /// bits from `tracing_instrumentations`; 0: none, nothing recorded).
    pub trace_spans: u8,
}

impl Settings {
    pub fn from_conf(conf: &Conf) -> Settings {
        Settings {
            headers: conf.headers,
            tls: conf.tls.clone(),
            gzip: conf.gzip.clone(),
            trace_spans: turnpike_plugins::spans::instrumentations(&conf.tracing_instrumentations),
            headers_upstream_request_id: conf.headers_upstream_request_id,
            keepalive_requests: conf.keepalive_requests,
            keepalive_timeout: conf.keepalive_timeout,
            client_body_timeout: conf.client_body_timeout,
            client_max_body_size: conf.client_max_body_size,
            client_body_buffer_size: conf.client_body_buffer_size,
            client_body_temp: conf.prefix.join("client_body_temp"),
            proxy_temp: conf.prefix.join("proxy_temp"),
            pool: PoolSettings {
                size: conf.upstream_keepalive_pool_size,
                max_requests: conf.upstream_keepalive_max_requests,
                idle_timeout: conf.upstream_keepalive_idle_timeout,
            },
            trusted_ips: conf
                .trusted_ips
                .iter()
                .filter_map(|s| parse_cidr(s))
                .collect(),
            real_ip_proxy_protocol: conf.real_ip_header.eq_ignore_ascii_case("proxy_protocol"),
            max_header_size: conf.max_header_size,
            server_value: http::HeaderValue::from_static(concat!(
                "turnpike/",
                env!("CARGO_PKG_VERSION")
            )),
            via_value: http::HeaderValue::from_static(concat!(
                "1.1 turnpike/",
                env!("CARGO_PKG_VERSION")
            )),
            access_log: None,
        }
    }

    pub fn is_trusted(&self, ip: IpAddr) -> bool {
        self.trusted_ips
            .iter()
            .any(|(net, len)| cidr_contains(*net, *len, ip))
    }
}

pub struct Gateway {
    pub snapshot: ArcSwap<Snapshot>,
    /// Bumped on every swap; workers compare it to their cached copy.
    pub generation: AtomicU64,
    pub settings: Settings,
    pub stats: Stats,
    pub default_cert: Arc<CertifiedKey>,
    /// The node's plugins, and their state (caches, counters, queues) across snapshots.
    pub plugins: Arc<turnpike_plugins::Registry>,
    pub reloads: AtomicU64,
    /// Of those, the ones patched into the running snapshot rather than compiled whole.
    pub reloads_patched: AtomicU64,
    /// Time spent applying configs (compile and swap), in microseconds: total and last.
    pub reload_micros_total: AtomicU64,
    pub reload_micros_last: AtomicU64,
    /// Serialises reloads (SIGHUP and `POST /config`); never taken on the request path.
    reload_lock: Mutex<()>,
    /// Replaced snapshots, kept until no worker or request holds them, then freed by the
    /// reaper thread (`start_reaper`), not by a proxy worker (a 10k-route snapshot takes
    /// milliseconds to free).
    retired: Mutex<Vec<Arc<Snapshot>>>,
    /// Wakes the reaper when a snapshot is retired.
    retired_added: std::sync::Condvar,
    /// What the node knows of its upstreams across snapshots: target health (its checker
    /// thread runs the active probes), the peers' pool ids, the resolver.
    pub upstreams: crate::upstream::Upstreams,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("generation", &self.generation)
            .finish()
    }
}

impl Gateway {
    pub fn new(
        settings: Settings,
        workers: usize,
        default_cert: Arc<CertifiedKey>,
        plugins: Arc<turnpike_plugins::Registry>,
        dns: Arc<crate::upstream::dns::Dns>,
    ) -> Gateway {
        let upstreams = crate::upstream::Upstreams::new(dns);
        Gateway {
            snapshot: ArcSwap::from_pointee(Snapshot::empty(&upstreams)),
            generation: AtomicU64::new(0),
            settings,
            stats: Stats::new(workers),
            default_cert,
            plugins,
            reloads: AtomicU64::new(0),
            reloads_patched: AtomicU64::new(0),
            reload_micros_total: AtomicU64::new(0),
            reload_micros_last: AtomicU64::new(0),
            reload_lock: Mutex::new(()),
            retired: Mutex::new(Vec::new()),
            retired_added: std::sync::Condvar::new(),
            upstreams,
        }
    }

    /// Compiles `config` and swaps it in. On error the current snapshot stays in place.
    /// In-flight requests finish on the snapshot they started with.
    pub fn apply(&self, config: Config) -> Result<(), String> {
        self.apply_changes(config, None)
    }

    /// Like `apply`, for a config made from the running one by `changes`: when the running
    /// snapshot is the one they start from, it is patched (`Snapshot::patch`: the router
    /// keeps every route but the changed ones) rather than compiled whole.
    ///
    /// A whole new config (`changes` None: a `POST /config`) is compared with the running one
    /// first (`Config::changes_from`): what it leaves alone is shared with the running
    /// snapshot rather than built again (the router, the plugins' indexes), so a reload holds
    /// little more than one config's memory at its peak.
    pub fn apply_changes(&self, config: Config, changes: Option<&Changes>) -> Result<(), String> {
        self.build_and_install(config, changes, false)
    }

    /// Like `apply`, refusing a config that cannot be built whole (a SIGHUP's file: a bad
    /// file never replaces a good config), still patched into the running one where it can.
    pub fn apply_whole(&self, config: Config) -> Result<(), String> {
        self.build_and_install(config, None, true)
    }

    /// [`Gateway::apply_changes`], refusing a config that cannot be built whole (a hybrid data
    /// plane's delta: its control plane's config is taken whole or not at all).
    pub fn apply_changes_whole(&self, config: Config, changes: &Changes) -> Result<(), String> {
        self.build_and_install(config, Some(changes), true)
    }

    fn build_and_install(
        &self,
        mut config: Config,
        changes: Option<&Changes>,
        whole: bool,
    ) -> Result<(), String> {
        let _guard = self.reload_lock.lock().unwrap_or_else(|e| e.into_inner());
        let started = std::time::Instant::now();
        let current = self.snapshot.load();
        let computed = match changes {
            // Nothing was built from the empty config a node starts with.
            Some(_) => None,
            None if current.config.hash.is_empty() => None,
            None => config.changes_from(&current.config),
        };
        let patch = changes
            .or(computed.as_ref())
            .filter(|c| current.config.hash == c.from);
        let snap = match patch {
            Some(c) => Snapshot::patch(&current, config, c, &self.plugins, &self.upstreams)?,
            None => Snapshot::compile(config, &self.plugins, &self.upstreams)?,
        };
        drop(current);
        if whole && !snap.problems.is_empty() {
            return Err(snap.problems.join("; "));
        }
        if patch.is_some() {
            self.reloads_patched.fetch_add(1, Ordering::Relaxed);
        }
        tracing::debug!(
            "config {}: {} in {:?}",
            snap.config.hash,
            if patch.is_some() {
                "patched"
            } else {
                "compiled"
            },
            started.elapsed()
        );
        self.install(snap, started);
        Ok(())
    }

    /// Swaps in a snapshot the caller compiled (a declarative file checked by compiling it:
    /// compiled once, not once to check and once to apply).
    pub fn apply_compiled(&self, snap: Snapshot) {
        let _guard = self.reload_lock.lock().unwrap_or_else(|e| e.into_inner());
        self.install(snap, std::time::Instant::now());
    }

    fn install(&self, snap: Snapshot, started: std::time::Instant) {
        // What could not be built is left out (or fails closed); everything else applies.
        for p in &snap.problems {
            tracing::error!("config: {p}: left out, the rest of the configuration applies");
        }
        let probes = snap.probes.clone();
        let old = self.snapshot.swap(Arc::new(snap));
        self.upstreams.health.watch(probes);
        self.generation.fetch_add(1, Ordering::Release);
        self.reloads.fetch_add(1, Ordering::Relaxed);
        let took = started.elapsed().as_micros() as u64;
        self.reload_micros_total.fetch_add(took, Ordering::Relaxed);
        self.reload_micros_last.store(took, Ordering::Relaxed);
        let mut retired = self.retired.lock().unwrap_or_else(|e| e.into_inner());
        retired.push(old);
        retired.retain(|s| Arc::strong_count(s) > 1);
        self.retired_added.notify_one();
    }

    /// Starts the thread that frees retired snapshots as soon as nothing holds them: workers
    /// let go of theirs within a second of a reload (`WorkerCtx::snapshot`, from their
    /// sweeper), requests when they end. Without it, a node with no traffic kept its previous
    /// snapshot until the next reload (twice the config's memory). `release` hands the freed
    /// memory back to the system.
    pub fn start_reaper(self: &Arc<Self>, release: fn()) {
        let gw = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("snapshot-reaper".into())
            .spawn(move || loop {
                let Some(gateway) = gw.upgrade() else {
                    return;
                };
                let mut retired = gateway.retired.lock().unwrap_or_else(|e| e.into_inner());
                if retired.is_empty() {
                    // Woken by a reload; the timeout lets the thread notice the gateway is gone.
                    retired = gateway
                        .retired_added
                        .wait_timeout(retired, std::time::Duration::from_secs(5))
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
                // Freed outside the lock.
                let free: Vec<Arc<Snapshot>> = {
                    let (free, keep) = std::mem::take(&mut *retired)
                        .into_iter()
                        .partition(|s| Arc::strong_count(s) == 1);
                    *retired = keep;
                    free
                };
                let waiting = !retired.is_empty();
                drop(retired);
                drop(gateway);
                if !free.is_empty() {
                    drop(free);
                    release();
                }
                if waiting {
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("cannot start the snapshot reaper ({e}): replaced configs are freed at the next reload");
        }
    }

    pub fn config_hash(&self) -> String {
        let h = self.snapshot.load().config.hash.clone();
        if h.is_empty() {
            // Kong's hash of an empty configuration.
            "00000000000000000000000000000000".into()
        } else {
            h
        }
    }
}

/// Picks the certificate for a handshake from the current snapshot.
#[derive(Debug)]
pub struct SniResolver {
    pub gateway: Arc<Gateway>,
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let snap = self.gateway.snapshot.load();
        let name = hello.server_name().map(|n| n.to_ascii_lowercase());
        // Kong's certificate phase (global plugins only): one of them may refuse the
        // handshake, which then ends without a certificate.
        if !snap.global_certificate.is_empty() {
            let req = turnpike_plugins::CertificateRequest {
                server_name: name.as_deref(),
            };
            for b in &snap.global_certificate {
                if let Err(e) = b.handler.certificate(&req) {
                    tracing::error!(
                        sni = name.as_deref().unwrap_or(""),
                        "certificate phase refused the handshake: {e}"
                    );
                    return None;
                }
            }
        }
        if let Some(name) = &name {
            if let Some(k) = snap.certs.find(name) {
                return Some(k);
            }
        }
        Some(self.gateway.default_cert.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs() {
        let n: IpAddr = "10.0.0.0".parse().unwrap();
        assert!(cidr_contains(n, 8, "10.1.2.3".parse().unwrap()));
        assert!(!cidr_contains(n, 8, "11.1.2.3".parse().unwrap()));
        assert!(cidr_contains(n, 8, "::ffff:10.9.9.9".parse().unwrap()));
        assert!(cidr_contains(
            "::".parse().unwrap(),
            0,
            "2001:db8::1".parse().unwrap()
        ));
        assert!(cidr_contains(
            "0.0.0.0".parse().unwrap(),
            0,
            "1.2.3.4".parse().unwrap()
        ));
    }
}
