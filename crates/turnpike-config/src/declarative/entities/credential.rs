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
            FieldKind::Integer => f.int(name, i64::MIN, i64::MAX, None).map(Value::from),
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
/// entity spec (`&'static str`), not a map with its hash table and a copy of each name; null
/// fields are not kept, and a string (nearly every field: keys, secrets, usernames) is kept as
/// its text, not as a `serde_json::Value` (80 bytes with `preserve_order`). A key-auth key's
/// fields cost 40 bytes here, against 88 with `Value`s, 288 with its null `ttl` and `tags`,
/// and 364 as a `serde_json::Map`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CredentialFields {
    /// The entity's own fields, written null when not set (`tags` too).
    names: &'static [(&'static str, FieldKind)],
    /// The fields that are set: own fields, `tags`, other foreign keys.
    set: Box<[(&'static str, Stored)]>,
}

/// A set field's value: text inline (a string field), anything else boxed.
#[derive(Debug, Clone, PartialEq)]
enum Stored {
    Str(Box<str>),
    Json(Box<Value>),
}

impl Stored {
    fn new(v: Value) -> Stored {
        match v {
            Value::String(s) => Stored::Str(s.into_boxed_str()),
            v => Stored::Json(Box::new(v)),
        }
    }

    fn as_ref(&self) -> FieldRef<'_> {
        match self {
            Stored::Str(s) => FieldRef::Str(s),
            Stored::Json(v) => FieldRef::Json(v),
        }
    }
}

/// A credential field's value as read from [`CredentialFields`]: the JSON value it stands for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FieldRef<'a> {
    Null,
    Str(&'a str),
    Json(&'a Value),
}

impl<'a> FieldRef<'a> {
    pub fn as_str(self) -> Option<&'a str> {
        match self {
            FieldRef::Str(s) => Some(s),
            FieldRef::Json(v) => v.as_str(),
            FieldRef::Null => None,
        }
    }

    pub fn as_u64(self) -> Option<u64> {
        match self {
            FieldRef::Json(v) => v.as_u64(),
            _ => None,
        }
    }

    pub fn as_bool(self) -> Option<bool> {
        match self {
            FieldRef::Json(v) => v.as_bool(),
            _ => None,
        }
    }

    pub fn as_array(self) -> Option<&'a Vec<Value>> {
        match self {
            FieldRef::Json(v) => v.as_array(),
            _ => None,
        }
    }

    pub fn is_null(self) -> bool {
        matches!(self, FieldRef::Null)
    }

    /// A member of an object field (a foreign key's `id`).
    pub fn get(self, key: &str) -> Option<&'a Value> {
        match self {
            FieldRef::Json(v) => v.get(key),
            _ => None,
        }
    }

    pub fn to_value(self) -> Value {
        match self {
            FieldRef::Null => Value::Null,
            FieldRef::Str(s) => Value::String(s.to_string()),
            FieldRef::Json(v) => v.clone(),
        }
    }
}

impl Serialize for FieldRef<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            FieldRef::Null => s.serialize_unit(),
            FieldRef::Str(v) => s.serialize_str(v),
            FieldRef::Json(v) => v.serialize(s),
        }
    }
}

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
                    Some((name?, Stored::new(v)))
                })
                .collect(),
        }
    }

    /// A field's value; `None` when it is null or not a field of the entity.
    pub fn get(&self, name: &str) -> Option<FieldRef<'_>> {
        self.set
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_ref())
    }

    /// A string field's text; `None` when it is null, not a string or not a field.
    pub fn get_str(&self, name: &str) -> Option<&str> {
        self.get(name)?.as_str()
    }

    /// Every field, in order: the entity's own fields and `tags` (null when not set), then
    /// the other foreign keys that are set.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, FieldRef<'_>)> {
        let own = self
            .names
            .iter()
            .map(|(n, _)| *n)
            .chain(["tags"])
            .map(|n| (n, self.get(n).unwrap_or(FieldRef::Null)));
        let others = self
            .set
            .iter()
            .filter(|(n, _)| *n != "tags" && !self.names.iter().any(|(o, _)| o == n))
            .map(|(n, v)| (*n, v.as_ref()));
        own.chain(others)
    }
}

impl Serialize for CredentialFields {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(None)?;
        for (k, v) in self.iter() {
            m.serialize_entry(k, &v)?;
        }
        m.end()
    }
}

/// String look-up over a credential's fields, as the snapshot holds them or as the store
/// returns them (a JSON object), for the code that reads both.
pub trait FieldMap {
    fn field_str(&self, name: &str) -> Option<&str>;
}

impl FieldMap for CredentialFields {
    fn field_str(&self, name: &str) -> Option<&str> {
        self.get_str(name)
    }
}

impl FieldMap for Map<String, Value> {
    fn field_str(&self, name: &str) -> Option<&str> {
        self.get(name)?.as_str()
    }
}

/// Kong generates 32 hex characters of randomness for auto credential fields.
fn random_secret() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_field_is_kept_in_40_bytes() {
        // A snapshot holds one per set field of every credential: 100k keys, 100k of these.
        assert!(
            size_of::<(&str, Stored)>() <= 40,
            "{}",
            size_of::<(&str, Stored)>()
        );
    }
}
