//! `GET /schemas/{entity}` in Kong's schema JSON shape (`{"fields": [{"name": {"type": ...,
//! "default": ...}}]}`), which decK reads for defaults, and `POST /schemas/{entity}/validate`.
//!
//! The field list and every default come from the entity reader itself: a minimal valid entity
//! is read and what the reader filled in is reported, so the schema can never disagree with the
//! validation the Admin API and the declarative loader apply.

use http::{Method, StatusCode};
use serde_json::{json, Map, Value};
use turnpike_store::entity;
use turnpike_store::schema::{self, EntitySpec};
use turnpike_store::StoreError;

use crate::forms::parse_body;
use crate::{json_response, message, Admin, Resp};
use turnpike_config::declarative::PluginRegistry;

const SOME_ID: &str = "00000000-0000-4000-8000-000000000000";

/// The smallest valid entity of each table: the fields it must set.
fn minimal(spec: &EntitySpec, plugins: &dyn PluginRegistry) -> Map<String, Value> {
    if let Some(e) = plugins
        .entities()
        .iter()
        .find(|e| e.spec.table == spec.table)
    {
        // A plugin's entity: its sample, for a consumer.
        let mut m: Map<String, Value> = serde_json::from_str(e.sample).unwrap_or_default();
        m.insert("consumer".into(), json!({"id": SOME_ID}));
        return m;
    }
    let v = match spec.table {
        "services" => json!({"host": "example.com"}),
        "routes" => json!({"paths": ["/"]}),
        "upstreams" => json!({"name": "example"}),
        "targets" => json!({"target": "example.com:80", "upstream": {"id": SOME_ID}}),
        "consumers" => json!({"username": "example"}),
        "certificates" => {
            json!({"cert": "-----BEGIN CERTIFICATE-----", "key": "-----BEGIN PRIVATE KEY-----"})
        }
        "snis" => json!({"name": "example.com", "certificate": {"id": SOME_ID}}),
        "ca_certificates" => json!({"cert": "-----BEGIN CERTIFICATE-----"}),
        _ => json!({}),
    };
    v.as_object().cloned().unwrap_or_default()
}

/// Kong's field type names for a field whose default is null.
fn null_type(name: &str) -> &'static str {
    match name {
        "hosts" | "paths" | "methods" | "snis" | "tags" | "ca_certificates" | "redirect_uris"
        | "protocols" => "set",
        "sources" | "destinations" => "set",
        "headers" | "healthchecks" | "config" => "map",
        "tls_verify" => "boolean",
        "tls_verify_depth" | "ttl" => "integer",
        _ => "string",
    }
}

/// What Kong's schema says of a field beyond its type and default: its choices, bounds and
/// elements (the same rules the entity readers apply).
fn kong_constraints(table: &str, field: &str) -> Option<Value> {
    use turnpike_config::declarative::entities::{
        ALGORITHMS, HASH_ON, ROUTE_PROTOCOLS, SERVICE_PROTOCOLS,
    };
    const TIMEOUT: [i64; 2] = [1, 2_147_483_646];
    const PORT: [i64; 2] = [0, 65535];
    let strings = json!({"elements": {"type": "string"}});
    Some(match (table, field) {
        (_, "tags") => json!({"elements": {"type": "string", "required": true}}),
        ("services", "protocol") => json!({"one_of": SERVICE_PROTOCOLS, "required": true}),
        ("services", "port") => json!({"between": PORT, "required": true}),
        ("services", "retries") => json!({"between": [0, 32767]}),
        ("services", "connect_timeout" | "write_timeout" | "read_timeout") => {
            json!({"between": TIMEOUT})
        }
        ("services", "tls_verify_depth") => json!({"between": [0, 64]}),
        ("services", "ca_certificates") => json!({"elements": {"type": "string", "uuid": true}}),
        ("routes", "protocols") => {
            json!({"elements": {"type": "string", "one_of": ROUTE_PROTOCOLS}, "required": true})
        }
        ("routes", "methods" | "hosts" | "paths" | "snis") => strings,
        ("routes", "https_redirect_status_code") => {
            json!({"one_of": [426, 301, 302, 307, 308], "required": true})
        }
        ("routes", "path_handling") => json!({"one_of": ["v0", "v1"]}),
        ("routes", "regex_priority") => json!({"between": [i32::MIN, i32::MAX]}),
        ("routes", "priority") => json!({
            "between": [0, turnpike_config::declarative::entities::MAX_PRIORITY],
            "required": true
        }),
        ("routes", "headers") => {
            json!({"keys": {"type": "string"}, "values": {"type": "array", "elements": {"type": "string"}}})
        }
        ("upstreams", "algorithm") => json!({"one_of": ALGORITHMS}),
        ("upstreams", "hash_on" | "hash_fallback") => json!({"one_of": HASH_ON}),
        ("upstreams", "slots") => json!({"between": [10, 65536]}),
        ("targets", "weight") => json!({"between": [0, 65535]}),
        ("certificates" | "ca_certificates", "cert" | "key" | "cert_alt" | "key_alt") => {
            json!({"referenceable": true})
        }
        ("certificates", "snis") => strings,
        _ => return None,
    })
}

/// Kong's `tags` entity (what `/tags` lists), which has no table of its own here.
/// Kong 3.9.1's `entity_checks` of its entities and of the bundled plugins this build carries,
/// as Kong's `GET /schemas/...` returns them (functions left out, as Kong's JSON leaves them
/// out). Made from Kong's schema files by `scripts/kong-entity-checks.py`; Kong Manager and
/// other clients read them to know which fields go together.
const KONG_ENTITY_CHECKS: &str = include_str!("entity_checks.json");

fn kong_entity_checks() -> Value {
    serde_json::from_str(KONG_ENTITY_CHECKS).unwrap_or(Value::Null)
}

/// An entity's schema with Kong's `entity_checks` (`[]` for one that has none).
fn with_entity_checks(mut schema: Value, table: &str) -> Value {
    let checks = kong_entity_checks();
    if let Some(m) = schema.as_object_mut() {
        let own = checks["entities"].get(table).cloned();
        m.insert("entity_checks".into(), own.unwrap_or_else(|| json!([])));
    }
    schema
}

/// A plugin's schema with Kong's `entity_checks`: the plugin's own, and its `config`
/// record's inside that field, where Kong's JSON has them.
fn with_plugin_checks(mut schema: Value, name: &str) -> Value {
    let checks = kong_entity_checks();
    let config_checks = checks["plugin_configs"].get(name).cloned();
    if let Some(fields) = schema["fields"].as_array_mut() {
        for f in fields {
            if let (Some(config), Some(c)) = (f.get_mut("config"), config_checks.clone()) {
                config["entity_checks"] = c;
            }
        }
    }
    if let Some(m) = schema.as_object_mut() {
        let own = checks["plugins"].get(name).cloned();
        m.insert("entity_checks".into(), own.unwrap_or_else(|| json!([])));
    }
    schema
}

fn tags_schema() -> Value {
    json!({"fields": [
        {"tag": {"type": "string", "required": true}},
        {"entity_name": {"type": "string", "required": true}},
        {"entity_id": {"type": "string", "uuid": true, "required": true}},
    ]})
}

pub fn entity_schema(spec: &EntitySpec, plugins: &dyn PluginRegistry) -> Value {
    if let Some(k) = turnpike_config::declarative::records::by_table(spec.table) {
        return turnpike_config::declarative::records::schema_json(k);
    }
    let input = minimal(spec, plugins);
    let checked = entity::check(spec, &input, SOME_ID, 0, plugins);
    let value = match checked {
        Ok(c) => c.value,
        Err(_) => input.clone(),
    };
    let mut fields = Vec::new();
    for (name, v) in &value {
        let mut f = Map::new();
        if let Some(fk) = spec.foreign.iter().find(|f| f.field == name) {
            f.insert("type".into(), json!("foreign"));
            f.insert("reference".into(), json!(fk.table));
            if fk.cascade {
                f.insert("on_delete".into(), json!("cascade"));
            }
        } else {
            let ty = match v {
                Value::Bool(_) => "boolean",
                Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
                Value::Number(_) => "number",
                Value::String(_) => "string",
                Value::Array(_) => "array",
                Value::Object(_) => "record",
                Value::Null => null_type(name),
            };
            f.insert("type".into(), json!(ty));
        }
        match name.as_str() {
            "id" => {
                f.insert("uuid".into(), json!(true));
                f.insert("auto".into(), json!(true));
            }
            "created_at" | "updated_at" => {
                f.insert("timestamp".into(), json!(true));
                f.insert("auto".into(), json!(true));
            }
            _ if input.contains_key(name) => {
                f.insert("required".into(), json!(true));
            }
            _ if !v.is_null() => {
                f.insert("default".into(), v.clone());
            }
            _ => {}
        }
        if spec.unique.contains(&name.as_str()) {
            f.insert("unique".into(), json!(true));
        }
        if let Some(Value::Object(extra)) = kong_constraints(spec.table, name) {
            for (k, v) in extra {
                f.insert(k, v);
            }
        }
        if spec.table == "upstreams" && name == "healthchecks" {
            // The whole record, as declared for validation (Kong's shape: decK fills the
            // defaults of each nested field from it).
            let mut hc = turnpike_config::schema::record_json(
                turnpike_config::declarative::healthchecks::FIELDS,
            );
            hc["default"] = v.clone();
            f = hc.as_object().cloned().unwrap_or_default();
        }
        if f.get("type").and_then(|t| t.as_str()) == Some("map") && !f.contains_key("values") {
            f.insert("keys".into(), json!({"type": "string"}));
            f.insert("values".into(), json!({"type": "string"}));
        }
        fields.push(json!({ name.clone(): Value::Object(f) }));
    }
    let mut out = json!({ "fields": fields });
    if let Some(ek) = spec.endpoint_key {
        out["endpoint_key"] = json!(ek);
    }
    out
}

impl Admin {
    pub(crate) fn schemas(
        &self,
        method: &Method,
        rest: &str,
        body: &[u8],
        content_type: Option<&str>,
    ) -> Resp {
        let parts: Vec<&str> = rest.split('/').collect();
        match (method, parts.as_slice()) {
            (&Method::GET, ["plugins", name]) => match self.plugins.schema_json(name) {
                Some(s) => json_response(StatusCode::OK, &with_plugin_checks(s, name)),
                None => message(StatusCode::NOT_FOUND, &format!("No plugin named '{name}'")),
            },
            (&Method::POST, ["plugins", "validate"]) => {
                let b = match parse_body(content_type, body) {
                    Ok(b) => b,
                    Err(r) => return r,
                };
                self.validate(self.tables().by_table("plugins").unwrap(), b)
            }
            (&Method::GET, ["tags"]) => json_response(StatusCode::OK, &tags_schema()),
            (&Method::GET, [entity]) => match lookup(self.tables(), entity) {
                Some(spec) => json_response(
                    StatusCode::OK,
                    &with_entity_checks(entity_schema(spec, &*self.plugins), spec.table),
                ),
                None => message(
                    StatusCode::NOT_FOUND,
                    &format!("No entity named '{entity}'"),
                ),
            },
            (&Method::POST, [entity, "validate"]) => match lookup(self.tables(), entity) {
                Some(spec) => {
                    let b = match parse_body(content_type, body) {
                        Ok(b) => b,
                        Err(r) => return r,
                    };
                    self.validate(spec, b)
                }
                None => message(
                    StatusCode::NOT_FOUND,
                    &format!("No entity named '{entity}'"),
                ),
            },
            _ => message(StatusCode::NOT_FOUND, "Not found"),
        }
    }

    fn validate(&self, spec: &EntitySpec, body: Map<String, Value>) -> Resp {
        let id = uuid::Uuid::new_v4().to_string();
        match entity::check(spec, &body, &id, 0, self.plugins.as_ref()) {
            Ok(_) => json_response(
                StatusCode::OK,
                &json!({"message": "schema validation successful"}),
            ),
            Err(v) => {
                let (status, body) = StoreError::Schema(v).to_kong();
                json_response(StatusCode::from_u16(status).unwrap(), &body)
            }
        }
    }
}

/// Schemas are named by table (`keyauth_credentials`) or by Admin API collection.
fn lookup(tables: schema::Tables, name: &str) -> Option<&'static EntitySpec> {
    tables.by_table(name).or_else(|| tables.by_path(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemas_carry_kongs_entity_checks() {
        let checks = kong_entity_checks();
        assert_eq!(checks["kong"], "3.9.1");
        // Every entity and plugin named is one this build has.
        let tables = tables();
        for table in checks["entities"].as_object().unwrap().keys() {
            assert!(lookup(tables, table).is_some(), "{table}");
        }
        let registry = turnpike_plugins::bundled();
        for name in checks["plugins"].as_object().unwrap().keys() {
            assert!(registry.get(name).is_some(), "{name}");
        }
        let consumers = lookup(tables, "consumers").unwrap();
        let s = with_entity_checks(entity_schema(consumers, &registry), "consumers");
        assert_eq!(
            s["entity_checks"],
            json!([{"at_least_one_of": ["custom_id", "username"]}])
        );
        let services = lookup(tables, "services").unwrap();
        let s = with_entity_checks(entity_schema(services, &registry), "services");
        assert_eq!(s["entity_checks"].as_array().unwrap().len(), 5, "{s}");
        assert_eq!(
            s["entity_checks"][0]["conditional"]["then_match"],
            json!({"eq": null})
        );
        let targets = lookup(tables, "targets").unwrap();
        let s = with_entity_checks(entity_schema(targets, &registry), "targets");
        assert_eq!(s["entity_checks"], json!([]));
        // A plugin's own, and its config record's inside that field.
        use turnpike_config::declarative::PluginRegistry;
        let acl = with_plugin_checks(registry.schema_json("acl").unwrap(), "acl");
        assert_eq!(
            acl["entity_checks"][0],
            json!({"only_one_of": ["config.allow", "config.deny"]})
        );
        let oauth2 = with_plugin_checks(registry.schema_json("oauth2").unwrap(), "oauth2");
        assert_eq!(
            field(&oauth2, "config")["entity_checks"][0]["conditional"]["then_field"],
            "scopes"
        );
        assert_eq!(oauth2["entity_checks"], json!([]));
    }

    fn tables() -> schema::Tables {
        schema::Tables::new(&turnpike_plugins::bundled())
    }

    fn field<'a>(schema: &'a Value, name: &str) -> &'a Value {
        schema["fields"]
            .as_array()
            .unwrap()
            .iter()
            .find_map(|f| f.get(name))
            .unwrap_or_else(|| panic!("no field {name}"))
    }

    #[test]
    fn defaults_come_from_the_reader() {
        let s = entity_schema(
            tables().by_table("services").unwrap(),
            &turnpike_plugins::bundled(),
        );
        assert_eq!(field(&s, "retries")["default"], 5);
        assert_eq!(field(&s, "connect_timeout")["default"], 60000);
        assert_eq!(field(&s, "protocol")["default"], "http");
        assert_eq!(field(&s, "host")["required"], true);
        assert_eq!(field(&s, "name")["unique"], true);
        let r = entity_schema(
            tables().by_table("routes").unwrap(),
            &turnpike_plugins::bundled(),
        );
        assert_eq!(field(&r, "strip_path")["default"], true);
        assert_eq!(field(&r, "https_redirect_status_code")["default"], 426);
        assert_eq!(field(&r, "service")["type"], "foreign");
        let t = entity_schema(
            tables().by_table("targets").unwrap(),
            &turnpike_plugins::bundled(),
        );
        assert_eq!(field(&t, "weight")["default"], 100);
        let u = entity_schema(
            tables().by_table("upstreams").unwrap(),
            &turnpike_plugins::bundled(),
        );
        assert_eq!(field(&u, "slots")["default"], 10000);
    }
}
