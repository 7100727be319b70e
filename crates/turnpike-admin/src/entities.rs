//! Kong's generated entity endpoints: `/{entity}`, `/{entity}/{id or endpoint key}`, nested
//! collections (`/services/{s}/routes`, `/consumers/{c}/key-auth/{id}`) and parent look-ups
//! (`/routes/{r}/service`). With a database they read and write the store; DB-less they read
//! the running config and refuse writes with 405, as Kong does.

use http::{Method, StatusCode};
use serde_json::{json, Map, Value};
use turnpike_store::crud::{is_uuid, url_pairs};
use turnpike_store::schema::{self, EntitySpec};
use turnpike_store::{ListQuery, Page, StoreError};

use crate::forms::{form_arrays, form_fields, is_form, parse_body};
use crate::{json_response, message, Admin, Resp};

/// What a path names.
enum Target {
    /// `/{entity}` or `/{parent}/{p}/{entity}`.
    Collection {
        spec: &'static EntitySpec,
        parent: Option<(String, &'static EntitySpec, String)>,
    },
    /// `/{entity}/{key}` or `/{parent}/{p}/{entity}/{key}`.
    Entity {
        spec: &'static EntitySpec,
        key: String,
        parent: Option<(String, &'static EntitySpec, String)>,
    },
    /// `/{entity}/{key}/{fk field}`: the entity a foreign key points at.
    Referenced {
        spec: &'static EntitySpec,
        key: String,
        field: &'static schema::ForeignKey,
    },
}

impl Target {
    fn spec(&self) -> &'static EntitySpec {
        match self {
            Target::Collection { spec, .. }
            | Target::Entity { spec, .. }
            | Target::Referenced { spec, .. } => spec,
        }
    }
}

fn route(tables: schema::Tables, segments: &[&str]) -> Option<Target> {
    let spec = tables.by_path(segments.first()?)?;
    match segments.len() {
        1 => Some(Target::Collection { spec, parent: None }),
        2 => Some(Target::Entity {
            spec,
            key: segments[1].to_string(),
            parent: None,
        }),
        3 | 4 => {
            if let Some(child) = tables.child(spec, segments[2]) {
                let fk = child.foreign_to(spec.table)?;
                let parent = Some((fk.field.to_string(), spec, segments[1].to_string()));
                return Some(if segments.len() == 3 {
                    Target::Collection {
                        spec: child,
                        parent,
                    }
                } else {
                    Target::Entity {
                        spec: child,
                        key: segments[3].to_string(),
                        parent,
                    }
                });
            }
            if segments.len() == 3 {
                let field = spec.parent_field(segments[2])?;
                return Some(Target::Referenced {
                    spec,
                    key: segments[1].to_string(),
                    field,
                });
            }
            None
        }
        _ => None,
    }
}

pub(crate) fn store_error(e: StoreError) -> Resp {
    if let StoreError::Database(m) = &e {
        tracing::error!("admin: database error: {m}");
    }
    let (status, body) = e.to_kong();
    json_response(
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        &body,
    )
}

fn list_body(page: Page, base: &str, q: &ListQuery, query: &str) -> Value {
    let next = page.offset.as_ref().map(|o| {
        let mut extra = String::new();
        for (k, v) in url_pairs(query) {
            if k == "tags" || k == "size" {
                extra.push_str(&format!(
                    "&{k}={}",
                    turnpike_config::conf::percent_encode(&v)
                ));
            }
        }
        format!(
            "{base}?offset={}{extra}",
            turnpike_config::conf::percent_encode(o)
        )
    });
    let mut m = Map::new();
    m.insert("data".into(), Value::Array(page.data));
    if let Some(o) = page.offset {
        m.insert("offset".into(), Value::String(o));
    }
    m.insert(
        "next".into(),
        next.map(Value::String).unwrap_or(Value::Null),
    );
    let _ = q;
    Value::Object(m)
}

impl Admin {
    /// A plugin written as a form: its config's single values for array fields become arrays.
    fn form_config_arrays(&self, body: &mut Map<String, Value>) {
        let Some(name) = body.get("name").and_then(|n| n.as_str()).map(String::from) else {
            return;
        };
        let Some(schema) = self.plugins.schema_json(&name) else {
            return;
        };
        let config_fields = schema["fields"]
            .as_array()
            .into_iter()
            .flatten()
            .find_map(|f| f.get("config"))
            .map(|c| c["fields"].clone());
        if let (Some(Value::Object(config)), Some(fields)) = (body.get_mut("config"), config_fields)
        {
            form_arrays(config, &fields);
        }
    }

    /// Serves an entity path; `None` when the path is not an entity path.
    pub(crate) async fn entities(
        &self,
        method: &Method,
        path: &str,
        query: &str,
        body: &[u8],
        content_type: Option<&str>,
    ) -> Option<Resp> {
        let segments: Vec<String> = path
            .trim_matches('/')
            .split('/')
            .map(turnpike_store::crud::percent_decode)
            .collect();
        let segs: Vec<&str> = segments.iter().map(String::as_str).collect();
        let target = route(self.tables(), &segs)?;
        Some(match self.store.as_ref() {
            Some(_) => {
                self.with_store(method, target, path, query, body, content_type)
                    .await
            }
            None => self.dbless(method, target, path, query),
        })
    }

    async fn with_store(
        &self,
        method: &Method,
        target: Target,
        path: &str,
        query: &str,
        body: &[u8],
        content_type: Option<&str>,
    ) -> Resp {
        let store = self.store.as_ref().unwrap();
        // Resolve a parent in the path to its id first: it must exist.
        let resolve_parent = |parent: Option<(String, &'static EntitySpec, String)>| async move {
            match parent {
                None => Ok(None),
                Some((field, pspec, key)) => match store.get(pspec, &key).await? {
                    Some(p) => Ok(Some((
                        field,
                        p["id"].as_str().unwrap_or_default().to_string(),
                    ))),
                    None => Err(StoreError::NotFound),
                },
            }
        };
        let write = matches!(*method, Method::POST | Method::PUT | Method::PATCH);
        let mut body = if write {
            match parse_body(content_type, body) {
                Ok(b) => b,
                Err(r) => return r,
            }
        } else {
            Map::new()
        };
        if write && is_form(content_type) {
            self.form_config_arrays(&mut body);
            if let Some(entity) = self.tables().plugin_entity(target.spec().table) {
                form_fields(&mut body, entity.fields);
            }
        }
        let result: Result<(StatusCode, Option<Value>), StoreError> = async {
            match target {
                Target::Collection { spec, parent } => {
                    let parent = resolve_parent(parent).await?;
                    match *method {
                        Method::GET => {
                            let mut q = ListQuery::parse(query)?;
                            q.parent = parent;
                            let mut page = store.list(spec, &q).await?;
                            if spec.table == "certificates" {
                                for c in page.data.iter_mut() {
                                    self.add_snis(c).await?;
                                }
                            }
                            Ok((StatusCode::OK, Some(list_body(page, path, &q, query))))
                        }
                        Method::POST => {
                            let v = store.insert(spec, body, parent).await?;
                            Ok((StatusCode::CREATED, Some(Value::Object(v))))
                        }
                        _ => Ok((StatusCode::METHOD_NOT_ALLOWED, None)),
                    }
                }
                Target::Entity { spec, key, parent } => {
                    let parent = resolve_parent(parent).await?;
                    match *method {
                        Method::GET => {
                            let found = match &parent {
                                Some(p) => store.get_in_parent(spec, &key, p).await?,
                                None => store.get(spec, &key).await?,
                            };
                            let mut v = Value::Object(found.ok_or(StoreError::NotFound)?);
                            if spec.table == "certificates" {
                                self.add_snis(&mut v).await?;
                            }
                            Ok((StatusCode::OK, Some(v)))
                        }
                        Method::PUT => {
                            let key = self.nested_key(spec, &key, &parent).await?;
                            let v = store.upsert(spec, &key, body, parent).await?;
                            Ok((StatusCode::OK, Some(Value::Object(v))))
                        }
                        Method::PATCH => {
                            let key = self.nested_key(spec, &key, &parent).await?;
                            let v = store.update(spec, &key, body, parent).await?;
                            Ok((StatusCode::OK, Some(Value::Object(v))))
                        }
                        Method::DELETE => {
                            let key = self.nested_key(spec, &key, &parent).await?;
                            store.delete(spec, &key, parent).await?;
                            Ok((StatusCode::NO_CONTENT, None))
                        }
                        _ => Ok((StatusCode::METHOD_NOT_ALLOWED, None)),
                    }
                }
                Target::Referenced { spec, key, field } => {
                    let child = store.get(spec, &key).await?.ok_or(StoreError::NotFound)?;
                    let pid = child
                        .get(field.field)
                        .and_then(|p| p.get("id"))
                        .and_then(|v| v.as_str())
                        .ok_or(StoreError::NotFound)?
                        .to_string();
                    let pspec = self.tables().by_table(field.table).unwrap();
                    match *method {
                        Method::GET => {
                            let v = store.get(pspec, &pid).await?.ok_or(StoreError::NotFound)?;
                            Ok((StatusCode::OK, Some(Value::Object(v))))
                        }
                        Method::PATCH => {
                            let v = store.update(pspec, &pid, body, None).await?;
                            Ok((StatusCode::OK, Some(Value::Object(v))))
                        }
                        Method::PUT => {
                            let v = store.upsert(pspec, &pid, body, None).await?;
                            Ok((StatusCode::OK, Some(Value::Object(v))))
                        }
                        Method::DELETE => {
                            store.delete(pspec, &pid, None).await?;
                            Ok((StatusCode::NO_CONTENT, None))
                        }
                        _ => Ok((StatusCode::METHOD_NOT_ALLOWED, None)),
                    }
                }
            }
        }
        .await;
        match result {
            Ok((status, value)) => {
                if write || *method == Method::DELETE {
                    // Start this node's rebuild now; other nodes follow via NOTIFY (or the
                    // poll). As in Kong the answer does not wait for it: with a large config a
                    // rebuild takes tens of milliseconds, and bulk writers (decK) would queue
                    // behind every one of them.
                    if let Some(sync) = &self.sync {
                        sync.trigger();
                    }
                }
                match (status, value) {
                    (StatusCode::METHOD_NOT_ALLOWED, _) => {
                        message(StatusCode::METHOD_NOT_ALLOWED, "Method not allowed")
                    }
                    (s, Some(v)) => json_response(s, &v),
                    (s, None) => {
                        let mut r = json_response(s, &Value::Null);
                        *r.body_mut() = crate::full(bytes::Bytes::new());
                        r.headers_mut().remove(http::header::CONTENT_TYPE);
                        r
                    }
                }
            }
            Err(e) => store_error(e),
        }
    }

    /// A nested entity addressed by its cache key's field (a target by `host:port`, an ACL by
    /// group) is stored under its id: find it.
    async fn nested_key(
        &self,
        spec: &'static EntitySpec,
        key: &str,
        parent: &Option<(String, String)>,
    ) -> Result<String, StoreError> {
        match parent {
            Some(p)
                if !is_uuid(key)
                    && turnpike_store::crud::nested_key_field(spec, &p.0).is_some() =>
            {
                let store = self.store.as_ref().unwrap();
                Ok(store
                    .get_in_parent(spec, key, p)
                    .await?
                    .and_then(|e| e.get("id").and_then(|v| v.as_str()).map(String::from))
                    .unwrap_or_else(|| key.to_string()))
            }
            _ => Ok(key.to_string()),
        }
    }

    async fn add_snis(&self, cert: &mut Value) -> Result<(), StoreError> {
        let id = cert["id"].as_str().unwrap_or_default().to_string();
        let names = self.store.as_ref().unwrap().certificate_snis(&id).await?;
        cert["snis"] = json!(names);
        Ok(())
    }

    /// DB-less: reads come from the running config; writes are refused.
    fn dbless(&self, method: &Method, target: Target, path: &str, query: &str) -> Resp {
        if *method != Method::GET {
            let table = match &target {
                Target::Collection { spec, .. } | Target::Entity { spec, .. } => spec.table,
                Target::Referenced { field, .. } => field.table,
            };
            return message(
                StatusCode::METHOD_NOT_ALLOWED,
                &format!(
                    "cannot modify '{table}' entities when not using a database (use POST /config)"
                ),
            );
        }
        let all = self.gateway.snapshot.load().config.to_json();
        let rows = |table: &str| -> Vec<Map<String, Value>> {
            let mut v: Vec<Map<String, Value>> = all
                .get(table)
                .and_then(|a| a.as_array())
                .map(|a| a.iter().filter_map(|x| x.as_object().cloned()).collect())
                .unwrap_or_default();
            v.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
            v
        };
        let find = |spec: &EntitySpec, key: &str| -> Option<Map<String, Value>> {
            rows(spec.table).into_iter().find(|e| {
                e.get("id").and_then(|v| v.as_str()) == Some(key)
                    || spec
                        .endpoint_key
                        .is_some_and(|ek| e.get(ek).and_then(|v| v.as_str()) == Some(key))
            })
        };
        let fk_of = |e: &Map<String, Value>, field: &str| -> Option<String> {
            e.get(field)
                .and_then(|p| p.get("id"))
                .and_then(|v| v.as_str())
                .map(String::from)
        };
        match target {
            Target::Collection { spec, parent } => {
                let q = match ListQuery::parse(query) {
                    Ok(q) => q,
                    Err(e) => return store_error(e),
                };
                let pid = match parent {
                    Some((field, pspec, key)) => match find(pspec, &key) {
                        Some(p) => Some((field, p["id"].as_str().unwrap_or_default().to_string())),
                        None => return store_error(StoreError::NotFound),
                    },
                    None => None,
                };
                let after = match q.offset.as_deref().map(|o| {
                    use base64::Engine;
                    base64::engine::general_purpose::URL_SAFE_NO_PAD
                        .decode(o)
                        .ok()
                        .and_then(|b| String::from_utf8(b).ok())
                        .ok_or_else(|| StoreError::InvalidOffset(o.to_string()))
                }) {
                    Some(Err(e)) => return store_error(e),
                    Some(Ok(a)) => Some(a),
                    None => None,
                };
                let matching: Vec<Map<String, Value>> = rows(spec.table)
                    .into_iter()
                    .filter(|e| {
                        q.filters_for(spec)
                            .all(|(k, v)| e.get(k).and_then(|x| x.as_str()) == Some(v))
                    })
                    .filter(|e| match &pid {
                        Some((field, id)) => fk_of(e, field).as_deref() == Some(id),
                        None => true,
                    })
                    .filter(|e| {
                        if q.tags.is_empty() {
                            return true;
                        }
                        let tags: Vec<&str> = e
                            .get("tags")
                            .and_then(|t| t.as_array())
                            .map(|a| a.iter().filter_map(|t| t.as_str()).collect())
                            .unwrap_or_default();
                        if q.tags_all {
                            q.tags.iter().all(|t| tags.contains(&t.as_str()))
                        } else {
                            q.tags.iter().any(|t| tags.contains(&t.as_str()))
                        }
                    })
                    .filter(|e| match &after {
                        Some(a) => e["id"].as_str().unwrap_or_default() > a.as_str(),
                        None => true,
                    })
                    .collect();
                let more = matching.len() > q.size;
                let data: Vec<Value> = matching
                    .into_iter()
                    .take(q.size)
                    .map(Value::Object)
                    .collect();
                let offset = more.then(|| {
                    use base64::Engine;
                    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(
                        data.last()
                            .and_then(|d| d["id"].as_str())
                            .unwrap_or_default(),
                    )
                });
                json_response(
                    StatusCode::OK,
                    &list_body(Page { data, offset }, path, &q, query),
                )
            }
            Target::Entity { spec, key, parent } => {
                let found = find(spec, &key).filter(|e| match &parent {
                    Some((field, pspec, pkey)) => find(pspec, pkey)
                        .is_some_and(|p| fk_of(e, field).as_deref() == p["id"].as_str()),
                    None => true,
                });
                match found {
                    Some(e) => json_response(StatusCode::OK, &Value::Object(e)),
                    None => store_error(StoreError::NotFound),
                }
            }
            Target::Referenced { spec, key, field } => {
                let parent = find(spec, &key)
                    .and_then(|e| fk_of(&e, field.field))
                    .and_then(|pid| find(self.tables().by_table(field.table).unwrap(), &pid));
                match parent {
                    Some(p) => json_response(StatusCode::OK, &Value::Object(p)),
                    None => store_error(StoreError::NotFound),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tables() -> schema::Tables {
        schema::Tables::new(&turnpike_plugins::bundled())
    }

    #[test]
    fn paths_route_to_targets() {
        assert!(matches!(
            route(tables(), &["services"]),
            Some(Target::Collection { parent: None, .. })
        ));
        assert!(matches!(
            route(tables(), &["services", "s", "routes"]),
            Some(Target::Collection {
                parent: Some(_),
                ..
            })
        ));
        assert!(matches!(
            route(tables(), &["consumers", "c", "key-auth", "k"]),
            Some(Target::Entity {
                parent: Some(_),
                ..
            })
        ));
        assert!(matches!(
            route(tables(), &["routes", "r", "service"]),
            Some(Target::Referenced { .. })
        ));
        assert!(route(tables(), &["routes", "r", "nope"]).is_none());
        assert!(route(tables(), &["nope"]).is_none());
    }
}
