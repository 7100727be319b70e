//! Target health: Kong's passive checks (the circuit breaker: the proxy's own responses,
//! connection failures and timeouts) and active checks (probes on an interval), which also
//! bring a recovered target back — Kong users report targets stuck unhealthy when only passive
//! checks run, since an unhealthy target gets no traffic to prove itself with.
//!
//! Health lives outside config snapshots, keyed by upstream id and target, so a reload keeps
//! what was learnt. The balancer skips unhealthy targets; when none is left (or the healthy
//! weight falls under `healthchecks.threshold` percent) the request gets Kong's 503.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use serde_json::Value;

/// Counters and thresholds of one side (passive or active).
#[derive(Debug, Clone, Default)]
pub struct Rules {
    pub healthy_statuses: Vec<u16>,
    /// Successes that make an unhealthy target healthy again (0: never by this side).
    pub successes: u32,
    pub unhealthy_statuses: Vec<u16>,
    /// Failures of each kind that make a healthy target unhealthy (0: not counted).
    pub http_failures: u32,
    pub tcp_failures: u32,
    pub timeouts: u32,
}

impl Rules {
    fn enabled(&self) -> bool {
        self.successes > 0 || self.http_failures > 0 || self.tcp_failures > 0 || self.timeouts > 0
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeKind {
    Http,
    Https,
    Tcp,
}

/// Active checks: what to probe and how often.
#[derive(Debug, Clone)]
pub struct Active {
    pub kind: ProbeKind,
    pub timeout: Duration,
    pub concurrency: usize,
    pub http_path: String,
    pub headers: Vec<(String, String)>,
    pub https_verify: bool,
    /// Probe interval while healthy / unhealthy (`None`: not probed in that state).
    pub healthy_interval: Option<Duration>,
    pub unhealthy_interval: Option<Duration>,
    pub rules: Rules,
}

/// An upstream's `healthchecks`, with Kong's defaults.
#[derive(Debug, Clone)]
pub struct Checks {
    pub threshold: f64,
    pub active: Active,
    pub passive: Rules,
}

impl Checks {
    /// Whether any check runs (else the Admin API says HEALTHCHECKS_OFF).
    pub fn enabled(&self) -> bool {
        self.passive.enabled()
            || self.active.healthy_interval.is_some()
            || self.active.unhealthy_interval.is_some()
    }

    pub fn active_enabled(&self) -> bool {
        (self.active.healthy_interval.is_some() || self.active.unhealthy_interval.is_some())
            && self.active.rules.enabled()
    }

    /// Parses `healthchecks` (absent fields take Kong's defaults).
    pub fn from_config(v: &Value) -> Checks {
        let num = |v: &Value, d: f64| v.as_f64().unwrap_or(d);
        let count = |v: &Value| v.as_u64().unwrap_or(0) as u32;
        let statuses = |v: &Value, d: &[u16]| -> Vec<u16> {
            v.as_array().map_or(d.to_vec(), |a| {
                a.iter()
                    .filter_map(|s| s.as_u64())
                    .map(|s| s as u16)
                    .collect()
            })
        };
        let interval = |v: &Value| {
            let s = num(v, 0.0);
            (s > 0.0).then(|| Duration::from_secs_f64(s))
        };
        let a = &v["active"];
        let p = &v["passive"];
        Checks {
            threshold: num(&v["threshold"], 0.0),
            active: Active {
                kind: match a["type"].as_str() {
                    Some("https") => ProbeKind::Https,
                    Some("tcp") => ProbeKind::Tcp,
                    _ => ProbeKind::Http,
                },
                timeout: Duration::from_secs_f64(num(&a["timeout"], 1.0).max(0.001)),
                concurrency: (num(&a["concurrency"], 10.0) as usize).max(1),
                http_path: a["http_path"].as_str().unwrap_or("/").to_string(),
                headers: a["headers"]
                    .as_object()
                    .map(|m| {
                        m.iter()
                            .flat_map(|(k, vs)| {
                                let vals: Vec<String> = match vs {
                                    Value::Array(a) => a
                                        .iter()
                                        .filter_map(|x| x.as_str().map(String::from))
                                        .collect(),
                                    Value::String(s) => vec![s.clone()],
                                    _ => Vec::new(),
                                };
                                vals.into_iter().map(move |x| (k.clone(), x))
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
                https_verify: a["https_verify_certificate"].as_bool().unwrap_or(true),
                healthy_interval: interval(&a["healthy"]["interval"]),
                unhealthy_interval: interval(&a["unhealthy"]["interval"]),
                rules: Rules {
                    healthy_statuses: statuses(&a["healthy"]["http_statuses"], &[200, 302]),
                    successes: count(&a["healthy"]["successes"]),
                    unhealthy_statuses: statuses(
                        &a["unhealthy"]["http_statuses"],
                        &[429, 404, 500, 501, 502, 503, 504, 505],
                    ),
                    http_failures: count(&a["unhealthy"]["http_failures"]),
                    tcp_failures: count(&a["unhealthy"]["tcp_failures"]),
                    timeouts: count(&a["unhealthy"]["timeouts"]),
                },
            },
            passive: Rules {
                healthy_statuses: statuses(
                    &p["healthy"]["http_statuses"],
                    &[
                        200, 201, 202, 203, 204, 205, 206, 207, 208, 226, 300, 301, 302, 303, 304,
                        305, 306, 307, 308,
                    ],
                ),
                successes: count(&p["healthy"]["successes"]),
                unhealthy_statuses: statuses(&p["unhealthy"]["http_statuses"], &[429, 500, 503]),
                http_failures: count(&p["unhealthy"]["http_failures"]),
                tcp_failures: count(&p["unhealthy"]["tcp_failures"]),
                timeouts: count(&p["unhealthy"]["timeouts"]),
            },
        }
    }
}

/// What one request or probe to a target showed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Status(u16),
    TcpFailure,
    Timeout,
}

/// One target's health, shared by every snapshot and worker.
#[derive(Default)]
pub struct TargetHealth {
    unhealthy: AtomicBool,
    successes: AtomicU32,
    http_failures: AtomicU32,
    tcp_failures: AtomicU32,
    timeouts: AtomicU32,
}

impl TargetHealth {
    pub fn healthy(&self) -> bool {
        !self.unhealthy.load(Ordering::Relaxed)
    }

    /// Sets the health by hand (the Admin API), counters reset.
    pub fn set(&self, healthy: bool) {
        self.unhealthy.store(!healthy, Ordering::Relaxed);
        self.reset();
    }

    fn reset(&self) {
        for c in [
            &self.successes,
            &self.http_failures,
            &self.tcp_failures,
            &self.timeouts,
        ] {
            c.store(0, Ordering::Relaxed);
        }
    }

    /// Counts an outcome under `rules`; returns the new health when it changed.
    pub fn record(&self, outcome: Outcome, rules: &Rules) -> Option<bool> {
        let bump =
            |c: &AtomicU32, limit: u32| limit > 0 && c.fetch_add(1, Ordering::Relaxed) + 1 >= limit;
        let success = matches!(outcome, Outcome::Status(s) if rules.healthy_statuses.contains(&s));
        if success {
            // Consecutive counts: a success clears the failures.
            self.http_failures.store(0, Ordering::Relaxed);
            self.tcp_failures.store(0, Ordering::Relaxed);
            self.timeouts.store(0, Ordering::Relaxed);
            if !self.healthy() && bump(&self.successes, rules.successes) {
                self.set(true);
                return Some(true);
            }
            return None;
        }
        let tripped = match outcome {
            Outcome::Status(s) if rules.unhealthy_statuses.contains(&s) => {
                bump(&self.http_failures, rules.http_failures)
            }
            Outcome::Status(_) => return None,
            Outcome::TcpFailure => bump(&self.tcp_failures, rules.tcp_failures),
            Outcome::Timeout => bump(&self.timeouts, rules.timeouts),
        };
        self.successes.store(0, Ordering::Relaxed);
        if tripped && self.healthy() {
            self.set(false);
            return Some(false);
        }
        None
    }
}

/// One target the active checker probes.
pub struct Probe {
    pub upstream: String,
    pub host: String,
    pub port: u16,
    /// Where the target is: its address (an IP target) or its name in the node's resolver.
    pub address: Option<std::net::SocketAddr>,
    pub name: Option<Arc<crate::upstream::dns::Name>>,
    pub health: Arc<TargetHealth>,
    pub checks: Arc<Checks>,
}

/// A node's target health: what passive and active checks have learnt, by (upstream id,
/// target `host:port`), kept across config reloads; and the running config's probes, which
/// the checker thread runs.
#[derive(Default)]
pub struct Health {
    targets: DashMap<(String, String), Arc<TargetHealth>>,
    probes: Mutex<Vec<Arc<Probe>>>,
    /// Wakes the checker when probes are installed (it sleeps while there are none).
    probes_set: tokio::sync::Notify,
}

impl Health {
    /// The state of a target, made healthy when first asked for (a config being compiled).
    pub fn target(&self, upstream_id: &str, target: &str) -> Arc<TargetHealth> {
        let key = (upstream_id.to_string(), target.to_string());
        if let Some(h) = self.targets.get(&key) {
            return h.clone();
        }
        self.targets.entry(key).or_default().clone()
    }

    /// The state of a target if it is known (for the Admin API).
    pub fn lookup(&self, upstream_id: &str, target: &str) -> Option<Arc<TargetHealth>> {
        self.targets
            .get(&(upstream_id.to_string(), target.to_string()))
            .map(|h| h.clone())
    }

    /// Installs the probes of a config just swapped in, and forgets the targets that no
    /// config holds any more (one that comes back later starts healthy, as in Kong).
    pub fn watch(&self, probes: Vec<Arc<Probe>>) {
        *self.probes.lock().unwrap_or_else(|e| e.into_inner()) = probes;
        self.probes_set.notify_one();
        // A snapshot (running, retired but still in use, or being compiled) holds the state
        // of each of its targets; only the map holds the others.
        self.targets.retain(|_, h| Arc::strong_count(h) > 1);
    }

    /// How many targets have a health state.
    #[cfg(test)]
    fn known_targets(&self) -> usize {
        self.targets.len()
    }

    /// Starts the thread that runs the active probes. Called once at start-up by a thread at
    /// the proxy workers' CPU priority, which the checker inherits: the control plane runs at
    /// a lower one, and a probe's answer read late counts as a timeout.
    pub fn start_checker(self: &Arc<Self>) -> std::io::Result<()> {
        let health = self.clone();
        std::thread::Builder::new()
            .name("healthchecker".into())
            .spawn(move || {
                match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt.block_on(health.checker()),
                    Err(e) => tracing::error!("health checks: cannot start: {e}"),
                }
            })
            .map(|_| ())
    }

    async fn checker(self: Arc<Self>) {
        let mut due: std::collections::HashMap<(String, String, u16), Instant> = Default::default();
        let limit = Arc::new(tokio::sync::Semaphore::new(64));
        loop {
            let installed = self.probes_set.notified();
            let probes: Vec<Arc<Probe>> = self
                .probes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            if probes.is_empty() {
                due.clear();
                installed.await;
                continue;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            let now = Instant::now();
            for p in probes {
                let a = &p.checks.active;
                let interval = if p.health.healthy() {
                    a.healthy_interval
                } else {
                    a.unhealthy_interval
                };
                let Some(interval) = interval else { continue };
                let key = (p.upstream.clone(), p.host.clone(), p.port);
                if due.get(&key).is_some_and(|t| now < *t) {
                    continue;
                }
                due.insert(key, now + interval);
                let Ok(permit) = limit.clone().try_acquire_owned() else {
                    continue;
                };
                tokio::spawn(async move {
                    let outcome = probe(&p).await;
                    if let Some(healthy) = p.health.record(outcome, &p.checks.active.rules) {
                        tracing::warn!(
                        "health checks: target {}:{} of upstream {} is now {} (active: {outcome:?})",
                        p.host,
                        p.port,
                        p.upstream,
                        if healthy { "healthy" } else { "unhealthy" }
                    );
                    }
                    drop(permit);
                });
            }
        }
    }
}

/// Probes a target once.
async fn probe(p: &Probe) -> Outcome {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let a = &p.checks.active;
    let work = async {
        let addr = match (p.address, &p.name) {
            (Some(a), _) => a,
            (None, Some(n)) => n.address(p.port).await.map_err(|_| Outcome::TcpFailure)?,
            (None, None) => return Err(Outcome::TcpFailure),
        };
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|_| Outcome::TcpFailure)?;
        if a.kind == ProbeKind::Tcp {
            return Ok(Outcome::Status(200));
        }
        let mut request = format!(
            "GET {} HTTP/1.1\r\nHost: {}:{}\r\nUser-Agent: turnpike-healthcheck\r\nConnection: close\r\n",
            a.http_path, p.host, p.port
        );
        for (k, v) in &a.headers {
            request.push_str(&format!("{k}: {v}\r\n"));
        }
        request.push_str("\r\n");
        let mut head = vec![0u8; 1024];
        let n = if a.kind == ProbeKind::Https {
            let cfg = crate::tls::client_config(a.https_verify, &[], None)
                .map_err(|_| Outcome::TcpFailure)?;
            let name = rustls::pki_types::ServerName::try_from(p.host.clone())
                .map_err(|_| Outcome::TcpFailure)?;
            let mut tls = tokio_rustls::TlsConnector::from(cfg)
                .connect(name, stream)
                .await
                .map_err(|_| Outcome::TcpFailure)?;
            tls.write_all(request.as_bytes())
                .await
                .map_err(|_| Outcome::TcpFailure)?;
            tls.read(&mut head).await.map_err(|_| Outcome::TcpFailure)?
        } else {
            let mut stream = stream;
            stream
                .write_all(request.as_bytes())
                .await
                .map_err(|_| Outcome::TcpFailure)?;
            stream
                .read(&mut head)
                .await
                .map_err(|_| Outcome::TcpFailure)?
        };
        // "HTTP/1.1 200 ..."
        let line = std::str::from_utf8(&head[..n]).map_err(|_| Outcome::TcpFailure)?;
        line.split(' ')
            .nth(1)
            .and_then(|s| s.parse::<u16>().ok())
            .map(Outcome::Status)
            .ok_or(Outcome::TcpFailure)
    };
    match tokio::time::timeout(a.timeout, work).await {
        Ok(Ok(o)) | Ok(Err(o)) => o,
        Err(_) => Outcome::Timeout,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_trip_and_recover() {
        let rules = Rules {
            healthy_statuses: vec![200],
            successes: 2,
            unhealthy_statuses: vec![500],
            http_failures: 3,
            tcp_failures: 1,
            timeouts: 2,
        };
        let h = TargetHealth::default();
        assert_eq!(h.record(Outcome::Status(500), &rules), None);
        assert_eq!(h.record(Outcome::Status(500), &rules), None);
        // A success in between: failures are consecutive.
        assert_eq!(h.record(Outcome::Status(200), &rules), None);
        assert_eq!(h.record(Outcome::Status(500), &rules), None);
        assert_eq!(h.record(Outcome::Status(500), &rules), None);
        assert_eq!(h.record(Outcome::Status(500), &rules), Some(false));
        assert!(!h.healthy());
        assert_eq!(h.record(Outcome::Status(200), &rules), None);
        assert_eq!(h.record(Outcome::Status(200), &rules), Some(true));
        assert_eq!(h.record(Outcome::TcpFailure, &rules), Some(false));
        h.set(true);
        assert_eq!(h.record(Outcome::Timeout, &rules), None);
        assert_eq!(h.record(Outcome::Timeout, &rules), Some(false));
    }

    #[test]
    fn a_reload_keeps_what_was_learnt_and_forgets_removed_targets() {
        let health = Health::default();
        let kept = health.target("u", "a:80");
        kept.set(false);
        drop(health.target("u", "gone:80"));
        // The new config holds "a:80" (as its balancer would); nothing holds "gone:80".
        health.watch(Vec::new());
        assert_eq!(health.known_targets(), 1);
        assert!(!health.lookup("u", "a:80").unwrap().healthy());
        assert!(health.lookup("u", "gone:80").is_none());
        // A target that comes back starts healthy.
        assert!(health.target("u", "gone:80").healthy());
    }

    #[test]
    fn kong_defaults() {
        let c = Checks::from_config(&Value::Null);
        assert!(!c.enabled());
        assert_eq!(c.active.rules.healthy_statuses, vec![200, 302]);
        assert_eq!(c.passive.unhealthy_statuses, vec![429, 500, 503]);
        let c = Checks::from_config(&serde_json::json!({
            "active": {"healthy": {"interval": 0.5, "successes": 1}, "unhealthy": {"interval": 0.5, "tcp_failures": 1}},
            "passive": {"unhealthy": {"http_failures": 2}}
        }));
        assert!(c.enabled() && c.active_enabled());
        assert_eq!(c.active.healthy_interval, Some(Duration::from_millis(500)));
        assert_eq!(c.passive.http_failures, 2);
    }
}
