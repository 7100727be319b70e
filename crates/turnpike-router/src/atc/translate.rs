//! A traditional route as the ATC expression Kong's `get_expression` writes for it
//! (`kong/router/transform.lua`), byte for byte, and the `net.protocol` clause the
//! expressions flavor adds (`kong/router/expressions.lua`).

use serde_json::Value;
use turnpike_config::atc::escape_str;
use turnpike_config::declarative::Route;

const OR: &str = " || ";
const AND: &str = " && ";

/// `(name op v1 || name op v2 ...)`, `None` for no values.
fn gen_for_field<'v>(
    name: &str,
    vals: impl IntoIterator<Item = &'v str>,
    op_val: impl Fn(&'v str) -> (&'static str, String),
) -> Option<String> {
    let parts: Vec<String> = vals
        .into_iter()
        .map(|v| {
            let (op, v) = op_val(v);
            format!("{name} {op} {}", escape_str(&v))
        })
        .collect();
    (!parts.is_empty()).then(|| format!("({})", parts.join(OR)))
}

/// Kong's `parse_ip_addr`: an IPv4 CIDR written as its network address; IPv6 as written.
fn ip_addr(ip: &str) -> (String, Option<&str>) {
    let Some((addr, mask)) = ip.split_once('/') else {
        return (ip.to_string(), None);
    };
    match (addr.parse::<std::net::Ipv4Addr>(), mask.parse::<u32>()) {
        (Ok(v4), Ok(m)) if m <= 32 => {
            let bits = u32::from(v4);
            let net = if m == 0 {
                0
            } else {
                bits & (u32::MAX << (32 - m))
            };
            (std::net::Ipv4Addr::from(net).to_string(), Some(mask))
        }
        _ => (addr.to_string(), Some(mask)),
    }
}

/// Kong's `gen_for_nets` for `sources` / `destinations`.
fn gen_for_nets(ip_field: &str, port_field: &str, vals: &[Value]) -> Option<String> {
    if vals.is_empty() {
        return None;
    }
    let mut parts = Vec::new();
    for v in vals {
        let ip = v.get("ip").and_then(Value::as_str);
        let port = v.get("port").and_then(Value::as_i64);
        let exp_ip = ip.map(|ip| match ip_addr(ip) {
            (addr, Some(mask)) => format!("{ip_field} in {addr}/{mask}"),
            (addr, None) => format!("{ip_field} == {addr}"),
        });
        let exp_port = port.map(|p| format!("{port_field} == {p}"));
        parts.push(match (exp_ip, exp_port) {
            (Some(i), Some(p)) => format!("({i}{AND}{p})"),
            (Some(i), None) => i,
            (None, Some(p)) => p,
            (None, None) => return None,
        });
    }
    Some(format!("({})", parts.join(OR)))
}

fn is_stream(route: &Route) -> bool {
    matches!(
        route.protocols.first(),
        Some("tcp" | "udp" | "tls" | "tls_passthrough")
    )
}

/// Kong's `get_expression` for `route`, its paths restricted to `paths` (one of the groups
/// Kong splits a route's paths into). `None` when the route sets no field to match on.
pub fn expression(route: &Route, paths: &[&str]) -> Option<String> {
    let mut parts: Vec<String> = Vec::new();
    let snis = route.snis.as_deref().unwrap_or_default();
    if let Some(gen) = gen_for_field("tls.sni", snis.iter().map(String::as_str), |sni| {
        // sni_op_transform, then sni_val_transform.
        let op = if sni.starts_with('*') {
            "=^"
        } else if sni.ends_with('*') {
            "^="
        } else {
            "=="
        };
        if op == "^=" {
            return (op, sni[..sni.len() - 1].to_string());
        }
        let mut v = sni;
        if v.len() > 1 && v.ends_with('.') {
            v = &v[..v.len() - 1];
        }
        if op == "=^" {
            v = &v[1..];
        }
        (op, v.to_string())
    }) {
        let proto = if is_stream(route) { "tls" } else { "https" };
        parts.push(format!("(net.protocol != r#\"{proto}\"#{OR}{gen})"));
    }
    if let Some(g) = gen_for_nets(
        "net.src.ip",
        "net.src.port",
        route.sources.as_deref().unwrap_or_default(),
    ) {
        parts.push(g);
    }
    if let Some(g) = gen_for_nets(
        "net.dst.ip",
        "net.dst.port",
        route.destinations.as_deref().unwrap_or_default(),
    ) {
        parts.push(g);
    }
    if !is_stream(route) {
        let methods = route.methods.as_deref().unwrap_or_default();
        if let Some(g) = gen_for_field("http.method", methods.iter().map(String::as_str), |m| {
            ("==", m.to_string())
        }) {
            parts.push(g);
        }
        let hosts = route.hosts.as_deref().unwrap_or_default();
        if !hosts.is_empty() {
            let alts: Vec<String> = hosts
                .iter()
                .map(|h| {
                    let (host, port) = kong_split_host_port(h);
                    let (op, host) = if let Some(rest) = host.strip_prefix('*') {
                        ("=^", rest)
                    } else if let Some(rest) = host.strip_suffix('*') {
                        ("^=", rest)
                    } else {
                        ("==", host)
                    };
                    let exp = format!("http.host {op} r#\"{host}\"#");
                    match port {
                        Some(p) => format!("({exp}{AND}net.dst.port == {p})"),
                        None => exp,
                    }
                })
                .collect();
            parts.push(format!("({})", alts.join(OR)));
        }
        if let Some(g) = gen_for_field("http.path", paths.iter().copied(), |p| {
            match p.strip_prefix('~') {
                Some(re) => ("~", format!("^{}", re.replace("?<", "?P<"))),
                None => ("^=", p.to_string()),
            }
        }) {
            parts.push(g);
        }
        if let Some(headers) = route.headers.as_deref().filter(|h| !h.is_empty()) {
            let mut hs = Vec::new();
            for (name, values) in headers {
                let field = format!(
                    "any(lower(http.headers.{}))",
                    name.to_ascii_lowercase().replace('-', "_")
                );
                let alts: Vec<String> = values
                    .iter()
                    .map(|v| {
                        let (op, v) = match v.strip_prefix("~*") {
                            Some(re) => ("~", re),
                            None => ("==", v.as_str()),
                        };
                        format!("{field} {op} {}", escape_str(&v.to_lowercase()))
                    })
                    .collect();
                hs.push(format!("({})", alts.join(OR)));
            }
            parts.push(hs.join(AND));
        }
    }
    (!parts.is_empty()).then(|| parts.join(AND))
}

/// transform.lua's `split_host_port`: the port after the first `:` when it is a number.
fn kong_split_host_port(h: &str) -> (&str, Option<u16>) {
    match h.split_once(':') {
        Some((host, p)) => match p.parse::<u16>() {
            Ok(port) => (host, Some(port)),
            Err(_) => (h, None),
        },
        None => (h, None),
    }
}

/// Kong's `stream_get_priority`: a stream route's priority from its `snis`, `sources` and
/// `destinations` (bit 61 for snis, or for sources and destinations both; then per side
/// IP (bit 3), port (bit 2) and CIDR (bit 0), the sources' bits four places up).
pub fn stream_priority(route: &Route) -> u64 {
    const SNI: u64 = 1 << 61;
    let weight = |nets: &[Value]| -> u64 {
        nets.iter().fold(0, |w, n| {
            let ip = match n.get("ip").and_then(Value::as_str) {
                Some(ip) if ip.contains('/') => 1,
                Some(_) => 1 << 3,
                None => 0,
            };
            let port = if n.get("port").is_some_and(|p| !p.is_null()) {
                1 << 2
            } else {
                0
            };
            w | ip | port
        })
    };
    let (snis, srcs, dsts) = (
        route.snis.as_deref().unwrap_or_default(),
        route.sources.as_deref().unwrap_or_default(),
        route.destinations.as_deref().unwrap_or_default(),
    );
    let mut p = 0;
    if !snis.is_empty() || (!srcs.is_empty() && !dsts.is_empty()) {
        p = SNI;
    }
    p | weight(srcs) << 4 | weight(dsts)
}

/// The expressions flavor's `&& (net.protocol == ...)` for the route's protocols, `None` for
/// a route whose one protocol is https, tls or tls_passthrough (left to the redirect).
pub fn protocol_clause(route: &Route) -> Option<String> {
    let ps: Vec<&str> = route.protocols.iter().collect();
    if ps.len() == 1 && matches!(ps[0], "https" | "tls" | "tls_passthrough") {
        return None;
    }
    gen_for_field("net.protocol", ps, |p| {
        (
            "==",
            match p {
                "tls_passthrough" => "tcp",
                "grpc" => "http",
                "grpcs" => "https",
                p => p,
            }
            .to_string(),
        )
    })
}

/// Kong's `group_by_regex_or_length`: all regex paths in one group, plain paths one group per
/// length, groups in the order their first path appears.
pub fn path_groups(paths: &[String]) -> Vec<Vec<&str>> {
    let mut keys: Vec<usize> = Vec::new();
    let mut groups: Vec<Vec<&str>> = Vec::new();
    for p in paths {
        let k = if p.starts_with('~') { 0 } else { p.len() };
        match keys.iter().position(|x| *x == k) {
            Some(i) => groups[i].push(p),
            None => {
                keys.push(k);
                groups.push(vec![p]);
            }
        }
    }
    groups
}

/// The id Kong gives group `index` (1-based) of a route split by its paths:
/// UUIDv5 of `"<route id>#<index>"` in Kong's namespace.
pub fn split_id(route_id: &str, index: usize) -> uuid::Uuid {
    const NS: uuid::Uuid = uuid::uuid!("7f145bf9-0dce-4f91-98eb-debbce4b9f6b");
    uuid::Uuid::new_v5(&NS, format!("{route_id}#{index}").as_bytes())
}
