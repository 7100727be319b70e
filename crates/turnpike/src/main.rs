//! `turnpike`: the gateway binary and its command line.

mod db;
mod doctor;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use tokio::sync::watch;
use turnpike_admin::Admin;
use turnpike_config::conf::Database;
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
    let registry = turnpike_plugins::enabled(&conf.plugins, conf.database == Database::Off)
        .map_err(|e| format!("invalid configuration: {e}"))?
        .hashing_keys(conf.key_auth_hash_keys);
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
    registry.runtime().lua.configure(
        turnpike_plugins::lua::Settings::parse(
            &conf.untrusted_lua,
            &conf.untrusted_lua_sandbox_requires.join(","),
            &conf.untrusted_lua_sandbox_environment.join(","),
        )
        .map_err(|e| format!("invalid configuration: {e}"))?,
    );
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
    let text = read_text(path)?;
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
    load_text(path, &read_text(path)?, plugins, previous)
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

fn start(conf_path: Option<&Path>) -> Result<(), String> {
    let (conf, warnings) = load_conf(conf_path)?;
    let plugins = plugin_registry(&conf)?;
    let log_filter = init_logging(&conf.log_level);
    for w in &warnings {
        tracing::warn!("{w}");
    }
    tracing::info!(
        "Turnpike {VERSION} starting ({BUILD_PROFILE} build, {} workers)",
        conf.worker_processes
    );
    if BUILD_PROFILE == "debug" {
        tracing::warn!(
            "**************************************************************************"
        );
        tracing::warn!(
            "* THIS IS A DEBUG BUILD: it is many times slower than a release build.   *"
        );
        tracing::warn!(
            "* Build with `cargo build --release` before serving real traffic.        *"
        );
        tracing::warn!(
            "**************************************************************************"
        );
    }
    let (soft, hard) = raise_nofile();
    tracing::info!("open files limit: soft {soft}, hard {hard}");
    // `turnpike doctor`'s checks, as warnings (after the limit was raised as far as allowed).
    for f in doctor::check(&conf, &doctor::Machine::inspect()) {
        tracing::warn!("doctor: {f}");
    }

    std::fs::create_dir_all(&conf.prefix)
        .map_err(|e| format!("cannot create prefix {}: {e}", conf.prefix.display()))?;
    // The node's resolver, with which every config's host names are resolved. No name
    // servers is not fatal (IP targets need none): names then fail to resolve.
    let (dns, dns_problem) = turnpike_proxy::upstream::dns::Dns::start(&conf.dns)
        .map_err(|e| format!("cannot start the resolver: {e}"))?;
    if let Some(e) = dns_problem {
        tracing::warn!("dns: {e}");
    }
    let default_cert = tls::default_certificate(
        &conf.prefix,
        conf.ssl_cert.first().map(String::as_str),
        conf.ssl_cert_key.first().map(String::as_str),
    )?;
    let mut settings = Settings::from_conf(&conf);
    settings.access_log = turnpike_proxy::worker::access_log::AccessLog::open(
        conf.proxy_access_log.as_deref(),
        &conf.prefix,
    )?;
    if let Some(log) = &settings.access_log {
        tracing::info!("access log: {} ({:?})", log.path.display(), log.format);
    }
    let gateway = Arc::new(Gateway::new(
        settings,
        conf.worker_processes,
        default_cert,
        plugins.clone(),
        dns,
    ));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    // Handlers first: a signal that arrives once the ports are open must find them installed
    // (SIGHUP's default action would kill the process).
    let signal_streams = {
        let _in_runtime = rt.enter();
        Signals::install()?
    };
    let (store, sync) = if conf.database == Database::Off {
        (None, None)
    } else {
        let (store, sync) = rt.block_on(db::start(&conf, plugins.clone(), gateway.clone()))?;
        (Some(store), Some(sync))
    };
    if let (Database::Off, Some(path)) = (conf.database, &conf.declarative_config) {
        gateway.apply_compiled(parse_file(path, plugins.as_ref(), &gateway.upstreams)?);
        tracing::info!("loaded declarative config {}", path.display());
    }

    let mut bind_warnings = Vec::new();
    let proxy = server::bind(
        &conf.proxy_listen,
        conf.worker_processes,
        &mut bind_warnings,
    )
    .map_err(|e| format!("cannot bind proxy_listen: {e}"))?;
    let admin_listeners = server::bind(&conf.admin_listen, 1, &mut bind_warnings)
        .map_err(|e| format!("cannot bind admin_listen: {e}"))?;
    let status_listeners = server::bind(&conf.status_listen, 1, &mut bind_warnings)
        .map_err(|e| format!("cannot bind status_listen: {e}"))?;
    let debug_listeners = server::bind(&conf.debug_listen, 1, &mut bind_warnings)
        .map_err(|e| format!("cannot bind debug_listen: {e}"))?;
    // Kong Manager is served only when the operator names a build of it.
    let gui_listeners = match &conf.admin_gui_dir {
        Some(dir) => {
            if !dir.join("index.html").is_file() {
                return Err(format!(
                    "admin_gui_dir: {} holds no index.html (a Kong Manager build)",
                    dir.display()
                ));
            }
            server::bind(&conf.admin_gui_listen, 1, &mut bind_warnings)
                .map_err(|e| format!("cannot bind admin_gui_listen: {e}"))?
        }
        None => Vec::new(),
    };
    for w in &bind_warnings {
        tracing::warn!("{w}");
    }
    for l in &proxy {
        tracing::info!(
            "proxy listening on {}{}",
            l.spec.addr,
            if l.spec.ssl { " (ssl)" } else { "" }
        );
    }
    for l in &admin_listeners {
        tracing::info!("admin API listening on {}", l.spec.addr);
    }
    for l in &status_listeners {
        tracing::info!("status API listening on {}", l.spec.addr);
    }
    for l in &gui_listeners {
        tracing::info!("Kong Manager listening on {}", l.spec.addr);
    }
    for l in &debug_listeners {
        tracing::warn!(
            "debug listener (CPU profiles) on {}: keep it private",
            l.spec.addr
        );
    }
    let pid_dir = conf.prefix.join("pids");
    let _ = std::fs::create_dir_all(&pid_dir);
    let _ = std::fs::write(pid_dir.join("turnpike.pid"), std::process::id().to_string());

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    // Replaced configs are freed as soon as nothing holds them, and their memory handed back
    // at once (mimalloc otherwise purges it only when the threads that own it next collect).
    gateway.start_reaper(release_memory_now);
    let workers = server::start_workers(
        gateway.clone(),
        proxy,
        conf.worker_processes,
        shutdown_rx.clone(),
        release_memory,
    );
    let admin = Arc::new(Admin {
        config_loading: Default::default(),
        release_memory: release_memory_now,
        gateway: gateway.clone(),
        node_id: node_id(&conf.prefix),
        hostname: hostname(),
        plugins: plugins.clone(),
        conf: conf.clone(),
        store,
        sync,
        log_levels: log_filter.map(|f| {
            Arc::new(turnpike_admin::log_level::LevelState::new(
                Arc::new(f),
                &conf.log_level,
            ))
        }),
    });
    // What watches the traffic keeps the proxy workers' priority, on threads of its own
    // started before this one lowers its own: active health checks (a probe's answer read
    // late counts as a timeout) and the status API (load balancers' and orchestrators' probes
    // of this node). DNS refreshes have theirs already (`Dns::start`).
    gateway
        .upstreams
        .health
        .start_checker()
        .map_err(|e| format!("cannot start the health checker: {e}"))?;
    let status = serve_status(&admin, status_listeners, &shutdown_rx)?;
    // This thread runs the control plane: the Admin API, the config sync, and the threads it
    // starts from now on (a `POST /config` load). When the cores are busy, traffic wins: the
    // proxy workers and the threads above keep the normal priority, this one yields to them.
    turnpike_store::sync::lower_priority(turnpike_store::sync::CONTROL_PLANE_NICE);
    // Its SQLite connections so far (loading the config) were opened at the workers' priority,
    // each on a thread of its own that kept it: the next ones open from here, at this one's.
    if let Some(store) = &admin.store {
        let renewed = rt.block_on(store.renew_idle_connections());
        tracing::debug!("store: {renewed} connections renewed at the control plane's priority");
    }

    rt.block_on(async {
        for l in admin_listeners {
            for s in l.sockets {
                let listener = tokio::net::TcpListener::from_std(s).expect("admin listener");
                tokio::spawn(turnpike_admin::serve(
                    admin.clone(),
                    listener,
                    shutdown_rx.clone(),
                ));
            }
        }
        for l in gui_listeners {
            for s in l.sockets {
                let listener = tokio::net::TcpListener::from_std(s).expect("gui listener");
                tokio::spawn(turnpike_admin::serve_gui(
                    admin.clone(),
                    listener,
                    shutdown_rx.clone(),
                ));
            }
        }
        for l in debug_listeners {
            for s in l.sockets {
                let listener = tokio::net::TcpListener::from_std(s).expect("debug listener");
                tokio::spawn(turnpike_admin::serve_debug(
                    admin.clone(),
                    listener,
                    shutdown_rx.clone(),
                ));
            }
        }
        signals(
            signal_streams,
            &gateway,
            &conf,
            plugins.as_ref(),
            admin.sync.as_deref(),
        )
        .await;
        tracing::info!("shutting down: draining in-flight requests");
        let _ = shutdown_tx.send(true);
    });
    // Workers stop accepting, finish their connections, then exit; bounded like Kong's
    // nginx_main_worker_shutdown_timeout.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    for w in workers.into_iter().chain(status) {
        while !w.is_finished() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    tracing::info!("stopped");
    Ok(())
}

/// Serves the status API (`status_listen`) on a thread of its own, with its own runtime and,
/// on a database, its own connection for `/status`'s reachability check: it answers at the
/// priority of the thread that calls this, whatever the control plane's. `None` without
/// status listeners.
fn serve_status(
    admin: &Arc<Admin>,
    listeners: Vec<server::BoundListener>,
    shutdown: &watch::Receiver<bool>,
) -> Result<Option<std::thread::JoinHandle<()>>, String> {
    let sockets: Vec<std::net::TcpListener> =
        listeners.into_iter().flat_map(|l| l.sockets).collect();
    if sockets.is_empty() {
        return Ok(None);
    }
    let (admin, shutdown) = (admin.clone(), shutdown.clone());
    std::thread::Builder::new()
        .name("status".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => return tracing::error!("status API: cannot start: {e}"),
            };
            rt.block_on(async move {
                // The store's connections live on the runtime that opened them: this thread
                // checks the database on a pool of its own.
                let own = admin.store.as_ref().and_then(|s| {
                    s.with_own_pool("turnpike-status")
                        .map_err(|e| {
                            tracing::warn!("status API: no connection pool of its own ({e})")
                        })
                        .ok()
                });
                let admin = match own {
                    Some(store) => Arc::new(Admin {
                        store: Some(Arc::new(store)),
                        ..(*admin).clone()
                    }),
                    None => admin,
                };
                let mut served = tokio::task::JoinSet::new();
                for s in sockets {
                    match tokio::net::TcpListener::from_std(s) {
                        Ok(l) => {
                            served.spawn(turnpike_admin::serve_status(
                                admin.clone(),
                                l,
                                shutdown.clone(),
                            ));
                        }
                        Err(e) => tracing::error!("status API: {e}"),
                    }
                }
                served.join_all().await;
            });
        })
        .map(Some)
        .map_err(|e| format!("cannot start the status API thread: {e}"))
}

/// Waits for a stop signal; reloads the declarative file on SIGHUP meanwhile.
/// The signals Turnpike handles, registered before anything listens.
struct Signals {
    term: tokio::signal::unix::Signal,
    quit: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    /// Must run inside the runtime (it registers with its driver).
    fn install() -> Result<Signals, String> {
        use tokio::signal::unix::{signal, SignalKind};
        let s =
            |k: SignalKind| signal(k).map_err(|e| format!("cannot install signal handlers: {e}"));
        Ok(Signals {
            term: s(SignalKind::terminate())?,
            quit: s(SignalKind::quit())?,
            int: s(SignalKind::interrupt())?,
            hup: s(SignalKind::hangup())?,
        })
    }
}

async fn signals(
    streams: Signals,
    gateway: &Gateway,
    conf: &Conf,
    plugins: &turnpike_plugins::Registry,
    sync: Option<&turnpike_store::sync::ConfigSync>,
) {
    let Signals {
        mut term,
        mut quit,
        mut int,
        mut hup,
    } = streams;
    loop {
        tokio::select! {
            _ = term.recv() => return,
            _ = quit.recv() => return,
            _ = int.recv() => return,
            _ = hup.recv() => {
                if let Some(sync) = sync {
                    tracing::info!("SIGHUP: re-reading the config from the database");
                    sync.trigger();
                    continue;
                }
                let Some(path) = &conf.declarative_config else {
                    tracing::warn!("SIGHUP: no declarative_config to reload");
                    continue;
                };
                // A bad file never replaces a good config.
                // Read against the running config and patched into it where it can be;
                // refused whole when any of it cannot be built.
                let running = gateway.snapshot.load_full();
                let read = read_file(path, plugins, Some(&running.config));
                drop(running);
                let applied = read.and_then(|cfg| {
                    gateway
                        .apply_whole(cfg)
                        .map_err(|e| format!("in '{}': {e}", path.display()))
                });
                match applied {
                    Ok(()) => tracing::info!("SIGHUP: reloaded {}", path.display()),
                    Err(e) => tracing::error!("SIGHUP: keeping the current configuration: {e}"),
                }
            }
        }
    }
}
