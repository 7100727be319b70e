//! Where the prometheus plugin records: one shard per worker thread, merged when scraped.
//! A worker only ever takes its own shard's lock on the request path, so the lock is never
//! contended except by a scrape; series are keyed by their label values written into a
//! per-thread buffer (no allocation once a series exists).

use std::cell::RefCell;
use std::fmt::Write;
use std::sync::{Arc, Mutex, Weak};

use rustc_hash::FxHashMap;

use crate::log::{LogEntry, Source, StreamLogEntry};

/// Kong's `workspace` label: every entity is in the default workspace.
const WORKSPACE: &str = "default";

/// Kong's buckets (milliseconds) for kong_kong_latency_ms.
pub const KONG_LATENCY_BUCKETS: [u64; 15] =
    [1, 2, 5, 7, 10, 15, 20, 30, 50, 75, 100, 200, 500, 750, 1000];
/// Kong's buckets for kong_upstream_latency_ms and kong_request_latency_ms.
pub const UPSTREAM_LATENCY_BUCKETS: [u64; 13] = [
    25, 50, 80, 100, 250, 400, 700, 1000, 2000, 5000, 10000, 30000, 60000,
];

/// Separates label values inside a series key (never part of a name Kong accepts).
const SEP: char = '\u{0}';

#[derive(Clone, Copy)]
struct Histogram<const N: usize> {
    /// Observations per bucket (not cumulative; made cumulative when rendered), and above
    /// the last bound.
    buckets: [u64; N],
    over: u64,
    sum: u64,
    count: u64,
}

impl<const N: usize> Default for Histogram<N> {
    fn default() -> Self {
        Histogram {
            buckets: [0; N],
            over: 0,
            sum: 0,
            count: 0,
        }
    }
}

impl<const N: usize> Histogram<N> {
    fn observe(&mut self, v: u64, bounds: &[u64; N]) {
        let i = bounds.partition_point(|b| *b < v);
        match self.buckets.get_mut(i) {
            Some(b) => *b += 1,
            None => self.over += 1,
        }
        self.sum += v;
        self.count += 1;
    }

    fn merge(&mut self, o: &Self) {
        for (a, b) in self.buckets.iter_mut().zip(o.buckets.iter()) {
            *a += b;
        }
        self.over += o.over;
        self.sum += o.sum;
        self.count += o.count;
    }
}

#[derive(Clone, Copy, Default)]
struct Latency {
    kong: Histogram<15>,
    upstream: Histogram<13>,
    request: Histogram<13>,
}

/// Everything recorded for one (service, route, consumer).
#[derive(Default)]
struct Series {
    /// (status code, answered by the service?) → requests; a handful per series, scanned.
    statuses: Vec<(u16, bool, u64)>,
    latency: Latency,
    /// [ingress, egress] bytes.
    bandwidth: [u64; 2],
}

/// Everything recorded for one stream (service, route): Kong's stream subsystem families.
#[derive(Default, Clone)]
struct StreamSeries {
    /// (status, proxied to the service?) → sessions.
    statuses: Vec<(u16, bool, u64)>,
    kong: Histogram<15>,
    session: Histogram<13>,
}

#[derive(Default)]
struct Shard {
    /// Keyed by service, route and consumer label values (one look-up per request).
    series: FxHashMap<String, Series>,
    /// Stream sessions, keyed by service and route.
    streams: FxHashMap<String, StreamSeries>,
}

type Shards = Mutex<Vec<Arc<Mutex<Shard>>>>;

/// prometheus's part of the node's [`crate::Runtime`]: one shard of series per worker thread
/// (a request locks only its own thread's), merged when `/metrics` is scraped; and whether a
/// config asked for the upstream health family.
#[derive(Default)]
pub struct State {
    shards: Arc<Shards>,
    /// Set once a config turns `upstream_health_metrics` on (Kong keeps exporting them until a
    /// restart after that, and so do we).
    pub upstream_health: std::sync::atomic::AtomicBool,
}

/// A thread's shards: one per node's state it recorded for.
type Mine = RefCell<Vec<(Weak<Shards>, Arc<Mutex<Shard>>)>>;

thread_local! {
    /// This thread's shard of each node's state (one node in a process but in tests), and the
    /// series key being built.
    static LOCAL: (Mine, RefCell<String>) =
        const { (RefCell::new(Vec::new()), RefCell::new(String::new())) };
}

impl State {
    /// This thread's shard, made and registered at its first request.
    fn local_shard(&self, mine: &Mine) -> Arc<Mutex<Shard>> {
        let mut mine = mine.borrow_mut();
        if let Some((_, s)) = mine
            .iter()
            .find(|(w, _)| std::ptr::eq(w.as_ptr(), Arc::as_ptr(&self.shards)))
        {
            return s.clone();
        }
        // A node's state that is gone leaves its entry: dropped here.
        mine.retain(|(w, _)| w.strong_count() > 0);
        let shard = Arc::new(Mutex::new(Shard::default()));
        self.shards
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(shard.clone());
        mine.push((Arc::downgrade(&self.shards), shard.clone()));
        shard
    }
}

/// What a prometheus config records.
#[derive(Clone, Copy, Debug)]
pub struct Families {
    pub per_consumer: bool,
    pub status_code: bool,
    pub latency: bool,
    pub bandwidth: bool,
}

/// Records one request (the plugin's log phase). Kong records nothing for requests without
/// a service.
pub fn record(state: &State, f: Families, e: &LogEntry<'_>) {
    let Some(service) = e.service else { return };
    let service = service.name.as_deref().unwrap_or(&service.host);
    let route = e.route.name.as_deref().unwrap_or(&e.route.id);
    let consumer = match (f.per_consumer, e.consumer) {
        (true, Some(c)) => c.username().unwrap_or(""),
        _ => "",
    };
    LOCAL.with(|(mine, key)| {
        let shard = state.local_shard(mine);
        let mut key = key.borrow_mut();
        key.clear();
        key.push_str(service);
        key.push(SEP);
        key.push_str(route);
        key.push(SEP);
        key.push_str(consumer);
        let mut shard = shard.lock().unwrap_or_else(|p| p.into_inner());
        // Looked up by the borrowed key: the key is only copied for a new series.
        let series = match shard.series.get_mut(key.as_str()) {
            Some(s) => s,
            None => shard.series.entry(key.clone()).or_default(),
        };
        if f.status_code {
            count_status(
                &mut series.statuses,
                e.status,
                e.source == Source::Service,
                1,
            );
        }
        if f.latency {
            let l = &mut series.latency;
            l.kong.observe(e.latency_kong_ms, &KONG_LATENCY_BUCKETS);
            l.request
                .observe(e.latency_request_ms, &UPSTREAM_LATENCY_BUCKETS);
            if let Some(p) = e.latency_proxy_ms {
                l.upstream.observe(p, &UPSTREAM_LATENCY_BUCKETS);
            }
        }
        if f.bandwidth {
            series.bandwidth[0] += e.request_size;
            series.bandwidth[1] += e.response_size;
        }
    });
}

/// Records one stream session (the plugin's log phase on a `tcp`/`tls` route): Kong's
/// `kong_stream_sessions_total`, and its latencies (`kong_kong_latency_ms` to the service
/// connected, `kong_session_duration_ms` for the whole session). Kong's stream sessions
/// record no bandwidth (its handler reads sizes from `response`, which a session has not).
pub fn record_stream(state: &State, f: Families, e: &StreamLogEntry<'_>) {
    let Some(service) = e.service else { return };
    let service = service.name.as_deref().unwrap_or(&service.host);
    let route = e.route.name.as_deref().unwrap_or(&e.route.id);
    LOCAL.with(|(mine, key)| {
        let shard = state.local_shard(mine);
        let mut key = key.borrow_mut();
        key.clear();
        key.push_str(service);
        key.push(SEP);
        key.push_str(route);
        let mut shard = shard.lock().unwrap_or_else(|p| p.into_inner());
        let series = match shard.streams.get_mut(key.as_str()) {
            Some(s) => s,
            None => shard.streams.entry(key.clone()).or_default(),
        };
        if f.status_code {
            count_status(&mut series.statuses, e.status, e.status == 200, 1);
        }
        if f.latency {
            series
                .kong
                .observe(e.latency_kong_ms, &KONG_LATENCY_BUCKETS);
            series
                .session
                .observe(e.session_ms, &UPSTREAM_LATENCY_BUCKETS);
        }
    });
}

/// Adds `n` to the count of (status, answered by the service?).
fn count_status(statuses: &mut Vec<(u16, bool, u64)>, code: u16, from_service: bool, n: u64) {
    match statuses
        .iter_mut()
        .find(|(c, s, _)| *c == code && *s == from_service)
    {
        Some(entry) => entry.2 += n,
        None => statuses.push((code, from_service, n)),
    }
}

/// A counter family's lines under its HELP and TYPE, when it has any.
fn counter(out: &mut String, name: &str, help: &str, lines: Vec<String>) {
    if lines.is_empty() {
        return;
    }
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
    for line in lines {
        out.push_str(&line);
        out.push('\n');
    }
}

/// A label value in the exposition format.
pub fn escape(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

fn labels(names: &[&str], key: &str) -> String {
    names
        .iter()
        .zip(key.split(SEP))
        .map(|(n, v)| format!("{n}=\"{}\"", escape(v)))
        .collect::<Vec<_>>()
        .join(",")
}

fn histogram<const N: usize>(
    out: &mut String,
    name: &str,
    help: &str,
    bounds: &[u64; N],
    series: &[(String, Histogram<N>)],
) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
    for (key, h) in series {
        if h.count == 0 {
            continue;
        }
        let l = format!(
            "{},workspace=\"{WORKSPACE}\"",
            labels(&["service", "route"], key)
        );
        let mut cumulative = 0;
        for (b, n) in bounds.iter().zip(h.buckets.iter()) {
            cumulative += n;
            // Kong's bucket labels: zero-padded, one decimal.
            let _ = writeln!(
                out,
                "{name}_bucket{{{l},le=\"{:07.1}\"}} {cumulative}",
                *b as f64
            );
        }
        let _ = writeln!(out, "{name}_bucket{{{l},le=\"+Inf\"}} {}", h.count);
        let _ = writeln!(out, "{name}_count{{{l}}} {}", h.count);
        let _ = writeln!(out, "{name}_sum{{{l}}} {}", h.sum);
    }
}

/// Writes the recorded families in the Prometheus text format (Kong's names, labels and
/// help texts), the workers' shards merged.
pub fn render(state: &State, out: &mut String) {
    // Merged by (service, route, consumer); stream sessions by (service, route).
    let mut merged: FxHashMap<String, Series> = FxHashMap::default();
    let mut streams: FxHashMap<String, StreamSeries> = FxHashMap::default();
    let shards: Vec<_> = state
        .shards
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    for shard in shards {
        let s = shard.lock().unwrap_or_else(|e| e.into_inner());
        for (k, v) in &s.streams {
            let m = streams.entry(k.clone()).or_default();
            for &(code, proxied, n) in &v.statuses {
                count_status(&mut m.statuses, code, proxied, n);
            }
            m.kong.merge(&v.kong);
            m.session.merge(&v.session);
        }
        for (k, v) in &s.series {
            let m = merged.entry(k.clone()).or_default();
            for &(code, from_service, n) in &v.statuses {
                count_status(&mut m.statuses, code, from_service, n);
            }
            m.latency.kong.merge(&v.latency.kong);
            m.latency.upstream.merge(&v.latency.upstream);
            m.latency.request.merge(&v.latency.request);
            m.bandwidth[0] += v.bandwidth[0];
            m.bandwidth[1] += v.bandwidth[1];
        }
    }
    let mut series: Vec<(String, Series)> = merged.into_iter().collect();
    series.sort_by(|a, b| a.0.cmp(&b.0));
    let split = |k: &str| -> (String, String, String) {
        let mut p = k.split(SEP);
        let mut next = || escape(p.next().unwrap_or(""));
        (next(), next(), next())
    };

    let mut requests = Vec::new();
    for (k, s) in &series {
        let (service, route, consumer) = split(k);
        let mut statuses = s.statuses.clone();
        statuses.sort();
        for (code, from_service, n) in statuses {
            let source = if from_service { "service" } else { "kong" };
            requests.push(format!(
                "kong_http_requests_total{{service=\"{service}\",route=\"{route}\",code=\"{code}\",source=\"{source}\",workspace=\"{WORKSPACE}\",consumer=\"{consumer}\"}} {n}"
            ));
        }
    }
    counter(
        out,
        "kong_http_requests_total",
        "HTTP status codes per consumer/service/route in Kong",
        requests,
    );

    // Latency is per (service, route): series of several consumers are summed.
    let mut by_route: Vec<(String, Latency)> = Vec::new();
    for (k, s) in &series {
        if s.latency.request.count == 0 {
            continue;
        }
        let route_key = k
            .rsplit_once(SEP)
            .map_or(k.as_str(), |(r, _)| r)
            .to_string();
        match by_route.iter_mut().find(|(r, _)| *r == route_key) {
            Some((_, l)) => {
                l.kong.merge(&s.latency.kong);
                l.upstream.merge(&s.latency.upstream);
                l.request.merge(&s.latency.request);
            }
            None => by_route.push((route_key, s.latency)),
        }
    }
    let mut streams: Vec<(String, StreamSeries)> = streams.into_iter().collect();
    streams.sort_by(|a, b| a.0.cmp(&b.0));
    let mut sessions = Vec::new();
    for (k, s) in &streams {
        let (service, route, _) = split(k);
        let mut statuses = s.statuses.clone();
        statuses.sort();
        for (code, proxied, n) in statuses {
            let source = if proxied { "service" } else { "kong" };
            sessions.push(format!(
                "kong_stream_sessions_total{{service=\"{service}\",route=\"{route}\",code=\"{code}\",source=\"{source}\",workspace=\"{WORKSPACE}\"}} {n}"
            ));
        }
    }
    counter(
        out,
        "kong_stream_sessions_total",
        "Stream status codes per service/route in Kong",
        sessions,
    );
    let stream_kong: Vec<_> = streams
        .iter()
        .filter(|(_, s)| s.kong.count > 0)
        .map(|(k, s)| (k.clone(), s.kong))
        .collect();
    if !by_route.is_empty() || !stream_kong.is_empty() {
        let kong: Vec<_> = by_route
            .iter()
            .map(|(k, l)| (k.clone(), l.kong))
            .chain(stream_kong)
            .collect();
        histogram(
            out,
            "kong_kong_latency_ms",
            "Latency added by Kong and enabled plugins for each service/route in Kong",
            &KONG_LATENCY_BUCKETS,
            &kong,
        );
        let upstream: Vec<_> = by_route
            .iter()
            .map(|(k, l)| (k.clone(), l.upstream))
            .collect();
        let session: Vec<_> = streams
            .iter()
            .filter(|(_, s)| s.session.count > 0)
            .map(|(k, s)| (k.clone(), s.session))
            .collect();
        if !session.is_empty() {
            histogram(
                out,
                "kong_session_duration_ms",
                "latency incurred in stream session for each service/route in Kong",
                &UPSTREAM_LATENCY_BUCKETS,
                &session,
            );
        }
        histogram(
            out,
            "kong_upstream_latency_ms",
            "Latency added by upstream response for each service/route in Kong",
            &UPSTREAM_LATENCY_BUCKETS,
            &upstream,
        );
        let request: Vec<_> = by_route
            .iter()
            .map(|(k, l)| (k.clone(), l.request))
            .collect();
        histogram(
            out,
            "kong_request_latency_ms",
            "Total latency incurred during requests for each service/route in Kong",
            &UPSTREAM_LATENCY_BUCKETS,
            &request,
        );
    }

    let bandwidth: Vec<_> = series
        .iter()
        .filter(|(_, s)| s.bandwidth != [0, 0])
        .collect();
    if !bandwidth.is_empty() {
        out.push_str("# HELP kong_bandwidth_bytes Total bandwidth (ingress/egress) throughput in bytes\n# TYPE kong_bandwidth_bytes counter\n");
        for (k, s) in bandwidth {
            let (service, route, consumer) = split(k);
            for (direction, n) in [("egress", s.bandwidth[1]), ("ingress", s.bandwidth[0])] {
                let _ = writeln!(
                    out,
                    "kong_bandwidth_bytes{{service=\"{service}\",route=\"{route}\",direction=\"{direction}\",workspace=\"{WORKSPACE}\",consumer=\"{consumer}\"}} {n}"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative_with_kongs_buckets() {
        let mut h = Histogram::<15>::default();
        for v in [0, 1, 3, 1000, 5000] {
            h.observe(v, &KONG_LATENCY_BUCKETS);
        }
        let mut out = String::new();
        histogram(
            &mut out,
            "kong_kong_latency_ms",
            "help",
            &KONG_LATENCY_BUCKETS,
            &[(format!("s{SEP}r"), h)],
        );
        assert!(
            out.contains(
                "kong_kong_latency_ms_bucket{service=\"s\",route=\"r\",workspace=\"default\",le=\"00001.0\"} 2\n"
            ),
            "{out}"
        );
        assert!(out.contains("le=\"00005.0\"} 3\n"), "{out}");
        assert!(out.contains("le=\"01000.0\"} 4\n"), "{out}");
        assert!(out.contains("le=\"+Inf\"} 5\n"), "{out}");
        assert!(
            out.contains(
                "kong_kong_latency_ms_sum{service=\"s\",route=\"r\",workspace=\"default\"} 6004\n"
            ),
            "{out}"
        );
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
