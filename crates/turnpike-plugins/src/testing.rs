//! A request for the plugins' unit tests.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};

use crate::*;

#[cfg(test)]
static REQUEST_ID: HeaderValue = HeaderValue::from_static("test-request-id");

#[cfg(test)]
/// A request for the plugins' unit tests: the parts `AccessRequest` borrows, owned here.
pub(crate) struct TestRequest {
    pub method: &'static str,
    pub path: &'static str,
    pub query: Option<&'static str>,
    /// The route's regex captures (`kong.request.get_uri_captures`).
    pub captures: Vec<(Option<String>, String)>,
    pub headers: HeaderMap,
    pub response_headers: Vec<(HeaderName, HeaderValue)>,
    pub client_ip: std::net::IpAddr,
    pub body: Option<Bytes>,
    pub ctx: PluginCtx,
    pub upstream: UpstreamRequest,
    /// The connection's peer is one of `trusted_ips`.
    pub trusted: bool,
}

#[cfg(test)]
impl TestRequest {
    pub fn new() -> TestRequest {
        TestRequest {
            method: "GET",
            path: "/",
            query: None,
            captures: Vec::new(),
            headers: HeaderMap::new(),
            response_headers: Vec::new(),
            client_ip: "127.0.0.1".parse().unwrap(),
            body: None,
            ctx: PluginCtx::default(),
            upstream: UpstreamRequest::default(),
            trusted: false,
        }
    }

    /// Runs `handler`'s access phase on this request, waits included.
    pub fn run(&mut self, handler: &dyn Handler) -> Access {
        self.run_full(handler).0
    }

    /// Runs `handler`'s access phase; also returns the consumer it set.
    pub fn run_full(&mut self, handler: &dyn Handler) -> (Access, Option<Arc<Identity>>) {
        let mut req = AccessRequest {
            body: self.body.clone(),
            route_id: "r",
            trusted: self.trusted,
            client_port: 54321,
            request_id: Some(&REQUEST_ID),
            started: Some(std::time::Instant::now()),
            captures: Some(&self.captures),
            ..AccessRequest::new(
                self.method,
                self.path,
                self.query,
                &mut self.headers,
                &mut self.response_headers,
                false,
                self.client_ip,
                &mut self.ctx,
                &mut self.upstream,
            )
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let outcome = match rt.block_on(run_access(handler, &mut req)) {
            Some(e) => Access::Exit(e),
            None => Access::Continue,
        };
        (outcome, req.consumer)
    }
}

/// Bytes the process's allocator holds now (glibc's count: what it handed out, chunk headers
/// included, the crypto library's own allocations too, and the large blocks it maps on their
/// own, a cache's arrays among them). Meaningful in a test run [`alone`], where no other test's
/// thread allocates meanwhile.
pub(crate) fn held() -> i64 {
    // SAFETY: mallinfo2 reads the allocator's counters; it takes no arguments.
    let m = unsafe { libc::mallinfo2() };
    (m.uordblks + m.hblkhd) as i64
}

/// The process's resident memory, once the allocator has handed back what it keeps free:
/// what the system counts against it. Meaningful in a test run [`alone`].
pub(crate) fn resident() -> i64 {
    // SAFETY: malloc_trim takes an integer and touches no memory of ours.
    unsafe { libc::malloc_trim(0) };
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: i64 = statm
        .split(' ')
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    // SAFETY: sysconf takes an integer.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as i64
}

/// Bytes the process keeps per call of `add` (for `i` in `range`), after `settle` on both
/// sides (a cache's pending bookkeeping). Run it [`alone`].
pub(crate) fn bytes_each(
    range: std::ops::Range<u64>,
    mut add: impl FnMut(u64),
    mut settle: impl FnMut(),
) -> f64 {
    let n = range.end - range.start;
    settle();
    let before = held();
    for i in range {
        add(i);
    }
    settle();
    (held() - before) as f64 / n as f64
}

/// Whether the calling test (`name`, its path from the crate root) should do its work here:
/// in the test run it starts itself again, alone, in a process of its own, and answers
/// `false` once that run passed; in that process it answers `true`. For counts that other
/// tests' threads would disturb.
pub(crate) fn alone(name: &str) -> bool {
    const ALONE: &str = "TURNPIKE_TEST_ALONE";
    if std::env::var_os(ALONE).is_some() {
        return true;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([name, "--exact", "--test-threads=1", "--nocapture"])
        .env(ALONE, "1")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{name}, alone: {text}");
    assert!(
        text.contains("1 passed"),
        "{name} did not run alone: {text}"
    );
    false
}

/// A store whose every look-up finds a credential of a consumer of its own (as a site's
/// credentials are): `fields(value)` as the row's fields, UUIDs as ids. Values end in 12 hex
/// digits, which make the ids.
pub(crate) struct Rows(pub fn(&str) -> serde_json::Map<String, serde_json::Value>);

impl crate::credentials::CredentialSource for Rows {
    fn find(&self, _: &'static str, _: &'static str, value: String) -> crate::credentials::Lookup {
        let fields = (self.0)(&value);
        Box::pin(async move {
            let n = &value[value.len() - 12..];
            Ok(Some(crate::credentials::Found {
                id: format!("0b5c8a3e-5d6f-4a8b-9c0d-{n}"),
                fields,
                consumer_id: format!("5d0e3b1a-2c4f-4e6d-8b9a-{n}"),
                username: Some(format!("consumer-{n}")),
                custom_id: None,
            }))
        })
    }
    fn write(&self, _: crate::credentials::Write) -> crate::credentials::Written {
        Box::pin(async { Ok(None) })
    }
}

/// A credential store of [`Rows`], for a cache with room for anything.
pub(crate) fn rows(
    fields: fn(&str) -> serde_json::Map<String, serde_json::Value>,
) -> Arc<crate::credentials::Store> {
    store(Arc::new(Rows(fields)), 1 << 40)
}

/// A credential store on `source`, its caches bounded at `max_bytes`.
pub(crate) fn store(
    source: Arc<dyn crate::credentials::CredentialSource>,
    max_bytes: u64,
) -> Arc<crate::credentials::Store> {
    let store = Arc::new(crate::credentials::Store::default());
    store.install(
        source,
        crate::credentials::CacheSettings {
            ttl: None,
            neg_ttl: None,
            max_bytes,
        },
    );
    store
}

/// The `i`th value the cache tests look up: 32 hex digits, spread over their range.
pub(crate) fn value_of(i: u64) -> String {
    format!("{:032x}", i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

/// Bytes an entry takes in `cache`: `n` values loaded (`load(prefix + value_of(i))`, awaited)
/// after 1,000, as [`bytes_each`] counts them. Run it [`alone`].
pub(crate) fn loaded_bytes_each<K, V, F: std::future::Future>(
    cache: &crate::credentials::Cache<K, V>,
    prefix: &str,
    n: u64,
    load: impl Fn(String) -> F,
) -> f64
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let load = |i: u64| {
        rt.block_on(load(format!("{prefix}{}", value_of(i))));
    };
    for i in 0..1_000 {
        load(i);
    }
    let each = bytes_each(1_000..1_000 + n, load, || {
        cache.len();
    });
    assert_eq!(cache.len(), 1_000 + n);
    each
}

/// Fills a cache bounded at `bound` bytes with far more credentials than fit (`load(value)`,
/// awaited, for 200,000 values) and checks that the process's resident memory grew by the
/// bound, within a tenth: the entries, the evicted keys the cache remembers, its arrays'
/// doubling, all of it (`len`: the entries cached, at least `at_least`). Run it [`alone`].
pub(crate) fn fills_to_its_bound<F: std::future::Future>(
    bound: u64,
    at_least: u64,
    len: impl Fn() -> u64,
    load: impl Fn(String) -> F,
) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let before = resident();
    for i in 0..200_000u64 {
        rt.block_on(load(value_of(i)));
    }
    let held = (resident() - before) as f64;
    let cached = len();
    assert!(cached >= at_least, "{cached} cached");
    assert!(
        held <= bound as f64 * 1.1 && held >= bound as f64 * 0.75,
        "{cached} cached in {held:.0} bytes, bound {bound}"
    );
}
