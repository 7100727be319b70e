//! Kong's stream routes (`protocols` `tcp`, `tls` or `tls_passthrough`), compiled with the
//! snapshot: each route's `sources` and `destinations` (an IP or CIDR, a port, or both) and
//! `snis` (exact, or `*.` wildcards) as matchers. A plain connection takes `tcp` routes, one
//! on a TLS listener `tls` routes (terminated) and `tls_passthrough` ones (routed on the
//! ClientHello's SNI, passed through encrypted). A connection takes the route whose every set
//! field matches it: a route with more kinds of fields set before one with fewer, then in
//! config order (Kong's traditional stream router orders by how many categories a route
//! matches on).
//!
//! Under `router_flavor = expressions` every stream route is an ATC program as Kong's
//! `kong/router/expressions.lua` makes it: its `expression` (or its traditional fields
//! translated), with the `net.protocol` clause for its protocols, ordered by Kong's priority
//! (`priority` for an expression route, above every translated one; `stream_get_priority`
//! for the others) and then by route id, both descending as the engine orders its matchers.
//! A connection's `net.protocol` is `udp`, `tls` when the ClientHello named a server, else
//! `tcp` (Kong's stream `exec`).
//!
//! Under `traditional_compatible` (Kong's default) routes are tried in that same order
//! (`stream_get_priority`, then id), each by the matchers above. One difference is kept on
//! purpose: Kong's translation of a traditional stream route has no `net.protocol` clause, so
//! there a `tls` route's `snis` (`net.protocol != "tls" || tls.sni == ...`) also take a plain
//! TCP connection; here a route takes only connections of its own protocols.

use std::net::{IpAddr, SocketAddr};

use serde_json::Value;
use turnpike_config::atc::{Expression, RouterFlavor};
use turnpike_config::conf::{cidr_contains, parse_cidr};
use turnpike_config::declarative::Config;
use turnpike_router::atc::eval::{eval, Fields, Record};
use turnpike_router::RequestView;

/// One `sources` / `destinations` entry: an address (network and prefix) and a port, either
/// may be absent.
#[derive(Debug, Clone, Copy)]
struct Net {
    ip: Option<(IpAddr, u8)>,
    port: Option<u16>,
}

impl Net {
    fn parse(v: &Value) -> Option<Net> {
        let ip = match v.get("ip").and_then(Value::as_str) {
            Some(s) => Some(parse_cidr(s)?),
            None => None,
        };
        let port = match v.get("port").and_then(Value::as_u64) {
            Some(p) => Some(u16::try_from(p).ok()?),
            None => None,
        };
        Some(Net { ip, port })
    }

    fn matches(&self, addr: SocketAddr) -> bool {
        self.ip
            .is_none_or(|(net, len)| cidr_contains(net, len, addr.ip()))
            && self.port.is_none_or(|p| p == addr.port())
    }
}

/// How a connection reached the route: which of its protocols apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport<'a> {
    /// A plain TCP connection.
    Tcp,
    /// A UDP client (its datagrams from one address and port).
    Udp,
    /// A connection on a TLS listener, with the ClientHello's server name.
    Tls(Option<&'a str>),
}

#[derive(Debug)]
pub struct StreamRoute {
    sources: Vec<Net>,
    destinations: Vec<Net>,
    /// Lower case; `*.example.com` kept as `.example.com`.
    snis: Vec<String>,
    tcp: bool,
    udp: bool,
    tls: bool,
    /// The TLS is not terminated: the bytes go to the service as they came.
    pub passthrough: bool,
    /// Index into the config's services.
    pub service: usize,
    /// The route's id, for logs.
    pub id: String,
    /// The route itself (for the log plugins' entries) and its plugins (`preread`,
    /// `stream_log`, for the configs whose `protocols` list the session's).
    pub route: std::sync::Arc<turnpike_config::declarative::Route>,
    pub chain: super::Chain,
    /// The route as an ATC program, under the expressions flavor.
    program: Option<Expression>,
}

impl StreamRoute {
    fn matches(&self, peer: SocketAddr, local: SocketAddr, t: Transport<'_>) -> bool {
        let transport = match t {
            Transport::Tcp => self.tcp,
            Transport::Udp => self.udp,
            Transport::Tls(sni) => {
                (self.tls || self.passthrough)
                    && (self.snis.is_empty()
                        || sni.is_some_and(|n| {
                            self.snis.iter().any(|s| match s.strip_prefix('.') {
                                Some(_) => n.ends_with(s.as_str()),
                                None => s == n,
                            })
                        }))
            }
        };
        transport
            && (self.sources.is_empty() || self.sources.iter().any(|n| n.matches(peer)))
            && (self.destinations.is_empty() || self.destinations.iter().any(|n| n.matches(local)))
    }

    fn categories(&self) -> u8 {
        (!self.sources.is_empty()) as u8
            + (!self.destinations.is_empty()) as u8
            + (!self.snis.is_empty()) as u8
    }
}

/// Whether `r` is a stream route (what [`StreamRoutes::compile`] looks at).
pub fn is_stream(r: &turnpike_config::declarative::Route) -> bool {
    r.protocols
        .iter()
        .any(|p| matches!(p, "tcp" | "udp" | "tls" | "tls_passthrough"))
}

/// The stream routes of one config, most specific first.
#[derive(Debug, Default)]
pub struct StreamRoutes {
    routes: Vec<StreamRoute>,
    /// Matched by their programs (the expressions flavor).
    atc: bool,
}

impl StreamRoutes {
    /// The stream routes of `config` whose service is enabled, for the router `flavor`.
    pub fn compile(
        config: &Config,
        flavor: RouterFlavor,
        chain: impl Fn(&turnpike_config::declarative::Route) -> super::Chain,
    ) -> StreamRoutes {
        let atc = flavor == RouterFlavor::Expressions;
        let mut routes: Vec<(StreamRoute, u64, uuid::Uuid)> = Vec::new();
        for r in &config.routes {
            let (tcp, udp, tls, passthrough) = (
                r.protocols.contains("tcp"),
                r.protocols.contains("udp"),
                r.protocols.contains("tls"),
                r.protocols.contains("tls_passthrough"),
            );
            if !is_stream(r) {
                continue;
            }
            let Some(sid) = r.service.as_ref().map(|s| &s.id) else {
                continue;
            };
            let Some(service) = config
                .services
                .iter()
                .position(|s| *s.id == **sid && s.enabled)
            else {
                continue;
            };
            let nets = |list: Option<&[Value]>| -> Vec<Net> {
                list.unwrap_or_default()
                    .iter()
                    .filter_map(Net::parse)
                    .collect()
            };
            let route = StreamRoute {
                sources: nets(r.sources.as_deref()),
                destinations: nets(r.destinations.as_deref()),
                snis: r
                    .snis
                    .iter()
                    .flatten()
                    .map(|s| {
                        let s = s.to_ascii_lowercase();
                        match s.strip_prefix('*') {
                            Some(rest) => rest.to_string(),
                            None => s,
                        }
                    })
                    .collect(),
                tcp,
                udp,
                tls,
                passthrough,
                service,
                id: r.id.to_string(),
                route: r.clone(),
                chain: chain(r),
                program: None,
            };
            if atc {
                let priority = turnpike_router::atc::translate::stream_priority(r);
                match turnpike_router::atc::programs(r, |_| priority) {
                    Ok(mut ps) if !ps.is_empty() => {
                        let (program, priority, id) = ps.swap_remove(0);
                        routes.push((
                            StreamRoute {
                                program: Some(program.expr),
                                ..route
                            },
                            priority,
                            id,
                        ));
                    }
                    Ok(_) => {}
                    Err(e) => tracing::error!("stream route {}: {e}", r.id),
                }
                continue;
            }
            if route.categories() == 0 {
                continue;
            }
            if flavor == RouterFlavor::Traditional {
                let categories = route.categories() as u64;
                routes.push((route, categories, uuid::Uuid::nil()));
            } else {
                // traditional_compatible: Kong's ATC order, its matchers ours.
                let priority = turnpike_router::atc::translate::stream_priority(r);
                let id = uuid::Uuid::parse_str(&r.id).unwrap_or_default();
                routes.push((route, priority, id));
            }
        }
        if flavor != RouterFlavor::Traditional {
            routes.sort_by(|a, b| b.1.cmp(&a.1).then(b.2.cmp(&a.2)));
        } else {
            // Stable: config order among routes of as many categories.
            routes.sort_by_key(|r| std::cmp::Reverse(r.1));
        }
        StreamRoutes {
            routes: routes.into_iter().map(|r| r.0).collect(),
            atc,
        }
    }

    /// The route for a connection from `peer` accepted on `local`.
    pub fn find(
        &self,
        peer: SocketAddr,
        local: SocketAddr,
        t: Transport<'_>,
    ) -> Option<&StreamRoute> {
        self.find_index(peer, local, t).map(|i| &self.routes[i])
    }

    /// The route at `index` (as `find_index` gave it).
    pub fn get(&self, index: usize) -> Option<&StreamRoute> {
        self.routes.get(index)
    }

    /// `find`'s route, by its index (what a session that outlives the borrow keeps).
    pub fn find_index(
        &self,
        peer: SocketAddr,
        local: SocketAddr,
        t: Transport<'_>,
    ) -> Option<usize> {
        if !self.atc {
            return self.routes.iter().position(|r| r.matches(peer, local, t));
        }
        let (protocol, sni) = match t {
            Transport::Tcp | Transport::Tls(None) => ("tcp", None),
            Transport::Udp => ("udp", None),
            Transport::Tls(Some(name)) => ("tls", Some(name)),
        };
        let headers = http::HeaderMap::new();
        let view = RequestView {
            sni,
            peer: Some(peer),
            local_ip: Some(local.ip()),
            protocol: Some(protocol),
            ..RequestView::basic("", "", local.port(), "", &headers)
        };
        let mut fields = Fields::new(&view);
        self.routes.iter().position(|r| {
            r.program
                .as_ref()
                .is_some_and(|e| eval(e, &mut fields, &mut Record::default()))
        })
    }

    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(routes: &str) -> Config {
        flavored(routes, RouterFlavor::TraditionalCompatible).unwrap()
    }

    fn flavored(routes: &str, flavor: RouterFlavor) -> Result<Config, String> {
        let yaml = format!(
            "_format_version: '3.0'\nservices: [{{name: a, url: 'tcp://127.0.0.1:1'}}, {{name: b, url: 'tcp://127.0.0.1:2'}}, {{name: c, url: 'tcp://127.0.0.1:3'}}]\nroutes: {routes}"
        );
        let plugins = turnpike_plugins::bundled().routing(flavor);
        turnpike_config::declarative::load_str(&yaml, &plugins).map_err(|e| e.to_string())
    }

    fn expressions(routes: &str) -> StreamRoutes {
        let c = flavored(routes, RouterFlavor::Expressions).unwrap();
        StreamRoutes::compile(&c, RouterFlavor::Expressions, |_| {
            std::sync::Arc::from(Vec::new())
        })
    }

    #[test]
    fn expression_routes_match_on_net_fields_by_priority() {
        let s = expressions(
            r#"[{name: low, protocols: [tcp], service: a, priority: 1,
                 expression: 'net.dst.port == 7000'},
                {name: high, protocols: [tcp], service: b, priority: 5,
                 expression: 'net.dst.port == 7000 && net.src.ip in 10.0.0.0/8'},
                {name: tls, protocols: [tls], service: c,
                 expression: 'tls.sni =^ ".wild.test" || tls.sni == "a.test"'},
                {name: udp, protocols: [udp], service: c, expression: 'net.src.port >= 1024'}]"#,
        );
        let at = |peer: &str, local: &str, t: Transport<'_>| {
            s.find(peer.parse().unwrap(), local.parse().unwrap(), t)
                .map(|r| r.service)
        };
        use Transport::*;
        // The higher priority wins where both match.
        assert_eq!(at("10.1.2.3:5000", "127.0.0.1:7000", Tcp), Some(1));
        assert_eq!(at("192.0.2.1:5000", "127.0.0.1:7000", Tcp), Some(0));
        assert_eq!(at("10.1.2.3:5000", "127.0.0.1:7001", Tcp), None);
        // The protocol clause: a tcp route takes no UDP client, the udp route no TCP one.
        assert_eq!(at("192.0.2.1:5000", "127.0.0.1:7001", Udp), Some(2));
        assert_eq!(at("192.0.2.1:5000", "127.0.0.1:7000", Udp), Some(2));
        assert_eq!(at("192.0.2.1:1000", "127.0.0.1:7001", Udp), None);
        assert_eq!(
            at("192.0.2.1:5000", "127.0.0.1:7002", Tls(Some("x.wild.test"))),
            Some(2)
        );
        assert_eq!(
            at("192.0.2.1:5000", "127.0.0.1:7002", Tls(Some("a.test"))),
            Some(2)
        );
        assert_eq!(
            at("192.0.2.1:5000", "127.0.0.1:7002", Tls(Some("b.test"))),
            None
        );
        // A ClientHello without a name is `tcp` to the engine, as in Kong: the tcp
        // routes see it.
        assert_eq!(at("192.0.2.1:5000", "127.0.0.1:7000", Tls(None)), Some(0));
    }

    #[test]
    fn traditional_stream_routes_rank_below_expressions_by_kongs_stream_priority() {
        let s = expressions(
            r#"[{name: port, protocols: [tcp], service: a, destinations: [{port: 7000}]},
                {name: both, protocols: [tcp], service: b, destinations: [{port: 7000}],
                 sources: [{ip: 10.0.0.0/8}]},
                {name: expr, protocols: [tcp], service: c, priority: 0,
                 expression: 'net.src.ip == 10.9.9.9'}]"#,
        );
        let at = |peer: &str| {
            s.find(
                peer.parse().unwrap(),
                "127.0.0.1:7000".parse().unwrap(),
                Transport::Tcp,
            )
            .map(|r| r.service)
        };
        // An expression route, even at priority 0, ranks above every translated one.
        assert_eq!(at("10.9.9.9:1"), Some(2));
        // sources + destinations carry bit 61, above a destination port alone.
        assert_eq!(at("10.1.1.1:1"), Some(1));
        assert_eq!(at("192.0.2.1:1"), Some(0));
        let p = |routes: &str| {
            let c = flavored(routes, RouterFlavor::Expressions).unwrap();
            turnpike_router::atc::translate::stream_priority(&c.routes[0])
        };
        assert_eq!(
            p("[{protocols: [tcp], service: a, destinations: [{ip: 10.0.0.1, port: 1}]}]"),
            0b1100
        );
        assert_eq!(
            p("[{protocols: [tcp], service: a, sources: [{ip: 10.0.0.0/8}], destinations: [{port: 1}]}]"),
            1 << 61 | 1 << 4 | 0b100
        );
        assert_eq!(
            p("[{protocols: [tls], service: a, snis: [a.test]}]"),
            1 << 61
        );
    }

    #[test]
    fn traditional_compatible_orders_stream_routes_as_kongs_atc_does() {
        let routes = "[{name: dst, protocols: [tcp], service: a, destinations: [{ip: 127.0.0.1, port: 7000}]},
                       {name: src, protocols: [tcp], service: b, sources: [{ip: 10.0.0.0/8}]}]";
        let c = config(routes);
        let pick = |flavor| {
            StreamRoutes::compile(&c, flavor, |_| std::sync::Arc::from(Vec::new()))
                .find(
                    "10.1.1.1:1".parse().unwrap(),
                    "127.0.0.1:7000".parse().unwrap(),
                    Transport::Tcp,
                )
                .map(|r| r.service)
        };
        // One category each: the traditional router keeps config order; Kong's default
        // ranks a source CIDR (bits 4) above a destination IP and port (bits 3 and 2).
        assert_eq!(pick(RouterFlavor::Traditional), Some(0));
        assert_eq!(pick(RouterFlavor::TraditionalCompatible), Some(1));
    }

    #[test]
    fn ties_go_to_the_greater_route_id() {
        let s = expressions(
            r#"[{id: 00000000-0000-0000-0000-000000000001, protocols: [tcp], service: a,
                 expression: 'net.dst.port == 7000'},
                {id: 00000000-0000-0000-0000-000000000002, protocols: [tcp], service: b,
                 expression: 'net.dst.port == 7000'}]"#,
        );
        let found = s.find(
            "10.0.0.1:1".parse().unwrap(),
            "127.0.0.1:7000".parse().unwrap(),
            Transport::Tcp,
        );
        assert_eq!(found.map(|r| r.service), Some(1));
    }

    #[test]
    fn a_stream_expression_asking_for_http_fields_is_refused_with_kongs_message() {
        let e = flavored(
            "[{protocols: [tcp], service: a, expression: 'http.path == \"/x\"'}]",
            RouterFlavor::Expressions,
        )
        .unwrap_err();
        assert!(
            e.contains("Router Expression failed validation: Unknown LHS field"),
            "{e}"
        );
    }

    #[test]
    fn routes_match_on_sources_and_destinations_most_specific_first() {
        let c = config(
            "[{name: any, protocols: [tcp], service: a, destinations: [{port: 7000}]},
              {name: lan, protocols: [tcp], service: b, destinations: [{port: 7000}], sources: [{ip: 10.0.0.0/8}]},
              {name: other, protocols: [tcp], service: a, destinations: [{ip: 127.0.0.2, port: 7001}]}]",
        );
        let s = StreamRoutes::compile(&c, RouterFlavor::Traditional, |_| {
            std::sync::Arc::from(Vec::new())
        });
        let at = |peer: &str, local: &str| {
            s.find(
                peer.parse().unwrap(),
                local.parse().unwrap(),
                Transport::Tcp,
            )
            .map(|r| r.service)
        };
        assert_eq!(at("10.1.2.3:5000", "127.0.0.1:7000"), Some(1));
        assert_eq!(at("192.168.0.1:5000", "127.0.0.1:7000"), Some(0));
        assert_eq!(at("10.1.2.3:5000", "127.0.0.1:7001"), None);
        assert_eq!(at("10.1.2.3:5000", "127.0.0.2:7001"), Some(0));
    }

    #[test]
    fn tls_routes_match_on_the_server_name() {
        let c = config(
            "[{name: t, protocols: [tls], service: a, snis: [a.test, '*.wild.test']},
              {name: p, protocols: [tls_passthrough], service: b, snis: [pass.test]},
              {name: plain, protocols: [tcp], service: b, destinations: [{port: 7000}]}]",
        );
        let s = StreamRoutes::compile(&c, RouterFlavor::Traditional, |_| {
            std::sync::Arc::from(Vec::new())
        });
        let (peer, local) = (
            "10.0.0.1:1".parse().unwrap(),
            "127.0.0.1:7000".parse().unwrap(),
        );
        let tls = |sni: Option<&str>| {
            s.find(peer, local, Transport::Tls(sni))
                .map(|r| (r.service, r.passthrough))
        };
        assert_eq!(tls(Some("a.test")), Some((0, false)));
        assert_eq!(tls(Some("x.wild.test")), Some((0, false)));
        assert_eq!(tls(Some("pass.test")), Some((1, true)));
        assert_eq!(tls(Some("other.test")), None);
        assert_eq!(tls(None), None);
        // A tcp route takes plain connections only.
        assert_eq!(
            s.find(peer, local, Transport::Tcp).map(|r| r.service),
            Some(1)
        );
    }
}
