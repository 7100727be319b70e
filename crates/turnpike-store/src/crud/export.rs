//! The store as a whole: exports for the config loader, the change log since a version, imports.

use super::*;

impl Store {
    /// Every entity, as a declarative config (`_format_version: "3.0"`), read in one
    /// transaction so that it is consistent, with the config version it reflects.
    pub async fn export(&self) -> Result<(i64, Value), StoreError> {
        let (version, raw) = self.export_raw(&[]).await?;
        Ok((version, assemble(raw)?))
    }

    /// The rows of every table as stored (JSON text), read in one consistent transaction:
    /// the I/O half of [`Store::export`]; [`assemble`] is the CPU half, which the config sync
    /// runs on its own low-priority thread. The tables in `skip` are not read (credentials the
    /// data plane reads by key: 100k key-auth rows were read, held and dropped at each start).
    pub async fn export_raw(&self, skip: &[&str]) -> Result<(i64, RawExport), StoreError> {
        let (mut tx, version) = self.begin_snapshot().await?;
        let mut raw = Vec::new();
        // Rows in id order. SQLite reads a table in its rowid order and would find each row
        // through the id index for `ORDER BY id` (0.49 s for 100k consumers, against 0.01 s
        // unordered); its ids compare as bytes (BINARY), as Rust's strings do, so they are
        // sorted here. PostgreSQL sorts them itself, by its own collation.
        for spec in self.tables.iter().filter(|t| !skip.contains(&t.table)) {
            if self.backend == crate::Backend::Sqlite {
                raw.push((spec.table, sqlite_rows(&mut tx, spec.table).await?));
                continue;
            }
            let sql = format!("SELECT entity FROM {} ORDER BY id", spec.table);
            // Row by row: the driver's rows are not held beside their texts.
            let mut rows = sqlx::query(&sql).fetch(&mut *tx);
            let mut texts = Vec::new();
            while let Some(r) = futures_util::TryStreamExt::try_next(&mut rows).await? {
                texts.push(r.try_get::<String, _>(0)?);
            }
            drop(rows);
            raw.push((spec.table, texts));
        }
        tx.commit().await?;
        Ok((version, raw))
    }

    /// The rows changed since version `since`, read in one consistent snapshot with the
    /// version they lead to. `None` when the change log no longer covers `since` (pruned, or a
    /// gap): the caller re-reads everything.
    pub async fn changes_since(&self, since: i64) -> Result<Option<(i64, Delta)>, StoreError> {
        if self.backend == crate::Backend::Postgres {
            return self.changes_in_one_statement(since).await;
        }
        let (mut tx, version) = self.begin_snapshot().await?;
        if version <= since {
            tx.commit().await?;
            return Ok(Some((version, Vec::new())));
        }
        // Bounded on both sides, so that a generic plan of this prepared statement (which
        // PostgreSQL may settle on) reads the index too: for `version > $1` alone it estimates
        // a third of the log and scans all 10,000 rows and their dead versions.
        let rows = sqlx::query(
            "SELECT version, entity_name, entity_id FROM changes WHERE version > $1 AND version <= $2",
        )
        .bind(since)
        .bind(version)
        .fetch_all(&mut *tx)
        .await?;
        // Every version since must be in the log (none pruned, no gap).
        let mut versions = std::collections::HashSet::new();
        let mut seen = std::collections::HashSet::new();
        let mut distinct = Vec::with_capacity(rows.len());
        for r in &rows {
            versions.insert(r.try_get::<i64, _>(0)?);
            let row: (String, String) = (r.try_get(1)?, r.try_get(2)?);
            if seen.insert(row.clone()) {
                distinct.push(row);
            }
        }
        if versions.len() as i64 != version - since {
            tx.commit().await?;
            return Ok(None);
        }
        let mut changed: Vec<(&'static EntitySpec, String)> = Vec::with_capacity(distinct.len());
        for (table, id) in distinct {
            if let Some(spec) = self.tables.by_table(&table) {
                changed.push((spec, id));
            }
        }
        // Each table's changed rows by their ids, up to 100 a query (a burst of token writes
        // is a few reads, not one per token). The ids are listed, not taken from a sub-select
        // of the change log: with 100k routes the planner chose to scan the whole table for
        // that, once per sync.
        let mut texts: std::collections::HashMap<(&str, String), String> = Default::default();
        let mut by_table: Vec<(&'static str, Vec<&str>)> = Vec::new();
        for (spec, id) in &changed {
            match by_table.iter_mut().find(|(t, _)| *t == spec.table) {
                Some((_, ids)) => ids.push(id),
                None => by_table.push((spec.table, vec![id])),
            }
        }
        for (table, ids) in by_table {
            for chunk in ids.chunks(100) {
                let marks: Vec<String> = (1..=chunk.len()).map(|i| format!("${i}")).collect();
                let sql = format!(
                    "SELECT id, entity FROM {table} WHERE id IN ({})",
                    marks.join(", ")
                );
                // Not kept prepared: one statement text per list length.
                let q = chunk
                    .iter()
                    .fold(sqlx::query(&sql).persistent(false), |q, id| q.bind(*id));
                for r in q.fetch_all(&mut *tx).await? {
                    texts.insert((table, r.try_get(0)?), r.try_get(1)?);
                }
            }
        }
        let delta = changed
            .into_iter()
            .map(|(spec, id)| {
                let entity = texts.remove(&(spec.table, id.clone()));
                (spec.table, id, entity)
            })
            .collect();
        tx.commit().await?;
        Ok(Some((version, delta)))
    }

    /// PostgreSQL's [`Store::changes_since`]: one statement ([`crate::schema::Tables::changes_query`],
    /// one snapshot) on a connection handed back unchecked ([`crate::direct`]). The
    /// transaction, the version read, the change-log read and the rows' reads were five
    /// statements a sync, and sqlx's pool checked the connection twice: at 150 token writes a
    /// second, more statements than the writes themselves (`bench/experiments/token-write-cost.sh`).
    async fn changes_in_one_statement(
        &self,
        since: i64,
    ) -> Result<Option<(i64, Delta)>, StoreError> {
        let mut conn = self.direct.get().await?;
        let read = sqlx::query(&self.changes_sql)
            .bind(since)
            .fetch_all(&mut *conn)
            .await;
        let rows = conn.seen(read)?;
        let Some(first) = rows.first() else {
            return Err(StoreError::Database(
                "no config version in turnpike_meta".into(),
            ));
        };
        let version: i64 = first.try_get(0)?;
        if version <= since {
            return Ok(Some((version, Vec::new())));
        }
        let mut versions = std::collections::HashSet::new();
        let mut seen = std::collections::HashSet::new();
        let mut delta = Vec::with_capacity(rows.len());
        for r in &rows {
            let Some(v) = r.try_get::<Option<i64>, _>(1)? else {
                continue;
            };
            versions.insert(v);
            let (table, id): (String, String) = (r.try_get(2)?, r.try_get(3)?);
            // Rows of tables this build does not know (a plugin no longer loaded) are not
            // the data plane's.
            let Some(spec) = self.tables.by_table(&table) else {
                continue;
            };
            if seen.insert((spec.table, id.clone())) {
                delta.push((spec.table, id, r.try_get::<Option<String>, _>(4)?));
            }
        }
        // Every version since must be in the log (none pruned, no gap).
        if versions.len() as i64 != version - since {
            return Ok(None);
        }
        Ok(Some((version, delta)))
    }

    /// Writes a validated declarative config into the store (`config db_import`): each entity
    /// upserted by its id, as Kong's `load_into_db` does, all in one transaction (entities
    /// already stored and absent from the file stay).
    pub async fn import(&self, cfg: &turnpike_config::Config) -> Result<usize, StoreError> {
        self.import_with_progress(cfg, &mut |_, _| {}).await
    }

    /// [`Store::import`], telling `progress(done, total)` as it goes. Into empty tables (a
    /// first import, a migration from Kong) the entities are written in bulk, many to a
    /// statement; otherwise one by one, each answered with Kong's errors as a write is.
    pub async fn import_with_progress(
        &self,
        cfg: &turnpike_config::Config,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<usize, StoreError> {
        let mut tx = self.begin_write().await?;
        if self.tables_empty(&mut tx, cfg).await? {
            let (n, analyze) = self.import_bulk(&mut tx, cfg, progress).await?;
            self.commit(tx).await?;
            // Tables filled in one transaction have no statistics until autovacuum gets to
            // them: PostgreSQL then planned the config sync's change-log read for a table
            // scan and compiled it with JIT (1-6 s a read at 100k routes, every node, every
            // write). Analysed now, it is an index scan (0.2 ms).
            self.analyze_filled(&analyze).await?;
            return Ok(n);
        }
        let v = cfg.to_json();
        let total = self.entities_in(&v);
        let mut count = 0;
        for spec in self.tables.iter() {
            let Some(Value::Array(items)) = v.get(spec.table) else {
                continue;
            };
            for item in items {
                let Value::Object(m) = item else { continue };
                let id = m
                    .get("id")
                    .and_then(|v| v.as_str())
                    .unwrap_or_default()
                    .to_string();
                let old = self.find_tx(&mut tx, spec, &id).await?.map(|e| e.1);
                Box::pin(self.write(&mut tx, spec, &id, m, now_secs(), old))
                    .await
                    .map_err(|e| in_entity(spec.table, &id, e))?;
                count += 1;
                if count % 1000 == 0 {
                    progress(count, total);
                }
            }
        }
        progress(count, total);
        self.commit(tx).await?;
        Ok(count)
    }
}

/// A schema violation of an imported entity, its fields named by table and id
/// (`consumers.<id>.username`).
pub(super) fn in_entity(table: &str, id: &str, e: StoreError) -> StoreError {
    match e {
        StoreError::Schema(v) => StoreError::Schema(
            v.into_iter()
                .map(|(f, m)| (format!("{table}.{id}.{f}"), m))
                .collect(),
        ),
        other => other,
    }
}

impl Store {
    /// How many entities an import of `v` writes.
    pub(super) fn entities_in(&self, v: &Value) -> usize {
        self.tables
            .iter()
            .filter_map(|s| v.get(s.table)?.as_array().map(Vec::len))
            .sum()
    }
}

/// Rows SQLite returns at a time, joined into one text (`group_concat`): the driver's cost per
/// row (100k consumers took 163 ms one row at a time) is paid once a batch.
const SQLITE_BATCH: usize = 1000;

/// The rows of a SQLite table in id order: read in batches in the table's own (rowid) order,
/// then sorted here (see [`Store::export_raw`]).
async fn sqlite_rows(tx: &mut Tx<'static>, table: &str) -> Result<Vec<String>, StoreError> {
    // U+001E cannot stand unescaped in JSON text, nor in an id (a UUID, or validated text).
    let sql = format!(
        "SELECT max(r), count(*), group_concat(entity, char(30)), group_concat(id, char(30)) \
         FROM (SELECT rowid AS r, id, entity FROM {table} WHERE rowid > $1 ORDER BY rowid LIMIT {SQLITE_BATCH})"
    );
    let (mut texts, mut keys) = (Vec::new(), Vec::new());
    let mut after = i64::MIN;
    loop {
        let row = sqlx::query(&sql).bind(after).fetch_one(&mut **tx).await?;
        let Some(last) = row.try_get::<Option<i64>, _>(0)? else {
            break;
        };
        let count = row.try_get::<i64, _>(1)? as usize;
        let entities: String = row.try_get(2)?;
        let ids: String = row.try_get(3)?;
        if entities.split('\x1e').count() != count || ids.split('\x1e').count() != count {
            return Err(StoreError::Database(format!(
                "{table}: a stored row holds a record separator (U+001E)"
            )));
        }
        for (e, id) in entities.split('\x1e').zip(ids.split('\x1e')) {
            texts.push(e.to_string());
            keys.push(SortKey::new(id));
        }
        after = last;
    }
    let mut order: Vec<u32> = (0..texts.len() as u32).collect();
    order.sort_unstable_by(|&a, &b| keys[a as usize].cmp(&keys[b as usize]));
    drop(keys);
    Ok(order
        .into_iter()
        .map(|i| std::mem::take(&mut texts[i as usize]))
        .collect())
}

/// A row's id as the key SQLite's rows are sorted by: the id's bytes (SQLite's BINARY
/// collation), inline for the ids of up to 36 bytes (every UUID) rather than a `String` each
/// (2.4 MB of a 100k-consumer start's peak).
#[derive(PartialEq, Eq)]
enum SortKey {
    /// Padded with NULs, which no id holds and which sort first: the order is the ids' own.
    Inline([u8; 36]),
    Long(Box<str>),
}

impl SortKey {
    fn new(id: &str) -> SortKey {
        match id.len() {
            n if n <= 36 => {
                let mut b = [0u8; 36];
                b[..n].copy_from_slice(id.as_bytes());
                SortKey::Inline(b)
            }
            _ => SortKey::Long(id.into()),
        }
    }

    fn bytes(&self) -> &[u8] {
        match self {
            SortKey::Inline(b) => &b[..b.iter().position(|&c| c == 0).unwrap_or(36)],
            SortKey::Long(s) => s.as_bytes(),
        }
    }
}

impl Ord for SortKey {
    fn cmp(&self, other: &SortKey) -> std::cmp::Ordering {
        match (self, other) {
            (SortKey::Inline(a), SortKey::Inline(b)) => a.cmp(b),
            _ => self.bytes().cmp(other.bytes()),
        }
    }
}

impl PartialOrd for SortKey {
    fn partial_cmp(&self, other: &SortKey) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

#[cfg(test)]
mod tests {
    use super::SortKey;

    #[test]
    fn sort_keys_order_ids_as_their_bytes() {
        let ids = [
            "b",
            "a",
            "ab",
            "00000000-0000-4000-8000-00000000000a",
            "00000000-0000-4000-8000-000000000009",
            "00000000-0000-4000-8000-000000000009-and-more",
            "00000000-0000-4000-8000-000000000009x",
            "",
        ];
        let mut by_key: Vec<&str> = ids.to_vec();
        by_key.sort_by_key(|s| SortKey::new(s));
        let mut by_bytes = ids.to_vec();
        by_bytes.sort();
        assert_eq!(by_key, by_bytes);
    }
}
