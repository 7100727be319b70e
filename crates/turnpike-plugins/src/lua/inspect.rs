//! Reading an operator's plugin at start (`crate::custom`): its handler's `PRIORITY`, `VERSION`
//! and phases, and its schema, in a Lua state of their own.

use mlua::{Function, Table, Value};

use super::{first_line, Phase, Runtime, Settings};

/// What a custom plugin's modules say of it, read once at start (`crate::custom`): its
/// handler's `PRIORITY`, `VERSION` and phase functions, and its schema table as JSON
/// (functions, such as custom validators, left out).
pub struct ModuleInfo {
    pub priority: Option<i64>,
    pub version: Option<String>,
    pub phases: Vec<Phase>,
    pub schema: serde_json::Value,
    /// Whether a module of the plugin's folder reads or replaces the request body (the proxy
    /// then reads it before the access phase, as for the serverless plugins).
    pub wants_body: bool,
    /// The handler has Kong's `configure(configs)`.
    pub configure: bool,
    /// Its `daos.lua` (the array of entity schemas) as JSON, when it has one.
    pub daos: Option<serde_json::Value>,
    /// The route patterns of its `api.lua`, when it has one.
    pub api: Vec<String>,
    /// A module of its folder calls `kong.client.load_consumer` (the snapshot's consumers
    /// are then indexed for it).
    pub loads_consumers: bool,
    /// A module of its folder reads `kong.vault` (the snapshot's vaults are then kept for it).
    pub reads_vaults: bool,
}

/// Kong's `kong.db.schema.typedefs` as far as a plugin's schema uses them: the field
/// definitions (type, default, bounds) a schema embeds.
const TYPEDEFS: &str = r##"
local t = {}
local http = { "grpc", "grpcs", "http", "https" }
local all = { "grpc", "grpcs", "http", "https", "tcp", "tls", "tls_passthrough", "udp", "ws", "wss" }
t.protocols = { type = "set", required = true, default = all, elements = { type = "string", one_of = all } }
t.protocols_http = { type = "set", required = true, default = http, elements = { type = "string", one_of = http } }
t.no_consumer = { type = "foreign", reference = "consumers", eq = ngx and ngx.null or nil }
t.no_route = { type = "foreign", reference = "routes", eq = ngx and ngx.null or nil }
t.no_service = { type = "foreign", reference = "services", eq = ngx and ngx.null or nil }
t.consumer = { type = "foreign", reference = "consumers" }
t.route = { type = "foreign", reference = "routes" }
t.service = { type = "foreign", reference = "services" }
t.host = { type = "string" }
t.port = { type = "integer", between = { 0, 65535 } }
t.path = { type = "string" }
t.url = { type = "string" }
t.timeout = { type = "integer", between = { 0, 2147483646 } }
t.header_name = { type = "string" }
t.http_method = { type = "string" }
t.ip = { type = "string" }
t.cidr = { type = "string" }
t.tags = { type = "set", elements = { type = "string" } }
t.name = { type = "string" }
t.uuid = { type = "string" }
t.auto_timestamp_s = { type = "integer", timestamp = true, auto = true }
t.auto_timestamp_ms = { type = "number", timestamp = true, auto = true }
t.utf8_name = { type = "string", unique = true }
t.semantic_version = { type = "string" }
t.sni = { type = "string" }
t.tag = { type = "string" }
t.jwk = { type = "record", fields = {} }
t.key = { type = "string" }
t.lua_code = { type = "map", keys = { type = "string" }, values = { type = "string" } }
-- A typedef called with overrides (`typedefs.host { required = true }`) gives a copy.
for name, def in pairs(t) do
  setmetatable(def, { __call = function(self, over)
    local copy = {}
    for k, v in pairs(self) do copy[k] = v end
    for k, v in pairs(over or {}) do copy[k] = v end
    return copy
  end })
end
return t
"##;

/// Loads `kong.plugins.<name>.handler` and `.schema` through `lua_package_path`, in a state of
/// their own (the PDK installed, as the worker's), and reads what the registry needs.
pub fn inspect_plugin(settings: &Settings, name: &str) -> Result<ModuleInfo, String> {
    use mlua::LuaSerdeExt;
    let rt = Runtime::new(settings).map_err(|e| format!("cannot start Lua: {e}"))?;
    let lua = &rt.lua;
    let run = || -> mlua::Result<ModuleInfo> {
        let package: Table = lua.globals().get("package")?;
        let preload: Table = package.get("preload")?;
        let typedefs = lua.load(TYPEDEFS).set_name("=kong.db.schema.typedefs");
        preload.set("kong.db.schema.typedefs", typedefs.into_function()?)?;
        let require: Function = lua.globals().get("require")?;
        let handler: Table = require.call(format!("kong.plugins.{name}.handler"))?;
        let schema: Table = require.call(format!("kong.plugins.{name}.schema"))?;
        let phases = Phase::HANDLER
            .into_iter()
            .filter(|p| matches!(handler.get::<Value>(p.name()), Ok(Value::Function(_))))
            .collect();
        // The plugin's folder, where `require` found its handler: its modules' text.
        let searchpath: Function = package.get("searchpath")?;
        let path: String = package.get("path")?;
        let found: Option<String> =
            searchpath.call((format!("kong.plugins.{name}.handler"), path.clone()))?;
        // The text of the modules of the plugin's folder, searched for what it calls.
        let texts: Vec<String> = found
            .as_deref()
            .and_then(|f| std::path::Path::new(f).parent())
            .and_then(|dir| std::fs::read_dir(dir).ok())
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "lua"))
            .filter_map(|e| std::fs::read_to_string(e.path()).ok())
            .collect();
        let wants_body = texts.iter().any(|text| super::reads_body(text));
        let loads_consumers = texts
            .iter()
            .any(|text| text.contains("load_consumer") || text.contains("consumers:select"));
        let reads_vaults = texts.iter().any(|text| text.contains("kong.vault"));
        let options = mlua::serde::DeserializeOptions::new()
            .deny_unsupported_types(false)
            .deny_recursive_tables(false);
        // Its entities, when the folder has a daos.lua (an error in it stops the start).
        let daos_found: Option<String> =
            searchpath.call((format!("kong.plugins.{name}.daos"), path.clone()))?;
        let daos = match daos_found {
            Some(_) => {
                let v: Value = require.call(format!("kong.plugins.{name}.daos"))?;
                Some(lua.from_value_with(v, options)?)
            }
            None => None,
        };
        // Its Admin API routes, when the folder has an api.lua.
        let api_found: Option<String> =
            searchpath.call((format!("kong.plugins.{name}.api"), path.clone()))?;
        let mut api = Vec::new();
        if api_found.is_some() {
            let routes: Table = require.call(format!("kong.plugins.{name}.api"))?;
            for pair in routes.pairs::<String, Value>() {
                let (pattern, _) = pair?;
                api.push(pattern);
            }
            api.sort();
        }
        Ok(ModuleInfo {
            priority: handler.get::<Option<i64>>("PRIORITY")?,
            version: handler.get::<Option<String>>("VERSION")?,
            phases,
            configure: matches!(handler.get::<Value>("configure"), Ok(Value::Function(_))),
            schema: lua.from_value_with(Value::Table(schema), options)?,
            wants_body,
            daos,
            api,
            loads_consumers,
            reads_vaults,
        })
    };
    run().map_err(|e| first_line(&e.to_string()).to_string())
}
