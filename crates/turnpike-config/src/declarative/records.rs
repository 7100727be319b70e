//! Entities that are plain records: validated and stored, served by the Admin API and
//! carried in declarative config, with no effect of their own on the request path yet —
//! Kong's `key_sets`, `keys` (JWK or PEM) and `vaults`. Each is declared once (its fields with
//! Kong's types and defaults, its parent, its checks); the loader, the store and the schema
//! endpoint all read that declaration.

use serde::Serialize;
use serde_json::{Map, Value};

use crate::schema::{self, Field, Type};

/// Checks across an entity's fields: violations as (field, message).
pub type EntityCheck = fn(&Map<String, Value>) -> Vec<(String, String)>;

/// One record entity type.
pub struct RecordSpec {
    pub table: &'static str,
    /// Its own fields (not id, timestamps or the parent's foreign key).
    pub fields: &'static [Field],
    /// The foreign key to a parent (`keys.set` -> `key_sets`), if any.
    pub parent: Option<(&'static str, &'static str)>,
    /// The unique field an entity can be named by (`name`, a vault's `prefix`).
    pub endpoint_key: &'static str,
    /// Checks across fields (Kong's `entity_checks`).
    pub check: EntityCheck,
    /// Nested records that are optional (`required = false` in Kong): null when nothing in
    /// them is set, rather than filled.
    pub optional_records: &'static [&'static str],
}

pub const RECORDS: &[RecordSpec] = &[
    RecordSpec {
        table: "key_sets",
        fields: &[
            Field::new("name", Type::String),
            Field::new("tags", Type::StringArray),
        ],
        parent: None,
        endpoint_key: "name",
        check: no_check,
        optional_records: &[],
    },
    RecordSpec {
        table: "keys",
        fields: &[
            Field::new("name", Type::String),
            Field::new("kid", Type::String).required(),
            Field::new("jwk", Type::String).referenceable(),
            Field::new("pem", Type::Record(PEM)),
            Field::new("tags", Type::StringArray),
        ],
        parent: Some(("set", "key_sets")),
        endpoint_key: "name",
        check: check_key,
        optional_records: &["pem"],
    },
    RecordSpec {
        table: "vaults",
        fields: &[
            Field::new("prefix", Type::String).required(),
            Field::new("name", Type::OneOf(&["env"])).required(),
            Field::new("description", Type::String),
            Field::new("config", Type::Record(ENV_VAULT)),
            Field::new("tags", Type::StringArray),
        ],
        parent: None,
        endpoint_key: "prefix",
        check: check_vault,
        optional_records: &[],
    },
];

const PEM: &[Field] = &[
    Field::new("private_key", Type::String).referenceable(),
    Field::new("public_key", Type::String).referenceable(),
];

/// The `env` vault's config (Kong's `kong/vaults/env/schema.lua`): a prefix for the variables it
/// reads, and whether their values are base64 to decode.
const ENV_VAULT: &[Field] = &[
    Field::new("prefix", Type::String),
    Field::new("base64_decode", Type::Boolean).default(crate::schema::Default::Bool(false)),
];

pub fn by_table(table: &str) -> Option<usize> {
    RECORDS.iter().position(|r| r.table == table)
}

fn no_check(_: &Map<String, Value>) -> Vec<(String, String)> {
    Vec::new()
}

/// A key is a JWK (JSON, whose `kid` is the key's) or a PEM pair, never both.
fn check_key(m: &Map<String, Value>) -> Vec<(String, String)> {
    let jwk = m.get("jwk").and_then(|v| v.as_str());
    let pem = m.get("pem").filter(|p| {
        p.as_object()
            .is_some_and(|o| o.values().any(|v| !v.is_null()))
    });
    let mut errs = Vec::new();
    match (jwk, pem) {
        (None, None) => errs.push((
            "@entity".into(),
            "at least one of these fields must be non-empty: 'jwk', 'pem'".into(),
        )),
        (Some(_), Some(_)) => errs.push((
            "@entity".into(),
            "only one of these fields must be non-empty: 'jwk', 'pem'".into(),
        )),
        // A reference is only known once resolved: Kong checks nothing of it.
        (Some(j), None) if crate::schema::is_reference(j) => {}
        (Some(j), None) => match serde_json::from_str::<Value>(j) {
            Ok(Value::Object(o)) => {
                if o.get("kid").and_then(|k| k.as_str()) != m.get("kid").and_then(|k| k.as_str()) {
                    errs.push((
                        "@entity".into(),
                        "kid in jwk.kid must be equal to keys.kid".into(),
                    ));
                }
            }
            _ => errs.push(("jwk".into(), "could not json decode jwk string".into())),
        },
        (None, Some(p)) => {
            for field in ["private_key", "public_key"] {
                if let Some(text) = p.get(field).and_then(|v| v.as_str()) {
                    if !text.contains("-----BEGIN") && !crate::schema::is_reference(text) {
                        errs.push((format!("pem.{field}"), "invalid key".into()));
                    }
                }
            }
        }
    }
    errs
}

/// A vault prefix names it in references (`{vault://<prefix>/...}`): a plain word.
fn check_vault(m: &Map<String, Value>) -> Vec<(String, String)> {
    let mut errs = Vec::new();
    if let Some(p) = m.get("prefix").and_then(|v| v.as_str()) {
        if !p
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            errs.push((
                "prefix".into(),
                "invalid value: must be a name of letters, digits, '-' and '_'".into(),
            ));
        }
        // Kong refuses a prefix that names a vault strategy other than the entity's own.
        if p == "aws" || p == "gcp" || p == "hcv" || p == "azure" {
            errs.push((
                "prefix".into(),
                format!("'{p}' is the name of another vault"),
            ));
        }
    }
    errs
}

/// One record entity, as stored and exported.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Record {
    #[serde(skip)]
    pub spec: usize,
    pub id: String,
    pub created_at: i64,
    pub updated_at: i64,
    #[serde(flatten)]
    pub fields: Map<String, Value>,
}

impl Record {
    pub fn table(&self) -> &'static str {
        RECORDS[self.spec].table
    }
}

/// Reads one record entity: (entity, the parent as written, violations).
pub fn read(
    spec: usize,
    map: &Map<String, Value>,
    id: &str,
    now: i64,
) -> (Record, Option<String>, Vec<(String, String)>) {
    let s = &RECORDS[spec];
    let mut own = Map::new();
    let mut errs = Vec::new();
    let mut parent = None;
    let (mut created_at, mut updated_at) = (now, now);
    for (k, v) in map {
        match k.as_str() {
            "id" => {}
            "created_at" => created_at = v.as_i64().unwrap_or(now),
            "updated_at" => updated_at = v.as_i64().unwrap_or(now),
            // A record's own `ttl`-less schema has no cache_key input: Kong computes it.
            "cache_key" => {}
            f if s.parent.is_some_and(|(p, _)| p == f) => {
                parent = (!v.is_null()).then(|| super::entities::foreign_ref_value(v))
            }
            _ => {
                own.insert(k.clone(), v.clone());
            }
        }
    }
    let fields = match schema::validate(s.fields, &Value::Object(own)) {
        Ok(Value::Object(m)) => m,
        Ok(_) => Map::new(),
        Err(e) => {
            errs.extend(e);
            Map::new()
        }
    };
    if errs.is_empty() {
        errs.extend((s.check)(&fields));
    }
    let mut fields = fields;
    for r in s.optional_records {
        let empty = fields
            .get(*r)
            .and_then(|v| v.as_object())
            .is_some_and(|o| o.values().all(|v| v.is_null()));
        if empty {
            fields.insert(r.to_string(), Value::Null);
        }
    }
    if let Some((p, _)) = s.parent {
        fields.insert(p.into(), Value::Null);
    }
    (
        Record {
            spec,
            id: id.to_string(),
            created_at,
            updated_at,
            fields,
        },
        parent,
        errs,
    )
}

/// The JSON schema `GET /schemas/{table}` serves.
pub fn schema_json(spec: usize) -> Value {
    let s = &RECORDS[spec];
    let mut fields = vec![
        serde_json::json!({"id": {"type": "string", "uuid": true, "auto": true}}),
        serde_json::json!({"created_at": {"type": "integer", "timestamp": true, "auto": true}}),
        serde_json::json!({"updated_at": {"type": "integer", "timestamp": true, "auto": true}}),
    ];
    if let Some((p, table)) = s.parent {
        fields.push(
            serde_json::json!({p: {"type": "foreign", "reference": table, "on_delete": "cascade"}}),
        );
    }
    if let Value::Object(r) = schema::record_json(s.fields) {
        if let Some(Value::Array(own)) = r.get("fields") {
            for f in own {
                let mut f = f.clone();
                for r in s.optional_records {
                    if let Some(rec) = f.get_mut(*r) {
                        rec["required"] = Value::Bool(false);
                    }
                }
                fields.push(f);
            }
        }
    }
    serde_json::json!({"fields": fields, "endpoint_key": s.endpoint_key})
}
