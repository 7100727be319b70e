//! Validates one entity written through the Admin API with the same rules the declarative
//! loader applies (`turnpike_config::declarative::entities`), and produces the entity as Kong
//! shows it: every default filled in, foreign keys as `{"id": ...}`.

use serde_json::{Map, Value};
use turnpike_config::declarative::{self as decl, PluginRegistry};

use crate::schema::EntitySpec;

/// A validated entity, not yet checked against the store.
#[derive(Debug)]
pub struct Checked {
    pub value: Map<String, Value>,
    /// Foreign keys as written (an id or an endpoint key such as a service name), still to be
    /// resolved to ids: (field, key).
    pub refs: Vec<(&'static str, String)>,
    /// A certificate's transient `snis`: names that become sni rows.
    pub sni_names: Option<Vec<String>>,
    /// A field the write's answer shows instead of its stored form (a new key-auth key).
    pub reveal: Option<(String, Value)>,
}

pub type Violations = Vec<(String, String)>;

/// Validates `map` as an entity of `spec`'s table with primary key `id`.
pub fn check(
    spec: &EntitySpec,
    map: &Map<String, Value>,
    id: &str,
    now: i64,
    plugins: &dyn PluginRegistry,
) -> Result<Checked, Violations> {
    let mut refs: Vec<(&'static str, String)> = Vec::new();
    let mut sni_names = None;
    let (value, mut errs) = match spec.table {
        "services" => {
            let (s, e) = decl::service(map, id, now);
            (serde_json::to_value(s), e)
        }
        "routes" => {
            let (r, svc, e) = decl::route(map, id, now, plugins.router_flavor());
            if let Some(s) = svc {
                refs.push(("service", s));
            }
            (serde_json::to_value(r), e)
        }
        "upstreams" => {
            let (u, e) = decl::upstream(map, id, now);
            (serde_json::to_value(u), e)
        }
        "targets" => {
            // Milliseconds of this second: Kong's target timestamps carry them.
            let ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_millis() as i64);
            let (t, up, e) = decl::target(map, id, now * 1000 + ms);
            if let Some(u) = up {
                refs.push(("upstream", u));
            }
            (serde_json::to_value(t), e)
        }
        "consumers" => {
            let (c, e) = decl::consumer(map, id, now);
            (serde_json::to_value(c), e)
        }
        "plugins" => {
            let (mut p, r, mut e) = decl::plugin(map, id, now);
            e.extend(decl::check_plugin_config(plugins, &mut p));
            if r.consumer.is_some() && !plugins.allows_consumer(&p.name) {
                e.push(("consumer".into(), decl::NO_CONSUMER.into()));
            }
            refs.extend(r.given());
            (serde_json::to_value(p), e)
        }
        "certificates" => {
            let (c, names, e) = decl::certificate(map, id, now);
            sni_names = names;
            (serde_json::to_value(c), e)
        }
        "snis" => {
            let (s, cert, e) = decl::sni(map, id, now);
            if let Some(c) = cert {
                refs.push(("certificate", c));
            }
            (serde_json::to_value(s), e)
        }
        "ca_certificates" => {
            let (c, e) = decl::ca_certificate(map, id, now);
            (serde_json::to_value(c), e)
        }
        table if turnpike_config::declarative::records::by_table(table).is_some() => {
            let k = turnpike_config::declarative::records::by_table(table).unwrap();
            let (r, parent, e) = turnpike_config::declarative::records::read(k, map, id, now);
            if let (Some(p), Some((field, _))) = (
                parent,
                turnpike_config::declarative::records::RECORDS[k].parent,
            ) {
                refs.push((field, p));
            }
            (serde_json::to_value(r), e)
        }
        table => {
            let Some(cred) = plugins.entities().iter().find(|c| c.spec.table == table) else {
                return Err(vec![("@entity".into(), format!("unknown entity {table}"))]);
            };
            let (c, consumer, e) = decl::credential(cred, map, id, now);
            if let Some(c) = consumer {
                refs.push(("consumer", c));
            }
            (serde_json::to_value(c), e)
        }
    };
    let Ok(Value::Object(mut value)) = value else {
        return Err(vec![("@entity".into(), "cannot encode the entity".into())]);
    };
    // A foreign key written as `{"id": ...}` must be a UUID in the Admin API, as in Kong
    // (`{"name": ...}` or a path parent name it by its endpoint key instead).
    for f in spec.foreign {
        if let Some(Value::String(id)) = map.get(f.field).and_then(|v| v.get("id")) {
            if !is_uuid(id) {
                errs.push((format!("{}.id", f.field), "expected a valid UUID".into()));
            }
        }
    }
    let mut reveal = None;
    if errs.is_empty()
        && plugins
            .entities()
            .iter()
            .any(|c| c.spec.table == spec.table)
    {
        match plugins.prepare_credential(spec.table, &mut value) {
            Ok(r) => reveal = r,
            Err(e) => errs.push(e),
        }
    }
    // Foreign keys the entity reader kept as they were written (service, client_certificate).
    for f in spec.foreign {
        if refs.iter().any(|(r, _)| *r == f.field) {
            continue;
        }
        if let Some(Value::Object(o)) = value.get(f.field) {
            match o.get("id").and_then(|v| v.as_str()) {
                Some(id) if !id.is_empty() => refs.push((f.field, id.to_string())),
                // Readers that fill foreign keys in later leave an empty id: absent.
                _ => {
                    value.insert(f.field.into(), Value::Null);
                }
            }
        }
    }
    for (field, key) in &refs {
        if key.is_empty() || key == "null" {
            errs.push((
                field.to_string(),
                "expected a foreign key: {id = <uuid>} or an endpoint key".into(),
            ));
        }
        value.insert(field.to_string(), serde_json::json!({ "id": key }));
    }
    // Required foreign keys that are absent entirely.
    for required in ["upstream", "certificate", "consumer", "credential"] {
        if spec.foreign.iter().any(|f| f.field == required)
            && spec.table != "plugins"
            && !refs.iter().any(|(f, _)| *f == required)
            && !errs.iter().any(|(f, _)| f == required)
        {
            errs.push((required.into(), "required field missing".into()));
        }
    }
    // Kong's `ttl` (key-auth keys, oauth2 tokens): the entity expires that many seconds after
    // this write. Stored beside it; it reads back as the seconds left.
    if let Some(ttl) = value.get("ttl").and_then(|t| t.as_i64()).filter(|t| *t > 0) {
        value.insert(EXPIRES_AT.into(), serde_json::json!(now + ttl));
        value.insert(
            EXPIRES_AT_MS.into(),
            serde_json::json!(crate::now_millis() + ttl * 1000),
        );
    }
    if errs.is_empty() {
        Ok(Checked {
            value,
            refs,
            sni_names,
            reveal,
        })
    } else {
        Err(errs)
    }
}

/// The composite unique key of an entity (Kong's cache key), e.g. `plugins:rate-limiting:<route
/// id>::` ; `None` when the table has none.
pub fn cache_key(spec: &EntitySpec, value: &Map<String, Value>) -> Option<String> {
    if spec.cache_key.is_empty() {
        return None;
    }
    let mut parts = vec![spec.table.to_string()];
    for f in spec.cache_key {
        let part = match value.get(*f) {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Object(o)) => o
                .get("id")
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_string(),
            _ => String::new(),
        };
        parts.push(part);
    }
    Some(parts.join(":"))
}

/// Kong merges a PATCH body into the stored entity: records are merged field by field, every
/// other value (arrays included) is replaced.
pub fn merge(base: &mut Map<String, Value>, patch: &Map<String, Value>) {
    for (k, v) in patch {
        match (base.get_mut(k), v) {
            (Some(Value::Object(b)), Value::Object(p)) if k != "headers" => merge(b, p),
            _ => {
                base.insert(k.clone(), v.clone());
            }
        }
    }
}

/// An id as Kong writes them: a UUID in its 36-character form.
pub fn is_uuid(s: &str) -> bool {
    uuid::Uuid::parse_str(s).is_ok() && s.len() == 36
}

/// Where a stored entity with a `ttl` keeps its expiry (seconds since the epoch).
pub(crate) const EXPIRES_AT: &str = "_expires_at";

/// The same expiry in milliseconds, from which the `ttl` left is read back.
pub(crate) const EXPIRES_AT_MS: &str = "_expires_at_ms";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{EntitySpec, Tables};
    use serde_json::json;

    fn by_table(table: &str) -> Option<&'static EntitySpec> {
        Tables::new(&turnpike_plugins::bundled()).by_table(table)
    }

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn service_defaults_and_url() {
        let c = check(
            by_table("services").unwrap(),
            &obj(json!({"name": "a", "url": "https://example.com/x"})),
            "6f1e9e2a-0000-4000-8000-000000000001",
            100,
            &turnpike_plugins::bundled(),
        )
        .unwrap();
        assert_eq!(c.value["port"], 443);
        assert_eq!(c.value["protocol"], "https");
        assert_eq!(c.value["retries"], 5);
        assert_eq!(c.value["created_at"], 100);
    }

    #[test]
    fn route_reference_by_name_is_kept_for_resolution() {
        let c = check(
            by_table("routes").unwrap(),
            &obj(json!({"paths": ["/a"], "service": {"name": "svc"}})),
            "6f1e9e2a-0000-4000-8000-000000000002",
            1,
            &turnpike_plugins::bundled(),
        )
        .unwrap();
        assert_eq!(c.refs, vec![("service", "svc".to_string())]);
    }

    #[test]
    fn violations_name_fields() {
        let e = check(
            by_table("services").unwrap(),
            &obj(json!({"port": "x", "bogus": 1})),
            "6f1e9e2a-0000-4000-8000-000000000003",
            1,
            &turnpike_plugins::bundled(),
        )
        .unwrap_err();
        let fields: Vec<&str> = e.iter().map(|(f, _)| f.as_str()).collect();
        assert!(fields.contains(&"host"), "{e:?}");
        assert!(fields.contains(&"bogus"), "{e:?}");
        let e = check(
            by_table("keyauth_credentials").unwrap(),
            &obj(json!({})),
            "6f1e9e2a-0000-4000-8000-000000000004",
            1,
            &turnpike_plugins::bundled(),
        )
        .unwrap_err();
        assert_eq!(
            e,
            vec![("consumer".to_string(), "required field missing".to_string())]
        );
    }

    #[test]
    fn patch_merges_records() {
        let mut base = obj(json!({"a": 1, "config": {"x": 1, "y": 2}, "tags": ["a"]}));
        merge(&mut base, &obj(json!({"config": {"y": 3}, "tags": ["b"]})));
        assert_eq!(
            Value::Object(base),
            json!({"a": 1, "config": {"x": 1, "y": 3}, "tags": ["b"]})
        );
    }
}
