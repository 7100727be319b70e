//! The rate-limiting plugins' `cluster` policy counters, in the node's database: Kong's
//! `ratelimiting_metrics` (rate-limiting: checked and counted in one transaction) and
//! `response_ratelimiting_metrics` (response-ratelimiting: read in the access phase, added to
//! in the log phase with what the upstream said a response cost).

use sqlx::Row;

use crate::{Store, StoreError};

/// One window of a rate-limiting counter (the cluster policy).
#[derive(Debug, Clone)]
pub struct CounterWindow {
    pub route_id: String,
    pub service_id: String,
    pub identifier: String,
    pub period: &'static str,
    pub period_date: i64,
    pub limit: i64,
    pub expire_at: i64,
}

/// One window of one named limit of response-ratelimiting (the cluster policy).
#[derive(Debug, Clone)]
pub struct ResponseCounter {
    pub route_id: String,
    pub service_id: String,
    pub identifier: String,
    /// The limit's name and the window's period (`videos_minute`), as Kong keys it.
    pub period: String,
    /// The window's start, in milliseconds (Kong's `period_date`).
    pub period_date: i64,
    /// When the row may be deleted (the window's end), in seconds.
    pub expire_at: i64,
}

impl Store {
    /// Counts a request in every window, exactly: in one transaction each window's row is
    /// incremented only while under its limit; when one is full the transaction is rolled
    /// back. Returns `[blocked window (1-based) or 0, count per window...]` (counts after the
    /// increment when allowed; as they were, for the windows checked, when blocked).
    pub async fn count_request(&self, windows: &[CounterWindow]) -> Result<Vec<i64>, StoreError> {
        let mut conn = self.direct.get().await?;
        let counted = Self::count_on(&mut conn, windows).await;
        conn.seen(counted)
    }

    async fn count_on(
        conn: &mut sqlx::AnyConnection,
        windows: &[CounterWindow],
    ) -> Result<Vec<i64>, StoreError> {
        use sqlx::Connection;
        let mut tx = conn.begin().await?;
        let mut out = vec![0i64];
        for (i, w) in windows.iter().enumerate() {
            let row = sqlx::query(
                "INSERT INTO ratelimiting_metrics (identifier, period, period_date, service_id, route_id, value, expire_at) \
                 VALUES ($1, $2, $3, $4, $5, 1, $6) \
                 ON CONFLICT (identifier, period, period_date, service_id, route_id) \
                 DO UPDATE SET value = ratelimiting_metrics.value + 1 WHERE ratelimiting_metrics.value < $7 \
                 RETURNING value",
            )
            .bind(&w.identifier)
            .bind(w.period)
            .bind(w.period_date)
            .bind(&w.service_id)
            .bind(&w.route_id)
            .bind(w.expire_at)
            .bind(w.limit)
            .fetch_optional(&mut *tx)
            .await?;
            match row {
                Some(r) if w.limit >= 1 => out.push(r.try_get::<i64, _>(0)?),
                _ => {
                    tx.rollback().await?;
                    // As they were: the earlier windows' increments are undone.
                    for c in out.iter_mut().skip(1) {
                        *c -= 1;
                    }
                    out[0] = i as i64 + 1;
                    out.push(w.limit);
                    return Ok(out);
                }
            }
        }
        tx.commit().await?;
        Ok(out)
    }

    /// What each response-ratelimiting window has used so far (0 for a window not counted yet).
    pub async fn response_usage(
        &self,
        counters: &[ResponseCounter],
    ) -> Result<Vec<i64>, StoreError> {
        let mut conn = self.direct.get().await?;
        let mut out = Vec::with_capacity(counters.len());
        let mut read = Ok(());
        for c in counters {
            let row = sqlx::query(
                "SELECT value FROM response_ratelimiting_metrics WHERE identifier = $1 AND period = $2 AND period_date = $3 AND service_id = $4 AND route_id = $5",
            )
            .bind(&c.identifier)
            .bind(&c.period)
            .bind(c.period_date)
            .bind(&c.service_id)
            .bind(&c.route_id)
            .fetch_optional(&mut *conn)
            .await;
            match row {
                Ok(r) => out.push(r.map(|r| r.try_get::<i64, _>(0)).transpose()?.unwrap_or(0)),
                Err(e) => {
                    read = Err(e);
                    break;
                }
            }
        }
        conn.seen(read)?;
        Ok(out)
    }

    /// Adds what a response spent to each of its windows (Kong's `increment`), in one
    /// transaction.
    pub async fn response_add(
        &self,
        counters: &[(ResponseCounter, i64)],
    ) -> Result<(), StoreError> {
        let mut conn = self.direct.get().await?;
        let added = Self::response_add_on(&mut conn, counters).await;
        conn.seen(added)
    }

    async fn response_add_on(
        conn: &mut sqlx::AnyConnection,
        counters: &[(ResponseCounter, i64)],
    ) -> Result<(), StoreError> {
        use sqlx::Connection;
        let mut tx = conn.begin().await?;
        for (c, n) in counters {
            sqlx::query(
                "INSERT INTO response_ratelimiting_metrics (identifier, period, period_date, service_id, route_id, value, expire_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7) \
                 ON CONFLICT (identifier, period, period_date, service_id, route_id) \
                 DO UPDATE SET value = response_ratelimiting_metrics.value + excluded.value",
            )
            .bind(&c.identifier)
            .bind(&c.period)
            .bind(c.period_date)
            .bind(&c.service_id)
            .bind(&c.route_id)
            .bind(*n)
            .bind(c.expire_at)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Deletes counter rows whose window has ended (both plugins' tables).
    pub async fn purge_counters(&self, now: i64) -> Result<u64, StoreError> {
        let mut n = 0;
        for table in ["ratelimiting_metrics", "response_ratelimiting_metrics"] {
            n += sqlx::query(&format!("DELETE FROM {table} WHERE expire_at < $1"))
                .bind(now)
                .execute(&self.pool)
                .await?
                .rows_affected();
        }
        Ok(n)
    }
}
