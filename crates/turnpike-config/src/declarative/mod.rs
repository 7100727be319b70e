//! Kong's declarative configuration (`_format_version: "3.0"`), read exactly as Kong reads it:
//! YAML or JSON; entities at the top level or nested under their parent; references by name or
//! id; Kong's deterministic UUIDv5 ids; every default and validation rule of the core entities.
//!
//! Loading is all-or-nothing: [`load`] returns either a complete [`Config`] or every error found,
//! each naming the entity and the field path. Nothing is half-applied because nothing is applied
//! here at all: the caller swaps a compiled snapshot in only on success.

pub mod entities;
pub mod errors;
mod fields;
pub mod healthchecks;
pub mod ids;
pub mod pem;
pub mod records;
pub mod vault;
pub mod yaml;

/// The loader's own maps (uniqueness, references): foldhash, seeded per process. SipHash was
/// 14% of a 100k-consumer config's load (perf).
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

use serde_json::{Map, Value};

pub use entities::*;
pub use errors::{DeclarativeError, EntityError};

mod config;
mod loader;
mod migrate;
pub mod positions;
mod refs;
mod registry;
mod stream;
mod text;

pub use config::*;
use loader::Loader;
use migrate::*;
pub use positions::Positions;
use refs::*;
pub use registry::*;
pub use text::*;

use crate::entity::{FieldKind, PluginEntity};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Service,
    Route,
    Upstream,
    Target,
    Consumer,
    Plugin,
    Certificate,
    Sni,
    CaCertificate,
    /// A plugin's entity (its folder's `daos`, listed by the plugin registry).
    Credential(&'static PluginEntity),
    Record(usize),
}

impl Kind {
    fn table(self) -> &'static str {
        match self {
            Kind::Service => "services",
            Kind::Route => "routes",
            Kind::Upstream => "upstreams",
            Kind::Target => "targets",
            Kind::Consumer => "consumers",
            Kind::Plugin => "plugins",
            Kind::Certificate => "certificates",
            Kind::Sni => "snis",
            Kind::CaCertificate => "ca_certificates",
            Kind::Credential(e) => e.spec.table,
            Kind::Record(i) => records::RECORDS[i].table,
        }
    }

    fn from_table(t: &str, plugins: &dyn PluginRegistry) -> Option<Kind> {
        Some(match t {
            "services" => Kind::Service,
            "routes" => Kind::Route,
            "upstreams" => Kind::Upstream,
            "targets" => Kind::Target,
            "consumers" => Kind::Consumer,
            "plugins" => Kind::Plugin,
            "certificates" => Kind::Certificate,
            "snis" => Kind::Sni,
            "ca_certificates" => Kind::CaCertificate,
            other if records::by_table(other).is_some() => {
                Kind::Record(records::by_table(other).unwrap())
            }
            other => Kind::Credential(plugins.entities().iter().find(|e| e.spec.table == other)?),
        })
    }

    /// Children that may be nested under this entity, and the foreign-key field they set: a
    /// consumer's include every plugin entity (credentials).
    fn children(
        self,
        plugins: &dyn PluginRegistry,
    ) -> impl Iterator<Item = (&'static str, &'static str)> + '_ {
        let credentials = (self == Kind::Consumer)
            .then(|| {
                plugins
                    .entities()
                    .iter()
                    .map(|e| (e.spec.table, "consumer"))
            })
            .into_iter()
            .flatten();
        self.own_children().iter().copied().chain(credentials)
    }

    fn own_children(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Kind::Service => &[("routes", "service"), ("plugins", "service")],
            Kind::Route => &[("plugins", "route")],
            Kind::Consumer => &[("plugins", "consumer")],
            Kind::Upstream => &[("targets", "upstream")],
            Kind::Certificate => &[("snis", "certificate")],
            Kind::Record(i) if records::RECORDS[i].table == "key_sets" => &[("keys", "set")],
            _ => &[],
        }
    }
}

/// One entity as written, before validation: 80 bytes, its fields borrowed from the document
/// (a clone of each consumer's fields without its credentials, and a path per entity, were
/// 60 MB of a 100k-consumer load's peak).
struct Item<'a> {
    kind: Kind,
    /// The entity as written, nested children included when `nested` (they are entities of
    /// their own: the readers' "unknown field" for them is dropped, and an error shows the
    /// entity without them).
    map: &'a Map<String, Value>,
    nested: bool,
    /// 1-based position in its list (Kong's error paths, e.g. `services.1.routes.2`).
    pos: u32,
    parent: Option<u32>,
    /// The foreign-key field the parent sets on this item (`service`, `route`, ...).
    child_key: Option<&'static str>,
    id: String,
}

impl Item<'_> {
    /// Whether `key` of this entity is a nested child list (not a field of its own).
    fn is_child_key(&self, key: &str, plugins: &dyn PluginRegistry) -> bool {
        self.nested && is_nested(self.kind, key, plugins)
    }

    /// The entity's own fields, for an error.
    fn own_map(&self, plugins: &dyn PluginRegistry) -> Map<String, Value> {
        self.map
            .iter()
            .filter(|(k, _)| !self.is_child_key(k, plugins))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

/// Whether `key` names entities nested under an entity of `kind` (a certificate's `snis` may
/// also be plain names, read by the certificate itself).
fn is_nested(kind: Kind, key: &str, plugins: &dyn PluginRegistry) -> bool {
    kind.children(plugins)
        .any(|(t, _)| t == key && !(kind == Kind::Certificate && t == "snis"))
}

/// Item `i`'s path from the top of the document.
fn item_path(items: &[Item], i: usize) -> Vec<(&'static str, usize)> {
    let mut path = Vec::new();
    let mut at = Some(i);
    while let Some(c) = at {
        path.push((items[c].kind.table(), items[c].pos as usize));
        at = items[c].parent.map(|p| p as usize);
    }
    path.reverse();
    path
}

/// Loads and validates declarative config text.
/// A JSON document is read entity by entity ([`load_json_streaming`]); any other, and one
/// with errors, whole.
pub fn load_str(text: &str, plugins: &dyn PluginRegistry) -> Result<Config, DeclarativeError> {
    load_str_against(text, plugins, None)
}

/// Like [`load_str`], for a reload: what the running config `previous` has unchanged is
/// shared with it as it is read.
pub fn load_str_against<'p>(
    text: &str,
    plugins: &'p dyn PluginRegistry,
    previous: Option<&'p Config>,
) -> Result<Config, DeclarativeError> {
    if let Some(cfg) = load_json_streaming_against(text, plugins, previous) {
        return Ok(cfg);
    }
    let json = text.trim_start().starts_with('{');
    if json {
        return load(&parse_text(text)?, plugins);
    }
    // YAML: made JSON text (its collections never held as values: a 100k-route reload peaked
    // at 1.84x steady memory with them), then read entity by entity; a document with errors
    // is read again whole, for them.
    if let Some(json) = text::yaml_as_json(text) {
        if let Some(cfg) = load_json_streaming_against(&json, plugins, previous) {
            return Ok(cfg);
        }
    }
    load(&parse_text(text)?, plugins)
}

/// Declarative text as JSON text, for a caller that gives the text up: YAML is made the JSON
/// text of the same value and its own text freed, so that a load never holds both (a 50 MiB
/// YAML file was 53 MB of the load's peak beside its JSON). JSON, and YAML that does not
/// convert (its errors are reported from it), come back as they are. [`load_str_against`]
/// reads the result as it would have read the text, errors and config hash alike.
pub fn into_json_text(text: String) -> String {
    if text.trim_start().starts_with('{') {
        return text;
    }
    text::yaml_as_json(&text).unwrap_or(text)
}

/// Reads a valid JSON document entity by entity, never holding it whole as values: the
/// config, equal to what [`load`] makes of the document (its hash included). `None` for text
/// that is not JSON, that has errors (which [`load`] then reports) or that needs the whole
/// document (formats 1.1 and 2.1, `_format_version` after the entities, a field given twice).
pub fn load_json_streaming(text: &str, plugins: &dyn PluginRegistry) -> Option<Config> {
    load_json_streaming_against(text, plugins, None)
}

/// Like [`load_json_streaming`], for a reload: routes the running config `previous` has
/// unchanged (timestamps aside) are its own, shared as they are read, so that a reload never
/// holds them twice.
pub fn load_json_streaming_against<'p>(
    text: &str,
    plugins: &'p dyn PluginRegistry,
    previous: Option<&'p Config>,
) -> Option<Config> {
    if !text.trim_start().starts_with('{') {
        return None;
    }
    stream::load_json(text, plugins, previous)
}

fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// Validates a parsed declarative config.
pub fn load(input: &Value, plugins: &dyn PluginRegistry) -> Result<Config, DeclarativeError> {
    load_inner(input, plugins, None)
}

/// Like [`load`], for a caller that already identifies the config (the database's config
/// version): skips digesting the whole input, which costs tens of milliseconds at 10k routes.
pub fn load_with_hash(
    input: &Value,
    plugins: &dyn PluginRegistry,
    hash: String,
) -> Result<Config, DeclarativeError> {
    load_inner(input, plugins, Some(hash))
}

fn load_inner(
    input: &Value,
    plugins: &dyn PluginRegistry,
    hash: Option<String>,
) -> Result<Config, DeclarativeError> {
    let Value::Object(top) = input else {
        return Err(DeclarativeError::message("expected an object".into()));
    };
    let mut top_errors: Vec<(String, String)> = Vec::new();
    let format_version = match top.get("_format_version") {
        None | Some(Value::Null) => {
            top_errors.push(("_format_version".into(), fields::REQUIRED.into()));
            String::new()
        }
        Some(Value::String(s)) if ["1.1", "2.1", "3.0"].contains(&s.as_str()) => s.clone(),
        Some(_) => {
            top_errors.push((
                "_format_version".into(),
                "expected one of: 1.1, 2.1, 3.0".into(),
            ));
            String::new()
        }
    };
    let transform = match top.get("_transform") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            top_errors.push(("_transform".into(), "expected a boolean".into()));
            true
        }
    };
    // Formats 1.1 and 2.1 wrote regex paths without the `~` marker; Kong migrates them.
    let migrated;
    let top = if format_version == "1.1" || format_version == "2.1" {
        migrated = migrate_route_paths(input);
        migrated.as_object().unwrap()
    } else {
        top
    };

    // 1. Collect every entity, nested ones after their parent.
    let mut items: Vec<Item> = Vec::new();
    for (key, value) in top {
        match key.as_str() {
            "_format_version" | "_transform" | "_comment" | "_ignore" => continue,
            "_workspace" | "_info" | "_konnect" | "_plugin_configs" => continue,
            // A Kong control plane's export lists its workspaces (OSS: the default one):
            // every entity here is the default workspace's.
            "workspaces" => continue,
            // Extension keys (`x-defaults: &defaults ...`): anchors for YAML reuse, as decK
            // files write them; not entities.
            k if k.starts_with("x-") => continue,
            _ => {}
        }
        let Some(kind) = Kind::from_table(key, plugins) else {
            top_errors.push((key.clone(), "unknown field".into()));
            continue;
        };
        collect(
            plugins,
            kind,
            kind.table(),
            value,
            None,
            None,
            &[],
            &mut items,
            &mut top_errors,
        );
    }

    let mut loader = Loader::new(plugins, format_version, transform);
    loader.reserve(&items);
    loader.read(&mut items, 0);
    loader.finish();
    let Loader {
        mut cfg,
        errs,
        top_errors: more,
        ..
    } = loader;
    top_errors.extend(more);
    let entity_errors: Vec<EntityError> = errs
        .into_iter()
        .map(|(i, e)| {
            let it = &items[i];
            EntityError::new(
                it.kind.table(),
                &item_path(&items, i),
                &it.own_map(plugins),
                e,
            )
        })
        .collect();
    if !top_errors.is_empty() || !entity_errors.is_empty() {
        return Err(DeclarativeError {
            top: top_errors,
            entities: entity_errors,
            message: None,
        });
    }
    cfg.hash = hash.unwrap_or_else(|| ids::config_hash(input));
    Ok(cfg)
}

#[allow(clippy::too_many_arguments)]
fn collect<'a>(
    plugins: &dyn PluginRegistry,
    kind: Kind,
    table: &'static str,
    value: &'a Value,
    parent: Option<usize>,
    child_key: Option<&'static str>,
    parent_path: &[(&'static str, usize)],
    items: &mut Vec<Item<'a>>,
    top_errors: &mut Vec<(String, String)>,
) {
    let path_str = |p: &[(&'static str, usize)]| errors::render_path(p);
    let Value::Array(arr) = value else {
        let mut p = path_str(parent_path);
        if !p.is_empty() {
            p.push('.');
        }
        top_errors.push((format!("{p}{table}"), "expected an array".into()));
        return;
    };
    for (i, v) in arr.iter().enumerate() {
        collect_entity(
            plugins,
            kind,
            v,
            i + 1,
            parent,
            child_key,
            parent_path,
            items,
            top_errors,
        );
    }
}

/// Collects the entity `v`, at 1-based position `pos` of its list, and its nested children.
#[allow(clippy::too_many_arguments)]
fn collect_entity<'a>(
    plugins: &dyn PluginRegistry,
    kind: Kind,
    v: &'a Value,
    pos: usize,
    parent: Option<usize>,
    child_key: Option<&'static str>,
    parent_path: &[(&'static str, usize)],
    items: &mut Vec<Item<'a>>,
    top_errors: &mut Vec<(String, String)>,
) {
    let table = kind.table();
    let mut path = parent_path.to_vec();
    path.push((table, pos));
    // Certificates may list plain sni names: those are not entities of their own.
    if kind == Kind::Sni && parent.is_some() && v.is_string() {
        return;
    }
    let Value::Object(map) = v else {
        top_errors.push((errors::render_path(&path), "expected a record".into()));
        return;
    };
    let idx = items.len();
    items.push(Item {
        kind,
        map,
        nested: map.keys().any(|k| is_nested(kind, k, plugins)),
        pos: pos as u32,
        parent: parent.map(|p| p as u32),
        child_key,
        id: String::new(),
    });
    for (child_table, fk) in kind.children(plugins) {
        if let Some(cv) = map.get(child_table) {
            if kind == Kind::Certificate
                && child_table == "snis"
                && cv
                    .as_array()
                    .is_some_and(|a| a.iter().all(|x| x.is_string()))
            {
                continue;
            }
            let ck = Kind::from_table(child_table, plugins).unwrap();
            collect(
                plugins,
                ck,
                ck.table(),
                cv,
                Some(idx),
                Some(fk),
                &path,
                items,
                top_errors,
            );
        }
    }
}

/// Kong's `generate_ids`: a UUIDv5 from the cache key or the unique endpoint key; random when
/// Kong would have no stable key either.
fn generate_id(items: &[Item], i: usize) -> String {
    let it = &items[i];
    let s = |k: &str| it.map.get(k).and_then(|v| v.as_str());
    let parent_id = it.parent.map(|p| items[p as usize].id.as_str());
    let cache_key = |fields: &[&str], required: &[&str], auto: &[&str]| -> Option<String> {
        let mut ck = vec![it.kind.table().to_string(), "*".to_string()];
        for f in fields {
            if auto.contains(f) {
                return None;
            }
            match it.map.get(*f) {
                Some(Value::String(v)) => ck.push(v.clone()),
                None | Some(Value::Null) => {
                    if Some(*f) == it.child_key {
                        ck.push(parent_id?.to_string());
                    } else if required.contains(f) {
                        return None;
                    } else {
                        ck.push(String::new());
                    }
                }
                // Kong's builder skips non-string values (e.g. `{id = ...}` references).
                Some(_) => {}
            }
        }
        Some(ck.join(":"))
    };
    let key = match it.kind {
        Kind::Service | Kind::Route | Kind::Upstream => s("name").map(String::from),
        Kind::Consumer => s("username").map(String::from),
        Kind::Sni => s("name").map(|n| n.to_ascii_lowercase()),
        Kind::Target => cache_key(&["upstream", "target"], &["upstream", "target"], &[]),
        Kind::Plugin => cache_key(&["name", "route", "service", "consumer"], &["name"], &[]),
        Kind::Credential(spec) => {
            let auto: Vec<&str> = spec
                .fields
                .iter()
                .filter(|(_, kind)| *kind == FieldKind::Auto)
                .map(|(n, _)| *n)
                .collect();
            let required: Vec<&str> = spec
                .fields
                .iter()
                .filter(|(_, kind)| *kind == FieldKind::Required)
                .map(|(n, _)| *n)
                .chain(["consumer"])
                .collect();
            cache_key(spec.spec.identity(), &required, &auto)
        }
        Kind::Certificate | Kind::CaCertificate => None,
        Kind::Record(k) => s(records::RECORDS[k].endpoint_key).map(String::from),
    };
    match key {
        Some(k) => ids::entity_id(it.kind.table(), &k),
        None => uuid::Uuid::new_v4().to_string(),
    }
}

#[cfg(test)]
mod tests;
