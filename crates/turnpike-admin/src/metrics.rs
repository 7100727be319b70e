//! `GET /metrics` (Admin API and `status_listen`): Kong's prometheus exposition. The node-wide
//! families are read from the workers' counters when scraped; the per-request families are
//! the prometheus plugin's (recorded only where it is configured, merged from per-worker
//! shards). Families Kong lacks are named `turnpike_*`.

use std::fmt::Write;

use http::{header, HeaderValue, Response, StatusCode};
use turnpike_plugins::prometheus::metrics::escape;

use crate::{Admin, Resp};

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

impl Admin {
    pub(crate) async fn metrics(&self) -> Resp {
        let mut out = String::with_capacity(4096);
        let gw = &self.gateway;
        let node = escape(&self.node_id);
        let t = gw.stats.totals();

        family(
            &mut out,
            "kong_nginx_connections_total",
            "gauge",
            "Number of connections by subsystem",
        );
        let active = t.connections_active.max(0);
        for (state, v) in [
            ("accepted", t.connections_accepted as i64),
            ("active", active),
            ("handled", t.connections_accepted as i64),
            ("reading", 0),
            ("total", t.requests as i64),
            ("waiting", (active - t.connections_writing.max(0)).max(0)),
            ("writing", t.connections_writing.clamp(0, active)),
        ] {
            let _ = writeln!(
                out,
                "kong_nginx_connections_total{{node_id=\"{node}\",subsystem=\"http\",state=\"{state}\"}} {v}"
            );
        }
        family(
            &mut out,
            "kong_nginx_requests_total",
            "gauge",
            "Number of requests total",
        );
        let _ = writeln!(
            out,
            "kong_nginx_requests_total{{node_id=\"{node}\",subsystem=\"http\"}} {}",
            t.requests
        );
        family(
            &mut out,
            "kong_node_info",
            "gauge",
            "Kong Node metadata information",
        );
        let _ = writeln!(
            out,
            "kong_node_info{{node_id=\"{node}\",version=\"{}\"}} 1",
            turnpike_proxy::VERSION
        );
        if let Some(store) = &self.store {
            family(
                &mut out,
                "kong_datastore_reachable",
                "gauge",
                "Datastore reachable from Kong, 0 is unreachable",
            );
            let _ = writeln!(
                out,
                "kong_datastore_reachable {}",
                u8::from(store.reachable().await)
            );
        }
        self.cluster_metrics(&mut out, &node);

        let plugins = self.gateway.plugins.runtime();
        if plugins.prometheus.upstream_health_metrics() {
            family(
                &mut out,
                "kong_upstream_target_health",
                "gauge",
                "Health status of targets of upstream. States = healthchecks_off|healthy|unhealthy|dns_error, value is 1 when state is populated.",
            );
            let snap = gw.snapshot.load();
            for u in &snap.config.upstreams {
                let checks = turnpike_proxy::upstream::health::Checks::from_config(&u.healthchecks);
                for t in snap
                    .config
                    .targets
                    .iter()
                    .filter(|t| *t.upstream.id == *u.id)
                {
                    let state = if !checks.enabled() {
                        "healthchecks_off"
                    } else if gw
                        .upstreams
                        .health
                        .lookup(&u.id, &t.target)
                        .is_none_or(|h| h.healthy())
                    {
                        "healthy"
                    } else {
                        "unhealthy"
                    };
                    for s in ["healthchecks_off", "healthy", "unhealthy", "dns_error"] {
                        let _ = writeln!(
                            out,
                            "kong_upstream_target_health{{upstream=\"{}\",target=\"{}\",address=\"{}\",state=\"{s}\",subsystem=\"http\"}} {}",
                            escape(&u.name),
                            escape(&t.target),
                            escape(&t.target),
                            u8::from(s == state)
                        );
                    }
                }
            }
        }

        turnpike_plugins::prometheus::metrics::render(&plugins.prometheus, &mut out);

        // What Kong does not report: upstream connection reuse and config reloads.
        family(
            &mut out,
            "turnpike_upstream_connections_opened_total",
            "counter",
            "Upstream connections opened, per peer (host:port)",
        );
        let peers = gw.stats.peer_totals();
        let named: Vec<_> = peers
            .iter()
            .enumerate()
            .filter(|(_, p)| p.requests > 0 || p.connections_opened > 0)
            .filter_map(|(id, p)| {
                gw.upstreams
                    .peers
                    .address(id as u64)
                    .map(|(h, port)| (escape(&format!("{h}:{port}")), *p))
            })
            .collect();
        for (peer, p) in &named {
            let _ = writeln!(
                out,
                "turnpike_upstream_connections_opened_total{{peer=\"{peer}\"}} {}",
                p.connections_opened
            );
        }
        family(
            &mut out,
            "turnpike_upstream_requests_total",
            "counter",
            "Requests sent upstream, per peer (host:port)",
        );
        for (peer, p) in &named {
            let _ = writeln!(
                out,
                "turnpike_upstream_requests_total{{peer=\"{peer}\"}} {}",
                p.requests
            );
        }
        family(
            &mut out,
            "turnpike_upstream_connection_reuse_ratio",
            "gauge",
            "Share of upstream requests sent on a reused connection (1 - opened / requests)",
        );
        if t.upstream_requests > 0 {
            let _ = writeln!(
                out,
                "turnpike_upstream_connection_reuse_ratio {}",
                1.0 - t.upstream_connections_opened.min(t.upstream_requests) as f64
                    / t.upstream_requests as f64
            );
        }
        use std::sync::atomic::Ordering::Relaxed;
        family(
            &mut out,
            "turnpike_log_entries_dropped_total",
            "counter",
            "Log entries a logging plugin dropped (queue full, or not delivered within max_retry_time)",
        );
        for (plugin, n) in [
            ("file-log", &*plugins.file_log.dropped),
            ("http-log", &plugins.http_log.tally.dropped),
        ] {
            let _ = writeln!(
                out,
                "turnpike_log_entries_dropped_total{{plugin=\"{plugin}\"}} {}",
                n.load(Relaxed)
            );
        }
        family(
            &mut out,
            "turnpike_log_entries_sent_total",
            "counter",
            "Log entries http-log delivered",
        );
        let _ = writeln!(
            out,
            "turnpike_log_entries_sent_total{{plugin=\"http-log\"}} {}",
            plugins.http_log.tally.sent.load(Relaxed)
        );
        family(
            &mut out,
            "turnpike_config_reloads_total",
            "counter",
            "Configurations applied (compiled and swapped in)",
        );
        let _ = writeln!(
            out,
            "turnpike_config_reloads_total {}",
            gw.reloads.load(Relaxed)
        );
        family(
            &mut out,
            "turnpike_config_problems",
            "gauge",
            "Entities of the applied configuration that could not be built (left out or failing closed)",
        );
        let _ = writeln!(
            out,
            "turnpike_config_problems {}",
            gw.snapshot.load().problems.len()
        );
        family(
            &mut out,
            "turnpike_config_reload_duration_seconds",
            "summary",
            "Time spent compiling and swapping in configurations",
        );
        let _ = writeln!(
            out,
            "turnpike_config_reload_duration_seconds_sum {}\nturnpike_config_reload_duration_seconds_count {}",
            gw.reload_micros_total.load(Relaxed) as f64 / 1e6,
            gw.reloads.load(Relaxed)
        );
        family(
            &mut out,
            "turnpike_config_last_reload_duration_seconds",
            "gauge",
            "Time the last configuration took to compile and swap in",
        );
        let _ = writeln!(
            out,
            "turnpike_config_last_reload_duration_seconds {}",
            gw.reload_micros_last.load(Relaxed) as f64 / 1e6
        );

        let mut r = Response::new(crate::full(out));
        *r.status_mut() = StatusCode::OK;
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        );
        r
    }
}

impl Admin {
    /// Hybrid mode's families (Kong's prometheus exporter): on a control plane, each data
    /// plane's last contact, config hash (as a number, as Kong converts it) and version
    /// compatibility; on a data plane, its cluster certificate's expiry. A node outside a
    /// cluster reports its own config hash as a data plane's.
    fn cluster_metrics(&self, out: &mut String, node: &str) {
        let hash_number = |h: &str| u128::from_str_radix(h, 16).map_or(0.0, |n| n as f64);
        match &self.cluster {
            turnpike_cluster::Node::ControlPlane(cp) => {
                let dps = cp.data_planes();
                let labels = |d: &turnpike_cluster::cp::DataPlaneRecord| {
                    format!(
                        "node_id=\"{}\",hostname=\"{}\",ip=\"{}\"",
                        escape(&d.id),
                        escape(d.hostname.as_deref().unwrap_or("")),
                        escape(&d.ip)
                    )
                };
                family(
                    out,
                    "kong_data_plane_last_seen",
                    "gauge",
                    "Last time data plane contacted control plane",
                );
                for d in &dps {
                    let _ = writeln!(
                        out,
                        "kong_data_plane_last_seen{{{}}} {}",
                        labels(d),
                        d.last_seen
                    );
                }
                family(
                    out,
                    "kong_data_plane_config_hash",
                    "gauge",
                    "Config hash numeric value of the data plane",
                );
                for d in &dps {
                    let _ = writeln!(
                        out,
                        "kong_data_plane_config_hash{{{}}} {:e}",
                        labels(d),
                        hash_number(&d.config_hash)
                    );
                }
                family(
                    out,
                    "kong_data_plane_version_compatible",
                    "gauge",
                    "Version compatible status of the data plane, 0 is incompatible",
                );
                for d in &dps {
                    use turnpike_cluster::compat::SyncStatus;
                    let compatible = !matches!(
                        d.sync_status,
                        SyncStatus::KongVersionIncompatible
                            | SyncStatus::PluginSetIncompatible
                            | SyncStatus::PluginVersionIncompatible
                    );
                    let _ = writeln!(
                        out,
                        "kong_data_plane_version_compatible{{{},kong_version=\"{}\"}} {}",
                        labels(d),
                        escape(&d.version),
                        u8::from(compatible)
                    );
                }
            }
            other => {
                if let turnpike_cluster::Node::DataPlane(dp) = other {
                    if let Some(expiry) = dp.cert_expiry() {
                        family(
                            out,
                            "kong_data_plane_cluster_cert_expiry_timestamp",
                            "gauge",
                            "Unix timestamp of Data Plane's cluster_cert expiry time",
                        );
                        let _ = writeln!(
                            out,
                            "kong_data_plane_cluster_cert_expiry_timestamp {expiry}"
                        );
                    }
                }
                family(
                    out,
                    "kong_data_plane_config_hash",
                    "gauge",
                    "Config hash numeric value of the data plane",
                );
                let _ = writeln!(
                    out,
                    "kong_data_plane_config_hash{{node_id=\"{node}\",hostname=\"{}\",ip=\"\"}} {:e}",
                    escape(&self.hostname),
                    hash_number(&self.gateway.config_hash())
                );
            }
        }
    }
}
