//! An upstream peer (host and port) as the request path uses it: its pool id, TLS server
//! name, address or DNS entry and Host header, all made at config compile time.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use http::HeaderValue;
use rustc_hash::FxHashMap;

use crate::upstream::dns::Dns;

#[derive(Clone, Debug)]
pub struct Peer {
    pub host: Arc<str>,
    pub port: u16,
    /// Identifies host:port in the keepalive pools, the same across config reloads.
    pub id: u64,
    /// The TLS server name (SNI) for this host, built once.
    pub server_name: rustls::pki_types::ServerName<'static>,
    /// Known at compile time when the host is an IP address.
    pub addr: Option<SocketAddr>,
    /// The resolver's entry for a host name (`None` for an IP address).
    pub dns: Option<Arc<crate::upstream::dns::Name>>,
    /// The Host header for this peer (`host` or `host:port` when the port is not the default).
    pub host_header: HeaderValue,
}

impl Peer {
    /// The address a new connection goes to: known for an IP, else from the DNS cache
    /// (`None` when the name has no address).
    pub async fn address(&self) -> Option<SocketAddr> {
        if let Some(a) = self.addr {
            return Some(a);
        }
        match self.dns.as_ref()?.address(self.port).await {
            Ok(a) => Some(a),
            Err(e) => {
                tracing::debug!("dns: no address for {}: {e:?}", self.host);
                None
            }
        }
    }
}

fn host_header(host: &str, port: u16, https: bool) -> HeaderValue {
    let default = if https { 443 } else { 80 };
    let v = if port == default {
        host.to_string()
    } else {
        format!("{host}:{port}")
    };
    HeaderValue::from_str(&v).unwrap_or_else(|_| HeaderValue::from_static("invalid"))
}

/// The node's numbering of upstream peers (host:port), handed out at config compile time:
/// pool keys stay valid across reloads and cost a u64 compare on the request path.
/// The ids are dense (0, 1, 2, ...): per-peer counters are vectors indexed by them. A number is
/// never reused (pooled connections and counters may still carry it), so the table grows by one
/// entry per host:port the node has ever been configured with.
#[derive(Default)]
pub struct Peers {
    ids: std::sync::Mutex<PeerIds>,
}

#[derive(Default)]
struct PeerIds {
    by_address: FxHashMap<(String, u16), u64>,
    addresses: Vec<(String, u16)>,
}

impl Peers {
    fn id(&self, host: &str, port: u16) -> u64 {
        let mut ids = self.ids.lock().unwrap_or_else(|e| e.into_inner());
        let key = (host.to_ascii_lowercase(), port);
        if let Some(id) = ids.by_address.get(&key) {
            return *id;
        }
        let id = ids.addresses.len() as u64;
        ids.addresses.push(key.clone());
        ids.by_address.insert(key, id);
        id
    }

    /// The host and port a peer id stands for.
    pub fn address(&self, id: u64) -> Option<(String, u16)> {
        self.ids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .addresses
            .get(id as usize)
            .cloned()
    }

    /// The peer `host:port` (`https`: for its Host header's default port), its name from the
    /// node's resolver `dns`.
    pub fn peer(&self, dns: &Arc<Dns>, host: &str, port: u16, https: bool) -> Peer {
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let addr = bare
            .parse::<IpAddr>()
            .ok()
            .map(|ip| SocketAddr::new(ip, port));
        let server_name =
            rustls::pki_types::ServerName::try_from(bare.to_string()).unwrap_or_else(|_| {
                rustls::pki_types::ServerName::try_from("invalid").expect("a valid name")
            });
        Peer {
            host: host.into(),
            port,
            id: self.id(host, port),
            server_name,
            dns: if addr.is_none() { dns.name(bare) } else { None },
            addr,
            host_header: host_header(host, port, https),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_header_has_port_only_when_not_default() {
        assert_eq!(host_header("a", 80, false), "a");
        assert_eq!(host_header("a", 8080, false), "a:8080");
        assert_eq!(host_header("a", 443, true), "a");
    }

    #[test]
    fn ids_are_dense_per_node_and_name_their_address() {
        let (dns, _) = Dns::start(&Default::default()).unwrap();
        let (a, b) = (Peers::default(), Peers::default());
        assert_eq!(a.peer(&dns, "10.0.0.1", 80, false).id, 0);
        assert_eq!(a.peer(&dns, "10.0.0.2", 80, false).id, 1);
        assert_eq!(
            a.peer(&dns, "10.0.0.1", 80, true).id,
            0,
            "the same host:port"
        );
        assert_eq!(a.peer(&dns, "EXAMPLE.test", 8080, false).id, 2);
        assert_eq!(a.peer(&dns, "example.test", 8080, false).id, 2);
        assert_eq!(a.address(2), Some(("example.test".into(), 8080)));
        assert_eq!(a.address(3), None);
        // Another node numbers its own peers.
        assert_eq!(b.peer(&dns, "10.0.0.2", 80, false).id, 0);
    }
}
