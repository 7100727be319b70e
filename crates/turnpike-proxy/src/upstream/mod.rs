//! The upstream side: keepalive pools (HTTP/1.1, and HTTP/2 for gRPC), load balancing over targets, health checks and DNS.

pub mod balancer;
pub mod connect;
pub mod dns;
pub mod h2;
pub mod health;
pub mod peer;
pub mod pool;

use std::sync::Arc;

/// What a node knows of its upstreams beyond any one config, owned by its `Gateway` and kept
/// across snapshots: target health (and the thread probing it), the peers' pool ids, and the
/// resolver with the names the configs use.
pub struct Upstreams {
    pub health: Arc<health::Health>,
    pub peers: peer::Peers,
    pub dns: Arc<dns::Dns>,
}

impl Upstreams {
    pub fn new(dns: Arc<dns::Dns>) -> Upstreams {
        Upstreams {
            health: Default::default(),
            peers: Default::default(),
            dns,
        }
    }

    /// The peer `host:port`, numbered and resolved by this node.
    pub fn peer(&self, host: &str, port: u16, https: bool) -> peer::Peer {
        self.peers.peer(&self.dns, host, port, https)
    }
}

impl Upstreams {
    /// With Kong's `dns_*` defaults (a file checked, not served; tests).
    pub fn with_default_dns() -> Result<Upstreams, String> {
        Ok(Upstreams::new(dns::Dns::start(&Default::default())?.0))
    }
}

#[cfg(test)]
impl Default for Upstreams {
    fn default() -> Upstreams {
        Upstreams::with_default_dns().expect("a resolver starts")
    }
}
