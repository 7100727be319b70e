//! Connections for the store's single-statement work on PostgreSQL: credential look-ups on a
//! proxy worker's cache miss, the one-statement insert (oauth2 tokens at hundreds a second),
//! the cluster rate-limiting counters.
//!
//! sqlx's pool checks a connection with a round trip (`Sync`, wait for `ReadyForQuery`) when
//! it hands it out and again when it takes it back: three round trips, and three wake-ups of
//! a PostgreSQL backend, for a one-statement query. At 1,500 token writes a second that was
//! most of PostgreSQL's CPU per write (#24). Here a connection goes back to the pool as it is
//! and is checked only when that can find something: after it sat idle for a second (the
//! server may have closed it meanwhile), or after a use of it failed the way a lost connection
//! fails (then it is closed, not reused). A query left unfinished (its future dropped) needs
//! no check either: sqlx reads the rest of the earlier exchange before its next query.
//!
//! SQLite keeps sqlx's pool: its "round trip" is a channel to its own thread.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use deadpool::managed::{self, Metrics, RecycleError, RecycleResult};
use sqlx::AnyConnection;
use sqlx::{AnyPool, Connection};

use crate::StoreError;

/// How long a connection may sit idle before it is checked when next handed out.
const IDLE_CHECK: Duration = Duration::from_secs(1);

/// A PostgreSQL connection as the pool keeps it.
pub struct Live {
    raw: AnyConnection,
    /// A use of it failed as a lost connection does: close it instead of reusing it.
    lost: bool,
}

pub struct Connector {
    url: String,
}

impl managed::Manager for Connector {
    type Type = Live;
    type Error = sqlx::Error;

    async fn create(&self) -> Result<Live, sqlx::Error> {
        Ok(Live {
            raw: AnyConnection::connect(&self.url).await?,
            lost: false,
        })
    }

    async fn recycle(&self, conn: &mut Live, metrics: &Metrics) -> RecycleResult<sqlx::Error> {
        if conn.lost {
            return Err(RecycleError::message("lost"));
        }
        if metrics.last_used() >= IDLE_CHECK {
            conn.raw.ping().await?;
        }
        Ok(())
    }
}

/// Where a store's single statements run: sqlx's pool on SQLite, [`Connector`]'s on
/// PostgreSQL.
#[derive(Clone)]
pub enum Direct {
    Sqlite(AnyPool),
    Postgres(Arc<Kept>),
}

/// A PostgreSQL pool and whether its idle connections are being swept.
pub struct Kept {
    pool: managed::Pool<Connector>,
    /// Idle connections are closed after this long (`pg_keepalive_timeout`): a node at rest
    /// holds none. `None`: kept.
    keepalive: Option<Duration>,
    swept: AtomicBool,
}

/// Closes the connections idle for `keepalive`, until the pool is dropped.
async fn sweep(pool: std::sync::Weak<Kept>, keepalive: Duration) {
    loop {
        tokio::time::sleep((keepalive / 4).max(Duration::from_millis(100))).await;
        let Some(kept) = pool.upgrade() else {
            return;
        };
        kept.pool.retain(|_, m| m.last_used() < keepalive);
    }
}

impl Direct {
    /// `size` connections at most, made on first use; waiting for one up to `timeout`;
    /// closed after `keepalive` idle.
    pub fn postgres(
        url: String,
        size: usize,
        timeout: Duration,
        keepalive: Option<Duration>,
    ) -> Result<Direct, StoreError> {
        managed::Pool::builder(Connector { url })
            .max_size(size.max(1))
            .wait_timeout(Some(timeout))
            .create_timeout(Some(timeout))
            .recycle_timeout(Some(timeout))
            .runtime(deadpool::Runtime::Tokio1)
            .build()
            .map(|pool| {
                Direct::Postgres(Arc::new(Kept {
                    pool,
                    keepalive,
                    swept: AtomicBool::new(false),
                }))
            })
            .map_err(|e| StoreError::Database(e.to_string()))
    }

    /// A connection for one piece of work; report its outcome with [`Conn::seen`].
    pub async fn get(&self) -> Result<Conn, StoreError> {
        let kept = match self {
            Direct::Sqlite(pool) => return Ok(Conn::Sqlite(pool.acquire().await?)),
            Direct::Postgres(kept) => kept,
        };
        // Swept on the runtime that uses it (a proxy worker's own).
        if let Some(keepalive) = kept.keepalive {
            if !kept.swept.swap(true, Ordering::Relaxed) {
                tokio::spawn(sweep(Arc::downgrade(kept), keepalive));
            }
        }
        match kept.pool.get().await {
            Ok(c) => Ok(Conn::Postgres(c)),
            Err(managed::PoolError::Backend(e)) => Err(e.into()),
            Err(e) => Err(StoreError::Unavailable(e.to_string())),
        }
    }
}

/// A connection handed out by [`Direct::get`].
pub enum Conn {
    Sqlite(sqlx::pool::PoolConnection<sqlx::Any>),
    Postgres(managed::Object<Connector>),
}

impl Conn {
    /// Notes the outcome of a use: after a lost connection's error it is closed when
    /// dropped. Returns the outcome, converted.
    pub fn seen<T, E: Into<StoreError>>(&mut self, r: Result<T, E>) -> Result<T, StoreError> {
        let r = r.map_err(Into::into);
        if let (Conn::Postgres(c), Err(StoreError::Unavailable(_))) = (&mut *self, &r) {
            c.lost = true;
        }
        r
    }
}

impl std::ops::Deref for Conn {
    type Target = AnyConnection;
    fn deref(&self) -> &AnyConnection {
        match self {
            Conn::Sqlite(c) => c,
            Conn::Postgres(c) => &c.raw,
        }
    }
}

impl std::ops::DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut AnyConnection {
        match self {
            Conn::Sqlite(c) => &mut *c,
            Conn::Postgres(c) => &mut c.raw,
        }
    }
}
