//! Property values: numbers, durations, sizes, lists, header sets, listeners, CIDRs.

use super::*;

pub(super) fn parse_num<T: std::str::FromStr>(v: &str) -> Option<T> {
    v.trim().parse().ok()
}

pub(super) fn split_list(v: &str) -> Vec<String> {
    v.split(',')
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

/// nginx-style durations: `60`, `60s`, `500ms`, `1m`, `1h`.
pub fn parse_duration(v: &str) -> Option<Duration> {
    let v = v.trim();
    let (num, unit) = match v.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => (&v[..i], &v[i..]),
        None => (v, "s"),
    };
    let n: u64 = num.parse().ok()?;
    Some(match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n * 60),
        "h" => Duration::from_secs(n * 3600),
        _ => return None,
    })
}

/// nginx sizes: `8k`, `1m`, `512`.
pub fn parse_size(v: &str) -> Option<usize> {
    let v = v.trim().to_ascii_lowercase();
    let (num, mult) = if let Some(n) = v.strip_suffix('k') {
        (n, 1024)
    } else if let Some(n) = v.strip_suffix('m') {
        (n, 1024 * 1024)
    } else if let Some(n) = v.strip_suffix('g') {
        (n, 1024 * 1024 * 1024)
    } else {
        (v.as_str(), 1)
    };
    num.parse::<usize>().ok().map(|n| n * mult)
}

pub(super) fn parse_header_buffers(v: &str) -> Option<usize> {
    let mut it = v.split_whitespace();
    let count: usize = it.next()?.parse().ok()?;
    let size = parse_size(it.next()?)?;
    if it.next().is_some() || count == 0 || size == 0 {
        return None;
    }
    Some(count * size)
}

pub(super) fn parse_headers(v: &str) -> Result<HeaderSet, ConfError> {
    let mut h = HeaderSet::default();
    for item in split_list(v) {
        match item.to_ascii_lowercase().as_str() {
            "off" => return Ok(HeaderSet::default()),
            "server" => h.server = true,
            "via" => h.via = true,
            "x-kong-proxy-latency" => h.proxy_latency = true,
            "x-kong-response-latency" => h.response_latency = true,
            "x-kong-upstream-latency" => h.upstream_latency = true,
            "x-kong-admin-latency" => h.admin_latency = true,
            "x-kong-upstream-status" => h.upstream_status = true,
            "x-kong-request-id" => h.request_id = true,
            "server_tokens" => {
                h.server = true;
                h.via = true;
            }
            "latency_tokens" => {
                h.proxy_latency = true;
                h.response_latency = true;
                h.admin_latency = true;
                h.upstream_latency = true;
            }
            other => {
                return Err(ConfError::Invalid(format!(
                    "headers: invalid header value: {other}"
                )))
            }
        }
    }
    Ok(h)
}

/// Parses Kong's listen syntax: `addr:port [ssl] [http2] [reuseport] [backlog=N] [proxy_protocol]
/// [deferred] [bind]`, comma separated, or `off`.
pub fn parse_listen(name: &str, v: &str) -> Result<Vec<ListenAddr>, ConfError> {
    let v = v.trim();
    if v == "off" || v.is_empty() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for entry in v.split(',') {
        let mut parts = entry.split_whitespace();
        let Some(addr_text) = parts.next() else {
            return Err(ConfError::Invalid(format!("{name}: empty entry in '{v}'")));
        };
        let addr = addr_text
            .to_socket_addrs()
            .ok()
            .and_then(|mut a| a.next())
            .ok_or_else(|| {
                ConfError::Invalid(format!(
                    "{name}: invalid address '{addr_text}' (expected host:port)"
                ))
            })?;
        let mut l = ListenAddr {
            addr,
            ssl: false,
            http2: false,
            reuseport: false,
            backlog: DEFAULT_BACKLOG,
            stream: false,
            udp: false,
            proxy_protocol: false,
        };
        for flag in parts {
            match flag {
                "ssl" => l.ssl = true,
                "http2" => l.http2 = true,
                "reuseport" => l.reuseport = true,
                "proxy_protocol" => l.proxy_protocol = true,
                // Accepted for compatibility; they change nothing in Turnpike.
                "deferred" | "bind" => {}
                "udp" if name == "stream_listen" => l.udp = true,
                "udp" => {
                    return Err(ConfError::Invalid(format!(
                        "{name}: unknown listen flag 'udp' in '{entry}'"
                    )))
                }
                f if f.starts_with("backlog=") => {
                    l.backlog = f["backlog=".len()..]
                        .parse()
                        .ok()
                        .filter(|n| *n > 0)
                        .ok_or_else(|| {
                            ConfError::Invalid(format!("{name}: invalid backlog in '{f}'"))
                        })?;
                }
                f if f.starts_with("so_keepalive=") || f.starts_with("ipv6only=") => {}
                other => {
                    return Err(ConfError::Invalid(format!(
                        "{name}: unknown listen flag '{other}' in '{entry}'"
                    )))
                }
            }
        }
        out.push(l);
    }
    Ok(out)
}

/// Parses an IP or CIDR range into (network, prefix length).
pub fn parse_cidr(s: &str) -> Option<(std::net::IpAddr, u8)> {
    let (ip, len) = match s.split_once('/') {
        Some((ip, len)) => (ip, Some(len)),
        None => (s, None),
    };
    let ip: std::net::IpAddr = ip.parse().ok()?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let len = match len {
        Some(l) => l.parse::<u8>().ok().filter(|l| *l <= max)?,
        None => max,
    };
    Some((ip, len))
}

/// Whether `ip` lies in `net/len` (an IPv4 network also matches IPv4-mapped IPv6 addresses).
pub fn cidr_contains(net: std::net::IpAddr, len: u8, ip: std::net::IpAddr) -> bool {
    let ip = match (net, ip) {
        (std::net::IpAddr::V4(_), std::net::IpAddr::V6(v6)) => match v6.to_ipv4_mapped() {
            Some(v4) => std::net::IpAddr::V4(v4),
            None => return false,
        },
        _ => ip,
    };
    match (net, ip) {
        (std::net::IpAddr::V4(n), std::net::IpAddr::V4(i)) => {
            let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
            u32::from(n) & mask == u32::from(i) & mask
        }
        (std::net::IpAddr::V6(n), std::net::IpAddr::V6(i)) => {
            let mask = if len == 0 {
                0
            } else {
                u128::MAX << (128 - len)
            };
            u128::from(n) & mask == u128::from(i) & mask
        }
        _ => false,
    }
}
