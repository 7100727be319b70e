//! Opening the configured store, the `migrations` and `config db_import`/`db_export` commands,
//! and the start-up sequence in database mode (schema check, first sync, fallback to the last
//! good config when the database is unreachable).

use std::path::Path;
use std::sync::Arc;

use turnpike_config::conf::Database;
use turnpike_config::declarative::PluginRegistry;
use turnpike_config::Conf;
use turnpike_proxy::Gateway;
use turnpike_store::sync::ConfigSync;
use turnpike_store::{Backend, SchemaState, Store, StoreError, StoreOptions, SCHEMA_VERSION};

/// Connection options for the configured database; `None` for `database = off`.
pub fn store_options(conf: &Conf) -> Result<Option<StoreOptions>, String> {
    Ok(match conf.database {
        Database::Off => None,
        Database::Sqlite => {
            std::fs::create_dir_all(&conf.prefix)
                .map_err(|e| format!("cannot create prefix {}: {e}", conf.prefix.display()))?;
            let prefix = conf
                .prefix
                .canonicalize()
                .map_err(|e| format!("prefix {}: {e}", conf.prefix.display()))?;
            Some(StoreOptions {
                backend: Backend::Sqlite,
                url: format!("sqlite://{}?mode=rwc", prefix.join("turnpike.db").display()),
                // One writer at a time in SQLite; a few readers beside it (WAL).
                pool_size: 4,
                timeout: std::time::Duration::from_secs(5),
                keepalive: Some(std::time::Duration::from_secs(60)),
            })
        }
        Database::Postgres => Some(StoreOptions {
            backend: Backend::Postgres,
            url: conf.pg.url(),
            pool_size: conf.pg.pool_size,
            timeout: conf.pg.timeout,
            keepalive: conf.pg.keepalive_timeout,
        }),
    })
}

pub async fn open(conf: &Conf, plugins: Arc<dyn PluginRegistry>) -> Result<Store, String> {
    let opts = store_options(conf)?.ok_or_else(|| {
        "this command needs a database (database = sqlite or postgres)".to_string()
    })?;
    Store::connect(opts, plugins)
        .await
        .map_err(|e| e.to_string())
}

/// `turnpike migrations <cmd>`.
pub async fn migrations(
    conf: &Conf,
    plugins: Arc<dyn PluginRegistry>,
    cmd: &str,
) -> Result<String, String> {
    let store = open(conf, plugins).await?;
    let state = store.schema_state().await.map_err(|e| e.to_string())?;
    match cmd {
        "status" => Ok(match state {
            SchemaState::Empty => "Database needs bootstrapping; run 'turnpike migrations bootstrap'".into(),
            SchemaState::At(v) if v < SCHEMA_VERSION => format!(
                "Database is at schema version {v}; run 'turnpike migrations up' to reach {SCHEMA_VERSION}"
            ),
            SchemaState::At(v) => match store.missing_tables().await.map_err(|e| e.to_string())? {
                m if m.is_empty() => format!("Database is up to date (schema version {v})"),
                m => pending(&m),
            },
        }),
        "bootstrap" => match state {
            SchemaState::Empty => {
                store.bootstrap().await.map_err(|e| e.to_string())?;
                Ok(format!("Database bootstrapped (schema version {SCHEMA_VERSION})"))
            }
            SchemaState::At(_) => Ok("Database already bootstrapped".into()),
        },
        "up" => match state {
            SchemaState::Empty => Err("Database needs bootstrapping; run 'turnpike migrations bootstrap'".into()),
            SchemaState::At(v) if v >= SCHEMA_VERSION => {
                let missing = store.missing_tables().await.map_err(|e| e.to_string())?;
                if missing.is_empty() {
                    Ok("Database is already up-to-date".into())
                } else {
                    store.bootstrap().await.map_err(|e| e.to_string())?;
                    Ok(format!(
                        "Database migrated: made the tables of enabled plugins: {}",
                        missing.join(", ")
                    ))
                }
            }
            SchemaState::At(_) => {
                store.bootstrap().await.map_err(|e| e.to_string())?;
                Ok(format!("Database migrated to schema version {SCHEMA_VERSION}"))
            }
        },
        "reset" => {
            store.reset().await.map_err(|e| e.to_string())?;
            Ok("Database reset: every Turnpike table dropped".into())
        }
        other => Err(format!("unknown migrations command '{other}'")),
    }
}

/// `turnpike config db_import FILE`: validates the file, then writes it in one transaction.
pub async fn db_import(
    conf: &Conf,
    plugins: Arc<dyn PluginRegistry>,
    cfg: turnpike_config::Config,
) -> Result<String, String> {
    let store = open(conf, plugins).await?;
    ensure_schema(&store).await?;
    // On a terminal, how far it is (entities done of all, and their rate), as any long
    // import shows it.
    let started = std::time::Instant::now();
    let tty = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let mut last = started;
    let mut progress = |done: usize, total: usize| {
        if !tty || (last.elapsed().as_millis() < 200 && done < total) {
            return;
        }
        last = std::time::Instant::now();
        let rate = done as f64 / started.elapsed().as_secs_f64().max(0.001);
        eprint!("\rimporting: {done}/{total} entities ({rate:.0}/s)   ");
        if done == total {
            eprintln!();
        }
    };
    let n = store
        .import_with_progress(&cfg, &mut progress)
        .await
        .map_err(|e| {
            let (_, body) = e.to_kong();
            body["message"]
                .as_str()
                .unwrap_or("import failed")
                .to_string()
        })?;
    Ok(format!("import successful: {n} entities"))
}

/// `turnpike config db_export FILE`: the store as a declarative YAML file.
pub async fn db_export(
    conf: &Conf,
    plugins: Arc<dyn PluginRegistry>,
    path: &Path,
) -> Result<String, String> {
    let store = open(conf, plugins).await?;
    ensure_schema(&store).await?;
    let (_, mut export) = store.export().await.map_err(|e| e.to_string())?;
    if let Some(m) = export.as_object_mut() {
        m.remove("_transform");
        // Sessions are state, not config (Kong's `db_export = false`).
        m.remove(turnpike_plugins::session::TABLE);
    }
    let yaml = to_yaml(&export)?;
    std::fs::write(path, yaml).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(format!("exported to {}", path.display()))
}

/// The store's `vaults` entities, for `turnpike vault get`.
pub async fn vaults(
    conf: &Conf,
    plugins: Arc<dyn PluginRegistry>,
) -> Result<Vec<turnpike_config::declarative::records::Record>, String> {
    let store = open(conf, plugins).await?;
    ensure_schema(&store).await?;
    let (_, export) = store.export().await.map_err(|e| e.to_string())?;
    let spec = turnpike_config::declarative::records::by_table("vaults")
        .ok_or("this build has no vaults entity")?;
    let mut out = Vec::new();
    for v in export["vaults"].as_array().into_iter().flatten() {
        let Some(m) = v.as_object() else { continue };
        let id = m.get("id").and_then(|i| i.as_str()).unwrap_or_default();
        let (record, _, errors) = turnpike_config::declarative::records::read(spec, m, id, 0);
        if errors.is_empty() {
            out.push(record);
        }
    }
    Ok(out)
}

/// The export as YAML, the format `kong config db_export` writes.
/// Numbers as Kong writes them (`timeout: 1`, not `1.0`).
fn to_yaml(v: &serde_json::Value) -> Result<String, String> {
    let mut v = v.clone();
    turnpike_config::number::normalize(&mut v);
    serde_yaml::to_string(&v).map_err(|e| e.to_string())
}

async fn ensure_schema(store: &Store) -> Result<(), String> {
    check_schema(store).await.map_err(|(_, e)| e)
}

/// Like `ensure_schema`; the flag says whether the failure is the database being unreachable
/// (worth waiting out) rather than a schema problem (an operator error).
async fn check_schema(store: &Store) -> Result<(), (bool, String)> {
    let state = store
        .schema_state()
        .await
        .map_err(|e| (matches!(e, StoreError::Unavailable(_)), e.to_string()))?;
    let fatal = |m: String| Err((false, m));
    match state {
        // The embedded store creates and upgrades its own schema.
        SchemaState::Empty if store.backend == Backend::Sqlite => {
            store.bootstrap().await.map_err(|e| (false, e.to_string()))
        }
        SchemaState::At(v) if v < SCHEMA_VERSION && store.backend == Backend::Sqlite => {
            store.bootstrap().await.map_err(|e| (false, e.to_string()))
        }
        SchemaState::Empty => {
            fatal("Database needs bootstrapping; run 'turnpike migrations bootstrap'".into())
        }
        SchemaState::At(v) if v < SCHEMA_VERSION => fatal(format!(
            "Database is at schema version {v}; run 'turnpike migrations up'"
        )),
        SchemaState::At(v) if v > SCHEMA_VERSION => fatal(format!(
            "Database schema version {v} is newer than this build ({SCHEMA_VERSION})"
        )),
        SchemaState::At(_) => {
            // A plugin with entities enabled since: SQLite makes their tables; PostgreSQL
            // waits for the operator, as Kong's pending migrations do.
            let missing = store
                .missing_tables()
                .await
                .map_err(|e| (matches!(e, StoreError::Unavailable(_)), e.to_string()))?;
            if missing.is_empty() {
                Ok(())
            } else if store.backend == Backend::Sqlite {
                store.bootstrap().await.map_err(|e| (false, e.to_string()))
            } else {
                fatal(pending(&missing))
            }
        }
    }
}

/// Kong's message for pending migrations, naming the tables of enabled plugins to make.
fn pending(missing: &[&str]) -> String {
    format!(
        "New migrations available (the tables of enabled plugins: {}); run 'turnpike migrations up' to proceed",
        missing.join(", ")
    )
}

/// Start-up in database mode: check the schema (SQLite creates it: the embedded default needs
/// no setup), load the config, start the sync. With the database unreachable, serve the last
/// good config saved under the prefix and keep trying.
pub async fn start(
    conf: &Conf,
    plugins: Arc<dyn PluginRegistry>,
    gateway: Arc<Gateway>,
) -> Result<(Arc<Store>, Arc<ConfigSync>), String> {
    let store = Arc::new(open(conf, plugins).await?);
    // Credentials come from the store, through the data plane's cache (not with the config).
    let runtime = gateway.plugins.runtime();
    let pools = Arc::new(WorkerPools {
        store: store.clone(),
        control: tokio::runtime::Handle::current(),
        pools: Default::default(),
    });
    runtime.credentials.install(
        Arc::new(StoreCredentials {
            store: store.clone(),
            pools: pools.clone(),
        }),
        turnpike_plugins::credentials::CacheSettings {
            ttl: conf.db_cache_ttl,
            neg_ttl: conf.db_cache_neg_ttl,
            max_bytes: conf.mem_cache_size,
        },
    );
    // rate-limiting's cluster policy counts in this store; ended windows are purged now and
    // then (as Kong's timer does).
    runtime
        .rate_limiting
        .cluster
        .install(Arc::new(StoreCounters { pools }));
    {
        let store = store.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(std::time::Duration::from_secs(60)).await;
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs() as i64)
                    .unwrap_or(0);
                if let Err(e) = store.purge_counters(now).await {
                    tracing::debug!("rate-limiting counters: purge failed: {e}");
                }
            }
        });
    }
    {
        // Kong's ttl cleanup: expired tokens, codes and keys leave the store in batches, so
        // a token table stays at its live size.
        let store = store.clone();
        let every = conf.ttl_cleanup_interval;
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                match store.purge_expired(turnpike_store::now_secs(), 1000).await {
                    Ok(0) => {}
                    Ok(n) => tracing::debug!("ttl cleanup: {n} expired rows deleted"),
                    Err(e) => tracing::debug!("ttl cleanup failed: {e}"),
                }
            }
        });
    }
    let gw = gateway.clone();
    let sync = ConfigSync::new(
        store.clone(),
        Arc::new(move |cfg, changes| gw.apply_changes(cfg, changes)),
        &conf.prefix,
        conf.db_update_frequency,
    );
    let loaded = match check_schema(&store).await {
        Ok(()) => {
            check_connection_budget(&store, conf).await;
            sync.sync_once().await.map_err(|e| e.to_string())
        }
        Err((true, e)) => Err(e),
        // A store that answers but lacks the schema is an operator error: refuse to start.
        Err((false, e)) => return Err(e),
    };
    match loaded {
        Ok(v) => tracing::info!(
            "database {}: loaded config version {v}",
            conf.database.name()
        ),
        Err(e) => match sync.load_last_good() {
            Some(cfg) => {
                gateway.apply(cfg)?;
                tracing::error!("database unreachable ({e}); serving the last good config from the prefix until it returns");
            }
            None => tracing::error!(
                "database unreachable ({e}) and no last good config under the prefix: serving no routes until it returns"
            ),
        },
    }
    tokio::spawn(sync.clone().run());
    tokio::spawn(sync.clone().listen());
    tokio::spawn(sync.clone().announce());
    Ok((store, sync))
}

/// Warns when this node alone may open more PostgreSQL connections than the server takes:
/// each worker's pool and the control plane's are `pg_pool_size` each (as in Kong, where the
/// pool is per worker), and a node past `max_connections` gets errors under load, not at start.
async fn check_connection_budget(store: &Store, conf: &Conf) {
    if store.backend != turnpike_store::Backend::Postgres {
        return;
    }
    let Ok(max) = store.max_connections().await else {
        return;
    };
    // Each worker's and the control plane's single statements and transactions, two pools each
    // (turnpike_store::direct; a worker's transactions are the oauth2 endpoints' token and
    // code updates and deletes); the status API's reachability check, when it listens.
    let pools = 2 * conf.worker_processes as i64 + 2 + i64::from(!conf.status_listen.is_empty());
    let mine = pools * i64::from(conf.pg.pool_size);
    if mine > max {
        tracing::warn!(
            "PostgreSQL takes {max} connections (max_connections) and this node alone may open {mine}: \
             {} workers and the control plane (two pools each) and the status API if it listens, {} a pool (pg_pool_size). Past the limit, credential \
             look-ups and Admin API writes fail under load. \
             fix: lower pg_pool_size or raise max_connections (every node counts against it)",
            conf.worker_processes,
            conf.pg.pool_size
        );
    }
}

/// Each proxy worker's own connection pool, made on first use from the worker's thread (a
/// worker's runtime is single-threaded: its connections are driven by the thread that uses
/// them), as each of Kong's workers has its own `pg_pool_size`. The data plane's store work
/// (credential look-ups, oauth2's token writes, rate-limiting counters) then runs on the
/// worker's runtime: it never
/// waits behind the control plane's (Admin API writes at hundreds a second, the config sync)
/// nor crosses threads.
struct WorkerPools {
    /// The control plane's store, and the runtime its connections live on: the fallback.
    store: Arc<Store>,
    control: tokio::runtime::Handle,
    pools: std::sync::Mutex<Vec<(std::thread::ThreadId, Arc<Store>)>>,
}

type StoreWork<T> = std::pin::Pin<Box<dyn std::future::Future<Output = Result<T, String>> + Send>>;

impl WorkerPools {
    /// Runs `work` on the calling worker's own pool, or, without one, on the control plane's
    /// runtime and pool.
    fn run<T, F>(&self, work: impl FnOnce(Arc<Store>) -> F) -> StoreWork<T>
    where
        T: Send + 'static,
        F: std::future::Future<Output = Result<T, turnpike_store::StoreError>> + Send + 'static,
    {
        match self.here() {
            Some(own) => {
                let work = work(own);
                Box::pin(async move { work.await.map_err(|e| e.to_string()) })
            }
            None => {
                let task = self.control.spawn(work(self.store.clone()));
                Box::pin(async move {
                    task.await
                        .map_err(|e| e.to_string())?
                        .map_err(|e| e.to_string())
                })
            }
        }
    }

    /// The calling thread's store, if it runs a runtime to drive one.
    fn here(&self) -> Option<Arc<Store>> {
        tokio::runtime::Handle::try_current().ok()?;
        let thread = std::thread::current();
        let me = thread.id();
        let mut pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, r)) = pools.iter().find(|(t, _)| *t == me) {
            return Some(r.clone());
        }
        match self
            .store
            .with_own_pool(thread.name().unwrap_or("turnpike"))
        {
            Ok(r) => {
                let r = Arc::new(r);
                pools.push((me, r.clone()));
                Some(r)
            }
            Err(e) => {
                tracing::warn!("no connection pool of this worker's own ({e})");
                None
            }
        }
    }
}

/// The store as the data plane's credential source: look-ups and writes (oauth2's tokens and
/// codes) on the worker's own pool ([`WorkerPools`]), never on the control plane's
/// lower-priority thread.
struct StoreCredentials {
    store: Arc<Store>,
    pools: Arc<WorkerPools>,
}

impl turnpike_plugins::credentials::CredentialSource for StoreCredentials {
    fn system(&self) -> &'static str {
        match self.store.backend {
            turnpike_store::Backend::Postgres => "postgres",
            turnpike_store::Backend::Sqlite => "sqlite",
        }
    }

    fn find(
        &self,
        table: &'static str,
        field: &'static str,
        value: String,
    ) -> turnpike_plugins::credentials::Lookup {
        let found = self
            .pools
            .run(move |store| async move { store.find_credential(table, field, &value).await });
        Box::pin(async move {
            let found = found.await?;
            Ok(found.map(|(credential, consumer)| {
                let s = |m: &serde_json::Map<String, serde_json::Value>, f: &str| {
                    m.get(f).and_then(|v| v.as_str()).map(String::from)
                };
                turnpike_plugins::credentials::Found {
                    id: s(&credential, "id").unwrap_or_default(),
                    consumer_id: s(&consumer, "id").unwrap_or_default(),
                    username: s(&consumer, "username"),
                    custom_id: s(&consumer, "custom_id"),
                    fields: credential,
                }
            }))
        })
    }

    fn write(
        &self,
        write: turnpike_plugins::credentials::Write,
    ) -> turnpike_plugins::credentials::Written {
        use turnpike_plugins::credentials::Write;
        self.pools.run(move |store| async move {
            let spec = |table: &str| {
                store.tables.by_table(table).ok_or_else(|| {
                    turnpike_store::StoreError::Database(format!("no table {table}"))
                })
            };
            match write {
                Write::Insert { table, entity } => {
                    store.insert(spec(table)?, entity, None).await.map(Some)
                }
                Write::Update { table, id, patch } => {
                    store.update(spec(table)?, &id, patch, None).await.map(Some)
                }
                Write::Delete { table, id } => {
                    store.delete(spec(table)?, &id, None).await.map(|_| None)
                }
            }
        })
    }
}

/// The store as the cluster policy's counter store; like credential look-ups, the counting
/// runs on the worker's own pool ([`WorkerPools`]).
struct StoreCounters {
    pools: Arc<WorkerPools>,
}

impl turnpike_plugins::rate_limiting::cluster::CounterStore for StoreCounters {
    fn count(
        &self,
        windows: Vec<turnpike_plugins::rate_limiting::cluster::Window>,
    ) -> turnpike_plugins::rate_limiting::cluster::Counted {
        self.pools.run(move |store| async move {
            let windows: Vec<turnpike_store::CounterWindow> = windows
                .into_iter()
                .map(|w| turnpike_store::CounterWindow {
                    route_id: w.route_id,
                    service_id: w.service_id,
                    identifier: w.identifier,
                    period: w.period,
                    period_date: w.period_date,
                    limit: w.limit,
                    expire_at: w.expire_at,
                })
                .collect();
            store.count_request(&windows).await
        })
    }

    fn usage(
        &self,
        counters: Vec<turnpike_plugins::rate_limiting::cluster::Counter>,
    ) -> turnpike_plugins::rate_limiting::cluster::Counted {
        self.pools.run(move |store| async move {
            let counters: Vec<_> = counters.into_iter().map(response_counter).collect();
            store.response_usage(&counters).await
        })
    }

    fn add(
        &self,
        counters: Vec<(turnpike_plugins::rate_limiting::cluster::Counter, i64)>,
    ) -> turnpike_plugins::rate_limiting::cluster::Done {
        self.pools.run(move |store| async move {
            let counters: Vec<_> = counters
                .into_iter()
                .map(|(c, n)| (response_counter(c), n))
                .collect();
            store.response_add(&counters).await
        })
    }
}

fn response_counter(
    c: turnpike_plugins::rate_limiting::cluster::Counter,
) -> turnpike_store::ResponseCounter {
    turnpike_store::ResponseCounter {
        route_id: c.route_id,
        service_id: c.service_id,
        identifier: c.identifier,
        period: c.period,
        period_date: c.period_date,
        expire_at: c.expire_at,
    }
}
