//! Entity writes: insert, upsert, update, delete, each one transaction (see the module above).

use super::*;

impl Store {
    /// `POST`: creates an entity. `parent` is the foreign key a nested path sets.
    pub async fn insert(
        &self,
        spec: &'static EntitySpec,
        mut body: Map<String, Value>,
        parent: Option<(String, String)>,
    ) -> Result<Map<String, Value>, StoreError> {
        if let Some((field, id)) = &parent {
            body.insert(field.clone(), json!({ "id": id }));
        }
        let (id, given) = match body.get("id") {
            Some(Value::String(s)) if is_uuid(s) => (s.to_ascii_lowercase(), true),
            Some(Value::String(_)) | Some(Value::Number(_)) | Some(Value::Bool(_)) => {
                return Err(StoreError::Schema(vec![(
                    "id".into(),
                    "expected a valid UUID".into(),
                )]))
            }
            _ => (uuid::Uuid::new_v4().to_string(), false),
        };
        let now = now_secs();
        body.insert("id".into(), Value::String(id.clone()));
        body.remove("created_at");
        body.remove("updated_at");
        if let Some(saved) = self.insert_at_once(spec, &id, &body, given, now).await? {
            return Ok(saved);
        }
        let mut tx = self.begin_write().await?;
        // An id the client chose may be taken (Kong's primary-key error); one drawn here
        // (122 random bits) is not, and the primary key backs that up: a token written by
        // the oauth2 endpoints or `POST /oauth2_tokens` saves the round trip.
        if given && self.row_exists(&mut tx, spec.table, &id).await? {
            return Err(StoreError::PrimaryKey(id));
        }
        let saved = self.write(&mut tx, spec, &id, &body, now, None).await?;
        self.commit(tx).await?;
        Ok(saved)
    }

    /// `PUT /{entity}/{id or endpoint key}`: creates or replaces.
    pub async fn upsert(
        &self,
        spec: &'static EntitySpec,
        key: &str,
        mut body: Map<String, Value>,
        parent: Option<(String, String)>,
    ) -> Result<Map<String, Value>, StoreError> {
        if let Some((field, id)) = &parent {
            body.insert(field.clone(), json!({ "id": id }));
        }
        let mut tx = self.begin_write().await?;
        let existing = self.find_tx(&mut tx, spec, key).await?;
        let id = match &existing {
            Some((id, _)) => id.clone(),
            None if is_uuid(key) => key.to_ascii_lowercase(),
            None => {
                // PUT by endpoint key creates the entity with that key.
                let ek = spec.endpoint_key.ok_or(StoreError::NotFound)?;
                body.insert(ek.into(), Value::String(key.to_string()));
                uuid::Uuid::new_v4().to_string()
            }
        };
        if is_uuid(key) {
            if let Some(Value::String(b)) = body.get("id") {
                if !b.eq_ignore_ascii_case(key) {
                    return Err(StoreError::Schema(vec![(
                        "id".into(),
                        "cannot change the primary key with PUT".into(),
                    )]));
                }
            }
        } else if let Some(ek) = spec.endpoint_key {
            body.entry(ek.to_string())
                .or_insert_with(|| Value::String(key.to_string()));
        }
        body.insert("id".into(), Value::String(id.clone()));
        let now = now_secs();
        let created = existing
            .as_ref()
            .and_then(|(_, e)| e.get("created_at").cloned());
        body.remove("updated_at");
        match created {
            Some(c) => {
                body.insert("created_at".into(), c);
            }
            None => {
                body.remove("created_at");
            }
        }
        let saved = self
            .write(&mut tx, spec, &id, &body, now, existing.map(|e| e.1))
            .await?;
        self.commit(tx).await?;
        Ok(saved)
    }

    /// `PATCH`: merges `body` into the stored entity.
    pub async fn update(
        &self,
        spec: &'static EntitySpec,
        key: &str,
        body: Map<String, Value>,
        parent: Option<(String, String)>,
    ) -> Result<Map<String, Value>, StoreError> {
        let mut tx = self.begin_write().await?;
        let Some((id, old)) = self.find_tx(&mut tx, spec, key).await? else {
            return Err(StoreError::NotFound);
        };
        if !belongs_to(&old, &parent) {
            return Err(StoreError::NotFound);
        }
        if let Some(Value::String(b)) = body.get("id") {
            if !b.eq_ignore_ascii_case(&id) {
                return Err(StoreError::Schema(vec![(
                    "id".into(),
                    "cannot change the primary key".into(),
                )]));
            }
        }
        let mut merged = old.clone();
        entity::merge(&mut merged, &body);
        // A PATCH with `url` replaces the parts it implies.
        if spec.table == "services" && body.contains_key("url") {
            for f in ["protocol", "host", "port", "path"] {
                if !body.contains_key(f) {
                    merged.remove(f);
                }
            }
        }
        merged.remove("updated_at");
        let saved = self
            .write(&mut tx, spec, &id, &merged, now_secs(), Some(old))
            .await?;
        self.commit(tx).await?;
        Ok(saved)
    }

    /// `DELETE`: removes the entity and what Kong cascades to; refuses while a restricting
    /// reference exists. Deleting what does not exist succeeds, as in Kong.
    pub async fn delete(
        &self,
        spec: &'static EntitySpec,
        key: &str,
        parent: Option<(String, String)>,
    ) -> Result<(), StoreError> {
        let mut tx = self.begin_write().await?;
        let Some((id, old)) = self.find_tx(&mut tx, spec, key).await? else {
            return Ok(());
        };
        if !belongs_to(&old, &parent) {
            return Ok(());
        }
        self.delete_tx(&mut tx, spec, &id).await?;
        self.commit(tx).await?;
        Ok(())
    }

    pub(super) fn delete_tx<'t>(
        &'t self,
        tx: &'t mut Tx<'_>,
        spec: &'static EntitySpec,
        id: &'t str,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), StoreError>> + Send + 't>>
    {
        Box::pin(async move {
            for child in self.tables.iter() {
                for f in child.foreign.iter().filter(|f| f.table == spec.table) {
                    let ids: Vec<String> = sqlx::query(&format!(
                        "SELECT id FROM {} WHERE {} = $1",
                        child.table,
                        f.column()
                    ))
                    .bind(id)
                    .fetch_all(&mut **tx)
                    .await?
                    .iter()
                    .map(|r| r.try_get::<String, _>(0))
                    .collect::<Result<_, _>>()?;
                    if ids.is_empty() {
                        continue;
                    }
                    if !f.cascade {
                        return Err(StoreError::ReferencedBy {
                            child: child.table.into(),
                            parent: spec.table.into(),
                        });
                    }
                    for cid in ids {
                        self.delete_tx(tx, child, &cid).await?;
                    }
                }
            }
            sqlx::query("DELETE FROM tags WHERE entity_id = $1")
                .bind(id)
                .execute(&mut **tx)
                .await?;
            sqlx::query(&format!("DELETE FROM {} WHERE id = $1", spec.table))
                .bind(id)
                .execute(&mut **tx)
                .await?;
            record_change(tx, spec.table, id).await?;
            Ok(())
        })
    }

    /// Starts a read-only transaction that sees one consistent state of the store, and reads
    /// the config version of that state.
    pub(super) async fn begin_snapshot(&self) -> Result<(Tx<'static>, i64), StoreError> {
        let mut tx = match self.backend {
            Backend::Postgres => {
                self.pool
                    .begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                    .await?
            }
            Backend::Sqlite => self.pool.begin().await?,
        };
        let version = sqlx::query("SELECT value FROM turnpike_meta WHERE name = 'config_version'")
            .fetch_one(&mut *tx)
            .await?
            .try_get::<i64, _>(0)?;
        Ok((tx, version))
    }

    /// Starts a write: the version bump comes first so that concurrent writers queue here.
    pub(super) async fn begin_write(&self) -> Result<WriteTx, StoreError> {
        let mut tx = self.pool.begin().await?;
        // The notification goes with the bump when this write sends one itself (a CLI
        // command's, a node's first of a gap), one round trip fewer: it is delivered to every
        // listening node when (and only if) the transaction commits.
        const BUMP: &str =
            "UPDATE turnpike_meta SET value = value + 1 WHERE name = 'config_version' RETURNING value";
        let notifies = self.notifies_inline();
        let sql = if notifies {
            format!("{BUMP}, pg_notify('{NOTIFY_CHANNEL}', '')::text")
        } else {
            BUMP.to_string()
        };
        let version: i64 = sqlx::query(&sql).fetch_one(&mut *tx).await?.try_get(0)?;
        Ok(WriteTx {
            tx,
            version,
            notifies,
        })
    }

    pub(super) async fn commit(&self, w: WriteTx) -> Result<(), StoreError> {
        let WriteTx {
            mut tx,
            version,
            notifies,
        } = w;
        // See PRUNE_CHANGES.
        if version % 64 == 0 {
            sqlx::query(PRUNE_CHANGES)
                .bind(version - 10000)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        if !notifies {
            self.written();
        }
        Ok(())
    }

    pub(super) async fn row_exists(
        &self,
        tx: &mut Tx<'_>,
        table: &str,
        id: &str,
    ) -> Result<bool, StoreError> {
        Ok(sqlx::query(&format!("SELECT 1 FROM {table} WHERE id = $1"))
            .bind(id)
            .fetch_optional(&mut **tx)
            .await?
            .is_some())
    }

    /// (id, entity) by id or endpoint key, inside a transaction.
    pub(super) async fn find_tx(
        &self,
        tx: &mut Tx<'_>,
        spec: &EntitySpec,
        key: &str,
    ) -> Result<Option<(String, Map<String, Value>)>, StoreError> {
        let row = if is_uuid(key) {
            sqlx::query(&format!(
                "SELECT id, entity FROM {} WHERE id = $1",
                spec.table
            ))
            .bind(key.to_ascii_lowercase())
            .fetch_optional(&mut **tx)
            .await?
        } else if let Some(ek) = spec.endpoint_key.filter(|ek| spec.unique.contains(ek)) {
            let mut sql = String::new();
            by_stored_key(self, &mut sql, "id, entity", spec.table, ek, key)
                .fetch_optional(&mut **tx)
                .await?
        } else {
            None
        };
        match row {
            None => Ok(None),
            Some(r) => Ok(Some((
                r.try_get::<String, _>(0)?,
                parse_entity(&r.try_get::<String, _>(1)?)?,
            ))),
        }
    }

    /// Resolves a reference (an id or an endpoint key) to an id.
    pub(super) async fn resolve_tx(
        &self,
        tx: &mut Tx<'_>,
        table: &str,
        key: &str,
    ) -> Result<Option<String>, StoreError> {
        let spec = self.tables.by_table(table).expect("known table");
        if is_uuid(key) {
            // The id alone (a token's credential is named by id): not the entity's text.
            let row = sqlx::query(&format!("SELECT id FROM {} WHERE id = $1", spec.table))
                .bind(key.to_ascii_lowercase())
                .fetch_optional(&mut **tx)
                .await?;
            return Ok(row.map(|r| r.try_get::<String, _>(0)).transpose()?);
        }
        Ok(self.find_tx(tx, spec, key).await?.map(|(id, _)| id))
    }

    /// Validates and writes one entity (insert or replace) with its tags.
    pub(super) async fn write(
        &self,
        tx: &mut Tx<'_>,
        spec: &'static EntitySpec,
        id: &str,
        body: &Map<String, Value>,
        now: i64,
        old: Option<Map<String, Value>>,
    ) -> Result<Map<String, Value>, StoreError> {
        let Checked {
            mut value,
            refs,
            sni_names,
            reveal,
        } = entity::check(spec, body, id, now, self.plugins.as_ref())
            .map_err(StoreError::Schema)?;
        // Only entities that have the field (credentials have none: writing one made the
        // stored entity unreadable for the config sync).
        if old.is_some() && value.contains_key("updated_at") {
            value.insert("updated_at".into(), json!(now));
            if spec.table == "targets" {
                value.insert("updated_at".into(), json!(now as f64 * 1000.0));
            }
        }
        // Foreign keys: each must name an existing entity; store its id.
        let mut fk_ids: Vec<(String, Option<String>)> = Vec::new();
        for f in spec.foreign {
            let key = refs.iter().find(|(r, _)| *r == f.field).map(|(_, k)| k);
            let resolved = match key {
                None => None,
                Some(k) => match self.resolve_tx(tx, f.table, k).await? {
                    Some(rid) => Some(rid),
                    None => {
                        return Err(StoreError::ForeignKey {
                            field: f.field.into(),
                            table: f.table.into(),
                            key: k.clone(),
                        })
                    }
                },
            };
            if let Some(rid) = &resolved {
                value.insert(f.field.into(), json!({ "id": rid }));
            }
            fk_ids.push((f.column(), resolved));
        }
        // Unique keys and the cache key, checked here for Kong's error (the UNIQUE columns
        // back them up): one query with a sub-select per value written, not one per key.
        let (uniques, cache_key) = keys_of(spec, &value);
        let checked: Vec<(&str, &str)> = uniques
            .iter()
            .filter_map(|(u, v)| Some((*u, v.as_deref()?)))
            .chain(cache_key.as_deref().map(|ck| ("cache_key", ck)))
            .collect();
        if !checked.is_empty() {
            let subs: Vec<String> = checked
                .iter()
                .enumerate()
                .map(|(i, (col, _))| {
                    let col = if *col == "cache_key" {
                        "cache_key".into()
                    } else {
                        quote(col)
                    };
                    format!(
                        "(SELECT id FROM {} WHERE {col} = ${} AND id <> $1 LIMIT 1)",
                        spec.table,
                        i + 2
                    )
                })
                .collect();
            let sql = format!("SELECT {}", subs.join(", "));
            let mut q = sqlx::query(&sql).bind(id);
            for (_, v) in &checked {
                q = q.bind(*v);
            }
            let row = q.fetch_one(&mut **tx).await?;
            for (i, (col, v)) in checked.iter().enumerate() {
                if row.try_get::<Option<String>, _>(i)?.is_none() {
                    continue;
                }
                if *col != "cache_key" {
                    return Err(StoreError::Unique {
                        fields: format!("{{{col}=\"{v}\"}}"),
                        detail: json!({ *col: v }),
                    });
                }
                let detail: Map<String, Value> = spec
                    .cache_key
                    .iter()
                    .map(|f| (f.to_string(), value.get(*f).cloned().unwrap_or(Value::Null)))
                    .collect();
                let shown: Vec<String> = detail
                    .iter()
                    .map(|(k, v)| match v {
                        Value::Null => format!("{k}=null"),
                        Value::String(s) => format!("{k}=\"{s}\""),
                        Value::Object(o) => format!(
                            "{k}={{id=\"{}\"}}",
                            o.get("id").and_then(|v| v.as_str()).unwrap_or_default()
                        ),
                        other => format!("{k}={other}"),
                    })
                    .collect();
                return Err(StoreError::Unique {
                    fields: format!("{{{}}}", shown.join(",")),
                    detail: Value::Object(detail),
                });
            }
        }
        let row = self.row_values(spec, id, &value, &uniques, &cache_key, &fk_ids)?;
        let updates: Vec<String> = row.cols[1..]
            .iter()
            .map(|c| format!("{c} = excluded.{c}"))
            .collect();
        let sql = format!(
            "INSERT INTO {} ({}) VALUES ({}) ON CONFLICT (id) DO UPDATE SET {}",
            spec.table,
            row.cols.join(", "),
            marks(1, row.cols.len()),
            updates.join(", ")
        );
        let q = bind_all(sqlx::query(&sql), &row.vals);
        q.execute(&mut **tx).await?;
        record_change(tx, spec.table, id).await?;

        // A new entity has no tags to replace.
        if old.is_some() {
            sqlx::query("DELETE FROM tags WHERE entity_id = $1")
                .bind(id)
                .execute(&mut **tx)
                .await?;
        }
        if let Some(Value::Array(tags)) = value.get("tags") {
            let mut seen = std::collections::HashSet::new();
            for t in tags.iter().filter_map(|t| t.as_str()) {
                if seen.insert(t) {
                    sqlx::query(
                        "INSERT INTO tags (entity_id, entity_name, tag) VALUES ($1, $2, $3)",
                    )
                    .bind(id)
                    .bind(spec.table)
                    .bind(t)
                    .execute(&mut **tx)
                    .await?;
                }
            }
        }

        // A certificate's `snis` replace the snis that point at it.
        if let Some(names) = sni_names {
            let snis = self.tables.by_table("snis").unwrap();
            let current: Vec<String> = sqlx::query("SELECT id FROM snis WHERE certificate_id = $1")
                .bind(id)
                .fetch_all(&mut **tx)
                .await?
                .iter()
                .map(|r| r.try_get::<String, _>(0))
                .collect::<Result<_, _>>()?;
            for sid in current {
                self.delete_tx(tx, snis, &sid).await?;
            }
            for name in &names {
                let mut m = Map::new();
                m.insert("name".into(), Value::String(name.clone()));
                m.insert("certificate".into(), json!({ "id": id }));
                let sid = uuid::Uuid::new_v4().to_string();
                Box::pin(self.write(tx, snis, &sid, &m, now, None))
                    .await
                    .map_err(|e| match e {
                        StoreError::Schema(v) => StoreError::Schema(
                            v.into_iter()
                                .map(|(f, m)| (format!("snis.{f}"), m))
                                .collect(),
                        ),
                        other => other,
                    })?;
            }
            value.insert("snis".into(), json!(names));
        }
        Ok(answer(value, reveal))
    }
}

/// Nodes further behind than 10,000 versions re-read everything instead; the log is pruned
/// every 64th version (it holds at most 64 more), not in every write.
/// The lower bound is for PostgreSQL's planner: for `version < $1` alone, with statistics
/// taken a few thousand versions ago (autovacuum's pace under writes), it expects every row
/// to go and scans the whole log, 10,000 rows and their dead versions (at 1,500 writes a
/// second, about half the prunes did). Bounded on both sides it reads the index from the
/// oldest entry.
pub(super) const PRUNE_CHANGES: &str =
    "DELETE FROM changes WHERE version < $1 AND version >= (SELECT min(version) FROM changes)";

/// An entity's unique keys as written (`None`: not set) and its cache key, if it has one.
pub(super) fn keys_of<'s>(
    spec: &'s EntitySpec,
    value: &Map<String, Value>,
) -> (Vec<(&'s str, Option<String>)>, Option<String>) {
    let uniques = spec
        .unique
        .iter()
        .map(|u| (*u, value.get(*u).and_then(|v| v.as_str()).map(String::from)))
        .collect();
    (uniques, entity::cache_key(spec, value))
}

/// A write's answer: the stored entity, showing what it reveals once (a new key-auth key),
/// with the `ttl` it has left as any read shows it (Kong's answer is read back the same way).
fn answer(mut value: Map<String, Value>, reveal: Option<(String, Value)>) -> Map<String, Value> {
    if let Some((field, shown)) = reveal {
        value.insert(field, shown);
    }
    super::read_back(&mut value);
    value
}

/// A value bound to a statement: the entity tables hold text and integers only.
#[derive(Clone)]
pub(super) enum Bind {
    Text(Option<String>),
    Int(Option<i64>),
}

/// One entity row as written: its columns, `id` first, and their values in the same order.
pub(super) struct RowValues {
    pub(super) cols: Vec<String>,
    pub(super) vals: Vec<Bind>,
}

pub(super) fn bind_all<'q>(
    q: sqlx::query::Query<'q, Any, sqlx::any::AnyArguments<'q>>,
    vals: &'q [Bind],
) -> sqlx::query::Query<'q, Any, sqlx::any::AnyArguments<'q>> {
    vals.iter().fold(q, |q, v| match v {
        Bind::Text(t) => q.bind(t.as_deref()),
        Bind::Int(i) => q.bind(*i),
    })
}

/// `$from, $from+1, ...`: `count` placeholders.
pub(super) fn marks(from: usize, count: usize) -> String {
    (from..from + count)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl Store {
    /// The row an entity is stored as: its id, unique keys, cache key, foreign key ids,
    /// creation time, JSON text and (for entities with a `ttl`) expiry.
    pub(super) fn row_values(
        &self,
        spec: &EntitySpec,
        id: &str,
        value: &Map<String, Value>,
        uniques: &[(&str, Option<String>)],
        cache_key: &Option<String>,
        fk_ids: &[(String, Option<String>)],
    ) -> Result<RowValues, StoreError> {
        let created_at = value
            .get("created_at")
            .and_then(|v| v.as_f64())
            .map(|v| if spec.table == "targets" { v / 1000.0 } else { v } as i64)
            .unwrap_or_else(now_secs);
        let text = turnpike_config::number::to_string(value)
            .map_err(|e| StoreError::Database(e.to_string()))?;
        let mut row = RowValues {
            cols: vec!["id".into()],
            vals: vec![Bind::Text(Some(id.to_string()))],
        };
        for (u, v) in uniques {
            row.cols.push(quote(u));
            row.vals.push(Bind::Text(v.clone()));
        }
        if let Some(ck) = cache_key {
            row.cols.push("cache_key".into());
            row.vals.push(Bind::Text(Some(ck.clone())));
        }
        for (c, v) in fk_ids {
            row.cols.push(c.clone());
            row.vals.push(Bind::Text(v.clone()));
        }
        row.cols.push("created_at".into());
        row.vals.push(Bind::Int(Some(created_at)));
        row.cols.push("entity".into());
        row.vals.push(Bind::Text(Some(text)));
        if self.tables.has_ttl(spec.table) {
            row.cols.push("expires_at".into());
            let at = value
                .get(crate::entity::EXPIRES_AT)
                .and_then(|v| v.as_i64());
            row.vals.push(Bind::Int(at));
        }
        Ok(row)
    }

    /// PostgreSQL: a new entity without tags or snis whose references are ids (an oauth2
    /// token, a credential, most `POST`s) is written by one statement, in one round trip
    /// instead of eight: the version bump, the row, its change-log entry and the notification,
    /// on condition that what it refers to exists and its unique keys are free. The version
    /// row's lock is then held for that one statement, not across a transaction's round trips,
    /// so writers queue far less. The conditions only choose the path: the table's foreign keys
    /// and UNIQUE columns are what keep a racing write out. `None`: write it the long way,
    /// which finds Kong's error for what failed (also after a constraint caught a race).
    /// Entities of the same shape written at the same time share the statement
    /// ([`batch`]: one round trip, commit and version-row lock for them all).
    async fn insert_at_once(
        &self,
        spec: &'static EntitySpec,
        id: &str,
        body: &Map<String, Value>,
        given: bool,
        now: i64,
    ) -> Result<Option<Map<String, Value>>, StoreError> {
        if self.backend != Backend::Postgres {
            return Ok(None);
        }
        let Checked {
            mut value,
            refs,
            sni_names,
            reveal,
        } = entity::check(spec, body, id, now, self.plugins.as_ref())
            .map_err(StoreError::Schema)?;
        let tagged = value
            .get("tags")
            .and_then(Value::as_array)
            .is_some_and(|t| !t.is_empty());
        if sni_names.is_some() || tagged {
            return Ok(None);
        }
        // (condition, value bound to it)
        let mut conds: Vec<(String, String)> = Vec::new();
        if given {
            conds.push((
                format!("NOT EXISTS (SELECT 1 FROM {} WHERE id = $", spec.table),
                id.into(),
            ));
        }
        let mut fk_ids = Vec::new();
        for f in spec.foreign {
            match refs.iter().find(|(r, _)| *r == f.field).map(|(_, k)| k) {
                None => fk_ids.push((f.column(), None)),
                Some(k) if is_uuid(k) => {
                    let rid = k.to_ascii_lowercase();
                    value.insert(f.field.into(), json!({ "id": rid }));
                    conds.push((
                        format!("EXISTS (SELECT 1 FROM {} WHERE id = $", f.table),
                        rid.clone(),
                    ));
                    fk_ids.push((f.column(), Some(rid)));
                }
                Some(_) => return Ok(None),
            }
        }
        let (uniques, cache_key) = keys_of(spec, &value);
        for (col, v) in &uniques {
            if let Some(v) = v {
                conds.push((
                    format!(
                        "NOT EXISTS (SELECT 1 FROM {} WHERE {} = $",
                        spec.table,
                        quote(col)
                    ),
                    v.clone(),
                ));
            }
        }
        if let Some(ck) = &cache_key {
            conds.push((
                format!(
                    "NOT EXISTS (SELECT 1 FROM {} WHERE cache_key = $",
                    spec.table
                ),
                ck.clone(),
            ));
        }
        let row = self.row_values(spec, id, &value, &uniques, &cache_key, &fk_ids)?;
        let announce = self.announcer.get().cloned();
        let shape = || batch::Shape {
            table: spec.table,
            cols: row.cols.clone(),
            conds: conds.iter().map(|(c, _)| c.clone()).collect(),
        };
        let binds = || batch::RowBinds {
            vals: row.vals.clone(),
            conds: conds.iter().map(|(_, v)| v.clone()).collect(),
        };
        let written = match self
            .batches
            .write(&self.direct, shape(), binds(), announce.clone())
            .await?
        {
            batch::Outcome::Written => true,
            batch::Outcome::Refused { alone: true } => false,
            // Refused with others: alone, it may pass (another row's key was taken).
            batch::Outcome::Refused { alone: false } => {
                let notifies = self.notifies_inline();
                let written = batch::run(&self.direct, &shape(), &[binds()], notifies).await?;
                if written && !notifies {
                    self.written();
                }
                written
            }
        };
        if !written {
            return Ok(None);
        }
        Ok(Some(answer(value, reveal)))
    }
}
