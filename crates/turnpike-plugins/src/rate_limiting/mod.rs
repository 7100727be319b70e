//! rate-limiting (PRIORITY 910): fixed calendar windows (second to year).
//!
//! Policies:
//! - `local`: counted per node, shared by all workers. Exact where Kong is not: Kong checks the
//!   count, lets the request through and increments afterwards, so concurrent requests
//!   overshoot the limit. Here taking a slot is one atomic compare-and-swap per window; a
//!   request that gets a slot in one window but not in a longer one gives the first back. The
//!   allowed count never exceeds the limit. Counters live outside the config snapshot (like
//!   Kong's shared dict), keyed like Kong's (`route:service:identifier:window start:period`),
//!   so config changes do not reset them.
//! - `redis`: counted in one Redis for all nodes, exactly (see `redis.rs`). When Redis fails and
//!   `fault_tolerant` is on, each node counts locally until Redis answers again.
//!   With `sync_rate > 0`, counted on the node and pushed to Redis periodically, with a
//!   documented overshoot bound (see `batched.rs`).
//! - `cluster`: counted in the node's database, exactly (see `cluster.rs`); the same fallback.

mod batched;
pub mod cluster;
pub(crate) mod redis;
pub(crate) mod schema;

use crate::now_secs;
use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use dashmap::DashMap;
use http::{HeaderName, HeaderValue, StatusCode};
use serde_json::Value;

use crate::{Access, AccessRequest, BuildContext, Exit, Handler, PluginSpec};

pub struct RateLimiting;

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) enum Period {
    Second,
    Minute,
    Hour,
    Day,
    Month,
    Year,
}

impl Period {
    pub(crate) const ALL: [Period; 6] = [
        Period::Second,
        Period::Minute,
        Period::Hour,
        Period::Day,
        Period::Month,
        Period::Year,
    ];

    pub(crate) fn name(self) -> &'static str {
        schema::PERIODS[self as usize]
    }

    /// (window start, window end) in seconds since the epoch, calendar-aligned in UTC.
    pub(crate) fn window(self, now: u64) -> (u64, u64) {
        match self {
            Period::Second => (now, now + 1),
            Period::Minute => (now - now % 60, now - now % 60 + 60),
            Period::Hour => (now - now % 3600, now - now % 3600 + 3600),
            Period::Day => (now - now % 86400, now - now % 86400 + 86400),
            // Calendar windows cost date arithmetic: the last one is reused while it lasts.
            Period::Month | Period::Year => CALENDAR_WINDOW.with(|cache| {
                let slot = &cache[(self == Period::Year) as usize];
                let (start, end) = slot.get();
                if start <= now && now < end {
                    return (start, end);
                }
                let w = self.calendar_window(now);
                slot.set(w);
                w
            }),
        }
    }

    fn calendar_window(self, now: u64) -> (u64, u64) {
        match self {
            Period::Month => {
                let (y, m) = year_month(now);
                (
                    month_start(y, m),
                    if m == 12 {
                        month_start(y + 1, 1)
                    } else {
                        month_start(y, m + 1)
                    },
                )
            }
            _ => {
                let (y, _) = year_month(now);
                (month_start(y, 1), month_start(y + 1, 1))
            }
        }
    }
}

thread_local! {
    /// This thread's last month and year windows (start, end).
    static CALENDAR_WINDOW: [std::cell::Cell<(u64, u64)>; 2] =
        const { [std::cell::Cell::new((0, 0)), std::cell::Cell::new((0, 0))] };
}

/// Days since the epoch for a civil date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: u64, d: u64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = m as i64;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146097 + doe - 719468
}

fn month_start(y: i64, m: u64) -> u64 {
    (days_from_civil(y, m, 1) * 86400) as u64
}

fn year_month(now: u64) -> (i64, u64) {
    let z = (now / 86400) as i64 + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u64;
    let y = yoe + era * 400 + if m <= 2 { 1 } else { 0 };
    (y, m)
}

/// The node's counters: Kong's `kong_rate_limiting_counters` shared dict.
/// FxHash: the keys are ours (ids and window numbers), not attacker-chosen bulk input, and
/// SipHash over ~120 bytes per request showed in the profile.
/// Keys are bytes: route id, service id and identifier (separated by 0x1f), then the window's
/// end (8 bytes) and its period (1 byte) — built without formatting numbers.
type Counters = DashMap<Box<[u8]>, Arc<AtomicU64>, rustc_hash::FxBuildHasher>;

/// rate-limiting's part of the node's [`crate::Runtime`]: the local policy's counters, the
/// batched policy's, the cluster policy's database, and whether Redis answers.
#[derive(Default)]
pub struct State {
    counters: Counters,
    last_sweep: AtomicU64,
    batches: Arc<batched::Batches>,
    /// The cluster policy's database (installed on a database node at start).
    pub cluster: cluster::Cluster,
    /// Whether the last Redis count failed.
    redis_down: std::sync::atomic::AtomicBool,
}

static RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("ratelimit-limit");
static RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("ratelimit-remaining");
static RATELIMIT_RESET: HeaderName = HeaderName::from_static("ratelimit-reset");

thread_local! {
    /// A Redis key being built (batched policy), reused by each worker thread.
    static KEY_TEXT: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
    /// The counter key being built, reused by each worker thread.
    static KEY: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(Vec::with_capacity(192));
}

/// Drops counters of windows that have ended (called now and then, not per request).
fn sweep(counters: &Counters, now: u64) {
    counters.retain(|k, _| {
        k.len() < 9 || {
            let end = &k[k.len() - 9..k.len() - 1];
            u64::from_le_bytes(end.try_into().unwrap_or([0; 8])) > now
        }
    });
}

#[derive(Clone, Copy)]
enum LimitBy {
    Consumer,
    Credential,
    Ip,
    Service,
    Header,
    Path,
}

/// Where the counters are.
enum Policy {
    Local,
    Redis(Arc<redis::RedisTarget>),
    /// Redis with `sync_rate > 0`.
    Batched(Arc<redis::RedisTarget>, std::time::Duration),
    Cluster,
}

/// The handler: its settings are shared with the continuation of a request waiting on Redis.
struct Limiter(Arc<Configured>);

struct Configured {
    state: Arc<State>,
    policy: Policy,
    fault_tolerant: bool,
    /// (period, limit, its X-RateLimit-Limit-* header and value, X-RateLimit-Remaining-*).
    limits: Vec<(Period, u64, HeaderName, HeaderValue, HeaderName)>,
    limit_by: LimitBy,
    header_name: Option<HeaderName>,
    path: Option<String>,
    hide_headers: bool,
    error_code: StatusCode,
    error_message: String,
}

impl PluginSpec for RateLimiting {
    fn name(&self) -> &'static str {
        "rate-limiting"
    }
    fn priority(&self) -> i32 {
        910
    }
    /// Kong's `protocols = typedefs.protocols_http`.
    fn http_only(&self) -> bool {
        true
    }
    fn fields(&self) -> &'static [crate::schema::Field] {
        schema::FIELDS
    }
    fn shorthand_fields(&self) -> &'static [crate::schema::Shorthand] {
        schema::SHORTHANDS
    }
    fn entity_checks(&self, config: &Value) -> Vec<(String, String)> {
        schema::entity_checks(config)
    }
    fn build(&self, config: &Value, ctx: &BuildContext) -> Result<Arc<dyn Handler>, String> {
        Ok(Arc::new(Limiter(Arc::new(configure(
            config,
            ctx.runtime.rate_limiting.clone(),
        )?))))
    }

    fn shorthands(&self, config: &mut Value) {
        schema::shorthands(config)
    }

    fn needs_database(&self, config: &Value) -> Option<(String, String)> {
        (config["policy"].as_str() == Some("cluster")).then(|| {
            (
                "policy".to_string(),
                "policy 'cluster' needs a database and is not supported in DB-less mode; use \
                 'local' or 'redis'"
                    .to_string(),
            )
        })
    }
}

/// X-RateLimit-Limit-<period> and X-RateLimit-Remaining-<period>, by period. Static names:
/// cloning one per response is a copy, where a name built at config time costs a reference
/// count update on clone and on drop.
static X_RATELIMIT_LIMIT: [HeaderName; 6] = [
    HeaderName::from_static("x-ratelimit-limit-second"),
    HeaderName::from_static("x-ratelimit-limit-minute"),
    HeaderName::from_static("x-ratelimit-limit-hour"),
    HeaderName::from_static("x-ratelimit-limit-day"),
    HeaderName::from_static("x-ratelimit-limit-month"),
    HeaderName::from_static("x-ratelimit-limit-year"),
];
static X_RATELIMIT_REMAINING: [HeaderName; 6] = [
    HeaderName::from_static("x-ratelimit-remaining-second"),
    HeaderName::from_static("x-ratelimit-remaining-minute"),
    HeaderName::from_static("x-ratelimit-remaining-hour"),
    HeaderName::from_static("x-ratelimit-remaining-day"),
    HeaderName::from_static("x-ratelimit-remaining-month"),
    HeaderName::from_static("x-ratelimit-remaining-year"),
];

/// Precomputes a validated config: header names and values, the policy's target.
fn configure(config: &Value, state: Arc<State>) -> Result<Configured, String> {
    let c: schema::Config = crate::typed(config)?;
    let limits = Period::ALL
        .iter()
        .filter_map(|p| {
            let v = c.limit(p.name())?;
            let limit = v.floor().max(0.0) as u64;
            Some((
                *p,
                limit,
                X_RATELIMIT_LIMIT[*p as usize].clone(),
                HeaderValue::from(limit),
                X_RATELIMIT_REMAINING[*p as usize].clone(),
            ))
        })
        .collect();
    let limit_by = match c.limit_by.as_str() {
        "credential" => LimitBy::Credential,
        "ip" => LimitBy::Ip,
        "service" => LimitBy::Service,
        "header" => LimitBy::Header,
        "path" => LimitBy::Path,
        _ => LimitBy::Consumer,
    };
    let policy = match c.policy.as_str() {
        "redis" => {
            let target = Arc::new(redis::RedisTarget::from_config(&c.redis)?);
            if c.sync_rate > 0.0 {
                Policy::Batched(target, std::time::Duration::from_secs_f64(c.sync_rate))
            } else {
                Policy::Redis(target)
            }
        }
        "cluster" => Policy::Cluster,
        _ => Policy::Local,
    };
    Ok(Configured {
        state,
        policy,
        fault_tolerant: c.fault_tolerant,
        limits,
        limit_by,
        header_name: c
            .header_name
            .as_deref()
            .and_then(|h| HeaderName::from_bytes(h.as_bytes()).ok()),
        path: c.path,
        hide_headers: c.hide_client_headers,
        error_code: StatusCode::from_u16(c.error_code).map_err(|e| e.to_string())?,
        error_message: c.error_message,
    })
}

impl Configured {
    /// Kong's identifier: the chosen entity's id, falling back to the client IP. Written into
    /// `out` (no allocation in the common case).
    /// The identifier as bytes, for this node's counters (an IP as its 4 or 16 bytes).
    fn identifier_bytes(&self, req: &AccessRequest<'_>, out: &mut Vec<u8>) {
        match self.identifier_str(req) {
            Some(s) => out.extend_from_slice(s.as_bytes()),
            None => match req.client_ip {
                std::net::IpAddr::V4(a) => out.extend_from_slice(&a.octets()),
                std::net::IpAddr::V6(a) => out.extend_from_slice(&a.octets()),
            },
        }
    }

    /// The chosen entity's id; `None`: the client IP.
    fn identifier_str<'r>(&self, req: &'r AccessRequest<'_>) -> Option<Cow<'r, str>> {
        let who = req.consumer.as_deref();
        match self.limit_by {
            LimitBy::Consumer => who.map(|c| Cow::Borrowed(c.consumer_id())),
            LimitBy::Credential => who.and_then(|c| c.credential_id()).map(Cow::Borrowed),
            LimitBy::Ip => None,
            LimitBy::Service => req.service_id.map(Cow::Borrowed),
            // An identity header (`X-Consumer-ID`) is built per request: owned.
            LimitBy::Header => match req.header(self.header_name.as_ref()?)? {
                Cow::Borrowed(v) => v.to_str().ok().map(Cow::Borrowed),
                Cow::Owned(v) => v.to_str().ok().map(|s| Cow::Owned(s.to_string())),
            },
            LimitBy::Path => Some(Cow::Borrowed(req.path)),
        }
    }

    /// The identifier as Kong writes it in its counter keys (the client IP in text).
    fn identifier(&self, req: &AccessRequest<'_>, out: &mut String) {
        use std::fmt::Write;
        match self.identifier_str(req) {
            Some(s) => out.push_str(&s),
            None => {
                let _ = write!(out, "{}", req.client_ip);
            }
        }
    }
}

/// Whether a shared store's answer for `windows` windows is well formed: `[0, one count per
/// window]` when allowed, `[b, counts up to window b]` when window `b` blocked.
pub(crate) fn answer_is_complete(a: &[i64], windows: usize) -> bool {
    match a.first() {
        Some(0) => a.len() == windows + 1,
        Some(&b) => b >= 1 && (b as usize) <= windows && a.len() > b as usize,
        None => false,
    }
}

thread_local! {
    /// The last RateLimit-Reset value formatted by this worker.
    static RESET: std::cell::RefCell<(u64, HeaderValue)> =
        const { std::cell::RefCell::new((0, HeaderValue::from_static("0"))) };
}

/// RateLimit-Reset's value, formatted again only when it changes.
fn reset_value(reset: u64) -> HeaderValue {
    RESET.with_borrow_mut(|(n, v)| {
        if *n != reset {
            *n = reset;
            *v = HeaderValue::from(reset);
        }
        v.clone()
    })
}

/// Takes one slot of `limit` in `counter`; false when the window is full.
fn take(counter: &AtomicU64, limit: u64) -> bool {
    counter
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < limit).then_some(n + 1)
        })
        .is_ok()
}

/// What the counters said about a request.
struct Decision {
    /// How many configured windows were looked at (all, or up to the one that blocked).
    seen: usize,
    /// Remaining count per configured window, for the response headers.
    remaining: [u64; 6],
    /// Seconds until the blocking window ends, when one did.
    blocked: Option<u64>,
    /// (limit, remaining, reset) of the most constraining window, for RateLimit-*.
    tightest: Option<(u64, u64, u64)>,
}

impl Configured {
    /// Whether this config applies to the request (`limit_by = path` limits one path).
    fn applies(&self, req: &AccessRequest<'_>) -> bool {
        match (self.limit_by, &self.path) {
            (LimitBy::Path, Some(p)) => req.path == p,
            _ => true,
        }
    }

    /// Counts the request in this node's counters.
    fn decide_local(&self, req: &AccessRequest<'_>, now: u64) -> Decision {
        // Ended windows are dropped at most once a minute.
        let state = &*self.state;
        let last = state.last_sweep.load(Ordering::Relaxed);
        if now >= last + 60
            && state
                .last_sweep
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            sweep(&state.counters, now);
        }
        const NONE: Option<Arc<AtomicU64>> = None;
        let mut taken = [NONE; 6];
        let mut d = Decision {
            seen: 0,
            remaining: [0; 6],
            blocked: None,
            tightest: None,
        };
        KEY.with_borrow_mut(|key| {
            key.clear();
            key.extend_from_slice(req.route_id.as_bytes());
            key.push(0x1f);
            key.extend_from_slice(req.service_id.unwrap_or("").as_bytes());
            key.push(0x1f);
            self.identifier_bytes(req, key);
            key.push(0x1f);
            let base = key.len();
            for (i, (period, limit, _, _, _)) in self.limits.iter().enumerate() {
                let (_, end) = period.window(now);
                key.truncate(base);
                key.extend_from_slice(&end.to_le_bytes());
                key.push(*period as u8);
                // A shared read lock on one shard in the common case; the write lock (and the
                // key's allocation) only for a window's first request.
                let counter = match state.counters.get(key.as_slice()) {
                    Some(c) => c.clone(),
                    None => state
                        .counters
                        .entry(key.clone().into_boxed_slice())
                        .or_default()
                        .clone(),
                };
                d.seen = i + 1;
                if take(&counter, *limit) {
                    d.remaining[i] = limit - counter.load(Ordering::Acquire).min(*limit);
                    if d.tightest.is_none_or(|t| d.remaining[i] < t.1) {
                        d.tightest = Some((*limit, d.remaining[i], end - now));
                    }
                    taken[i] = Some(counter);
                } else {
                    d.blocked = Some(end - now);
                    d.tightest = Some((*limit, 0, end - now));
                    break;
                }
            }
        });
        if d.blocked.is_some() {
            // Give back what this request took in the other windows.
            for c in taken.iter().flatten() {
                c.fetch_sub(1, Ordering::AcqRel);
            }
        }
        d
    }

    /// The Redis keys (Kong's) and script arguments (limit, expiry per window) for a request.
    fn redis_keys(&self, req: &AccessRequest<'_>, now: u64) -> (Vec<String>, Vec<u64>) {
        let mut keys = Vec::with_capacity(self.limits.len());
        let mut args = Vec::with_capacity(self.limits.len() * 2);
        for (period, limit, _, _, _) in &self.limits {
            let mut key = String::new();
            self.redis_key(req, now, *period, &mut key);
            keys.push(key);
            // A second past the window's end: clocks of nodes and Redis differ a little.
            args.extend([*limit, period.window(now).1 + 1]);
        }
        (keys, args)
    }

    /// Kong's Redis key of one window, written into `out`.
    fn redis_key(&self, req: &AccessRequest<'_>, now: u64, period: Period, out: &mut String) {
        use std::fmt::Write;
        out.clear();
        let _ = write!(
            out,
            "ratelimit:{}:{}:",
            req.route_id,
            req.service_id.unwrap_or("")
        );
        self.identifier(req, out);
        let _ = write!(out, ":{}:{}", period.window(now).0 * 1000, period.name());
    }

    /// Counts the request on this node's batched counters (pushed to Redis periodically).
    fn decide_batched(
        &self,
        req: &AccessRequest<'_>,
        now: u64,
        target: &Arc<redis::RedisTarget>,
        rate: std::time::Duration,
    ) -> Decision {
        let mut d = Decision {
            seen: 0,
            remaining: [0; 6],
            blocked: None,
            tightest: None,
        };
        let mut taken = Vec::with_capacity(self.limits.len());
        // The key is written into this worker's buffer: a counter's key is only copied when
        // its window is first seen.
        let mut key = String::new();
        KEY_TEXT.with_borrow_mut(|buf| std::mem::swap(buf, &mut key));
        for (i, (period, limit, _, _, _)) in self.limits.iter().enumerate() {
            let (_, end) = period.window(now);
            self.redis_key(req, now, *period, &mut key);
            let c = batched::counter(&self.state.batches, &key, *limit, end, target, rate);
            d.seen = i + 1;
            if c.take() {
                d.remaining[i] = limit.saturating_sub(c.used());
                if d.tightest.is_none_or(|t| d.remaining[i] < t.1) {
                    d.tightest = Some((*limit, d.remaining[i], end - now));
                }
                taken.push(c);
            } else {
                d.blocked = Some(end - now);
                d.tightest = Some((*limit, 0, end - now));
                break;
            }
        }
        if d.blocked.is_some() {
            for c in taken {
                c.give_back();
            }
        }
        KEY_TEXT.with_borrow_mut(|buf| *buf = key);
        d
    }

    /// The windows of a request for the cluster policy (Kong's `ratelimiting_metrics` rows).
    fn cluster_windows(&self, req: &AccessRequest<'_>, now: u64) -> Vec<cluster::Window> {
        let mut id = String::new();
        self.identifier(req, &mut id);
        self.limits
            .iter()
            .map(|(period, limit, _, _, _)| {
                let (start, end) = period.window(now);
                cluster::Window {
                    route_id: req.route_id.to_string(),
                    service_id: req.service_id.unwrap_or("").to_string(),
                    identifier: id.clone(),
                    period: period.name(),
                    period_date: (start * 1000) as i64,
                    limit: (*limit).min(i64::MAX as u64) as i64,
                    expire_at: end as i64,
                }
            })
            .collect()
    }

    /// Turns the script's answer into a decision.
    fn decide_from_redis(&self, answer: &[i64], now: u64) -> Decision {
        let blocked_at = answer[0] as usize;
        let mut d = Decision {
            seen: 0,
            remaining: [0; 6],
            blocked: None,
            tightest: None,
        };
        for (i, (period, limit, _, _, _)) in self.limits.iter().enumerate() {
            let (_, end) = period.window(now);
            let count = answer[i + 1].max(0) as u64;
            d.seen = i + 1;
            if blocked_at == i + 1 {
                d.blocked = Some(end - now);
                d.tightest = Some((*limit, 0, end - now));
                break;
            }
            // Allowed: the count includes this request. Blocked later: it was not counted.
            let used = if blocked_at == 0 { count } else { count + 1 };
            d.remaining[i] = limit.saturating_sub(used);
            if d.tightest.is_none_or(|t| d.remaining[i] < t.1) {
                d.tightest = Some((*limit, d.remaining[i], end - now));
            }
        }
        d
    }

    /// Writes the headers and answers as the decision says.
    fn respond(&self, req: &mut AccessRequest<'_>, d: Decision) -> Access {
        if !self.hide_headers {
            let out = &mut *req.response_headers;
            out.reserve(d.seen * 2 + 3);
            // Each number is formatted (and allocated) once: RateLimit-Limit and -Remaining
            // repeat a window's values, and the reset only changes once a second.
            let mut tight_values: Option<(HeaderValue, HeaderValue)> = None;
            for (i, (_, limit, lh, lv, rh)) in self.limits.iter().enumerate().take(d.seen) {
                let left = HeaderValue::from(d.remaining[i]);
                if tight_values.is_none()
                    && d.tightest
                        .is_some_and(|t| t.0 == *limit && t.1 == d.remaining[i])
                {
                    tight_values = Some((lv.clone(), left.clone()));
                }
                out.push((lh.clone(), lv.clone()));
                out.push((rh.clone(), left));
            }
            if let Some((limit, left, reset)) = d.tightest {
                let (lv, rv) = tight_values
                    .unwrap_or_else(|| (HeaderValue::from(limit), HeaderValue::from(left)));
                out.push((RATELIMIT_LIMIT.clone(), lv));
                out.push((RATELIMIT_REMAINING.clone(), rv));
                out.push((RATELIMIT_RESET.clone(), reset_value(reset)));
            }
        }
        match d.blocked {
            None => Access::Continue,
            Some(retry) => {
                let mut e = Exit::message(self.error_code, &self.error_message);
                e.headers
                    .push((http::header::RETRY_AFTER, HeaderValue::from(retry)));
                Access::Exit(e)
            }
        }
    }
}

impl Limiter {
    /// Waits for a shared store's answer (`[blocked window or 0, counts...]`), then decides;
    /// a failed store falls back to this node's counters when `fault_tolerant`.
    fn wait_for(
        conf: Arc<Configured>,
        now: u64,
        answer: impl std::future::Future<Output = Result<Vec<i64>, String>> + 'static,
    ) -> Access {
        Access::Wait(Box::pin(async move {
            let answer = answer.await;
            let resume: crate::Resume = Box::new(move |req| match answer {
                Ok(a) if answer_is_complete(&a, conf.limits.len()) => {
                    let d = conf.decide_from_redis(&a, now);
                    conf.respond(req, d)
                }
                // Kong's fault_tolerant: the store failing must not stop traffic; we still
                // limit, per node.
                _ if conf.fault_tolerant => {
                    let d = conf.decide_local(req, now);
                    conf.respond(req, d)
                }
                _ => Access::Exit(Exit::message(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "An unexpected error occurred",
                )),
            });
            resume
        }))
    }
}

impl Handler for Limiter {
    fn phases(&self) -> crate::Phases {
        crate::Phases::ACCESS
    }
    fn access(&self, req: &mut AccessRequest<'_>) -> Access {
        let conf = &self.0;
        if !conf.applies(req) {
            return Access::Continue;
        }
        let now = now_secs();
        match &conf.policy {
            Policy::Local => {
                let d = conf.decide_local(req, now);
                conf.respond(req, d)
            }
            Policy::Redis(target) => {
                let (keys, args) = conf.redis_keys(req, now);
                let target = target.clone();
                let state = conf.state.clone();
                Self::wait_for(self.0.clone(), now, async move {
                    redis::count(&target, &keys, &args, &state.redis_down).await
                })
            }
            Policy::Cluster => {
                let windows = conf.cluster_windows(req, now);
                let state = conf.state.clone();
                Self::wait_for(self.0.clone(), now, async move {
                    state.cluster.count(windows).await
                })
            }
            Policy::Batched(target, rate) => {
                let d = conf.decide_batched(req, now, target, *rate);
                conf.respond(req, d)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calendar_windows() {
        // 2026-11-21T23:59:59Z
        let t = 1_795_305_599;
        assert_eq!(year_month(t), (2026, 11));
        assert_eq!(Period::Day.window(t), (1_795_219_200, 1_795_305_600));
        assert_eq!(Period::Month.window(t).0, month_start(2026, 11));
        assert_eq!(Period::Month.window(t).1, month_start(2026, 12));
        assert_eq!(
            Period::Year.window(t),
            (month_start(2026, 1), month_start(2027, 1))
        );
        assert_eq!(month_start(1970, 1), 0);
        assert_eq!(month_start(2000, 3), 951_868_800);
        assert_eq!(Period::Minute.window(t), (t - 59, t + 1));
    }

    #[test]
    fn cached_calendar_windows_move_on_at_their_end() {
        // The last second of 2026, then the first of 2027, then back (a clock set back).
        let last = month_start(2027, 1) - 1;
        for t in [
            last,
            last + 1,
            last,
            month_start(2026, 12),
            last + 86_400 * 40,
        ] {
            assert_eq!(
                Period::Month.window(t),
                Period::Month.calendar_window(t),
                "{t}"
            );
            assert_eq!(
                Period::Year.window(t),
                Period::Year.calendar_window(t),
                "{t}"
            );
        }
        assert_eq!(Period::Year.window(last + 1).0, month_start(2027, 1));
        assert_eq!(
            Period::Month.window(last + 86_400 * 40).0,
            month_start(2027, 2)
        );
    }

    #[test]
    fn static_header_names_follow_the_period_order() {
        for p in Period::ALL {
            assert_eq!(
                X_RATELIMIT_LIMIT[p as usize].as_str(),
                format!("x-ratelimit-limit-{}", p.name())
            );
            assert_eq!(
                X_RATELIMIT_REMAINING[p as usize].as_str(),
                format!("x-ratelimit-remaining-{}", p.name())
            );
        }
    }

    #[test]
    fn the_coarse_clock_is_the_real_time() {
        let precise = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let coarse = now_secs();
        assert!(
            coarse + 1 >= precise && coarse <= precise + 1,
            "{coarse} vs {precise}"
        );
    }

    #[test]
    fn redis_answers_become_headers_and_decisions() {
        let full = crate::schema::validate(
            schema::FIELDS,
            &serde_json::json!({"second": 5, "minute": 10, "policy": "redis", "redis": {"host": "h"}}),
        )
        .unwrap();
        let conf = configure(&full, Arc::default()).unwrap();
        assert!(matches!(&conf.policy, Policy::Redis(t) if t.host == "h" && t.port == 6379));
        let t = 1_795_305_599;
        // Allowed: counts include the request.
        let d = conf.decide_from_redis(&[0, 2, 7], t);
        assert_eq!((d.seen, d.blocked), (2, None));
        assert_eq!(&d.remaining[..2], &[3, 3]);
        assert_eq!(d.tightest, Some((5, 3, 1)));
        // Blocked by the minute window: the second's count was read, not incremented.
        let d = conf.decide_from_redis(&[2, 1, 10], t);
        assert_eq!((d.seen, d.blocked), (2, Some(1)));
        assert_eq!(d.remaining[0], 3);
        assert_eq!(d.tightest, Some((10, 0, 1)));
        // Blocked by the first window: the answer stops there.
        assert!(answer_is_complete(&[1, 5], 2));
        assert!(answer_is_complete(&[0, 1, 1], 2));
        assert!(!answer_is_complete(&[0, 1], 2));
        assert!(!answer_is_complete(&[3, 1, 1], 2));
        assert!(!answer_is_complete(&[], 2));
        let d = conf.decide_from_redis(&[1, 5], t);
        assert_eq!((d.seen, d.blocked), (1, Some(1)));
    }

    #[test]
    fn taking_slots_is_exact_under_contention() {
        let c = Arc::new(AtomicU64::new(0));
        let allowed = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (c, allowed) = (c.clone(), allowed.clone());
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        if take(&c, 100) {
                            allowed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(allowed.load(Ordering::Relaxed), 100);
    }
}
