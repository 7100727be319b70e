//! proxy-cache (PRIORITY 100): serves cacheable responses from the node's memory, as Kong's
//! `handler.lua` does. The access phase computes Kong's cache key (`cache_key.rs`) and answers
//! a fresh entry itself (`X-Cache-Status: Hit`, `Age`); a miss goes upstream marked `Miss`
//! (or `Refresh` when the entry is too old for the client or for `cache_ttl`), and its
//! response, when its status, content type and Cache-Control allow, is copied into the
//! dictionary as it streams to the client. Requests that cannot be cached are marked `Bypass`.
//!
//! Beyond Kong: concurrent misses of one key make one upstream request (the others wait, up to
//! 5 s as nginx's `proxy_cache_lock`, then read the entry or go upstream themselves), and a
//! response larger than a quarter of the dictionary is not stored.

mod cache_key;
mod schema;
pub mod store;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use serde_json::Value;

use crate::{
    Access, AccessRequest, BodyFilter, BuildContext, Exit, Handler, PluginSpec, ResponseHead,
};
use store::{Dict, Entry, FetchGuard};

pub use store::State;

pub struct ProxyCache;

static X_CACHE_STATUS: HeaderName = HeaderName::from_static("x-cache-status");
static X_CACHE_KEY: HeaderName = HeaderName::from_static("x-cache-key");
static KONG_DEBUG: HeaderName = HeaderName::from_static("kong-debug");

/// How long a miss waits for another request's fetch of the same key.
const LOCK_TIMEOUT: Duration = Duration::from_secs(5);

/// A content type of `content_type`: `type/subtype` (either may be `*`) and parameters.
struct MimePattern {
    ty: String,
    subtype: String,
    params: Vec<(String, String)>,
}

/// Kong's `parse_mime_type`: type and subtype lowercased, parameters by name.
fn parse_mime(s: &str) -> Option<MimePattern> {
    let mut parts = s.split(';');
    let (ty, subtype) = parts.next()?.trim().split_once('/')?;
    let params = parts
        .filter_map(|p| {
            let (k, v) = p.split_once('=')?;
            Some((
                k.trim().to_ascii_lowercase(),
                v.trim().trim_matches('"').to_string(),
            ))
        })
        .collect();
    Some(MimePattern {
        ty: ty.trim().to_ascii_lowercase(),
        subtype: subtype.trim().to_ascii_lowercase(),
        params,
    })
}

impl MimePattern {
    fn matches(&self, actual: &MimePattern) -> bool {
        (self.ty == "*" || self.ty == actual.ty)
            && (self.subtype == "*" || self.subtype == actual.subtype)
            && self.params.len() == actual.params.len()
            && self
                .params
                .iter()
                .all(|(k, v)| actual.params.iter().any(|(ak, av)| ak == k && av == v))
    }
}

/// Cache-Control directives as Kong's `parse_directive_header` reads them: names lowercased,
/// a value a number when it reads as one.
#[derive(Default)]
struct Directives(Vec<(String, Option<String>)>);

impl Directives {
    fn parse<'a>(values: impl Iterator<Item = &'a HeaderValue>) -> Directives {
        let mut out = Vec::new();
        for v in values {
            for d in String::from_utf8_lossy(v.as_bytes()).split(',') {
                let d = d.trim_start();
                if d.is_empty() {
                    continue;
                }
                let (k, v) = match d.split_once('=') {
                    Some((k, v)) => (k, Some(v.trim().trim_matches('"').to_string())),
                    None => (d, None),
                };
                out.push((k.trim_end().to_ascii_lowercase(), v));
            }
        }
        Directives(out)
    }

    fn has(&self, name: &str) -> bool {
        self.0.iter().any(|(k, _)| k == name)
    }

    fn number(&self, name: &str) -> Option<f64> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.as_deref()?.parse().ok())
    }

    /// Kong's `calculate_resource_ttl`: s-maxage, max-age, or what Expires leaves; never
    /// below 0.
    fn resource_ttl(&self, headers: &HeaderMap, now: u64) -> u64 {
        let max_age = self.number("s-maxage").or_else(|| self.number("max-age"));
        let max_age = max_age.or_else(|| {
            let expires = headers.get_all(http::header::EXPIRES).iter().next_back()?;
            let t = httpdate::parse_http_date(expires.to_str().ok()?).ok()?;
            let secs = t.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs();
            Some(secs as f64 - now as f64)
        });
        max_age.map_or(0, |a| a.max(0.0) as u64)
    }
}

struct Configured {
    dict: Arc<Dict>,
    methods: Vec<String>,
    codes: Vec<u16>,
    content_types: Vec<MimePattern>,
    cache_ttl: u64,
    cache_control: bool,
    ignore_uri_case: bool,
    storage_ttl: Option<u64>,
    vary_query_params: Vec<String>,
    vary_headers: Vec<String>,
    show_age: bool,
    show_status: bool,
    show_key: bool,
    /// The largest response stored: a quarter of the dictionary.
    max_entry: usize,
}

/// A miss being fetched, from the access phase to the end of the response (Kong's
/// `kong.ctx.plugin.proxy_cache`).
struct Miss {
    /// The key's text, and Kong's key (its digest).
    text: Box<str>,
    key: String,
    debug: bool,
    /// A HEAD request: its response has no body (nor a body_filter phase) to wait for.
    head: bool,
    /// This request's fetch is the one others wait for.
    guard: Option<FetchGuard>,
}

impl Configured {
    fn header_shown(&self, shown: bool, debug: bool) -> bool {
        shown || debug
    }

    /// Kong's `cacheable_request`.
    fn cacheable_request(&self, req: &AccessRequest<'_>, cc: &Directives) -> bool {
        self.methods.iter().any(|m| m == req.method)
            && !(self.cache_control && (cc.has("no-store") || cc.has("no-cache")))
    }

    /// The cached response as the client gets it (Kong's hit: the stored headers but the
    /// hop-by-hop ones, `Age`, `X-Cache-Status: Hit`, `X-Cache-Key`).
    fn hit(&self, e: &Entry, debug: bool, now: u64) -> Exit {
        let mut headers: Vec<(HeaderName, HeaderValue)> = e.headers.clone();
        if self.header_shown(self.show_age, debug) {
            headers.push((
                http::header::AGE,
                HeaderValue::from(now.saturating_sub(e.timestamp)),
            ));
        }
        if self.header_shown(self.show_status, debug) {
            headers.push((X_CACHE_STATUS.clone(), HeaderValue::from_static("Hit")));
        }
        if self.header_shown(self.show_key, debug) {
            if let Ok(v) = HeaderValue::from_str(&e.key) {
                headers.push((X_CACHE_KEY.clone(), v));
            }
        }
        Exit {
            status: StatusCode::from_u16(e.status).unwrap_or(StatusCode::OK),
            headers,
            body: e.body.clone(),
        }
    }

    /// Whether a cached entry may answer this request (Kong's freshness checks).
    fn fresh(&self, e: &Entry, cc: &Directives, now: u64) -> bool {
        let age = now as f64 - e.timestamp as f64;
        if !self.cache_control {
            return age <= self.cache_ttl as f64;
        }
        let ttl = e.ttl as f64;
        !(cc.number("max-age").is_some_and(|m| age > m)
            || cc.number("max-stale").is_some_and(|m| age - ttl > m)
            || cc.number("min-fresh").is_some_and(|m| ttl - age < m))
    }

    /// The access phase after the look-up: a hit answers, anything else goes upstream marked.
    fn serve_or_fetch(
        self: &Arc<Self>,
        req: &mut AccessRequest<'_>,
        text: String,
        cc: &Directives,
        debug: bool,
        may_wait: bool,
    ) -> Access {
        let now = crate::now_secs();
        let status = match self.dict.get(&text) {
            Some(e) if self.fresh(&e, cc, now) => {
                return Access::Exit(self.hit(&e, debug, now));
            }
            Some(_) => "Refresh",
            None if self.cache_control && cc.has("only-if-cached") => {
                return Access::Exit(Exit {
                    status: StatusCode::GATEWAY_TIMEOUT,
                    headers: Vec::new(),
                    body: Bytes::new(),
                });
            }
            None => "Miss",
        };
        let guard = match self.dict.claim(&text) {
            Ok(g) => Some(g),
            Err(mut done) if may_wait => {
                // Another request is fetching this key: wait for it, then look again.
                let conf = self.clone();
                let cc = Directives(cc.0.clone());
                return Access::Wait(Box::pin(async move {
                    let _ = tokio::time::timeout(LOCK_TIMEOUT, done.changed()).await;
                    let resume: crate::Resume =
                        Box::new(move |req| conf.serve_or_fetch(req, text, &cc, debug, false));
                    resume
                }));
            }
            Err(_) => None,
        };
        let key = cache_key::digest(&text);
        if self.header_shown(self.show_status, debug) {
            req.response_headers
                .push((X_CACHE_STATUS.clone(), HeaderValue::from_static(status)));
        }
        if self.header_shown(self.show_key, debug) {
            if let Ok(v) = HeaderValue::from_str(&key) {
                req.response_headers.push((X_CACHE_KEY.clone(), v));
            }
        }
        let head = req.method == "HEAD";
        req.ctx.insert(Miss {
            text: text.into(),
            key,
            debug,
            head,
            guard,
        });
        Access::Continue
    }

    /// Kong's `cacheable_response`, and the ttl of what is stored.
    fn cacheable_response(&self, resp: &ResponseHead<'_>, now: u64) -> Option<u64> {
        if !self.codes.contains(&resp.status.as_u16()) {
            return None;
        }
        let mut types = resp.headers.get_all(http::header::CONTENT_TYPE).iter();
        let ct = types.next()?;
        if types.next().is_some() || ct.is_empty() {
            return None;
        }
        let actual = parse_mime(ct.to_str().ok()?)?;
        if !self.content_types.iter().any(|p| p.matches(&actual)) {
            return None;
        }
        if !self.cache_control {
            return Some(self.cache_ttl);
        }
        let cc = Directives::parse(resp.headers.get_all(http::header::CACHE_CONTROL).iter());
        if cc.has("private") || cc.has("no-store") || cc.has("no-cache") {
            return None;
        }
        let ttl = cc.resource_ttl(resp.headers, now);
        (ttl > 0).then_some(ttl)
    }
}

struct Handle(Arc<Configured>);

impl Handler for Handle {
    fn phases(&self) -> crate::Phases {
        crate::Phases::ACCESS | crate::Phases::RESPONSE
    }

    fn access(&self, req: &mut AccessRequest<'_>) -> Access {
        let conf = &self.0;
        let debug = req.headers.contains_key(&KONG_DEBUG);
        let cc = if conf.cache_control {
            Directives::parse(req.headers.get_all(http::header::CACHE_CONTROL).iter())
        } else {
            Directives::default()
        };
        if !conf.cacheable_request(req, &cc) {
            if conf.header_shown(conf.show_status, debug) {
                req.response_headers
                    .push((X_CACHE_STATUS.clone(), HeaderValue::from_static("Bypass")));
            }
            return Access::Continue;
        }
        let path_and_query;
        let target = if req.target.is_empty() {
            path_and_query = match req.query {
                Some(q) => format!("{}?{q}", req.path),
                None => req.path.to_string(),
            };
            &path_and_query
        } else {
            req.target
        };
        let text = cache_key::text(
            &cache_key::Request {
                consumer_id: req.consumer.as_deref().map(|c| c.consumer_id()),
                route_id: req.route_id,
                method: req.method,
                target,
                version: req.version,
                query: req.query,
                headers: req.headers,
            },
            conf.ignore_uri_case,
            &conf.vary_query_params,
            &conf.vary_headers,
        );
        conf.serve_or_fetch(req, text, &cc, debug, true)
    }

    fn header_filter(&self, resp: &mut ResponseHead<'_>) -> Option<Box<dyn BodyFilter>> {
        let conf = &self.0;
        // Not cacheable, or answered from the cache: nothing to do.
        let miss = resp.ctx.get_mut::<Miss>()?;
        let (text, key, debug, head, guard) = (
            std::mem::take(&mut miss.text),
            std::mem::take(&mut miss.key),
            miss.debug,
            miss.head,
            miss.guard.take(),
        );
        let now = crate::now_secs();
        let Some(ttl) = conf.cacheable_response(resp, now) else {
            if conf.header_shown(conf.show_status, debug) {
                resp.headers
                    .insert(X_CACHE_STATUS.clone(), HeaderValue::from_static("Bypass"));
            }
            return None;
        };
        let headers = resp
            .headers
            .iter()
            .filter(|(k, _)| stored_header(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut tee = Tee {
            dict: conf.dict.clone(),
            text,
            key,
            status: resp.status.as_u16(),
            headers,
            ttl,
            storage_ttl: conf.storage_ttl.unwrap_or(if conf.cache_control {
                ttl
            } else {
                conf.cache_ttl
            }),
            pieces: Vec::new(),
            len: 0,
            max: conf.max_entry,
            _guard: guard,
        };
        if head {
            // Stored now, with its empty body (Kong's body_filter sees just the end).
            tee.filter(Bytes::new(), true);
            return None;
        }
        Some(Box::new(tee))
    }
}

/// Whether a response header is kept with the cached response: not the hop-by-hop ones
/// (Content-Length is the body's own), not the rate-limit counts nor the cache's own, and
/// not Kong's per-request headers (a hit gets its own).
fn stored_header(k: &HeaderName) -> bool {
    let n = k.as_str();
    !matches!(
        n,
        "connection"
            | "keep-alive"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailers"
            | "transfer-encoding"
            | "upgrade"
            | "content-length"
            | "age"
            | "x-cache-status"
            | "x-cache-key"
            | "via"
    ) && !n.contains("ratelimit-remaining")
        && !n.starts_with("x-kong-")
}

/// Passes the body on untouched while keeping a copy (reference-counted pieces, no copy until
/// the end), stored in the dictionary when the body is complete.
struct Tee {
    dict: Arc<Dict>,
    text: Box<str>,
    key: String,
    status: u16,
    headers: Vec<(HeaderName, HeaderValue)>,
    ttl: u64,
    storage_ttl: u64,
    pieces: Vec<Bytes>,
    len: usize,
    max: usize,
    _guard: Option<FetchGuard>,
}

impl BodyFilter for Tee {
    fn filter(&mut self, piece: Bytes, eof: bool) -> Bytes {
        if self.len <= self.max {
            self.len += piece.len();
            self.pieces.push(piece.clone());
        }
        if eof && self.len <= self.max {
            let mut body = bytes::BytesMut::with_capacity(self.len);
            for p in self.pieces.drain(..) {
                body.extend_from_slice(&p);
            }
            self.dict.put(
                std::mem::take(&mut self.text),
                Entry {
                    key: std::mem::take(&mut self.key),
                    status: self.status,
                    headers: std::mem::take(&mut self.headers),
                    body: body.freeze(),
                    timestamp: crate::now_secs(),
                    ttl: self.ttl,
                    storage_ttl: self.storage_ttl,
                },
            );
        } else if self.len > self.max {
            self.pieces.clear();
        }
        piece
    }
}

impl PluginSpec for ProxyCache {
    fn name(&self) -> &'static str {
        "proxy-cache"
    }
    fn priority(&self) -> i32 {
        100
    }
    fn fields(&self) -> &'static [crate::schema::Field] {
        schema::FIELDS
    }
    fn entity_checks(&self, config: &Value) -> Vec<(String, String)> {
        schema::entity_checks(config)
    }
    fn runtime_checks(&self, config: &Value, runtime: &crate::Runtime) -> Vec<(String, String)> {
        let name = config["memory"]["dictionary_name"].as_str().unwrap_or("");
        if config["strategy"] == "memory" && !runtime.proxy_cache.exists(name) {
            return vec![("/@entity".into(), format!("missing shared dict '{name}'"))];
        }
        Vec::new()
    }
    fn build(&self, config: &Value, ctx: &BuildContext) -> Result<Arc<dyn Handler>, String> {
        let c: schema::Config = crate::registry::typed(config)?;
        let dict = ctx
            .runtime
            .proxy_cache
            .dict(&c.memory.dictionary_name)
            .ok_or_else(|| format!("missing shared dict '{}'", c.memory.dictionary_name))?;
        let size = ctx
            .runtime
            .proxy_cache
            .size(&c.memory.dictionary_name)
            .unwrap_or(0);
        Ok(Arc::new(Handle(Arc::new(Configured {
            dict,
            methods: c.request_method,
            codes: c.response_code,
            content_types: c
                .content_type
                .iter()
                .filter_map(|t| parse_mime(t))
                .collect(),
            cache_ttl: c.cache_ttl,
            cache_control: c.cache_control,
            ignore_uri_case: c.ignore_uri_case,
            storage_ttl: c.storage_ttl,
            vary_query_params: c.vary_query_params.unwrap_or_default(),
            vary_headers: c.vary_headers.unwrap_or_default(),
            show_age: c.response_headers.age,
            show_status: c.response_headers.x_cache_status,
            show_key: c.response_headers.x_cache_key,
            max_entry: (size / 4) as usize,
        }))))
    }
}

/// Kong's `api.lua`: `/proxy-cache` (DELETE: every entry of every proxy-cache config),
/// `/proxy-cache/{key}` (GET, DELETE: the entry in whichever config's dictionary holds it),
/// `/proxy-cache/{plugin_id}/caches/{key}` (GET, DELETE: in that config's). `plugins` are the
/// node's plugin entities; answers (status, body).
pub fn admin_api(
    state: &State,
    method: &str,
    path: &str,
    plugins: &[turnpike_config::declarative::Plugin],
) -> Option<(u16, Option<Value>)> {
    let rest = path.strip_prefix("/proxy-cache")?;
    let dict_of = |p: &turnpike_config::declarative::Plugin| {
        state.dict(p.config["memory"]["dictionary_name"].as_str()?)
    };
    let caches = || {
        plugins
            .iter()
            .filter(|p| p.name == "proxy-cache")
            .filter_map(dict_of)
    };
    let not_allowed = Some((
        405,
        Some(serde_json::json!({"message": "Method not allowed"})),
    ));
    let not_found = Some((404, Some(serde_json::json!({"message": "Not found"}))));
    let segments: Vec<&str> = rest.trim_start_matches('/').split('/').collect();
    match segments.as_slice() {
        [""] => match method {
            "DELETE" => {
                caches().for_each(|d| d.flush());
                Some((204, None))
            }
            _ => not_allowed,
        },
        [key] => {
            let found = caches().find_map(|d| d.get_by_key(key).map(|e| (d, e)));
            match (method, found) {
                ("GET", Some((_, e))) => Some((200, Some(e.to_json()))),
                ("DELETE", Some((d, _))) => {
                    d.purge(key);
                    Some((204, None))
                }
                ("GET" | "DELETE", None) => not_found,
                _ => not_allowed,
            }
        }
        [plugin_id, "caches", key] => {
            let Some(d) = plugins
                .iter()
                .find(|p| p.id == *plugin_id && p.name == "proxy-cache")
                .and_then(dict_of)
            else {
                return not_found;
            };
            match (method, d.get_by_key(key)) {
                ("GET", Some(e)) => Some((200, Some(e.to_json()))),
                ("DELETE", Some(_)) => {
                    d.purge(key);
                    Some((204, None))
                }
                ("GET" | "DELETE", None) => not_found,
                _ => not_allowed,
            }
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_types_match_as_kongs() {
        let p = |s| parse_mime(s).unwrap();
        assert!(p("application/json").matches(&p("Application/JSON")));
        assert!(p("text/*").matches(&p("text/html")));
        assert!(p("*/*").matches(&p("image/png")));
        // Parameters must be the same set.
        assert!(!p("application/json").matches(&p("application/json; charset=utf-8")));
        assert!(p("application/json; charset=utf-8").matches(&p("application/json;charset=utf-8")));
        assert!(parse_mime("nonsense").is_none());
    }

    #[test]
    fn directives_and_resource_ttl() {
        let v = [
            HeaderValue::from_static("public, Max-Age=60"),
            HeaderValue::from_static("s-maxage=30"),
        ];
        let cc = Directives::parse(v.iter());
        assert!(cc.has("public"));
        assert_eq!(cc.number("max-age"), Some(60.0));
        assert_eq!(cc.resource_ttl(&HeaderMap::new(), 0), 30);
        let mut h = HeaderMap::new();
        h.insert(
            http::header::EXPIRES,
            HeaderValue::from_static("Thu, 01 Jan 1970 00:01:40 GMT"),
        );
        assert_eq!(Directives::default().resource_ttl(&h, 40), 60);
        assert_eq!(Directives::default().resource_ttl(&h, 400), 0);
    }
}
