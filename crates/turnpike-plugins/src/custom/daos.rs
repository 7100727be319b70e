//! An operator's plugin's own entities (Kong's `daos.lua`, an array of entity schemas): each
//! becomes a [`PluginEntity`] as a bundled plugin's are, so the store makes its table, the
//! declarative loader reads it (at the top level, or under its consumer when it has one), the
//! Admin API serves it (`/<admin_api_name>`, `/consumers/{c}/<admin_api_nested_name>`) and
//! `kong.db.<name>` reads it in the plugin's phases.
//!
//! What a field may be: a string (required, `auto`, `unique`, `one_of`, a default), an integer
//! (`between`), a boolean, an array or set of strings, a foreign key to consumers, services,
//! routes or another entity of the plugin; `id`, `created_at` and `tags` are the store's. The
//! entity's `entity_checks` are those the plugin's config may have (`crate::custom::Check`).
//! What is refused at start, naming the field: another primary key than `id`, other field
//! types (number, record, map), a custom `dao` module.

use serde_json::{Map, Value};
use turnpike_config::entity::{fk, EntitySpec, FieldKind, ForeignKey, PluginEntity};

use super::{leak, Check};

/// Kong's own tables, which a plugin's entity cannot take the name of.
const CORE_TABLES: &[&str] = &[
    "services",
    "routes",
    "consumers",
    "plugins",
    "upstreams",
    "targets",
    "certificates",
    "snis",
    "ca_certificates",
    "key_sets",
    "keys",
    "vaults",
    "tags",
    "workspaces",
    "parameters",
    "clustering_data_planes",
];

/// Fields the store keeps for every entity.
const OWN_BY_STORE: &[&str] = &["id", "created_at", "updated_at", "tags", "ws_id"];

/// The entities of `daos` (the module's value as JSON), for the plugin `plugin`.
pub(crate) fn entities(plugin: &str, daos: &Value) -> Result<Vec<&'static PluginEntity>, String> {
    let at = |e: String| format!("plugin '{plugin}': daos.lua: {e}");
    let list = daos.as_array().ok_or_else(|| {
        format!("custom plugin '{plugin}' returned non-array daos definition table")
    })?;
    let names: Vec<&str> = list
        .iter()
        .filter_map(|d| d.get("name").and_then(Value::as_str))
        .collect();
    list.iter()
        .map(|def| entity(def, &names).map_err(at))
        .collect()
}

fn entity(def: &Value, siblings: &[&str]) -> Result<&'static PluginEntity, String> {
    let name = def
        .get("name")
        .and_then(Value::as_str)
        .ok_or("an entity has no name")?;
    let at = |e: String| format!("entity '{name}': {e}");
    if CORE_TABLES.contains(&name) {
        return Err(at("the name is one of Kong's own entities".into()));
    }
    if def.get("dao").is_some() {
        return Err(at("a custom 'dao' module is not supported yet".into()));
    }
    let pk: Vec<&str> = strings(def.get("primary_key"));
    if !pk.is_empty() && pk != ["id"] {
        return Err(at(format!(
            "primary_key {pk:?} is not supported yet (only {{ \"id\" }})"
        )));
    }
    let mut fields: Vec<(&'static str, FieldKind)> = Vec::new();
    let mut foreign: Vec<ForeignKey> = Vec::new();
    let mut unique: Vec<&'static str> = Vec::new();
    let mut rules: Vec<(String, Rule)> = Vec::new();
    for entry in def
        .get("fields")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        let Some((field, f)) = entry.as_object().and_then(|m| m.iter().next()) else {
            return Err(at("a field is not a {name = {...}} table".into()));
        };
        if OWN_BY_STORE.contains(&field.as_str()) {
            continue;
        }
        let ty = f.get("type").and_then(Value::as_str).unwrap_or("");
        let flag = |k: &str| f.get(k).and_then(Value::as_bool).unwrap_or(false);
        let name: &'static str = leak(field);
        if flag("unique") {
            unique.push(name);
        }
        let kind = match ty {
            "foreign" => {
                let table = f.get("reference").and_then(Value::as_str).ok_or_else(|| {
                    at(format!("field '{field}': a foreign key without reference"))
                })?;
                if !["consumers", "services", "routes"].contains(&table)
                    && !siblings.contains(&table)
                {
                    return Err(at(format!(
                        "field '{field}': references to '{table}' are not supported yet"
                    )));
                }
                let cascade = f.get("on_delete").and_then(Value::as_str) == Some("cascade");
                foreign.push(fk(name, leak(table), cascade));
                continue;
            }
            "string" if flag("auto") => FieldKind::Auto,
            "string" if flag("required") && f.get("default").is_none() => FieldKind::Required,
            "string" => FieldKind::Optional,
            "integer" => {
                let b = f.get("between").and_then(Value::as_array);
                let lo = b.and_then(|b| b.first()?.as_i64());
                let hi = b.and_then(|b| b.get(1)?.as_i64());
                if (lo, hi) == (Some(0), Some(100_000_000)) {
                    FieldKind::Int
                } else {
                    if lo.is_some() || hi.is_some() {
                        rules.push((
                            field.clone(),
                            Rule::Between(lo.unwrap_or(i64::MIN), hi.unwrap_or(i64::MAX)),
                        ));
                    }
                    FieldKind::Integer
                }
            }
            "boolean" => FieldKind::Bool,
            "array" | "set"
                if f.pointer("/elements/type").and_then(Value::as_str) == Some("string") =>
            {
                FieldKind::StrArray
            }
            other => {
                return Err(at(format!(
                    "field '{field}': type '{other}' is not supported yet in a plugin's entity"
                )))
            }
        };
        if let Some(d) = f.get("default").filter(|d| !d.is_null()) {
            rules.push((field.clone(), Rule::Default(d.clone())));
        }
        if flag("required") && kind != FieldKind::Required && kind != FieldKind::Auto {
            rules.push((field.clone(), Rule::Required));
        }
        if let Some(one_of) = f.get("one_of").and_then(Value::as_array) {
            rules.push((field.clone(), Rule::OneOf(one_of.clone())));
        }
        fields.push((name, kind));
    }
    let checks: Vec<Check> = def
        .get("entity_checks")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(Check::parse)
        .collect::<Result<_, _>>()
        .map_err(at)?;
    let endpoint_key = def.get("endpoint_key").and_then(Value::as_str).map(leak);
    let cache_key: Vec<&'static str> = strings(def.get("cache_key"))
        .into_iter()
        .map(leak)
        .collect();
    let path = leak(
        def.get("admin_api_name")
            .and_then(Value::as_str)
            .unwrap_or(name),
    );
    let nested_path = def
        .get("admin_api_nested_name")
        .and_then(Value::as_str)
        .map_or(path, leak);
    let sample: Map<String, Value> = fields
        .iter()
        .filter(|(_, k)| *k == FieldKind::Required)
        .map(|(n, _)| (n.to_string(), Value::from("x")))
        .collect();
    let check: turnpike_config::entity::EntityCheck = Box::leak(Box::new(
        move |m: &mut Map<String, Value>| -> Vec<(String, String)> {
            let mut errors = Vec::new();
            for (field, rule) in &rules {
                rule.apply(field, m, &mut errors);
            }
            let whole = Value::Object(std::mem::take(m));
            errors.extend(
                checks
                    .iter()
                    .filter_map(|c| c.failure(&whole))
                    .map(|e| ("@entity".to_string(), e)),
            );
            if let Value::Object(back) = whole {
                *m = back;
            }
            errors
        },
    ));
    Ok(Box::leak(Box::new(PluginEntity {
        spec: EntitySpec {
            table: leak(name),
            path,
            nested_path,
            endpoint_key,
            unique: Box::leak(unique.into_boxed_slice()),
            cache_key: Box::leak(cache_key.into_boxed_slice()),
            foreign: Box::leak(foreign.into_boxed_slice()),
        },
        fields: Box::leak(fields.into_boxed_slice()),
        sample: leak(&Value::Object(sample).to_string()),
        check: Some(check),
    })))
}

fn strings(v: Option<&Value>) -> Vec<&str> {
    v.and_then(Value::as_array)
        .map(|l| l.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// A field's rule the store's reader does not know: its default, `one_of`, bounds, or
/// `required` on a field with a default.
enum Rule {
    Default(Value),
    OneOf(Vec<Value>),
    Between(i64, i64),
    Required,
}

impl Rule {
    fn apply(&self, field: &str, m: &mut Map<String, Value>, errors: &mut Vec<(String, String)>) {
        let unset = m.get(field).is_none_or(Value::is_null);
        match self {
            Rule::Default(d) => {
                if unset {
                    m.insert(field.to_string(), d.clone());
                }
            }
            Rule::Required => {
                if unset {
                    errors.push((field.to_string(), "required field missing".into()));
                }
            }
            Rule::OneOf(list) => {
                if let Some(v) = m.get(field).filter(|v| !v.is_null()) {
                    if !list.contains(v) {
                        let names: Vec<String> = list
                            .iter()
                            .map(|v| v.as_str().map_or(v.to_string(), str::to_string))
                            .collect();
                        errors.push((
                            field.to_string(),
                            format!("expected one of: {}", names.join(", ")),
                        ));
                    }
                }
            }
            Rule::Between(lo, hi) => {
                if let Some(n) = m.get(field).and_then(Value::as_i64) {
                    if n < *lo || n > *hi {
                        errors.push((
                            field.to_string(),
                            format!("value should be between {lo} and {hi}"),
                        ));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_daos_entity_becomes_a_plugin_entity() {
        let daos = json!([{
            "name": "api_clients",
            "primary_key": ["id"],
            "endpoint_key": "client_name",
            "cache_key": ["client_name"],
            "admin_api_name": "api-clients",
            "admin_api_nested_name": "api-client",
            "fields": [
                {"id": {"type": "string"}},
                {"created_at": {"type": "integer"}},
                {"consumer": {"type": "foreign", "reference": "consumers", "on_delete": "cascade", "required": true}},
                {"client_name": {"type": "string", "required": true, "unique": true}},
                {"tier": {"type": "string", "default": "free", "one_of": ["free", "gold"]}},
                {"quota": {"type": "integer", "between": [1, 1000]}},
                {"scopes": {"type": "set", "elements": {"type": "string"}}},
                {"tags": {"type": "set", "elements": {"type": "string"}}},
            ],
        }]);
        let e = entities("clients", &daos).unwrap();
        let e = e[0];
        assert_eq!(e.spec.table, "api_clients");
        assert_eq!(e.spec.path, "api-clients");
        assert_eq!(e.spec.nested_path, "api-client");
        assert_eq!(e.spec.endpoint_key, Some("client_name"));
        assert_eq!(e.spec.unique, ["client_name"]);
        assert_eq!(e.spec.foreign[0].table, "consumers");
        assert!(e.spec.foreign[0].cascade);
        let names: Vec<&str> = e.fields.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, ["client_name", "tier", "quota", "scopes"]);
        let check = e.check.unwrap();
        let mut m = json!({"client_name": "a"}).as_object().unwrap().clone();
        assert!(check(&mut m).is_empty());
        assert_eq!(m["tier"], "free");
        let mut bad = json!({"client_name": "a", "tier": "x", "quota": 5000})
            .as_object()
            .unwrap()
            .clone();
        let errors = check(&mut bad);
        assert_eq!(errors.len(), 2, "{errors:?}");
    }

    #[test]
    fn what_is_not_supported_is_named() {
        let e = entities(
            "p",
            &json!([{"name": "foos", "primary_key": ["color"], "fields": []}]),
        )
        .unwrap_err();
        assert!(e.contains("primary_key"), "{e}");
        let e = entities(
            "p",
            &json!([{"name": "x", "fields": [{"n": {"type": "number"}}]}]),
        )
        .unwrap_err();
        assert!(e.contains("field 'n': type 'number'"), "{e}");
        let e = entities("p", &json!({"x": {}})).unwrap_err();
        assert!(e.contains("non-array daos definition table"), "{e}");
        let e = entities("p", &json!([{"name": "routes", "fields": []}])).unwrap_err();
        assert!(e.contains("Kong's own"), "{e}");
    }
}
