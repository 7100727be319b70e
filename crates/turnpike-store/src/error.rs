//! Store errors, each rendered as Kong's Admin API renders its DAO errors (`kong/db/errors.lua`):
//! `{"code", "name", "message", "fields"}` and the HTTP status Kong maps the code to.

use serde_json::{json, Map, Value};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Code 2: the entity breaks its schema. (field path, message), `a.b` for nested fields.
    #[error("schema violation ({})", describe(.0))]
    Schema(Vec<(String, String)>),
    /// Code 3: `POST` with an id that exists.
    #[error("primary key violation on id {0}")]
    PrimaryKey(String),
    /// Code 4: a foreign key names no existing entity.
    #[error("foreign key violation on {field}")]
    ForeignKey {
        field: String,
        table: String,
        key: String,
    },
    /// Code 4 as Kong uses it on delete: another entity still references this one.
    #[error("'{child}' entities reference this '{parent}' entity")]
    ReferencedBy { child: String, parent: String },
    /// Code 5: a unique field (or Kong's cache key) is taken.
    #[error("unique constraint violation on {fields}")]
    Unique { fields: String, detail: Value },
    #[error("not found")]
    NotFound,
    /// Code 7.
    #[error("invalid offset")]
    InvalidOffset(String),
    /// Code 9.
    #[error("invalid size")]
    InvalidSize(String),
    /// Code 11.
    #[error("invalid options")]
    InvalidOptions(Value),
    /// Code 8: the database failed or is unreachable.
    #[error("database error: {0}")]
    Database(String),
    /// Code 8 too, but the database could not be reached at all (connect, I/O, pool timeout):
    /// the node keeps serving its last config and retries.
    #[error("database unreachable: {0}")]
    Unavailable(String),
}

impl StoreError {
    /// The same failure, for another of the writes one failed statement carried.
    pub(crate) fn again(&self) -> StoreError {
        match self {
            StoreError::Unavailable(m) => StoreError::Unavailable(m.clone()),
            StoreError::Database(m) => StoreError::Database(m.clone()),
            other => StoreError::Database(other.to_string()),
        }
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        if let sqlx::Error::Database(d) = &e {
            match d.code().as_deref() {
                // Unique: PostgreSQL 23505, SQLite 2067 / 1555 (primary key).
                Some("23505") | Some("2067") | Some("1555") => {
                    return StoreError::Unique {
                        fields: "a unique key".into(),
                        detail: json!({ "@entity": d.message() }),
                    }
                }
                // Foreign key: PostgreSQL 23503, SQLite 787.
                Some("23503") | Some("787") => {
                    return StoreError::ForeignKey {
                        field: "@entity".into(),
                        table: String::new(),
                        key: d.message().to_string(),
                    }
                }
                _ => {}
            }
        }
        match e {
            sqlx::Error::Io(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Tls(_)
            | sqlx::Error::Protocol(_) => StoreError::Unavailable(e.to_string()),
            _ => StoreError::Database(e.to_string()),
        }
    }
}

/// Nests `a.b` field paths into objects, as Kong's `fields` shows them: a 1-based numeric
/// segment (an array or set element) is a position in a JSON array, the positions before it
/// `null`, as Kong's cjson writes a sparse Lua array (`encode_sparse_array(nil, nil, 2^15)`):
/// `protocols.2` is `"protocols": [null, "expected one of: ..."]`.
pub fn nest_fields(violations: &[(String, String)]) -> Value {
    let mut root = Value::Object(Map::new());
    for (path, msg) in violations {
        let parts: Vec<&str> = path.split('.').collect();
        insert(&mut root, &parts, msg);
    }
    root
}

/// Kong's cjson writes a sparse array as an array up to this index.
const SPARSE_ARRAY_MAX: usize = 1 << 15;

fn insert(node: &mut Value, path: &[&str], msg: &str) {
    let Some((head, rest)) = path.split_first() else {
        return;
    };
    let index = head
        .parse::<usize>()
        .ok()
        .filter(|n| (1..=SPARSE_ARRAY_MAX).contains(n));
    let slot = match index {
        Some(i) => {
            if !node.is_array() {
                *node = Value::Array(Vec::new());
            }
            let a = node.as_array_mut().expect("made an array above");
            if a.len() < i {
                a.resize(i, Value::Null);
            }
            &mut a[i - 1]
        }
        None => {
            if !node.is_object() {
                *node = Value::Object(Map::new());
            }
            let o = node.as_object_mut().expect("made an object above");
            if rest.is_empty() && *head == "@entity" {
                // Checks of a whole entity or record are a list, as Kong shows them.
                let list = o
                    .entry("@entity")
                    .or_insert_with(|| Value::Array(Vec::new()));
                if let Value::Array(a) = list {
                    a.push(Value::String(msg.to_string()));
                }
                return;
            }
            o.entry(head.to_string()).or_insert(Value::Null)
        }
    };
    if rest.is_empty() {
        *slot = Value::String(msg.to_string());
    } else {
        insert(slot, rest, msg);
    }
}

impl StoreError {
    /// (HTTP status, Kong's error body).
    pub fn to_kong(&self) -> (u16, Value) {
        match self {
            StoreError::Schema(v) => {
                let mut sorted = v.clone();
                sorted.sort();
                let listed: Vec<String> = sorted.iter().map(|(f, m)| format!("{f}: {m}")).collect();
                let message = if sorted.len() == 1 {
                    format!("schema violation ({})", listed[0])
                } else {
                    format!("{} schema violations ({})", sorted.len(), listed.join("; "))
                };
                (
                    400,
                    json!({"code": 2, "name": "schema violation", "message": message, "fields": nest_fields(v)}),
                )
            }
            StoreError::PrimaryKey(id) => (
                400,
                json!({"code": 3, "name": "primary key violation",
                       "message": format!("primary key violation on key '{{id=\"{id}\"}}'"),
                       "fields": {"id": id}}),
            ),
            StoreError::ForeignKey { field, table, key } => (
                400,
                json!({"code": 4, "name": "foreign key violation",
                       "message": format!("the foreign key '{{id=\"{key}\"}}' does not reference an existing '{table}' entity."),
                       "fields": {field.as_str(): {"id": key}}}),
            ),
            StoreError::ReferencedBy { child, parent } => (
                400,
                json!({"code": 4, "name": "foreign key violation",
                       "message": format!("an existing '{child}' entity references this '{parent}' entity"),
                       "fields": {"@referenced_by": child}}),
            ),
            StoreError::Unique { fields, detail } => (
                409,
                json!({"code": 5, "name": "unique constraint violation",
                       "message": format!("UNIQUE violation detected on '{fields}'"),
                       "fields": detail}),
            ),
            StoreError::NotFound => (404, json!({"message": "Not found"})),
            StoreError::InvalidOffset(o) => (
                400,
                json!({"code": 7, "name": "invalid offset",
                       "message": format!("'{o}' is not a valid offset: bad base64 encoding")}),
            ),
            StoreError::InvalidSize(m) => (
                400,
                json!({"code": 9, "name": "invalid size", "message": m}),
            ),
            StoreError::InvalidOptions(o) => {
                let msg = match o {
                    Value::Object(m) => m
                        .iter()
                        .map(|(k, v)| format!("{k}: {}", v.as_str().unwrap_or_default()))
                        .collect::<Vec<_>>()
                        .join("; "),
                    _ => String::new(),
                };
                (
                    400,
                    json!({"code": 11, "name": "invalid options",
                           "message": format!("invalid option ({msg})"), "options": o}),
                )
            }
            StoreError::Database(m) | StoreError::Unavailable(m) => (
                500,
                json!({"code": 8, "name": "database error", "message": format!("database error: {m}")}),
            ),
        }
    }
}

/// A schema violation's fields and messages, for logs (`ttl: expected an integer`).
fn describe(errors: &[(String, String)]) -> String {
    errors
        .iter()
        .map(|(f, m)| format!("{f}: {m}"))
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_violation_message_and_nested_fields() {
        let (status, body) = StoreError::Schema(vec![
            ("port".into(), "expected an integer".into()),
            ("config.minute".into(), "expected a number".into()),
        ])
        .to_kong();
        assert_eq!(status, 400);
        assert_eq!(
            body["message"],
            "2 schema violations (config.minute: expected a number; port: expected an integer)"
        );
        assert_eq!(body["fields"]["config"]["minute"], "expected a number");
        // Element errors are positions in arrays, as Kong's cjson writes them.
        let (_, elements) = StoreError::Schema(vec![
            ("protocols.2".into(), "expected one of: http".into()),
            ("config.headers.1".into(), "invalid value: x".into()),
        ])
        .to_kong();
        assert_eq!(
            elements["fields"],
            serde_json::json!({"protocols": [null, "expected one of: http"],
                               "config": {"headers": ["invalid value: x"]}})
        );
        let (_, one) =
            StoreError::Schema(vec![("host".into(), "required field missing".into())]).to_kong();
        assert_eq!(
            one["message"],
            "schema violation (host: required field missing)"
        );
    }
}
