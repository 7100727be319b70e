//! `config db_import` into an empty store, in bulk: every entity validated as a write is
//! (the same `entity::check`, credentials' hashing included), its references checked against
//! the entities of the same import, then the rows and their tags written many to a statement,
//! in one transaction. Entity by entity, 10k services and routes with 100k consumers took ~33x
//! the time the same file takes to load DB-less, five or six statements each.
//!
//! The import writes no change-log entries: its version has none, which every node's sync
//! reads as a gap and answers with a full read of the store, what 130k entries would have
//! led to anyway (more than a delta is allowed to hold), and the 130k rows and their index
//! were a sixth of the import's time.
//!
//! The checks and the statements are made while the database executes the previous statement:
//! a writer that holds the transaction takes [`Job`]s from a queue of one, and the two run
//! joined in the same task (the checks yield whenever the queue is full). Done one after the
//! other, PostgreSQL's 0.9 s of inserts waited for the 0.6 s of checks and binds before them.
//!
//! Only into tables that are empty: with rows already there, an import may update them and
//! collide with their unique keys, which the entity-by-entity path answers with Kong's
//! errors ([`Store::import`] takes that path then).

use std::collections::HashSet;

use tokio::sync::{mpsc, oneshot};

use super::export::in_entity;
use super::write::{self, Bind};
use super::*;

/// Rows of one table waiting for their statement, all with the same columns.
struct Pending {
    cols: Vec<String>,
    vals: Vec<Bind>,
    rows: usize,
}

/// At most this many values a statement. PostgreSQL allows 65,535, SQLite 32,766. On SQLite
/// the marks are anonymous (`?`): sqlx binds each value by asking SQLite the name of its
/// parameter, a linear scan of the statement's named ones, so `$n` marks cost n² a statement
/// (30,000 of them made an import 2.6x slower than writing entity by entity; at 240 a
/// statement the lookups were still a tenth of the import).
fn max_values(backend: crate::Backend) -> usize {
    match backend {
        crate::Backend::Sqlite => 30_000,
        crate::Backend::Postgres => 30_000,
    }
}

impl Store {
    /// Whether every table the config writes to is empty.
    pub(super) async fn tables_empty(
        &self,
        tx: &mut Tx<'_>,
        cfg: &turnpike_config::Config,
    ) -> Result<bool, StoreError> {
        for spec in self.tables.iter() {
            if cfg.table_len(spec.table) == 0 {
                continue;
            }
            let sql = format!("SELECT EXISTS (SELECT 1 FROM {})", spec.table);
            let row = sqlx::query(&sql).fetch_one(&mut **tx).await?;
            let any: bool = match row.try_get::<bool, _>(0) {
                Ok(b) => b,
                Err(_) => row.try_get::<i64, _>(0)? != 0,
            };
            if any {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Statistics for the tables an import filled (see [`Store::import_with_progress`]). On
    /// PostgreSQL only of the columns a look-up filters on (`targets` from
    /// [`Store::import_bulk`]): analysing every table, the entities' text included, took 140
    /// ms after a 100k-consumer import; these take 50.
    pub(super) async fn analyze_filled(&self, targets: &[String]) -> Result<(), StoreError> {
        let sql = match self.backend {
            crate::Backend::Sqlite => "ANALYZE".to_string(),
            crate::Backend::Postgres if targets.is_empty() => return Ok(()),
            crate::Backend::Postgres => format!("ANALYZE {}", targets.join(", ")),
        };
        sqlx::query(&sql).execute(&self.pool).await?;
        Ok(())
    }

    /// Writes the config's entities into empty tables, in bulk (see the module's doc).
    /// `progress(done, total)` is told after each statement. Returns how many entities it
    /// wrote and what to analyse ([`Store::analyze_filled`]).
    pub(super) async fn import_bulk(
        &self,
        w: &mut WriteTx,
        cfg: &turnpike_config::Config,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<(usize, Vec<String>), StoreError> {
        let tx: &mut Tx<'static> = &mut w.tx;
        if self.backend == crate::Backend::Sqlite {
            // SQLite's statement journal (what undoes a multi-row statement that fails half
            // way) in memory rather than a temporary file, and a page cache that holds the
            // import's B-trees (the default 2 MB spilled them to the journal mid-transaction):
            // a fifth of the import's time was those writes. This connection is the import's
            // own (`config db_import` runs in a process of its own).
            sqlx::query("PRAGMA temp_store = MEMORY")
                .execute(&mut **tx)
                .await?;
            sqlx::query("PRAGMA cache_size = -262144")
                .execute(&mut **tx)
                .await?;
        }
        let (jobs, queue) = mpsc::channel(1);
        let checks = self.check_rows(cfg, jobs, progress);
        let writes = self.run_jobs(tx, queue);
        let (checked, written) = futures_util::future::join(checks, writes).await;
        // The writer's failure first: the checks stop with "writer stopped" when it does.
        written?;
        checked
    }

    /// The writer: runs the jobs in order on the import's transaction until the queue closes.
    async fn run_jobs(
        &self,
        tx: &mut Tx<'static>,
        mut queue: mpsc::Receiver<Job>,
    ) -> Result<(), StoreError> {
        while let Some(job) = queue.recv().await {
            match job {
                Job::Insert { sql, vals } => {
                    write::bind_all(sqlx::query(&sql), &vals)
                        .execute(&mut **tx)
                        .await?;
                }
                Job::Resolve { table, key, reply } => {
                    let _ = reply.send(self.resolve_tx(tx, table, &key).await);
                }
                Job::Write {
                    spec,
                    id,
                    body,
                    now,
                    reply,
                } => {
                    let done = Box::pin(self.write(tx, spec, &id, &body, now, None)).await;
                    let _ = reply.send(done.map(|_| ()));
                }
            }
        }
        Ok(())
    }

    /// Every entity checked and its row queued for the writer (see the module's doc).
    async fn check_rows(
        &self,
        cfg: &turnpike_config::Config,
        jobs: mpsc::Sender<Job>,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<(usize, Vec<String>), StoreError> {
        let total: usize = self.tables.iter().map(|s| cfg.table_len(s.table)).sum();
        // What to analyse: each filled table, by the columns it was written with.
        let mut analyze = Vec::new();
        let mut long_way = false;
        let now = now_secs();
        let max = max_values(self.backend);
        // The ids written so far, by table: what a reference may name.
        let mut known: std::collections::HashMap<&str, HashSet<String>> = Default::default();
        let mut count = 0;
        for spec in self.tables.iter() {
            if cfg.table_len(spec.table) == 0 {
                continue;
            }
            let mut columns: Option<Vec<String>> = None;
            let mut batch = Batch {
                table: spec.table,
                max,
                pending: None,
                tags: Vec::new(),
                anonymous: self.backend == crate::Backend::Sqlite,
            };
            for item in cfg.table_json(spec.table) {
                let Value::Object(m) = item else { continue };
                let id = m
                    .get("id")
                    .and_then(|v| v.as_str())
                    .unwrap_or_default()
                    .to_string();
                let named = |e| in_entity(spec.table, &id, e);
                let Checked {
                    mut value,
                    refs,
                    sni_names,
                    reveal: _,
                } = entity::check(spec, &m, &id, now, self.plugins.as_ref())
                    .map_err(StoreError::Schema)
                    .map_err(named)?;
                if sni_names.is_some() {
                    // A certificate with `snis` makes sni entities: written the long way (its
                    // table's rows so far first, which it does not need, but in order).
                    batch.flush(&jobs).await?;
                    long_way = true;
                    let (reply, done) = oneshot::channel();
                    let job = Job::Write {
                        spec,
                        id: id.clone(),
                        body: m,
                        now,
                        reply,
                    };
                    ask(&jobs, job, done).await?.map_err(named)?;
                    known.entry(spec.table).or_default().insert(id);
                    count += 1;
                    continue;
                }
                let mut fk_ids: Vec<(String, Option<String>)> = Vec::new();
                for f in spec.foreign {
                    let key = refs.iter().find(|(r, _)| *r == f.field).map(|(_, k)| k);
                    let resolved = match key {
                        None => None,
                        Some(k) => {
                            let lower = k.to_ascii_lowercase();
                            if known.get(f.table).is_some_and(|ids| ids.contains(&lower)) {
                                Some(lower)
                            } else {
                                // Named by its endpoint key, or not in this import.
                                let (reply, done) = oneshot::channel();
                                let job = Job::Resolve {
                                    table: f.table,
                                    key: k.clone(),
                                    reply,
                                };
                                match ask(&jobs, job, done).await?? {
                                    Some(rid) => Some(rid),
                                    None => {
                                        return Err(named(StoreError::ForeignKey {
                                            field: f.field.into(),
                                            table: f.table.into(),
                                            key: k.clone(),
                                        }))
                                    }
                                }
                            }
                        }
                    };
                    if let Some(rid) = &resolved {
                        value.insert(f.field.into(), json!({ "id": rid }));
                    }
                    fk_ids.push((f.column(), resolved));
                }
                let (uniques, cache_key) = write::keys_of(spec, &value);
                let row = self.row_values(spec, &id, &value, &uniques, &cache_key, &fk_ids)?;
                if columns.is_none() {
                    columns = Some(row.cols.clone());
                }
                let same_cols = batch.pending.as_ref().is_none_or(|p| p.cols == row.cols);
                let full = batch
                    .pending
                    .as_ref()
                    .is_some_and(|p| p.vals.len() + row.vals.len() > max);
                if !same_cols || full {
                    batch.flush(&jobs).await?;
                    progress(count, total);
                }
                let p = batch.pending.get_or_insert_with(|| Pending {
                    cols: row.cols.clone(),
                    vals: Vec::new(),
                    rows: 0,
                });
                p.vals.extend(row.vals);
                p.rows += 1;
                if let Some(Value::Array(t)) = value.get("tags") {
                    let mut seen = HashSet::new();
                    for tag in t.iter().filter_map(|t| t.as_str()) {
                        if seen.insert(tag) {
                            batch.tags.push((id.clone(), tag.to_string()));
                        }
                    }
                }
                known.entry(spec.table).or_default().insert(id);
                count += 1;
            }
            batch.flush(&jobs).await?;
            progress(count, total);
            // Every column but the entity's text, which nothing looks up by; a table whose
            // rows were all written the long way (certificates) whole.
            let keys: Vec<String> = columns
                .unwrap_or_default()
                .into_iter()
                .filter(|c| c != "entity")
                .collect();
            analyze.push(match keys.is_empty() {
                true => spec.table.to_string(),
                false => format!("{} ({})", spec.table, keys.join(", ")),
            });
        }
        // Tags, the change log (empty: the sync's read of it is planned from these), and the
        // snis a certificate's `snis` made.
        if !analyze.is_empty() {
            analyze.push("tags".into());
            analyze.push("changes".into());
        }
        let snis = |a: &String| a == "snis" || a.starts_with("snis ");
        if long_way && !analyze.iter().any(snis) {
            analyze.push("snis".into());
        }
        Ok((count, analyze))
    }
}

/// What the writer is asked to do on the import's transaction.
enum Job {
    /// One `INSERT` of many rows.
    Insert { sql: String, vals: Vec<Bind> },
    /// The id of the `table` entity `key` names (by id or endpoint key), stored before.
    Resolve {
        table: &'static str,
        key: String,
        reply: oneshot::Sender<Result<Option<String>, StoreError>>,
    },
    /// One entity written the long way (a certificate with its snis).
    Write {
        spec: &'static EntitySpec,
        id: String,
        body: Map<String, Value>,
        now: i64,
        reply: oneshot::Sender<Result<(), StoreError>>,
    },
}

/// The writer stopped (its own error is the one reported).
fn stopped<T>(_: T) -> StoreError {
    StoreError::Database("the import's writer stopped".into())
}

/// Queues `job` and waits for its answer.
async fn ask<T>(
    jobs: &mpsc::Sender<Job>,
    job: Job,
    done: oneshot::Receiver<T>,
) -> Result<T, StoreError> {
    jobs.send(job).await.map_err(stopped)?;
    done.await.map_err(stopped)
}

/// One table's rows waiting for their statements, with their tags.
struct Batch<'t> {
    table: &'t str,
    /// Values a statement.
    max: usize,
    pending: Option<Pending>,
    tags: Vec<(String, String)>,
    /// Anonymous marks (`?`, SQLite) rather than numbered ones (`$n`).
    anonymous: bool,
}

impl Batch<'_> {
    /// Queues the pending rows and their tags for the writer.
    async fn flush(&mut self, jobs: &mpsc::Sender<Job>) -> Result<(), StoreError> {
        let table = self.table;
        if let Some(p) = self.pending.take() {
            let cols = p.cols.join(", ");
            let into = format!("{table} ({cols})");
            let sql = insert_sql(&into, p.cols.len(), p.rows, self.anonymous);
            let job = Job::Insert { sql, vals: p.vals };
            jobs.send(job).await.map_err(stopped)?;
        }
        // Tags: three values a row, `max` values a statement.
        let per = self.max / 3;
        let text = |s: &str| Bind::Text(Some(s.to_string()));
        for chunk in self.tags.chunks(per) {
            let vals = chunk
                .iter()
                .flat_map(|(id, tag)| [text(id), text(table), text(tag)])
                .collect();
            let into = "tags (entity_id, entity_name, tag)";
            let sql = insert_sql(into, 3, chunk.len(), self.anonymous);
            jobs.send(Job::Insert { sql, vals })
                .await
                .map_err(stopped)?;
        }
        self.tags.clear();
        Ok(())
    }
}

/// `INSERT INTO <into> VALUES (...), (...)`: `rows` rows of `width` values, marked `?` when
/// `anonymous`, else `$1, $2, ...`.
fn insert_sql(into: &str, width: usize, rows: usize, anonymous: bool) -> String {
    let row = |r: usize| {
        if anonymous {
            format!("({})", vec!["?"; width].join(", "))
        } else {
            format!("({})", write::marks(r * width + 1, width))
        }
    };
    let marks: Vec<String> = (0..rows).map(row).collect();
    format!("INSERT INTO {into} VALUES {}", marks.join(", "))
}
