//! The router: Kong's `traditional_compatible` semantics, compiled once per configuration into
//! an index so that per request only a few hash look-ups and the candidates' checks run.
//!
//! Compilation follows Kong's ATC compatibility layer (`kong/router/compat.lua`,
//! `kong/router/transform.lua`): each route is split into one matcher per group of paths that
//! share a priority (all regex paths; plain paths of one length), and every matcher gets Kong's
//! 64-bit priority. Matchers are sorted by priority once; a request's candidates come from the
//! index (host map → per-host prefix table of path prefixes, plus regex and path-less lists), and
//! the first candidate in priority order whose every field matches wins.

pub mod atc;
mod cache;
mod compile;
mod path;
mod shared;

use std::sync::Arc;

use http::HeaderMap;
use regex::Regex;
use rustc_hash::FxHashMap;
use turnpike_config::atc::RouterFlavor;
use turnpike_config::declarative::{Config, Route};

pub use cache::MatchCache;
use compile::*;
pub use compile::{CompileError, ServiceRef};
pub use path::{normalize_path, upstream_uri};
pub use shared::{ChunkedVec, ShardedMap};

/// What the router needs to know of a request.
pub struct RequestView<'a> {
    pub method: &'a str,
    /// Host without port, lower-case.
    pub host: &'a str,
    /// The local port the request arrived on (Kong's `net.dst.port`).
    pub port: u16,
    /// Normalised path, no query string.
    pub path: &'a str,
    pub headers: &'a HeaderMap,
    pub sni: Option<&'a str>,
    /// The Host as the client sent it, port included: Kong's `http.host` (case kept) and
    /// `net.dst.port` (the Host's port when it has one).
    pub authority: &'a str,
    /// The query string (`http.queries.*`).
    pub query: Option<&'a str>,
    /// Whether the request came over TLS (`net.protocol`).
    pub tls: bool,
    /// The client's address (`net.src.*`) and the address it reached (`net.dst.ip`).
    pub peer: Option<std::net::SocketAddr>,
    pub local_ip: Option<std::net::IpAddr>,
    /// `net.protocol` when it is not `http`/`https` by [`RequestView::tls`]: a stream
    /// connection's `tcp`, `tls` or `udp`.
    pub protocol: Option<&'a str>,
}

impl<'a> RequestView<'a> {
    /// A request with only the fields the traditional router reads; the rest empty.
    pub fn basic(
        method: &'a str,
        host: &'a str,
        port: u16,
        path: &'a str,
        headers: &'a HeaderMap,
    ) -> Self {
        RequestView {
            method,
            host,
            port,
            path,
            headers,
            sni: None,
            authority: host,
            query: None,
            tls: false,
            peer: None,
            local_ip: None,
            protocol: None,
        }
    }
}

/// [`RouteEntry::grpc`]: the route lists `grpc` (cleartext h2c).
pub const GRPC: u8 = 1;
/// [`RouteEntry::grpc`]: the route lists `grpcs`.
pub const GRPCS: u8 = 2;

/// A compiled route: what the proxy needs after a match.
#[derive(Debug, Clone, Copy)]
pub struct RouteEntry {
    /// The route's slot ([`RouteEntry::route_index`]); 32 bits keep a router slot at 56
    /// bytes rather than 72 (1.6 MB at 100k routes).
    slot: u32,
    service: Option<u32>,
    pub strip_path: bool,
    pub preserve_host: bool,
    pub path_handling_v1: bool,
    pub accepts_http: bool,
    pub accepts_https: bool,
    pub https_redirect_status_code: u16,
    /// A gRPC route ([`GRPC`], [`GRPCS`] bits: the protocols it lists); 0 for others.
    pub grpc: u8,
    /// Read the whole request body before choosing and connecting to an upstream (Kong's
    /// `request_buffering`, default true).
    pub request_buffering: bool,
    /// Read the upstream's response body ahead of the client (Kong's `response_buffering`,
    /// default true).
    pub response_buffering: bool,
}

impl RouteEntry {
    /// The route's slot: stable for the route's life across patches ([`Router::update`]),
    /// so that the data a snapshot keeps per route can be kept by slot too.
    #[inline]
    pub fn route_index(&self) -> usize {
        self.slot as usize
    }

    /// Index into the configuration's `services`, when the route has one.
    #[inline]
    pub fn service_index(&self) -> Option<usize> {
        self.service.map(|s| s as usize)
    }
}

/// The result of a match.
#[derive(Debug)]
pub struct Match<'r> {
    pub route: &'r RouteEntry,
    /// How many bytes at the start of the path the route's path matched (for strip_path);
    /// `None` when the route has no paths.
    pub matched_len: Option<usize>,
    /// Regex captures, unnamed by position and named by name, when the path was a regex.
    pub captures: Option<Vec<(Option<String>, String)>>,
}

#[derive(Debug, Clone)]
enum HostPattern {
    Exact(Arc<str>, Option<u16>),
    /// `*.example.com`: stored as `.example.com`.
    Suffix(Box<str>, Option<u16>),
    /// `example.*`: stored as `example.`.
    Prefix(Box<str>, Option<u16>),
}

impl HostPattern {
    fn matches(&self, host: &str, port: u16) -> bool {
        let (ok, p) = match self {
            HostPattern::Exact(h, p) => (host == &**h, p),
            HostPattern::Suffix(s, p) => (host.len() > s.len() && host.ends_with(&**s), p),
            HostPattern::Prefix(s, p) => (host.len() > s.len() && host.starts_with(&**s), p),
        };
        ok && p.is_none_or(|p| p == port)
    }
}

#[derive(Debug, Clone)]
enum ValueMatch {
    /// Compared case-insensitively (stored lower-case).
    Exact(Box<str>),
    /// `~*regex`: Kong's case-insensitive regex, stored lower-cased.
    Regex(Regex),
}

#[derive(Debug)]
enum PathMatch {
    Any,
    /// Shared with the index's keys; one path inline (most routes have one).
    Prefix(smallvec::SmallVec<[Arc<str>; 1]>),
    Regex(Vec<Regex>),
}

#[derive(Debug)]
struct Matcher {
    /// The route's slot.
    entry: u32,
    /// The route's methods when all are standard ones ([`method_bit`]), 0 for none (or for
    /// methods kept in `filters`): a route with paths and methods then needs no `Filters`
    /// (88 bytes, plus 40 and two strings for its methods: 31 MB at 231k routes).
    methods: u16,
    priority: u64,
    /// The tie-break among equal priorities, lowest first: under the ATC flavors the
    /// matcher's id in descending order (Kong's engine keeps matchers by (priority, id) and
    /// tries the largest first); under `traditional` the route's creation time, then file
    /// order (its position at the full build, and past every other route's for a route added
    /// by a patch).
    tie: (u64, u64),
    paths: PathMatch,
    /// Methods, hosts, headers and SNIs, when the route has any: most routes have a path
    /// only, and these four lists inline made a matcher 176 bytes rather than 88 (9 MB at
    /// 100k routes).
    filters: Option<Box<Filters>>,
}

#[derive(Debug, Clone, Default)]
struct Filters {
    methods: Option<Vec<Box<str>>>,
    hosts: Option<Vec<HostPattern>>,
    headers: Vec<(http::HeaderName, Vec<ValueMatch>)>,
    snis: Option<Vec<HostPattern>>,
    /// An ATC matcher (the expressions flavor): evaluated instead of the fields above, which
    /// then only say where the index files it.
    program: Option<Arc<atc::Program>>,
}

/// A standard method's bit in [`Matcher::methods`], 0 for any other method.
fn method_bit(method: &str) -> u16 {
    match method {
        "GET" => 1,
        "HEAD" => 1 << 1,
        "POST" => 1 << 2,
        "PUT" => 1 << 3,
        "DELETE" => 1 << 4,
        "PATCH" => 1 << 5,
        "OPTIONS" => 1 << 6,
        "CONNECT" => 1 << 7,
        "TRACE" => 1 << 8,
        _ => 0,
    }
}

impl Matcher {
    fn hosts(&self) -> Option<&Vec<HostPattern>> {
        self.filters.as_ref()?.hosts.as_ref()
    }
}

impl Matcher {
    /// Highest priority first; among equals the tie-break.
    fn rank(&self) -> (std::cmp::Reverse<u64>, (u64, u64)) {
        (std::cmp::Reverse(self.priority), self.tie)
    }
}

/// Matcher ids: most keys name one or two matchers, kept inline.
type Ids = smallvec::SmallVec<[u32; 2]>;

/// Candidate lists for one host key. Shared between the routers of successive snapshots
/// until a patch changes it.
#[derive(Default, Debug, Clone)]
struct Bucket {
    /// Plain prefix → matchers.
    prefixes: ShardedMap<Ids>,
    /// Distinct prefix lengths present, longest first, with how many prefixes have each.
    prefix_lens: Vec<(usize, u32)>,
    /// Regex-path and path-less matchers.
    others: Vec<u32>,
}

impl Bucket {
    /// Adds matcher `id`; adding it again right after (a host listed twice) does nothing.
    fn add(&mut self, m: &Matcher, id: u32) {
        match &m.paths {
            PathMatch::Prefix(ps) => {
                for p in ps {
                    let ids = self.prefixes.get_or_default(p);
                    if ids.is_empty() {
                        match self.prefix_lens.iter().position(|l| l.0 <= p.len()) {
                            Some(i) if self.prefix_lens[i].0 == p.len() => {
                                self.prefix_lens[i].1 += 1
                            }
                            Some(i) => self.prefix_lens.insert(i, (p.len(), 1)),
                            None => self.prefix_lens.push((p.len(), 1)),
                        }
                    }
                    if ids.last() != Some(&id) {
                        ids.push(id);
                    }
                }
            }
            _ => {
                if self.others.last() != Some(&id) {
                    self.others.push(id)
                }
            }
        }
    }

    fn remove(&mut self, m: &Matcher, id: u32) {
        match &m.paths {
            PathMatch::Prefix(ps) => {
                for p in ps {
                    let Some(ids) = self.prefixes.get_mut(p) else {
                        continue;
                    };
                    ids.retain(|x| *x != id);
                    if ids.is_empty() {
                        self.prefixes.remove(p);
                        if let Some(i) = self.prefix_lens.iter().position(|l| l.0 == p.len()) {
                            self.prefix_lens[i].1 -= 1;
                            if self.prefix_lens[i].1 == 0 {
                                self.prefix_lens.remove(i);
                            }
                        }
                    }
                }
            }
            _ => self.others.retain(|x| *x != id),
        }
    }

    fn candidates(&self, path: &str, out: &mut Candidates) {
        for &(len, _) in &self.prefix_lens {
            if let Some(prefix) = path.get(..len) {
                if let Some(v) = self.prefixes.get(prefix) {
                    out.extend_from_slice(v);
                }
            }
        }
        out.extend_from_slice(&self.others);
    }
}

type Candidates = smallvec::SmallVec<[u32; 16]>;

/// One route's place in the router.
#[derive(Debug, Clone)]
struct Slot {
    /// `None` for a route the HTTP router does not serve (stream protocols, a disabled
    /// service, a route that does not compile) and for a free slot.
    entry: Option<RouteEntry>,
    matchers: Ids,
    order: u32,
}

/// A compiled router for one configuration snapshot.
///
/// Built whole from a config ([`Router::build_skipping`]), then patched route by route
/// ([`Router::add`], [`Router::update`], [`Router::remove`]) on a clone: the clone copies
/// pointers, and only the buckets a patch touches are copied, so a change to one route of
/// 100k costs far less than a rebuild while the previous snapshot keeps serving.
#[derive(Debug, Default, Clone)]
pub struct Router {
    slots: ChunkedVec<Slot>,
    free_slots: Vec<u32>,
    matchers: ChunkedVec<Option<Arc<Matcher>>>,
    free_matchers: Vec<u32>,
    live_matchers: usize,
    next_order: u32,
    exact_hosts: ShardedMap<Arc<Bucket>>,
    wildcard_hosts: Arc<Bucket>,
    any_host: Arc<Bucket>,
    flavor: RouterFlavor,
    /// What a match cache's key is made of ([`MatchCache`]).
    keys: cache::KeyFields,
}

impl Router {
    /// Compiles the HTTP routes of a configuration. Stream routes (tcp, tls, udp,
    /// tls_passthrough) and gRPC routes are not served by the HTTP router.
    pub fn build(config: &Config) -> Result<Router, CompileError> {
        let mut problems = Vec::new();
        let router = Router::build_skipping(config, RouterFlavor::default(), &mut problems);
        match problems.into_iter().next() {
            Some(p) => Err(CompileError(p)),
            None => Ok(router),
        }
    }

    /// Like `build`, leaving out the routes that do not compile, each named in `problems`.
    /// Route `i` of the config gets slot `i`.
    pub fn build_skipping(
        config: &Config,
        flavor: RouterFlavor,
        problems: &mut Vec<String>,
    ) -> Router {
        let service_index: FxHashMap<&str, usize> = config
            .services
            .iter()
            .enumerate()
            .map(|(i, s)| (&*s.id, i))
            .collect();
        let mut router = Router {
            flavor,
            ..Router::default()
        };
        for route in &config.routes {
            let service = route.service.as_ref().and_then(|s| {
                let i = *service_index.get(s.id.as_ref())?;
                Some((i, config.services[i].enabled))
            });
            if let (_, Err(e)) = router.add(route, service) {
                problems.push(e.0);
            }
        }
        router
    }

    /// Adds a route in a new slot (a free one or the next): the slot its entry will carry.
    /// A route that does not compile keeps its slot, unserved, and the error names it.
    pub fn add(&mut self, route: &Route, service: ServiceRef) -> (usize, Result<(), CompileError>) {
        let slot = match self.free_slots.pop() {
            Some(s) => s,
            None => {
                self.slots.push(Slot {
                    entry: None,
                    matchers: Ids::new(),
                    order: 0,
                });
                (self.slots.len() - 1) as u32
            }
        };
        let order = self.next_order;
        self.next_order += 1;
        self.slot_mut(slot as usize).order = order;
        (slot as usize, self.place(slot, route, service))
    }

    /// Replaces the route in `slot` by its new version: it keeps its place in file order.
    pub fn update(
        &mut self,
        slot: usize,
        route: &Route,
        service: ServiceRef,
    ) -> Result<(), CompileError> {
        self.unplace(slot);
        self.place(slot as u32, route, service)
    }

    /// Removes the route in `slot`; the slot may be given to a route added later.
    pub fn remove(&mut self, slot: usize) {
        if slot < self.slots.len() {
            self.unplace(slot);
            self.free_slots.push(slot as u32);
        }
    }

    /// Compiles a route into `slot` (empty) and indexes its matchers.
    fn place(&mut self, slot: u32, route: &Route, service: ServiceRef) -> Result<(), CompileError> {
        let order = self.slots[slot as usize].order;
        let (entry, matchers) = compile(route, slot, service, order, self.flavor)?;
        let mut ids = Ids::new();
        for m in matchers {
            let id = match self.free_matchers.pop() {
                Some(id) => id,
                None => {
                    self.matchers.push(None);
                    (self.matchers.len() - 1) as u32
                }
            };
            self.index(&m, id, true);
            self.learn(&m);
            *self.matchers.get_mut(id as usize).expect("a matcher id") = Some(Arc::new(m));
            self.live_matchers += 1;
            ids.push(id);
        }
        let s = self.slot_mut(slot as usize);
        s.entry = entry;
        s.matchers = ids;
        Ok(())
    }

    /// Takes the route in `slot` out of the index, leaving the slot empty.
    fn unplace(&mut self, slot: usize) {
        if slot >= self.slots.len() {
            return;
        }
        let s = self.slot_mut(slot);
        s.entry = None;
        for id in std::mem::take(&mut s.matchers) {
            if let Some(m) = self.matchers.get_mut(id as usize).and_then(Option::take) {
                self.index(&m, id, false);
                self.live_matchers -= 1;
                self.free_matchers.push(id);
            }
        }
    }

    /// Adds matcher `id` to (or removes it from) the buckets of its hosts. A bucket shared with
    /// an earlier router is copied first.
    fn index(&mut self, m: &Matcher, id: u32, add: bool) {
        let apply = |b: &mut Arc<Bucket>| {
            let b = Arc::make_mut(b);
            if add {
                b.add(m, id)
            } else {
                b.remove(m, id)
            }
        };
        match m.hosts() {
            None => apply(&mut self.any_host),
            Some(hs) => {
                let mut wildcard_done = false;
                for h in hs {
                    match h {
                        HostPattern::Exact(name, _) => {
                            if add {
                                apply(self.exact_hosts.get_or_default(name));
                            } else if let Some(b) = self.exact_hosts.get_mut(name) {
                                apply(b);
                                if b.prefixes.is_empty() && b.others.is_empty() {
                                    self.exact_hosts.remove(name);
                                }
                            }
                        }
                        _ if !wildcard_done => {
                            apply(&mut self.wildcard_hosts);
                            wildcard_done = true;
                        }
                        _ => {}
                    }
                }
            }
        }
    }

    /// Adds what `m` reads of a request to the cache key's fields.
    fn learn(&mut self, m: &Matcher) {
        let k = &mut self.keys;
        match &m.paths {
            PathMatch::Any => {}
            PathMatch::Prefix(_) => k.path = true,
            PathMatch::Regex(_) => {
                k.path = true;
                k.costly = true;
            }
        }
        k.method |= m.methods != 0;
        let Some(f) = &m.filters else { return };
        if let Some(p) = &f.program {
            k.costly = true;
            turnpike_config::atc::visit_predicates(&p.expr, &mut |pred| {
                k.atc_field(&pred.lhs.var_name)
            });
            return;
        }
        k.method |= f.methods.is_some();
        k.host |= f.hosts.is_some();
        if f.snis.is_some() {
            k.sni = true;
            k.tls = true;
        }
        for (name, values) in &f.headers {
            k.header(name);
            if values.iter().any(|v| matches!(v, ValueMatch::Regex(_))) {
                k.costly = true;
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.live_matchers == 0
    }

    /// The entry of the route in `slot`, when the router serves it.
    pub fn entry(&self, slot: usize) -> Option<&RouteEntry> {
        self.slots.get(slot)?.entry.as_ref()
    }

    /// How many slots there are (routes, served or not, and free slots).
    pub fn slots(&self) -> usize {
        self.slots.len()
    }

    fn slot_mut(&mut self, slot: usize) -> &mut Slot {
        self.slots.get_mut(slot).expect("a slot in range")
    }

    fn matcher(&self, id: u32) -> &Matcher {
        self.matchers[id as usize]
            .as_deref()
            .expect("the index names live matchers only")
    }

    /// Finds the route for a request. Inline: it was, in the route phase, before the match
    /// cache called it from a second place (out of line, ~150 instructions a request more).
    #[inline]
    pub fn find(&self, req: &RequestView) -> Option<Match<'_>> {
        // Candidate matcher ids; small lists stay on the stack.
        let mut cands = Candidates::new();
        if let Some(b) = self.exact_hosts.get(req.host) {
            b.candidates(req.path, &mut cands);
        }
        self.wildcard_hosts.candidates(req.path, &mut cands);
        self.any_host.candidates(req.path, &mut cands);
        if cands.len() > 1 {
            cands.sort_unstable_by_key(|&id| (self.matcher(id).rank(), id));
            cands.dedup();
        }
        for id in cands {
            if let Some(found) = self.check(self.matcher(id), req) {
                return Some(found);
            }
        }
        None
    }

    fn check<'r>(&'r self, m: &Matcher, req: &RequestView) -> Option<Match<'r>> {
        if let Some(p) = m.filters.as_ref().and_then(|f| f.program.as_ref()) {
            return self.check_program(m, p, req);
        }
        if m.methods != 0 && m.methods & method_bit(req.method) == 0 {
            return None;
        }
        if let Some(f) = &m.filters {
            if let Some(methods) = &f.methods {
                if !methods.iter().any(|x| &**x == req.method) {
                    return None;
                }
            }
            if let Some(hosts) = &f.hosts {
                if !hosts.iter().any(|h| h.matches(req.host, req.port)) {
                    return None;
                }
            }
            // Kong's `(net.protocol != "https" || tls.sni ...)`: SNIs bind TLS requests only.
            if let (Some(snis), true) = (&f.snis, req.tls) {
                let sni = req.sni?;
                if !snis.iter().any(|h| h.matches(sni, 0)) {
                    return None;
                }
            }
            for (name, values) in &f.headers {
                let mut ok = false;
                for hv in req.headers.get_all(name) {
                    let Ok(s) = hv.to_str() else { continue };
                    ok = values.iter().any(|v| match v {
                        ValueMatch::Exact(e) => s.eq_ignore_ascii_case(e),
                        ValueMatch::Regex(re) => re.is_match(&s.to_lowercase()),
                    });
                    if ok {
                        break;
                    }
                }
                if !ok {
                    return None;
                }
            }
        }
        let route = self.slots[m.entry as usize].entry.as_ref()?;
        match &m.paths {
            PathMatch::Any => Some(Match {
                route,
                matched_len: None,
                captures: None,
            }),
            PathMatch::Prefix(ps) => {
                let p = ps.iter().find(|p| req.path.starts_with(&***p))?;
                Some(Match {
                    route,
                    matched_len: Some(p.len()),
                    captures: None,
                })
            }
            PathMatch::Regex(res) => {
                for re in res {
                    if re.captures_len() == 1 {
                        if let Some(found) = re.find(req.path) {
                            return Some(Match {
                                route,
                                matched_len: Some(found.end()),
                                captures: None,
                            });
                        }
                    } else if let Some(c) = re.captures(req.path) {
                        let caps = captures(re, &c);
                        return Some(Match {
                            route,
                            matched_len: Some(c.get(0).unwrap().end()),
                            captures: Some(caps),
                        });
                    }
                }
                None
            }
        }
    }
}

impl Router {
    /// The flavor the router was built for.
    pub fn flavor(&self) -> RouterFlavor {
        self.flavor
    }

    /// An ATC matcher: Kong strips the length of the `http.path` value the expression matched.
    fn check_program<'r>(
        &'r self,
        m: &Matcher,
        p: &atc::Program,
        req: &RequestView,
    ) -> Option<Match<'r>> {
        let route = self.slots[m.entry as usize].entry.as_ref()?;
        let mut fields = atc::eval::Fields::new(req);
        let mut rec = atc::eval::Record::default();
        if !atc::eval::eval(&p.expr, &mut fields, &mut rec) {
            return None;
        }
        Some(Match {
            route,
            matched_len: rec
                .path
                .filter(|&l| l <= req.path.len() && req.path.is_char_boundary(l)),
            captures: (!rec.captures.is_empty()).then_some(rec.captures),
        })
    }
}

/// A regex's groups past the whole match, in order, named when the regex names them (the
/// shape plugins read `uri_captures` in); groups that took no part are left out.
pub(crate) fn captures(re: &Regex, c: &regex::Captures<'_>) -> Vec<(Option<String>, String)> {
    let names: Vec<Option<&str>> = re.capture_names().collect();
    c.iter()
        .enumerate()
        .skip(1)
        .filter_map(|(i, g)| g.map(|g| (names[i].map(String::from), g.as_str().to_string())))
        .collect()
}

/// A router shared by many workers.
pub type SharedRouter = Arc<Router>;

#[cfg(test)]
mod tests;
