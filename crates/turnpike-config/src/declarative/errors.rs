//! Errors of a declarative config, in the shapes Kong uses: a message, the nested `fields`
//! table, and `flattened_errors` (one entry per entity, `POST /config?flatten_errors=1`).

use serde_json::{json, Map, Value};

/// The errors of one entity.
#[derive(Debug, Clone)]
pub struct EntityError {
    /// The table: `services`, `routes`, ...
    pub table: &'static str,
    /// Where the entity stands in the file, e.g. `services.1.routes.2` (1-based, as Kong).
    pub path: Vec<(&'static str, usize)>,
    pub name: Option<String>,
    pub id: Option<String>,
    pub tags: Option<Value>,
    pub entity: Value,
    /// (field path, message); `@entity` for errors about the whole entity.
    pub errors: Vec<(String, String)>,
}

impl EntityError {
    pub fn new(
        table: &'static str,
        path: &[(&'static str, usize)],
        map: &Map<String, Value>,
        errors: Vec<(String, String)>,
    ) -> Self {
        let s = |k: &str| map.get(k).and_then(|v| v.as_str()).map(String::from);
        EntityError {
            table,
            path: path.to_vec(),
            name: s("name").or_else(|| s("username")),
            id: s("id"),
            tags: map.get("tags").cloned(),
            entity: Value::Object(map.clone()),
            errors,
        }
    }
}

#[derive(Debug, Clone)]
pub struct DeclarativeError {
    /// Errors not tied to one entity (top-level fields, parse errors).
    pub top: Vec<(String, String)>,
    pub entities: Vec<EntityError>,
    /// A parse failure: the whole message.
    pub message: Option<String>,
}

pub fn render_path(p: &[(&'static str, usize)]) -> String {
    p.iter()
        .map(|(t, i)| format!("{t}.{i}"))
        .collect::<Vec<_>>()
        .join(".")
}

impl DeclarativeError {
    pub fn message(msg: String) -> Self {
        DeclarativeError {
            top: Vec::new(),
            entities: Vec::new(),
            message: Some(msg),
        }
    }

    /// Every error on its own line: `in routes.2 (name 'r'): paths.1: should start with ...`.
    pub fn lines(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(m) = &self.message {
            out.push(m.clone());
        }
        for (f, m) in &self.top {
            out.push(format!("{f}: {m}"));
        }
        for e in &self.entities {
            let who = match (&e.name, &e.id) {
                (Some(n), _) => format!("{} '{}'", singular(e.table), n),
                (None, Some(id)) => format!("{} {}", singular(e.table), id),
                _ => singular(e.table).to_string(),
            };
            for (f, m) in &e.errors {
                if f == "@entity" {
                    out.push(format!("in {} ({}): {}", render_path(&e.path), who, m));
                } else {
                    out.push(format!(
                        "in {} ({}): {}: {}",
                        render_path(&e.path),
                        who,
                        f,
                        m
                    ));
                }
            }
        }
        out
    }

    /// Kong's nested error table: `{"services": [null, {"host": "required field missing"}]}`.
    pub fn fields(&self) -> Value {
        let mut root = Value::Object(Map::new());
        for (f, m) in &self.top {
            insert_path(
                &mut root,
                &f.split('.').map(String::from).collect::<Vec<_>>(),
                m,
            );
        }
        for e in &self.entities {
            let mut base: Vec<String> = Vec::new();
            for (t, i) in &e.path {
                base.push(t.to_string());
                base.push(i.to_string());
            }
            for (f, m) in &e.errors {
                let mut p = base.clone();
                p.extend(f.split('.').map(String::from));
                insert_path(&mut root, &p, m);
            }
        }
        root
    }

    /// Kong's `flattened_errors`.
    pub fn flattened(&self) -> Value {
        let list: Vec<Value> = self
            .entities
            .iter()
            .map(|e| {
                let errors: Vec<Value> = e
                    .errors
                    .iter()
                    .map(|(f, m)| {
                        if f == "@entity" {
                            json!({"type": "entity", "message": m})
                        } else {
                            json!({"type": "field", "field": f, "message": m})
                        }
                    })
                    .collect();
                json!({
                    "entity_type": singular(e.table),
                    "entity_name": e.name,
                    "entity_id": e.id,
                    "entity_tags": e.tags,
                    "entity": e.entity,
                    "errors": errors,
                })
            })
            .collect();
        Value::Array(list)
    }

    /// The body Kong's `POST /config` answers with on 400.
    pub fn to_kong_json(&self, flatten: bool) -> Value {
        let mut body = json!({
            "code": 14,
            "name": "invalid declarative configuration",
            "message": match &self.message {
                Some(m) => m.clone(),
                None => format!("declarative config is invalid: {}", self.summary()),
            },
            "fields": self.fields(),
        });
        if flatten {
            body["flattened_errors"] = self.flattened();
        }
        body
    }

    pub fn summary(&self) -> String {
        serde_json::to_string(&self.fields()).unwrap_or_default()
    }
}

impl std::fmt::Display for DeclarativeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.lines().join("\n"))
    }
}

impl std::error::Error for DeclarativeError {}

/// Kong's schema name of a table's entity: every table is named for its entity in the
/// plural (`services`, `keyauth_credentials`, `acls`, `ca_certificates`).
fn singular(table: &str) -> &str {
    table.strip_suffix('s').unwrap_or(table)
}

/// Inserts a message at a path of object keys and 1-based array indexes (numeric segments).
fn insert_path(root: &mut Value, path: &[String], msg: &str) {
    let Some((head, rest)) = path.split_first() else {
        return;
    };
    let is_index = |s: &str| s.parse::<usize>().ok().filter(|n| *n > 0);
    if let Some(idx) = is_index(head) {
        if !root.is_array() {
            *root = Value::Array(Vec::new());
        }
        let arr = root.as_array_mut().unwrap();
        while arr.len() < idx {
            arr.push(Value::Null);
        }
        let slot = &mut arr[idx - 1];
        if rest.is_empty() {
            append_msg(slot, msg);
        } else {
            insert_path(slot, rest, msg);
        }
    } else {
        if !root.is_object() {
            *root = Value::Object(Map::new());
        }
        let obj = root.as_object_mut().unwrap();
        let key = if head == "@entity" {
            "@entity"
        } else {
            head.as_str()
        };
        let slot = obj.entry(key.to_string()).or_insert(Value::Null);
        if rest.is_empty() {
            if key == "@entity" {
                if !slot.is_array() {
                    *slot = Value::Array(Vec::new());
                }
                slot.as_array_mut().unwrap().push(Value::from(msg));
            } else {
                append_msg(slot, msg);
            }
        } else {
            insert_path(slot, rest, msg);
        }
    }
}

fn append_msg(slot: &mut Value, msg: &str) {
    match slot {
        Value::Null => *slot = Value::from(msg),
        Value::String(s) => *slot = Value::Array(vec![Value::from(s.clone()), Value::from(msg)]),
        Value::Array(a) => a.push(Value::from(msg)),
        _ => {}
    }
}
