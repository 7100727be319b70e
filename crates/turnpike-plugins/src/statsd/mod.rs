//! statsd (PRIORITY 11): Kong's metrics for each request, in StatsD's line format
//! (`kong.service.<name>.request.count:1|c`), to `host:port` over UDP (or TCP with `use_tcp`),
//! as Kong's `log.lua` names them: per service (`service_identifier`, `global.unmatched` for a
//! request no service matched), per consumer (`consumer_identifier`), per workspace (this
//! gateway has one, `default`), per route. The log phase formats the request's lines and
//! queues them (one queue entry per request); a sender thread per destination sends them, one
//! datagram per line or packed up to `udp_packet_size` bytes (`crate::log_sender`), so a request
//! never waits on the network.
//!
//! With `tag_style` (dogstatsd, influxdb, librato, signalfx), as Kong 3.2+: the request's
//! sizes, count and latencies go out under their own names (`kong.request.count`) tagged with
//! the service, route, workspace, consumer, node and status; the per-consumer and per-status
//! metrics are not sent in that mode, as in Kong.
//!
//! Not here: `shdict_usage` (the metric sends nothing).

mod schema;

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::{TcpStream, ToSocketAddrs, UdpSocket};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::log::LogEntry;
use crate::log_sender::Sender;
use crate::{Handler, Identity, PluginSpec};

pub struct Statsd;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Name {
    KongLatency,
    Latency,
    RequestCount,
    RequestPerUser,
    RequestSize,
    ResponseSize,
    StatusCount,
    StatusCountPerUser,
    UniqueUsers,
    UpstreamLatency,
    StatusCountPerWorkspace,
    StatusCountPerUserPerRoute,
    ShdictUsage,
}

#[derive(Clone, Copy)]
enum ConsumerId {
    Id,
    CustomId,
    Username,
}

#[derive(Clone, Copy)]
enum ServiceId {
    Id,
    Name,
    Host,
    NameOrHost,
}

/// One configured metric, compiled: its `|type` and `|@rate` suffix written once.
struct Metric {
    name: Name,
    suffix: String,
    consumer: ConsumerId,
    service: ServiceId,
    /// The workspace tag is its name (`default`), not its id.
    workspace_name: bool,
}

/// How tags are written (Kong's `statsd_logger`).
#[derive(Clone, Copy)]
enum TagStyle {
    /// `name:value|c|#k:v,k:v`
    Dogstatsd,
    /// `name,k=v,k=v:value|c`
    Influxdb,
    /// `name#k=v,k=v:value|c`
    Librato,
    /// `name[k=v,k=v]:value|c`
    Signalfx,
}

struct Configured {
    prefix: String,
    metrics: Vec<Metric>,
    tag_style: Option<TagStyle>,
    /// The node's host name, dots as `_` (the `node` tag).
    node: String,
    /// Inclusive status ranges logged; empty: all.
    allow: Vec<(u16, u16)>,
    sender: Arc<Sender>,
}

fn consumer_id(s: &str) -> ConsumerId {
    match s {
        "consumer_id" => ConsumerId::Id,
        "username" => ConsumerId::Username,
        _ => ConsumerId::CustomId,
    }
}

fn service_id(s: &str) -> ServiceId {
    match s {
        "service_id" => ServiceId::Id,
        "service_name" => ServiceId::Name,
        "service_host" => ServiceId::Host,
        _ => ServiceId::NameOrHost,
    }
}

/// Lua's `tostring` of a number: integers without a decimal point.
pub(crate) fn number(f: f64) -> String {
    if f.fract() == 0.0 && f.abs() < 1e15 {
        format!("{}", f as i64)
    } else {
        format!("{f}")
    }
}

/// The node's host name, dots as `_` (Kong's `hostname_in_prefix`).
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().replace('.', "_"))
        .unwrap_or_else(|_| "localhost".into())
}

impl PluginSpec for Statsd {
    fn name(&self) -> &'static str {
        "statsd"
    }
    fn priority(&self) -> i32 {
        11
    }
    fn fields(&self) -> &'static [crate::schema::Field] {
        schema::FIELDS
    }
    fn entity_checks(&self, config: &Value) -> Vec<(String, String)> {
        schema::entity_checks(config)
    }
    fn build(&self, config: &Value, ctx: &crate::BuildContext) -> Result<Arc<dyn Handler>, String> {
        let c: schema::Config = crate::typed(config)?;
        let mut metrics = Vec::new();
        for m in &c.metrics {
            let name = match m.name.as_str() {
                "kong_latency" => Name::KongLatency,
                "latency" => Name::Latency,
                "request_count" => Name::RequestCount,
                "request_per_user" => Name::RequestPerUser,
                "request_size" => Name::RequestSize,
                "response_size" => Name::ResponseSize,
                "status_count" => Name::StatusCount,
                "status_count_per_user" => Name::StatusCountPerUser,
                "unique_users" => Name::UniqueUsers,
                "upstream_latency" => Name::UpstreamLatency,
                "status_count_per_workspace" => Name::StatusCountPerWorkspace,
                "status_count_per_user_per_route" => Name::StatusCountPerUserPerRoute,
                _ => Name::ShdictUsage,
            };
            let kind = match m.stat_type.as_str() {
                "gauge" => "g",
                "counter" => "c",
                "timer" => "ms",
                "histogram" => "h",
                "meter" => "m",
                _ => "s",
            };
            // Kong writes the rate for the types that take one (statsd_logger's counter and
            // gauge), and only when it is not 1.
            let rate = match (kind, m.sample_rate) {
                ("c" | "g", Some(r)) if r != 1.0 => format!("|@{}", number(r)),
                _ => String::new(),
            };
            metrics.push(Metric {
                name,
                suffix: format!("|{kind}{rate}"),
                consumer: consumer_id(
                    m.consumer_identifier
                        .as_deref()
                        .unwrap_or(&c.consumer_identifier_default),
                ),
                service: service_id(
                    m.service_identifier
                        .as_deref()
                        .unwrap_or(&c.service_identifier_default),
                ),
                workspace_name: m
                    .workspace_identifier
                    .as_deref()
                    .unwrap_or(&c.workspace_identifier_default)
                    == "workspace_name",
            });
        }
        let allow = c
            .allow_status_codes
            .iter()
            .flatten()
            .filter_map(|r| {
                let (a, b) = r.split_once('-')?;
                Some((a.parse().ok()?, b.parse().ok()?))
            })
            .collect();
        let tag_style = match c.tag_style.as_deref() {
            Some("dogstatsd") => Some(TagStyle::Dogstatsd),
            Some("influxdb") => Some(TagStyle::Influxdb),
            Some("librato") => Some(TagStyle::Librato),
            Some("signalfx") => Some(TagStyle::Signalfx),
            _ => None,
        };
        let node = hostname();
        // Kong puts the host in the prefix only without tags (it is the `node` tag then).
        let prefix = if c.hostname_in_prefix && tag_style.is_none() {
            format!("{}.node.{node}", c.prefix)
        } else {
            c.prefix.clone()
        };
        let packet = c.udp_packet_size as usize;
        let (host, port, tcp) = (c.host.clone(), c.port, c.use_tcp);
        let sender = ctx.runtime.log_senders.get(
            &ctx.runtime.spawner,
            "statsd",
            format!("statsd {}:{} tcp={} packet={}", c.host, c.port, tcp, packet),
            move |rx| send_metrics(host, port, tcp, packet, rx),
        )?;
        Ok(Arc::new(Configured {
            prefix,
            metrics,
            tag_style,
            node,
            allow,
            sender,
        }))
    }
}

impl Configured {
    fn consumer<'a>(&self, m: &Metric, who: Option<&'a Identity>) -> Option<&'a str> {
        let who = who?;
        match m.consumer {
            ConsumerId::Id => Some(who.consumer_id()).filter(|s| !s.is_empty()),
            ConsumerId::CustomId => who.custom_id(),
            ConsumerId::Username => who.username(),
        }
    }

    /// The metric's scope: `service.<identifier>` (dots as `_`), or `global.unmatched`.
    fn scope(&self, m: &Metric, e: &LogEntry<'_>) -> Option<String> {
        let s = e.service?;
        let name = match m.service {
            ServiceId::Id => Some(&*s.id),
            ServiceId::Name => s.name.as_deref(),
            ServiceId::Host => Some(&*s.host),
            ServiceId::NameOrHost => Some(s.name.as_deref().unwrap_or(&*s.host)),
        };
        Some(format!(
            "service.{}",
            name.map_or("unnamed".to_string(), |n| n.replace('.', "_"))
        ))
    }

    /// The request's tags for a metric (Kong's `get_tags`): none when the service has no such
    /// identifier (or no service matched).
    fn tags<'a>(&'a self, m: &Metric, e: &'a LogEntry<'_>) -> Option<Vec<(&'static str, String)>> {
        let s = e.service?;
        let service = match m.service {
            ServiceId::Id => Some(&*s.id),
            ServiceId::Name => s.name.as_deref(),
            ServiceId::Host => Some(&*s.host),
            ServiceId::NameOrHost => Some(s.name.as_deref().unwrap_or(&*s.host)),
        }?;
        let mut tags = vec![
            ("service", service.to_string()),
            (
                "route",
                e.route.name.clone().unwrap_or_else(|| e.route.id.clone()),
            ),
            (
                "workspace",
                if m.workspace_name {
                    "default"
                } else {
                    "00000000-0000-0000-0000-000000000000"
                }
                .to_string(),
            ),
        ];
        if let Some(c) = self.consumer(m, e.consumer) {
            tags.push(("consumer", c.to_string()));
        }
        tags.push(("node", self.node.clone()));
        tags.push(("status", e.status.to_string()));
        Some(tags)
    }

    /// The request's lines in a tag style: the sizes, count and latencies only.
    fn tagged_lines(&self, e: &LogEntry<'_>, style: TagStyle) -> String {
        let mut out = String::new();
        for m in &self.metrics {
            let (stat, value) = match m.name {
                Name::RequestCount => ("request.count", Some(1)),
                Name::Latency => ("latency", Some(e.latency_request_ms)),
                Name::KongLatency => ("kong_latency", Some(e.latency_kong_ms)),
                Name::UpstreamLatency => ("upstream_latency", e.latency_proxy_ms),
                Name::RequestSize => ("request.size", Some(e.request_size)),
                Name::ResponseSize => ("response.size", Some(e.response_size)),
                _ => continue,
            };
            let Some(value) = value else { continue };
            if !out.is_empty() {
                out.push('\n');
            }
            let (p, suffix) = (&self.prefix, &m.suffix);
            let Some(tags) = self.tags(m, e) else {
                let _ = write!(out, "{p}.{stat}:{value}{suffix}");
                continue;
            };
            let sep = if matches!(style, TagStyle::Dogstatsd) {
                ':'
            } else {
                '='
            };
            let list = tags
                .iter()
                .map(|(k, v)| format!("{k}{sep}{v}"))
                .collect::<Vec<_>>()
                .join(",");
            let _ = match style {
                TagStyle::Dogstatsd => write!(out, "{p}.{stat}:{value}{suffix}|#{list}"),
                TagStyle::Influxdb => write!(out, "{p}.{stat},{list}:{value}{suffix}"),
                TagStyle::Librato => write!(out, "{p}.{stat}#{list}:{value}{suffix}"),
                TagStyle::Signalfx => write!(out, "{p}.{stat}[{list}]:{value}{suffix}"),
            };
        }
        out
    }

    /// The request's lines, `\n`-separated.
    fn lines(&self, e: &LogEntry<'_>) -> String {
        if let Some(style) = self.tag_style {
            return self.tagged_lines(e, style);
        }
        let mut out = String::new();
        let status = e.status;
        let mut line = |stat: &str, value: &dyn std::fmt::Display, suffix: &str| {
            if !out.is_empty() {
                out.push('\n');
            }
            let _ = write!(out, "{}.{stat}:{value}{suffix}", self.prefix);
        };
        for m in &self.metrics {
            let scope = self.scope(m, e);
            let matched = scope.is_some();
            let scope = scope.as_deref().unwrap_or("global.unmatched");
            let suffix = m.suffix.as_str();
            let who = self.consumer(m, e.consumer);
            match m.name {
                Name::RequestCount => line(&format!("{scope}.request.count"), &1, suffix),
                Name::Latency => line(&format!("{scope}.latency"), &e.latency_request_ms, suffix),
                Name::KongLatency => {
                    line(&format!("{scope}.kong_latency"), &e.latency_kong_ms, suffix)
                }
                Name::UpstreamLatency => {
                    if let (true, Some(ms)) = (matched, e.latency_proxy_ms) {
                        line(&format!("{scope}.upstream_latency"), &ms, suffix)
                    }
                }
                Name::RequestSize => {
                    line(&format!("{scope}.request.size"), &e.request_size, suffix)
                }
                Name::ResponseSize => {
                    line(&format!("{scope}.response.size"), &e.response_size, suffix)
                }
                Name::StatusCount => line(&format!("{scope}.status.{status}"), &1, suffix),
                Name::UniqueUsers => {
                    if let (true, Some(id)) = (matched, who) {
                        line(&format!("{scope}.user.uniques"), &id, suffix)
                    }
                }
                Name::RequestPerUser => {
                    if let (true, Some(id)) = (matched, who) {
                        line(&format!("{scope}.user.{id}.request.count"), &1, suffix)
                    }
                }
                Name::StatusCountPerUser => {
                    if let (true, Some(id)) = (matched, who) {
                        line(&format!("{scope}.user.{id}.status.{status}"), &1, suffix)
                    }
                }
                Name::StatusCountPerWorkspace => line(
                    &format!("{scope}.workspace.default.status.{status}"),
                    &1,
                    suffix,
                ),
                Name::StatusCountPerUserPerRoute => {
                    if let (true, Some(id)) = (matched, who) {
                        line(
                            &format!("route.{}.user.{id}.status.{status}", e.route.id),
                            &1,
                            suffix,
                        )
                    }
                }
                Name::ShdictUsage => {}
            }
        }
        out
    }
}

impl Handler for Configured {
    fn phases(&self) -> crate::Phases {
        crate::Phases::LOG
    }
    fn log(&self, e: &LogEntry<'_>) {
        if !self.allow.is_empty()
            && !self
                .allow
                .iter()
                .any(|(a, b)| (*a..=*b).contains(&e.status))
        {
            return;
        }
        let lines = self.lines(e);
        if !lines.is_empty() {
            self.sender.send(lines);
        }
    }
}

/// The sender thread: each request's lines as datagrams (one per line, or packed up to
/// `packet` bytes) or over one TCP connection, `\n`-terminated.
pub(crate) fn send_metrics(
    host: String,
    port: u16,
    tcp: bool,
    packet: usize,
    rx: std::sync::mpsc::Receiver<String>,
) {
    let timeout = Duration::from_secs(1);
    let addr = || (host.as_str(), port).to_socket_addrs().ok()?.next();
    let mut udp: Option<UdpSocket> = None;
    let mut stream: Option<TcpStream> = None;
    let mut failing = false;
    let mut pending = String::new();
    while let Ok(first) = rx.recv() {
        // What else is queued goes out with it.
        let mut batch = first;
        while let Ok(more) = rx.try_recv() {
            batch.push('\n');
            batch.push_str(&more);
            if batch.len() > 1 << 16 {
                break;
            }
        }
        let result: std::io::Result<()> = if tcp {
            if stream.is_none() {
                stream = addr().and_then(|a| TcpStream::connect_timeout(&a, timeout).ok());
            }
            match stream.as_mut() {
                Some(s) => {
                    batch.push('\n');
                    s.write_all(batch.as_bytes())
                }
                None => Err(std::io::ErrorKind::NotConnected.into()),
            }
        } else {
            if udp.is_none() {
                udp = addr().and_then(|a| {
                    let s =
                        UdpSocket::bind(if a.is_ipv6() { "[::]:0" } else { "0.0.0.0:0" }).ok()?;
                    s.connect(a).ok()?;
                    Some(s)
                });
            }
            match udp.as_ref() {
                Some(s) => {
                    let mut r = Ok(());
                    for l in batch.split('\n') {
                        if packet == 0 {
                            r = r.and(s.send(l.as_bytes()).map(|_| ()));
                            continue;
                        }
                        if !pending.is_empty() && pending.len() + 1 + l.len() > packet {
                            r = r.and(s.send(pending.as_bytes()).map(|_| ()));
                            pending.clear();
                        }
                        if !pending.is_empty() {
                            pending.push('\n');
                        }
                        pending.push_str(l);
                    }
                    if !pending.is_empty() {
                        r = r.and(s.send(pending.as_bytes()).map(|_| ()));
                        pending.clear();
                    }
                    r
                }
                None => Err(std::io::ErrorKind::NotConnected.into()),
            }
        };
        match result {
            Ok(()) => failing = false,
            Err(e) => {
                if !failing {
                    tracing::error!("statsd: could not send to {host}:{port}: {e}");
                    failing = true;
                }
                udp = None;
                stream = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_print_as_lua_prints_them() {
        assert_eq!(number(1.0), "1");
        assert_eq!(number(0.25), "0.25");
    }
}
