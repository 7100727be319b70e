//! response-ratelimiting (PRIORITY 900): limits that the upstream spends, as Kong's
//! `access.lua`, `header_filter.lua` and `log.lua` do. The upstream says what a response cost
//! in its `X-Kong-Limit` header (`videos=1, images=3`); the access phase reads each named
//! limit's usage in its windows (second to year, calendar-aligned as rate-limiting's) and tells
//! the upstream what remains (`X-RateLimit-Remaining-<name>`), refusing at once with
//! `block_on_first_violation`; the header_filter phase gives the client
//! `X-RateLimit-Limit-<name>-<period>` and `X-RateLimit-Remaining-<name>-<period>`, removes the
//! upstream's header, and answers 429 (no body) when a response spends a limit that was
//! already used up; the log phase adds what was spent.
//!
//! Policies: `local` (counted on the node, shared by its workers), `redis` (one Redis for all
//! nodes: one MGET per request, INCRBY per spent window) and `cluster` (the node's database,
//! Kong's `response_ratelimiting_metrics` table: one read per window when a request comes, one
//! transaction adding what the response spent after it; refused on a DB-less node, as Kong).

mod schema;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use dashmap::DashMap;
use http::{HeaderName, HeaderValue, StatusCode};
use serde_json::Value;

use crate::rate_limiting::cluster;
use crate::rate_limiting::redis::{self, RedisTarget};
use crate::rate_limiting::Period;
use crate::{now_secs, Access, AccessRequest, BuildContext, Exit, Handler, PluginSpec};

pub struct ResponseRateLimiting;

/// The node's counters for the `local` policy: key -> (window end, count); and, for `redis`,
/// the queue of each Redis's increments (a thread of its own sends them: the log phase does
/// not wait, and needs no runtime of its own).
#[derive(Default)]
pub struct State {
    counters: DashMap<String, (u64, AtomicU64), rustc_hash::FxBuildHasher>,
    last_sweep: AtomicU64,
    increments: std::sync::Mutex<std::collections::HashMap<String, Increments>>,
}

/// (key, amount, window end) to add in Redis.
type Increments = std::sync::mpsc::SyncSender<(String, u64, u64)>;

impl State {
    /// The increment queue of `target`, its thread started on first use.
    fn increments(&self, target: &Arc<RedisTarget>) -> Option<Increments> {
        let key = format!("{}:{}/{}", target.host, target.port, target.database);
        let mut m = self.increments.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(tx) = m.get(&key) {
            return Some(tx.clone());
        }
        let (tx, rx) = std::sync::mpsc::sync_channel::<(String, u64, u64)>(10_000);
        let target = target.clone();
        std::thread::Builder::new()
            .name("response-ratelimiting".into())
            .spawn(move || {
                let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                else {
                    return;
                };
                while let Ok((k, n, end)) = rx.recv() {
                    if let Err(e) = rt.block_on(redis::add(&target, &k, n, end)) {
                        tracing::error!("response-ratelimiting: failed to increment {k}: {e}");
                    }
                }
            })
            .ok()?;
        m.insert(key, tx.clone());
        Some(tx)
    }
}

enum Policy {
    Local,
    Redis(Arc<RedisTarget>),
    /// The node's database, through rate-limiting's cluster counters.
    Cluster(Arc<crate::rate_limiting::State>),
}

#[derive(Clone, Copy)]
enum LimitBy {
    Consumer,
    Credential,
    Ip,
}

/// One window of one named limit.
struct Window {
    period: Period,
    limit: i64,
    limit_header: HeaderName,
    limit_value: HeaderValue,
    remaining_header: HeaderName,
}

struct Limit {
    name: String,
    windows: Vec<Window>,
    /// `X-RateLimit-Remaining-<name>`, to the upstream.
    upstream_header: HeaderName,
}

struct Configured {
    state: Arc<State>,
    policy: Policy,
    fault_tolerant: bool,
    limits: Vec<Limit>,
    header_name: HeaderName,
    limit_by: LimitBy,
    hide_headers: bool,
    block_first: bool,
}

struct Handle(Arc<Configured>);

/// What one request's phases share (Kong's `kong.ctx.plugin`).
struct Usage {
    /// Counter keys' common part: route, service, identifier.
    base: String,
    now: u64,
    /// Remaining, by limit then window (as `limits`).
    remaining: Vec<Vec<i64>>,
    /// What the response spent, by limit.
    spent: Vec<u64>,
    stop: bool,
}

fn header(name: String) -> Result<HeaderName, String> {
    HeaderName::from_bytes(name.to_ascii_lowercase().as_bytes())
        .map_err(|_| format!("limit name makes an invalid header name: {name}"))
}

impl PluginSpec for ResponseRateLimiting {
    fn name(&self) -> &'static str {
        "response-ratelimiting"
    }
    fn priority(&self) -> i32 {
        900
    }
    /// Kong's `protocols = typedefs.protocols_http`.
    fn http_only(&self) -> bool {
        true
    }
    fn fields(&self) -> &'static [crate::schema::Field] {
        schema::FIELDS
    }
    fn shorthand_fields(&self) -> &'static [crate::schema::Shorthand] {
        crate::rate_limiting::schema::SHORTHANDS
    }
    fn shorthands(&self, config: &mut Value) {
        crate::rate_limiting::schema::shorthands(config)
    }
    fn entity_checks(&self, config: &Value) -> Vec<(String, String)> {
        schema::entity_checks(config)
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
    fn build(&self, config: &Value, ctx: &BuildContext) -> Result<Arc<dyn Handler>, String> {
        let c: schema::Config = crate::typed(config)?;
        let mut limits = Vec::new();
        for (name, l) in &c.limits {
            let mut windows = Vec::new();
            for period in Period::ALL {
                let Some(limit) = l.get(period.name()) else {
                    continue;
                };
                let limit = limit as i64;
                windows.push(Window {
                    period,
                    limit,
                    limit_header: header(format!("x-ratelimit-limit-{name}-{}", period.name()))?,
                    limit_value: HeaderValue::from(limit),
                    remaining_header: header(format!(
                        "x-ratelimit-remaining-{name}-{}",
                        period.name()
                    ))?,
                });
            }
            limits.push(Limit {
                name: name.clone(),
                windows,
                upstream_header: header(format!("x-ratelimit-remaining-{name}"))?,
            });
        }
        let policy = match c.policy.as_str() {
            "redis" => Policy::Redis(Arc::new(RedisTarget::from_config(&c.redis)?)),
            "local" => Policy::Local,
            "cluster" => Policy::Cluster(ctx.runtime.rate_limiting.clone()),
            other => return Err(format!("policy '{other}' is not supported")),
        };
        Ok(Arc::new(Handle(Arc::new(Configured {
            state: ctx.runtime.response_ratelimiting.clone(),
            policy,
            fault_tolerant: c.fault_tolerant,
            limits,
            header_name: header(c.header_name)?,
            limit_by: match c.limit_by.as_str() {
                "credential" => LimitBy::Credential,
                "ip" => LimitBy::Ip,
                _ => LimitBy::Consumer,
            },
            hide_headers: c.hide_client_headers,
            block_first: c.block_on_first_violation,
        }))))
    }
}

impl Configured {
    /// Kong's `get_identifier`.
    fn identifier(&self, req: &AccessRequest<'_>) -> String {
        let who = req.consumer.as_deref();
        let id = match self.limit_by {
            LimitBy::Consumer => who.map(|c| {
                if c.consumer_id().is_empty() {
                    c.credential_id().unwrap_or("")
                } else {
                    c.consumer_id()
                }
            }),
            LimitBy::Credential => who.and_then(|c| c.credential_id()),
            LimitBy::Ip => None,
        };
        match id.filter(|s| !s.is_empty()) {
            Some(s) => s.to_string(),
            None => req.client_ip.to_string(),
        }
    }

    /// Each window's counter key.
    fn keys(&self, base: &str, now: u64) -> Vec<Vec<(String, u64)>> {
        self.limits
            .iter()
            .map(|l| {
                l.windows
                    .iter()
                    .map(|w| {
                        let (start, end) = w.period.window(now);
                        (
                            format!(
                                "response-ratelimit:{base}:{start}:{}_{}",
                                l.name,
                                w.period.name()
                            ),
                            end,
                        )
                    })
                    .collect()
            })
            .collect()
    }

    /// Each window's row for the cluster policy (Kong's `response_ratelimiting_metrics` key:
    /// the limit's name and period, the window's start in milliseconds).
    fn counters(&self, base: &str, now: u64) -> Vec<Vec<cluster::Counter>> {
        // `base` is route id, service id (both without colons) and the identifier (an IPv6
        // address has some).
        let mut parts = base.splitn(3, ':');
        let (route_id, service_id, identifier) = (
            parts.next().unwrap_or(""),
            parts.next().unwrap_or(""),
            parts.next().unwrap_or(""),
        );
        self.limits
            .iter()
            .map(|l| {
                l.windows
                    .iter()
                    .map(|w| {
                        let (start, end) = w.period.window(now);
                        cluster::Counter {
                            route_id: route_id.into(),
                            service_id: service_id.into(),
                            identifier: identifier.into(),
                            period: format!("{}_{}", l.name, w.period.name()),
                            period_date: start as i64 * 1000,
                            expire_at: end as i64,
                        }
                    })
                    .collect()
            })
            .collect()
    }

    /// The access phase once usage is known: headers to the upstream, or a 429.
    fn decide(&self, req: &mut AccessRequest<'_>, mut usage: Usage, used: Vec<Vec<i64>>) -> Access {
        usage.remaining = self
            .limits
            .iter()
            .zip(&used)
            .map(|(l, u)| l.windows.iter().zip(u).map(|(w, n)| w.limit - n).collect())
            .collect();
        for (l, rem) in self.limits.iter().zip(&usage.remaining) {
            if self.block_first && rem.iter().any(|r| *r <= 0) {
                return Access::Exit(Exit::message(
                    StatusCode::TOO_MANY_REQUESTS,
                    &format!("API rate limit exceeded for '{}'", l.name),
                ));
            }
            if let Some(min) = rem.iter().min() {
                req.headers
                    .insert(l.upstream_header.clone(), HeaderValue::from(*min));
            }
        }
        req.ctx.insert(usage);
        Access::Continue
    }

    fn failed(&self, e: &str) -> Access {
        tracing::error!("response-ratelimiting: failed to get usage: {e}");
        if self.fault_tolerant {
            Access::Continue
        } else {
            Access::Exit(Exit::message(
                StatusCode::INTERNAL_SERVER_ERROR,
                "An unexpected error occurred",
            ))
        }
    }

    fn sweep(&self, now: u64) {
        let last = self.state.last_sweep.load(Ordering::Relaxed);
        if now >= last + 60
            && self
                .state
                .last_sweep
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.state.counters.retain(|_, (end, _)| *end > now);
        }
    }
}

/// `name=n, other=m` as Kong's `parse_header` reads it: names of configured limits only.
fn spent(value: &str, limits: &[Limit]) -> Vec<u64> {
    let mut out = vec![0; limits.len()];
    for part in value.split(',') {
        let Some((name, n)) = part.split_once('=') else {
            continue;
        };
        if let Some(i) = limits.iter().position(|l| l.name == name.trim()) {
            out[i] = n.trim().parse::<f64>().map_or(0, |f| f.max(0.0) as u64);
        }
    }
    out
}

/// Drops the body of a response the header_filter phase refused (Kong's exit without body).
struct Drop;

impl crate::BodyFilter for Drop {
    fn filter(&mut self, _piece: bytes::Bytes, _eof: bool) -> bytes::Bytes {
        bytes::Bytes::new()
    }
}

impl Handler for Handle {
    fn phases(&self) -> crate::Phases {
        crate::Phases::ACCESS
            .and(crate::Phases::RESPONSE)
            .and(crate::Phases::LOG)
    }

    fn access(&self, req: &mut AccessRequest<'_>) -> Access {
        let conf = &self.0;
        if conf.limits.is_empty() {
            return Access::Continue;
        }
        let now = now_secs();
        let base = format!(
            "{}:{}:{}",
            req.route_id,
            req.service_id.unwrap_or(""),
            conf.identifier(req)
        );
        let keys = conf.keys(&base, now);
        let usage = Usage {
            base,
            now,
            remaining: Vec::new(),
            spent: Vec::new(),
            stop: false,
        };
        match &conf.policy {
            Policy::Local => {
                let used = keys
                    .iter()
                    .map(|ws| {
                        ws.iter()
                            .map(|(k, _)| {
                                conf.state
                                    .counters
                                    .get(k)
                                    .map_or(0, |c| c.1.load(Ordering::Relaxed) as i64)
                            })
                            .collect()
                    })
                    .collect();
                conf.decide(req, usage, used)
            }
            Policy::Redis(target) => {
                let (conf, target) = (self.0.clone(), target.clone());
                Access::Wait(Box::pin(async move {
                    let flat: Vec<String> = keys.iter().flatten().map(|(k, _)| k.clone()).collect();
                    let got = redis::get_many(&target, &flat).await;
                    let resume: crate::Resume = Box::new(move |req| match got {
                        Ok(counts) => {
                            let mut it = counts.into_iter();
                            let used = keys
                                .iter()
                                .map(|ws| ws.iter().map(|_| it.next().unwrap_or(0)).collect())
                                .collect();
                            conf.decide(req, usage, used)
                        }
                        Err(e) => conf.failed(&e),
                    });
                    resume
                }))
            }
            Policy::Cluster(state) => {
                let counters = conf.counters(&usage.base, now);
                let (conf, state) = (self.0.clone(), state.clone());
                Access::Wait(Box::pin(async move {
                    let shape: Vec<usize> = counters.iter().map(Vec::len).collect();
                    let got = state
                        .cluster
                        .usage(counters.into_iter().flatten().collect())
                        .await;
                    let resume: crate::Resume = Box::new(move |req| match got {
                        Ok(counts) => {
                            let mut it = counts.into_iter();
                            let used = shape
                                .iter()
                                .map(|n| it.by_ref().take(*n).collect())
                                .collect();
                            conf.decide(req, usage, used)
                        }
                        Err(e) => conf.failed(&e),
                    });
                    resume
                }))
            }
        }
    }

    fn header_filter(
        &self,
        resp: &mut crate::ResponseHead<'_>,
    ) -> Option<Box<dyn crate::BodyFilter>> {
        let conf = &self.0;
        if conf.limits.is_empty() {
            return None;
        }
        let spent = resp
            .headers
            .get(&conf.header_name)
            .and_then(|v| v.to_str().ok())
            .map(|v| spent(v, &conf.limits))
            .unwrap_or_else(|| vec![0; conf.limits.len()]);
        resp.headers.remove(&conf.header_name);
        let usage = resp.ctx.get_mut::<Usage>()?;
        let mut stop = false;
        for ((l, rem), inc) in conf.limits.iter().zip(&usage.remaining).zip(&spent) {
            for (w, r) in l.windows.iter().zip(rem) {
                if !conf.hide_headers {
                    resp.headers
                        .insert(w.limit_header.clone(), w.limit_value.clone());
                    let left = (*r - *inc as i64).max(0);
                    resp.headers
                        .insert(w.remaining_header.clone(), HeaderValue::from(left));
                }
                if *inc > 0 && *r <= 0 {
                    stop = true;
                }
            }
        }
        usage.spent = spent;
        usage.stop = stop;
        if !stop {
            return None;
        }
        resp.status = StatusCode::TOO_MANY_REQUESTS;
        resp.headers.remove(http::header::CONTENT_LENGTH);
        resp.headers.remove(http::header::CONTENT_TYPE);
        Some(Box::new(Drop))
    }

    fn log(&self, entry: &crate::log::LogEntry<'_>) {
        let conf = &self.0;
        let Some(usage) = entry.ctx.and_then(|c| c.get::<Usage>()) else {
            return;
        };
        if usage.stop || usage.spent.iter().all(|n| *n == 0) {
            return;
        }
        let keys = conf.keys(&usage.base, usage.now);
        match &conf.policy {
            Policy::Local => {
                for (ws, n) in keys.into_iter().zip(&usage.spent) {
                    for (k, end) in ws.into_iter().filter(|_| *n > 0) {
                        conf.state
                            .counters
                            .entry(k)
                            .or_insert_with(|| (end, AtomicU64::new(0)))
                            .1
                            .fetch_add(*n, Ordering::Relaxed);
                    }
                }
                conf.sweep(usage.now);
            }
            Policy::Redis(target) => {
                let adds: Vec<(String, u64, u64)> = keys
                    .into_iter()
                    .zip(&usage.spent)
                    .filter(|(_, n)| **n > 0)
                    .flat_map(|(ws, n)| ws.into_iter().map(move |(k, end)| (k, *n, end)))
                    .collect();
                if let Some(queue) = conf.state.increments(target) {
                    for add in adds {
                        if queue.try_send(add).is_err() {
                            tracing::warn!(
                                "response-ratelimiting: Redis increments are behind; one dropped"
                            );
                        }
                    }
                }
            }
            Policy::Cluster(state) => {
                let adds: Vec<(cluster::Counter, i64)> = conf
                    .counters(&usage.base, usage.now)
                    .into_iter()
                    .zip(&usage.spent)
                    .filter(|(_, n)| **n > 0)
                    .flat_map(|(ws, n)| ws.into_iter().map(move |c| (c, *n as i64)))
                    .collect();
                // The log phase does not wait: the addition runs on the worker's runtime.
                let state = state.clone();
                match tokio::runtime::Handle::try_current() {
                    Ok(rt) => {
                        rt.spawn(async move {
                            if let Err(e) = state.cluster.add(adds).await {
                                tracing::error!("response-ratelimiting: failed to add usage: {e}");
                            }
                        });
                    }
                    Err(_) => tracing::error!(
                        "response-ratelimiting: no runtime to add usage on; this response's cost is not counted"
                    ),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_upstreams_header_as_kong_parses_it() {
        let limits: Vec<Limit> = ["videos", "images"]
            .iter()
            .map(|n| Limit {
                name: n.to_string(),
                windows: Vec::new(),
                upstream_header: HeaderName::from_static("x-a"),
            })
            .collect();
        assert_eq!(spent("videos=1, images=3", &limits), [1, 3]);
        assert_eq!(spent(" images = 2 ,unknown=9, bad", &limits), [0, 2]);
    }
}
