//! Where the prometheus plugin records: one shard per worker thread, merged when scraped.
//! A worker only ever takes its own shard's lock on the request path, so the lock is never
//! contended except by a scrape; series are keyed by their label values written into a
//! per-thread buffer (no allocation once a series exists).

use std::cell::RefCell;
use std::fmt::Write;
use std::sync::{Arc, Mutex};

use rustc_hash::FxHashMap;

use crate::log::{LogEntry, Source};

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

#[derive(Default)]
struct Shard {
    /// service, route, code, source, consumer → requests.
    requests: FxHashMap<String, u64>,
    /// service, route → latency histograms.
    latency: FxHashMap<String, Latency>,
    /// service, route, consumer → [ingress, egress] bytes.
    bandwidth: FxHashMap<String, [u64; 2]>,
}

static SHARDS: Mutex<Vec<Arc<Mutex<Shard>>>> = Mutex::new(Vec::new());

thread_local! {
    static LOCAL: (Arc<Mutex<Shard>>, RefCell<String>) = {
        let shard = Arc::new(Mutex::new(Shard::default()));
        SHARDS.lock().unwrap_or_else(|e| e.into_inner()).push(shard.clone());
        (shard, RefCell::new(String::with_capacity(128)))
    };
}

/// What a prometheus config records.
#[derive(Clone, Copy, Debug)]
pub struct Families {
    pub per_consumer: bool,
    pub status_code: bool,
    pub latency: bool,
    pub bandwidth: bool,
}

fn bump<'m, V: Default>(map: &'m mut FxHashMap<String, V>, key: &str) -> &'m mut V {
    // Looked up by the borrowed key: the key string is only copied for a new series.
    if !map.contains_key(key) {
        map.insert(key.to_string(), V::default());
    }
    map.get_mut(key).expect("just inserted")
}

/// Records one request (the plugin's log phase). Kong records nothing for requests without
/// a service.
pub fn record(f: Families, e: &LogEntry<'_>) {
    let Some(service) = e.service else { return };
    let service = service.name.as_deref().unwrap_or(&service.host);
    let route = e.route.name.as_deref().unwrap_or(&e.route.id);
    let consumer = match (f.per_consumer, e.consumer) {
        (true, Some(c)) => c.username.as_deref().unwrap_or(""),
        _ => "",
    };
    LOCAL.with(|(shard, key)| {
        let mut shard = shard.lock().unwrap_or_else(|p| p.into_inner());
        let mut key = key.borrow_mut();
        if f.status_code {
            key.clear();
            let source = if e.source == Source::Service {
                "service"
            } else {
                "kong"
            };
            let _ = write!(
                key,
                "{service}{SEP}{route}{SEP}{}{SEP}{source}{SEP}{consumer}",
                e.status
            );
            *bump(&mut shard.requests, &key) += 1;
        }
        if f.latency {
            key.clear();
            let _ = write!(key, "{service}{SEP}{route}");
            let l = bump(&mut shard.latency, &key);
            l.kong.observe(e.latency_kong_ms, &KONG_LATENCY_BUCKETS);
            l.request
                .observe(e.latency_request_ms, &UPSTREAM_LATENCY_BUCKETS);
            if let Some(p) = e.latency_proxy_ms {
                l.upstream.observe(p, &UPSTREAM_LATENCY_BUCKETS);
            }
        }
        if f.bandwidth {
            key.clear();
            let _ = write!(key, "{service}{SEP}{route}{SEP}{consumer}");
            let b = bump(&mut shard.bandwidth, &key);
            b[0] += e.request_size;
            b[1] += e.response_size;
        }
    });
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
        let l = labels(&["service", "route"], key);
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
pub fn render(out: &mut String) {
    let mut requests: FxHashMap<String, u64> = FxHashMap::default();
    let mut latency: FxHashMap<String, Latency> = FxHashMap::default();
    let mut bandwidth: FxHashMap<String, [u64; 2]> = FxHashMap::default();
    let shards: Vec<_> = SHARDS.lock().unwrap_or_else(|e| e.into_inner()).clone();
    for shard in shards {
        let s = shard.lock().unwrap_or_else(|e| e.into_inner());
        for (k, v) in &s.requests {
            *requests.entry(k.clone()).or_default() += v;
        }
        for (k, v) in &s.latency {
            let l = latency.entry(k.clone()).or_default();
            l.kong.merge(&v.kong);
            l.upstream.merge(&v.upstream);
            l.request.merge(&v.request);
        }
        for (k, v) in &s.bandwidth {
            let b = bandwidth.entry(k.clone()).or_default();
            b[0] += v[0];
            b[1] += v[1];
        }
    }
    let mut requests: Vec<_> = requests.into_iter().collect();
    requests.sort();
    let mut latency: Vec<_> = latency.into_iter().collect();
    latency.sort_by(|a, b| a.0.cmp(&b.0));
    let mut bandwidth: Vec<_> = bandwidth.into_iter().collect();
    bandwidth.sort();

    if !requests.is_empty() {
        out.push_str("# HELP kong_http_requests_total HTTP status codes per consumer/service/route in Kong\n# TYPE kong_http_requests_total counter\n");
        for (k, n) in &requests {
            let l = labels(&["service", "route", "code", "source", "consumer"], k);
            let _ = writeln!(out, "kong_http_requests_total{{{l}}} {n}");
        }
    }
    if !latency.is_empty() {
        let kong: Vec<_> = latency.iter().map(|(k, l)| (k.clone(), l.kong)).collect();
        histogram(
            out,
            "kong_kong_latency_ms",
            "Latency added by Kong and enabled plugins for each service/route in Kong",
            &KONG_LATENCY_BUCKETS,
            &kong,
        );
        let upstream: Vec<_> = latency
            .iter()
            .map(|(k, l)| (k.clone(), l.upstream))
            .collect();
        histogram(
            out,
            "kong_upstream_latency_ms",
            "Latency added by upstream response for each service/route in Kong",
            &UPSTREAM_LATENCY_BUCKETS,
            &upstream,
        );
        let request: Vec<_> = latency
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
    if !bandwidth.is_empty() {
        out.push_str("# HELP kong_bandwidth_bytes Total bandwidth (ingress/egress) throughput in bytes\n# TYPE kong_bandwidth_bytes counter\n");
        for (k, [ingress, egress]) in &bandwidth {
            let mut parts = k.split(SEP);
            let (service, route, consumer) = (
                parts.next().unwrap_or(""),
                parts.next().unwrap_or(""),
                parts.next().unwrap_or(""),
            );
            for (direction, n) in [("egress", egress), ("ingress", ingress)] {
                let _ = writeln!(
                    out,
                    "kong_bandwidth_bytes{{service=\"{}\",route=\"{}\",direction=\"{direction}\",consumer=\"{}\"}} {n}",
                    escape(service),
                    escape(route),
                    escape(consumer)
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
                "kong_kong_latency_ms_bucket{service=\"s\",route=\"r\",le=\"00001.0\"} 2\n"
            ),
            "{out}"
        );
        assert!(out.contains("le=\"00005.0\"} 3\n"), "{out}");
        assert!(out.contains("le=\"01000.0\"} 4\n"), "{out}");
        assert!(out.contains("le=\"+Inf\"} 5\n"), "{out}");
        assert!(
            out.contains("kong_kong_latency_ms_sum{service=\"s\",route=\"r\"} 6004\n"),
            "{out}"
        );
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
