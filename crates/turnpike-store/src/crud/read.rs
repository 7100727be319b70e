//! Entity reads: by id or endpoint key, in a parent, lists and tag lists, a credential for the data plane.

use super::*;

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
            let mut sql = String::new();
            by_stored_key(self, &mut sql, "entity", spec.table, ek, key)
                .fetch_optional(&mut *conn)
                .await?
        } else {
            None
        };
        Ok(row
            .map(|r| parse_live(&r.try_get::<String, _>(0)?))
            .transpose()?
            .flatten())
    }

    /// A credential by one of its unique columns, with its consumer's entity: the data
    /// plane's look-up for credentials it caches (two primary/unique-key reads). An entity
    /// that hangs under a credential instead of a consumer (an oauth2 token under its
    /// application) comes with that credential's entity in its `credential` field, and the
    /// credential's consumer (three such reads).
    pub async fn find_credential(
        &self,
        table: &str,
        field: &str,
        value: &str,
    ) -> Result<Option<(Map<String, Value>, Map<String, Value>)>, StoreError> {
        let spec = self.tables.by_table(table).ok_or(StoreError::NotFound)?;
        if !spec.unique.contains(&field) {
            return Err(StoreError::Database(format!(
                "{table}.{field} is not unique"
            )));
        }
        // A row of no one (the session plugin's `sessions`): the row alone, with an empty
        // consumer.
        if spec.foreign.is_empty() {
            let sql = format!(
                "SELECT entity FROM {} WHERE {} = $1",
                spec.table,
                quote(field)
            );
            let mut conn = self.direct.get().await?;
            let found = sqlx::query(&sql)
                .bind(value)
                .fetch_optional(&mut *conn)
                .await;
            let Some(row) = conn.seen(found)? else {
                return Ok(None);
            };
            return Ok(parse_live(&row.try_get::<String, _>(0)?)?.map(|r| (r, Map::new())));
        }
        // The foreign key that leads to the consumer: the consumer's own, or a parent
        // credential's.
        let via = match spec.foreign_to("consumers") {
            Some(fk) => fk,
            None => spec
                .foreign
                .iter()
                .find(|fk| {
                    self.tables
                        .by_table(fk.table)
                        .is_some_and(|p| p.foreign_to("consumers").is_some())
                })
                .ok_or_else(|| StoreError::Database(format!("{table} belongs to no consumer")))?,
        };
        // One round trip: the row, its parent credential (if any) and the consumer, joined.
        let (parent_col, join) = if via.table == "consumers" {
            ("", format!("JOIN consumers k ON k.id = t.{}", via.column()))
        } else {
            (
                "p.entity, ",
                format!(
                    "JOIN {} p ON p.id = t.{} JOIN consumers k ON k.id = p.consumer_id",
                    via.table,
                    via.column()
                ),
            )
        };
        let forms = self.plugins.stored_keys(spec.table, value);
        let marks: Vec<String> = (1..=forms.len()).map(|i| format!("${i}")).collect();
        let sql = format!(
            "SELECT t.entity, {parent_col}k.entity FROM {} t {join} WHERE t.{} IN ({})",
            spec.table,
            quote(field),
            marks.join(", ")
        );
        let mut conn = self.direct.get().await?;
        let found = forms
            .into_iter()
            .fold(sqlx::query(&sql), |q, f| q.bind(f))
            .fetch_optional(&mut *conn)
            .await;
        let Some(row) = conn.seen(found)? else {
            return Ok(None);
        };
        let Some(mut found) = parse_live(&row.try_get::<String, _>(0)?)? else {
            return Ok(None);
        };
        let mut consumer = 1;
        if via.table != "consumers" {
            let Some(credential) = parse_live(&row.try_get::<String, _>(1)?)? else {
                return Ok(None);
            };
            found.insert(via.field.to_string(), Value::Object(credential));
            consumer = 2;
        }
        Ok(Some((
            found,
            parse_entity(&row.try_get::<String, _>(consumer)?)?,
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
}
