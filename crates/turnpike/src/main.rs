//! `turnpike`: the gateway binary and its command line.

mod db;
mod doctor;
mod hybrid;
mod start;

use start::start;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use tokio::sync::watch;
use turnpike_admin::Admin;
use turnpike_config::conf::{Database, Role};
use turnpike_config::declarative;
use turnpike_config::Conf;

use turnpike_proxy::{tls, worker::listen as server, Gateway, Settings, BUILD_PROFILE, VERSION};

/// mimalloc: chosen by measurement over glibc's malloc (see BENCHMARKS.md, "Allocator").
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Hands the calling thread's freed memory back to the system: mimalloc frees the thread's
/// empty pages and purges what it had kept for reuse (a worker calls this once it has gone
/// quiet, see `server::start_workers`).
fn release_memory() {
    #[cfg(not(feature = "system-allocator"))]
    // SAFETY: mi_collect only walks the calling thread's heap and the shared arenas.
    unsafe {
        libmimalloc_sys::mi_collect(false);
    }
    #[cfg(feature = "system-allocator")]
    // SAFETY: malloc_trim takes an integer and walks glibc's own arenas.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Like `release_memory`, and forces mimalloc to give back at once what it would purge later:
/// for a thread that has just freed a whole parsed configuration (`POST /config`).
fn release_memory_now() {
    #[cfg(not(feature = "system-allocator"))]
    // SAFETY: as in `release_memory`.
    unsafe {
        libmimalloc_sys::mi_collect(true);
    }
    #[cfg(feature = "system-allocator")]
    release_memory();
}

/// Turns transparent huge pages off for this process unless `MIMALLOC_ALLOW_THP` asks for
/// them. mimalloc marks its arenas MADV_HUGEPAGE, so the first touch of each 2 MiB region
/// (and every touch after a purge) zeroes a whole huge page in the page-fault handler:
/// measured, a burst of 500 new connections cost the worker 306 µs of CPU each with them and
/// 67 µs without, and held requests for 100-200 ms; steady keep-alive throughput was the same
/// within noise and RSS halved (BENCHMARKS.md, "Transparent huge pages"). The kernel checks
/// the flag at fault time, so regions mimalloc advised before `main` are covered too.
fn disable_transparent_huge_pages() {
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_some() {
        return; // the operator chose; mimalloc reads the same variable
    }
    // SAFETY: PR_SET_THP_DISABLE takes integer arguments and touches no memory of ours.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}

#[derive(Parser)]
#[command(name = "turnpike", version = VERSION, about = "A Kong-compatible API gateway")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start the gateway in the foreground. SIGTERM/SIGQUIT/SIGINT drain and exit; SIGHUP
    /// reloads the declarative configuration file.
    Start {
        /// Configuration file (kong.conf format).
        #[arg(short = 'c', long = "conf")]
        conf: Option<PathBuf>,
    },
    /// Declarative configuration commands.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Print the version and build profile.
    Version,
    /// Check the machine and the configuration for what operators forget (open-file limit,
    /// listen backlog, ephemeral ports, workers, keepalive, access log, build). Exits 1 when
    /// something needs attention.
    Doctor {
        /// Configuration file (kong.conf format).
        #[arg(short = 'c', long = "conf")]
        conf: Option<PathBuf>,
    },
    /// Hybrid mode utilities (as `kong hybrid`).
    Hybrid {
        #[command(subcommand)]
        command: HybridCommand,
    },
    /// Secret references (as `kong vault`).
    Vault {
        #[command(subcommand)]
        command: VaultCommand,
    },
    /// Database schema: bootstrap, up, status, reset (as `kong migrations`).
    Migrations {
        #[command(subcommand)]
        command: MigrationsCommand,
        #[arg(short = 'c', long = "conf", global = true)]
        conf: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum HybridCommand {
    /// Generate a certificate/key pair for hybrid mode's shared `cluster_mtls` (written to
    /// ./cluster.crt and ./cluster.key unless paths are given), as `kong hybrid gen_cert`.
    #[command(name = "gen_cert")]
    GenCert {
        cert: Option<PathBuf>,
        key: Option<PathBuf>,
        /// Validity in days (default 1095: 3 years).
        #[arg(short = 'd', long = "days")]
        days: Option<u64>,
    },
}

#[derive(Subcommand)]
enum VaultCommand {
    /// Print the secret a reference resolves to, with the node's vaults (its database's, or
    /// its declarative file's) and environment: `{vault://env/name[/key]}` or `env/name[/key]`
    /// (like `kong vault get`).
    Get {
        reference: String,
        #[arg(short = 'c', long = "conf")]
        conf: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum MigrationsCommand {
    /// Create the schema in an empty database.
    Bootstrap,
    /// Bring an existing schema up to this build's version.
    Up,
    /// Report the schema state.
    Status,
    /// Drop every Turnpike table (all entities are lost).
    Reset {
        /// Do not ask for confirmation.
        #[arg(short = 'y', long = "yes")]
        yes: bool,
    },
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Validate a declarative configuration file (like `kong config parse`).
    Parse {
        file: PathBuf,
        #[arg(short = 'c', long = "conf")]
        conf: Option<PathBuf>,
    },
    /// Validate a declarative file and write its entities into the database, in one
    /// transaction (like `kong config db_import`).
    #[command(name = "db_import")]
    DbImport {
        file: PathBuf,
        #[arg(short = 'c', long = "conf")]
        conf: Option<PathBuf>,
    },
    /// Write the database's entities to a declarative file (like `kong config db_export`).
    #[command(name = "db_export")]
    DbExport {
        file: PathBuf,
        #[arg(short = 'c', long = "conf")]
        conf: Option<PathBuf>,
    },
}

fn env_pairs() -> Vec<(String, String)> {
    std::env::vars()
        .filter(|(k, _)| k.starts_with("KONG_") || k.starts_with("TURNPIKE_"))
        // TURNPIKE_LOG is the log filter (tracing's syntax), not a property.
        .filter(|(k, _)| k != "TURNPIKE_LOG")
        .collect()
}

fn load_conf(path: Option<&Path>) -> Result<(Conf, Vec<String>), String> {
    let mut warnings = Vec::new();
    let conf = Conf::load(path, &env_pairs(), &mut warnings)
        .map_err(|e| format!("invalid configuration: {e}"))?;
    Ok((conf, warnings))
}

/// The plugins this node loads (Kong's `plugins` property; `bundled` by default).
/// The node's plugin state (caches, counters, queues) comes with it, one per node.
fn plugin_registry(conf: &Conf) -> Result<Arc<turnpike_plugins::Registry>, String> {
    let mut lua = turnpike_plugins::lua::Settings::parse(
        &conf.untrusted_lua,
        &conf.untrusted_lua_sandbox_requires.join(","),
        &conf.untrusted_lua_sandbox_environment.join(","),
    )
    .map_err(|e| format!("invalid configuration: {e}"))?;
    lua.package_path = conf.lua_package_path.clone();
    lua.node_id = node_id(&conf.prefix);
    lua.workers = conf.worker_processes.max(1);
    lua.budget = conf.lua_time_budget;
    lua.trusted_ips = conf
        .trusted_ips
        .iter()
        .filter_map(|s| turnpike_config::conf::parse_cidr(s))
        .collect();
    lua.cache_ttl = conf.db_cache_ttl.map_or(0.0, |d| d.as_secs_f64());
    lua.cache_neg_ttl = conf
        .db_cache_neg_ttl
        .or(conf.db_cache_ttl)
        .map_or(0.0, |d| d.as_secs_f64());
    // Kong's own lua_shared_dicts (its nginx template's) and the operator's.
    let mut dicts: Vec<(String, u64)> = [
        ("kong", 5u64 << 20),
        ("kong_locks", 8u64 << 20),
        ("kong_healthchecks", 5 << 20),
        ("kong_cluster_events", 5 << 20),
        ("kong_rate_limiting_counters", 12 << 20),
        ("kong_secrets", 5 << 20),
        ("kong_db_cache", conf.mem_cache_size),
    ]
    .into_iter()
    .map(|(n, s)| (n.to_string(), s))
    .collect();
    dicts.retain(|(n, _)| !conf.shared_dicts.iter().any(|(m, _)| m == n));
    dicts.extend(conf.shared_dicts.iter().cloned());
    lua.shared = Arc::new(turnpike_plugins::lua::shared::SharedDicts::new(dicts));
    // External plugins: their servers asked for them (Kong's query commands), not yet run.
    let servers = turnpike_plugins::pluginserver::load(&conf.pluginservers)
        .map_err(|e| format!("invalid configuration: {e}"))?;
    let registry = turnpike_plugins::enabled_with(
        &conf.plugins,
        conf.database == Database::Off,
        Some(&lua),
        &servers.plugins,
    )
    .map_err(|e| format!("invalid configuration: {e}"))?
    .hashing_keys(conf.key_auth_hash_keys)
    .routing(conf.router_flavor);
    // Before any plugin config is checked: whether and how Lua code in configs may run.
    let _ = registry
        .runtime()
        .syslog_socket
        .set(conf.syslog_socket.clone());
    registry
        .runtime()
        .proxy_cache
        .configure(conf.shared_dicts.iter().cloned());
    registry.runtime().opentelemetry.configure(
        &conf.tracing_instrumentations,
        conf.tracing_sampling_rate,
        &node_id(&conf.prefix),
    );
    registry.runtime().lua.configure(lua);
    let _ = registry.runtime().pluginservers.set(servers);
    Ok(Arc::new(registry))
}

fn main() -> ExitCode {
    disable_transparent_huge_pages();
    let cli = Cli::parse();
    match cli.command {
        Command::Version => {
            println!("Turnpike {VERSION} ({BUILD_PROFILE} build)");
            ExitCode::SUCCESS
        }
        Command::Hybrid {
            command: HybridCommand::GenCert { cert, key, days },
        } => match hybrid::gen_cert(cert.as_deref(), key.as_deref(), days) {
            Ok(done) => {
                println!("{done}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("Error: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Config {
            command: ConfigCommand::Parse { file, conf },
        } => {
            let plugins = match load_conf(conf.as_deref()).and_then(|(c, _)| plugin_registry(&c)) {
                Ok(p) => p,
                Err(e) => {
                    eprintln!("Error: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let checked = turnpike_proxy::upstream::Upstreams::with_default_dns()
                .and_then(|u| parse_file(&file, plugins.as_ref(), &u));
            match checked {
                Ok(snap) => {
                    let cfg = &snap.config;
                    println!(
                        "parse successful: {} services, {} routes, {} upstreams, {} consumers, {} plugins",
                        cfg.services.len(),
                        cfg.routes.len(),
                        cfg.upstreams.len(),
                        cfg.consumers.len(),
                        cfg.plugins.len()
                    );
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("Error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Migrations { command, conf } => {
            let cmd = match command {
                MigrationsCommand::Bootstrap => "bootstrap",
                MigrationsCommand::Up => "up",
                MigrationsCommand::Status => "status",
                MigrationsCommand::Reset { yes } => {
                    if !yes {
                        eprintln!(
                            "Error: 'migrations reset' drops every entity; confirm with --yes"
                        );
                        return ExitCode::FAILURE;
                    }
                    "reset"
                }
            };
            run_db_command(conf.as_deref(), |conf, plugins| async move {
                db::migrations(&conf, plugins, cmd).await
            })
        }
        Command::Config {
            command: ConfigCommand::DbImport { file, conf },
        } => run_db_command(conf.as_deref(), |conf, plugins| async move {
            let upstreams = turnpike_proxy::upstream::Upstreams::with_default_dns()?;
            let snap = parse_file(&file, &plugins, &upstreams)?;
            db::db_import(&conf, plugins, snap.config).await
        }),
        Command::Config {
            command: ConfigCommand::DbExport { file, conf },
        } => run_db_command(conf.as_deref(), |conf, plugins| async move {
            db::db_export(&conf, plugins, &file).await
        }),
        Command::Vault {
            command: VaultCommand::Get { reference, conf },
        } => {
            let reference = if reference.starts_with("{vault://") {
                reference
            } else {
                format!("{{vault://{}}}", reference.trim_start_matches('/'))
            };
            let loaded = load_conf(conf.as_deref()).and_then(|(conf, _)| {
                let plugins = plugin_registry(&conf)?;
                Ok((conf, plugins))
            });
            let (conf, plugins) = match loaded {
                Ok(l) => l,
                Err(e) => {
                    eprintln!("Error: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let vaults = if conf.database == Database::Off {
                match &conf.declarative_config {
                    Some(path) => read_text(path)
                        .and_then(|text| load_text(path, &text, &plugins, None))
                        .map(|cfg| cfg.records),
                    None => Ok(Vec::new()),
                }
            } else {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| e.to_string())
                    .and_then(|rt| rt.block_on(db::vaults(&conf, plugins)))
            };
            let resolved = vaults.and_then(|v| {
                turnpike_config::declarative::vault::resolve(
                    &reference,
                    &v,
                    &turnpike_config::declarative::vault::process_env,
                )
            });
            match resolved {
                Ok(secret) => {
                    println!("{secret}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("Error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Doctor { conf } => {
            let conf = match load_conf(conf.as_deref()) {
                Ok((c, _)) => c,
                Err(e) => {
                    eprintln!("Error: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let findings = doctor::check(&conf, &doctor::Machine::inspect());
            if findings.is_empty() {
                println!("turnpike doctor: nothing needs attention");
                return ExitCode::SUCCESS;
            }
            println!("turnpike doctor: {} finding(s)\n", findings.len());
            for f in &findings {
                println!("- {f}\n");
            }
            ExitCode::FAILURE
        }
        Command::Start { conf } => match start(conf.as_deref()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("Error: {e}");
                ExitCode::FAILURE
            }
        },
    }
}

/// Runs a command against the configured database on a small runtime.
fn run_db_command<F, Fut>(conf_path: Option<&Path>, f: F) -> ExitCode
where
    F: FnOnce(Conf, Arc<turnpike_plugins::Registry>) -> Fut,
    Fut: std::future::Future<Output = Result<String, String>>,
{
    let conf = match load_conf(conf_path) {
        Ok((c, _)) => c,
        Err(e) => {
            eprintln!("Error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("Error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let plugins = match plugin_registry(&conf) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("Error: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(f(conf, plugins)) {
        Ok(msg) => {
            println!("{msg}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("Error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Reads, validates and compiles a declarative file: the snapshot a gateway swaps in as it is
/// (compiled once: compiling a copy to check it, then the config again to apply it, doubled a
/// 100k-entity start's time and its peak memory). `upstreams` is what its peers and balancers
/// share: the gateway's, or a throwaway one for a file only checked.
fn parse_file(
    path: &Path,
    plugins: &turnpike_plugins::Registry,
    upstreams: &turnpike_proxy::upstream::Upstreams,
) -> Result<turnpike_proxy::snapshot::Snapshot, String> {
    let text = declarative::into_json_text(read_text(path)?);
    let cfg = load_text(path, &text, plugins, None)?;
    // Compile it too: a config that validates but cannot be compiled (a certificate that does
    // not parse, a regex the engine refuses) is reported here rather than at reload.
    let snap = turnpike_proxy::snapshot::Snapshot::compile(cfg, plugins, upstreams)
        .map_err(|e| format!("in '{}': {e}", path.display()))?;
    if !snap.problems.is_empty() {
        return Err(format!(
            "in '{}': {}",
            path.display(),
            snap.problems.join("; ")
        ));
    }
    // The text is freed only now, after the compile: freed before it, its pages took the
    // snapshot's allocations and 100k consumers held 6 MB more (bench/reload-memory.sh).
    drop(text);
    Ok(snap)
}

fn read_text(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

/// Reads and validates a declarative file; against the running config `previous` for a
/// reload (what it has unchanged is shared as it is read).
fn read_file(
    path: &Path,
    plugins: &turnpike_plugins::Registry,
    previous: Option<&turnpike_config::Config>,
) -> Result<turnpike_config::Config, String> {
    let text = declarative::into_json_text(read_text(path)?);
    load_text(path, &text, plugins, previous)
}

fn load_text(
    path: &Path,
    text: &str,
    plugins: &turnpike_plugins::Registry,
    previous: Option<&turnpike_config::Config>,
) -> Result<turnpike_config::Config, String> {
    declarative::load_str_against(text, plugins, previous).map_err(|e| {
        format!(
            "in '{}':\n{}",
            path.display(),
            e.lines()
                .iter()
                .map(|l| format!("  {l}"))
                .collect::<Vec<_>>()
                .join("\n")
        )
    })
}

/// Kong's levels onto tracing's. Below debug, rustls says only errors: its warnings are about
/// what a client sent (wrk and other OpenSSL clients put the IP address they connect to in
/// SNI, which rustls ignores with a warning), one line per handshake, thousands a second under
/// load. nginx logs a client's TLS mistakes at `info`.
fn tracing_filter(level: &str) -> &'static str {
    match level {
        "debug" => "debug",
        "info" | "notice" => "info,rustls=error",
        "warn" => "warn,rustls=error",
        _ => "error",
    }
}

/// The subscriber `init_logging` builds (stderr, default format).
type LogFormatter = tracing_subscriber::fmt::Formatter<
    tracing_subscriber::fmt::format::DefaultFields,
    tracing_subscriber::fmt::format::Format<tracing_subscriber::fmt::format::Full>,
    fn() -> std::io::Stderr,
>;

/// The log filter, changeable at run time through the Admin API.
struct ReloadableFilter(
    tracing_subscriber::reload::Handle<tracing_subscriber::EnvFilter, LogFormatter>,
);

impl turnpike_admin::log_level::LogLevels for ReloadableFilter {
    fn apply(&self, level: &str) -> Result<(), String> {
        self.0
            .reload(tracing_subscriber::EnvFilter::new(tracing_filter(level)))
            .map_err(|e| e.to_string())
    }
}

fn init_logging(level: &str) -> Option<ReloadableFilter> {
    let builder = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TURNPIKE_LOG")
                .unwrap_or_else(|_| tracing_filter(level).into()),
        )
        .with_target(false)
        .with_writer(std::io::stderr as fn() -> std::io::Stderr)
        .with_filter_reloading();
    let handle = builder.reload_handle();
    builder.try_init().ok().map(|_| ReloadableFilter(handle))
}

/// Raises the open-file soft limit to the hard limit and reports both.
fn raise_nofile() -> (u64, u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct we pass.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return (0, 0);
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim.rlim_cur = lim.rlim_max;
            }
        }
    }
    (lim.rlim_cur, lim.rlim_max)
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

/// A node id that survives restarts, kept under the prefix as Kong keeps `kong.id`.
fn node_id(prefix: &Path) -> String {
    let path = prefix.join("turnpike.id");
    if let Some(id) = std::fs::read_to_string(&path)
        .ok()
        .and_then(|s| uuid::Uuid::parse_str(s.trim()).ok())
    {
        return id.to_string();
    }
    let id = uuid::Uuid::new_v4().to_string();
    let _ = std::fs::write(&path, &id);
    id
}
