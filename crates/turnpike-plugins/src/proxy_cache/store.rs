//! The `memory` strategy: cached responses in a node-wide dictionary (Kong's
//! `lua_shared_dict`), shared by the node's workers and bounded by its size in bytes, each
//! entry kept for its storage ttl; and the misses in flight, so that concurrent misses of one
//! key make one upstream request.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use dashmap::DashMap;
use http::{HeaderName, HeaderValue};
use serde_json::{json, Map, Value};

/// Kong's `CACHE_VERSION`.
pub const CACHE_VERSION: u64 = 1;

/// A cached response (Kong's `res` table).
pub struct Entry {
    /// Kong's cache key (the digest of the text the dictionary finds it by).
    pub key: String,
    pub status: u16,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub body: Bytes,
    /// When it was stored (seconds since the epoch).
    pub timestamp: u64,
    /// How long it is fresh (`cache_ttl`, or the response's own max-age).
    pub ttl: u64,
    /// How long the dictionary keeps it.
    pub storage_ttl: u64,
}

impl Entry {
    /// Bytes it holds, for the dictionary's bound.
    fn weight(&self) -> u32 {
        let headers: usize = self
            .headers
            .iter()
            .map(|(k, v)| k.as_str().len() + v.len() + 64)
            .sum();
        (self.body.len() + headers + 160).min(u32::MAX as usize) as u32
    }

    /// As Kong's Admin API shows it (`GET /proxy-cache/{key}`).
    pub fn to_json(&self) -> Value {
        let mut headers = Map::new();
        for (k, v) in &self.headers {
            let v = Value::from(String::from_utf8_lossy(v.as_bytes()).into_owned());
            match headers.get_mut(k.as_str()) {
                Some(Value::Array(a)) => a.push(v),
                Some(old) => *old = Value::Array(vec![old.take(), v]),
                None => {
                    headers.insert(k.as_str().to_string(), v);
                }
            }
        }
        json!({
            "status": self.status,
            "headers": headers,
            "body": String::from_utf8_lossy(&self.body),
            "body_len": self.body.len(),
            "timestamp": self.timestamp,
            "ttl": self.ttl,
            "version": CACHE_VERSION,
        })
    }
}

struct StorageTtl;

impl moka::Expiry<Box<str>, Arc<Entry>> for StorageTtl {
    fn expire_after_create(
        &self,
        _key: &Box<str>,
        e: &Arc<Entry>,
        _now: std::time::Instant,
    ) -> Option<Duration> {
        Some(Duration::from_secs(e.storage_ttl))
    }
}

/// The key text's hasher: fast, with a seed of its own per process (a client chooses what
/// goes into the text).
type Hasher = foldhash::fast::RandomState;

/// One dictionary: entries by their key's text, and the text by Kong's key (its digest) for
/// the Admin API.
pub struct Dict {
    entries: moka::sync::Cache<Box<str>, Arc<Entry>, Hasher>,
    by_key: Arc<DashMap<String, Box<str>, Hasher>>,
    /// Keys whose miss is being fetched: waiters see the sender dropped when it is over.
    in_flight: DashMap<Box<str>, tokio::sync::watch::Receiver<()>, Hasher>,
}

impl Dict {
    fn new(bytes: u64) -> Dict {
        let by_key: Arc<DashMap<String, Box<str>, Hasher>> = Arc::default();
        let index = by_key.clone();
        Dict {
            entries: moka::sync::Cache::builder()
                .max_capacity(bytes)
                .weigher(|_, e: &Arc<Entry>| e.weight())
                .expire_after(StorageTtl)
                .eviction_listener(move |_, e: Arc<Entry>, cause| {
                    // A replaced entry had the same key, which now names the new one.
                    if cause != moka::notification::RemovalCause::Replaced {
                        index.remove(&e.key);
                    }
                })
                .build_with_hasher(Hasher::default()),
            by_key,
            in_flight: DashMap::default(),
        }
    }

    /// The entry for a key's text.
    pub fn get(&self, text: &str) -> Option<Arc<Entry>> {
        self.entries.get(text)
    }

    /// The entry for Kong's key.
    pub fn get_by_key(&self, key: &str) -> Option<Arc<Entry>> {
        let text = self.by_key.get(key)?.clone();
        self.entries.get(&text)
    }

    pub fn put(&self, text: Box<str>, e: Entry) {
        if e.storage_ttl > 0 {
            self.by_key.insert(e.key.clone(), text.clone());
            self.entries.insert(text, Arc::new(e));
        }
    }

    /// Removes the entry of Kong's key.
    pub fn purge(&self, key: &str) -> bool {
        let Some((_, text)) = self.by_key.remove(key) else {
            return false;
        };
        self.entries.remove(&text).is_some()
    }

    pub fn flush(&self) {
        self.entries.invalidate_all();
        self.by_key.clear();
    }

    /// Claims the fetch of `key`: `Ok` for the first asker (the claim ends when the guard is
    /// dropped), `Err` with what to wait on for the others.
    pub fn claim(
        self: &Arc<Self>,
        key: &str,
    ) -> Result<FetchGuard, tokio::sync::watch::Receiver<()>> {
        use dashmap::mapref::entry::Entry as E;
        match self.in_flight.entry(key.into()) {
            E::Occupied(o) => Err(o.get().clone()),
            E::Vacant(v) => {
                let (tx, rx) = tokio::sync::watch::channel(());
                v.insert(rx);
                Ok(FetchGuard {
                    dict: self.clone(),
                    key: key.into(),
                    _done: tx,
                })
            }
        }
    }
}

/// The one fetch of a key in flight; dropping it (stored, not cacheable, or the request
/// gone) lets the waiting requests go on.
pub struct FetchGuard {
    dict: Arc<Dict>,
    key: Box<str>,
    _done: tokio::sync::watch::Sender<()>,
}

impl Drop for FetchGuard {
    fn drop(&mut self) {
        self.dict.in_flight.remove(&*self.key);
    }
}

/// The node's dictionaries, by name: their sizes come from the properties at start
/// (`mem_cache_size` for Kong's `kong_db_cache`, `nginx_http_lua_shared_dict` for others);
/// each is made on first use and outlives config reloads, as nginx's shared memory does.
#[derive(Default)]
pub struct State {
    sizes: OnceLock<HashMap<String, u64>>,
    dicts: Mutex<HashMap<String, Arc<Dict>>>,
}

/// Kong's dictionaries when nothing is configured (`mem_cache_size`'s default).
fn default_sizes() -> HashMap<String, u64> {
    let mut m = HashMap::new();
    for name in ["kong_db_cache", "kong_core_db_cache"] {
        m.insert(name.to_string(), 128 << 20);
    }
    m.insert("kong".into(), 5 << 20);
    m
}

impl State {
    /// Sets the dictionaries (once, at start).
    pub fn configure(&self, sizes: impl IntoIterator<Item = (String, u64)>) {
        let _ = self.sizes.set(sizes.into_iter().collect());
    }

    fn sizes(&self) -> &HashMap<String, u64> {
        self.sizes.get_or_init(default_sizes)
    }

    pub fn exists(&self, name: &str) -> bool {
        self.sizes().contains_key(name)
    }

    /// A dictionary's size in bytes.
    pub fn size(&self, name: &str) -> Option<u64> {
        self.sizes().get(name).copied()
    }

    pub fn dict(&self, name: &str) -> Option<Arc<Dict>> {
        let size = *self.sizes().get(name)?;
        let mut m = self.dicts.lock().unwrap_or_else(|e| e.into_inner());
        Some(
            m.entry(name.to_string())
                .or_insert_with(|| Arc::new(Dict::new(size)))
                .clone(),
        )
    }

    /// The dictionaries made so far.
    pub fn made(&self) -> Vec<Arc<Dict>> {
        let m = self.dicts.lock().unwrap_or_else(|e| e.into_inner());
        m.values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(body: &str, storage_ttl: u64) -> Entry {
        Entry {
            key: format!("{:x}", body.len()),
            status: 200,
            headers: vec![(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain"),
            )],
            body: Bytes::copy_from_slice(body.as_bytes()),
            timestamp: 1,
            ttl: 300,
            storage_ttl,
        }
    }

    #[test]
    fn a_dictionary_holds_at_most_its_size() {
        let d = Dict::new(64 * 1024);
        for i in 0..100 {
            d.put(format!("k{i}").into(), entry(&"x".repeat(4096), 60));
        }
        d.entries.run_pending_tasks();
        assert!(d.entries.weighted_size() <= 64 * 1024);
        assert!(d.entries.entry_count() < 100);
    }

    #[test]
    fn entries_are_found_by_kongs_key_until_they_go() {
        let d = Dict::new(1 << 20);
        d.put("text-a".into(), entry("aaa", 60));
        assert_eq!(d.get("text-a").unwrap().body, "aaa");
        assert_eq!(d.get_by_key("3").unwrap().body, "aaa");
        // Replaced: still found by its key.
        d.put("text-a".into(), entry("bbb", 60));
        d.entries.run_pending_tasks();
        assert_eq!(d.get_by_key("3").unwrap().body, "bbb");
        assert!(d.purge("3"));
        assert!(d.get("text-a").is_none());
        assert!(!d.purge("3"));
        d.put("text-b".into(), entry("cc", 60));
        d.flush();
        d.entries.run_pending_tasks();
        assert!(d.get_by_key("2").is_none());
        assert!(d.by_key.is_empty());
    }

    #[test]
    fn one_claim_per_key_until_the_guard_goes() {
        let d = Arc::new(Dict::new(1 << 20));
        let g = d.claim("k").ok().unwrap();
        let mut rx = d.claim("k").err().unwrap();
        assert!(d.claim("other").is_ok());
        drop(g);
        // The waiter learns the fetch is over.
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        assert!(rt.block_on(rx.changed()).is_err());
        assert!(d.claim("k").is_ok());
    }

    #[test]
    fn unknown_dictionaries_are_none() {
        let s = State::default();
        s.configure([("my_cache".to_string(), 1 << 20)]);
        assert!(s.dict("my_cache").is_some());
        assert!(s.dict("kong_db_cache").is_none());
        assert!(Arc::ptr_eq(
            &s.dict("my_cache").unwrap(),
            &s.dict("my_cache").unwrap()
        ));
    }
}
