//! Upstream host names, resolved by the gateway itself (Kong's `dns_*` properties) rather than
//! by getaddrinfo per connection: SRV, A and AAAA answers in `dns_order`, the hosts file read
//! once, TTLs honoured, names of the running config refreshed in the background before their
//! answer expires, and the last good answer kept for `dns_stale_ttl` while the name servers fail
//! (a resolver outage must not become Kong's "name resolution failed" 503s).
//!
//! The request path never queries: it reads the current answer of a [`Name`] (an `ArcSwap`
//! load) when it opens a connection. Only a name never resolved yet makes a request wait, and
//! every request waiting for one name waits on the same query.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use hickory_resolver::config::{NameServerConfig, ResolverConfig, ResolverOpts};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::proto::op::Query;
use hickory_resolver::proto::rr::{RData, RecordType};
use hickory_resolver::{Hosts, TokioResolver};
use turnpike_config::conf::{DnsConf, DnsRecord};

/// How often the refresher looks for answers about to expire.
const REFRESH_TICK: Duration = Duration::from_millis(200);
/// The longest a request waits for a name's first answer.
const FIRST_ANSWER_WAIT: Duration = Duration::from_secs(10);
/// Answers from the hosts file do not expire.
const FOREVER: Duration = Duration::from_secs(100 * 365 * 86400);

/// A resolved address: the port is the SRV record's, or the caller's for A/AAAA answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Addr {
    ip: IpAddr,
    port: Option<u16>,
    weight: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// No answer yet.
    Unresolved,
    Found,
    /// The name servers said the name has no records of the types in `dns_order`.
    NotFound,
    /// The name servers could not be asked (no answer, refused, SERVFAIL) and nothing is stale.
    Failed,
}

#[derive(Debug)]
struct Answer {
    state: State,
    addrs: Vec<Addr>,
    total_weight: u32,
    /// Until when the answer is fresh.
    valid_until: Instant,
    /// Until when a found answer is still used when it cannot be refreshed.
    stale_until: Instant,
    ttl: Duration,
}

impl Answer {
    fn unresolved() -> Answer {
        let now = Instant::now();
        Answer {
            state: State::Unresolved,
            addrs: Vec::new(),
            total_weight: 0,
            valid_until: now,
            stale_until: now,
            ttl: Duration::ZERO,
        }
    }
}

/// One upstream host name, shared by every peer naming it. Held by config snapshots; the
/// resolver forgets it when no snapshot holds it any more.
#[derive(Debug)]
pub struct Name {
    host: Box<str>,
    /// The resolver that made it, which refreshes it (gone: the node is shutting down).
    dns: Weak<Dns>,
    answer: ArcSwap<Answer>,
    /// Changes when the set of addresses changes: pooled connections opened under another
    /// generation are not reused (they may lead to an address the name no longer has).
    generation: AtomicU64,
    refreshing: AtomicBool,
    refreshed: tokio::sync::Notify,
    /// Rotation over the addresses, one step per connection opened.
    next: AtomicUsize,
    /// `LAST` in `dns_order`: the type of the last successful look-up (0: none yet).
    last_type: AtomicU8,
}

/// Why a name gave no address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResolveError {
    NotFound,
    Failed,
}

impl Name {
    /// A name not resolved yet.
    fn new(host: Box<str>, dns: Weak<Dns>) -> Name {
        Name {
            host,
            dns,
            answer: ArcSwap::from_pointee(Answer::unresolved()),
            generation: AtomicU64::new(0),
            refreshing: AtomicBool::new(false),
            refreshed: tokio::sync::Notify::new(),
            next: AtomicUsize::new(0),
            last_type: AtomicU8::new(0),
        }
    }

    pub fn host(&self) -> &str {
        &self.host
    }

    /// The generation of the current answer (see the field).
    #[inline]
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The address the next connection goes to: the answer's addresses in turn, weighted
    /// for SRV answers. A fresh answer is used as is; an expired one is used (within
    /// `dns_stale_ttl`) while a refresh runs in the background; only a name without an answer
    /// waits for the name servers.
    pub async fn address(self: &Arc<Self>, port: u16) -> Result<SocketAddr, ResolveError> {
        let mut waited = false;
        loop {
            let answer = self.answer.load();
            let now = Instant::now();
            match answer.state {
                State::Found if now < answer.stale_until || waited => {
                    if now >= answer.valid_until {
                        self.refresh();
                    }
                    return Ok(self.pick(&answer, port));
                }
                State::NotFound if now < answer.valid_until || waited => {
                    return Err(ResolveError::NotFound)
                }
                State::Failed if now < answer.valid_until || waited => {
                    return Err(ResolveError::Failed)
                }
                _ => {}
            }
            if waited {
                return Err(ResolveError::Failed);
            }
            // Registered before the refresh starts, so its end cannot be missed.
            let refreshed = self.refreshed.notified();
            tokio::pin!(refreshed);
            refreshed.as_mut().enable();
            self.refresh();
            let _ = tokio::time::timeout(FIRST_ANSWER_WAIT, refreshed).await;
            waited = true;
        }
    }

    fn pick(&self, answer: &Answer, port: u16) -> SocketAddr {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let mut at = (n as u64 % answer.total_weight.max(1) as u64) as u32;
        for a in &answer.addrs {
            if at < a.weight {
                return SocketAddr::new(a.ip, a.port.unwrap_or(port));
            }
            at -= a.weight;
        }
        let a = answer.addrs[0];
        SocketAddr::new(a.ip, a.port.unwrap_or(port))
    }

    /// Starts a look-up in the background unless one is running.
    fn refresh(self: &Arc<Self>) {
        if self.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let Some(dns) = self.dns.upgrade() else {
            self.refreshing.store(false, Ordering::Release);
            return;
        };
        let name = self.clone();
        dns.runtime.clone().spawn(async move {
            let fresh = dns.query(&name).await;
            name.store(fresh, &dns.conf);
            name.refreshing.store(false, Ordering::Release);
            name.refreshed.notify_waiters();
        });
    }

    /// Takes a look-up's result: a failure keeps a found answer until its stale time.
    fn store(&self, fresh: Answer, conf: &DnsConf) {
        let old = self.answer.load();
        let now = Instant::now();
        let next = match fresh.state {
            State::Failed if old.state == State::Found && now < old.stale_until => {
                tracing::warn!(
                    "dns: cannot refresh '{}'; using its last answer (stale for up to {:?} more)",
                    self.host,
                    old.stale_until - now
                );
                Answer {
                    state: State::Found,
                    addrs: old.addrs.clone(),
                    total_weight: old.total_weight,
                    // Asked again after dns_error_ttl.
                    valid_until: now + conf.error_ttl,
                    stale_until: old.stale_until,
                    ttl: old.ttl,
                }
            }
            _ => fresh,
        };
        let changed = next.state != old.state || next.addrs != old.addrs;
        if changed {
            match next.state {
                State::Found => tracing::info!(
                    "dns: '{}' resolves to {}",
                    self.host,
                    next.addrs
                        .iter()
                        .map(|a| match a.port {
                            Some(p) => SocketAddr::new(a.ip, p).to_string(),
                            None => a.ip.to_string(),
                        })
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                State::NotFound => tracing::warn!("dns: '{}' was not found", self.host),
                _ => tracing::warn!("dns: '{}' could not be resolved", self.host),
            }
        }
        self.answer.store(Arc::new(next));
        // Bumped only once the new answer is in place: a request that reads the new
        // generation (its pool key) must also get an address from the new answer, or a
        // connection to the old address would be pooled under the new key and reused.
        if changed {
            self.generation.fetch_add(1, Ordering::Release);
        }
    }

    /// Whether the refresher should ask again now: found answers shortly before they expire
    /// (a quarter of their TTL, at most 5 s, ahead), others when they expire.
    fn due(&self, now: Instant) -> bool {
        let a = self.answer.load();
        match a.state {
            State::Found => now + (a.ttl / 4).min(Duration::from_secs(5)) >= a.valid_until,
            State::Unresolved => false,
            _ => now >= a.valid_until,
        }
    }
}

/// The node's resolver (one per gateway, made from its `dns_*` properties): the hosts file
/// read once, the name servers, and the names the node's configs use, refreshed by a thread
/// of its own (`dns`) that ends when the resolver is dropped.
pub struct Dns {
    conf: DnsConf,
    resolver: Option<TokioResolver>,
    hosts: Hosts,
    names: Mutex<HashMap<Box<str>, Arc<Name>>>,
    runtime: tokio::runtime::Handle,
}

impl std::fmt::Debug for Dns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dns").field("conf", &self.conf).finish()
    }
}

impl Dns {
    /// Starts the resolver with `conf`: reads the hosts file and the name servers, and starts
    /// the refresher thread. When the system's name servers cannot be read, names are asked of
    /// 127.0.0.1:53 and the reason comes back beside (not fatal: IP targets need no resolver).
    /// Fails only when its thread cannot be started.
    pub fn start(conf: &DnsConf) -> Result<(Arc<Dns>, Option<String>), String> {
        match Dns::open(conf.clone()) {
            Ok(dns) => Ok((dns, None)),
            Err(e) => {
                let fallback = DnsConf {
                    resolver: vec![SocketAddr::from(([127, 0, 0, 1], 53))],
                    ..conf.clone()
                };
                Ok((Dns::open(fallback)?, Some(e)))
            }
        }
    }

    /// The shared entry for `host`, or `None` when `host` is an IP address. A name seen for
    /// the first time is looked up in the background at once, so that the first request finds
    /// it resolved.
    pub fn name(self: &Arc<Self>, host: &str) -> Option<Arc<Name>> {
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if bare.parse::<IpAddr>().is_ok() {
            return None;
        }
        let key = bare.to_ascii_lowercase();
        let mut names = self.names.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = names.get(key.as_str()) {
            return Some(n.clone());
        }
        let n = Arc::new(Name::new(key.clone().into(), Arc::downgrade(self)));
        names.insert(key.into(), n.clone());
        drop(names);
        n.refresh();
        Some(n)
    }

    /// Resolves `host:port` once: IP addresses as they are, names through the shared cache.
    pub async fn lookup(
        self: &Arc<Self>,
        host: &str,
        port: u16,
    ) -> Result<SocketAddr, ResolveError> {
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return Ok(SocketAddr::new(ip, port));
        }
        match self.name(host) {
            Some(n) => n.address(port).await,
            None => Err(ResolveError::Failed),
        }
    }

    /// How many names the resolver keeps (those some config or request still holds).
    pub fn names(&self) -> usize {
        self.names.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

fn record_code(t: RecordType) -> u8 {
    match t {
        RecordType::SRV => 1,
        RecordType::A => 2,
        RecordType::AAAA => 3,
        _ => 0,
    }
}

impl Dns {
    fn open(conf: DnsConf) -> Result<Arc<Dns>, String> {
        let mut hosts = Hosts::default();
        match std::fs::File::open(&conf.hostsfile) {
            Ok(f) => {
                if let Err(e) = hosts.read_hosts_conf(f) {
                    tracing::warn!("dns: cannot read {}: {e}", conf.hostsfile.display());
                }
            }
            Err(e) => tracing::warn!("dns: cannot read {}: {e}", conf.hostsfile.display()),
        }
        let (config, mut opts) = if conf.resolver.is_empty() {
            hickory_resolver::system_conf::read_system_conf()
                .map_err(|e| format!("cannot read /etc/resolv.conf ({e}); set dns_resolver"))?
        } else {
            let servers = conf
                .resolver
                .iter()
                .map(|a| {
                    let mut s = NameServerConfig::udp_and_tcp(a.ip());
                    for c in &mut s.connections {
                        c.port = a.port();
                    }
                    s
                })
                .collect();
            let mut opts = ResolverOpts::default();
            opts.timeout = Duration::from_secs(2);
            opts.attempts = 2;
            (ResolverConfig::from_name_servers(servers), opts)
        };
        // Our cache decides what is fresh and what is stale; hickory's would hide TTLs.
        opts.cache_size = 0;
        opts.use_hosts_file = hickory_resolver::config::ResolveHosts::Never;
        let (tx, rx) = std::sync::mpsc::channel();
        // The refresher holds the resolver weakly: dropping the resolver ends the thread.
        let (made_tx, made) = tokio::sync::oneshot::channel::<Weak<Dns>>();
        std::thread::Builder::new()
            .name("dns".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = tx.send(Err(e.to_string()));
                        return;
                    }
                };
                let _ = tx.send(Ok(rt.handle().clone()));
                rt.block_on(async move {
                    if let Ok(dns) = made.await {
                        refresher(dns).await;
                    }
                });
            })
            .map_err(|e| format!("cannot start the dns thread: {e}"))?;
        let runtime = rx
            .recv()
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("cannot start the dns runtime: {e}"))?;
        let resolver = {
            let _enter = runtime.enter();
            TokioResolver::builder_with_config(config, TokioRuntimeProvider::default())
                .with_options(opts)
                .build()
                .map_err(|e| tracing::error!("dns: cannot build the resolver: {e}"))
                .ok()
        };
        let dns = Arc::new(Dns {
            conf,
            resolver,
            hosts,
            names: Mutex::new(HashMap::new()),
            runtime,
        });
        let _ = made_tx.send(Arc::downgrade(&dns));
        Ok(dns)
    }

    fn ttl(&self, seconds: u32) -> Duration {
        // A TTL of 0 would mean a query per connection; one second is the floor.
        self.conf
            .valid_ttl
            .unwrap_or(Duration::from_secs(seconds.max(1) as u64))
    }

    /// The addresses of `host` from the hosts file.
    fn hosts_file_addresses(&self, host: &str, types: &[RecordType]) -> Vec<IpAddr> {
        let Ok(name) = hickory_resolver::proto::rr::Name::from_ascii(host) else {
            return Vec::new();
        };
        let mut ips = Vec::new();
        for t in types {
            if let Some(l) = self
                .hosts
                .lookup_static_host(&Query::query(name.clone(), *t))
            {
                ips.extend(l.answers().iter().filter_map(|r| r.data.ip_addr()));
            }
        }
        ips
    }

    /// One look-up of `host` for `t`: addresses and the smallest TTL, `Ok(None)` when the
    /// name has no such records, `Err` when the name servers could not answer.
    async fn ask(
        &self,
        host: &str,
        t: RecordType,
        address_types: &[RecordType],
    ) -> Result<Option<(Vec<Addr>, u32)>, ()> {
        let Some(resolver) = &self.resolver else {
            return Err(());
        };
        let lookup = match resolver.lookup(host, t).await {
            Ok(l) => l,
            Err(e) if e.is_no_records_found() || e.is_nx_domain() => return Ok(None),
            Err(e) => {
                tracing::debug!("dns: {t} {host}: {e}");
                return Err(());
            }
        };
        let mut ttl = u32::MAX;
        let mut addrs = Vec::new();
        if t == RecordType::SRV {
            // Only the lowest priority is used (Kong's rule); weights are kept.
            let srv: Vec<_> = lookup
                .answers()
                .iter()
                .filter_map(|r| match &r.data {
                    RData::SRV(s) => Some((r.ttl, s.clone())),
                    _ => None,
                })
                .collect();
            let Some(lowest) = srv.iter().map(|(_, s)| s.priority).min() else {
                return Ok(None);
            };
            for (record_ttl, s) in srv.iter().filter(|(_, s)| s.priority == lowest) {
                ttl = ttl.min(*record_ttl);
                let target = s.target.to_ascii();
                let target = target.trim_end_matches('.');
                let mut ips = self.hosts_file_addresses(target, address_types);
                if ips.is_empty() {
                    for at in address_types {
                        // Addresses given in the SRV answer's additional section would do too;
                        // asking keeps one path for every server.
                        if let Ok(Some((found, t))) = Box::pin(self.ask(target, *at, &[])).await {
                            ttl = ttl.min(t);
                            ips.extend(found.into_iter().map(|a| a.ip));
                        }
                    }
                }
                addrs.extend(ips.into_iter().map(|ip| Addr {
                    ip,
                    port: Some(s.port),
                    weight: (s.weight as u32).max(1),
                }));
            }
        } else {
            for r in lookup.answers() {
                if let Some(ip) = r.data.ip_addr() {
                    ttl = ttl.min(r.ttl);
                    addrs.push(Addr {
                        ip,
                        port: None,
                        weight: 1,
                    });
                }
            }
        }
        if addrs.is_empty() {
            return Ok(None);
        }
        addrs.sort();
        addrs.dedup();
        Ok(Some((addrs, ttl)))
    }

    /// Resolves a name: the hosts file, then each type of `dns_order`.
    async fn query(&self, name: &Name) -> Answer {
        let now = Instant::now();
        let mut types: Vec<RecordType> = Vec::new();
        let last = name.last_type.load(Ordering::Relaxed);
        for t in &self.conf.order {
            let t = match t {
                DnsRecord::Last => match last {
                    1 => RecordType::SRV,
                    2 => RecordType::A,
                    3 => RecordType::AAAA,
                    _ => continue,
                },
                DnsRecord::Srv => RecordType::SRV,
                DnsRecord::A => RecordType::A,
                DnsRecord::Aaaa => RecordType::AAAA,
                DnsRecord::Cname => continue,
            };
            if !types.contains(&t) {
                types.push(t);
            }
        }
        let address_types: Vec<RecordType> = types
            .iter()
            .copied()
            .filter(|t| *t != RecordType::SRV)
            .collect();
        let address_types = if address_types.is_empty() {
            vec![RecordType::A]
        } else {
            address_types
        };
        let from_hosts = self.hosts_file_addresses(&name.host, &address_types);
        if !from_hosts.is_empty() {
            let addrs: Vec<Addr> = from_hosts
                .into_iter()
                .map(|ip| Addr {
                    ip,
                    port: None,
                    weight: 1,
                })
                .collect();
            return Answer {
                state: State::Found,
                total_weight: addrs.len() as u32,
                addrs,
                valid_until: now + FOREVER,
                stale_until: now + FOREVER,
                ttl: FOREVER,
            };
        }
        let mut failed = false;
        for t in types {
            match self.ask(&name.host, t, &address_types).await {
                Ok(Some((addrs, ttl))) => {
                    name.last_type.store(record_code(t), Ordering::Relaxed);
                    let ttl = self.ttl(ttl);
                    let now = Instant::now();
                    return Answer {
                        state: State::Found,
                        total_weight: addrs.iter().map(|a| a.weight).sum(),
                        addrs,
                        valid_until: now + ttl,
                        stale_until: now + ttl + self.conf.stale_ttl,
                        ttl,
                    };
                }
                Ok(None) => {}
                Err(()) => failed = true,
            }
        }
        let now = Instant::now();
        let (state, ttl) = if failed {
            (State::Failed, self.conf.error_ttl)
        } else {
            (State::NotFound, self.conf.not_found_ttl)
        };
        Answer {
            state,
            addrs: Vec::new(),
            total_weight: 0,
            valid_until: now + ttl,
            stale_until: now + ttl,
            ttl,
        }
    }
}

/// Refreshes the names still in use before their answers expire, and forgets the others;
/// returns when the resolver is gone.
async fn refresher(dns: Weak<Dns>) {
    loop {
        tokio::time::sleep(REFRESH_TICK).await;
        let Some(dns) = dns.upgrade() else { return };
        let now = Instant::now();
        let mut due = Vec::new();
        {
            let mut names = dns.names.lock().unwrap_or_else(|e| e.into_inner());
            // Only the registry holds it: no config (and no request) uses the name any more.
            names.retain(|_, n| Arc::strong_count(n) > 1 || n.refreshing.load(Ordering::Acquire));
            let over = names.len().saturating_sub(dns.conf.cache_size);
            if over > 0 {
                tracing::warn!(
                    "dns: {} names in use, more than dns_cache_size = {}",
                    names.len(),
                    dns.conf.cache_size
                );
            }
            for n in names.values() {
                if n.due(now) {
                    due.push(n.clone());
                }
            }
        }
        for n in due {
            n.refresh();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(addrs: Vec<Addr>) -> Answer {
        let now = Instant::now();
        Answer {
            state: State::Found,
            total_weight: addrs.iter().map(|a| a.weight).sum(),
            addrs,
            valid_until: now + Duration::from_secs(10),
            stale_until: now + Duration::from_secs(20),
            ttl: Duration::from_secs(10),
        }
    }

    fn entry() -> Name {
        Name::new("svc.test".into(), Weak::new())
    }

    #[test]
    fn picks_follow_srv_weights_and_ports() {
        let n = entry();
        let a = found(vec![
            Addr {
                ip: "10.0.0.1".parse().unwrap(),
                port: Some(8001),
                weight: 3,
            },
            Addr {
                ip: "10.0.0.2".parse().unwrap(),
                port: None,
                weight: 1,
            },
        ]);
        let picks: Vec<SocketAddr> = (0..8).map(|_| n.pick(&a, 80)).collect();
        let first = picks.iter().filter(|p| p.port() == 8001).count();
        assert_eq!(first, 6, "{picks:?}");
        assert!(picks.contains(&"10.0.0.2:80".parse().unwrap()));
    }

    #[test]
    fn a_failed_refresh_keeps_the_answer_until_it_is_stale() {
        let conf = DnsConf::default();
        let n = entry();
        let addrs = vec![Addr {
            ip: "10.0.0.1".parse().unwrap(),
            port: None,
            weight: 1,
        }];
        n.store(found(addrs.clone()), &conf);
        let g = n.generation();
        let failed = Answer {
            state: State::Failed,
            ..Answer::unresolved()
        };
        n.store(failed, &conf);
        let a = n.answer.load();
        assert_eq!((a.state, &a.addrs), (State::Found, &addrs));
        // Retried after dns_error_ttl, not after the record's TTL.
        assert!(a.valid_until <= Instant::now() + conf.error_ttl);
        assert_eq!(n.generation(), g, "same addresses: pooled connections stay");
        // Not found is an answer: the addresses go, and so do the pooled connections.
        n.store(
            Answer {
                state: State::NotFound,
                ..Answer::unresolved()
            },
            &conf,
        );
        assert_eq!(n.answer.load().state, State::NotFound);
        assert_ne!(n.generation(), g);
    }

    #[tokio::test]
    async fn hosts_file_names_and_ip_literals_need_no_name_server() {
        let (dns, _) = Dns::start(&DnsConf::default()).unwrap();
        assert!(dns.name("127.0.0.1").is_none());
        assert!(dns.name("[::1]").is_none());
        assert_eq!(
            dns.lookup("::1", 80).await,
            Ok("[::1]:80".parse::<SocketAddr>().unwrap())
        );
        // /etc/hosts names localhost on every Linux machine.
        let a = dns.lookup("localhost", 8080).await.unwrap();
        assert!(a.ip().is_loopback() && a.port() == 8080, "{a}");
    }

    /// Each gateway has a resolver of its own: a name one resolves is not in another's
    /// registry, and nothing but its owner keeps a resolver alive (its refresher and its names
    /// hold it weakly), so dropping it ends its thread.
    #[test]
    fn resolvers_are_the_nodes_own_and_end_with_it() {
        let (a, _) = Dns::start(&DnsConf::default()).unwrap();
        let (b, _) = Dns::start(&DnsConf::default()).unwrap();
        let n = a.name("localhost").unwrap();
        assert!(Arc::ptr_eq(&n, &a.name("LOCALHOST").unwrap()));
        assert_eq!((a.names(), b.names()), (1, 0));
        // The first look-up (from the hosts file) runs on a's thread and lets go of it.
        let deadline = Instant::now() + Duration::from_secs(5);
        while (n.answer.load().state == State::Unresolved || Arc::strong_count(&a) > 1)
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(n.answer.load().state, State::Found);
        let weak = Arc::downgrade(&a);
        drop((a, b));
        assert!(weak.upgrade().is_none(), "only its owner held the resolver");
        // A name outliving its resolver keeps its last answer and asks no one.
        n.refresh();
        assert!(!n.refreshing.load(Ordering::Acquire));
        assert_eq!(n.answer.load().state, State::Found);
    }
}
