//! Kong's match cache (`kong/router/atc.lua`): a worker keeps the results of its last matches,
//! found and not found, keyed by the request fields the routes read, so a request like an
//! earlier one skips the match. Kong keeps two LRU caches of 5,000 entries a worker (matches and
//! misses apart, so a scan of unknown paths cannot evict the routes in use) and empties them
//! when the router is rebuilt; so does this one, when it meets a router other than the one its
//! entries came from.
//!
//! Only where a match costs more than the cache: a router whose matchers are all plain (hosts,
//! path prefixes, methods, exact headers: a few hash look-ups and compares) is asked directly,
//! as building the key and looking it up would cost as much. A regex path or header, or an ATC
//! expression, makes the router costly ([`KeyFields::costly`]).

use std::sync::{Arc, Weak};

use crate::{Match, RequestView, Router};

/// What [`Router::find_cached`] keeps of a match: the route's slot and what the match found
/// of the path.
#[derive(Clone)]
struct Hit {
    slot: u32,
    matched_len: Option<usize>,
    captures: Option<Vec<(Option<String>, String)>>,
}

/// Kong's `DEFAULT_MATCH_LRUCACHE_SIZE`, for matches and misses each.
pub const DEFAULT_SIZE: usize = 5000;

/// A worker's cache of matches (see the module's doc). Not shared between threads: each
/// worker owns one, as each of Kong's workers has its own lrucache.
pub struct MatchCache {
    /// The router the entries came from (held weakly: an old router's routes are freed when
    /// its snapshot goes, and the pointer cannot name a newer one while this is held).
    router: Weak<Router>,
    /// Made when a costly router is first asked: a worker behind plain routes holds none.
    caches: Option<Caches>,
    size: usize,
    key: Vec<u8>,
}

struct Caches {
    hits: quick_cache::unsync::Cache<Box<[u8]>, Hit>,
    misses: quick_cache::unsync::Cache<Box<[u8]>, ()>,
}

impl MatchCache {
    /// A cache of `size` matches and `size` misses.
    pub fn new(size: usize) -> Self {
        let size = size.max(1);
        MatchCache {
            router: Weak::new(),
            caches: None,
            size,
            key: Vec::new(),
        }
    }

    /// How many matches and misses it holds.
    pub fn len(&self) -> (usize, usize) {
        self.caches
            .as_ref()
            .map_or((0, 0), |c| (c.hits.len(), c.misses.len()))
    }

    pub fn is_empty(&self) -> bool {
        self.len() == (0, 0)
    }

    /// The caches for `router`: emptied when they hold another router's matches.
    fn serve(&mut self, router: &Arc<Router>) -> &mut Caches {
        if self.router.as_ptr() != Arc::as_ptr(router) || self.caches.is_none() {
            self.router = Arc::downgrade(router);
            self.caches = Some(Caches {
                hits: quick_cache::unsync::Cache::new(self.size),
                misses: quick_cache::unsync::Cache::new(self.size),
            });
        }
        self.caches.as_mut().expect("made above")
    }
}

impl Default for MatchCache {
    fn default() -> Self {
        MatchCache::new(DEFAULT_SIZE)
    }
}

/// The request fields a router's matchers read: what a cache key is made of. Learnt as
/// matchers are added; a route removed leaves its fields in (a key with a field no route
/// reads is still right, only less often shared) until the next full build.
#[derive(Debug, Clone, Default)]
pub(crate) struct KeyFields {
    /// Whether any matcher costs more than a cache look-up (see the module's doc).
    pub costly: bool,
    pub method: bool,
    /// The Host (as sent, port included) and the port the request reached.
    pub host: bool,
    pub path: bool,
    pub sni: bool,
    pub tls: bool,
    pub query: bool,
    pub src_ip: bool,
    pub src_port: bool,
    pub dst_ip: bool,
    /// Header names (lower case), each once.
    pub headers: Vec<http::HeaderName>,
}

impl KeyFields {
    pub fn header(&mut self, name: &http::HeaderName) {
        if !self.headers.contains(name) {
            self.headers.push(name.clone());
        }
    }

    /// Learns the fields an ATC field name reads (`http.headers.x_y` is the header `x-y`).
    pub fn atc_field(&mut self, field: &str) {
        match field {
            "http.method" => self.method = true,
            "http.host" | "net.dst.port" => self.host = true,
            "net.protocol" => self.tls = true,
            "tls.sni" => self.sni = true,
            "net.src.ip" => self.src_ip = true,
            "net.src.port" => self.src_port = true,
            "net.dst.ip" => self.dst_ip = true,
            f if f.starts_with("http.path") => self.path = true,
            f if f.starts_with("http.queries.") => self.query = true,
            f => {
                if let Some(name) = f.strip_prefix("http.headers.") {
                    if let Ok(n) = http::HeaderName::from_bytes(name.replace('_', "-").as_bytes()) {
                        self.header(&n);
                    }
                }
            }
        }
    }

    /// The key of `req`: each field read, in a fixed order, each preceded by its length, so
    /// that no two requests that differ in a field read share a key.
    fn key(&self, req: &RequestView, out: &mut Vec<u8>) {
        out.clear();
        let mut put = |s: &[u8]| {
            out.extend_from_slice(&(s.len() as u32).to_le_bytes());
            out.extend_from_slice(s);
        };
        if self.method {
            put(req.method.as_bytes());
        }
        if self.host {
            put(req.host.as_bytes());
            put(req.authority.as_bytes());
            put(&req.port.to_le_bytes());
        }
        if self.path {
            put(req.path.as_bytes());
        }
        if self.tls {
            put(&[req.tls as u8]);
        }
        if self.sni {
            match req.sni {
                Some(s) => put(s.as_bytes()),
                None => put(&[0xff]),
            }
        }
        if self.query {
            match req.query {
                Some(q) => put(q.as_bytes()),
                None => put(&[0xff]),
            }
        }
        if self.src_ip {
            put_ip(&mut put, req.peer.map(|p| p.ip()));
        }
        if self.src_port {
            put(&req.peer.map_or(u32::MAX, |p| p.port() as u32).to_le_bytes());
        }
        if self.dst_ip {
            put_ip(&mut put, req.local_ip);
        }
        for name in &self.headers {
            let mut n = 0u32;
            for v in req.headers.get_all(name) {
                put(v.as_bytes());
                n += 1;
            }
            put(&n.to_le_bytes());
        }
    }
}

fn put_ip(put: &mut impl FnMut(&[u8]), ip: Option<std::net::IpAddr>) {
    match ip {
        Some(std::net::IpAddr::V4(a)) => put(&a.octets()),
        Some(std::net::IpAddr::V6(a)) => put(&a.octets()),
        None => put(&[]),
    }
}

impl Router {
    /// [`Router::find`] through a worker's [`MatchCache`] (see the module's doc).
    /// Inline, so that a plain router's `find` stays inlined into the caller as it was
    /// without a cache (out of line it cost ~150 instructions a request more).
    #[inline]
    pub fn find_cached<'r>(
        self: &'r Arc<Router>,
        req: &RequestView,
        cache: &mut MatchCache,
    ) -> Option<Match<'r>> {
        if !self.keys.costly {
            return self.find(req);
        }
        self.find_through(req, cache)
    }

    #[inline(never)]
    fn find_through<'r>(
        self: &'r Arc<Router>,
        req: &RequestView,
        cache: &mut MatchCache,
    ) -> Option<Match<'r>> {
        let mut key = std::mem::take(&mut cache.key);
        self.keys.key(req, &mut key);
        let c = cache.serve(self);
        let found = if let Some(hit) = c.hits.get(key.as_slice()) {
            let hit = hit.clone();
            self.entry(hit.slot as usize).map(|route| Match {
                route,
                matched_len: hit.matched_len,
                captures: hit.captures,
            })
        } else if c.misses.get(key.as_slice()).is_some() {
            None
        } else {
            let found = self.find(req);
            let k: Box<[u8]> = key.as_slice().into();
            match &found {
                Some(m) => c.hits.insert(
                    k,
                    Hit {
                        slot: m.route.route_index() as u32,
                        matched_len: m.matched_len,
                        captures: m.captures.clone(),
                    },
                ),
                None => c.misses.insert(k, ()),
            }
            found
        };
        cache.key = key;
        found
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use http::HeaderMap;
    use serde_json::{json, Value};
    use turnpike_config::atc::RouterFlavor;
    use turnpike_config::declarative::load_str;

    use super::MatchCache;
    use crate::atc::tests::Flavored;
    use crate::{RequestView, Router};

    fn router(routes: Value, flavor: RouterFlavor) -> Arc<Router> {
        let doc = json!({"_format_version": "3.0",
            "services": [{"name": "s", "host": "up", "routes": routes}]});
        let cfg = load_str(&doc.to_string(), &Flavored(flavor)).unwrap();
        let mut problems = Vec::new();
        let r = Router::build_skipping(&cfg, flavor, &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        Arc::new(r)
    }

    fn find(r: &Arc<Router>, cache: &mut MatchCache, path: &str, h: &HeaderMap) -> Option<usize> {
        let view = RequestView::basic("GET", "a.test", 8000, path, h);
        r.find_cached(&view, cache).map(|m| m.route.route_index())
    }

    #[test]
    fn plain_routes_are_not_cached() {
        let r = router(
            json!([{"paths": ["/a"], "hosts": ["a.test"], "methods": ["GET"]}]),
            RouterFlavor::TraditionalCompatible,
        );
        let mut cache = MatchCache::default();
        let h = HeaderMap::new();
        assert_eq!(find(&r, &mut cache, "/a/b", &h), Some(0));
        assert_eq!(find(&r, &mut cache, "/x", &h), None);
        assert!(cache.is_empty());
        assert!(
            cache.caches.is_none(),
            "nothing allocated for a plain router"
        );
    }

    #[test]
    fn matches_and_misses_are_kept_apart_bounded_and_with_their_captures() {
        let r = router(
            json!([{"paths": ["~/users/(?<id>\\d+)$"]}]),
            RouterFlavor::TraditionalCompatible,
        );
        let mut cache = MatchCache::new(4);
        let h = HeaderMap::new();
        let view = RequestView::basic("GET", "a.test", 8000, "/users/42", &h);
        for _ in 0..2 {
            let m = r.find_cached(&view, &mut cache).unwrap();
            assert_eq!(m.matched_len, Some(9));
            let caps = m.captures.unwrap();
            assert!(caps.contains(&(Some("id".into()), "42".into())), "{caps:?}");
        }
        assert_eq!(cache.len(), (1, 0));
        assert_eq!(find(&r, &mut cache, "/nope", &h), None);
        assert_eq!(cache.len(), (1, 1));
        // A scan of unknown paths fills the misses, never evicts the matches beyond them.
        for i in 0..100 {
            assert_eq!(find(&r, &mut cache, &format!("/scan/{i}"), &h), None);
            assert_eq!(find(&r, &mut cache, &format!("/users/{i}"), &h), Some(0));
        }
        let (hits, misses) = cache.len();
        assert!(hits <= 4 && misses <= 4, "{hits} {misses}");
    }

    #[test]
    fn a_patched_router_is_not_answered_from_the_old_ones_entries() {
        let r = router(json!([{"paths": ["~/a$"]}]), RouterFlavor::Expressions);
        let mut cache = MatchCache::default();
        let h = HeaderMap::new();
        assert_eq!(find(&r, &mut cache, "/b", &h), None);
        assert_eq!(find(&r, &mut cache, "/a", &h), Some(0));
        assert_eq!(cache.len(), (1, 1));
        // The next snapshot's router: a route for /b added, the /a one removed.
        let mut next = (*r).clone();
        let doc = json!({"_format_version": "3.0", "services": [{"name": "s", "host": "up",
            "routes": [{"paths": ["~/b$"]}]}]});
        let cfg = load_str(&doc.to_string(), &Flavored(RouterFlavor::Expressions)).unwrap();
        let (slot, ok) = next.add(&cfg.routes[0], None);
        ok.unwrap();
        next.remove(0);
        let next = Arc::new(next);
        assert_eq!(find(&next, &mut cache, "/b", &h), Some(slot));
        assert_eq!(find(&next, &mut cache, "/a", &h), None);
        // The old router gone while the cache still names it: a new one is never mistaken
        // for it.
        drop(r);
        let again = router(json!([{"paths": ["~/c$"]}]), RouterFlavor::Expressions);
        assert_eq!(find(&again, &mut cache, "/c", &h), Some(0));
        assert_eq!(find(&next, &mut cache, "/c", &h), None);
    }

    #[test]
    fn the_key_holds_the_headers_queries_and_addresses_routes_read() {
        let r = router(
            json!([
                {"expression": "http.path == \"/t\" && http.headers.x_tenant == \"a\"", "priority": 3},
                {"expression": "http.path == \"/t\" && http.queries.v == \"2\"", "priority": 2},
                {"expression": "http.path == \"/t\" && net.src.ip in 10.0.0.0/8", "priority": 1},
            ]),
            RouterFlavor::Expressions,
        );
        let mut cache = MatchCache::default();
        let mut tenant = HeaderMap::new();
        tenant.insert("x-tenant", "a".parse().unwrap());
        let none = HeaderMap::new();
        let ask = |cache: &mut MatchCache, h: &HeaderMap, q: Option<&str>, src: &str| {
            let view = RequestView {
                query: q,
                peer: Some(src.parse().unwrap()),
                ..RequestView::basic("GET", "a.test", 8000, "/t", h)
            };
            r.find_cached(&view, cache).map(|m| m.route.route_index())
        };
        for _ in 0..2 {
            assert_eq!(ask(&mut cache, &tenant, None, "192.0.2.1:5"), Some(0));
            assert_eq!(ask(&mut cache, &none, Some("v=2"), "192.0.2.1:5"), Some(1));
            assert_eq!(ask(&mut cache, &none, Some("v=3"), "10.1.2.3:5"), Some(2));
            assert_eq!(ask(&mut cache, &none, Some("v=3"), "192.0.2.1:5"), None);
        }
        assert_eq!(cache.len(), (3, 1));
    }
}
