//! Kong's stream routes (`protocols` `tcp`, `tls` or `tls_passthrough`), compiled with the
//! snapshot: each route's `sources` and `destinations` (an IP or CIDR, a port, or both) and
//! `snis` (exact, or `*.` wildcards) as matchers. A plain connection takes `tcp` routes, one
//! on a TLS listener `tls` routes (terminated) and `tls_passthrough` ones (routed on the
//! ClientHello's SNI, passed through encrypted). A connection takes the route whose every set
//! field matches it: a route with more kinds of fields set before one with fewer, then in
//! config order (Kong's traditional stream router orders by how many categories a route
//! matches on).

use std::net::{IpAddr, SocketAddr};

use serde_json::Value;
use turnpike_config::conf::{cidr_contains, parse_cidr};
use turnpike_config::declarative::Config;

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
}

impl StreamRoutes {
    /// The stream routes of `config` whose service is enabled.
    pub fn compile(config: &Config) -> StreamRoutes {
        let mut routes: Vec<StreamRoute> = Vec::new();
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
            };
            if route.categories() == 0 {
                continue;
            }
            routes.push(route);
        }
        // Stable: config order among routes of as many categories.
        routes.sort_by_key(|r| std::cmp::Reverse(r.categories()));
        StreamRoutes { routes }
    }

    /// The route for a connection from `peer` accepted on `local`.
    pub fn find(
        &self,
        peer: SocketAddr,
        local: SocketAddr,
        t: Transport<'_>,
    ) -> Option<&StreamRoute> {
        self.routes.iter().find(|r| r.matches(peer, local, t))
    }

    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(routes: &str) -> Config {
        let yaml = format!(
            "_format_version: '3.0'\nservices: [{{name: a, url: 'tcp://127.0.0.1:1'}}, {{name: b, url: 'tcp://127.0.0.1:2'}}]\nroutes: {routes}"
        );
        turnpike_config::declarative::load_str(&yaml, &turnpike_plugins::bundled()).unwrap()
    }

    #[test]
    fn routes_match_on_sources_and_destinations_most_specific_first() {
        let c = config(
            "[{name: any, protocols: [tcp], service: a, destinations: [{port: 7000}]},
              {name: lan, protocols: [tcp], service: b, destinations: [{port: 7000}], sources: [{ip: 10.0.0.0/8}]},
              {name: other, protocols: [tcp], service: a, destinations: [{ip: 127.0.0.2, port: 7001}]}]",
        );
        let s = StreamRoutes::compile(&c);
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
        let s = StreamRoutes::compile(&c);
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
