//! Plugin chains, compiled once per snapshot: each enabled plugin config built (its vault
//! references resolved, a config that does not build failing closed), then every route's chain
//! in PRIORITY order with the most specific config of each plugin (Kong's precedence), the
//! consumer-scoped configs beside the one that applies before authentication.

use std::sync::Arc;

use rustc_hash::FxHashMap;
use turnpike_config::declarative::vault;
use turnpike_config::Config;
use turnpike_plugins::Handler;

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

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(
            self.handler
                .as_ref()
                .map_or("(consumer-scoped)", |b| b.name),
        )
    }
}

/// A configured plugin with the request protocols it runs for (its `protocols` field).
#[derive(Clone)]
pub struct Bound {
    pub handler: Arc<dyn Handler>,
    pub protocols: u8,
    /// The plugin's name (its spans are named by it).
    pub name: &'static str,
}

/// Request protocols as bits, for a plugin's `protocols`.
pub const PROTO_HTTP: u8 = 1;
pub const PROTO_HTTPS: u8 = 2;
/// Stream sessions' protocols: `tcp`, `tls` (terminated), `tls_passthrough`, `udp`.
pub const PROTO_TCP: u8 = 4;
pub const PROTO_TLS: u8 = 8;
pub const PROTO_TLS_PASSTHROUGH: u8 = 16;
pub const PROTO_UDP: u8 = 32;

fn protocol_mask(protocols: &[String]) -> u8 {
    protocols.iter().fold(0, |m, p| match p.as_str() {
        "http" | "grpc" | "ws" => m | PROTO_HTTP,
        "https" | "grpcs" | "wss" => m | PROTO_HTTPS,
        "tcp" => m | PROTO_TCP,
        "tls" => m | PROTO_TLS,
        "tls_passthrough" => m | PROTO_TLS_PASSTHROUGH,
        "udp" => m | PROTO_UDP,
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
        self.bound_for(consumer, protocol).map(|b| &b.handler)
    }

    /// As `handler_for`, with the plugin's name and protocols.
    #[inline]
    pub fn bound_for(&self, consumer: Option<&str>, protocol: u8) -> Option<&Bound> {
        let bound = match (&self.by_consumer, consumer) {
            (Some(map), Some(c)) => map.get(c).or(self.handler.as_ref()),
            _ => self.handler.as_ref(),
        }?;
        (bound.protocols & protocol != 0).then_some(bound)
    }
}

/// Builds each enabled plugin of the config (aligned with `config.plugins`; `None` for a
/// disabled one). A config that does not build fails closed (see `BrokenPlugin`).
pub(super) fn build_plugins(
    config: &Config,
    registry: &turnpike_plugins::Registry,
    problems: &mut Vec<String>,
) -> Vec<Option<Bound>> {
    let build_ctx = registry.build_context(config);
    config
        .plugins
        .iter()
        .map(|p| {
            if !p.enabled {
                return None;
            }
            let spec = registry.get(&p.name);
            // Secrets written as `{vault://...}` references in the fields Kong marks
            // referenceable are resolved here, into a copy: the stored config keeps the
            // reference. Anywhere else a reference is the string it is, as in Kong.
            let resolved;
            let plugin_config = if let Some(spec) = spec.filter(|_| vault::has_reference(&p.config))
            {
                let mut c = p.config.clone();
                let resolve = |r: &str| vault::resolve(r, &config.records, &vault::process_env);
                match turnpike_config::schema::resolve_references(spec.fields(), &mut c, &resolve) {
                    Ok(()) => {
                        resolved = c;
                        Ok(&resolved)
                    }
                    Err(e) => Err(format!("plugin {} ({}): {e}", p.id, p.name)),
                }
            } else {
                Ok(&p.config)
            };
            build_ctx.building(&p.id);
            let built = match (spec, plugin_config) {
                (_, Err(e)) => Err(e),
                (Some(spec), Ok(plugin_config)) => spec
                    .build(plugin_config, &build_ctx)
                    .map_err(|e| format!("plugin {} ({}): {e}", p.id, p.name)),
                (None, _) => Err(format!("plugin {}: '{}' is not available", p.id, p.name)),
            };
            Some(Bound {
                handler: built.unwrap_or_else(|e| {
                    problems.push(e);
                    Arc::new(BrokenPlugin)
                }),
                protocols: protocol_mask(&p.protocols),
                name: spec.map_or("unknown", |s| s.name()),
            })
        })
        .collect()
}

type Entry = (i32, &'static str, Bound);
type ByConsumer<'a> = FxHashMap<&'static str, FxHashMap<&'a str, Bound>>;

/// The built plugins indexed by scope, to compile route chains: per route, the most specific
/// enabled config of each plugin, in Kong's precedence: Route+Service+Consumer >
/// Route+Consumer > Service+Consumer > Route+Service > Consumer > Route > Service > Global.
/// The consumer-free part is resolved here; the consumer-scoped part becomes a per-slot map
/// looked up, per request, with the consumer authentication found (plugins run in PRIORITY
/// order, so the auth plugins have run by then). The cost is per route times the plugins
/// that apply to it.
pub(super) struct ChainIndex<'a> {
    global: Vec<Entry>,
    by_service: FxHashMap<&'a str, Vec<Entry>>,
    by_route: FxHashMap<&'a str, Vec<Entry>>,
    by_both: FxHashMap<(&'a str, &'a str), Vec<Entry>>,
    /// Consumer-scoped: consumer only (shared by every route), and with a route and/or service.
    consumer_only: FxHashMap<&'static str, Arc<ConsumerHandlers>>,
    consumer_scoped: FxHashMap<(Option<&'a str>, Option<&'a str>), ByConsumer<'a>>,
    priorities: FxHashMap<&'static str, i32>,
    empty: Chain,
}

impl<'a> ChainIndex<'a> {
    pub(super) fn new(
        config: &'a Config,
        built: &[Option<Bound>],
        registry: &turnpike_plugins::Registry,
    ) -> ChainIndex<'a> {
        let mut ix = ChainIndex {
            global: Vec::new(),
            by_service: FxHashMap::default(),
            by_route: FxHashMap::default(),
            by_both: FxHashMap::default(),
            consumer_only: FxHashMap::default(),
            consumer_scoped: FxHashMap::default(),
            priorities: FxHashMap::default(),
            empty: Arc::from(Vec::<Slot>::new()),
        };
        let mut consumer_only: ByConsumer = FxHashMap::default();
        for (p, handler) in config.plugins.iter().zip(built) {
            let Some(handler) = handler else { continue };
            // Under its own name and priority where the plugin exists, first in the chain
            // where it does not.
            let (name, priority) = registry
                .get(&p.name)
                .map_or(("(unavailable plugin)", i32::MAX), |s| {
                    (s.name(), s.priority())
                });
            ix.priorities.insert(name, priority);
            let route = p.route.as_ref().map(|r| r.id.as_ref());
            let service = p.service.as_ref().map(|s| s.id.as_ref());
            let handler = handler.clone();
            if let Some(c) = &p.consumer {
                let target = match (route, service) {
                    (None, None) => &mut consumer_only,
                    key => ix.consumer_scoped.entry(key).or_default(),
                };
                target
                    .entry(name)
                    .or_default()
                    .insert(c.id.as_ref(), handler);
                continue;
            }
            let entry = (priority, name, handler);
            match (route, service) {
                (Some(r), Some(s)) => ix.by_both.entry((r, s)).or_default().push(entry),
                (Some(r), None) => ix.by_route.entry(r).or_default().push(entry),
                (None, Some(s)) => ix.by_service.entry(s).or_default().push(entry),
                (None, None) => ix.global.push(entry),
            }
        }
        ix.consumer_only = consumer_only
            .into_iter()
            .map(|(name, m)| {
                let owned: ConsumerHandlers =
                    m.into_iter().map(|(c, h)| (c.to_string(), h)).collect();
                (name, Arc::new(owned))
            })
            .collect();
        ix
    }

    /// Global plugins, highest PRIORITY first.
    pub(super) fn global(&self) -> Vec<Bound> {
        let mut global = self.global.clone();
        global.sort_by_key(|e| std::cmp::Reverse(e.0));
        global.into_iter().map(|e| e.2).collect()
    }

    /// The chain of one route.
    pub(super) fn chain(&self, r: &turnpike_config::declarative::Route) -> Chain {
        type Chosen = (&'static str, Option<Bound>, bool);
        let nothing: &[Entry] = &[];
        let no_scoped: ByConsumer = FxHashMap::default();
        let sid = r.service.as_ref().map(|s| s.id.as_ref());
        let rid = Some(r.id.as_str());
        let both = sid
            .and_then(|s| self.by_both.get(&(r.id.as_str(), s)))
            .map_or(nothing, |v| v.as_slice());
        let route = self
            .by_route
            .get(r.id.as_str())
            .map_or(nothing, |v| v.as_slice());
        let service = sid
            .and_then(|s| self.by_service.get(s))
            .map_or(nothing, |v| v.as_slice());
        // Most specific first: the first config seen for a plugin name wins.
        // (plugin, its consumer-free config, whether that is a Route+Service one)
        let mut chosen: Vec<Chosen> = Vec::new();
        for (i, e) in both
            .iter()
            .chain(route)
            .chain(service)
            .chain(&self.global)
            .enumerate()
        {
            if !chosen.iter().any(|c| c.0 == e.1) {
                // Whether this is a Route+Service config, which outranks Consumer-only ones.
                chosen.push((e.1, Some(e.2.clone()), i < both.len()));
            }
        }
        let scoped = |key| self.consumer_scoped.get(&key).unwrap_or(&no_scoped);
        let crs = match sid {
            Some(_) => scoped((rid, sid)),
            None => &no_scoped,
        };
        let cr = scoped((rid, None));
        let cs = match sid {
            Some(_) => scoped((None, sid)),
            None => &no_scoped,
        };
        let mut names: Vec<&'static str> = chosen.iter().map(|c| c.0).collect();
        for n in crs
            .keys()
            .chain(cr.keys())
            .chain(cs.keys())
            .chain(self.consumer_only.keys())
        {
            if !names.contains(n) {
                names.push(n);
            }
        }
        if names.is_empty() {
            return self.empty.clone();
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
                .then(|| self.consumer_only.get(name))
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
                self.priorities.get(name).copied().unwrap_or(0),
                Slot {
                    handler,
                    by_consumer,
                },
            ));
        }
        slots.sort_by_key(|s| std::cmp::Reverse(s.0));
        slots.into_iter().map(|s| s.1).collect()
    }
}
