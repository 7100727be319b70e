//! The configuration as `GET /` shows it (Kong's shape; secrets masked).

use super::*;

impl Conf {
    /// The configuration as Kong's `GET /` shows it: property names and values, no secrets.
    pub fn to_json(&self) -> serde_json::Value {
        let listen = |l: &[ListenAddr]| -> Vec<String> {
            l.iter()
                .map(|a| {
                    let mut s = a.addr.to_string();
                    if a.http2 {
                        s.push_str(" http2");
                    }
                    if a.ssl {
                        s.push_str(" ssl");
                    }
                    if a.reuseport {
                        s.push_str(" reuseport");
                    }
                    s.push_str(&format!(" backlog={}", a.backlog));
                    s
                })
                .collect()
        };
        // Kong's parsed listeners (`proxy_listeners`, ...): one object per address, each flag
        // it knows as a boolean; Kong Manager's overview reads the ports from these.
        let listeners = |l: &[ListenAddr]| -> Vec<serde_json::Value> {
            l.iter()
                .map(|a| {
                    serde_json::json!({
                        "ip": a.addr.ip().to_string(),
                        "port": a.addr.port(),
                        "ssl": a.ssl,
                        "http2": a.http2,
                        "reuseport": a.reuseport,
                        "backlog=%d+": true,
                        "proxy_protocol": a.proxy_protocol,
                        "deferred": false,
                        "bind": false,
                        "ipv6only=on": false,
                        "ipv6only=off": false,
                        "so_keepalive=on": false,
                        "so_keepalive=off": false,
                        "so_keepalive=%w*:%w*:%d*": false,
                        "listener": format!(
                            "{}{}{}{} backlog={}",
                            a.addr,
                            if a.ssl { " ssl" } else { "" },
                            if a.http2 { " http2" } else { "" },
                            if a.reuseport { " reuseport" } else { "" },
                            a.backlog
                        ),
                    })
                })
                .collect()
        };
        let mut v = serde_json::json!({
            "prefix": self.prefix.display().to_string(),
            "log_level": self.log_level,
            "proxy_access_log": self.proxy_access_log.clone().unwrap_or_else(|| "off".into()),
            "proxy_listen": listen(&self.proxy_listen),
            "admin_listen": listen(&self.admin_listen),
            "status_listen": listen(&self.status_listen),
            "debug_listen": listen(&self.debug_listen),
            "database": self.database.name(),
            "pg_host": self.pg.host,
            "pg_port": self.pg.port,
            "pg_user": self.pg.user,
            "pg_password": if self.pg.password.is_empty() { serde_json::Value::Null } else { "******".into() },
            "pg_database": self.pg.database,
            "pg_ssl": self.pg.ssl,
            "pg_ssl_verify": self.pg.ssl_verify,
            "pg_timeout": self.pg.timeout.as_millis() as u64,
            "pg_pool_size": self.pg.pool_size,
            "db_update_frequency": self.db_update_frequency.as_secs_f64(),
            "plugins": self.plugins,
            "untrusted_lua": self.untrusted_lua,
            "untrusted_lua_sandbox_requires": self.untrusted_lua_sandbox_requires,
            "untrusted_lua_sandbox_environment": self.untrusted_lua_sandbox_environment,
            "db_cache_ttl": self.db_cache_ttl.map_or(0.0, |d| d.as_secs_f64()),
            "db_cache_neg_ttl": self.db_cache_neg_ttl.map_or(0.0, |d| d.as_secs_f64()),
            "mem_cache_size": self.mem_cache_size,
            "admin_auth_token": self.admin_auth_token.as_ref().map(|_| "******"),
            "declarative_config": self.declarative_config.as_ref().map(|p| p.display().to_string()),
            "nginx_worker_processes": self.worker_processes,
            "upstream_keepalive_pool_size": self.upstream_keepalive_pool_size,
            "upstream_keepalive_max_requests": self.upstream_keepalive_max_requests,
            "upstream_keepalive_idle_timeout": self.upstream_keepalive_idle_timeout.as_secs(),
            "nginx_http_keepalive_requests": self.keepalive_requests,
            "nginx_http_keepalive_timeout": format!("{}ms", self.keepalive_timeout.as_millis()),
            "nginx_http_client_body_timeout": format!("{}ms", self.client_body_timeout.as_millis()),
            "nginx_http_client_max_body_size": self.client_max_body_size,
            "nginx_http_client_body_buffer_size": self.client_body_buffer_size,
            // Certificate paths are not secret, keys are: show that one is set, never its value.
            "ssl_cert": self.ssl_cert,
            "ssl_cert_key": self.ssl_cert_key.iter().map(|_| "******").collect::<Vec<_>>(),
            "trusted_ips": self.trusted_ips,
            "real_ip_header": self.real_ip_header,
            "router_flavor": self.router_flavor.name(),
        });
        v["pg_keepalive_timeout"] = self
            .pg
            .keepalive_timeout
            .map_or(0, |d| d.as_millis() as u64)
            .into();
        // Hybrid mode, as Kong's `remove_sensitive` shows it: the key is never shown.
        v["role"] = self.cluster.role.name().into();
        v["cluster_mtls"] = match self.cluster.mtls {
            super::ClusterMtls::Shared => "shared",
            super::ClusterMtls::Pki => "pki",
        }
        .into();
        v["cluster_control_plane"] = self.cluster.control_plane.clone().into();
        v["cluster_max_payload"] = self.cluster.max_payload.into();
        v["cluster_data_plane_purge_delay"] =
            self.cluster.data_plane_purge_delay.as_secs_f64().into();
        v["cluster_listeners"] = listeners(&self.cluster.listen).into();
        v["cluster_dp_labels"] = self
            .cluster
            .dp_labels
            .iter()
            .map(|(k, v)| format!("{k}:{v}"))
            .collect::<Vec<_>>()
            .into();
        v["cluster_cert_key"] = if self.cluster.cert_key.is_empty() {
            serde_json::Value::Null
        } else {
            "******".into()
        };
        v["lua_time_budget"] = self.lua_time_budget.map_or(0.0, |d| d.as_secs_f64()).into();
        v["proxy_listeners"] = listeners(&self.proxy_listen).into();
        v["admin_listeners"] = listeners(&self.admin_listen).into();
        v["status_listeners"] = listeners(&self.status_listen).into();
        // Apart: one json! this large passes the macro's recursion limit.
        let dns = serde_json::json!({
            "dns_resolver": self.dns.resolver.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
            "dns_hostsfile": self.dns.hostsfile.display().to_string(),
            "dns_order": self.dns.order.iter().map(|t| format!("{t:?}").to_ascii_uppercase()).collect::<Vec<_>>(),
            "dns_valid_ttl": self.dns.valid_ttl.map(|d| d.as_secs_f64()),
            "dns_stale_ttl": self.dns.stale_ttl.as_secs_f64(),
            "dns_not_found_ttl": self.dns.not_found_ttl.as_secs_f64(),
            "dns_error_ttl": self.dns.error_ttl.as_secs_f64(),
            "dns_cache_size": self.dns.cache_size,
        });
        if let (Some(all), Some(dns)) = (v.as_object_mut(), dns.as_object()) {
            all.extend(dns.clone());
        }
        v
    }
}
