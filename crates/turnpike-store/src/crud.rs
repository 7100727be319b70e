//! Entity reads and writes with Kong's Admin API semantics. Every write is one transaction that
//! first bumps the config version (which also serialises writers, so the foreign-key and
//! uniqueness checks below cannot race), validates, checks references and unique keys, writes
//! the row and its tags, and commits; nothing is half-applied.

use base64::Engine;
use serde_json::{json, Map, Value};
use sqlx::any::Any;
use sqlx::{Row, Transaction};

use crate::entity::{self, Checked};
use crate::schema::{self, quote, EntitySpec, ENTITIES};
use crate::{now_secs, Backend, Store, StoreError, NOTIFY_CHANNEL};

pub const DEFAULT_PAGE_SIZE: usize = 100;
pub const MAX_PAGE_SIZE: usize = 1000;

type Tx<'a> = Transaction<'a, Any>;

/// A list request: Kong's `size`, `offset` and `tags` options, plus the parent filter of a
/// nested collection (`/services/{s}/routes` lists routes whose `service_id` is s).
#[derive(Debug, Default, Clone)]
pub struct ListQuery {
    pub size: usize,
    pub offset: Option<String>,
    /// Tags and whether all must match (`a,b`) or any (`a/b`).
    pub tags: Vec<String>,
    pub tags_all: bool,
    pub parent: Option<(String, String)>,
    /// Other query arguments: those naming one of the entity's unique fields filter the list
    /// by it (`/consumers?custom_id=x`, as Kong; `/services?name=x`, as Kong Manager asks).
    pub filters: Vec<(String, String)>,
}

impl ListQuery {
    /// The filters that apply to `spec`: its unique fields.
    pub fn filters_for<'q>(
        &'q self,
        spec: &'q EntitySpec,
    ) -> impl Iterator<Item = (&'q str, &'q str)> + 'q {
        self.filters
            .iter()
            .filter(|(k, _)| spec.unique.contains(&k.as_str()))
            .map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

impl ListQuery {
    /// Reads Kong's query options; errors are Kong's invalid size / invalid options errors.
    pub fn parse(query: &str) -> Result<ListQuery, StoreError> {
        let mut q = ListQuery {
            size: DEFAULT_PAGE_SIZE,
            ..Default::default()
        };
        for (k, v) in url_pairs(query) {
            match k.as_str() {
                "size" => {
                    let n: i64 = v
                        .parse()
                        .map_err(|_| StoreError::InvalidSize("size must be a number".into()))?;
                    if n < 1 || n as usize > MAX_PAGE_SIZE {
                        return Err(StoreError::InvalidSize(format!(
                            "size must be an integer between 1 and {MAX_PAGE_SIZE}"
                        )));
                    }
                    q.size = n as usize;
                }
                "offset" => q.offset = Some(v),
                "tags" => {
                    if v.is_empty() {
                        return Err(StoreError::InvalidOptions(
                            json!({"tags": "cannot be an empty string"}),
                        ));
                    }
                    let (sep, all) = if v.contains('/') {
                        ('/', false)
                    } else {
                        (',', true)
                    };
                    if v.contains('/') && v.contains(',') {
                        return Err(StoreError::InvalidOptions(
                            json!({"tags": "invalid filter: cannot mix ',' and '/'"}),
                        ));
                    }
                    q.tags = v.split(sep).map(|s| s.trim().to_string()).collect();
                    if q.tags.iter().any(|t| t.is_empty()) {
                        return Err(StoreError::InvalidOptions(
                            json!({"tags": "invalid filter: empty tag"}),
                        ));
                    }
                    q.tags_all = all;
                }
                _ => q.filters.push((k, v)),
            }
        }
        Ok(q)
    }
}

/// One page of a list.
#[derive(Debug)]
pub struct Page {
    pub data: Vec<Value>,
    /// The opaque offset of the next page, `None` on the last page.
    pub offset: Option<String>,
}

/// Splits and percent-decodes a query string or form body.
pub fn url_pairs(s: &str) -> Vec<(String, String)> {
    s.split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

pub fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                let hex = |c: u8| (c as char).to_digit(16);
                match (hex(b[i + 1]), hex(b[i + 2])) {
                    (Some(h), Some(l)) => {
                        out.push((h * 16 + l) as u8);
                        i += 2;
                    }
                    _ => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn encode_offset(id: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(id)
}

fn decode_offset(o: &str) -> Result<String, StoreError> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(o)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or_else(|| StoreError::InvalidOffset(o.to_string()))
}

/// Kong treats a key that parses as a UUID as an id, anything else as the endpoint key.
pub fn is_uuid(s: &str) -> bool {
    uuid::Uuid::parse_str(s).is_ok() && s.len() == 36
}

fn parse_entity(text: &str) -> Result<Map<String, Value>, StoreError> {
    match serde_json::from_str(text) {
        Ok(Value::Object(mut m)) => {
            // An entity written with a `ttl` keeps when it expires; it reads back with the
            // seconds it has left, as Kong's do (0: expired).
            if let Some(at) = m.remove(EXPIRES_AT).and_then(|v| v.as_i64()) {
                m.insert("ttl".into(), json!((at - crate::now_secs()).max(0)));
            }
            Ok(m)
        }
        _ => Err(StoreError::Database(
            "stored entity is not a JSON object".into(),
        )),
    }
}

/// Where a stored entity with a `ttl` keeps its expiry (seconds since the epoch).
pub(crate) const EXPIRES_AT: &str = "_expires_at";

/// A stored entity, unless its `ttl` has run out (Kong no longer shows or uses it).
fn parse_live(text: &str) -> Result<Option<Map<String, Value>>, StoreError> {
    let m = parse_entity(text)?;
    let expired = text.contains(EXPIRES_AT) && m.get("ttl").and_then(|t| t.as_i64()) == Some(0);
    Ok((!expired).then_some(m))
}

impl Store {
    /// Finds an entity by id or endpoint key.
    pub async fn get(
        &self,
        spec: &EntitySpec,
        key: &str,
    ) -> Result<Option<Map<String, Value>>, StoreError> {
        let mut conn = self.pool.acquire().await?;
        let row = if is_uuid(key) {
            sqlx::query(&format!("SELECT entity FROM {} WHERE id = $1", spec.table))
                .bind(key.to_ascii_lowercase())
                .fetch_optional(&mut *conn)
                .await?
        } else if let Some(ek) = spec.endpoint_key.filter(|ek| spec.unique.contains(ek)) {
            let forms = self.plugins.stored_keys(spec.table, key);
            let sql = format!(
                "SELECT entity FROM {} WHERE {} IN ({})",
                spec.table,
                quote(ek),
                placeholders(forms.len())
            );
            let mut q = sqlx::query(&sql);
            for f in forms {
                q = q.bind(f);
            }
            q.fetch_optional(&mut *conn).await?
        } else {
            None
        };
        Ok(row
            .map(|r| parse_live(&r.try_get::<String, _>(0)?))
            .transpose()?
            .flatten())
    }

    /// A credential by one of its unique columns, with its consumer's entity: the data
    /// plane's look-up for credentials it caches (two primary/unique-key reads).
    pub async fn find_credential(
        &self,
        table: &str,
        field: &str,
        value: &str,
    ) -> Result<Option<(Map<String, Value>, Map<String, Value>)>, StoreError> {
        let spec = schema::by_table(table).ok_or(StoreError::NotFound)?;
        if !spec.unique.contains(&field) {
            return Err(StoreError::Database(format!(
                "{table}.{field} is not unique"
            )));
        }
        let mut conn = self.pool.acquire().await?;
        let forms = self.plugins.stored_keys(spec.table, value);
        let sql = format!(
            "SELECT entity, consumer_id FROM {} WHERE {} IN ({})",
            spec.table,
            quote(field),
            placeholders(forms.len())
        );
        let mut q = sqlx::query(&sql);
        for f in forms {
            q = q.bind(f);
        }
        let Some(row) = q.fetch_optional(&mut *conn).await? else {
            return Ok(None);
        };
        let Some(credential) = parse_live(&row.try_get::<String, _>(0)?)? else {
            return Ok(None);
        };
        let consumer_id: String = row.try_get(1)?;
        let Some(c) = sqlx::query("SELECT entity FROM consumers WHERE id = $1")
            .bind(&consumer_id)
            .fetch_optional(&mut *conn)
            .await?
        else {
            return Ok(None);
        };
        Ok(Some((
            credential,
            parse_entity(&c.try_get::<String, _>(0)?)?,
        )))
    }

    /// A target inside its upstream, by id or by `host:port`.
    pub async fn get_in_parent(
        &self,
        spec: &EntitySpec,
        key: &str,
        parent: &(String, String),
    ) -> Result<Option<Map<String, Value>>, StoreError> {
        let col = format!("{}_id", parent.0);
        let row = if is_uuid(key) {
            sqlx::query(&format!(
                "SELECT entity FROM {} WHERE id = $1 AND {col} = $2",
                spec.table
            ))
            .bind(key.to_ascii_lowercase())
            .bind(&parent.1)
            .fetch_optional(&self.pool)
            .await?
        } else if let Some(field) = nested_key_field(spec, &parent.0) {
            // The cache key is the parent and one field: upstream + target, consumer + group
            // (Kong's `/consumers/{c}/acls/{group}`).
            let mut probe = Map::new();
            probe.insert(parent.0.clone(), json!({"id": parent.1}));
            let value = if spec.table == "targets" {
                turnpike_config::declarative::normalize_target(key)
                    .unwrap_or_else(|_| key.to_string())
            } else {
                key.to_string()
            };
            probe.insert(field.into(), Value::String(value));
            let ck = entity::cache_key(spec, &probe).unwrap_or_default();
            sqlx::query(&format!(
                "SELECT entity FROM {} WHERE cache_key = $1",
                spec.table
            ))
            .bind(ck)
            .fetch_optional(&self.pool)
            .await?
        } else {
            return match self.get(spec, key).await? {
                Some(e)
                    if e.get(&parent.0)
                        .and_then(|p| p.get("id"))
                        .and_then(|v| v.as_str())
                        == Some(parent.1.as_str()) =>
                {
                    Ok(Some(e))
                }
                _ => Ok(None),
            };
        };
        Ok(row
            .map(|r| parse_live(&r.try_get::<String, _>(0)?))
            .transpose()?
            .flatten())
    }

    /// One page of a collection, in id order.
    pub async fn list(&self, spec: &EntitySpec, q: &ListQuery) -> Result<Page, StoreError> {
        let mut sql = format!("SELECT id, entity FROM {} WHERE 1 = 1", spec.table);
        let mut binds: Vec<String> = Vec::new();
        let mut n = 0;
        let mut next = |binds: &mut Vec<String>, v: String| {
            n += 1;
            binds.push(v);
            format!("${n}")
        };
        if let Some((field, id)) = &q.parent {
            let p = next(&mut binds, id.clone());
            sql.push_str(&format!(" AND {field}_id = {p}"));
        }
        for (field, value) in q.filters_for(spec) {
            let p = next(&mut binds, value.to_string());
            sql.push_str(&format!(" AND {} = {p}", quote(field)));
        }
        if let Some(o) = &q.offset {
            let last = decode_offset(o)?;
            let p = next(&mut binds, last);
            sql.push_str(&format!(" AND id > {p}"));
        }
        if !q.tags.is_empty() {
            let t = next(&mut binds, spec.table.to_string());
            let list: Vec<String> = q
                .tags
                .iter()
                .map(|tag| next(&mut binds, tag.clone()))
                .collect();
            let having = if q.tags_all {
                format!("COUNT(DISTINCT tag) = {}", q.tags.len())
            } else {
                "COUNT(*) >= 1".into()
            };
            sql.push_str(&format!(
                " AND id IN (SELECT entity_id FROM tags WHERE entity_name = {t} AND tag IN ({}) GROUP BY entity_id HAVING {having})",
                list.join(", ")
            ));
        }
        sql.push_str(&format!(" ORDER BY id LIMIT {}", q.size + 1));
        let mut query = sqlx::query(&sql);
        for b in &binds {
            query = query.bind(b.as_str());
        }
        let rows = query.fetch_all(&self.pool).await?;
        let more = rows.len() > q.size;
        let mut data = Vec::with_capacity(rows.len().min(q.size));
        let mut last_id = String::new();
        for r in rows.into_iter().take(q.size) {
            last_id = r.try_get::<String, _>(0)?;
            if let Some(e) = parse_live(&r.try_get::<String, _>(1)?)? {
                data.push(Value::Object(e));
            }
        }
        Ok(Page {
            data,
            offset: more.then(|| encode_offset(&last_id)),
        })
    }

    /// `GET /tags/{tag}`: which entities carry a tag; `GET /tags` (`tag` `None`): every tag
    /// of every entity. Paged by (entity, tag).
    pub async fn list_tag(&self, tag: Option<&str>, q: &ListQuery) -> Result<Page, StoreError> {
        let mut sql = "SELECT entity_id, entity_name, tag FROM tags WHERE 1 = 1".to_string();
        let mut binds: Vec<String> = Vec::new();
        if let Some(t) = tag {
            binds.push(t.to_string());
            sql.push_str(&format!(" AND tag = ${}", binds.len()));
        }
        if let Some(o) = q.offset.as_deref() {
            binds.push(decode_offset(o)?);
            sql.push_str(&format!(" AND entity_id || ' ' || tag > ${}", binds.len()));
        }
        sql.push_str(&format!(
            " ORDER BY entity_id || ' ' || tag LIMIT {}",
            q.size + 1
        ));
        let mut query = sqlx::query(&sql);
        for b in &binds {
            query = query.bind(b.as_str());
        }
        let rows = query.fetch_all(&self.pool).await?;
        let more = rows.len() > q.size;
        let mut data = Vec::new();
        let mut last_id = String::new();
        for r in rows.into_iter().take(q.size) {
            let (id, name, t): (String, String, String) =
                (r.try_get(0)?, r.try_get(1)?, r.try_get(2)?);
            last_id = format!("{id} {t}");
            data.push(json!({"entity_id": id, "entity_name": name, "tag": t}));
        }
        Ok(Page {
            data,
            offset: more.then(|| encode_offset(&last_id)),
        })
    }

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
        let id = match body.get("id") {
            Some(Value::String(s)) if is_uuid(s) => s.to_ascii_lowercase(),
            Some(Value::String(_)) | Some(Value::Number(_)) | Some(Value::Bool(_)) => {
                return Err(StoreError::Schema(vec![(
                    "id".into(),
                    "expected a valid UUID".into(),
                )]))
            }
            _ => uuid::Uuid::new_v4().to_string(),
        };
        let mut tx = self.begin_write().await?;
        if self.row_exists(&mut tx, spec.table, &id).await? {
            return Err(StoreError::PrimaryKey(id));
        }
        let now = now_secs();
        body.insert("id".into(), Value::String(id.clone()));
        body.remove("created_at");
        body.remove("updated_at");
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

    fn delete_tx<'t>(
        &'t self,
        tx: &'t mut Tx<'_>,
        spec: &'static EntitySpec,
        id: &'t str,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), StoreError>> + Send + 't>>
    {
        Box::pin(async move {
            for child in ENTITIES {
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
    async fn begin_snapshot(&self) -> Result<(Tx<'static>, i64), StoreError> {
        let mut tx = self.pool.begin().await?;
        if self.backend == Backend::Postgres {
            sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
                .execute(&mut *tx)
                .await?;
        }
        let version = sqlx::query("SELECT value FROM turnpike_meta WHERE name = 'config_version'")
            .fetch_one(&mut *tx)
            .await?
            .try_get::<i64, _>(0)?;
        Ok((tx, version))
    }

    /// Starts a write: the version bump comes first so that concurrent writers queue here.
    async fn begin_write(&self) -> Result<Tx<'static>, StoreError> {
        let mut tx = self.pool.begin().await?;
        sqlx::query("UPDATE turnpike_meta SET value = value + 1 WHERE name = 'config_version'")
            .execute(&mut *tx)
            .await?;
        Ok(tx)
    }

    async fn commit(&self, mut tx: Tx<'static>) -> Result<(), StoreError> {
        // Nodes further behind than this re-read everything instead.
        sqlx::query(
            "DELETE FROM changes WHERE version < (SELECT value FROM turnpike_meta WHERE name = 'config_version') - 10000",
        )
        .execute(&mut *tx)
        .await?;
        if self.backend == Backend::Postgres {
            // Delivered to every listening node when (and only if) the transaction commits.
            sqlx::query(&format!("NOTIFY {NOTIFY_CHANNEL}"))
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn row_exists(&self, tx: &mut Tx<'_>, table: &str, id: &str) -> Result<bool, StoreError> {
        Ok(sqlx::query(&format!("SELECT 1 FROM {table} WHERE id = $1"))
            .bind(id)
            .fetch_optional(&mut **tx)
            .await?
            .is_some())
    }

    /// (id, entity) by id or endpoint key, inside a transaction.
    async fn find_tx(
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
            let forms = self.plugins.stored_keys(spec.table, key);
            let sql = format!(
                "SELECT id, entity FROM {} WHERE {} IN ({})",
                spec.table,
                quote(ek),
                placeholders(forms.len())
            );
            let mut q = sqlx::query(&sql);
            for f in forms {
                q = q.bind(f);
            }
            q.fetch_optional(&mut **tx).await?
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
    async fn resolve_tx(
        &self,
        tx: &mut Tx<'_>,
        table: &str,
        key: &str,
    ) -> Result<Option<String>, StoreError> {
        let spec = schema::by_table(table).expect("known table");
        Ok(self.find_tx(tx, spec, key).await?.map(|(id, _)| id))
    }

    /// Validates and writes one entity (insert or replace) with its tags.
    async fn write(
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
        // Unique keys, checked here for Kong's error; the UNIQUE columns back them up.
        let mut uniques: Vec<(&str, Option<String>)> = Vec::new();
        for u in spec.unique {
            let v = value.get(*u).and_then(|v| v.as_str()).map(String::from);
            if let Some(v) = &v {
                let taken = sqlx::query(&format!(
                    "SELECT id FROM {} WHERE {} = $1 AND id <> $2",
                    spec.table,
                    quote(u)
                ))
                .bind(v.as_str())
                .bind(id)
                .fetch_optional(&mut **tx)
                .await?;
                if taken.is_some() {
                    return Err(StoreError::Unique {
                        fields: format!("{{{u}=\"{v}\"}}"),
                        detail: json!({ *u: v }),
                    });
                }
            }
            uniques.push((u, v));
        }
        let cache_key = entity::cache_key(spec, &value);
        if let Some(ck) = &cache_key {
            let taken = sqlx::query(&format!(
                "SELECT id FROM {} WHERE cache_key = $1 AND id <> $2",
                spec.table
            ))
            .bind(ck.as_str())
            .bind(id)
            .fetch_optional(&mut **tx)
            .await?;
            if taken.is_some() {
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
        let created_at = value
            .get("created_at")
            .and_then(|v| v.as_f64())
            .map(|v| if spec.table == "targets" { v / 1000.0 } else { v } as i64)
            .unwrap_or(now);
        let text =
            serde_json::to_string(&value).map_err(|e| StoreError::Database(e.to_string()))?;

        let mut cols: Vec<String> = vec!["id".into()];
        cols.extend(spec.unique.iter().map(|u| quote(u)));
        if cache_key.is_some() {
            cols.push("cache_key".into());
        }
        cols.extend(fk_ids.iter().map(|(c, _)| c.clone()));
        cols.push("created_at".into());
        cols.push("entity".into());
        let placeholders: Vec<String> = (1..=cols.len()).map(|i| format!("${i}")).collect();
        let updates: Vec<String> = cols[1..]
            .iter()
            .map(|c| format!("{c} = excluded.{c}"))
            .collect();
        let sql = format!(
            "INSERT INTO {} ({}) VALUES ({}) ON CONFLICT (id) DO UPDATE SET {}",
            spec.table,
            cols.join(", "),
            placeholders.join(", "),
            updates.join(", ")
        );
        let mut q = sqlx::query(&sql).bind(id);
        for (_, v) in &uniques {
            q = q.bind(v.clone());
        }
        if let Some(ck) = &cache_key {
            q = q.bind(ck.clone());
        }
        for (_, v) in &fk_ids {
            q = q.bind(v.clone());
        }
        q = q.bind(created_at).bind(text);
        q.execute(&mut **tx).await?;
        record_change(tx, spec.table, id).await?;

        sqlx::query("DELETE FROM tags WHERE entity_id = $1")
            .bind(id)
            .execute(&mut **tx)
            .await?;
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
            let snis = schema::by_table("snis").unwrap();
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
        if let Some((field, shown)) = reveal {
            value.insert(field, shown);
        }
        Ok(value)
    }

    /// The names of a certificate's snis (Kong shows them on the certificate).
    pub async fn certificate_snis(&self, cert_id: &str) -> Result<Vec<String>, StoreError> {
        sqlx::query("SELECT name FROM snis WHERE certificate_id = $1 ORDER BY name")
            .bind(cert_id)
            .fetch_all(&self.pool)
            .await?
            .iter()
            .map(|r| r.try_get::<String, _>(0).map_err(StoreError::from))
            .collect()
    }

    /// Every entity, as a declarative config (`_format_version: "3.0"`), read in one
    /// transaction so that it is consistent, with the config version it reflects.
    pub async fn export(&self) -> Result<(i64, Value), StoreError> {
        let (version, raw) = self.export_raw().await?;
        Ok((version, assemble(raw)?))
    }

    /// The rows of every table as stored (JSON text), read in one consistent transaction:
    /// the I/O half of [`Store::export`]; [`assemble`] is the CPU half, which the config sync
    /// runs on its own low-priority thread.
    pub async fn export_raw(&self) -> Result<(i64, RawExport), StoreError> {
        let (mut tx, version) = self.begin_snapshot().await?;
        let mut raw = Vec::with_capacity(ENTITIES.len());
        for spec in ENTITIES {
            let rows = sqlx::query(&format!("SELECT entity FROM {} ORDER BY id", spec.table))
                .fetch_all(&mut *tx)
                .await?;
            let texts = rows
                .iter()
                .map(|r| r.try_get::<String, _>(0))
                .collect::<Result<Vec<_>, _>>()?;
            raw.push((spec.table, texts));
        }
        tx.commit().await?;
        Ok((version, raw))
    }

    /// The rows changed since version `since`, read in one consistent transaction with the
    /// version they lead to. `None` when the change log no longer covers `since` (pruned, or a
    /// gap): the caller re-reads everything.
    pub async fn changes_since(&self, since: i64) -> Result<Option<(i64, Delta)>, StoreError> {
        let (mut tx, version) = self.begin_snapshot().await?;
        if version <= since {
            tx.commit().await?;
            return Ok(Some((version, Vec::new())));
        }
        let covered = sqlx::query("SELECT COUNT(DISTINCT version) FROM changes WHERE version > $1")
            .bind(since)
            .fetch_one(&mut *tx)
            .await?
            .try_get::<i64, _>(0)?;
        if covered != version - since {
            tx.commit().await?;
            return Ok(None);
        }
        let rows =
            sqlx::query("SELECT DISTINCT entity_name, entity_id FROM changes WHERE version > $1")
                .bind(since)
                .fetch_all(&mut *tx)
                .await?;
        let mut delta = Vec::with_capacity(rows.len());
        for r in rows {
            let table: String = r.try_get(0)?;
            let id: String = r.try_get(1)?;
            let Some(spec) = schema::by_table(&table) else {
                continue;
            };
            let entity = sqlx::query(&format!("SELECT entity FROM {} WHERE id = $1", spec.table))
                .bind(&id)
                .fetch_optional(&mut *tx)
                .await?
                .map(|r| r.try_get::<String, _>(0))
                .transpose()?;
            delta.push((spec.table, id, entity));
        }
        tx.commit().await?;
        Ok(Some((version, delta)))
    }

    /// Writes a validated declarative config into the store (`config db_import`): each entity
    /// upserted by its id, as Kong's `load_into_db` does, all in one transaction (entities
    /// already stored and absent from the file stay).
    pub async fn import(&self, cfg: &turnpike_config::Config) -> Result<usize, StoreError> {
        let v = cfg.to_json();
        let mut tx = self.begin_write().await?;
        let mut count = 0;
        for spec in ENTITIES {
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
                    .map_err(|e| match e {
                        StoreError::Schema(v) => StoreError::Schema(
                            v.into_iter()
                                .map(|(f, m)| (format!("{}.{id}.{f}", spec.table), m))
                                .collect(),
                        ),
                        other => other,
                    })?;
                count += 1;
            }
        }
        self.commit(tx).await?;
        Ok(count)
    }
}

/// Whether an entity reached through a nested path belongs to the parent in that path.
fn belongs_to(entity: &Map<String, Value>, parent: &Option<(String, String)>) -> bool {
    match parent {
        None => true,
        Some((field, pid)) => {
            entity
                .get(field)
                .and_then(|p| p.get("id"))
                .and_then(|v| v.as_str())
                == Some(pid.as_str())
        }
    }
}

/// Notes, inside a write transaction, that this version touched a row.
async fn record_change(tx: &mut Tx<'_>, table: &str, id: &str) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO changes (version, entity_name, entity_id) SELECT value, $1, $2 FROM turnpike_meta WHERE name = 'config_version'",
    )
    .bind(table)
    .bind(id)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// What changed between two config versions: each touched row, with its current entity
/// (`None`: deleted).
pub type Delta = Vec<(&'static str, String, Option<String>)>;

/// Each table's rows as stored: (table, entity JSON texts).
pub type RawExport = Vec<(&'static str, Vec<String>)>;

/// Builds the declarative config from raw rows.
pub fn assemble(raw: RawExport) -> Result<Value, StoreError> {
    let mut top = Map::new();
    top.insert("_format_version".into(), json!("3.0"));
    top.insert("_transform".into(), json!(false));
    for (table, texts) in raw {
        if texts.is_empty() {
            continue;
        }
        let mut list = Vec::with_capacity(texts.len());
        for t in &texts {
            list.push(Value::Object(parse_entity(t)?));
        }
        top.insert(table.into(), Value::Array(list));
    }
    Ok(Value::Object(top))
}

/// The field that, with the parent, makes an entity's cache key: an entity nested under that
/// parent can be addressed by it (`/upstreams/{u}/targets/{host:port}`,
/// `/consumers/{c}/acls/{group}`).
pub fn nested_key_field(spec: &EntitySpec, parent_field: &str) -> Option<&'static str> {
    match spec.cache_key {
        [p, field] if *p == parent_field => Some(field),
        _ => None,
    }
}

/// `$1, $2, ...` for `n` bound values.
fn placeholders(n: usize) -> String {
    (1..=n)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_options() {
        let q = ListQuery::parse("size=5&tags=a,b&offset=xyz").unwrap();
        assert_eq!((q.size, q.tags_all, q.tags.len()), (5, true, 2));
        let q = ListQuery::parse("tags=a%2Fb").unwrap();
        assert!(!q.tags_all);
        assert!(matches!(
            ListQuery::parse("size=abc"),
            Err(StoreError::InvalidSize(_))
        ));
        assert!(matches!(
            ListQuery::parse("size=1001"),
            Err(StoreError::InvalidSize(_))
        ));
        assert!(matches!(
            ListQuery::parse("tags="),
            Err(StoreError::InvalidOptions(_))
        ));
    }

    #[test]
    fn offsets_round_trip_and_reject_garbage() {
        let id = "6f1e9e2a-0000-4000-8000-000000000001";
        assert_eq!(decode_offset(&encode_offset(id)).unwrap(), id);
        assert!(decode_offset("%%%").is_err());
    }

    #[test]
    fn uuid_or_endpoint_key() {
        assert!(is_uuid("6f1e9e2a-0000-4000-8000-000000000001"));
        assert!(!is_uuid("my-service"));
    }
}
