//! An upstream peer (host and port) as the request path uses it: its pool id, TLS server
//! name, address or DNS entry and Host header, all made at config compile time.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use http::HeaderValue;
use rustc_hash::FxHashMap;

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

fn host_header(host: &str, port: u16, https: bool) -> HeaderValue {
    let default = if https { 443 } else { 80 };
    let v = if port == default {
        host.to_string()
    } else {
        format!("{host}:{port}")
    };
    HeaderValue::from_str(&v).unwrap_or_else(|_| HeaderValue::from_static("invalid"))
}

/// A process-wide number per host:port, handed out at config compile time: pool keys stay
/// valid across reloads and cost a u64 compare on the request path.
/// The ids are dense (0, 1, 2, ...): per-peer counters are vectors indexed by them.
fn peer_id(host: &str, port: u16) -> u64 {
    let mut ids = PEER_IDS.lock().unwrap_or_else(|e| e.into_inner());
    let key = (host.to_ascii_lowercase(), port);
    if let Some(id) = ids.0.get(&key) {
        return *id;
    }
    let id = ids.1.len() as u64;
    ids.1.push(key.clone());
    ids.0.insert(key, id);
    id
}

type PeerIds = (FxHashMap<(String, u16), u64>, Vec<(String, u16)>);
static PEER_IDS: std::sync::Mutex<PeerIds> = std::sync::Mutex::new((
    FxHashMap::with_hasher(rustc_hash::FxBuildHasher),
    Vec::new(),
));

/// The host and port a peer id stands for.
pub fn peer_address(id: u64) -> Option<(String, u16)> {
    PEER_IDS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .1
        .get(id as usize)
        .cloned()
}

pub fn peer(host: &str, port: u16, https: bool) -> Peer {
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
        id: peer_id(host, port),
        server_name,
        dns: if addr.is_none() {
            crate::upstream::dns::name(bare)
        } else {
            None
        },
        addr,
        host_header: host_header(host, port, https),
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
}
