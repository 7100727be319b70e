//! The resolver's properties (`dns_*`).

use super::*;

/// A record type `dns_order` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DnsRecord {
    /// The type of the last successful look-up of the name.
    Last,
    Srv,
    A,
    Aaaa,
    /// Accepted as Kong spells it; CNAME chains are followed by the A and AAAA look-ups.
    Cname,
}

/// Kong's `dns_*` properties.
#[derive(Debug, Clone, PartialEq)]
pub struct DnsConf {
    /// `dns_resolver`: name servers (port 53 when omitted); empty: those of /etc/resolv.conf.
    pub resolver: Vec<std::net::SocketAddr>,
    /// `dns_hostsfile`, read once at start.
    pub hostsfile: PathBuf,
    pub order: Vec<DnsRecord>,
    /// `dns_valid_ttl`: replaces the TTL of every answer when set.
    pub valid_ttl: Option<Duration>,
    /// How long an answer is still used past its TTL while it cannot be refreshed.
    pub stale_ttl: Duration,
    pub not_found_ttl: Duration,
    pub error_ttl: Duration,
    /// Most names kept (the names of the running config are always kept).
    pub cache_size: usize,
}

impl Default for DnsConf {
    fn default() -> Self {
        DnsConf {
            resolver: Vec::new(),
            hostsfile: PathBuf::from("/etc/hosts"),
            order: vec![
                DnsRecord::Last,
                DnsRecord::Srv,
                DnsRecord::A,
                DnsRecord::Cname,
            ],
            valid_ttl: None,
            stale_ttl: Duration::from_secs(3600),
            not_found_ttl: Duration::from_secs(30),
            error_ttl: Duration::from_secs(1),
            cache_size: 10000,
        }
    }
}

/// Parses Kong's `dns_*` properties.
pub(super) fn dns_conf(get: &dyn Fn(&str) -> String) -> Result<DnsConf, ConfError> {
    let seconds = |name: &str, allow_empty: bool| -> Result<Option<Duration>, ConfError> {
        let v = get(name);
        let v = v.trim();
        if v.is_empty() && allow_empty {
            return Ok(None);
        }
        v.parse::<f64>()
            .ok()
            .filter(|n| *n >= 0.0 && *n <= 1e9)
            .map(|n| Some(Duration::from_secs_f64(n)))
            .ok_or_else(|| invalid(name, "must be a number of seconds".into()))
    };
    let mut resolver = Vec::new();
    for entry in split_list(&get("dns_resolver")) {
        let addr = entry
            .parse::<std::net::SocketAddr>()
            .ok()
            .or_else(|| {
                let bare = entry.trim_start_matches('[').trim_end_matches(']');
                bare.parse::<std::net::IpAddr>()
                    .ok()
                    .map(|ip| std::net::SocketAddr::new(ip, 53))
            })
            .ok_or_else(|| {
                invalid(
                    "dns_resolver",
                    format!("'{entry}' is not an ip[:port] address"),
                )
            })?;
        resolver.push(addr);
    }
    let mut order = Vec::new();
    for t in split_list(&get("dns_order")) {
        order.push(match t.to_ascii_uppercase().as_str() {
            "LAST" => DnsRecord::Last,
            "SRV" => DnsRecord::Srv,
            "A" => DnsRecord::A,
            "AAAA" => DnsRecord::Aaaa,
            "CNAME" => DnsRecord::Cname,
            _ => {
                return Err(invalid(
                    "dns_order",
                    format!("invalid entry '{t}' (one of LAST, SRV, A, AAAA, CNAME)"),
                ))
            }
        });
    }
    if !order
        .iter()
        .any(|t| matches!(t, DnsRecord::Srv | DnsRecord::A | DnsRecord::Aaaa))
    {
        return Err(invalid(
            "dns_order",
            "must name at least one of SRV, A or AAAA".into(),
        ));
    }
    let cache_size = parse_num::<usize>(&get("dns_cache_size"))
        .filter(|n| *n > 0)
        .ok_or_else(|| invalid("dns_cache_size", "must be a positive integer".into()))?;
    match get("dns_no_sync").trim() {
        "on" | "off" => {}
        _ => return Err(invalid("dns_no_sync", "must be 'on' or 'off'".into())),
    }
    Ok(DnsConf {
        resolver,
        hostsfile: PathBuf::from(get("dns_hostsfile").trim()),
        order,
        valid_ttl: seconds("dns_valid_ttl", true)?.filter(|d| !d.is_zero()),
        stale_ttl: seconds("dns_stale_ttl", false)?.unwrap_or_default(),
        not_found_ttl: seconds("dns_not_found_ttl", false)?.unwrap_or_default(),
        error_ttl: seconds("dns_error_ttl", false)?.unwrap_or_default(),
        cache_size,
    })
}
