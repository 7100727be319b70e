//! The router: Kong's `traditional_compatible` semantics, compiled once per configuration into
//! an index so that per request only a few hash look-ups and the candidates' checks run.
//!
//! Compilation follows Kong's ATC compatibility layer (`kong/router/compat.lua`,
//! `kong/router/transform.lua`): each route is split into one matcher per group of paths that
//! share a priority (all regex paths; plain paths of one length), and every matcher gets Kong's
//! 64-bit priority. Matchers are sorted by priority once; a request's candidates come from the
//! index (host map → per-host prefix table of path prefixes, plus regex and path-less lists), and
//! the first candidate in priority order whose every field matches wins.

mod path;

use std::sync::Arc;

use http::HeaderMap;
use regex::Regex;
use rustc_hash::FxHashMap;
use turnpike_config::declarative::{Config, Route};

pub use path::{normalize_path, upstream_uri};

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
}

/// A compiled route: what the proxy needs after a match.
#[derive(Debug)]
pub struct RouteEntry {
    /// Index into the configuration's `routes`.
    pub route_index: usize,
    /// Index into the configuration's `services`, when the route has one.
    pub service_index: Option<usize>,
    pub strip_path: bool,
    pub preserve_host: bool,
    pub path_handling_v1: bool,
    pub accepts_http: bool,
    pub accepts_https: bool,
    pub https_redirect_status_code: u16,
    /// Read the whole request body before choosing and connecting to an upstream (Kong's
    /// `request_buffering`, default true).
    pub request_buffering: bool,
    /// Read the upstream's response body ahead of the client (Kong's `response_buffering`,
    /// default true).
    pub response_buffering: bool,
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

#[derive(Debug)]
enum HostPattern {
    Exact(Box<str>, Option<u16>),
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

#[derive(Debug)]
enum ValueMatch {
    /// Compared case-insensitively (stored lower-case).
    Exact(Box<str>),
    /// `~*regex`: Kong's case-insensitive regex.
    Regex(Regex),
}

#[derive(Debug)]
enum PathMatch {
    Any,
    Prefix(Vec<Box<str>>),
    Regex(Vec<Regex>),
}

#[derive(Debug)]
struct Matcher {
    entry: u32,
    priority: u64,
    created_at: i64,
    order: usize,
    methods: Option<Vec<Box<str>>>,
    hosts: Option<Vec<HostPattern>>,
    headers: Vec<(http::HeaderName, Vec<ValueMatch>)>,
    paths: PathMatch,
    snis: Option<Vec<HostPattern>>,
}

/// Candidate lists for one host key.
#[derive(Default, Debug)]
struct Bucket {
    /// Plain prefix → matchers (indices into the priority-sorted matcher list).
    prefixes: FxHashMap<Box<str>, Vec<u32>>,
    /// Distinct prefix lengths present, longest first.
    prefix_lens: Vec<usize>,
    /// Regex-path and path-less matchers.
    others: Vec<u32>,
    /// The last matcher added: a matcher listing the same host twice is added once.
    last: Option<u32>,
}

impl Bucket {
    fn add(&mut self, m: &Matcher, idx: u32) {
        if self.last == Some(idx) {
            return;
        }
        self.last = Some(idx);
        match &m.paths {
            PathMatch::Prefix(ps) => {
                for p in ps {
                    self.prefixes.entry(p.clone()).or_default().push(idx);
                    if !self.prefix_lens.contains(&p.len()) {
                        self.prefix_lens.push(p.len());
                    }
                }
            }
            _ => self.others.push(idx),
        }
    }

    fn finish(&mut self) {
        self.prefix_lens.sort_unstable_by(|a, b| b.cmp(a));
    }

    fn candidates(&self, path: &str, out: &mut Candidates) {
        for &len in &self.prefix_lens {
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

/// A compiled router for one configuration snapshot.
#[derive(Debug, Default)]
pub struct Router {
    entries: Vec<RouteEntry>,
    matchers: Vec<Matcher>,
    exact_hosts: FxHashMap<Box<str>, Bucket>,
    wildcard_hosts: Bucket,
    any_host: Bucket,
}

const MAX_HEADER_COUNT: u64 = 255;
const PLAIN_HOST_ONLY_BIT: u64 = 1 << 60;
const REGEX_URL_BIT: u64 = 1 << 51;

fn host_pattern(h: &str) -> HostPattern {
    let h = h.to_ascii_lowercase();
    let (host, port) = match h.rsplit_once(':') {
        Some((a, p)) if !a.contains(':') || a.ends_with(']') => match p.parse::<u16>() {
            Ok(port) => (a.to_string(), Some(port)),
            Err(_) => (h.clone(), None),
        },
        _ => (h.clone(), None),
    };
    if let Some(s) = host.strip_prefix('*') {
        HostPattern::Suffix(s.into(), port)
    } else if let Some(s) = host.strip_suffix('*') {
        HostPattern::Prefix(s.into(), port)
    } else {
        HostPattern::Exact(host.into(), port)
    }
}

/// Kong's `get_priority` (kong/router/transform.lua) for a route restricted to one path group.
fn priority(route: &Route, paths: &PathMatch) -> u64 {
    let non_empty = |o: &Option<Vec<String>>| o.as_ref().is_some_and(|v| !v.is_empty());
    let mut weight: u64 = 0;
    if non_empty(&route.snis) {
        weight += 1;
    }
    if route.sources.as_ref().is_some_and(|v| !v.is_empty()) {
        weight += 1;
    }
    if route.destinations.as_ref().is_some_and(|v| !v.is_empty()) {
        weight += 1;
    }
    if non_empty(&route.methods) {
        weight += 1;
    }
    let mut plain_host_only = route.hosts.is_some();
    if non_empty(&route.hosts) {
        weight += 1;
        if route
            .hosts
            .as_ref()
            .unwrap()
            .iter()
            .any(|h| h.contains('*'))
        {
            plain_host_only = false;
        }
    }
    let mut header_count = route.headers.as_ref().map(|h| h.len() as u64).unwrap_or(0);
    if header_count > 0 {
        weight += 1;
        header_count = header_count.min(MAX_HEADER_COUNT);
    }
    let (regex_url, uri_length) = match paths {
        PathMatch::Any => (false, 0),
        PathMatch::Prefix(p) => {
            weight += 1;
            (false, p[0].len() as u64)
        }
        PathMatch::Regex(_) => {
            weight += 1;
            (true, 0)
        }
    };
    let regex_priority = if regex_url {
        (route.regex_priority as u64) << 19
    } else {
        0
    };
    (weight << 61)
        | if plain_host_only {
            PLAIN_HOST_ONLY_BIT
        } else {
            0
        }
        | if regex_url { REGEX_URL_BIT } else { 0 }
        | (header_count << 52)
        | regex_priority
        | (uri_length & 0x7FFFF)
}

/// Errors found while compiling (a route that validation let through but cannot be compiled).
#[derive(Debug)]
pub struct CompileError(pub String);

impl std::fmt::Display for CompileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A route's header matchers and path groups; an error names what does not compile.
#[allow(clippy::type_complexity)]
fn route_matchers(
    route: &Route,
) -> Result<(Vec<(http::HeaderName, Vec<ValueMatch>)>, Vec<PathMatch>), CompileError> {
    let mut headers = Vec::new();
    for (name, values) in route.headers.iter().flatten() {
        let hn = http::HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
            CompileError(format!("route {}: invalid header name '{name}'", route.id))
        })?;
        let mut vm = Vec::new();
        for v in values {
            if let Some(re) = v.strip_prefix("~*") {
                let re = Regex::new(&format!("(?i){re}"))
                    .map_err(|e| CompileError(format!("route {}: header regex: {e}", route.id)))?;
                vm.push(ValueMatch::Regex(re));
            } else {
                vm.push(ValueMatch::Exact(v.to_ascii_lowercase().into()));
            }
        }
        headers.push((hn, vm));
    }
    // Split paths into groups that share a priority, as Kong's compat router does.
    let mut groups: Vec<PathMatch> = Vec::new();
    match route.paths.as_ref().filter(|p| !p.is_empty()) {
        None => groups.push(PathMatch::Any),
        Some(paths) => {
            let mut regexes = Vec::new();
            let mut by_len: std::collections::BTreeMap<usize, Vec<Box<str>>> = Default::default();
            for p in paths {
                if let Some(re) = p.strip_prefix('~') {
                    // Kong anchors regex paths at the start of the path.
                    let re = Regex::new(&format!("^(?:{re})")).map_err(|e| {
                        CompileError(format!("route {}: path regex: {e}", route.id))
                    })?;
                    regexes.push(re);
                } else {
                    by_len.entry(p.len()).or_default().push(p.as_str().into());
                }
            }
            if !regexes.is_empty() {
                groups.push(PathMatch::Regex(regexes));
            }
            for (_, ps) in by_len.into_iter().rev() {
                groups.push(PathMatch::Prefix(ps));
            }
        }
    }
    Ok((headers, groups))
}

impl Router {
    /// Compiles the HTTP routes of a configuration. Stream routes (tcp, tls, udp,
    /// tls_passthrough) and gRPC routes are not served by the HTTP router.
    pub fn build(config: &Config) -> Result<Router, CompileError> {
        let mut problems = Vec::new();
        let router = Router::build_skipping(config, &mut problems);
        match problems.into_iter().next() {
            Some(p) => Err(CompileError(p)),
            None => Ok(router),
        }
    }

    /// Like `build`, leaving out the routes that do not compile, each named in `problems`.
    pub fn build_skipping(config: &Config, problems: &mut Vec<String>) -> Router {
        let service_index: FxHashMap<&str, usize> = config
            .services
            .iter()
            .enumerate()
            .map(|(i, s)| (s.id.as_str(), i))
            .collect();
        let mut router = Router::default();
        // One entry per route, and (usually) one matcher: sized up front rather than grown by
        // doubling, which left up to half of each list empty for the snapshot's life.
        router.entries.reserve_exact(config.routes.len());
        let mut matchers = Vec::with_capacity(config.routes.len());
        for (ri, route) in config.routes.iter().enumerate() {
            let accepts_http = route.protocols.iter().any(|p| p == "http" || p == "ws");
            let accepts_https = route.protocols.iter().any(|p| p == "https" || p == "wss");
            if !accepts_http && !accepts_https {
                continue;
            }
            let service = route
                .service
                .as_ref()
                .and_then(|s| service_index.get(s.id.as_str()).copied());
            // Kong leaves routes of disabled services out of the router.
            if service.is_some_and(|i| !config.services[i].enabled) {
                continue;
            }
            let methods = route
                .methods
                .as_ref()
                .filter(|m| !m.is_empty())
                .map(|m| m.iter().map(|s| s.as_str().into()).collect());
            let hosts: Option<Vec<HostPattern>> = route
                .hosts
                .as_ref()
                .filter(|h| !h.is_empty())
                .map(|h| h.iter().map(|s| host_pattern(s)).collect());
            let snis: Option<Vec<HostPattern>> = route
                .snis
                .as_ref()
                .filter(|h| !h.is_empty())
                .map(|h| h.iter().map(|s| host_pattern(s)).collect());
            // A route that does not compile is left out (and reported); the others are served.
            let (headers, groups) = match route_matchers(route) {
                Ok(m) => m,
                Err(e) => {
                    problems.push(e.0);
                    continue;
                }
            };
            let entry = router.entries.len() as u32;
            router.entries.push(RouteEntry {
                route_index: ri,
                service_index: service,
                strip_path: route.strip_path,
                preserve_host: route.preserve_host,
                path_handling_v1: route.path_handling == "v1",
                accepts_http,
                accepts_https,
                https_redirect_status_code: route.https_redirect_status_code,
                request_buffering: route.request_buffering,
                response_buffering: route.response_buffering,
            });
            for paths in groups {
                matchers.push(Matcher {
                    entry,
                    priority: priority(route, &paths),
                    created_at: route.created_at,
                    order: ri,
                    methods: methods.clone(),
                    hosts: hosts
                        .as_ref()
                        .map(|h| h.iter().map(clone_pattern).collect()),
                    headers: headers
                        .iter()
                        .map(|(n, v)| (n.clone(), v.iter().map(clone_value).collect()))
                        .collect(),
                    paths,
                    snis: snis.as_ref().map(|h| h.iter().map(clone_pattern).collect()),
                });
            }
        }
        // Highest priority first; among equals the oldest route, then file order.
        matchers.sort_by(|a, b| {
            b.priority
                .cmp(&a.priority)
                .then(a.created_at.cmp(&b.created_at))
                .then(a.order.cmp(&b.order))
        });
        for (i, m) in matchers.iter().enumerate() {
            let idx = i as u32;
            match &m.hosts {
                None => router.any_host.add(m, idx),
                Some(hs) => {
                    let mut wildcard_added = false;
                    for h in hs {
                        match h {
                            HostPattern::Exact(name, _) => {
                                router
                                    .exact_hosts
                                    .entry(name.clone())
                                    .or_default()
                                    .add(m, idx);
                            }
                            _ if !wildcard_added => {
                                router.wildcard_hosts.add(m, idx);
                                wildcard_added = true;
                            }
                            _ => {}
                        }
                    }
                }
            }
        }
        router.any_host.finish();
        router.wildcard_hosts.finish();
        for b in router.exact_hosts.values_mut() {
            b.finish();
        }
        matchers.shrink_to_fit();
        router.matchers = matchers;
        router
    }

    pub fn is_empty(&self) -> bool {
        self.matchers.is_empty()
    }

    pub fn entries(&self) -> &[RouteEntry] {
        &self.entries
    }

    /// Finds the route for a request.
    pub fn find(&self, req: &RequestView) -> Option<Match<'_>> {
        // Candidate indices are ranks in priority order; small lists stay on the stack.
        let mut cands = Candidates::new();
        if let Some(b) = self.exact_hosts.get(req.host) {
            b.candidates(req.path, &mut cands);
        }
        self.wildcard_hosts.candidates(req.path, &mut cands);
        self.any_host.candidates(req.path, &mut cands);
        if cands.len() > 1 {
            cands.sort_unstable();
            cands.dedup();
        }
        for idx in cands {
            let m = &self.matchers[idx as usize];
            if let Some(found) = self.check(m, req) {
                return Some(found);
            }
        }
        None
    }

    fn check<'r>(&'r self, m: &Matcher, req: &RequestView) -> Option<Match<'r>> {
        if let Some(methods) = &m.methods {
            if !methods.iter().any(|x| &**x == req.method) {
                return None;
            }
        }
        if let Some(hosts) = &m.hosts {
            if !hosts.iter().any(|h| h.matches(req.host, req.port)) {
                return None;
            }
        }
        if let Some(snis) = &m.snis {
            let sni = req.sni?;
            if !snis.iter().any(|h| h.matches(sni, 0)) {
                return None;
            }
        }
        for (name, values) in &m.headers {
            let mut ok = false;
            for hv in req.headers.get_all(name) {
                let Ok(s) = hv.to_str() else { continue };
                ok = values.iter().any(|v| match v {
                    ValueMatch::Exact(e) => s.eq_ignore_ascii_case(e),
                    ValueMatch::Regex(re) => re.is_match(s),
                });
                if ok {
                    break;
                }
            }
            if !ok {
                return None;
            }
        }
        let route = &self.entries[m.entry as usize];
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
                        let names: Vec<Option<&str>> = re.capture_names().collect();
                        let caps = c
                            .iter()
                            .enumerate()
                            .skip(1)
                            .filter_map(|(i, g)| {
                                g.map(|g| (names[i].map(String::from), g.as_str().to_string()))
                            })
                            .collect();
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

fn clone_pattern(h: &HostPattern) -> HostPattern {
    match h {
        HostPattern::Exact(a, p) => HostPattern::Exact(a.clone(), *p),
        HostPattern::Suffix(a, p) => HostPattern::Suffix(a.clone(), *p),
        HostPattern::Prefix(a, p) => HostPattern::Prefix(a.clone(), *p),
    }
}

fn clone_value(v: &ValueMatch) -> ValueMatch {
    match v {
        ValueMatch::Exact(e) => ValueMatch::Exact(e.clone()),
        ValueMatch::Regex(r) => ValueMatch::Regex(r.clone()),
    }
}

/// A router shared by many workers.
pub type SharedRouter = Arc<Router>;

#[cfg(test)]
mod tests;
