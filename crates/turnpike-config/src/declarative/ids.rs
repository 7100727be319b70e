//! Kong's deterministic ids and the configuration hash.

use serde_json::Value;
use sha2::{Digest, Sha256};
use uuid::Uuid;

/// The UUIDv5 namespace Kong uses for declarative entities (Kong
/// `kong/db/schema/others/declarative_config.lua`); decK uses the same one.
pub const KONG_NAMESPACE: Uuid = Uuid::from_u128(0xfd02801f_0957_4a15_a55a_c8d9606f30b5);

/// `uuid5(uuid5(KONG_NAMESPACE, table), key)`: equal to the id Kong and decK give the entity.
pub fn entity_id(table: &str, key: &str) -> String {
    let ns = Uuid::new_v5(&KONG_NAMESPACE, table.as_bytes());
    Uuid::new_v5(&ns, key.as_bytes()).to_string()
}

/// A digest of the declarative input, independent of key order: 32 hex characters, the width of
/// Kong's `configuration_hash`.
///
/// A document's top-level fields are digested one by one and the digests combined in key
/// order, and a list of records (entities) enters its holder's digest as its own digest, so
/// that a reader streaming the document (`declarative::stream`, which reads a service's
/// routes one by one) gets the same hash without holding the whole of it.
pub fn config_hash(v: &Value) -> String {
    match v {
        Value::Object(m) => hash_of_parts(m.iter().map(|(k, v)| (k.as_str(), digest(v))).collect()),
        other => hex::encode(&digest(other)[..16]),
    }
}

/// The digest of one value, independent of key order.
pub(crate) fn digest(v: &Value) -> [u8; 32] {
    let mut h = Sha256::new();
    feed(&mut h, v);
    h.finalize().into()
}

/// The config hash from the digests of a document's top-level fields (any order).
pub(crate) fn hash_of_parts(mut parts: Vec<(&str, [u8; 32])>) -> String {
    parts.sort_unstable_by(|a, b| a.0.cmp(b.0));
    let mut h = Sha256::new();
    h.update(b"{");
    for (k, d) in parts {
        h.update(k.as_bytes());
        h.update(b":");
        h.update(d);
        h.update(b",");
    }
    h.update(b"}");
    hex::encode(&h.finalize()[..16])
}

/// A field of an object being digested: a value, or a list of records digested apart.
pub(crate) enum Part<'a> {
    Value(&'a Value),
    Records(RecordsDigest),
}

/// A list of records' digest (`None` for an empty list, which is digested like any array).
#[derive(Clone, Copy)]
pub(crate) struct RecordsDigest(pub(crate) Option<[u8; 32]>);

impl RecordsDigest {
    /// The digest of a whole value that is this list (a top-level field).
    pub(crate) fn as_value_digest(self) -> [u8; 32] {
        let mut h = Sha256::new();
        feed_records(&mut h, self);
        h.finalize().into()
    }
}

fn feed_records(h: &mut Sha256, r: RecordsDigest) {
    match r.0 {
        Some(d) => {
            h.update(b"#");
            h.update(d);
        }
        None => h.update(b"[]"),
    }
}

/// Feeds an object given as its fields, in key order.
pub(crate) fn feed_object(h: &mut Sha256, mut parts: Vec<(&str, Part)>) {
    parts.sort_unstable_by(|a, b| a.0.cmp(b.0));
    h.update(b"{");
    for (k, p) in parts {
        h.update(k.as_bytes());
        h.update(b":");
        match p {
            Part::Value(v) => feed(h, v),
            Part::Records(r) => feed_records(h, r),
        }
        h.update(b",");
    }
    h.update(b"}");
}

/// A list of records' digest built record by record.
pub(crate) struct RecordsHasher(Option<Sha256>);

impl RecordsHasher {
    pub(crate) fn new() -> RecordsHasher {
        RecordsHasher(None)
    }

    /// Adds a record, given as its fields.
    pub(crate) fn push(&mut self, parts: Vec<(&str, Part)>) {
        let h = self.0.get_or_insert_with(Sha256::new);
        feed_object(h, parts);
        h.update(b",");
    }

    pub(crate) fn finish(self) -> RecordsDigest {
        RecordsDigest(self.0.map(|h| h.finalize().into()))
    }
}

fn feed(h: &mut Sha256, v: &Value) {
    match v {
        Value::Object(m) => feed_object(
            h,
            m.iter()
                .map(|(k, v)| (k.as_str(), Part::Value(v)))
                .collect(),
        ),
        // A list of records: digested apart, as a streaming reader digests it.
        Value::Array(a)
            if a.first().is_some_and(Value::is_object) && a.iter().all(Value::is_object) =>
        {
            let mut r = RecordsHasher::new();
            for x in a {
                let Value::Object(m) = x else { unreachable!() };
                r.push(
                    m.iter()
                        .map(|(k, v)| (k.as_str(), Part::Value(v)))
                        .collect(),
                );
            }
            feed_records(h, r.finish());
        }
        Value::Array(a) => {
            h.update(b"[");
            for x in a {
                feed(h, x);
                h.update(b",");
            }
            h.update(b"]");
        }
        other => h.update(other.to_string().as_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_match_kong_and_deck() {
        // The per-table namespace is itself a v5 uuid of the table name.
        let ns = Uuid::new_v5(&KONG_NAMESPACE, b"services");
        assert_eq!(
            entity_id("services", "svc"),
            Uuid::new_v5(&ns, b"svc").to_string()
        );
        assert_ne!(entity_id("services", "a"), entity_id("routes", "a"));
        // Vectors computed with an independent implementation (Python's `uuid.uuid5`, same
        // namespace chain): they pin the algorithm, not just its self-consistency.
        assert_eq!(
            entity_id("services", "example-service"),
            "7a267194-6123-5ee0-a1c9-4c1559eb0d95"
        );
        assert_eq!(
            entity_id("routes", "r1"),
            "4726a05a-d550-537e-9fc3-a07c7a1188c7"
        );
        assert_eq!(
            KONG_NAMESPACE.to_string(),
            "fd02801f-0957-4a15-a55a-c8d9606f30b5"
        );
    }

    #[test]
    fn hash_ignores_key_order() {
        let a: Value = serde_json::from_str(r#"{"a":1,"b":[1,2]}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"b":[1,2],"a":1}"#).unwrap();
        let c: Value = serde_json::from_str(r#"{"b":[2,1],"a":1}"#).unwrap();
        assert_eq!(config_hash(&a), config_hash(&b));
        assert_ne!(config_hash(&a), config_hash(&c));
        assert_eq!(config_hash(&a).len(), 32);
    }
}
