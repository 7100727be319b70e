//! An operator's own Lua plugin, installed as Kong installs one: named in `plugins`
//! (`bundled,my-plugin`), found through `lua_package_path` as `kong/plugins/<name>/handler.lua`
//! and `schema.lua`. The handler's `PRIORITY` orders it among the bundled plugins, its phase
//! methods (`rewrite`, `access`, `response`, `header_filter`, `body_filter`, `log`) run with the PDK of
//! the serverless plugins, called as Kong calls them (`handler:access(conf)`), and its
//! schema's `config` record is the config's schema: validated, defaulted and shown by
//! `GET /schemas/plugins/<name>` as a bundled plugin's.
//!
//! Read once at start; each worker thread's Lua state loads the modules on the first request
//! that needs them, and runs the handler's `init_worker` then. The config record's
//! `entity_checks` that Kong's schema library names `at_least_one_of`, `only_one_of`,
//! `distinct`, `mutually_required` and `mutually_exclusive` are checked with Kong's messages.
//! `configure(configs)` runs in each worker on its first request with a configuration, and
//! `certificate` in the TLS handshake for a global config. What is not there yet: `daos.lua`
//! and `api.lua`, the other entity checks and custom validators.

mod daos;

use std::sync::Arc;

use serde_json::Value;
use turnpike_config::entity::PluginEntity;

use crate::lua::{self, Code, Phase};
use crate::pre_function::Serverless;
use crate::schema::{Default, Field, Type};
use crate::{Handler, PluginSpec};

/// What an operator's plugin says of itself (Lua or external alike): its name, PRIORITY and
/// VERSION, and its schema's config record as the registry checks and shows it.
pub(crate) struct Described {
    pub name: &'static str,
    pub priority: i32,
    pub version: &'static str,
    pub fields: &'static [Field],
    /// Its `protocols` are HTTP's only.
    pub http_only: bool,
    /// It may be scoped to a consumer (not `typedefs.no_consumer`).
    pub allows_consumer: bool,
    /// The config record's `entity_checks` this build knows.
    pub checks: Vec<Check>,
}

impl Described {
    /// From what the plugin's modules (or its plugin server) say; errors name the plugin.
    pub(crate) fn new(
        name: &str,
        priority: i64,
        version: &str,
        schema: &Value,
        at: &str,
    ) -> Result<Described, String> {
        let (fields, http_only, allows_consumer) =
            config_fields(schema).map_err(|e| format!("{at}: schema: {e}"))?;
        let checks = config_checks(schema).map_err(|e| format!("{at}: schema: {e}"))?;
        Ok(Described {
            name: leak(name),
            priority: priority.clamp(i32::MIN.into(), i32::MAX.into()) as i32,
            version: leak(version),
            fields,
            http_only,
            allows_consumer,
            checks,
        })
    }
}

/// An operator's plugin: its description, and how a config of it becomes a handler. The
/// registry sees it as it sees a bundled plugin.
pub(crate) trait OwnPlugin: Send + Sync {
    fn described(&self) -> &Described;
    fn handler(
        &self,
        config: &Value,
        ctx: &crate::BuildContext,
    ) -> Result<Arc<dyn Handler>, String>;
}

impl<T: OwnPlugin> PluginSpec for T {
    fn name(&self) -> &'static str {
        self.described().name
    }
    fn priority(&self) -> i32 {
        self.described().priority
    }
    fn version(&self) -> &'static str {
        self.described().version
    }
    fn fields(&self) -> &'static [Field] {
        self.described().fields
    }
    fn allows_consumer(&self) -> bool {
        self.described().allows_consumer
    }
    fn entity_checks(&self, config: &Value) -> Vec<(String, String)> {
        self.described()
            .checks
            .iter()
            .filter_map(|c| c.failure(config))
            .map(|m| ("config.@entity".to_string(), m))
            .collect()
    }
    fn http_only(&self) -> bool {
        self.described().http_only
    }
    fn build(&self, config: &Value, ctx: &crate::BuildContext) -> Result<Arc<dyn Handler>, String> {
        self.handler(config, ctx)
    }
}

/// A custom Lua plugin, as the registry knows it.
pub struct LuaPlugin {
    described: Described,
    phases: Vec<Phase>,
    wants_body: bool,
    /// The handler has `configure(configs)`.
    configure: bool,
    /// Its own entities (its `daos.lua`).
    pub entities: Vec<&'static PluginEntity>,
    /// Its own Admin API routes (its `api.lua`).
    pub api: Vec<lua::api::Route>,
    /// Its code calls `kong.client.load_consumer`.
    loads_consumers: bool,
    /// Its code reads `kong.vault` (the snapshot's vaults, through its `Dao`).
    reads_vaults: bool,
}

/// One of a record's `entity_checks` (Kong's `kong/db/schema/init.lua`), over its fields.
#[derive(Debug, PartialEq)]
pub(crate) enum Check {
    AtLeastOneOf(Vec<String>),
    OnlyOneOf(Vec<String>),
    Distinct(Vec<String>),
    MutuallyRequired(Vec<String>),
    MutuallyExclusive(Vec<String>),
}

impl Check {
    fn parse(v: &Value) -> Result<Check, String> {
        let (kind, names) = v
            .as_object()
            .and_then(|m| m.iter().next())
            .ok_or("an entity check is not a {name = {...}} table")?;
        let names: Vec<String> = names
            .as_array()
            .map(|l| {
                l.iter()
                    .filter_map(|n| n.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        Ok(match kind.as_str() {
            "at_least_one_of" => Check::AtLeastOneOf(names),
            "only_one_of" => Check::OnlyOneOf(names),
            "distinct" => Check::Distinct(names),
            "mutually_required" => Check::MutuallyRequired(names),
            "mutually_exclusive" => Check::MutuallyExclusive(names),
            other => return Err(format!("entity check '{other}' is not supported yet")),
        })
    }

    /// Kong's message when `config` fails the check.
    pub(crate) fn failure(&self, config: &Value) -> Option<String> {
        let set = |n: &String| config.get(n).is_some_and(|v| !v.is_null());
        let quoted = |ns: &[String]| {
            ns.iter()
                .map(|n| format!("'{n}'"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let (ok, message, names) = match self {
            Check::AtLeastOneOf(ns) => (
                ns.iter().any(set),
                "at least one of these fields must be non-empty",
                ns,
            ),
            Check::OnlyOneOf(ns) => (
                ns.iter().filter(|n| set(n)).count() == 1,
                "exactly one of these fields must be non-empty",
                ns,
            ),
            Check::Distinct(ns) => {
                let values: Vec<&Value> = ns.iter().filter_map(|n| config.get(n)).collect();
                let distinct = values
                    .iter()
                    .enumerate()
                    .all(|(i, v)| v.is_null() || !values[..i].contains(v));
                (distinct, "values of these fields must be distinct", ns)
            }
            Check::MutuallyRequired(ns) => {
                let n = ns.iter().filter(|n| set(n)).count();
                (
                    n == 0 || n == ns.len(),
                    "all or none of these fields must be set",
                    ns,
                )
            }
            Check::MutuallyExclusive(ns) => (
                ns.iter().filter(|n| set(n)).count() <= 1,
                "only one or none of these fields must be set",
                ns,
            ),
        };
        (!ok).then(|| format!("{message}: {}", quoted(names)))
    }
}

/// Finds and reads the plugin `name` (its handler and schema modules) through
/// `settings.package_path`. The plugin lives as long as the process (the registry holds
/// `'static` specs), as Kong's loaded modules do.
pub fn load(name: &str, settings: &lua::Settings) -> Result<&'static LuaPlugin, String> {
    let info = lua::inspect_plugin(settings, name)
        .map_err(|e| format!("plugin '{name}' enabled but not installed: {e}"))?;
    let described = Described::new(
        name,
        info.priority.unwrap_or(0),
        info.version.as_deref().unwrap_or("0.1.0"),
        &info.schema,
        &format!("plugin '{name}'"),
    )?;
    let entities = match &info.daos {
        Some(d) => daos::entities(name, d)?,
        None => Vec::new(),
    };
    let plugin = LuaPlugin {
        described,
        phases: info.phases,
        wants_body: info.wants_body,
        configure: info.configure,
        entities,
        api: info.api.iter().map(|p| lua::api::Route::new(p)).collect(),
        loads_consumers: info.loads_consumers,
        reads_vaults: info.reads_vaults,
    };
    Ok(Box::leak(Box::new(plugin)))
}

fn leak(s: &str) -> &'static str {
    Box::leak(s.to_string().into_boxed_str())
}

/// The schema's `config` record as fields, and whether its `protocols` are HTTP's only and
/// whether it may be scoped to a consumer (not `typedefs.no_consumer`).
pub(crate) fn config_fields(schema: &Value) -> Result<(&'static [Field], bool, bool), String> {
    let entries = schema
        .get("fields")
        .and_then(Value::as_array)
        .ok_or("no 'fields' list")?;
    let mut config = None;
    let mut http_only = false;
    let mut allows_consumer = true;
    for entry in entries {
        let Some((name, def)) = entry.as_object().and_then(|m| m.iter().next()) else {
            continue;
        };
        match name.as_str() {
            "config" => config = Some(def),
            "protocols" => {
                let listed = def.pointer("/elements/one_of").and_then(Value::as_array);
                http_only = listed.is_some_and(|l| {
                    l.iter()
                        .all(|p| crate::schema::HTTP_PROTOCOLS.contains(&p.as_str().unwrap_or("")))
                });
            }
            "consumer" => {
                allows_consumer = !(def.get("type").and_then(Value::as_str) == Some("foreign")
                    && def.as_object().is_some_and(|d| d.contains_key("eq")));
            }
            _ => {}
        }
    }
    let config = config.ok_or("no 'config' record")?;
    let fields = record_fields(config, "config")?;
    Ok((fields, http_only, allows_consumer))
}

/// The config record's `entity_checks`.
pub(crate) fn config_checks(schema: &Value) -> Result<Vec<Check>, String> {
    let config = schema
        .get("fields")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find_map(|e| e.get("config"));
    config
        .and_then(|c| c.get("entity_checks"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(Check::parse)
        .collect()
}

/// A record's fields (`{type = "record", fields = {{name = {...}}, ...}}`).
fn record_fields(record: &Value, at: &str) -> Result<&'static [Field], String> {
    let mut out = Vec::new();
    for entry in record
        .get("fields")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        let Some((name, def)) = entry.as_object().and_then(|m| m.iter().next()) else {
            return Err(format!("{at}: a field is not a {{name = {{...}}}} table"));
        };
        out.push(field(name, def, &format!("{at}.{name}"))?);
    }
    Ok(Box::leak(out.into_boxed_slice()))
}

fn strings(v: Option<&Value>) -> Option<&'static [&'static str]> {
    let list: Vec<&'static str> = v?
        .as_array()?
        .iter()
        .filter_map(|s| s.as_str().map(leak))
        .collect();
    Some(Box::leak(list.into_boxed_slice()))
}

fn field(name: &str, def: &Value, at: &str) -> Result<Field, String> {
    let ty_name = def.get("type").and_then(Value::as_str).unwrap_or("");
    let between = def.get("between").and_then(Value::as_array);
    let elements = def.get("elements");
    let element_type = elements
        .and_then(|e| e.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("");
    let ty = match ty_name {
        "string" => match strings(def.get("one_of")) {
            Some(list) => Type::OneOf(list),
            None => Type::String,
        },
        "integer" if between.is_none() && (def.get("gt").is_some() || def.get("lt").is_some()) => {
            Type::Integer {
                min: def
                    .get("gt")
                    .and_then(Value::as_i64)
                    .map_or(i64::MIN, |g| g + 1),
                max: def
                    .get("lt")
                    .and_then(Value::as_i64)
                    .map_or(i64::MAX, |l| l - 1),
            }
        }
        "integer" => match between {
            Some(b) => Type::Integer {
                min: b.first().and_then(Value::as_i64).unwrap_or(i64::MIN),
                max: b.get(1).and_then(Value::as_i64).unwrap_or(i64::MAX),
            },
            None => Type::Integer {
                min: i64::MIN,
                max: i64::MAX,
            },
        },
        "number" => match between {
            Some(b) => Type::NumberIn {
                min: b.first().and_then(Value::as_f64).unwrap_or(f64::MIN),
                max: b.get(1).and_then(Value::as_f64).unwrap_or(f64::MAX),
            },
            None => Type::Number,
        },
        "boolean" => Type::Boolean,
        "array" | "set" => match element_type {
            "string" => match strings(elements.and_then(|e| e.get("one_of"))) {
                Some(list) => Type::OneOfArray(list),
                None => Type::StringArray,
            },
            "integer" => Type::IntegerArray {
                min: i64::MIN,
                max: i64::MAX,
            },
            "record" => Type::RecordArray(record_fields(elements.unwrap_or(&Value::Null), at)?),
            other => return Err(format!("{at}: arrays of '{other}' are not supported yet")),
        },
        "map" => {
            let values = def.get("values");
            match values.and_then(|v| v.get("type")).and_then(Value::as_str) {
                Some("string") => Type::Map,
                Some("record") => {
                    Type::MapOfRecords(record_fields(values.unwrap_or(&Value::Null), at)?)
                }
                _ => return Err(format!("{at}: this map's values are not supported yet")),
            }
        }
        "record" => Type::Record(record_fields(def, at)?),
        other => return Err(format!("{at}: type '{other}' is not supported yet")),
    };
    let mut f = Field::new(leak(name), ty);
    if def.get("required").and_then(Value::as_bool) == Some(true) {
        f = f.required();
    }
    if def.get("referenceable").and_then(Value::as_bool) == Some(true) {
        f = f.referenceable();
    }
    if let Some(d) = def.get("default") {
        f = f.default(default_of(d, ty_name));
    }
    Ok(f)
}

/// A schema default as the registry keeps it. Lua has one table type: an empty table is an
/// empty array for an array field.
fn default_of(d: &Value, ty_name: &str) -> Default {
    match d {
        Value::String(s) => Default::Str(leak(s)),
        Value::Bool(b) => Default::Bool(*b),
        Value::Number(n) if ty_name == "integer" => Default::Int(n.as_i64().unwrap_or_default()),
        Value::Number(n) => Default::Float(n.as_f64().unwrap_or_default()),
        Value::Object(m) if m.is_empty() && matches!(ty_name, "array" | "set") => {
            Default::EmptyArray
        }
        other => Default::Json(leak(&other.to_string())),
    }
}

impl OwnPlugin for LuaPlugin {
    fn described(&self) -> &Described {
        &self.described
    }
    fn handler(
        &self,
        config: &Value,
        ctx: &crate::BuildContext,
    ) -> Result<Arc<dyn Handler>, String> {
        let mut phases: [Vec<String>; lua::PHASES] = std::default::Default::default();
        let conf = lua_literal(config);
        let configure = if self.configure {
            let (configs, key) = &*configs_of(ctx, self.described.name);
            CONFIGURE
                .replace("@CONFIGS@", configs)
                .replace("@KEY@", &key.to_string())
        } else {
            String::new()
        };
        for p in &self.phases {
            phases[*p as usize].push(format!(
                "local handler = require(\"kong.plugins.{name}.handler\")\n\
                 {INIT_WORKER}\n\
                 {configure}\n\
                 local conf = {conf}\n\
                 return function() return handler:{phase}(conf) end",
                name = self.described.name,
                phase = p.name()
            ));
        }
        let mut code = Code::new(
            self.described.name,
            phases,
            ctx.runtime.lua.settings().clone(),
        );
        code.trusted = true;
        code.keep_logs = crate::request_logs::wanted(ctx);
        code.config_id = ctx.plugin_id();
        if !self.entities.is_empty() || self.loads_consumers || self.reads_vaults {
            code.dao = Some(dao_of(
                ctx,
                self.described.name,
                &self.entities,
                self.loads_consumers,
            ));
        }
        Ok(Arc::new(Serverless::from_code(code, self.wants_body)))
    }
}

/// Kong's `init_worker` phase, once per worker thread: run when the thread first loads the
/// plugin's handler (on the first request a config of the plugin sees there), its error
/// logged as Kong logs one. Kong runs it at the worker's start whether or not a config uses
/// the plugin; here it waits for the first config that does.
const INIT_WORKER: &str = "\
local inited = package.loaded[\"turnpike.init_worker\"] or {}
package.loaded[\"turnpike.init_worker\"] = inited
if not inited[handler] then
  inited[handler] = true
  if type(handler.init_worker) == \"function\" then
    local ok, err = pcall(handler.init_worker, handler)
    if not ok then kong.log.err(\"init_worker: \", err) end
  end
end";

/// Kong's `configure` phase: the handler's `configure(configs)` with every enabled config of
/// the plugin in the node's configuration, once per worker thread for each configuration (a
/// key of the configs says which it last saw); run on the first request the thread serves
/// with a configuration (Kong runs it when the configuration is loaded).
const CONFIGURE: &str = "\
local configured = package.loaded[\"turnpike.configured\"] or {}
package.loaded[\"turnpike.configured\"] = configured
if configured[handler] ~= \"@KEY@\" then
  configured[handler] = \"@KEY@\"
  local ok, err = pcall(handler.configure, handler, @CONFIGS@)
  if not ok then kong.log.err(\"configure: \", err) end
end";

/// Every enabled config of the plugin `name` in the configuration being built, as a Lua list
/// (`nil` for none, as Kong passes), and a key for it: made once per plugin and build.
impl LuaPlugin {
    /// Answers an Admin API request for one of its `api.lua` routes (`None`: no route of it
    /// matches the path).
    pub fn admin_call(
        &'static self,
        runtime: &crate::Runtime,
        call: turnpike_config::declarative::ApiCall<'_>,
        config: &turnpike_config::Config,
    ) -> Option<turnpike_config::declarative::ApiAnswer> {
        let settings = runtime.lua.settings();
        let route = self.api.iter().find(|r| r.matches(call.path).is_some())?;
        let mut headers = http::HeaderMap::new();
        for (k, v) in &call.headers {
            if let (Ok(k), Ok(v)) = (
                http::HeaderName::from_bytes(k.as_bytes()),
                http::HeaderValue::from_bytes(v),
            ) {
                headers.append(k, v);
            }
        }
        let dao = (!self.entities.is_empty()).then(|| {
            Arc::new(lua::db::Dao::new(
                config,
                &self.entities,
                runtime.credentials.clone(),
            ))
        });
        let a = lua::api::call(
            settings,
            lua::api::Call {
                plugin: self.described.name,
                route,
                method: call.method,
                path: call.path,
                query: call.query,
                headers,
                body: bytes::Bytes::copy_from_slice(call.body),
                params: call.params,
                dao,
            },
        );
        Some(turnpike_config::declarative::ApiAnswer {
            status: a.status.as_u16(),
            headers: a
                .headers
                .into_iter()
                .map(|(k, v)| (k.as_str().to_string(), v.as_bytes().to_vec()))
                .collect(),
            body: a.body.to_vec(),
        })
    }
}

/// The plugin's entities in the configuration being built, indexed once for all its configs.
fn dao_of(
    ctx: &crate::BuildContext,
    name: &'static str,
    entities: &[&'static PluginEntity],
    consumers: bool,
) -> Arc<lua::db::Dao> {
    type Made = std::sync::Mutex<std::collections::HashMap<&'static str, Arc<lua::db::Dao>>>;
    let made = ctx.shared::<Made>(|_| std::default::Default::default());
    let mut made = made.lock().unwrap_or_else(|e| e.into_inner());
    made.entry(name)
        .or_insert_with(|| {
            // What the plugin cached of the entities it read (kong.cache) may be stale now:
            // every worker empties its cache, as Kong purges its cache on a new declarative
            // config (DB mode invalidates the changed entities' keys).
            ctx.runtime
                .lua
                .settings()
                .cache_generation
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let dao = lua::db::Dao::new(ctx.config, entities, ctx.runtime.credentials.clone());
            Arc::new(if consumers {
                dao.with_consumers(ctx.consumer_index())
            } else {
                dao
            })
        })
        .clone()
}

fn configs_of(ctx: &crate::BuildContext, name: &'static str) -> Arc<(String, u64)> {
    type Made = std::sync::Mutex<std::collections::HashMap<&'static str, Arc<(String, u64)>>>;
    let made = ctx.shared::<Made>(|_| std::default::Default::default());
    let mut made = made.lock().unwrap_or_else(|e| e.into_inner());
    made.entry(name)
        .or_insert_with(|| {
            let configs: Vec<String> = ctx
                .config
                .plugins
                .iter()
                .filter(|p| p.enabled && p.name == name)
                .map(|p| lua_literal(&p.config))
                .collect();
            let text = if configs.is_empty() {
                "nil".to_string()
            } else {
                format!("{{{}}}", configs.join(", "))
            };
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            text.hash(&mut h);
            Arc::new((text, h.finish()))
        })
        .clone()
}

/// A JSON value as a Lua constructor: objects as tables with string keys, arrays as
/// sequences, JSON null left out (Kong hands a plugin its config without nulls).
fn lua_literal(v: &Value) -> String {
    match v {
        Value::Null => "nil".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => lua_string(s),
        Value::Array(items) => {
            let parts: Vec<String> = items.iter().map(lua_literal).collect();
            format!("{{{}}}", parts.join(", "))
        }
        Value::Object(m) => {
            let parts: Vec<String> = m
                .iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| format!("[{}] = {}", lua_string(k), lua_literal(v)))
                .collect();
            format!("{{{}}}", parts.join(", "))
        }
    }
}

/// A string as a Lua literal: quoted, every byte outside printable ASCII (and `"`, `\`) as a
/// decimal escape, so no text can end the literal.
fn lua_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for b in s.bytes() {
        if (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\' {
            out.push(b as char);
        } else {
            out.push_str(&format!("\\{b:03}"));
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn configs_become_lua_constructors_that_no_text_escapes() {
        let v = json!({"a": "x\"]] .. os.exit() --\n\u{e9}", "n": 3, "l": [1, "b"], "gone": null});
        let lit = lua_literal(&v);
        let lua = mlua::Lua::new();
        let t: mlua::Table = lua.load(format!("return {lit}")).eval().unwrap();
        assert_eq!(
            t.get::<String>("a").unwrap(),
            "x\"]] .. os.exit() --\n\u{e9}"
        );
        assert_eq!(t.get::<i64>("n").unwrap(), 3);
        assert_eq!(t.get::<mlua::Table>("l").unwrap().raw_len(), 2);
        assert!(t.get::<mlua::Value>("gone").unwrap().is_nil());
    }

    #[test]
    fn entity_checks_say_what_kong_says() {
        let schema = json!({"fields": [{"config": {"type": "record", "fields": [], "entity_checks": [
            {"at_least_one_of": ["a", "b"]},
            {"distinct": ["a", "b"]},
            {"only_one_of": ["c", "d"]},
            {"mutually_required": ["e", "f"]},
            {"mutually_exclusive": ["a", "c"]},
        ]}}]});
        let checks = config_checks(&schema).unwrap();
        let failures =
            |c: Value| -> Vec<String> { checks.iter().filter_map(|k| k.failure(&c)).collect() };
        assert_eq!(
            failures(json!({"a": "x", "b": "x", "c": 1, "d": 2, "e": 1})),
            [
                "values of these fields must be distinct: 'a', 'b'",
                "exactly one of these fields must be non-empty: 'c', 'd'",
                "all or none of these fields must be set: 'e', 'f'",
                "only one or none of these fields must be set: 'a', 'c'",
            ]
        );
        assert_eq!(
            failures(json!({"c": 1})),
            ["at least one of these fields must be non-empty: 'a', 'b'"]
        );
        assert!(failures(json!({"a": "x", "b": "y", "d": 1, "e": 1, "f": 2})).is_empty());
    }

    #[test]
    fn a_schema_config_record_becomes_fields() {
        let schema = json!({"name": "x", "fields": [
            {"consumer": {"type": "foreign", "reference": "consumers", "eq": null}},
            {"protocols": {"type": "set", "elements": {"type": "string", "one_of": ["grpc", "grpcs", "http", "https"]}}},
            {"config": {"type": "record", "fields": [
                {"header": {"type": "string", "required": true, "default": "X-Hello"}},
                {"count": {"type": "integer", "between": [1, 10], "default": 2}},
                {"mode": {"type": "string", "one_of": ["a", "b"]}},
                {"list": {"type": "array", "elements": {"type": "string"}, "default": {}}},
                {"nested": {"type": "record", "fields": [{"on": {"type": "boolean", "default": true}}]}},
            ]}},
        ]});
        let (fields, http_only, allows_consumer) = config_fields(&schema).unwrap();
        assert!(http_only && !allows_consumer);
        let names: Vec<_> = fields.iter().map(|f| f.name).collect();
        assert_eq!(names, ["header", "count", "mode", "list", "nested"]);
        assert!(fields[0].required);
        assert!(matches!(fields[1].ty, Type::Integer { min: 1, max: 10 }));
        assert!(matches!(fields[2].ty, Type::OneOf(["a", "b"])));
        assert!(matches!(fields[3].default, Some(Default::EmptyArray)));
        assert!(matches!(
            fields[4].ty,
            Type::Record([Field { name: "on", .. }])
        ));
        let bad = json!({"fields": [{"config": {"type": "record", "fields": [{"f": {"type": "function"}}]}}]});
        assert_eq!(
            config_fields(&bad).unwrap_err(),
            "config.f: type 'function' is not supported yet"
        );
    }
}
