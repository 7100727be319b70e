//! Credentials of consumers (key-auth, basic-auth, acl, ...), read by their spec.

use serde_json::{Map, Value};

use super::super::fields::Fields;
use super::*;
use crate::entity::{FieldKind, PluginEntity};

/// Reads a credential of the given table; returns its fields (with generated values filled in)
/// and the consumer reference when written at the top level.
pub fn credential(
    spec: &'static PluginEntity,
    map: &Map<String, Value>,
    id: &str,
    now: i64,
) -> (Credential, Option<String>, Vec<(String, String)>) {
    let mut f = Fields::new(map);
    let id = read_id(&mut f, id);
    let created_at = f.int("created_at", 0, i64::MAX, Some(now)).unwrap_or(now);
    let mut fields = Map::new();
    for (name, kind) in spec.fields {
        let v = match kind {
            FieldKind::Required => f.req_str(name).map(Value::String),
            FieldKind::Optional => f.str(name).map(Value::String),
            FieldKind::Auto => Some(Value::String(f.str(name).unwrap_or_else(random_secret))),
            FieldKind::Int => f.int(name, 0, 100_000_000, None).map(Value::from),
            FieldKind::Bool => Some(Value::Bool(f.bool(name, false))),
            FieldKind::StrArray => f.str_array(name).map(Value::from),
        };
        fields.insert(name.to_string(), v.unwrap_or(Value::Null));
    }
    if let Some(t) = f.tags() {
        fields.insert("tags".into(), Value::from(t));
    } else {
        fields.insert("tags".into(), Value::Null);
    }
    let consumer = f.raw("consumer").map(foreign_ref_value);
    // Other foreign keys (an oauth2 token's credential and service) are kept in the fields as
    // `{"id": ...}`, which is how the store reads and indexes them.
    for fk in spec.spec.foreign.iter().filter(|fk| fk.field != "consumer") {
        if let Some(v) = f.raw(fk.field).filter(|v| !v.is_null()) {
            fields.insert(
                fk.field.to_string(),
                serde_json::json!({ "id": foreign_ref_value(v) }),
            );
        }
    }
    let mut errors = f.finish();
    if let Some(check) = spec.check {
        if errors.is_empty() {
            errors.extend(check(&mut fields));
        }
    }
    (
        Credential {
            table: spec.spec.table,
            id,
            created_at,
            consumer: ForeignKey::new(String::new()),
            fields: CredentialFields::new(spec, fields),
        },
        consumer,
        errors,
    )
}

/// A credential's own fields, in their order. A snapshot holds one per credential (100k
/// consumers with keys: 100k of these), so they are a boxed slice named by the plugin's
/// entity spec (`&'static str`), not a map with its hash table and a copy of each name, and
/// null fields are not kept (a `Value` is 80 bytes): a key-auth key's fields cost 96 bytes
/// here, against 288 with its null `ttl` and `tags`, and 364 as a `serde_json::Map`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CredentialFields {
    /// The entity's own fields, written null when not set (`tags` too).
    names: &'static [(&'static str, FieldKind)],
    /// The fields that are set: own fields, `tags`, other foreign keys.
    set: Box<[(&'static str, Value)]>,
}

static NULL: Value = Value::Null;

impl CredentialFields {
    /// The fields of `map` the spec names (its own fields, `tags` and foreign keys); the
    /// loader writes no others.
    pub fn new(spec: &'static PluginEntity, map: Map<String, Value>) -> CredentialFields {
        let names = spec
            .fields
            .iter()
            .map(|(n, _)| *n)
            .chain(["tags"])
            .chain(spec.spec.foreign.iter().map(|fk| fk.field));
        let static_name = |k: &str| names.clone().find(|n| *n == k);
        CredentialFields {
            names: spec.fields,
            set: map
                .into_iter()
                .filter(|(_, v)| !v.is_null())
                .filter_map(|(k, v)| {
                    let name = static_name(&k);
                    debug_assert!(name.is_some(), "{k} is no field of {}", spec.spec.table);
                    Some((name?, v))
                })
                .collect(),
        }
    }

    /// A field's value; `None` when it is null or not a field of the entity.
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.set.iter().find(|(n, _)| *n == name).map(|(_, v)| v)
    }

    /// Every field, in order: the entity's own fields and `tags` (null when not set), then
    /// the other foreign keys that are set.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, &Value)> {
        let own = self
            .names
            .iter()
            .map(|(n, _)| *n)
            .chain(["tags"])
            .map(|n| (n, self.get(n).unwrap_or(&NULL)));
        let others = self
            .set
            .iter()
            .filter(|(n, _)| *n != "tags" && !self.names.iter().any(|(o, _)| o == n))
            .map(|(n, v)| (*n, v));
        own.chain(others)
    }
}

impl Serialize for CredentialFields {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(None)?;
        for (k, v) in self.iter() {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

/// Field look-up over a credential's fields, as the snapshot holds them or as the store
/// returns them (a JSON object), for the code that reads both.
pub trait FieldMap {
    fn field(&self, name: &str) -> Option<&Value>;
}

impl FieldMap for CredentialFields {
    fn field(&self, name: &str) -> Option<&Value> {
        self.get(name)
    }
}

impl FieldMap for Map<String, Value> {
    fn field(&self, name: &str) -> Option<&Value> {
        self.get(name)
    }
}

/// Kong generates 32 hex characters of randomness for auto credential fields.
fn random_secret() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}
