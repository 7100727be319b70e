//! Compiling a route into its entry and matchers: Kong's priorities (`get_priority` of
//! `kong/router/transform.lua`), its split of a route's paths into groups, the tie-breaks of
//! each flavor, and the expressions flavor's ATC programs.

use std::sync::Arc;

use regex::Regex;
use turnpike_config::atc::RouterFlavor;
use turnpike_config::declarative::Route;

use crate::{atc, Filters, HostPattern, Matcher, PathMatch, RouteEntry, ValueMatch, GRPC, GRPCS};

/// The traditional tie-break: creation time, then file order.
pub(super) fn created_tie(created_at: i64, order: u32) -> (u64, u64) {
    ((created_at as u64) ^ (1 << 63), order as u64)
}

/// The ATC tie-break: the largest id first.
pub(super) fn id_tie(id: uuid::Uuid) -> (u64, u64) {
    let (hi, lo) = id.as_u64_pair();
    (!hi, !lo)
}

pub(super) const MAX_HEADER_COUNT: u64 = 255;
pub(super) const PLAIN_HOST_ONLY_BIT: u64 = 1 << 60;
pub(super) const REGEX_URL_BIT: u64 = 1 << 51;

pub(super) fn host_pattern(h: &str) -> HostPattern {
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
pub(super) fn priority(route: &Route, paths: &PathMatch) -> u64 {
    let non_empty = |o: Option<&[String]>| o.is_some_and(|v| !v.is_empty());
    let mut weight: u64 = 0;
    if non_empty(route.snis.as_deref()) {
        weight += 1;
    }
    if route.sources.as_ref().is_some_and(|v| !v.is_empty()) {
        weight += 1;
    }
    if route.destinations.as_ref().is_some_and(|v| !v.is_empty()) {
        weight += 1;
    }
    if non_empty(route.methods.as_deref()) {
        weight += 1;
    }
    let mut plain_host_only = route.hosts.is_some();
    if non_empty(route.hosts.as_deref()) {
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
pub(super) fn route_matchers(
    route: &Route,
) -> Result<(Vec<(http::HeaderName, Vec<ValueMatch>)>, Vec<PathMatch>), CompileError> {
    let mut headers = Vec::new();
    for (name, values) in route.headers.iter().flat_map(|h| h.iter()) {
        let hn = http::HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
            CompileError(format!("route {}: invalid header name '{name}'", route.id))
        })?;
        let mut vm = Vec::new();
        for v in values {
            if let Some(re) = v.strip_prefix("~*") {
                // Kong's `any(lower(http.headers.x)) ~ lower(regex)`: the pattern itself is
                // lower-cased (so `\D` reads as `\d`) and matched against the lower-cased value.
                let re = Regex::new(&re.to_lowercase())
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
            let mut by_len: std::collections::BTreeMap<usize, Vec<Arc<str>>> = Default::default();
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
                groups.push(PathMatch::Prefix(ps.into_iter().collect()));
            }
        }
    }
    Ok((headers, groups))
}

/// What one route needs of its service: its index in `config.services`, and whether it is
/// enabled (Kong leaves routes of disabled services out of the router).
pub type ServiceRef = Option<(usize, bool)>;

/// A route compiled, not yet in the index: its entry (None when the HTTP router does not serve
/// it) and its matchers.
pub(super) type Compiled = (Option<RouteEntry>, Vec<Matcher>);

/// Kong's priority for `route` restricted to one group of its paths (as Kong splits them).
pub(super) fn group_priority(route: &Route, group: &[&str]) -> u64 {
    let paths = match group.first() {
        None => PathMatch::Any,
        Some(p) if p.starts_with('~') => PathMatch::Regex(Vec::new()),
        Some(p) => PathMatch::Prefix(smallvec::smallvec![Arc::from(*p)]),
    };
    priority(route, &paths)
}

/// The id Kong's engine knows a route's matcher by: the route's, or for a route whose paths
/// Kong splits into groups, the group's UUIDv5 (`kong/router/transform.lua`).
pub(super) fn matcher_id(route: &Route, paths: &PathMatch) -> uuid::Uuid {
    let own = uuid::Uuid::parse_str(&route.id).unwrap_or_default();
    let all = route.paths.as_deref().unwrap_or_default();
    if all.len() < 2 {
        return own;
    }
    let groups = atc::translate::path_groups(all);
    if groups.len() < 2 {
        return own;
    }
    let is_regex = matches!(paths, PathMatch::Regex(_));
    let len = match paths {
        PathMatch::Prefix(p) => p[0].len(),
        _ => 0,
    };
    let index = groups.iter().position(|g| {
        let first = g[0];
        if is_regex {
            first.starts_with('~')
        } else {
            !first.starts_with('~') && first.len() == len
        }
    });
    index.map_or(own, |i| atc::translate::split_id(&route.id, i + 1))
}

/// Matchers for the expressions flavor: every route as an ATC program.
pub(super) fn compile_programs(route: &Route, slot: u32) -> Result<Vec<Matcher>, CompileError> {
    let programs = atc::programs(route, |g| group_priority(route, g))
        .map_err(|e| CompileError(format!("route {}: {e}", route.id)))?;
    Ok(programs
        .into_iter()
        .map(|(p, priority, id)| {
            let paths = match &p.paths {
                Some(ps) => PathMatch::Prefix(ps.iter().cloned().collect()),
                None => PathMatch::Any,
            };
            let hosts = p.hosts.as_ref().map(|hs| {
                hs.iter()
                    .map(|h| HostPattern::Exact(h.clone(), None))
                    .collect()
            });
            Matcher {
                entry: slot,
                methods: 0,
                priority,
                tie: id_tie(id),
                paths,
                filters: Some(Box::new(Filters {
                    hosts,
                    program: Some(Arc::new(p)),
                    ..Default::default()
                })),
            }
        })
        .collect())
}

pub(super) fn compile(
    route: &Route,
    slot: u32,
    service: ServiceRef,
    order: u32,
    flavor: RouterFlavor,
) -> Result<Compiled, CompileError> {
    let mut grpc = 0;
    for p in route.protocols.iter() {
        match p {
            "grpc" => grpc |= GRPC,
            "grpcs" => grpc |= GRPCS,
            _ => {}
        }
    }
    // gRPC requests are HTTP/2 requests: a gRPC route is matched as an HTTP one, and the
    // proxy checks the request is gRPC afterwards (Kong's access phase).
    let accepts_http = grpc != 0 || route.protocols.iter().any(|p| p == "http" || p == "ws");
    let accepts_https = grpc != 0 || route.protocols.iter().any(|p| p == "https" || p == "wss");
    if (!accepts_http && !accepts_https) || service.is_some_and(|s| !s.1) {
        return Ok((None, Vec::new()));
    }
    let entry = RouteEntry {
        slot,
        service: service.map(|s| s.0 as u32),
        strip_path: route.strip_path,
        preserve_host: route.preserve_host,
        path_handling_v1: route.path_handling == turnpike_config::declarative::PathHandling::V1,
        accepts_http,
        accepts_https,
        https_redirect_status_code: route.https_redirect_status_code,
        grpc,
        request_buffering: route.request_buffering,
        response_buffering: route.response_buffering,
    };
    if flavor == RouterFlavor::Expressions {
        return Ok((Some(entry), compile_programs(route, slot)?));
    }
    let listed = route.methods.as_deref().unwrap_or_default();
    // Standard methods as bits; a route listing any other keeps them all as names.
    let bits = listed
        .iter()
        .map(|m| crate::method_bit(m))
        .try_fold(0, |acc, b| (b != 0).then_some(acc | b))
        .unwrap_or(0);
    let methods: Option<Vec<Box<str>>> = (bits == 0 && !listed.is_empty())
        .then(|| listed.iter().map(|s| s.as_str().into()).collect());
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
    let (headers, groups) = route_matchers(route)?;
    let filters = (methods.is_some() || hosts.is_some() || snis.is_some() || !headers.is_empty())
        .then(|| {
            Box::new(Filters {
                methods,
                hosts,
                headers,
                snis,
                program: None,
            })
        });
    let matchers = groups
        .into_iter()
        .map(|paths| Matcher {
            entry: slot,
            methods: bits,
            priority: priority(route, &paths),
            tie: match flavor {
                RouterFlavor::Traditional => created_tie(route.created_at, order),
                _ => id_tie(matcher_id(route, &paths)),
            },
            paths,
            filters: filters.clone(),
        })
        .collect();
    Ok((Some(entry), matchers))
}
