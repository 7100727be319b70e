//! A configuration snapshot: the validated entities plus everything compiled from them (router,
//! per-service upstream settings, balancers, TLS certificates). Immutable once built; the data
//! plane swaps a whole new one in.

use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;
use rustc_hash::FxHashMap;
use turnpike_config::declarative::vault;
use turnpike_config::Config;
use turnpike_router::Router;

use turnpike_plugins::Handler;
use turnpike_plugins::Phases;

use crate::tls::{self, CertStore};
pub use crate::upstream::balancer::Balancer;
use crate::upstream::balancer::HashOn;
use crate::upstream::peer::peer;
pub use crate::upstream::peer::{peer_address, Peer};

pub struct Snapshot {
    pub config: Config,
    pub router: Router,
    /// Aligned with `config.services`.
    pub services: Vec<ServiceInfo>,
    pub certs: CertStore,
    /// Aligned with `config.routes`: the plugins that run on each route, highest PRIORITY first.
    pub chains: Vec<Chain>,
    /// Aligned with `config.routes`: whether a plugin of the route reads the request body.
    pub chains_want_body: Vec<bool>,
    /// Aligned with `config.routes`: whether a plugin of the route has a header_filter phase.
    pub chains_filter: Vec<bool>,
    /// Aligned with `config.routes`: whether plugins of the route have a log phase
    /// (`LOGS`) and read headers there (`LOG_HEADERS`).
    pub chains_log: Vec<u8>,
    /// The targets active health checks probe while this config runs.
    pub probes: Vec<Arc<crate::upstream::health::Probe>>,
    /// Global plugins with a rewrite phase, highest PRIORITY first: run before the router on
    /// every request (Kong runs only global plugins there). Empty for most configs.
    pub global_rewrite: Vec<Bound>,
    /// Global plugins with a certificate phase, run in every TLS handshake.
    pub global_certificate: Vec<Bound>,
    /// Entities this config holds that the data plane could not build, each left out (a
    /// route, a certificate) or failing closed (a plugin answers 500, a service 502) while
    /// everything else applies: one line per entity, for the log, `/status` and a metric.
    pub problems: Vec<String>,
}

/// Stands in for a plugin config that does not build: requests on its routes get 500, as in
/// Kong when a plugin fails, never a request let through without, say, its authentication.
struct BrokenPlugin;

impl Handler for BrokenPlugin {
    fn phases(&self) -> turnpike_plugins::Phases {
        turnpike_plugins::Phases::ACCESS
    }
    fn access(&self, _req: &mut turnpike_plugins::AccessRequest<'_>) -> turnpike_plugins::Access {
        turnpike_plugins::Access::Exit(turnpike_plugins::Exit::message(
            http::StatusCode::INTERNAL_SERVER_ERROR,
            "An unexpected error occurred",
        ))
    }
}

/// A route's compiled plugin chain (shared: most routes have the same, often empty, one).
pub type Chain = Arc<[Slot]>;

/// One plugin in a route's chain: the config that applies without a consumer, and the
/// consumer-scoped configs that replace it once authentication has named the consumer.
pub struct Slot {
    pub handler: Option<Bound>,
    pub by_consumer: Option<Arc<ConsumerHandlers>>,
}

/// A configured plugin with the request protocols it runs for (its `protocols` field).
#[derive(Clone)]
pub struct Bound {
    pub handler: Arc<dyn Handler>,
    pub protocols: u8,
}

/// Request protocols as bits, for a plugin's `protocols`.
/// Per-route log flags, compiled with the snapshot.
pub const LOGS: u8 = 1;
/// A log plugin of the route reads headers.
pub const LOG_HEADERS: u8 = 2;

pub const PROTO_HTTP: u8 = 1;
pub const PROTO_HTTPS: u8 = 2;

fn protocol_mask(protocols: &[String]) -> u8 {
    protocols.iter().fold(0, |m, p| match p.as_str() {
        "http" | "grpc" | "ws" => m | PROTO_HTTP,
        "https" | "grpcs" | "wss" => m | PROTO_HTTPS,
        _ => m,
    })
}

/// Consumer-scoped configs of one plugin on one route, by consumer id.
pub type ConsumerHandlers = FxHashMap<String, Bound>;

impl Slot {
    /// The config that applies to a request, given the consumer known at this point and the
    /// request's protocol (`PROTO_*`): a config whose `protocols` leave the request out does
    /// not run (and does not hand over to a less specific one).
    #[inline]
    pub fn handler_for(&self, consumer: Option<&str>, protocol: u8) -> Option<&Arc<dyn Handler>> {
        let bound = match (&self.by_consumer, consumer) {
            (Some(map), Some(c)) => map.get(c).or(self.handler.as_ref()),
            _ => self.handler.as_ref(),
        }?;
        (bound.protocols & protocol != 0).then_some(&bound.handler)
    }
}

/// Per route, the most specific enabled config of each plugin, in Kong's precedence:
/// Route+Service+Consumer > Route+Consumer > Service+Consumer > Route+Service > Consumer >
/// Route > Service > Global. The consumer-free part is resolved here; the consumer-scoped
/// part becomes a per-slot map looked up, per request, with the consumer authentication found
/// (plugins run in PRIORITY order, so the auth plugins have run by then). Plugins are indexed
/// by scope first, so the cost is per route times the plugins that apply to it.
fn compile_chains(
    config: &Config,
    registry: &turnpike_plugins::Registry,
    problems: &mut Vec<String>,
) -> (Vec<Chain>, Vec<Bound>) {
    type Entry = (i32, &'static str, Bound);
    type Chosen = (&'static str, Option<Bound>, bool);
    type ByConsumer<'a> = FxHashMap<&'static str, FxHashMap<&'a str, Bound>>;
    let build_ctx = registry.build_context(config);
    let mut global: Vec<Entry> = Vec::new();
    let mut by_service: FxHashMap<&str, Vec<Entry>> = FxHashMap::default();
    let mut by_route: FxHashMap<&str, Vec<Entry>> = FxHashMap::default();
    let mut by_both: FxHashMap<(&str, &str), Vec<Entry>> = FxHashMap::default();
    // Consumer-scoped: consumer only (shared by every route), and with a route and/or service.
    let mut consumer_only: ByConsumer = FxHashMap::default();
    let mut consumer_scoped: FxHashMap<(Option<&str>, Option<&str>), ByConsumer> =
        FxHashMap::default();
    let mut priorities: FxHashMap<&'static str, i32> = FxHashMap::default();
    for p in config.plugins.iter().filter(|p| p.enabled) {
        // A config that does not build fails closed (see `BrokenPlugin`), under its own name
        // and priority where the plugin exists, first in the chain where it does not.
        let spec = registry.get(&p.name);
        let (name, priority) = spec.map_or(("(unavailable plugin)", i32::MAX), |s| {
            (s.name(), s.priority())
        });
        // Secrets written as `{vault://...}` references are resolved here, into a copy: the
        // stored config keeps the reference.
        let resolved;
        let plugin_config = if vault::has_reference(&p.config) {
            let mut c = p.config.clone();
            match vault::resolve_in(&mut c, &config.records, &vault::process_env) {
                Ok(()) => {
                    resolved = c;
                    Ok(&resolved)
                }
                Err(e) => Err(format!("plugin {} ({}): {e}", p.id, p.name)),
            }
        } else {
            Ok(&p.config)
        };
        let built = match (spec, plugin_config) {
            (_, Err(e)) => Err(e),
            (Some(spec), Ok(plugin_config)) => spec
                .build(plugin_config, &build_ctx)
                .map_err(|e| format!("plugin {} ({}): {e}", p.id, p.name)),
            (None, _) => Err(format!("plugin {}: '{}' is not available", p.id, p.name)),
        };
        let handler = Bound {
            handler: built.unwrap_or_else(|e| {
                problems.push(e);
                Arc::new(BrokenPlugin)
            }),
            protocols: protocol_mask(&p.protocols),
        };
        priorities.insert(name, priority);
        let route = p.route.as_ref().map(|r| r.id.as_str());
        let service = p.service.as_ref().map(|s| s.id.as_str());
        if let Some(c) = &p.consumer {
            let target = match (route, service) {
                (None, None) => &mut consumer_only,
                key => consumer_scoped.entry(key).or_default(),
            };
            target
                .entry(name)
                .or_default()
                .insert(c.id.as_str(), handler);
            continue;
        }
        let entry = (priority, name, handler);
        match (route, service) {
            (Some(r), Some(s)) => by_both.entry((r, s)).or_default().push(entry),
            (Some(r), None) => by_route.entry(r).or_default().push(entry),
            (None, Some(s)) => by_service.entry(s).or_default().push(entry),
            (None, None) => global.push(entry),
        }
    }
    let consumer_only: FxHashMap<&'static str, Arc<ConsumerHandlers>> = consumer_only
        .into_iter()
        .map(|(name, m)| {
            let owned: ConsumerHandlers = m.into_iter().map(|(c, h)| (c.to_string(), h)).collect();
            (name, Arc::new(owned))
        })
        .collect();
    let empty: Chain = Arc::from(Vec::<Slot>::new());
    let nothing: &[Entry] = &[];
    let no_scoped: ByConsumer = FxHashMap::default();
    let mut chains = Vec::with_capacity(config.routes.len());
    for r in &config.routes {
        let sid = r.service.as_ref().map(|s| s.id.as_str());
        let rid = Some(r.id.as_str());
        let both = sid
            .and_then(|s| by_both.get(&(r.id.as_str(), s)))
            .map_or(nothing, |v| v.as_slice());
        let route = by_route
            .get(r.id.as_str())
            .map_or(nothing, |v| v.as_slice());
        let service = sid
            .and_then(|s| by_service.get(s))
            .map_or(nothing, |v| v.as_slice());
        // Most specific first: the first config seen for a plugin name wins.
        // (plugin, its consumer-free config, whether that is a Route+Service one)
        let mut chosen: Vec<Chosen> = Vec::new();
        for (i, e) in both
            .iter()
            .chain(route)
            .chain(service)
            .chain(&global)
            .enumerate()
        {
            if !chosen.iter().any(|c| c.0 == e.1) {
                // Whether this is a Route+Service config, which outranks Consumer-only ones.
                chosen.push((e.1, Some(e.2.clone()), i < both.len()));
            }
        }
        let crs = match sid {
            Some(_) => consumer_scoped.get(&(rid, sid)).unwrap_or(&no_scoped),
            None => &no_scoped,
        };
        let cr = consumer_scoped.get(&(rid, None)).unwrap_or(&no_scoped);
        let cs = match sid {
            Some(_) => consumer_scoped.get(&(None, sid)).unwrap_or(&no_scoped),
            None => &no_scoped,
        };
        let mut names: Vec<&'static str> = chosen.iter().map(|c| c.0).collect();
        for n in crs
            .keys()
            .chain(cr.keys())
            .chain(cs.keys())
            .chain(consumer_only.keys())
        {
            if !names.contains(n) {
                names.push(n);
            }
        }
        if names.is_empty() {
            chains.push(empty.clone());
            continue;
        }
        let mut slots: Vec<(i32, Slot)> = Vec::with_capacity(names.len());
        for name in names {
            let (handler, route_and_service) = chosen
                .iter()
                .find(|c| c.0 == name)
                .map_or((None, false), |c| (c.1.clone(), c.2));
            let specific: Vec<&FxHashMap<&str, Bound>> =
                [crs, cr, cs].iter().filter_map(|m| m.get(name)).collect();
            // A Route+Service config outranks Consumer-only configs.
            let general = (!route_and_service)
                .then(|| consumer_only.get(name))
                .flatten();
            let by_consumer = if specific.is_empty() {
                general.cloned()
            } else {
                let mut m: ConsumerHandlers = FxHashMap::default();
                // Least specific first, so that more specific configs overwrite.
                if let Some(g) = general {
                    m.extend(g.iter().map(|(c, h)| (c.clone(), h.clone())));
                }
                for level in specific.iter().rev() {
                    m.extend(level.iter().map(|(c, h)| (c.to_string(), h.clone())));
                }
                Some(Arc::new(m))
            };
            if handler.is_none() && by_consumer.is_none() {
                continue;
            }
            slots.push((
                priorities.get(name).copied().unwrap_or(0),
                Slot {
                    handler,
                    by_consumer,
                },
            ));
        }
        slots.sort_by_key(|s| std::cmp::Reverse(s.0));
        chains.push(slots.into_iter().map(|s| s.1).collect());
    }
    global.sort_by_key(|e| std::cmp::Reverse(e.0));
    (chains, global.into_iter().map(|e| e.2).collect())
}

/// Where a service's traffic goes.
pub enum Destination {
    /// A host name or IP and port.
    Direct(Peer),
    /// An `upstreams` entity (the service's host names it).
    Balanced(Arc<Balancer>),
    /// The service's protocol is not one the HTTP proxy serves (tcp, grpc, ...).
    Unsupported(String),
    /// The service could not be built (its TLS settings): why. Its requests get 502.
    Broken(String),
}

pub struct ServiceInfo {
    pub https: bool,
    pub path: Option<String>,
    pub destination: Destination,
    pub connect_timeout: Duration,
    pub read_timeout: Duration,
    pub write_timeout: Duration,
    pub retries: u32,
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

/// Kong's `hash_on` / `hash_fallback` with their companion fields.
fn hash_on(
    on: &str,
    header: Option<&str>,
    cookie: Option<&str>,
    cookie_path: &str,
    query_arg: Option<&str>,
    uri_capture: Option<&str>,
) -> HashOn {
    match on {
        "consumer" => HashOn::Consumer,
        "ip" => HashOn::Ip,
        "header" => header
            .and_then(|h| http::HeaderName::from_bytes(h.as_bytes()).ok())
            .map_or(HashOn::None, HashOn::Header),
        "cookie" => cookie.map_or(HashOn::None, |c| {
            HashOn::Cookie(c.to_string(), cookie_path.to_string())
        }),
        "path" => HashOn::Path,
        "query_arg" => query_arg.map_or(HashOn::None, |q| HashOn::QueryArg(q.to_string())),
        "uri_capture" => uri_capture.map_or(HashOn::None, |c| HashOn::UriCapture(c.to_string())),
        _ => HashOn::None,
    }
}

impl Snapshot {
    /// The snapshot of an empty config (no plugin is built, so no node's plugin state is
    /// needed).
    pub fn empty() -> Snapshot {
        Snapshot::compile(Config::default(), &turnpike_plugins::bundled())
            .expect("an empty config compiles")
    }

    /// Compiles `config`, its plugins built by the node's `plugins` registry (which hands them
    /// the node's plugin state).
    pub fn compile(
        config: Config,
        plugins: &turnpike_plugins::Registry,
    ) -> Result<Snapshot, String> {
        let mut problems = config.left_out.clone();
        let router = Router::build_skipping(&config, &mut problems);
        let certs = CertStore::build_skipping(&config, &mut problems);
        let cert_by_id: FxHashMap<&str, (&str, &str)> = config
            .certificates
            .iter()
            .map(|c| (c.id.as_str(), (c.cert.as_str(), c.key.as_str())))
            .collect();
        let ca_by_id: FxHashMap<&str, &str> = config
            .ca_certificates
            .iter()
            .map(|c| (c.id.as_str(), c.cert.as_str()))
            .collect();

        let mut balancers: FxHashMap<&str, Arc<Balancer>> = FxHashMap::default();
        let mut probes = Vec::new();
        for u in &config.upstreams {
            let checks = Arc::new(crate::upstream::health::Checks::from_config(
                &u.healthchecks,
            ));
            let mut peers = Vec::new();
            let mut health = Vec::new();
            for t in config.targets.iter().filter(|t| t.upstream.id == u.id) {
                let (h, p) = t.target.rsplit_once(':').unwrap_or((&t.target, "8000"));
                let port = p.parse().unwrap_or(8000);
                let state = crate::upstream::health::target(&u.id, &t.target);
                if checks.active_enabled() && t.weight > 0 {
                    probes.push(Arc::new(crate::upstream::health::Probe {
                        upstream: u.name.clone(),
                        host: h.trim_matches(|c| c == '[' || c == ']').to_string(),
                        port,
                        health: state.clone(),
                        checks: checks.clone(),
                    }));
                }
                peers.push((peer(h, port, false), t.weight));
                health.push(state);
            }
            let hh = u
                .host_header
                .as_deref()
                .and_then(|h| HeaderValue::from_str(h).ok());
            let settings = crate::upstream::balancer::Settings {
                algorithm: u.algorithm.clone(),
                hash_on: hash_on(
                    &u.hash_on,
                    u.hash_on_header.as_deref(),
                    u.hash_on_cookie.as_deref(),
                    &u.hash_on_cookie_path,
                    u.hash_on_query_arg.as_deref(),
                    u.hash_on_uri_capture.as_deref(),
                ),
                hash_fallback: hash_on(
                    &u.hash_fallback,
                    u.hash_fallback_header.as_deref(),
                    u.hash_on_cookie.as_deref(),
                    &u.hash_on_cookie_path,
                    u.hash_fallback_query_arg.as_deref(),
                    u.hash_fallback_uri_capture.as_deref(),
                ),
                slots: u.slots,
            };
            balancers.insert(
                u.name.as_str(),
                Arc::new(Balancer::with_health(
                    peers,
                    hh,
                    &settings,
                    health,
                    checks,
                    u.name.clone(),
                )),
            );
        }

        let mut services = Vec::with_capacity(config.services.len());
        for s in &config.services {
            let https = s.protocol == "https" || s.protocol == "wss";
            let destination = if !matches!(s.protocol.as_str(), "http" | "https" | "ws" | "wss") {
                Destination::Unsupported(s.protocol.clone())
            } else if let Some(b) = balancers.get(s.host.as_str()) {
                Destination::Balanced(b.clone())
            } else {
                Destination::Direct(peer(&s.host, s.port, https))
            };
            let (tls, destination) = if https {
                match service_tls(s, &cert_by_id, &ca_by_id) {
                    Ok(tls) => (Some(tls), destination),
                    Err(e) => {
                        let e = format!("service {}: {e}", s.id);
                        problems.push(e.clone());
                        (None, Destination::Broken(e))
                    }
                }
            } else {
                (None, destination)
            };
            services.push(ServiceInfo {
                https,
                path: s.path.clone(),
                destination,
                connect_timeout: Duration::from_millis(s.connect_timeout as u64),
                read_timeout: Duration::from_millis(s.read_timeout as u64),
                write_timeout: Duration::from_millis(s.write_timeout as u64),
                retries: s.retries as u32,
                tls,
            });
        }
        let (chains, global) = compile_chains(&config, plugins, &mut problems);
        let global_rewrite = global
            .iter()
            .filter(|b| b.handler.phases().has(Phases::REWRITE))
            .cloned()
            .collect();
        let global_certificate = global
            .iter()
            .filter(|b| {
                b.handler.phases().has(Phases::CERTIFICATE) && b.protocols & PROTO_HTTPS != 0
            })
            .cloned()
            .collect();
        // Whether any config of a chain (consumer-scoped ones included) says `has`.
        let any_config = |has: fn(&dyn Handler) -> bool| -> Vec<bool> {
            chains
                .iter()
                .map(|c| {
                    c.iter().any(|s| {
                        s.handler.iter().any(|h| has(&*h.handler))
                            || s.by_consumer
                                .as_ref()
                                .is_some_and(|m| m.values().any(|h| has(&*h.handler)))
                    })
                })
                .collect()
        };
        let chains_want_body = any_config(|h| h.wants_body());
        let chains_filter = any_config(|h| h.phases().has(Phases::RESPONSE));
        let chains_log = chains
            .iter()
            .map(|c| {
                let mut flags = 0;
                for s in c.iter() {
                    let handlers = s
                        .handler
                        .iter()
                        .chain(s.by_consumer.iter().flat_map(|m| m.values()));
                    for h in handlers {
                        if h.handler.phases().has(Phases::LOG) {
                            flags |= LOGS;
                            if h.handler.log_headers() {
                                flags |= LOG_HEADERS;
                            }
                        }
                    }
                }
                flags
            })
            .collect();
        Ok(Snapshot {
            config,
            router,
            services,
            certs,
            chains,
            chains_want_body,
            chains_filter,
            chains_log,
            probes,
            global_rewrite,
            global_certificate,
            problems,
        })
    }
}

/// A service's upstream TLS client: its client certificate and CA certificates must exist and
/// parse.
fn service_tls(
    s: &turnpike_config::declarative::Service,
    cert_by_id: &FxHashMap<&str, (&str, &str)>,
    ca_by_id: &FxHashMap<&str, &str>,
) -> Result<Arc<rustls::ClientConfig>, String> {
    let client = match &s.client_certificate {
        Some(fk) => Some(
            *cert_by_id
                .get(fk.id.as_str())
                .ok_or_else(|| format!("client_certificate {} not found", fk.id))?,
        ),
        None => None,
    };
    let cas: Vec<&str> = s
        .ca_certificates
        .iter()
        .flatten()
        .map(|id| {
            ca_by_id
                .get(id.as_str())
                .copied()
                .ok_or_else(|| format!("ca_certificate {id} not found"))
        })
        .collect::<Result<_, _>>()?;
    tls::client_config(s.tls_verify.unwrap_or(false), &cas, client)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(v: serde_json::Value) -> Config {
        turnpike_config::declarative::load(&v, &turnpike_plugins::bundled()).unwrap()
    }

    /// What does not build is reported and left out or fails closed; the rest compiles.
    #[test]
    fn entities_that_do_not_build_are_left_out_and_reported() {
        let mut cfg = load(serde_json::json!({
            "_format_version": "3.0",
            "services": [{"name": "s", "url": "http://127.0.0.1:1", "routes": [
                {"name": "ok", "paths": ["/ok"], "plugins": [{"name": "key-auth"}]},
                {"name": "bad", "paths": ["~/bad"]},
            ]}],
        }));
        // As if stored by an older version: a regex the engine refuses, a plugin this build
        // does not carry.
        cfg.routes[1].paths = Some(vec!["~/bad(".into()]);
        cfg.plugins[0].name = "no-such-plugin".into();
        let snap = Snapshot::compile(cfg, &turnpike_plugins::bundled()).unwrap();
        assert_eq!(snap.problems.len(), 2, "{:?}", snap.problems);
        assert!(
            snap.problems[0].contains("path regex"),
            "{:?}",
            snap.problems
        );
        assert!(
            snap.problems[1].contains("no-such-plugin"),
            "{:?}",
            snap.problems
        );
        // The good route is served, and its broken plugin is not dropped (which would serve
        // it without its authentication) but stands in, failing closed.
        assert!(!snap.router.is_empty());
        assert_eq!(snap.chains[0].len(), 1);
    }
}
