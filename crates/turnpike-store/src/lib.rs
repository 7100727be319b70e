//! The control plane's entity store: Kong's entities in SQLite (the embedded default, one file
//! under the prefix) or PostgreSQL (shared by many nodes), behind one interface.
//!
//! The data plane never reads from here: every write bumps a config version, and the config
//! sync ([`sync`]) turns the store's contents into a new immutable snapshot that the proxy swaps
//! in. Requests only ever see snapshots, so a slow or absent database cannot stall traffic.

pub mod counters;
pub mod crud;
pub mod direct;
pub mod entity;
pub mod error;
pub mod schema;
pub mod sync;

use std::sync::Arc;
use std::time::Duration;

use sqlx::any::AnyPoolOptions;
use sqlx::AnyPool;
use sqlx::Row;
use turnpike_config::declarative::PluginRegistry;

pub use counters::{CounterWindow, ResponseCounter};
pub use crud::{ListQuery, Page};
pub use error::StoreError;

/// Which database engine a store talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// Where and how to connect.
#[derive(Clone)]
pub struct StoreOptions {
    pub backend: Backend,
    /// `sqlite://...` or `postgres://...`.
    pub url: String,
    pub pool_size: u32,
    pub timeout: Duration,
    /// Idle connections are closed after this long (`pg_keepalive_timeout`); `None`: kept.
    pub keepalive: Option<Duration>,
}

impl std::fmt::Debug for StoreOptions {
    // The URL may carry the PostgreSQL password: never print it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreOptions")
            .field("backend", &self.backend)
            .field("pool_size", &self.pool_size)
            .finish()
    }
}

/// The schema version this build writes; `migrations up` brings older stores here.
/// 1: the entity tables; 2: the change log (`changes`); 3: rate-limiting counters
/// (`ratelimiting_metrics`, the cluster policy); 4: `key_sets`, `keys`, `vaults`;
/// 5: `oauth2_authorization_codes`; 6: `response_ratelimiting_metrics` (response-ratelimiting's
/// cluster policy).
pub const SCHEMA_VERSION: i64 = 6;

/// Channel PostgreSQL notifies on when the config version changes.
pub const NOTIFY_CHANNEL: &str = "turnpike_config";

pub struct Store {
    /// Transactions (Admin API writes, the config sync's snapshots, migrations).
    pub pool: AnyPool,
    /// Single statements on the hot paths, without sqlx's pool's checks ([`direct`]).
    direct: direct::Direct,
    /// Set while a node runs [`sync::ConfigSync::announce`]: its writes then send one NOTIFY per
    /// [`sync::NOTIFY_GAP`] at most between them instead of one each. Shared with the
    /// workers' stores ([`Store::with_own_pool`]): the node's writes share one announcer.
    announcer: Arc<std::sync::OnceLock<Arc<sync::Announcer>>>,
    /// New entities waiting to share a statement ([`crud::batch`]).
    batches: Arc<crud::batch::Batches>,
    pub backend: Backend,
    pub plugins: Arc<dyn PluginRegistry>,
    /// Kong's tables and the plugins' (from `plugins`).
    pub tables: schema::Tables,
    /// [`schema::Tables::changes_query`], built once.
    changes_sql: Arc<str>,
    options: StoreOptions,
}

/// A PostgreSQL URL with the connections' `application_name` (unless it names one).
fn application_name(url: &str, name: &str) -> String {
    if url.contains("application_name=") {
        return url.to_string();
    }
    let sep = if url.contains('?') { '&' } else { '?' };
    let name: String = name
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    format!("{url}{sep}application_name={name}")
}

/// A pool that connects on first use (a node starts, on its last good config, even while the
/// database is down), on the runtime that first uses it; `name` is its connections'
/// `application_name` on PostgreSQL.
fn lazy_pool(options: &StoreOptions, name: &str) -> Result<AnyPool, StoreError> {
    let url = match options.backend {
        Backend::Postgres => application_name(&options.url, name),
        Backend::Sqlite => options.url.clone(),
    };
    AnyPoolOptions::new()
        .max_connections(options.pool_size.max(1))
        .min_connections(0)
        .acquire_timeout(options.timeout)
        .idle_timeout(options.keepalive)
        .connect_lazy(&url)
        .map_err(|e| StoreError::Database(e.to_string()))
}

/// The pool for a store's single statements ([`direct`]): on PostgreSQL, its own
/// connections (under the same `application_name`); on SQLite, `pool`.
fn direct_pool(
    options: &StoreOptions,
    name: &str,
    pool: &AnyPool,
) -> Result<direct::Direct, StoreError> {
    match options.backend {
        Backend::Postgres => direct::Direct::postgres(
            application_name(&options.url, name),
            options.pool_size.max(1) as usize,
            options.timeout,
            options.keepalive,
        ),
        Backend::Sqlite => Ok(direct::Direct::Sqlite(pool.clone())),
    }
}

/// The state of a store's schema, as `migrations status` reports it.
#[derive(Debug, PartialEq, Eq)]
pub enum SchemaState {
    /// No Turnpike tables yet: needs `migrations bootstrap`.
    Empty,
    /// Tables at this schema version.
    At(i64),
}

impl Store {
    /// Opens a connection pool. Does not create or check tables (see [`Store::schema_state`]).
    pub async fn connect(
        options: StoreOptions,
        plugins: Arc<dyn PluginRegistry>,
    ) -> Result<Store, StoreError> {
        sqlx::any::install_default_drivers();
        let pool = lazy_pool(&options, "turnpike")?;
        if options.backend == Backend::Sqlite {
            // WAL: readers (the config loader, Admin API reads) never wait for a writer.
            sqlx::query("PRAGMA journal_mode=WAL")
                .execute(&pool)
                .await?;
        }
        let tables = schema::Tables::new(&*plugins);
        Ok(Store {
            direct: direct_pool(&options, "turnpike", &pool)?,
            announcer: Default::default(),
            batches: Default::default(),
            pool,
            backend: options.backend,
            tables,
            changes_sql: tables.changes_query().into(),
            plugins,
            options,
        })
    }

    /// The same store on a connection pool of its own, for one thread's store work: a proxy
    /// worker's credential look-ups and writes (oauth2's tokens and codes), which then run on
    /// the worker's runtime rather than queue behind the Admin API's work on the control
    /// plane's lower-priority thread (Kong's `pg_pool_size` is per worker too). Its writes
    /// share the node's announcer. The pool connects lazily on the runtime this is called
    /// from, and must be used there. `name` is the connections' `application_name` on
    /// PostgreSQL (what `pg_stat_activity` shows an operator).
    pub fn with_own_pool(&self, name: &str) -> Result<Store, StoreError> {
        let pool = lazy_pool(&self.options, name)?;
        Ok(Store {
            direct: direct_pool(&self.options, name, &pool)?,
            announcer: self.announcer.clone(),
            batches: Default::default(),
            pool,
            backend: self.backend,
            plugins: self.plugins.clone(),
            tables: self.tables,
            changes_sql: self.changes_sql.clone(),
            options: self.options.clone(),
        })
    }

    /// Closes the pool's idle connections, so that those opened next open from the calling
    /// thread. A SQLite connection runs on a thread of its own, which takes the CPU priority
    /// of the thread that opened it: a control plane that lowers its priority after its first
    /// connections were opened renews them (PostgreSQL's connections have no such thread;
    /// there this only reconnects). Returns how many were closed.
    ///
    /// A connection in use at that moment (the first config load's, a start-up task's) is
    /// renewed once it is returned: the pool is watched for up to two seconds until every
    /// connection opened before the call is gone (those opened since open from here).
    pub async fn renew_idle_connections(&self) -> usize {
        let mut closed = 0;
        let before = self.pool.size() as usize;
        for _ in 0..100 {
            while let Some(c) = self.pool.try_acquire() {
                if let Err(e) = c.close().await {
                    tracing::debug!("store: closing an idle connection: {e}");
                }
                closed += 1;
            }
            if closed >= before || self.pool.size() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        closed
    }

    /// PostgreSQL's `max_connections`.
    pub async fn max_connections(&self) -> Result<i64, StoreError> {
        let v: String = sqlx::query("SELECT current_setting('max_connections')")
            .fetch_one(&self.pool)
            .await?
            .try_get(0)?;
        v.parse()
            .map_err(|_| StoreError::Database(format!("max_connections: {v}")))
    }

    pub fn options(&self) -> &StoreOptions {
        &self.options
    }

    /// The tables of enabled plugins' entities that the database does not have yet (a plugin
    /// with entities enabled after the schema was made: Kong's pending plugin migrations).
    pub async fn missing_tables(&self) -> Result<Vec<&'static str>, StoreError> {
        let mut missing = Vec::new();
        for spec in self.tables.iter() {
            let sql = match self.backend {
                Backend::Sqlite => {
                    "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = $1"
                }
                Backend::Postgres => {
                    "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = current_schema() AND table_name = $1"
                }
            };
            let n = sqlx::query(sql)
                .bind(spec.table)
                .fetch_one(&self.pool)
                .await?
                .try_get::<i64, _>(0)?;
            if n == 0 {
                missing.push(spec.table);
            }
        }
        Ok(missing)
    }

    /// Whether the schema exists and at which version.
    pub async fn schema_state(&self) -> Result<SchemaState, StoreError> {
        let exists = match self.backend {
            Backend::Sqlite => sqlx::query(
                "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'turnpike_meta'",
            ),
            Backend::Postgres => sqlx::query(
                "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = current_schema() AND table_name = 'turnpike_meta'",
            ),
        }
        .fetch_one(&self.pool)
        .await?
        .try_get::<i64, _>(0)?;
        if exists == 0 {
            return Ok(SchemaState::Empty);
        }
        let v = sqlx::query("SELECT value FROM turnpike_meta WHERE name = 'schema_version'")
            .fetch_optional(&self.pool)
            .await?
            .map(|r| r.try_get::<i64, _>(0))
            .transpose()?
            .unwrap_or(0);
        Ok(SchemaState::At(v))
    }

    /// Creates every table (Kong's `migrations bootstrap`); harmless when they exist.
    pub async fn bootstrap(&self) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        if self.backend == Backend::Postgres {
            // Two nodes bootstrapping at once must not race on CREATE TABLE.
            sqlx::query("SELECT pg_advisory_xact_lock(7305183)")
                .execute(&mut *tx)
                .await?;
        }
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS turnpike_meta (name TEXT PRIMARY KEY, value BIGINT NOT NULL)",
        )
        .execute(&mut *tx)
        .await?;
        for spec in self.tables.iter() {
            for stmt in schema::ddl(spec, self.tables.has_ttl(spec.table)) {
                sqlx::query(&stmt).execute(&mut *tx).await?;
            }
        }
        // Schema 5: ttl tables made before it get their `expires_at` column, filled from the
        // expiry each row carries in its entity.
        for table in self.tables.ttl_tables() {
            let sql = match self.backend {
                Backend::Sqlite => format!(
                    "SELECT COUNT(*) FROM pragma_table_info('{table}') WHERE name = 'expires_at'"
                ),
                Backend::Postgres => format!(
                    "SELECT COUNT(*) FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = '{table}' AND column_name = 'expires_at'"
                ),
            };
            let has_column = sqlx::query(&sql)
                .fetch_one(&mut *tx)
                .await?
                .try_get::<i64, _>(0)?
                > 0;
            if !has_column {
                sqlx::query(&format!("ALTER TABLE {table} ADD COLUMN expires_at BIGINT"))
                    .execute(&mut *tx)
                    .await?;
                let from_entity = match self.backend {
                    Backend::Sqlite => "CAST(json_extract(entity, '$._expires_at') AS BIGINT)",
                    Backend::Postgres => "CAST(CAST(entity AS json)->>'_expires_at' AS BIGINT)",
                };
                sqlx::query(&format!(
                    "UPDATE {table} SET expires_at = {from_entity} WHERE entity LIKE '%_expires_at%'"
                ))
                .execute(&mut *tx)
                .await?;
            }
            sqlx::query(&schema::expires_index(table))
                .execute(&mut *tx)
                .await?;
        }
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS tags (entity_id TEXT NOT NULL, entity_name TEXT NOT NULL, tag TEXT NOT NULL, PRIMARY KEY (entity_id, tag))",
        )
        .execute(&mut *tx)
        .await?;
        sqlx::query("CREATE INDEX IF NOT EXISTS tags_tag ON tags (tag, entity_name)")
            .execute(&mut *tx)
            .await?;
        // Which rows each config version touched: lets a node apply only what changed.
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS changes (version BIGINT NOT NULL, entity_name TEXT NOT NULL, entity_id TEXT NOT NULL)",
        )
        .execute(&mut *tx)
        .await?;
        sqlx::query("CREATE INDEX IF NOT EXISTS changes_version ON changes (version)")
            .execute(&mut *tx)
            .await?;
        // rate-limiting's cluster policy: one row per counter window (Kong's table and key).
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS ratelimiting_metrics (identifier TEXT NOT NULL, period TEXT NOT NULL, period_date BIGINT NOT NULL, service_id TEXT NOT NULL, route_id TEXT NOT NULL, value BIGINT NOT NULL, expire_at BIGINT NOT NULL, PRIMARY KEY (identifier, period, period_date, service_id, route_id))",
        )
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "CREATE INDEX IF NOT EXISTS ratelimiting_metrics_expire ON ratelimiting_metrics (expire_at)",
        )
        .execute(&mut *tx)
        .await?;
        // Schema 6: response-ratelimiting's cluster policy (Kong's table and key; `period` is
        // the limit's name and its period, `videos_minute`).
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS response_ratelimiting_metrics (identifier TEXT NOT NULL, period TEXT NOT NULL, period_date BIGINT NOT NULL, service_id TEXT NOT NULL, route_id TEXT NOT NULL, value BIGINT NOT NULL, expire_at BIGINT NOT NULL, PRIMARY KEY (identifier, period, period_date, service_id, route_id))",
        )
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "CREATE INDEX IF NOT EXISTS response_ratelimiting_metrics_expire ON response_ratelimiting_metrics (expire_at)",
        )
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "INSERT INTO turnpike_meta (name, value) VALUES ('config_version', 0) ON CONFLICT (name) DO NOTHING",
        )
        .execute(&mut *tx)
        .await?;
        // Bootstrap and `migrations up` both end at this build's schema version.
        sqlx::query(
            "INSERT INTO turnpike_meta (name, value) VALUES ('schema_version', $1) ON CONFLICT (name) DO UPDATE SET value = excluded.value",
        )
        .bind(SCHEMA_VERSION)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Drops every Turnpike table (Kong's `migrations reset`).
    pub async fn reset(&self) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        for t in [
            "tags",
            "changes",
            "ratelimiting_metrics",
            "response_ratelimiting_metrics",
        ] {
            sqlx::query(&format!("DROP TABLE IF EXISTS {t}"))
                .execute(&mut *tx)
                .await?;
        }
        for spec in self.tables.iter().rev() {
            sqlx::query(&format!("DROP TABLE IF EXISTS {}", spec.table))
                .execute(&mut *tx)
                .await?;
        }
        sqlx::query("DROP TABLE IF EXISTS turnpike_meta")
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// The config version: bumped by every committed write.
    pub async fn config_version(&self) -> Result<i64, StoreError> {
        Ok(
            sqlx::query("SELECT value FROM turnpike_meta WHERE name = 'config_version'")
                .fetch_one(&self.pool)
                .await?
                .try_get::<i64, _>(0)?,
        )
    }

    /// Whether the database answers (for `GET /status`).
    pub async fn reachable(&self) -> bool {
        sqlx::query("SELECT 1").execute(&self.pool).await.is_ok()
    }
}

/// Seconds since the epoch, Kong's entity timestamps.
pub fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

pub fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

impl Store {
    /// From now on this store's writes share their notifications to other nodes through the
    /// returned announcer ([`sync::ConfigSync::announce`] sends those they leave to it).
    pub(crate) fn announce_writes_later(&self) -> Arc<sync::Announcer> {
        self.announcer.get_or_init(Default::default).clone()
    }

    /// Whether the write about to be sent notifies other nodes itself (in its own statement):
    /// always without a node's announcer (a CLI command), else when it is the first of a gap.
    pub(crate) fn notifies_inline(&self) -> bool {
        self.backend == Backend::Postgres && self.announcer.get().is_none_or(|a| a.claim())
    }

    /// After a committed write that sent no NOTIFY: the announcer (if any) owes other nodes
    /// one.
    pub(crate) fn written(&self) {
        if let Some(a) = self.announcer.get() {
            a.owed();
        }
    }

    /// Tells every listening node (PostgreSQL's NOTIFY) that the config version moved.
    pub(crate) async fn notify_nodes(&self) -> Result<(), StoreError> {
        let mut conn = self.direct.get().await?;
        let sent = sqlx::query(&format!("SELECT pg_notify('{NOTIFY_CHANNEL}', '')::text"))
            .execute(&mut *conn)
            .await;
        conn.seen(sent).map(|_| ())
    }

    /// Deletes rows whose `ttl` ran out (Kong's ttl cleanup), `batch` rows per statement so
    /// that a table of millions never holds a long lock; returns the rows deleted. Expired
    /// rows already read as absent, so no node needs telling.
    pub async fn purge_expired(&self, now: i64, batch: i64) -> Result<u64, StoreError> {
        let mut total = 0;
        for table in self.tables.ttl_tables() {
            let mut purged = 0;
            loop {
                let n = sqlx::query(&format!(
                    "DELETE FROM {table} WHERE id IN (SELECT id FROM {table} WHERE expires_at <= $1 LIMIT $2)"
                ))
                .bind(now)
                .bind(batch)
                .execute(&self.pool)
                .await?
                .rows_affected();
                purged += n;
                if (n as i64) < batch {
                    break;
                }
            }
            // Their tags go with them (a write of a new entity does not clear tags first).
            if purged > 0 {
                sqlx::query(&format!(
                    "DELETE FROM tags WHERE entity_name = $1 AND entity_id NOT IN (SELECT id FROM {table})"
                ))
                .bind(table)
                .execute(&self.pool)
                .await?;
            }
            total += purged;
        }
        Ok(total)
    }
}

#[cfg(test)]
mod tests {
    use super::application_name;

    #[test]
    fn connections_are_named_unless_the_url_names_them() {
        assert_eq!(
            application_name("postgres://u@h:5432/d?sslmode=disable", "turnpike-worker-0"),
            "postgres://u@h:5432/d?sslmode=disable&application_name=turnpike-worker-0"
        );
        assert_eq!(
            application_name("postgres://u@h/d", "a b"),
            "postgres://u@h/d?application_name=a%20b"
        );
        let named = "postgres://u@h/d?application_name=mine";
        assert_eq!(application_name(named, "turnpike"), named);
    }
}
