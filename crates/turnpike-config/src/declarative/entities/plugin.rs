//! A plugin entity: name, scope and config (the config itself is checked by the plugin's schema).

use serde_json::{Map, Value};

use super::super::fields::Fields;
use super::*;

pub struct PluginRefs {
    pub route: Option<String>,
    pub service: Option<String>,
    pub consumer: Option<String>,
}

impl PluginRefs {
    /// The references given, as (foreign-key field, reference).
    pub fn given(self) -> impl Iterator<Item = (&'static str, String)> {
        [
            ("route", self.route),
            ("service", self.service),
            ("consumer", self.consumer),
        ]
        .into_iter()
        .filter_map(|(f, v)| Some((f, v?)))
    }
}

pub fn plugin(
    map: &Map<String, Value>,
    id: &str,
    now: i64,
) -> (Plugin, PluginRefs, Vec<(String, String)>) {
    let mut f = Fields::new(map);
    let id = read_id(&mut f, id);
    let (created_at, updated_at) = timestamps(&mut f, now);
    let name = f.req_str("name").unwrap_or_default();
    let instance_name = f.name("instance_name");
    let config = match f.raw("config") {
        None => Value::Object(Map::new()),
        Some(v @ Value::Object(_)) => v.clone(),
        Some(_) => {
            f.err("config", "expected a record");
            Value::Object(Map::new())
        }
    };
    let protocols = f.str_set("protocols").unwrap_or_else(|| {
        ["grpc", "grpcs", "http", "https"]
            .iter()
            .map(|s| s.to_string())
            .collect()
    });
    for (i, p) in protocols.iter().enumerate() {
        if !ROUTE_PROTOCOLS.contains(&p.as_str()) {
            f.err(
                format!("protocols.{}", i + 1),
                format!("expected one of: {}", ROUTE_PROTOCOLS.join(", ")),
            );
        }
    }
    let enabled = f.bool("enabled", true);
    let tags = f.tags();
    let refs = PluginRefs {
        route: f.raw("route").map(foreign_ref_value),
        service: f.raw("service").map(foreign_ref_value),
        consumer: f.raw("consumer").map(foreign_ref_value),
    };
    let errors = f.finish();
    let p = Plugin {
        id,
        created_at,
        updated_at,
        name,
        instance_name,
        route: None,
        service: None,
        consumer: None,
        config,
        protocols,
        enabled,
        tags,
    };
    (p, refs, errors)
}
