//! `turnpike start`: a node from its configuration to its last request. The configuration and
//! plugins are read, the data plane's snapshot built (from the declarative file, or from the
//! database with its config sync), the workers and listeners started (proxy, Admin API,
//! status), then signals handled (SIGHUP reloads; SIGTERM, SIGINT and SIGQUIT stop) until it stops.

use super::*;

pub(super) fn start(conf_path: Option<&Path>) -> Result<(), String> {
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
    // A control plane whose certificate cannot serve does not start.
    if conf.cluster.role == Role::ControlPlane {
        turnpike_cluster::tls::server_config(&conf.cluster)?;
    }
    // A data plane serves the config kept from its control plane before it connects.
    let data_plane = match conf.cluster.role {
        Role::DataPlane => Some(hybrid::data_plane(
            &conf,
            &plugins,
            &gateway,
            node_id(&conf.prefix),
            hostname(),
        )?),
        _ => None,
    };

    let mut bind_warnings = Vec::new();
    let mut proxy = server::bind(
        &conf.proxy_listen,
        conf.worker_processes,
        &mut bind_warnings,
    )
    .map_err(|e| format!("cannot bind proxy_listen: {e}"))?;
    // The stream listeners are served by the same workers, beside the HTTP ones.
    proxy.extend(
        server::bind(
            &conf.stream_listen,
            conf.worker_processes,
            &mut bind_warnings,
        )
        .map_err(|e| format!("cannot bind stream_listen: {e}"))?,
    );
    let admin_listeners = server::bind(&conf.admin_listen, 1, &mut bind_warnings)
        .map_err(|e| format!("cannot bind admin_listen: {e}"))?;
    let status_listeners = server::bind(&conf.status_listen, 1, &mut bind_warnings)
        .map_err(|e| format!("cannot bind status_listen: {e}"))?;
    let debug_listeners = server::bind(&conf.debug_listen, 1, &mut bind_warnings)
        .map_err(|e| format!("cannot bind debug_listen: {e}"))?;
    let cluster_listeners = if conf.cluster.role == Role::ControlPlane {
        server::bind(&conf.cluster.listen, 1, &mut bind_warnings)
            .map_err(|e| format!("cannot bind cluster_listen: {e}"))?
    } else {
        Vec::new()
    };
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
            "{} listening on {}{}",
            if l.spec.stream {
                "stream proxy"
            } else {
                "proxy"
            },
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
    for l in &cluster_listeners {
        tracing::info!("cluster listener (control plane) on {}", l.spec.addr);
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

    // External plugin servers run before traffic does (at the workers' priority: a request
    // waits on them), as Kong starts them in its init phase.
    if let Some(servers) = plugins.runtime().pluginservers.get() {
        servers.run();
    }
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
    // Hybrid mode's side of this node, on a thread of its own at the control plane's priority
    // is started below; the control plane's records and the data plane's state are the
    // Admin API's to show.
    let control_plane = match (&conf.cluster.role, &store, &sync) {
        (Role::ControlPlane, Some(store), Some(sync)) => {
            Some(turnpike_cluster::cp::ControlPlane::new(
                conf.cluster.clone(),
                hybrid::plugin_versions(&plugins),
                turnpike_plugins::KONG_VERSION,
            ))
            .map(|cp| (cp, store.clone(), sync.clone()))
        }
        _ => None,
    };
    let cluster = match (&control_plane, &data_plane) {
        (Some((cp, _, _)), _) => turnpike_cluster::Node::ControlPlane(cp.clone()),
        (_, Some(dp)) => turnpike_cluster::Node::DataPlane(dp.clone()),
        _ => turnpike_cluster::Node::Traditional,
    };
    let admin = Arc::new(Admin {
        cluster,
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
    let mut cluster_thread = None;
    if let Some((cp, store, sync)) = control_plane {
        cluster_thread = Some(hybrid::start_control_plane(
            cp,
            store,
            sync,
            cluster_listeners,
            &shutdown_rx,
        )?);
    }
    if let Some(dp) = data_plane {
        cluster_thread = Some(hybrid::run_data_plane(dp, &shutdown_rx)?);
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
    for w in workers.into_iter().chain(status).chain(cluster_thread) {
        while !w.is_finished() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    if let Some(servers) = plugins.runtime().pluginservers.get() {
        servers.stop();
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
