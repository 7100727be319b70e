//! The ring balancer of an `upstreams` entity: Kong's algorithms over its targets.
//!
//! - `round-robin`: nginx's smooth weighted round-robin, one period precomputed.
//! - `consistent-hashing`: a continuum of points (per target, `weight × slots / 1000`, each at a
//!   stable hash of its target and number); a request's key (consumer, ip, header,
//!   cookie, path, query argument or URI capture, with Kong's fallback) picks the first point at
//!   or after its hash. Adding or removing a target only moves the keys of its own points.
//! - `least-connections`: the target with the fewest requests in flight for its weight (all
//!   workers' counts; a request counts until its response head arrives or it fails).
//! - `latency`: the target with the lowest moving average (EWMA) of time to response head for
//!   its weight; targets not measured yet are tried first.
//!
//! Weight 0 takes a target out. Retries move to another target where there is one.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue};

use crate::upstream::health::{Checks, Outcome, TargetHealth};
use crate::upstream::peer::Peer;
use std::sync::Arc;

/// What a consistent-hashing key is taken from (Kong's `hash_on` / `hash_fallback`).
#[derive(Debug, Clone)]
pub enum HashOn {
    None,
    Consumer,
    Ip,
    Header(HeaderName),
    /// Cookie name and path; the cookie is set on the response when the request had none.
    Cookie(String, String),
    Path,
    QueryArg(String),
    UriCapture(String),
}

enum Algorithm {
    RoundRobin {
        /// One period of the smooth weighted sequence, as indices into `peers`.
        schedule: Vec<u32>,
        cursor: AtomicUsize,
    },
    ConsistentHashing {
        /// (point, peer index), sorted by point.
        continuum: Vec<(u32, u32)>,
        hash_on: HashOn,
        fallback: HashOn,
    },
    LeastConnections,
    Latency,
}

pub struct Balancer {
    pub peers: Vec<Peer>,
    pub host_header: Option<HeaderValue>,
    weights: Vec<u32>,
    algorithm: Algorithm,
    /// Requests in flight per peer (least-connections).
    active: Vec<AtomicU32>,
    /// EWMA of the time to response head per peer, in microseconds; 0: not measured.
    ewma_us: Vec<AtomicU64>,
    /// Round-robin cursor for ties and for the fallback when a key is missing.
    cursor: AtomicUsize,
    /// Each peer's health (shared with the other snapshots and the active checker).
    health: Vec<Arc<TargetHealth>>,
    checks: Arc<Checks>,
    /// The upstream's name, for logs.
    name: String,
}

/// What the balancer may read of a request.
pub struct Request<'a> {
    pub consumer_id: Option<&'a str>,
    pub client_ip: IpAddr,
    pub headers: &'a HeaderMap,
    pub path: &'a str,
    pub query: Option<&'a str>,
    pub captures: Option<&'a [(Option<String>, String)]>,
}

/// A chosen peer, and a cookie to set when hashing on a cookie the client did not send.
pub struct Pick<'b> {
    pub index: usize,
    pub peer: &'b Peer,
    pub set_cookie: Option<HeaderValue>,
}

/// The algorithm's settings, from the upstream entity.
pub struct Settings {
    pub algorithm: String,
    pub hash_on: HashOn,
    pub hash_fallback: HashOn,
    pub slots: u32,
}

/// FNV-1a, 64 bits folded to 32: a stable hash, the same on every node and build.
fn hash32(data: &[u8]) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in data {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    // Final avalanche (from murmur3's fmix64): FNV alone clusters similar keys.
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    (h ^ (h >> 32)) as u32
}

fn gcd(a: i64, b: i64) -> i64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

impl Balancer {
    pub fn new(
        peers: Vec<(Peer, u32)>,
        host_header: Option<HeaderValue>,
        settings: &Settings,
    ) -> Balancer {
        let health = peers.iter().map(|_| Arc::default()).collect();
        Self::with_health(
            peers,
            host_header,
            settings,
            health,
            Arc::new(Checks::from_config(&serde_json::Value::Null)),
            String::new(),
        )
    }

    /// A balancer whose peers' health is tracked (`health` aligned with `peers`).
    pub fn with_health(
        peers: Vec<(Peer, u32)>,
        host_header: Option<HeaderValue>,
        settings: &Settings,
        health: Vec<Arc<TargetHealth>>,
        checks: Arc<Checks>,
        name: String,
    ) -> Balancer {
        let weights: Vec<u32> = peers.iter().map(|(_, w)| *w).collect();
        let algorithm = match settings.algorithm.as_str() {
            "consistent-hashing" if !matches!(settings.hash_on, HashOn::None) => {
                Algorithm::ConsistentHashing {
                    continuum: continuum(&peers, settings.slots),
                    hash_on: settings.hash_on.clone(),
                    fallback: settings.hash_fallback.clone(),
                }
            }
            "least-connections" => Algorithm::LeastConnections,
            "latency" => Algorithm::Latency,
            _ => Algorithm::RoundRobin {
                schedule: schedule(&weights),
                cursor: AtomicUsize::new(0),
            },
        };
        let n = peers.len();
        Balancer {
            peers: peers.into_iter().map(|(p, _)| p).collect(),
            host_header,
            weights,
            algorithm,
            active: (0..n).map(|_| AtomicU32::new(0)).collect(),
            ewma_us: (0..n).map(|_| AtomicU64::new(0)).collect(),
            cursor: AtomicUsize::new(0),
            health,
            checks,
            name,
        }
    }

    /// Whether a peer may be chosen: it has a weight and is healthy.
    fn usable(&self, i: usize) -> bool {
        self.weights[i] > 0 && self.health[i].healthy()
    }

    /// Kong's `healthchecks.threshold`: under this percentage of healthy weight the whole
    /// upstream counts as down.
    fn over_threshold(&self) -> bool {
        if self.checks.threshold <= 0.0 {
            return true;
        }
        let total: u64 = self.weights.iter().map(|w| *w as u64).sum();
        let healthy: u64 = (0..self.peers.len())
            .filter(|i| self.usable(*i))
            .map(|i| self.weights[i] as u64)
            .sum();
        total > 0 && (healthy as f64) * 100.0 / (total as f64) >= self.checks.threshold
    }

    /// Round-robin only: the next peer (kept for callers without a request).
    #[cfg(test)]
    pub fn next(&self) -> Option<&Peer> {
        self.round_robin().map(|i| &self.peers[i])
    }

    fn round_robin(&self) -> Option<usize> {
        match &self.algorithm {
            Algorithm::RoundRobin { schedule, cursor } => {
                // Unhealthy targets are stepped over (at most one period).
                for _ in 0..schedule.len() {
                    let i = cursor.fetch_add(1, Ordering::Relaxed) % schedule.len();
                    let p = schedule[i] as usize;
                    if self.health[p].healthy() {
                        return Some(p);
                    }
                }
                None
            }
            _ => self.weighted_rotation(),
        }
    }

    /// Any target with a weight, in turn (hashing's fallback when a request has no key).
    fn weighted_rotation(&self) -> Option<usize> {
        let live: Vec<usize> = (0..self.peers.len()).filter(|i| self.usable(*i)).collect();
        if live.is_empty() {
            return None;
        }
        Some(live[self.cursor.fetch_add(1, Ordering::Relaxed) % live.len()])
    }

    /// Chooses a peer for a request; `attempt` > 0 for retries, which avoid the peers in
    /// `tried` when another has a weight.
    pub fn pick(&self, req: &Request<'_>, attempt: u32, tried: &[usize]) -> Option<Pick<'_>> {
        if !self.over_threshold() {
            return None;
        }
        let mut set_cookie = None;
        let index = match &self.algorithm {
            Algorithm::RoundRobin { .. } => {
                let mut i = self.round_robin()?;
                // A retry skips targets already tried, within one period.
                for _ in 0..self.peers.len() * 2 {
                    if attempt == 0 || !tried.contains(&i) {
                        break;
                    }
                    i = self.round_robin()?;
                }
                i
            }
            Algorithm::ConsistentHashing {
                continuum,
                hash_on,
                fallback,
            } => {
                if continuum.is_empty() {
                    return None;
                }
                // The key from hash_on, else from hash_fallback; a cookie the client does not
                // have yet is made up and set on the response (Kong's behaviour), so its later
                // requests stick to the same target.
                let mut key = None;
                for on in [hash_on, fallback] {
                    key = key_of(on, req);
                    if key.is_none() {
                        if let HashOn::Cookie(name, path) = on {
                            let value = uuid::Uuid::new_v4().simple().to_string();
                            set_cookie =
                                HeaderValue::from_str(&format!("{name}={value}; Path={path}")).ok();
                            key = Some(value);
                        }
                    }
                    if key.is_some() {
                        break;
                    }
                }
                match key {
                    Some(k) => {
                        let h = hash32(k.as_bytes());
                        let start = continuum.partition_point(|(p, _)| *p < h);
                        // The first point's peer; a retry walks on to a peer not tried yet.
                        let mut chosen = None;
                        for step in 0..continuum.len() {
                            let (_, peer) = continuum[(start + step) % continuum.len()];
                            let peer = peer as usize;
                            // The next point of a healthy target (its keys come back when it
                            // recovers).
                            if !self.health[peer].healthy() {
                                continue;
                            }
                            if attempt == 0 || !tried.contains(&peer) {
                                chosen = Some(peer);
                                break;
                            }
                            chosen.get_or_insert(peer);
                        }
                        chosen?
                    }
                    None => self.weighted_rotation()?,
                }
            }
            Algorithm::LeastConnections => self.least(
                |i| (self.active[i].load(Ordering::Relaxed) as f64 + 1.0) / self.weights[i] as f64,
                attempt,
                tried,
            )?,
            Algorithm::Latency => self.least(
                |i| {
                    let e = self.ewma_us[i].load(Ordering::Relaxed);
                    // Not measured yet: tried first, so every target gets measured.
                    if e == 0 {
                        0.0
                    } else {
                        e as f64 / self.weights[i] as f64
                    }
                },
                attempt,
                tried,
            )?,
        };
        self.active[index].fetch_add(1, Ordering::Relaxed);
        Some(Pick {
            index,
            peer: &self.peers[index],
            set_cookie,
        })
    }

    /// The weighted target with the lowest score; ties go round in turn.
    fn least(&self, score: impl Fn(usize) -> f64, attempt: u32, tried: &[usize]) -> Option<usize> {
        let n = self.peers.len();
        let offset = self.cursor.fetch_add(1, Ordering::Relaxed);
        let mut best: Option<(f64, usize)> = None;
        for k in 0..n {
            let i = (offset + k) % n;
            if !self.usable(i) || (attempt > 0 && tried.contains(&i) && n > 1) {
                continue;
            }
            let s = score(i);
            if best.is_none_or(|(b, _)| s < b) {
                best = Some((s, i));
            }
        }
        best.map(|(_, i)| i).or_else(|| self.weighted_rotation())
    }

    /// What a request to `index` showed, for passive health checks; then `done`.
    pub fn report(&self, index: usize, outcome: Outcome, elapsed: Option<Duration>) {
        if let Some(healthy) = self.health[index].record(outcome, &self.checks.passive) {
            let p = &self.peers[index];
            tracing::warn!(
                "health checks: target {}:{} of upstream {} is now {} (passive: {outcome:?})",
                p.host,
                p.port,
                self.name,
                if healthy { "healthy" } else { "unhealthy" }
            );
        }
        self.done(index, elapsed);
    }

    /// The request to `index` got its response head after `elapsed` (or failed: `None`).
    pub fn done(&self, index: usize, elapsed: Option<Duration>) {
        let _ = self.active[index].fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
            Some(n.saturating_sub(1))
        });
        if let (Algorithm::Latency, Some(t)) = (&self.algorithm, elapsed) {
            let sample = (t.as_micros() as u64).max(1);
            let _ = self.ewma_us[index].fetch_update(Ordering::Relaxed, Ordering::Relaxed, |e| {
                // Weight 0.3 for the newest sample: a slow target shows within a few requests.
                Some(if e == 0 {
                    sample
                } else {
                    (e * 7 + sample * 3) / 10
                })
            });
        }
    }
}

/// The key a request offers for `hash_on`, if it has one.
fn key_of(on: &HashOn, req: &Request<'_>) -> Option<String> {
    match on {
        HashOn::None => None,
        HashOn::Consumer => req.consumer_id.map(String::from),
        HashOn::Ip => Some(req.client_ip.to_string()),
        HashOn::Header(h) => req
            .headers
            .get(h)
            .and_then(|v| v.to_str().ok())
            .map(String::from),
        HashOn::Cookie(name, _) => req
            .headers
            .get_all(http::header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .find_map(|kv| {
                let (k, v) = kv.trim().split_once('=')?;
                (k == name).then(|| v.to_string())
            }),
        HashOn::Path => Some(req.path.to_string()),
        HashOn::QueryArg(arg) => req.query.and_then(|q| {
            q.split('&').find_map(|kv| {
                let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                (k == arg).then(|| v.to_string())
            })
        }),
        HashOn::UriCapture(name) => req.captures.and_then(|c| {
            c.iter()
                .find(|(n, _)| n.as_deref() == Some(name.as_str()))
                .map(|(_, v)| v.clone())
        }),
    }
}

/// nginx's smooth weighted round-robin, one period (reduced by the gcd, at most 10k entries).
fn schedule(weights: &[u32]) -> Vec<u32> {
    let weights: Vec<i64> = weights.iter().map(|w| *w as i64).collect();
    let total: i64 = weights.iter().sum();
    let mut schedule = Vec::new();
    if total > 0 {
        let g = weights
            .iter()
            .filter(|w| **w > 0)
            .fold(0i64, |a, b| gcd(a, *b));
        let period = (total / g).min(10_000);
        let mut current = vec![0i64; weights.len()];
        for _ in 0..period {
            let mut best = 0;
            for i in 0..weights.len() {
                current[i] += weights[i];
                if current[i] > current[best] {
                    best = i;
                }
            }
            current[best] -= total;
            schedule.push(best as u32);
        }
    }
    schedule
}

/// The ring: each target gets `weight × slots / 1000` points (1000 for Kong's default weight
/// 100 and 10000 slots), each at a hash of its target and number. A target's points depend
/// only on itself, so adding or removing one moves exactly the keys its points cover.
fn continuum(peers: &[(Peer, u32)], slots: u32) -> Vec<(u32, u32)> {
    let mut points = Vec::new();
    for (i, (p, w)) in peers.iter().enumerate() {
        if *w == 0 {
            continue;
        }
        let n = (*w as u64 * slots as u64 / 1000).clamp(1, 100_000);
        for k in 0..n {
            let label = format!("{}:{}-{k}", p.host, p.port);
            points.push((hash32(label.as_bytes()), i as u32));
        }
    }
    points.sort_unstable();
    points
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peers(n: usize) -> Vec<(Peer, u32)> {
        let node = crate::upstream::Upstreams::default();
        (0..n)
            // Kong's default target weight.
            .map(|i| (node.peer(&format!("10.0.0.{i}"), 80, false), 100))
            .collect()
    }

    fn settings(algorithm: &str, hash_on: HashOn) -> Settings {
        Settings {
            algorithm: algorithm.into(),
            hash_on,
            hash_fallback: HashOn::None,
            slots: 10_000,
        }
    }

    fn request<'a>(headers: &'a HeaderMap) -> Request<'a> {
        Request {
            consumer_id: None,
            client_ip: "127.0.0.1".parse().unwrap(),
            headers,
            path: "/",
            query: None,
            captures: None,
        }
    }

    #[test]
    fn smooth_weighted_round_robin_respects_weights() {
        let mut p = peers(3);
        p[0].1 = 500;
        let b = Balancer::new(p, None, &settings("round-robin", HashOn::None));
        let mut counts = [0; 3];
        for _ in 0..700 {
            let n = b.next().unwrap();
            let i: usize = n.host.rsplit('.').next().unwrap().parse().unwrap();
            counts[i] += 1;
        }
        assert_eq!(counts, [500, 100, 100]);
        // nginx's sequence for 5,1,1 is a a b a c a a.
        let Algorithm::RoundRobin { schedule, .. } = &b.algorithm else {
            unreachable!()
        };
        assert_eq!(schedule, &vec![0, 0, 1, 0, 2, 0, 0]);
    }

    #[test]
    fn zero_weight_takes_targets_out() {
        let mut p = peers(2);
        p[0].1 = 0;
        p[1].1 = 0;
        let b = Balancer::new(p, None, &settings("round-robin", HashOn::None));
        assert!(b.next().is_none());
    }

    #[test]
    fn adding_a_target_moves_only_its_share_of_keys() {
        let on = || HashOn::Header(HeaderName::from_static("x-key"));
        let three = Balancer::new(peers(3), None, &settings("consistent-hashing", on()));
        let four = Balancer::new(peers(4), None, &settings("consistent-hashing", on()));
        let mut moved = 0;
        let mut per_target = [0; 3];
        for k in 0..2000 {
            let mut h = HeaderMap::new();
            h.insert(
                "x-key",
                HeaderValue::from_str(&format!("user-{k}")).unwrap(),
            );
            let a = three.pick(&request(&h), 0, &[]).unwrap().index;
            let b = four.pick(&request(&h), 0, &[]).unwrap().index;
            per_target[a] += 1;
            if a != b {
                moved += 1;
                // Keys only move to the new target.
                assert_eq!(b, 3);
            }
        }
        // About a quarter moves (2000 / 4 = 500).
        assert!((350..650).contains(&moved), "{moved} keys moved");
        for c in per_target {
            assert!((500..850).contains(&c), "{per_target:?}");
        }
    }

    #[test]
    fn missing_keys_fall_back_and_cookies_are_set() {
        let mut s = settings(
            "consistent-hashing",
            HashOn::Header(HeaderName::from_static("x-key")),
        );
        s.hash_fallback = HashOn::Ip;
        let b = Balancer::new(peers(3), None, &s);
        let h = HeaderMap::new();
        let first = b.pick(&request(&h), 0, &[]).unwrap().index;
        for _ in 0..10 {
            assert_eq!(b.pick(&request(&h), 0, &[]).unwrap().index, first);
        }
        // A retry moves to another target.
        assert_ne!(b.pick(&request(&h), 1, &[first]).unwrap().index, first);
        let c = Balancer::new(
            peers(3),
            None,
            &settings(
                "consistent-hashing",
                HashOn::Cookie("sticky".into(), "/".into()),
            ),
        );
        let p = c.pick(&request(&h), 0, &[]).unwrap();
        let cookie = p.set_cookie.unwrap();
        let cookie = cookie.to_str().unwrap();
        assert!(
            cookie.starts_with("sticky=") && cookie.ends_with("; Path=/"),
            "{cookie}"
        );
        let mut with = HeaderMap::new();
        with.insert(
            http::header::COOKIE,
            HeaderValue::from_str(cookie.split(';').next().unwrap()).unwrap(),
        );
        let again = c.pick(&request(&with), 0, &[]).unwrap();
        assert!(again.set_cookie.is_none());
        assert_eq!(again.index, p.index);
    }

    #[test]
    fn least_connections_and_latency_prefer_the_idle_and_the_fast() {
        let h = HeaderMap::new();
        let b = Balancer::new(peers(2), None, &settings("least-connections", HashOn::None));
        let a = b.pick(&request(&h), 0, &[]).unwrap().index;
        // `a` is busy: the next request goes to the other.
        let other = b.pick(&request(&h), 0, &[]).unwrap().index;
        assert_ne!(a, other);
        b.done(other, None);
        assert_eq!(b.pick(&request(&h), 0, &[]).unwrap().index, other);

        let l = Balancer::new(peers(2), None, &settings("latency", HashOn::None));
        for _ in 0..4 {
            let p = l.pick(&request(&h), 0, &[]).unwrap().index;
            let t = if p == 0 { 50_000 } else { 1_000 };
            l.done(p, Some(Duration::from_micros(t)));
        }
        for _ in 0..10 {
            let p = l.pick(&request(&h), 0, &[]).unwrap().index;
            l.done(p, Some(Duration::from_micros(1_000)));
            assert_eq!(p, 1);
        }
    }
}
