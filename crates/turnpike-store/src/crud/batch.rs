//! PostgreSQL: new entities written at the same time share one statement (group commit).
//!
//! `Store::insert_at_once` writes a plain new entity in one statement. Writers at hundreds a
//! second (oauth2 tokens through `POST /oauth2_tokens`) each paid that statement's fixed
//! costs: a round trip, executor start-up, a commit, the WAL writer's wake-up, and the version
//! row's lock, which serialises every write of the cluster. Here the rows of one shape (same
//! table, columns and conditions) that arrive while a statement of that shape is running wait
//! for it and then go together, in one statement with one version each: a lone write goes at
//! once (no timer), a burst in batches of up to [`MAX_ROWS`].
//!
//! The statement is all or nothing. When its checks fail, or a constraint stops it (a key
//! taken by a racing write or by another row of the batch), no row is written, and each row is
//! written alone, which gives each its own answer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use sqlx::Row;
use tokio::sync::oneshot;

use super::write::{bind_all, marks, Bind, PRUNE_CHANGES};
use crate::direct::Direct;
use crate::sync::Announcer;
use crate::{StoreError, NOTIFY_CHANNEL};

/// Rows a statement takes at most (each binds its columns and conditions: well under
/// PostgreSQL's 65,535 parameters).
const MAX_ROWS: usize = 64;

/// What rows of one statement have in common.
pub(super) struct Shape {
    pub(super) table: &'static str,
    pub(super) cols: Vec<String>,
    /// Each condition up to its bound value: `NOT EXISTS (SELECT 1 FROM t WHERE k = $`.
    pub(super) conds: Vec<String>,
}

impl Shape {
    fn key(&self) -> String {
        format!(
            "{}\n{}\n{}",
            self.table,
            self.cols.join(","),
            self.conds.join("\n"),
        )
    }

    /// The statement writing `rows` rows: returns the last version it made. `notify`: it
    /// sends the NOTIFY itself.
    fn sql(&self, rows: usize, notify: bool) -> String {
        let (n, c) = (self.cols.len(), self.conds.len());
        let base = |j: usize| j * (n + c);
        let conds: Vec<String> = (0..rows)
            .flat_map(|j| {
                self.conds
                    .iter()
                    .enumerate()
                    .map(move |(i, cond)| format!("{cond}{})", base(j) + n + 1 + i))
            })
            .collect();
        let values: Vec<String> = (0..rows)
            .map(|j| format!("SELECT {} FROM bump", marks(base(j) + 1, n)))
            .collect();
        let changes: Vec<String> = (0..rows)
            .map(|j| {
                format!(
                    "SELECT value - {}, '{}', ${} FROM bump",
                    rows - 1 - j,
                    self.table,
                    base(j) + 1
                )
            })
            .collect();
        format!(
            "WITH ok AS (SELECT 1 WHERE {conds}), \
             bump AS (UPDATE turnpike_meta SET value = value + {rows} WHERE name = 'config_version' AND EXISTS (SELECT 1 FROM ok) RETURNING value), \
             ins AS (INSERT INTO {table} ({cols}) {values}), \
             chg AS (INSERT INTO changes (version, entity_name, entity_id) {changes}) \
             SELECT value{notify} FROM bump",
            conds = if conds.is_empty() { "TRUE".into() } else { conds.join(" AND ") },
            table = self.table,
            cols = self.cols.join(", "),
            values = values.join(" UNION ALL "),
            changes = changes.join(" UNION ALL "),
            notify = if notify {
                format!(", pg_notify('{NOTIFY_CHANNEL}', '')::text")
            } else {
                String::new()
            },
        )
    }
}

/// One row's values: its columns' (id first), then its conditions'.
pub(super) struct RowBinds {
    pub(super) vals: Vec<Bind>,
    pub(super) conds: Vec<String>,
}

/// How a row's write went.
pub(super) enum Outcome {
    Written,
    /// Not written: its statement's checks failed or a constraint stopped it. `alone`: it
    /// was the statement's only row.
    Refused {
        alone: bool,
    },
}

struct Waiting {
    row: RowBinds,
    done: oneshot::Sender<Result<Outcome, StoreError>>,
}

#[derive(Default)]
struct Queue {
    rows: Vec<Waiting>,
    running: bool,
}

/// The rows waiting for a statement, by shape.
#[derive(Default)]
pub(crate) struct Batches {
    queues: Mutex<HashMap<String, Queue>>,
}

impl Batches {
    /// Writes `row` with whichever rows of its shape are waiting when a statement is free.
    /// `announce`: a node's announcer (without one, every statement notifies).
    pub(super) async fn write(
        self: &Arc<Self>,
        direct: &Direct,
        shape: Shape,
        row: RowBinds,
        announce: Option<Arc<Announcer>>,
    ) -> Result<Outcome, StoreError> {
        let key = shape.key();
        let (done, outcome) = oneshot::channel();
        let lead = {
            let mut queues = self.queues.lock().unwrap_or_else(|e| e.into_inner());
            let q = queues.entry(key.clone()).or_default();
            q.rows.push(Waiting { row, done });
            !std::mem::replace(&mut q.running, true)
        };
        if lead {
            // Its own task: the rows of others must not depend on this request's future.
            tokio::spawn(self.clone().lead(key, shape, direct.clone(), announce));
        }
        outcome
            .await
            .unwrap_or_else(|_| Err(StoreError::Database("write batch lost".into())))
    }

    /// Runs statements of one shape while rows of it wait.
    async fn lead(
        self: Arc<Self>,
        key: String,
        shape: Shape,
        direct: Direct,
        announce: Option<Arc<Announcer>>,
    ) {
        loop {
            let batch: Vec<Waiting> = {
                let mut queues = self.queues.lock().unwrap_or_else(|e| e.into_inner());
                let Some(q) = queues.get_mut(&key) else {
                    return;
                };
                if q.rows.is_empty() {
                    queues.remove(&key);
                    return;
                }
                let take = q.rows.len().min(MAX_ROWS);
                q.rows.drain(..take).collect()
            };
            let (rows, senders): (Vec<RowBinds>, Vec<_>) =
                batch.into_iter().map(|w| (w.row, w.done)).unzip();
            let notifies = announce.as_ref().is_none_or(|a| a.claim());
            let result = run(&direct, &shape, &rows, notifies).await;
            if let (Ok(true), Some(a), false) = (&result, &announce, notifies) {
                a.owed();
            }
            let alone = rows.len() == 1;
            for done in senders {
                let _ = done.send(match &result {
                    Ok(true) => Ok(Outcome::Written),
                    Ok(false) => Ok(Outcome::Refused { alone }),
                    Err(e) => Err(e.again()),
                });
            }
        }
    }
}

/// Writes `rows` in one statement: `true` when written, `false` when refused (nothing kept).
pub(super) async fn run(
    direct: &Direct,
    shape: &Shape,
    rows: &[RowBinds],
    notify: bool,
) -> Result<bool, StoreError> {
    let sql = shape.sql(rows.len(), notify);
    let q = rows.iter().fold(sqlx::query(&sql), |q, r| {
        r.conds
            .iter()
            .fold(bind_all(q, &r.vals), |q, v| q.bind(v.as_str()))
    });
    let mut conn = direct.get().await?;
    let written = q.fetch_optional(&mut *conn).await;
    let version: i64 = match written {
        Ok(Some(r)) => r.try_get(0)?,
        Ok(None) => return Ok(false),
        Err(sqlx::Error::Database(d)) if matches!(d.code().as_deref(), Some("23505" | "23503")) => {
            return Ok(false)
        }
        Err(e) => return Err(conn.seen::<(), _>(Err(e)).unwrap_err()),
    };
    // See PRUNE_CHANGES: when this statement's versions passed a multiple of 64.
    let first = version - rows.len() as i64 + 1;
    if version.div_euclid(64) != (first - 1).div_euclid(64) {
        let pruned = sqlx::query(PRUNE_CHANGES)
            .bind(version - 10000)
            .execute(&mut *conn)
            .await;
        conn.seen(pruned)?;
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_statement_for_many_rows_numbers_each_rows_values_and_versions() {
        let shape = Shape {
            table: "keyauth_credentials",
            cols: vec!["id".into(), "key".into()],
            conds: vec!["EXISTS (SELECT 1 FROM consumers WHERE id = $".into()],
        };
        let sql = shape.sql(2, false);
        assert!(sql.contains("WHERE EXISTS (SELECT 1 FROM consumers WHERE id = $3) AND EXISTS (SELECT 1 FROM consumers WHERE id = $6)"), "{sql}");
        assert!(sql.contains("SET value = value + 2"), "{sql}");
        assert!(
            sql.contains("SELECT $1, $2 FROM bump UNION ALL SELECT $4, $5 FROM bump"),
            "{sql}"
        );
        assert!(
            sql.contains("SELECT value - 1, 'keyauth_credentials', $1 FROM bump UNION ALL SELECT value - 0, 'keyauth_credentials', $4 FROM bump"),
            "{sql}"
        );
        assert!(!sql.contains("pg_notify"), "{sql}");
        let one = shape.sql(1, true);
        assert!(one.contains("SET value = value + 1 "), "{one}");
        assert!(
            one.ends_with("SELECT value, pg_notify('turnpike_config', '')::text FROM bump"),
            "{one}"
        );
    }
}
