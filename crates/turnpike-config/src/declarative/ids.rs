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
/// order, so that a reader streaming the document (`declarative::stream`) gets the same hash
/// without holding the whole of it.
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

/// An array's digest built element by element, as `digest` builds it from the whole array.
pub(crate) struct ArrayDigest(Sha256);

impl ArrayDigest {
    pub(crate) fn new() -> ArrayDigest {
        let mut h = Sha256::new();
        h.update(b"[");
        ArrayDigest(h)
    }

    pub(crate) fn push(&mut self, v: &Value) {
        feed(&mut self.0, v);
        self.0.update(b",");
    }

    pub(crate) fn finish(mut self) -> [u8; 32] {
        self.0.update(b"]");
        self.0.finalize().into()
    }
}

fn feed(h: &mut Sha256, v: &Value) {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            h.update(b"{");
            for k in keys {
                h.update(k.as_bytes());
                h.update(b":");
                feed(h, &m[k]);
                h.update(b",");
            }
            h.update(b"}");
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
