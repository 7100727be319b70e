//! A configuration snapshot: the validated entities plus everything compiled from them (router,
//! per-service upstream settings, balancers, TLS certificates). Immutable once built; the data
//! plane swaps a whole new one in.

use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;
use rustc_hash::FxHashMap;
use turnpike_config::declarative::positions::SCANS_BEFORE_INDEXING;
use turnpike_config::declarative::{Changes, Positions};
use turnpike_config::Config;
use turnpike_router::{ChunkedVec, Router};

use crate::upstream::Upstreams;

use turnpike_plugins::Handler;
use turnpike_plugins::Phases;

use crate::tls::{self, CertStore};

mod chains;
pub mod streams;
pub use chains::{
    Bound, Chain, ConsumerHandlers, Slot, PROTO_HTTP, PROTO_HTTPS, PROTO_TCP, PROTO_TLS,
    PROTO_TLS_PASSTHROUGH, PROTO_UDP,
};

/// Per-route log flags, compiled with the snapshot.
pub const LOGS: u8 = 1;
/// A log plugin of the route reads headers.
pub const LOG_HEADERS: u8 = 2;
/// A log plugin of the route reads the balancer's tries.
pub const LOG_TRIES: u8 = 4;
pub use crate::upstream::balancer::Balancer;
use crate::upstream::balancer::HashOn;
pub use crate::upstream::peer::Peer;
use chains::{build_plugins, ChainIndex};

pub struct Snapshot {
    pub config: Config,
    /// Shared with the next snapshot when a change leaves the routes alone.
    pub router: Arc<Router>,
    /// Aligned with `config.services` (whose indices a patch keeps).
    pub services: Arc<Vec<ServiceInfo>>,
    /// The stream routes (`protocols: [tcp]`), for the stream listeners.
    pub streams: Arc<streams::StreamRoutes>,
    pub certs: Arc<CertStore>,
    /// By router slot (`RouteEntry::route_index`): each route and what its plugins need.
    pub routes: ChunkedVec<RouteSlot>,
    /// The slot of each route, by id: what a patch looks up (indexed by the first patch).
    slots: Positions,
    /// Aligned with `config.plugins`: each enabled plugin's built handler, reused by a patch
    /// that changes no plugin.
    built: Arc<Vec<Option<Bound>>>,
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
    /// The routes' part of `problems` (routes that do not compile), and the rest of it.
    route_problems: Vec<String>,
    other_problems: Vec<String>,
}

fn slot_mut(routes: &mut ChunkedVec<RouteSlot>, slot: usize) -> &mut RouteSlot {
    routes.get_mut(slot).expect("a slot in range")
}

/// One route of a snapshot, by router slot.
#[derive(Clone)]
pub struct RouteSlot {
    pub route: Arc<turnpike_config::declarative::Route>,
    /// The plugins that run on the route, highest PRIORITY first.
    pub chain: Chain,
    /// Whether a plugin of the route reads the request body.
    pub want_body: bool,
    /// Whether a plugin of the route has a header_filter phase.
    pub filter: bool,
    /// Whether plugins of the route have a log phase (`LOGS`) and read headers there
    /// (`LOG_HEADERS`).
    pub log: u8,
}

impl RouteSlot {
    fn new(route: Arc<turnpike_config::declarative::Route>, chain: Chain) -> RouteSlot {
        // Whether any config of the chain (consumer-scoped ones included) says `has`.
        let any = |has: &dyn Fn(&dyn Handler) -> bool| {
            chain.iter().any(|s| {
                s.handler.iter().any(|h| has(&*h.handler))
                    || s.by_consumer
                        .as_ref()
                        .is_some_and(|m| m.values().any(|h| has(&*h.handler)))
            })
        };
        let want_body = any(&|h| h.wants_body());
        let filter = any(&|h| h.phases().has(Phases::RESPONSE));
        let mut log = 0;
        if any(&|h| h.phases().has(Phases::LOG)) {
            log |= LOGS;
        }
        if any(&|h| h.phases().has(Phases::LOG) && h.log_headers()) {
            log |= LOG_HEADERS;
        }
        if any(&|h| h.phases().has(Phases::LOG) && h.log_tries()) {
            log |= LOG_TRIES;
        }
        RouteSlot {
            route,
            chain,
            want_body,
            filter,
            log,
        }
    }
}

/// Where a service's traffic goes.
pub enum Destination {
    /// A host name or IP and port, shared by every service of one snapshot that names the
    /// same (host, port, scheme): 231k services over 100 hosts hold 100 peers, not 231k
    /// (about 110 bytes and three allocations each).
    Direct(Arc<Peer>),
    /// An `upstreams` entity (the service's host names it).
    Balanced(Arc<Balancer>),
    /// The service's protocol is not one the HTTP proxy serves (tcp, grpc, ...).
    Unsupported(Box<str>),
    /// The service could not be built (its TLS settings): why. Its requests get 502.
    Broken(Box<str>),
}

pub struct ServiceInfo {
    pub https: bool,
    /// A `grpc` or `grpcs` service: its upstream speaks HTTP/2 (h2c, or TLS with ALPN h2).
    pub grpc: bool,
    /// A `tcp`, `tls` or `udp` service: only stream routes reach it.
    pub stream: bool,
    /// Shared with the config's service.
    pub path: Option<Arc<str>>,
    pub destination: Destination,
    /// The timeouts in milliseconds (a `Duration` each was 48 of the service's 120 bytes: 8 MB
    /// at 231k services); see [`ServiceInfo::connect_timeout`] and the others.
    timeouts_ms: [u32; 3],
    pub retries: u32,
    pub tls: Option<Arc<rustls::ClientConfig>>,
}

impl ServiceInfo {
    #[inline]
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.timeouts_ms[0].into())
    }

    #[inline]
    pub fn read_timeout(&self) -> Duration {
        Duration::from_millis(self.timeouts_ms[1].into())
    }

    #[inline]
    pub fn write_timeout(&self) -> Duration {
        Duration::from_millis(self.timeouts_ms[2].into())
    }
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
    pub fn empty(upstreams: &Upstreams) -> Snapshot {
        Snapshot::compile(Config::default(), &turnpike_plugins::bundled(), upstreams)
            .expect("an empty config compiles")
    }

    /// Compiles `config`, its plugins built by the node's `plugins` registry (which hands them
    /// the node's plugin state), its peers and balancers made with what the node knows of its
    /// `upstreams` (their health, pool ids and resolved names).
    pub fn compile(
        config: Config,
        plugins: &turnpike_plugins::Registry,
        upstreams: &Upstreams,
    ) -> Result<Snapshot, String> {
        let mut route_problems = Vec::new();
        let flavor = turnpike_config::PluginRegistry::router_flavor(plugins);
        let router = Router::build_skipping(&config, flavor, &mut route_problems);
        // Slot i is route i.
        let routes = config.routes.clone();
        let slots = config.positions.routes.clone();
        Ok(Snapshot::assemble(
            config,
            plugins,
            upstreams,
            Arc::new(router),
            route_problems,
            routes,
            slots,
        ))
    }

    /// The snapshot of `config`, a change of the config `prev` was built from: what the change
    /// leaves alone is shared with `prev`. A change to routes patches the router (and compiles
    /// those routes' chains) instead of rebuilding it; any other change rebuilds all but the
    /// router; a change that moves or disables services rebuilds everything.
    pub fn patch(
        prev: &Snapshot,
        config: Config,
        changes: &Changes,
        plugins: &turnpike_plugins::Registry,
        upstreams: &Upstreams,
    ) -> Result<Snapshot, String> {
        // Routes refer to services by index, and the router leaves out routes of disabled
        // services: both must hold for every service the previous config had.
        let services_kept = prev.config.services.len() <= config.services.len()
            && prev
                .config
                .services
                .iter()
                .zip(&config.services)
                .all(|(a, b)| a.id == b.id && a.enabled == b.enabled);
        if !services_kept {
            return Snapshot::compile(config, plugins, upstreams);
        }
        let mut config = config;
        let mut routes = prev.routes.clone();
        let mut slots = prev.slots.clone();
        let mut route_problems = prev.route_problems.clone();
        let mut touched = Vec::new();
        // Whether a changed route is (or was) a stream route: only then are they compiled again.
        let mut streams_changed = false;
        let router = if changes.routes.is_empty() {
            prev.router.clone()
        } else {
            let mut router = (*prev.router).clone();
            // A vacant slot holds a route with an empty id.
            let vacant = RouteSlot::new(
                Arc::new(turnpike_config::declarative::Route::default()),
                Arc::from(Vec::<Slot>::new()),
            );
            // Found by their positions when those are built or worth building (many changes,
            // or a config kept up to date change by change, as a database node's is); a few
            // changes to a config loaded whole (a reload of a file) scan instead.
            let indexed = config.positions.routes.covers(config.routes.len());
            let many = indexed || changes.routes.len() > SCANS_BEFORE_INDEXING;
            // The slots' positions, once used, are kept right through every change after.
            let by_slot = many || slots.covers(routes.len());
            for id in &changes.routes {
                let old = {
                    let r = &routes;
                    let id_at = |i: usize| r.get(i).map(|s| s.route.id.as_str());
                    if by_slot {
                        slots.find(r.len(), id_at, id)
                    } else {
                        (0..r.len()).find(|&i| id_at(i) == Some(id.as_str()))
                    }
                };
                let new = if many {
                    config.route(id).cloned()
                } else {
                    config.routes.iter().find(|r| r.id == *id).cloned()
                };
                let new = new.as_ref();
                streams_changed |= old.is_some_and(|slot| streams::is_stream(&routes[slot].route))
                    || new.is_some_and(|r| streams::is_stream(r));
                route_problems.retain(|p| !p.starts_with(&format!("route {id}:")));
                let service = new.and_then(|r| {
                    let sid = &r.service.as_ref()?.id;
                    let i = config.services.iter().position(|s| *s.id == **sid)?;
                    Some((i, config.services[i].enabled))
                });
                let slot = match (old, new) {
                    (Some(slot), Some(route)) => {
                        if let Err(e) = router.update(slot, route, service) {
                            route_problems.push(e.0);
                        }
                        slot
                    }
                    (None, Some(route)) => {
                        let (slot, compiled) = router.add(route, service);
                        if let Err(e) = compiled {
                            route_problems.push(e.0);
                        }
                        slot
                    }
                    (Some(slot), None) => {
                        router.remove(slot);
                        *slot_mut(&mut routes, slot) = vacant.clone();
                        if by_slot {
                            slots.forget(id);
                        }
                        continue;
                    }
                    (None, None) => continue,
                };
                while slot >= routes.len() {
                    routes.push(vacant.clone());
                }
                if by_slot {
                    slots.grew_to(routes.len());
                    slots.set(id, slot);
                }
                slot_mut(&mut routes, slot).route = new.expect("a route added or updated").clone();
                touched.push(slot);
            }
            Arc::new(router)
        };
        if changes.others {
            return Ok(Snapshot::assemble(
                config,
                plugins,
                upstreams,
                router,
                route_problems,
                routes.iter().map(|slot| slot.route.clone()),
                slots,
            ));
        }
        // Only routes changed: the plugins, services and certificates are the previous ones.
        let index = ChainIndex::new(&config, &prev.built, plugins);
        for slot in touched {
            let route = routes[slot].route.clone();
            let chain = index.chain(&route);
            *slot_mut(&mut routes, slot) = RouteSlot::new(route, chain);
        }
        let streams = if streams_changed {
            Arc::new(streams::StreamRoutes::compile(
                &config,
                router.flavor(),
                |r| index.chain(r),
            ))
        } else {
            prev.streams.clone()
        };
        drop(index);
        let problems = config
            .left_out
            .iter()
            .chain(&route_problems)
            .chain(&prev.other_problems)
            .cloned()
            .collect();
        Ok(Snapshot {
            config,
            router,
            services: prev.services.clone(),
            streams,
            certs: prev.certs.clone(),
            routes,
            slots,
            built: prev.built.clone(),
            probes: prev.probes.clone(),
            global_rewrite: prev.global_rewrite.clone(),
            global_certificate: prev.global_certificate.clone(),
            problems,
            route_problems,
            other_problems: prev.other_problems.clone(),
        })
    }

    /// Everything but the router: services, balancers, certificates, plugins and the chains
    /// of `routes` (by router slot).
    fn assemble(
        config: Config,
        plugins: &turnpike_plugins::Registry,
        upstreams: &Upstreams,
        router: Arc<Router>,
        route_problems: Vec<String>,
        // The route of each slot, in slot order.
        routes: impl IntoIterator<Item = Arc<turnpike_config::declarative::Route>>,
        // Where each of them stands, by id.
        slots: Positions,
    ) -> Snapshot {
        let mut problems = Vec::new();
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
            for t in config.targets.iter().filter(|t| *t.upstream.id == *u.id) {
                let (h, p) = t.target.rsplit_once(':').unwrap_or((&t.target, "8000"));
                let port = p.parse().unwrap_or(8000);
                let state = upstreams.health.target(&u.id, &t.target);
                let peer = upstreams.peer(h, port, false);
                if checks.active_enabled() && t.weight > 0 {
                    probes.push(Arc::new(crate::upstream::health::Probe {
                        upstream: u.name.clone(),
                        host: h.trim_matches(|c| c == '[' || c == ']').to_string(),
                        port,
                        address: peer.addr,
                        name: peer.dns.clone(),
                        health: state.clone(),
                        checks: checks.clone(),
                    }));
                }
                peers.push((peer, t.weight));
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
        let mut direct: rustc_hash::FxHashMap<(&str, u16, bool), Arc<Peer>> = Default::default();
        for s in &config.services {
            let grpc = s.protocol == "grpc" || s.protocol == "grpcs";
            let https = matches!(s.protocol, "https" | "wss" | "grpcs" | "tls");
            // tcp services are the stream proxy's (the HTTP path refuses them).
            let destination = if !grpc
                && !matches!(
                    s.protocol,
                    "http" | "https" | "ws" | "wss" | "tcp" | "tls" | "udp"
                ) {
                Destination::Unsupported(s.protocol.into())
            } else if let Some(b) = balancers.get(&*s.host) {
                Destination::Balanced(b.clone())
            } else {
                Destination::Direct(
                    direct
                        .entry((&*s.host, s.port, https))
                        .or_insert_with(|| Arc::new(upstreams.peer(&s.host, s.port, https)))
                        .clone(),
                )
            };
            let (tls, destination) = if s.protocol == "grpcs" {
                // nginx's grpc_pass as Kong configures it: SNI, ALPN h2, no verification.
                match tls::client_config(false, &[], None) {
                    Ok(cfg) => {
                        let mut cfg = (*cfg).clone();
                        cfg.alpn_protocols = vec![b"h2".to_vec()];
                        (Some(Arc::new(cfg)), destination)
                    }
                    Err(e) => {
                        let e = format!("service {}: {e}", s.id);
                        problems.push(e.clone());
                        (None, Destination::Broken(e.into()))
                    }
                }
            } else if https {
                match service_tls(s, &cert_by_id, &ca_by_id) {
                    Ok(tls) => (Some(tls), destination),
                    Err(e) => {
                        let e = format!("service {}: {e}", s.id);
                        problems.push(e.clone());
                        (None, Destination::Broken(e.into()))
                    }
                }
            } else {
                (None, destination)
            };
            services.push(ServiceInfo {
                https,
                grpc,
                stream: matches!(s.protocol, "tcp" | "tls" | "udp"),
                path: s.path.clone(),
                destination,
                timeouts_ms: [s.connect_timeout, s.read_timeout, s.write_timeout],
                retries: s.retries as u32,
                tls,
            });
        }
        let built = build_plugins(&config, plugins, &mut problems);
        let index = ChainIndex::new(&config, &built, plugins);
        let routes = routes
            .into_iter()
            .map(|route| {
                let chain = index.chain(&route);
                RouteSlot::new(route, chain)
            })
            .collect();
        let global = index.global();
        let streams = Arc::new(streams::StreamRoutes::compile(
            &config,
            router.flavor(),
            |r| index.chain(r),
        ));
        drop(index);
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
        let other_problems = problems;
        let problems = config
            .left_out
            .iter()
            .chain(&route_problems)
            .chain(&other_problems)
            .cloned()
            .collect();
        Snapshot {
            config,
            router,
            services: Arc::new(services),
            streams,
            certs: Arc::new(certs),
            routes,
            slots,
            built: Arc::new(built),
            probes,
            global_rewrite,
            global_certificate,
            problems,
            route_problems,
            other_problems,
        }
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
                .get(fk.id.as_ref())
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
        std::sync::Arc::make_mut(&mut cfg.routes[1]).paths = Some(vec!["~/bad(".into()].into());
        cfg.plugins[0].name = "no-such-plugin".into();
        let snap =
            Snapshot::compile(cfg, &turnpike_plugins::bundled(), &Upstreams::default()).unwrap();
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
        assert_eq!(snap.routes[0].chain.len(), 1);
    }

    /// Services naming the same host, port and scheme share one peer (a 50 MiB config's
    /// 231k services over 100 hosts hold 100); another port or scheme is another peer.
    #[test]
    fn services_to_one_address_share_their_peer() {
        let cfg = load(serde_json::json!({
            "_format_version": "3.0",
            "services": [
                {"name": "a", "url": "http://up.test:8080/a"},
                {"name": "b", "url": "http://up.test:8080/b"},
                {"name": "c", "url": "http://up.test:8081"},
                {"name": "d", "url": "https://up.test:8080"},
            ],
        }));
        let snap =
            Snapshot::compile(cfg, &turnpike_plugins::bundled(), &Upstreams::default()).unwrap();
        let peer = |i: usize| match &snap.services[i].destination {
            Destination::Direct(p) => p.clone(),
            _ => panic!("service {i} is not direct"),
        };
        assert!(Arc::ptr_eq(&peer(0), &peer(1)));
        assert!(!Arc::ptr_eq(&peer(0), &peer(2)));
        assert!(!Arc::ptr_eq(&peer(0), &peer(3)));
        assert_eq!(peer(2).port, 8081);
        assert_eq!(snap.services[1].path.as_deref(), Some("/b"));
    }

    /// What each path routes to in a snapshot: the route's name and its chain's length.
    fn routing(snap: &Snapshot, paths: &[&str]) -> Vec<Option<(String, usize)>> {
        let headers = http::HeaderMap::new();
        paths
            .iter()
            .map(|path| {
                let view =
                    turnpike_router::RequestView::basic("GET", "example.com", 8000, path, &headers);
                let m = snap.router.find(&view)?;
                let slot = &snap.routes[m.route.route_index()];
                Some((
                    slot.route.name.clone().unwrap_or_default(),
                    slot.chain.len(),
                ))
            })
            .collect()
    }

    /// A route-only patch compiles the stream routes again only when a stream route changed.
    #[test]
    fn stream_routes_follow_route_patches() {
        let plugins = turnpike_plugins::bundled();
        let cfg = load(serde_json::json!({
            "_format_version": "3.0",
            "services": [{"name": "s", "url": "tcp://127.0.0.1:1", "routes": [
                {"name": "t", "protocols": ["tcp"], "destinations": [{"port": 7000}]},
                {"name": "h", "paths": ["/h"]},
            ]}],
        }));
        let sid = cfg.services[0].id.clone();
        let upstreams = Upstreams::default();
        let first = Snapshot::compile(cfg.clone(), &plugins, &upstreams).unwrap();
        let (peer, at) = ("10.0.0.1:1".parse().unwrap(), |p: u16| {
            std::net::SocketAddr::from(([127, 0, 0, 1], p))
        });
        let tcp = streams::Transport::Tcp;
        assert!(first.streams.find(peer, at(7000), tcp).is_some());
        let patch = |prev: &Snapshot, id: &str, row: serde_json::Value| {
            let mut next = prev.config.clone();
            next.apply_change("routes", id, Some(row.as_object().unwrap()), &plugins)
                .unwrap();
            let changes = Changes {
                from: prev.config.hash.clone(),
                routes: vec![id.to_string()],
                others: false,
            };
            Snapshot::patch(prev, next, &changes, &plugins, &upstreams).unwrap()
        };
        // An HTTP route changed: the stream routes are the previous ones.
        let h = cfg.routes[1].id.to_string();
        let second = patch(
            &first,
            &h,
            serde_json::json!({"id": h, "name": "h", "paths": ["/h2"], "service": {"id": sid}}),
        );
        assert!(Arc::ptr_eq(&first.streams, &second.streams));
        // The stream route moved to another port: compiled again.
        let t = cfg.routes[0].id.to_string();
        let third = patch(
            &second,
            &t,
            serde_json::json!({"id": t, "name": "t", "protocols": ["tcp"],
                               "destinations": [{"port": 7001}], "service": {"id": sid}}),
        );
        assert!(third.streams.find(peer, at(7000), tcp).is_none());
        assert!(third.streams.find(peer, at(7001), tcp).is_some());
    }

    /// A snapshot patched with route changes (and then with a plugin change) routes and runs
    /// plugins as one compiled whole from the same config, and shares what did not change.
    #[test]
    fn a_patched_snapshot_serves_as_a_compiled_one() {
        let plugins = turnpike_plugins::bundled();
        let routes: Vec<serde_json::Value> = (0..10)
            .map(|i| serde_json::json!({"name": format!("r{i}"), "paths": [format!("/r{i}")]}))
            .collect();
        let mut cfg = load(serde_json::json!({
            "_format_version": "3.0",
            "services": [{"name": "s", "url": "http://127.0.0.1:1", "routes": routes}],
            "plugins": [{"name": "cors"}],
        }));
        let sid = cfg.services[0].id.clone();
        let r3 = cfg.routes[3].id.clone();
        cfg.plugins.push(
            load(serde_json::json!({
                "_format_version": "3.0",
                "plugins": [{"name": "request-termination", "route": r3.clone()}],
                "routes": [{"id": r3, "paths": ["/r3"]}],
            }))
            .plugins
            .remove(0),
        );
        let upstreams = Upstreams::default();
        let first = Snapshot::compile(cfg.clone(), &plugins, &upstreams).unwrap();
        let paths = ["/r0", "/r2", "/x2", "/r3", "/r5", "/r9", "/r10", "/r11"];
        assert_eq!(routing(&first, &paths)[3], Some(("r3".into(), 2)));

        // Routes only: r2 moves to /x2, r5 goes, r10 comes.
        let mut next = cfg.clone();
        next.hash = "next".into();
        let row = |id: &str, name: &str, path: &str| {
            serde_json::json!({"id": id, "name": name, "paths": [path], "service": {"id": sid}})
                .as_object()
                .unwrap()
                .clone()
        };
        let (r2, r5) = (cfg.routes[2].id.clone(), cfg.routes[5].id.clone());
        let r10 = "6b1d8a0e-3c9f-4b7a-9e2d-5f4c3b2a1d00".to_string();
        next.apply_change("routes", &r2, Some(&row(&r2, "r2", "/x2")), &plugins)
            .unwrap();
        next.apply_change("routes", &r5, None, &plugins).unwrap();
        next.apply_change("routes", &r10, Some(&row(&r10, "r10", "/r10")), &plugins)
            .unwrap();
        let changes = Changes {
            from: cfg.hash.clone(),
            routes: vec![r2, r5, r10.clone()],
            others: false,
        };
        let patched =
            Snapshot::patch(&first, next.clone(), &changes, &plugins, &upstreams).unwrap();
        let whole = Snapshot::compile(next.clone(), &plugins, &upstreams).unwrap();
        assert_eq!(routing(&patched, &paths), routing(&whole, &paths));
        assert_eq!(routing(&patched, &paths)[1], None);
        assert_eq!(routing(&patched, &paths)[2], Some(("r2".into(), 1)));
        assert_eq!(routing(&patched, &paths)[6], Some(("r10".into(), 1)));
        // The deleted route's slot went to the new route; the services were not rebuilt.
        assert_eq!(patched.routes.len(), first.routes.len());
        assert!(Arc::ptr_eq(&patched.services, &first.services));

        // Another route plus a plugin on it: the router is patched, the chains rebuilt.
        let mut third = next.clone();
        let r11 = "6b1d8a0e-3c9f-4b7a-9e2d-5f4c3b2a1d11".to_string();
        third
            .apply_change("routes", &r11, Some(&row(&r11, "r11", "/r11")), &plugins)
            .unwrap();
        let pid = "6b1d8a0e-3c9f-4b7a-9e2d-5f4c3b2a1d12";
        let plugin = serde_json::json!({"id": pid, "name": "request-termination", "route": {"id": r11}, "config": {}});
        third
            .apply_change("plugins", pid, Some(plugin.as_object().unwrap()), &plugins)
            .unwrap();
        let changes = Changes {
            from: next.hash.clone(),
            routes: vec![r11],
            others: true,
        };
        let patched =
            Snapshot::patch(&patched, third.clone(), &changes, &plugins, &upstreams).unwrap();
        let whole = Snapshot::compile(third, &plugins, &upstreams).unwrap();
        assert_eq!(routing(&patched, &paths), routing(&whole, &paths));
        assert_eq!(routing(&patched, &paths)[7], Some(("r11".into(), 2)));
    }
}
