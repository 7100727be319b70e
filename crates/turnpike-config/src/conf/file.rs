//! kong.conf files: defaults, aliases, and the `name = value` text.

use super::*;

/// Properties Turnpike implements, with their defaults (as text, parsed like file values).
pub(super) const DEFAULTS: &[(&str, &str)] = &[
    ("prefix", "/usr/local/turnpike"),
    ("log_level", "notice"),
    ("proxy_access_log", "off"),
    (
        "proxy_listen",
        "0.0.0.0:8000 reuseport backlog=16384, 0.0.0.0:8443 http2 ssl reuseport backlog=16384",
    ),
    // Kong's stream (TCP) listeners: off unless asked for.
    ("stream_listen", "off"),
    ("admin_listen", "127.0.0.1:8001 reuseport backlog=16384"),
    // Kong 3 listens on 127.0.0.1:8007 by default; off here unless asked for, so that
    // several nodes on one host do not collide.
    ("status_listen", "off"),
    // Serves /debug/profile (CPU flame graphs); off unless set.
    ("debug_listen", "off"),
    ("admin_gui_listen", "0.0.0.0:8002"),
    ("admin_gui_url", ""),
    ("admin_gui_path", "/"),
    ("admin_gui_api_url", ""),
    ("admin_gui_dir", ""),
    ("database", "sqlite"),
    ("pg_host", "127.0.0.1"),
    ("pg_port", "5432"),
    ("pg_timeout", "5000"),
    ("pg_user", "kong"),
    ("pg_password", ""),
    ("pg_database", "kong"),
    ("pg_ssl", "off"),
    ("pg_ssl_verify", "off"),
    ("pg_pool_size", "10"),
    // Kong's default: `lua_socket_keepalive_timeout`.
    ("pg_keepalive_timeout", "60000"),
    ("db_update_frequency", "5"),
    // Turnpike's own: how often expired rows (`ttl`: oauth2 tokens and codes, key-auth keys)
    // are deleted from the store, in batches (Kong runs this every 60 s).
    ("ttl_cleanup_interval", "60"),
    // Turnpike's own: the local syslog socket the syslog plugin writes to.
    ("syslog_socket", "/dev/log"),
    ("plugins", "bundled"),
    ("pluginserver_names", ""),
    ("untrusted_lua", "sandbox"),
    ("untrusted_lua_sandbox_requires", ""),
    ("untrusted_lua_sandbox_environment", ""),
    ("lua_package_path", "./?.lua;./?/init.lua;"),
    ("db_cache_ttl", "0"),
    ("db_cache_neg_ttl", ""),
    ("mem_cache_size", "128m"),
    // Kong's tracing: which spans are made (`off`: none; opentelemetry then only propagates)
    // and the share of traces sampled.
    ("tracing_instrumentations", "off"),
    ("tracing_sampling_rate", "0.01"),
    // Shared dictionaries beyond Kong's own (`lua_shared_dict`, "name size", several separated
    // by `;`): proxy-cache's `memory.dictionary_name` may name one.
    ("nginx_http_lua_shared_dict", ""),
    ("admin_auth_token", ""),
    ("key_auth_hash_keys", "off"),
    // Turnpike's own: how long one call into an operator's Lua may run before it is stopped
    // (seconds; 0: no bound, and LuaJIT's compiler on).
    ("lua_time_budget", "2"),
    ("declarative_config", ""),
    ("nginx_worker_processes", "auto"),
    ("upstream_keepalive_pool_size", "512"),
    ("upstream_keepalive_max_requests", "10000"),
    ("upstream_keepalive_idle_timeout", "60"),
    // Response compression (`conf/gzip.rs`): empty means nginx's default.
    ("nginx_proxy_gzip", ""),
    ("nginx_proxy_gzip_types", ""),
    ("nginx_proxy_gzip_min_length", ""),
    ("nginx_proxy_gzip_comp_level", ""),
    ("nginx_proxy_gzip_vary", ""),
    ("nginx_proxy_gzip_proxied", ""),
    ("nginx_proxy_gzip_http_version", ""),
    ("nginx_http_gzip", ""),
    ("nginx_http_gzip_types", ""),
    ("nginx_http_gzip_min_length", ""),
    ("nginx_http_gzip_comp_level", ""),
    ("nginx_http_gzip_vary", ""),
    ("nginx_http_gzip_proxied", ""),
    ("nginx_http_gzip_http_version", ""),
    ("nginx_http_keepalive_requests", "10000"),
    ("nginx_http_keepalive_timeout", "60s"),
    ("nginx_http_client_body_timeout", "60s"),
    ("nginx_http_client_max_body_size", "0"),
    ("nginx_http_client_body_buffer_size", "8k"),
    ("ssl_cert", ""),
    ("ssl_cert_key", ""),
    ("ssl_cipher_suite", "intermediate"),
    ("ssl_protocols", "TLSv1.2 TLSv1.3"),
    ("ssl_ciphers", ""),
    ("ssl_prefer_server_ciphers", "on"),
    ("ssl_session_tickets", "on"),
    ("ssl_session_cache_size", "10m"),
    (
        "headers",
        "server_tokens, latency_tokens, X-Kong-Request-Id",
    ),
    ("headers_upstream", "X-Kong-Request-Id"),
    ("trusted_ips", ""),
    ("real_ip_header", "X-Real-IP"),
    ("nginx_proxy_real_ip_header", ""),
    ("nginx_http_large_client_header_buffers", "4 8k"),
    ("router_flavor", "traditional_compatible"),
    // Hybrid mode (`conf/cluster.rs`), with Kong's defaults.
    ("role", "traditional"),
    ("cluster_listen", "0.0.0.0:8005"),
    ("cluster_control_plane", "127.0.0.1:8005"),
    ("cluster_cert", ""),
    ("cluster_cert_key", ""),
    ("cluster_ca_cert", ""),
    ("cluster_mtls", "shared"),
    ("cluster_server_name", ""),
    ("cluster_max_payload", "16777216"),
    ("cluster_data_plane_purge_delay", "1209600"),
    ("cluster_dp_labels", ""),
    ("cluster_use_proxy", "off"),
    ("proxy_server", ""),
    ("dns_resolver", ""),
    ("dns_hostsfile", "/etc/hosts"),
    ("dns_order", "LAST,SRV,A,CNAME"),
    ("dns_valid_ttl", ""),
    ("dns_stale_ttl", "3600"),
    ("dns_not_found_ttl", "30"),
    ("dns_error_ttl", "1"),
    ("dns_cache_size", "10000"),
    // Look-ups of one name are always shared; `on` is accepted for Kong's sake.
    ("dns_no_sync", "off"),
];

/// Aliases: Turnpike's shorter names for Kong's nginx_* properties.
pub(super) const ALIASES: &[(&str, &str)] = &[
    ("worker_processes", "nginx_worker_processes"),
    ("keepalive_requests", "nginx_http_keepalive_requests"),
    ("keepalive_timeout", "nginx_http_keepalive_timeout"),
    ("client_body_timeout", "nginx_http_client_body_timeout"),
    ("client_max_body_size", "nginx_http_client_max_body_size"),
    (
        "client_body_buffer_size",
        "nginx_http_client_body_buffer_size",
    ),
];

pub(super) fn canonical(name: &str) -> &str {
    ALIASES
        .iter()
        .find(|(alias, _)| *alias == name)
        .map(|(_, real)| *real)
        .unwrap_or(name)
}

/// Parses the text of a kong.conf-style file into (name, value) pairs.
pub fn parse_conf_text(text: &str) -> Result<Vec<(String, String)>, ConfError> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        // A `#` starts a comment unless escaped as `\#` (Kong's rule).
        let mut line = String::with_capacity(raw.len());
        let mut chars = raw.chars().peekable();
        while let Some(c) = chars.next() {
            if c == '\\' && chars.peek() == Some(&'#') {
                line.push('#');
                chars.next();
            } else if c == '#' {
                break;
            } else {
                line.push(c);
            }
        }
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            return Err(ConfError::Invalid(format!(
                "line {}: expected 'name = value', got '{}'",
                i + 1,
                line
            )));
        };
        let k = k.trim().to_ascii_lowercase();
        if k.is_empty() {
            return Err(ConfError::Invalid(format!(
                "line {}: missing property name",
                i + 1
            )));
        }
        out.push((k, v.trim().to_string()));
    }
    Ok(out)
}
