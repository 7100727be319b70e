//! The node configuration: a kong.conf-style file (`key = value`, `#` comments), overridden by
//! `TURNPIKE_<NAME>` and `KONG_<NAME>` environment variables, with Kong's property names and
//! defaults wherever the meaning is the same.
//!
//! Precedence (highest first): `TURNPIKE_<NAME>`, `KONG_<NAME>`, the file, the default.

use std::collections::BTreeMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

use crate::kong_properties::KONG_PROPERTIES;

mod cluster;
mod dns;
mod file;
mod gzip;
mod json;
mod tls;
mod values;

pub use cluster::{ClusterConf, ClusterMtls, Role};
use dns::dns_conf;
pub use dns::*;
pub use file::*;
use file::{canonical, DEFAULTS};
pub use gzip::{GzipConf, Proxied};
pub use tls::TlsConf;
pub use values::*;
use values::{parse_header_buffers, parse_headers, parse_num, split_list};

/// Default listen backlog; clamped to `net.core.somaxconn` at bind time.
pub const DEFAULT_BACKLOG: u32 = 16384;

#[derive(Debug, thiserror::Error)]
pub enum ConfError {
    #[error("{0}")]
    Io(String),
    #[error("{0}")]
    Invalid(String),
}

/// One address of `proxy_listen` / `admin_listen` with its flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenAddr {
    pub addr: SocketAddr,
    pub ssl: bool,
    pub http2: bool,
    pub reuseport: bool,
    pub backlog: u32,
    /// A `stream_listen` address: raw TCP proxied by the stream routes, not HTTP.
    pub stream: bool,
    /// A `stream_listen ... udp` address: datagrams, by client address sessions.
    pub udp: bool,
    /// `proxy_protocol`: every connection starts with a PROXY protocol header (v1 or v2, as
    /// nginx reads them), which names the client a load balancer in front accepted.
    pub proxy_protocol: bool,
}

/// Which Kong headers to add to responses (`headers`) and to upstream requests (`headers_upstream`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HeaderSet {
    pub server: bool,
    pub via: bool,
    pub proxy_latency: bool,
    pub response_latency: bool,
    pub upstream_latency: bool,
    pub admin_latency: bool,
    pub upstream_status: bool,
    pub request_id: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Database {
    /// DB-less: entities come from `declarative_config` or `POST /config`.
    Off,
    /// The embedded default: one SQLite file under the prefix.
    Sqlite,
    /// PostgreSQL shared by many nodes (Kong's `pg_*` properties).
    Postgres,
}

impl Database {
    pub fn name(self) -> &'static str {
        match self {
            Database::Off => "off",
            Database::Sqlite => "sqlite",
            Database::Postgres => "postgres",
        }
    }
}

/// Kong's `pg_*` connection properties.
#[derive(Clone)]
pub struct PgConf {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: String,
    pub database: String,
    pub ssl: bool,
    pub ssl_verify: bool,
    pub timeout: Duration,
    pub pool_size: u32,
    /// How long a pooled connection may sit idle before it is closed; `None`: no limit
    /// (`pg_keepalive_timeout = 0`).
    pub keepalive_timeout: Option<Duration>,
}

impl std::fmt::Debug for PgConf {
    // Never print the password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgConf")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("user", &self.user)
            .field("database", &self.database)
            .finish()
    }
}

/// Percent-encodes everything but RFC 3986's unreserved characters (for URL components).
pub fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

impl PgConf {
    /// A `postgres://` URL for the driver (carries the password: never log it).
    pub fn url(&self) -> String {
        let enc = percent_encode;
        let sslmode = match (self.ssl, self.ssl_verify) {
            (false, _) => "disable",
            (true, false) => "require",
            (true, true) => "verify-full",
        };
        format!(
            // No `connect_timeout`: the driver ignores it with a warning per connection; the
            // pool's acquire timeout (`pg_timeout`) bounds a connect.
            "postgres://{}:{}@{}:{}/{}?sslmode={sslmode}",
            enc(&self.user),
            enc(&self.password),
            if self.host.contains(':') {
                format!("[{}]", self.host)
            } else {
                self.host.clone()
            },
            self.port,
            enc(&self.database),
        )
    }
}

#[derive(Debug, Clone)]
pub struct Conf {
    pub prefix: PathBuf,
    pub log_level: String,
    pub proxy_access_log: Option<String>,
    pub proxy_listen: Vec<ListenAddr>,
    /// Kong's `stream_listen` (default off).
    pub stream_listen: Vec<ListenAddr>,
    pub admin_listen: Vec<ListenAddr>,
    /// Kong's Status API: `/status`, `/status/ready` and `/metrics`, read-only.
    pub status_listen: Vec<ListenAddr>,
    /// `GET /debug/profile?seconds=N` (a CPU flame graph), `/status` and `/metrics`.
    pub debug_listen: Vec<ListenAddr>,
    /// Kong Manager: where it is served (only when `admin_gui_dir` names a build of it).
    pub admin_gui_listen: Vec<ListenAddr>,
    /// Kong's `admin_gui_url`: the origin(s) Kong Manager is loaded from (CORS on the Admin
    /// API allows them; `*` when unset).
    pub admin_gui_url: Vec<String>,
    /// Kong's `admin_gui_path`: the path prefix Kong Manager is served under.
    pub admin_gui_path: String,
    /// Kong's `admin_gui_api_url`: the Admin API URL Kong Manager calls (default: the page's
    /// host and the admin port).
    pub admin_gui_api_url: Option<String>,
    /// Turnpike's own: the folder of a Kong Manager build to serve (we do not ship Kong's
    /// files; `../shared/tools/kong-manager/build.sh` makes one). Empty: no GUI listener.
    pub admin_gui_dir: Option<PathBuf>,
    pub database: Database,
    pub pg: PgConf,
    /// How often a node polls the store's config version (Kong's `db_update_frequency`); with
    /// PostgreSQL, LISTEN/NOTIFY normally brings changes long before that.
    pub db_update_frequency: Duration,
    /// How often expired rows are purged from the store (`ttl_cleanup_interval`).
    pub ttl_cleanup_interval: Duration,
    /// The local syslog socket (`syslog_socket`).
    pub syslog_socket: PathBuf,
    /// Which plugins this node loads (Kong's `plugins`: `bundled`, names, or `off`).
    pub plugins: Vec<String>,
    /// What Lua code in plugin configs (pre-function, post-function) may do: `sandbox`, `on`
    /// or `off` (Kong's `untrusted_lua`).
    pub untrusted_lua: String,
    /// Modules sandboxed code may `require` (`untrusted_lua_sandbox_requires`).
    pub untrusted_lua_sandbox_requires: Vec<String>,
    /// Globals added to the sandbox (`untrusted_lua_sandbox_environment`).
    pub untrusted_lua_sandbox_environment: Vec<String>,
    /// Where custom Lua plugins and the modules they require are found (Kong's
    /// `lua_package_path`, Lua's `package.path` syntax).
    pub lua_package_path: String,
    /// External plugin servers (Kong's `pluginserver_names` and the `pluginserver_<name>_*`
    /// properties), in the order named.
    pub pluginservers: Vec<PluginServerConf>,
    /// How long cached credentials and misses live (`None`: until they change).
    pub db_cache_ttl: Option<Duration>,
    pub db_cache_neg_ttl: Option<Duration>,
    /// Bound on the credential cache, in bytes (Kong's `mem_cache_size`).
    pub mem_cache_size: u64,
    /// Shared dictionaries by name, with their sizes in bytes (Kong's `lua_shared_dict`s and
    /// `nginx_http_lua_shared_dict`).
    pub shared_dicts: Vec<(String, u64)>,
    /// Kong's `tracing_instrumentations` (which spans are made; `off` by default).
    pub tracing_instrumentations: Vec<String>,
    /// Kong's `tracing_sampling_rate`.
    pub tracing_sampling_rate: f64,
    /// Bearer token the Admin API requires when set (mandatory on a non-loopback admin_listen).
    pub admin_auth_token: Option<String>,
    /// Turnpike's own: store key-auth keys as SHA-256 digests (Kong stores them as written).
    pub key_auth_hash_keys: bool,
    /// Turnpike's own `lua_time_budget`: how long one call into Lua (a plugin's phase, a
    /// timer) may run before it is stopped; `None` (0): no bound, the JIT compiler on.
    pub lua_time_budget: Option<Duration>,
    pub declarative_config: Option<PathBuf>,
    pub worker_processes: usize,
    pub upstream_keepalive_pool_size: usize,
    pub upstream_keepalive_max_requests: u64,
    pub upstream_keepalive_idle_timeout: Duration,
    pub keepalive_requests: u64,
    pub keepalive_timeout: Duration,
    /// nginx's client_body_timeout: the longest wait between two reads of a request body.
    pub client_body_timeout: Duration,
    /// nginx's client_max_body_size: the largest request body (0: no limit); larger gets 413.
    pub client_max_body_size: u64,
    /// nginx's client_body_buffer_size: a buffered request body (a route's
    /// `request_buffering`) is held in memory up to this size, in a temporary file beyond.
    pub client_body_buffer_size: usize,
    pub ssl_cert: Vec<String>,
    pub ssl_cert_key: Vec<String>,
    pub headers: HeaderSet,
    pub headers_upstream_request_id: bool,
    pub trusted_ips: Vec<String>,
    pub real_ip_header: String,
    /// Maximum size of the request line plus headers (nginx's large_client_header_buffers
    /// count x size); above it the client gets 431.
    pub max_header_size: usize,
    /// Kong's `router_flavor`: which route fields exist and how routes are ordered.
    pub router_flavor: crate::atc::RouterFlavor,
    /// How upstream host names are resolved (Kong's `dns_*` properties).
    pub dns: DnsConf,
    /// What the proxy's TLS listeners serve (Kong's `ssl_*` properties).
    pub tls: TlsConf,
    /// Response compression (`nginx_proxy_gzip`); `None`: off.
    pub gzip: Option<GzipConf>,
    /// Hybrid mode: the node's role and its clustering properties.
    pub cluster: ClusterConf,
    /// Where each value came from, for `GET /` and for start-up logging.
    pub sources: BTreeMap<String, String>,
}

/// One external plugin server, as Kong's conf loader reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginServerConf {
    /// The name as listed, lowercased.
    pub name: String,
    /// `pluginserver_<name>_socket`; `<prefix>/<name>.socket` by default.
    pub socket: PathBuf,
    /// `pluginserver_<name>_start_cmd`; `/usr/local/bin/<name>` when that exists. `None`: the
    /// server is managed outside the gateway.
    pub start_command: Option<String>,
    /// `pluginserver_<name>_query_cmd`; `/usr/local/bin/<name> -dump` when that exists.
    pub query_command: String,
}

/// Where Kong looks for a plugin server's binary when its commands are not set.
const DEFAULT_PLUGINSERVER_PATH: &str = "/usr/local/bin";

/// Kong's reading of `pluginserver_names` (conf_loader's "parse and validate pluginserver
/// directives"): a name's properties use `_` for `-`, and a server with no query command
/// is an error.
fn plugin_servers<'a>(
    names: &[String],
    get: &impl Fn(&str) -> &'a str,
    prefix: &std::path::Path,
    warnings: &mut Vec<String>,
) -> Result<Vec<PluginServerConf>, ConfError> {
    let mut out = Vec::new();
    for name in names {
        let name = name.to_lowercase();
        let key = format!("pluginserver_{}", name.replace('-', "_"));
        let set = |suffix: &str| {
            let v = get(&format!("{key}_{suffix}")).trim();
            (!v.is_empty()).then(|| v.to_string())
        };
        let default_path = std::path::Path::new(DEFAULT_PLUGINSERVER_PATH).join(&name);
        let default_path = default_path
            .exists()
            .then(|| default_path.display().to_string());
        let start_command = set("start_cmd").or_else(|| default_path.clone());
        let query_command = set("query_cmd")
            .or_else(|| default_path.map(|p| format!("{p} -dump")))
            .ok_or_else(|| {
                ConfError::Invalid(format!("query_command undefined for pluginserver {name}"))
            })?;
        if start_command.is_none() {
            warnings.push(format!(
                "start_command undefined for pluginserver {name}; assuming external process management"
            ));
        }
        let socket = set("socket")
            .map(PathBuf::from)
            .unwrap_or_else(|| prefix.join(format!("{name}.socket")));
        out.push(PluginServerConf {
            name,
            socket,
            start_command,
            query_command,
        });
    }
    Ok(out)
}

fn invalid(name: &str, msg: String) -> ConfError {
    ConfError::Invalid(format!("{name}: {msg}"))
}

impl Conf {
    /// Loads the configuration: defaults, then the file (if any), then the environment.
    /// `warnings` receives messages for Kong properties that are accepted but not implemented.
    pub fn load(
        file: Option<&std::path::Path>,
        env: &[(String, String)],
        warnings: &mut Vec<String>,
    ) -> Result<Conf, ConfError> {
        let mut values: BTreeMap<String, (String, String)> = DEFAULTS
            .iter()
            .map(|(k, v)| (k.to_string(), (v.to_string(), "default".to_string())))
            .collect();

        let mut set = |name: &str, value: String, source: String, warnings: &mut Vec<String>| {
            let name = canonical(name);
            // `pluginserver_<name>_socket`, `_start_cmd`, `_query_cmd`: one set per name in
            // `pluginserver_names`, read below.
            if DEFAULTS.iter().any(|(k, _)| *k == name) || name.starts_with("pluginserver_") {
                values.insert(name.to_string(), (value, source));
                Ok(())
            } else if KONG_PROPERTIES.contains(&name) || name.starts_with("nginx_") {
                warnings.push(format!(
                    "property '{name}' ({source}) is a Kong property Turnpike does not implement; ignored"
                ));
                Ok(())
            } else {
                Err(ConfError::Invalid(format!(
                    "unknown property '{name}' ({source})"
                )))
            }
        };

        if let Some(path) = file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| ConfError::Io(format!("cannot read {}: {e}", path.display())))?;
            for (k, v) in parse_conf_text(&text)? {
                set(&k, v, format!("file {}", path.display()), warnings)?;
            }
        }
        // KONG_ first, then TURNPIKE_ so that ours wins when both are set. Variables with
        // either prefix that name no property (KONG_VERSION in Kong's images, a script's own
        // TURNPIKE_SETUP_BENCH) are not ours to judge: Kong ignores them, and so does a node,
        // with one warning naming them. A typo in the file stays an error.
        let mut ignored = Vec::new();
        for prefix in ["KONG_", "TURNPIKE_"] {
            for (k, v) in env {
                if let Some(name) = k.strip_prefix(prefix) {
                    let name = name.to_ascii_lowercase();
                    let known = DEFAULTS.iter().any(|(d, _)| *d == canonical(&name))
                        || KONG_PROPERTIES.contains(&canonical(&name))
                        || name.starts_with("nginx_")
                        || name.starts_with("pluginserver_");
                    if !known {
                        ignored.push(k.clone());
                        continue;
                    }
                    set(&name, v.clone(), format!("env {k}"), warnings)?;
                }
            }
        }
        if !ignored.is_empty() {
            warnings.push(format!(
                "environment variables that name no property, ignored: {}",
                ignored.join(", ")
            ));
        }

        let get = |name: &str| values.get(name).map(|(v, _)| v.as_str()).unwrap_or("");

        let prefix = PathBuf::from(get("prefix"));
        if prefix.as_os_str().is_empty() {
            return Err(invalid("prefix", "must not be empty".into()));
        }
        let log_level = get("log_level").to_ascii_lowercase();
        const LEVELS: &[&str] = &[
            "debug", "info", "notice", "warn", "error", "crit", "alert", "emerg",
        ];
        if !LEVELS.contains(&log_level.as_str()) {
            return Err(invalid(
                "log_level",
                format!("must be one of: {}", LEVELS.join(", ")),
            ));
        }
        let proxy_access_log = match get("proxy_access_log") {
            "off" | "" => None,
            other => Some(other.to_string()),
        };
        let proxy_listen = parse_listen("proxy_listen", get("proxy_listen"))?;
        // A control plane may proxy nothing (Kong's `proxy_listen = off` on a control plane).
        if proxy_listen.is_empty() && get("role").trim() != "control_plane" {
            return Err(invalid(
                "proxy_listen",
                "must list at least one address".into(),
            ));
        }
        // Kong's stream listeners: TCP, TLS with `ssl`, UDP with `udp`.
        let mut stream_listen = parse_listen("stream_listen", get("stream_listen"))?;
        for l in &mut stream_listen {
            if l.udp && l.ssl {
                return Err(invalid(
                    "stream_listen",
                    format!("{}: 'ssl' cannot be set on a 'udp' listener", l.addr),
                ));
            }
            if l.http2 {
                return Err(invalid(
                    "stream_listen",
                    format!("{}: unknown listen flag 'http2'", l.addr),
                ));
            }
            l.stream = true;
        }
        let admin_listen = parse_listen("admin_listen", get("admin_listen"))?;
        let status_listen = parse_listen("status_listen", get("status_listen"))?;
        let debug_listen = parse_listen("debug_listen", get("debug_listen"))?;
        let admin_gui_listen = parse_listen("admin_gui_listen", get("admin_gui_listen"))?;
        if admin_gui_listen.iter().any(|l| l.ssl) {
            return Err(invalid(
                "admin_gui_listen",
                "ssl is not supported for Kong Manager's listener; put TLS in front of it".into(),
            ));
        }
        let admin_gui_path = {
            let p = get("admin_gui_path").trim();
            if !p.starts_with('/') || p.contains("..") || p.contains("//") {
                return Err(invalid(
                    "admin_gui_path",
                    "must start with '/' and be a plain path".into(),
                ));
            }
            p.trim_end_matches('/').to_string()
        };
        let admin_gui_url: Vec<String> = get("admin_gui_url")
            .split(',')
            .map(|u| u.trim().trim_end_matches('/').to_string())
            .filter(|u| !u.is_empty())
            .collect();
        let admin_gui_api_url =
            Some(get("admin_gui_api_url").trim().to_string()).filter(|u| !u.is_empty());
        let admin_gui_dir = Some(get("admin_gui_dir").trim())
            .filter(|d| !d.is_empty())
            .map(PathBuf::from);
        let database = match get("database") {
            "off" => Database::Off,
            "sqlite" => Database::Sqlite,
            "postgres" => Database::Postgres,
            other => {
                return Err(invalid(
                    "database",
                    format!("'{other}' must be one of: sqlite, postgres, off"),
                ))
            }
        };
        let on_off = |name: &str| -> Result<bool, ConfError> {
            match get(name) {
                "on" => Ok(true),
                "off" => Ok(false),
                other => Err(invalid(name, format!("'{other}' must be 'on' or 'off'"))),
            }
        };
        let pg = PgConf {
            host: get("pg_host").to_string(),
            port: parse_num::<u16>(get("pg_port"))
                .filter(|p| *p > 0)
                .ok_or_else(|| invalid("pg_port", "must be a port number".into()))?,
            user: get("pg_user").to_string(),
            password: get("pg_password").to_string(),
            database: get("pg_database").to_string(),
            ssl: on_off("pg_ssl")?,
            ssl_verify: on_off("pg_ssl_verify")?,
            timeout: parse_num::<u64>(get("pg_timeout"))
                .filter(|t| *t > 0)
                .map(Duration::from_millis)
                .ok_or_else(|| invalid("pg_timeout", "must be a positive integer (ms)".into()))?,
            pool_size: parse_num::<u32>(get("pg_pool_size"))
                .filter(|n| (1..=1000).contains(n))
                .ok_or_else(|| invalid("pg_pool_size", "must be an integer in 1..1000".into()))?,
            keepalive_timeout: parse_num::<u64>(get("pg_keepalive_timeout"))
                .map(|ms| (ms > 0).then(|| Duration::from_millis(ms)))
                .ok_or_else(|| {
                    invalid(
                        "pg_keepalive_timeout",
                        "must be a non-negative integer (ms; 0: no limit)".into(),
                    )
                })?,
        };
        let db_update_frequency = get("db_update_frequency")
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|f| *f > 0.0 && *f <= 86400.0)
            .map(Duration::from_secs_f64)
            .ok_or_else(|| {
                invalid(
                    "db_update_frequency",
                    "must be a positive number of seconds".into(),
                )
            })?;
        let ttl_cleanup_interval = get("ttl_cleanup_interval")
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|f| *f > 0.0 && *f <= 86400.0)
            .map(Duration::from_secs_f64)
            .ok_or_else(|| {
                invalid(
                    "ttl_cleanup_interval",
                    "must be a positive number of seconds".into(),
                )
            })?;
        // Kong's `plugins`: `bundled`, plugin names, or `off`; which names exist is the plugin
        // registry's to check.
        let plugins: Vec<String> = get("plugins")
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect();
        if plugins.iter().any(|p| p == "off") && plugins.len() > 1 {
            return Err(invalid(
                "plugins",
                "'off' cannot be combined with other values".into(),
            ));
        }
        let untrusted_lua = get("untrusted_lua").trim().to_string();
        if !["on", "off", "sandbox"].contains(&untrusted_lua.as_str()) {
            return Err(invalid(
                "untrusted_lua",
                "must be one of: on, off, sandbox".into(),
            ));
        }
        let list = |name: &str| -> Vec<String> {
            get(name)
                .split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect()
        };
        let untrusted_lua_sandbox_requires = list("untrusted_lua_sandbox_requires");
        let untrusted_lua_sandbox_environment = list("untrusted_lua_sandbox_environment");
        let lua_package_path = get("lua_package_path").trim().to_string();
        let pluginservers = plugin_servers(&list("pluginserver_names"), &get, &prefix, warnings)?;
        // Kong's tracing properties (the opentelemetry plugin reads them).
        const INSTRUMENTATIONS: &[&str] = &[
            "off",
            "all",
            "request",
            "db_query",
            "dns_query",
            "router",
            "http_client",
            "balancer",
            "plugin_rewrite",
            "plugin_access",
            "plugin_header_filter",
        ];
        let tracing_instrumentations = list("tracing_instrumentations");
        if let Some(bad) = tracing_instrumentations
            .iter()
            .find(|i| !INSTRUMENTATIONS.contains(&i.as_str()))
        {
            return Err(invalid(
                "tracing_instrumentations",
                format!("invalid tracing type: {bad}"),
            ));
        }
        if tracing_instrumentations.len() > 1 && tracing_instrumentations.iter().any(|i| i == "off")
        {
            return Err(invalid(
                "tracing_instrumentations",
                "invalid tracing types: off, other types are mutually exclusive".into(),
            ));
        }
        let lua_time_budget = get("lua_time_budget")
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|s| (0.0..=3600.0).contains(s))
            .ok_or_else(|| {
                invalid(
                    "lua_time_budget",
                    "must be a number of seconds between 0 and 3600".into(),
                )
            })
            .map(|s| (s > 0.0).then(|| Duration::from_secs_f64(s)))?;
        let tracing_sampling_rate = get("tracing_sampling_rate")
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|r| (0.0..=1.0).contains(r))
            .ok_or_else(|| {
                invalid(
                    "tracing_sampling_rate",
                    "must be a number between 0 and 1".into(),
                )
            })?;
        // Kong's entity cache: time-to-live of found entities and of misses (0: until the
        // store says they changed), and its size.
        let secs = |name: &str, v: &str| -> Result<Option<Duration>, ConfError> {
            let n = v
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|n| *n >= 0.0 && *n <= 1e9)
                .ok_or_else(|| {
                    invalid(name, "must be a number of seconds, 0 for no expiry".into())
                })?;
            Ok((n > 0.0).then(|| Duration::from_secs_f64(n)))
        };
        let db_cache_ttl = secs("db_cache_ttl", get("db_cache_ttl"))?;
        let db_cache_neg_ttl = match get("db_cache_neg_ttl").trim() {
            "" => db_cache_ttl,
            v => secs("db_cache_neg_ttl", v)?,
        };
        let mem_cache_size = parse_size(get("mem_cache_size"))
            .map(|n| n as u64)
            .filter(|n| *n >= 1 << 20)
            .ok_or_else(|| {
                invalid(
                    "mem_cache_size",
                    "must be a size of at least 1m (e.g. 128m, 1g)".into(),
                )
            })?;
        // Kong's shared dictionaries that a plugin may name (`kong_db_cache`, sized by
        // mem_cache_size), and the operator's own.
        let mut shared_dicts = vec![
            ("kong".to_string(), 5u64 << 20),
            ("kong_db_cache".to_string(), mem_cache_size),
            ("kong_core_db_cache".to_string(), mem_cache_size),
        ];
        for d in get("nginx_http_lua_shared_dict")
            .split(';')
            .map(str::trim)
            .filter(|d| !d.is_empty())
        {
            let mut it = d.split_whitespace();
            let parsed = match (it.next(), it.next().and_then(parse_size), it.next()) {
                (Some(name), Some(size), None) if size > 0 => Some((name.to_string(), size as u64)),
                _ => None,
            };
            let Some((name, size)) = parsed else {
                return Err(invalid(
                    "nginx_http_lua_shared_dict",
                    format!("expected \"name size\" (e.g. \"proxy_cache 64m\"), got \"{d}\""),
                ));
            };
            shared_dicts.retain(|(n, _)| *n != name);
            shared_dicts.push((name, size));
        }
        let admin_auth_token = match get("admin_auth_token") {
            "" => None,
            t => Some(t.to_string()),
        };
        let declarative_config = match get("declarative_config") {
            "" => None,
            p => Some(PathBuf::from(p)),
        };
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        let worker_processes = match get("nginx_worker_processes") {
            "auto" => cores,
            v => parse_num::<usize>(v)
                .filter(|n| (1..=1024).contains(n))
                .ok_or_else(|| {
                    invalid(
                        "nginx_worker_processes",
                        format!("'{v}' must be 'auto' or 1..1024"),
                    )
                })?,
        };
        let upstream_keepalive_pool_size = parse_num::<usize>(get("upstream_keepalive_pool_size"))
            .ok_or_else(|| {
                invalid(
                    "upstream_keepalive_pool_size",
                    "must be a non-negative integer".into(),
                )
            })?;
        let upstream_keepalive_max_requests =
            parse_num::<u64>(get("upstream_keepalive_max_requests")).ok_or_else(|| {
                invalid(
                    "upstream_keepalive_max_requests",
                    "must be a non-negative integer".into(),
                )
            })?;
        let upstream_keepalive_idle_timeout =
            parse_num::<u64>(get("upstream_keepalive_idle_timeout"))
                .map(Duration::from_secs)
                .ok_or_else(|| {
                    invalid(
                        "upstream_keepalive_idle_timeout",
                        "must be a non-negative integer (seconds)".into(),
                    )
                })?;
        let keepalive_requests = parse_num::<u64>(get("nginx_http_keepalive_requests"))
            .ok_or_else(|| {
                invalid(
                    "nginx_http_keepalive_requests",
                    "must be a non-negative integer".into(),
                )
            })?;
        let keepalive_timeout =
            parse_duration(get("nginx_http_keepalive_timeout")).ok_or_else(|| {
                invalid(
                    "nginx_http_keepalive_timeout",
                    "must be a duration such as 60s, 500ms or 1m".into(),
                )
            })?;
        let client_body_timeout = parse_duration(get("nginx_http_client_body_timeout"))
            .filter(|d| !d.is_zero())
            .ok_or_else(|| {
                invalid(
                    "nginx_http_client_body_timeout",
                    "must be a positive duration such as 60s or 500ms".into(),
                )
            })?;
        let client_max_body_size =
            parse_size(get("nginx_http_client_max_body_size")).ok_or_else(|| {
                invalid(
                    "nginx_http_client_max_body_size",
                    "must be a size such as 0 (no limit), 512, 8k or 10m".into(),
                )
            })? as u64;
        let client_body_buffer_size = parse_size(get("nginx_http_client_body_buffer_size"))
            .filter(|n| *n > 0)
            .ok_or_else(|| {
                invalid(
                    "nginx_http_client_body_buffer_size",
                    "must be a positive size such as 8k or 1m".into(),
                )
            })?;
        let ssl_cert = split_list(get("ssl_cert"));
        let ssl_cert_key = split_list(get("ssl_cert_key"));
        if ssl_cert.len() != ssl_cert_key.len() {
            return Err(invalid(
                "ssl_cert",
                "ssl_cert and ssl_cert_key must list the same number of entries".into(),
            ));
        }
        let headers = parse_headers(get("headers"))?;
        let headers_upstream_request_id =
            match get("headers_upstream").trim().to_ascii_lowercase().as_str() {
                "off" | "" => false,
                "x-kong-request-id" => true,
                other => {
                    return Err(invalid(
                        "headers_upstream",
                        format!("invalid header value: {other}"),
                    ))
                }
            };
        let trusted_ips = split_list(get("trusted_ips"));
        for ip in &trusted_ips {
            if parse_cidr(ip).is_none() {
                return Err(invalid(
                    "trusted_ips",
                    format!("invalid IP or CIDR range: '{ip}'"),
                ));
            }
        }
        // Kong 3.x's name for it, an injected nginx directive, wins over the deprecated one.
        let real_ip_header = match get("nginx_proxy_real_ip_header") {
            "" => get("real_ip_header").to_string(),
            v => v.to_string(),
        };
        if real_ip_header == "proxy_protocol" && !proxy_listen.iter().any(|l| l.proxy_protocol) {
            return Err(invalid(
                "real_ip_header",
                "'proxy_protocol' needs a proxy_listen address with the proxy_protocol flag"
                    .to_string(),
            ));
        }
        let max_header_size = parse_header_buffers(get("nginx_http_large_client_header_buffers"))
            .ok_or_else(|| {
            invalid(
                "nginx_http_large_client_header_buffers",
                "must be '<count> <size>', e.g. '4 8k'".into(),
            )
        })?;
        let router_flavor =
            crate::atc::RouterFlavor::parse(get("router_flavor")).ok_or_else(|| {
                invalid(
                    "router_flavor",
                    "expected one of: traditional, traditional_compatible, expressions".into(),
                )
            })?;

        // The Admin API can rewrite every route: off loopback it must demand a token.
        if admin_auth_token.is_none() {
            if let Some(a) = admin_listen.iter().find(|a| !a.addr.ip().is_loopback()) {
                return Err(invalid(
                    "admin_listen",
                    format!(
                        "{} is not a loopback address: set admin_auth_token so that the Admin API requires a bearer token",
                        a.addr
                    ),
                ));
            }
        }
        if database != Database::Off && declarative_config.is_some() {
            warnings.push(format!(
                "declarative_config is only read when database = off (database = {})",
                database.name()
            ));
        }
        let dns = dns_conf(&|name: &str| get(name).to_string())?;
        let tls = tls::tls_conf(&|name: &str| get(name).to_string(), warnings)?;
        let gzip = gzip::gzip_conf(&|name: &str| get(name).to_string())?;
        let cluster = cluster::cluster_conf(
            &|name: &str| get(name).to_string(),
            database,
            &proxy_listen,
            &admin_listen,
        )?;
        let sources = values
            .iter()
            .map(|(k, (_, s))| (k.clone(), s.clone()))
            .collect();
        Ok(Conf {
            prefix,
            log_level,
            proxy_access_log,
            proxy_listen,
            stream_listen,
            admin_listen,
            status_listen,
            debug_listen,
            admin_gui_listen,
            admin_gui_url,
            admin_gui_path,
            admin_gui_api_url,
            admin_gui_dir,
            database,
            pg,
            db_update_frequency,
            ttl_cleanup_interval,
            syslog_socket: PathBuf::from(get("syslog_socket")),
            plugins,
            untrusted_lua,
            untrusted_lua_sandbox_requires,
            untrusted_lua_sandbox_environment,
            lua_package_path,
            pluginservers,
            db_cache_ttl,
            db_cache_neg_ttl,
            mem_cache_size,
            shared_dicts,
            tracing_instrumentations,
            tracing_sampling_rate,
            admin_auth_token,
            key_auth_hash_keys: on_off("key_auth_hash_keys")?,
            lua_time_budget,
            declarative_config,
            worker_processes,
            upstream_keepalive_pool_size,
            upstream_keepalive_max_requests,
            upstream_keepalive_idle_timeout,
            keepalive_requests,
            keepalive_timeout,
            client_body_timeout,
            client_max_body_size,
            client_body_buffer_size,
            ssl_cert,
            ssl_cert_key,
            tls,
            gzip,
            cluster,
            headers,
            headers_upstream_request_id,
            trusted_ips,
            real_ip_header,
            max_header_size,
            router_flavor,
            dns,
            sources,
        })
    }
}

#[cfg(test)]
mod tests;
