//! What the request path records for Kong's tracing instrumentations beyond the request span
//! (`tracing_instrumentations`: `router`, `balancer`, `plugin_rewrite`, `plugin_access`,
//! `plugin_header_filter`, `dns_query`, `db_query`, or `all`): when the router ran, each
//! plugin's phase, each balancer try, and each try's look-up of a target's host name. (Store
//! look-ups are kept by the plugins that make them, in the request's plugin context.) The runloop fills it only when the node's property asks for one of them (one
//! branch per phase otherwise); tracing plugins turn it into spans in the log phase, for the
//! traces they sample.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// `kong.router`.
pub const ROUTER: u8 = 1;
/// `kong.balancer`, one per try.
pub const BALANCER: u8 = 2;
/// `kong.rewrite.plugin.<name>`.
pub const PLUGIN_REWRITE: u8 = 4;
/// `kong.access.plugin.<name>`.
pub const PLUGIN_ACCESS: u8 = 8;
/// `kong.header_filter.plugin.<name>`.
pub const PLUGIN_HEADER_FILTER: u8 = 16;
/// `kong.dns`, one per try whose target is a host name (Kong's wrapped `toip`).
pub const DNS_QUERY: u8 = 32;
/// `kong.database.query`, one per store look-up a plugin made for the request (a credential
/// or token not cached yet: [`crate::credentials::DbQueries`]).
pub const DB_QUERY: u8 = 64;

/// The instrumentations of a `tracing_instrumentations` list that this record serves, as bits.
pub fn instrumentations(list: &[String]) -> u8 {
    list.iter().fold(0, |m, i| {
        m | match i.as_str() {
            "all" => {
                ROUTER
                    | BALANCER
                    | PLUGIN_REWRITE
                    | PLUGIN_ACCESS
                    | PLUGIN_HEADER_FILTER
                    | DNS_QUERY
                    | DB_QUERY
            }
            "router" => ROUTER,
            "balancer" => BALANCER,
            "plugin_rewrite" => PLUGIN_REWRITE,
            "plugin_access" => PLUGIN_ACCESS,
            "plugin_header_filter" => PLUGIN_HEADER_FILTER,
            "dns_query" => DNS_QUERY,
            "db_query" => DB_QUERY,
            _ => 0,
        }
    })
}

/// One plugin's run in one phase.
pub struct PluginSpan {
    /// `rewrite`, `access` or `header_filter`.
    pub phase: &'static str,
    pub plugin: &'static str,
    pub start: Instant,
    pub end: Instant,
}

/// One balancer try: the peer, when it started and, for a failed try, when it failed and
/// the status Kong gives it (502, or 504 for a timeout). The try that answered ends with the
/// response (`end` unset).
#[derive(Debug)]
pub struct TrySpan {
    /// When the peer's choice began, and when it was made (Kong's `balancer_latency`).
    pub start: Instant,
    pub picked: Instant,
    pub end: Option<Instant>,
    pub ip: Option<IpAddr>,
    pub host: Arc<str>,
    pub port: u16,
    pub failed: Option<u16>,
}

/// One look-up of a target's host name: what Kong's `kong.dns` span says (the address found,
/// or none: the span's error).
#[derive(Debug)]
pub struct DnsSpan {
    pub start: Instant,
    pub end: Instant,
    pub domain: Arc<str>,
    pub port: u16,
    pub ip: Option<IpAddr>,
}

/// One request's record.
pub struct Spans {
    /// Which instrumentations are on (the bits above).
    pub on: u8,
    /// Whether the balancer's tries are recorded (its instrumentation, or a log plugin of the
    /// route that reads them).
    pub record_tries: bool,
    /// The wall clock and the monotonic clock read together, to date the instants below.
    epoch_ns: u64,
    base: Instant,
    pub router: Option<(Instant, Instant)>,
    pub plugins: Vec<PluginSpan>,
    /// Written by the balancer as it tries (through a shared reference the upstream call
    /// holds: one pointer in its future, nothing held across its awaits).
    pub tries: std::cell::RefCell<Vec<TrySpan>>,
    /// Written by the balancer the same way, when `dns_query` is on.
    pub dns: std::cell::RefCell<Vec<DnsSpan>>,
}

impl Spans {
    pub fn new(on: u8, base: Instant) -> Spans {
        let epoch_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            .saturating_sub(base.elapsed().as_nanos() as u64);
        Spans {
            on,
            record_tries: on & BALANCER != 0,
            epoch_ns,
            base,
            router: None,
            plugins: Vec::new(),
            tries: Default::default(),
            dns: Default::default(),
        }
    }

    /// Whether instrumentation `bit` is on.
    #[inline]
    pub fn has(&self, bit: u8) -> bool {
        self.on & bit != 0
    }

    /// When the request started, in nanoseconds since the epoch.
    pub fn start_ns(&self) -> u64 {
        self.epoch_ns
    }

    /// An instant as nanoseconds since the epoch.
    pub fn ns(&self, t: Instant) -> u64 {
        self.epoch_ns + t.saturating_duration_since(self.base).as_nanos() as u64
    }

    /// Records a plugin's run of `phase` from `start` to now.
    pub fn plugin(&mut self, phase: &'static str, plugin: &'static str, start: Instant) {
        self.plugins.push(PluginSpan {
            phase,
            plugin,
            start,
            end: Instant::now(),
        });
    }
}

/// Starts timing a plugin's phase when `spans` records it.
#[inline]
pub fn start(spans: &Option<Box<Spans>>, bit: u8) -> Option<Instant> {
    spans
        .as_deref()
        .filter(|s| s.has(bit))
        .map(|_| Instant::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instrumentations_from_the_property() {
        let l = |v: &[&str]| instrumentations(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(l(&["off"]), 0);
        assert_eq!(l(&["request"]), 0);
        assert_eq!(l(&["router", "balancer"]), ROUTER | BALANCER);
        assert_eq!(l(&["all"]), 127);
        assert_eq!(l(&["db_query"]), DB_QUERY);
        assert_eq!(l(&["dns_query"]), DNS_QUERY);
    }

    #[test]
    fn instants_are_dated_from_the_base() {
        let base = Instant::now();
        let s = Spans::new(ROUTER, base);
        let later = base + std::time::Duration::from_millis(5);
        assert_eq!(s.ns(later) - s.ns(base), 5_000_000);
        assert!(s.has(ROUTER) && !s.has(BALANCER));
    }
}
