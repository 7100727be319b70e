//! `kong.db.<entity>`: an operator's plugin reads its own entities (its `daos.lua`) from the
//! configuration the node runs, never from the database on the request's path: `select(pk)`,
//! `select_by_<unique field>(value)`, `page(size, offset)`, `each(size)` and `cache_key(...)`,
//! with Kong's shapes (an entity table, nil when there is none; a page and the next offset).
//! The rows are indexed once per configuration and plugin ([`Dao`]).
//!
//! Writes (`insert`, `update`, `update_by_<field>`, `delete`, `delete_by_<field>`) go to the
//! node's store as the bundled plugins' credential writes do (checked as an Admin API write,
//! on the worker's own connections), waiting without holding the worker: the entity written,
//! or `nil` and the error. The configuration the reads see has it once the change arrives.
//! On a DB-less node they answer Kong's "cannot create '<entity>' entities when not using a
//! database". `upsert` and Kong's own entities (`kong.db.services`, ...) are not there: a
//! call names itself in its error, but for `kong.db.consumers:select` and
//! `select_by_username`, read from the snapshot for a plugin whose code reads consumers.

use std::cell::RefCell;
use std::sync::Arc;

use mlua::{Lua, LuaSerdeExt, Table, Value};
use rustc_hash::FxHashMap;
use serde_json::Value as Json;
use turnpike_config::entity::PluginEntity;

/// One plugin's entities in one configuration, indexed, and where writes of them go.
pub struct Dao {
    tables: FxHashMap<&'static str, Rows>,
    store: Arc<crate::credentials::Store>,
    /// The snapshot's consumers, for `kong.client.load_consumer` (a plugin that calls it).
    consumers: Option<Arc<crate::build::ConsumerIndex>>,
    /// The snapshot's vaults, for `kong.vault.get`.
    vaults: Vec<turnpike_config::declarative::records::Record>,
}

struct Rows {
    /// Each entity as the Admin API shows it.
    rows: Vec<Json>,
    by_id: FxHashMap<String, usize>,
    /// By (unique field or endpoint key, value).
    by_field: FxHashMap<(&'static str, String), usize>,
    /// The fields `by_field` knows.
    keyed: Vec<&'static str>,
}

impl Dao {
    /// The rows of `entities` in `config`; writes go to `store`.
    pub fn new(
        config: &turnpike_config::Config,
        entities: &[&'static PluginEntity],
        store: Arc<crate::credentials::Store>,
    ) -> Dao {
        let mut tables: FxHashMap<&'static str, Rows> = entities
            .iter()
            .map(|e| {
                (
                    e.spec.table,
                    Rows {
                        rows: Vec::new(),
                        by_id: FxHashMap::default(),
                        by_field: FxHashMap::default(),
                        keyed: e
                            .spec
                            .unique
                            .iter()
                            .chain(e.spec.endpoint_key.iter())
                            .copied()
                            .collect(),
                    },
                )
            })
            .collect();
        for c in config.credentials.iter() {
            let Some(t) = tables.get_mut(c.table) else {
                continue;
            };
            let Ok(row) = serde_json::to_value(c) else {
                continue;
            };
            let i = t.rows.len();
            t.by_id.insert(c.id.clone(), i);
            for f in &t.keyed {
                if let Some(v) = row.get(*f).and_then(key_text) {
                    t.by_field.insert((f, v), i);
                }
            }
            t.rows.push(row);
        }
        let vaults = config
            .records
            .iter()
            .filter(|r| r.table() == "vaults")
            .cloned()
            .collect();
        Dao {
            tables,
            store,
            consumers: None,
            vaults,
        }
    }

    /// With the snapshot's consumers (`kong.client.load_consumer`).
    pub fn with_consumers(mut self, consumers: Arc<crate::build::ConsumerIndex>) -> Dao {
        self.consumers = Some(consumers);
        self
    }
}

/// Kong's `kong.vault.get(reference)`: the secret, resolved against the running plugin's view
/// of the snapshot's vaults. Only an operator's own plugin (whose code names `kong.vault`)
/// reads secrets: code in plugin configs (pre-function, ...) reaches the environment only
/// through `untrusted_lua_sandbox_environment`, and the vault must not open it wider.
pub(super) fn vault_get(reference: &str) -> Result<String, String> {
    CURRENT.with(|c| {
        let c = c.borrow();
        let Some(dao) = c.as_ref() else {
            return Err(
                "kong.vault.get is for an operator's own plugin: code in a plugin's config cannot read secrets"
                    .into(),
            );
        };
        turnpike_config::declarative::vault::resolve(
            reference,
            &dao.vaults,
            &turnpike_config::declarative::vault::process_env,
        )
    })
}

/// Kong's `kong.client.load_consumer(id, search_by_username)` over the running plugin's view
/// of the snapshot: `Err` when the plugin has none (its code was not seen to call it).
pub(super) fn load_consumer(
    key: &str,
    by_username: bool,
) -> Result<Option<Arc<crate::Identity>>, String> {
    CURRENT.with(|c| {
        let c = c.borrow();
        let index = c.as_ref().and_then(|d| d.consumers.as_ref()).ok_or(
            "kong.client.load_consumer: the snapshot's consumers are not loaded for this plugin",
        )?;
        Ok(index
            .get(key)
            .filter(|who| by_username || who.consumer_id() == key)
            .cloned())
    })
}

/// A write of a plugin's entity, as a coroutine yields it.
#[derive(Debug)]
pub struct DbWrite {
    table: &'static str,
    /// `insert`, `update` or `delete`.
    action: String,
    /// The entity's id or endpoint key (update, delete).
    key: String,
    entity: serde_json::Map<String, Json>,
    store: Arc<crate::credentials::Store>,
}

/// The write a `kong.db` call yields, for a table of the running plugin.
pub(super) fn write_of(t: &Table) -> Option<DbWrite> {
    let table: String = t.raw_get("table").ok()?;
    let (table, store) = CURRENT.with(|c| {
        let c = c.borrow();
        let dao = c.as_ref()?;
        let (name, _) = dao.tables.get_key_value(table.as_str())?;
        Some((*name, dao.store.clone()))
    })?;
    let entity = match t.raw_get::<Value>("entity") {
        Ok(v @ Value::Table(_)) => match serde_json::to_value(&v) {
            Ok(Json::Object(m)) => m,
            _ => serde_json::Map::new(),
        },
        _ => serde_json::Map::new(),
    };
    Some(DbWrite {
        table,
        action: t.raw_get("action").ok()?,
        key: t
            .raw_get::<Option<String>>("key")
            .ok()
            .flatten()
            .unwrap_or_default(),
        entity,
        store,
    })
}

impl DbWrite {
    pub async fn perform(self) -> Result<Option<serde_json::Map<String, Json>>, String> {
        use crate::credentials::Write;
        if !self.store.installed() {
            let verb = match self.action.as_str() {
                "insert" => "create",
                "update" => "update",
                _ => "remove",
            };
            return Err(format!(
                "[off] cannot {verb} '{}' entities when not using a database",
                self.table
            ));
        }
        let write = match self.action.as_str() {
            "insert" => Write::Insert {
                table: self.table,
                entity: self.entity,
            },
            "update" => Write::Update {
                table: self.table,
                id: self.key,
                patch: self.entity,
            },
            "delete" => Write::Delete {
                table: self.table,
                id: self.key,
            },
            other => return Err(format!("kong.db: unknown write '{other}'")),
        };
        self.store.write(write).await
    }
}

/// A write's result as the coroutine resumes with it: `{entity = ...}` or `{err = ...}`.
pub(super) fn written_value(
    lua: &Lua,
    done: Result<Option<serde_json::Map<String, Json>>, String>,
) -> mlua::Result<Value> {
    let t = lua.create_table()?;
    match done {
        Ok(Some(e)) => t.set("entity", lua.to_value(&Json::Object(e))?)?,
        Ok(None) => t.set("entity", true)?,
        Err(e) => t.set("err", e)?,
    }
    Ok(Value::Table(t))
}

/// A field's value as an index key: text, or a foreign key's id.
fn key_text(v: &Json) -> Option<String> {
    match v {
        Json::String(s) => Some(s.clone()),
        Json::Number(n) => Some(n.to_string()),
        Json::Object(o) => o.get("id").and_then(Json::as_str).map(str::to_string),
        _ => None,
    }
}

thread_local! {
    /// The entities of the plugin whose code runs now on this thread.
    static CURRENT: RefCell<Option<Arc<Dao>>> = const { RefCell::new(None) };
}

/// Makes `dao` the one `kong.db` reads until the guard drops.
pub(super) fn enter(dao: Option<&Arc<Dao>>) -> Option<Entered> {
    let dao = dao?;
    CURRENT.with(|c| *c.borrow_mut() = Some(dao.clone()));
    Some(Entered)
}

pub(super) struct Entered;

impl Drop for Entered {
    fn drop(&mut self) {
        CURRENT.with(|c| *c.borrow_mut() = None);
    }
}

fn row_value(lua: &Lua, row: &Json) -> mlua::Result<Value> {
    // JSON null as `ngx.null` (mlua's null), as Kong's entities carry it.
    lua.to_value(row)
}

/// `kong.db`, over the Rust reads.
pub(super) fn install(lua: &Lua, kong: &Table, op_key: &str) -> mlua::Result<()> {
    let query = lua.create_function(
        |lua, (table, op, a, b): (String, String, Value, Value)| -> mlua::Result<(Value, Value)> {
            CURRENT.with(|c| {
                let c = c.borrow();
                // Outside a plugin's call (a module loaded at start, `api.lua` reading
                // `kong.db.<entity>.schema`) any name has its DAO, which finds nothing.
                if c.is_none() && op == "known" {
                    return Ok((Value::Boolean(true), Value::Nil));
                }
                // Kong's consumers, for a plugin whose code reads them: by id or username.
                if table == "consumers" && (op == "select" || op == "select_by") {
                    let index = c.as_ref().and_then(|d| d.consumers.as_ref());
                    let Some(index) = index else {
                        return Err(mlua::Error::runtime(
                            "kong.db.consumers: the snapshot's consumers are not loaded for this plugin",
                        ));
                    };
                    let (field, key) = match op.as_str() {
                        "select" => ("id".to_string(), a),
                        _ => (a.to_string().unwrap_or_default(), b),
                    };
                    let key = match &key {
                        Value::String(s) => s.to_str()?.to_string(),
                        Value::Table(t) => t.get::<String>("id")?,
                        _ => return Ok((Value::Nil, Value::Nil)),
                    };
                    let found = index.get(&key).filter(|who| match field.as_str() {
                        "id" => who.consumer_id() == key,
                        "username" => who.username() == Some(key.as_str()),
                        _ => false,
                    });
                    return match found {
                        Some(who) => {
                            let t = lua.create_table()?;
                            t.set("id", who.consumer_id())?;
                            t.set("username", who.username())?;
                            t.set("custom_id", who.custom_id())?;
                            Ok((Value::Table(t), Value::Nil))
                        }
                        None => Ok((Value::Nil, Value::Nil)),
                    };
                }
                let Some(t) = c.as_ref().and_then(|d| d.tables.get(table.as_str())) else {
                    return Ok((Value::Nil, Value::Nil));
                };
                let text = |v: &Value| -> Option<String> {
                    match v {
                        Value::String(s) => s.to_str().ok().map(|s| s.to_string()),
                        Value::Integer(i) => Some(i.to_string()),
                        Value::Number(n) => Some(n.to_string()),
                        _ => None,
                    }
                };
                match op.as_str() {
                    "known" => Ok((Value::Boolean(true), Value::Nil)),
                    "select" => match text(&a).and_then(|id| t.by_id.get(&id)) {
                        Some(&i) => Ok((row_value(lua, &t.rows[i])?, Value::Nil)),
                        None => Ok((Value::Nil, Value::Nil)),
                    },
                    "select_by" => {
                        let field = text(&a).unwrap_or_default();
                        let found = t
                            .keyed
                            .iter()
                            .find(|f| **f == field)
                            .zip(text(&b))
                            .and_then(|(f, v)| t.by_field.get(&(*f, v)).copied());
                        match found {
                            Some(i) => Ok((row_value(lua, &t.rows[i])?, Value::Nil)),
                            None => Ok((Value::Nil, Value::Nil)),
                        }
                    }
                    "page" => {
                        let size = match a {
                            Value::Integer(n) if n > 0 => n.min(1000) as usize,
                            _ => 100,
                        };
                        let offset: usize = text(&b).and_then(|o| o.parse().ok()).unwrap_or(0);
                        let page = lua.create_table()?;
                        for (k, row) in t.rows.iter().skip(offset).take(size).enumerate() {
                            page.raw_set(k + 1, row_value(lua, row)?)?;
                        }
                        let next = offset + size;
                        let next = if next < t.rows.len() {
                            Value::String(lua.create_string(next.to_string())?)
                        } else {
                            Value::Nil
                        };
                        Ok((Value::Table(page), next))
                    }
                    other => Err(mlua::Error::runtime(format!(
                        "kong.db: unknown read '{other}'"
                    ))),
                }
            })
        },
    )?;
    let db: Table = lua.load(DB).set_name("=kong.db").call((query, op_key))?;
    kong.set("db", db)?;
    kong.set("vault", vault_table(lua)?)
}

/// `kong.vault`: `is_reference`, `parse_reference` and `get` (the `env` vault, and the vaults
/// entities of the snapshot for a plugin whose code reads them).
fn vault_table(lua: &Lua) -> mlua::Result<Table> {
    let vault = lua.create_table()?;
    vault.set(
        "is_reference",
        lua.create_function(|_, v: Value| {
            Ok(match &v {
                Value::String(s) => turnpike_config::schema::is_reference(&s.to_string_lossy()),
                _ => false,
            })
        })?,
    )?;
    vault.set(
        "parse_reference",
        lua.create_function(|lua, r: String| {
            let Some(inner) = r
                .strip_prefix("{vault://")
                .and_then(|x| x.strip_suffix('}'))
            else {
                let e = lua.create_string(format!("not a reference: {r}"))?;
                return Ok((Value::Nil, Value::String(e)));
            };
            let mut parts = inner.splitn(3, '/');
            let t = lua.create_table()?;
            t.set("name", parts.next().unwrap_or_default())?;
            t.set("resource", parts.next().unwrap_or_default())?;
            if let Some(k) = parts.next().filter(|k| !k.is_empty()) {
                t.set("key", k)?;
            }
            Ok((Value::Table(t), Value::Nil))
        })?,
    )?;
    vault.set(
        "get",
        lua.create_function(|lua, r: String| match vault_get(&r) {
            Ok(v) => Ok((Value::String(lua.create_string(v)?), Value::Nil)),
            Err(e) => Ok((Value::Nil, Value::String(lua.create_string(e)?))),
        })?,
    )?;
    Ok(vault)
}

/// The DAO objects, made on first use of each name: reads go to `query`; a name the running
/// plugin has no entity of is nil, as in Kong, unless it is one of Kong's own (whose DAO
/// exists there): those, and writes, fail naming the call.
const DB: &str = r#"
local query, OP_KEY = ...
local yield, isyieldable = coroutine.yield, coroutine.isyieldable
local core = { consumers = true, services = true, routes = true, plugins = true,
  upstreams = true, targets = true, certificates = true, snis = true, ca_certificates = true,
  keys = true, key_sets = true, vaults = true }
local function unsupported(name, m)
  return function() error("kong.db." .. name .. ":" .. m .. " is not implemented by Turnpike", 2) end
end
local function dao_for(name)
  local dao = { schema = { name = name } }
  function dao:select(pk)
    if type(pk) == "table" then pk = pk.id end
    return (query(name, "select", pk))
  end
  function dao:page(size, offset)
    local rows, nxt = query(name, "page", size, offset)
    return rows or {}, nil, nil, nxt
  end
  function dao:each(size)
    local rows, i, offset, done = {}, 0, nil, false
    return function()
      i = i + 1
      if rows[i] == nil and not done then
        local nxt
        rows, nxt = query(name, "page", size or 100, offset)
        rows = rows or {}
        i, offset, done = 1, nxt, nxt == nil
      end
      if rows[i] ~= nil then return rows[i] end
    end
  end
  function dao:cache_key(key, a2, a3, a4, a5)
    if type(key) == "table" then
      local v = key.id
      key = type(v) == "table" and v.id or v
    end
    local function s(v) if v == nil or v == ngx.null then return "" end return tostring(v) end
    return string.format("%s:%s:%s:%s:%s:%s:%s", name, s(key), s(a2), s(a3), s(a4), s(a5), "")
  end
  -- Writes wait for the store (a coroutine's yield, as resty.http's calls).
  local function write(action, key, entity)
    if not isyieldable() then
      return nil, "API disabled in the context of " .. (ngx.get_phase and ngx.get_phase() or "this")
    end
    if type(key) == "table" then key = key.id end
    local r = yield({ [OP_KEY] = "db", table = name, action = action,
      key = key ~= nil and tostring(key) or nil, entity = entity })
    if r == nil then return nil, "kong.db: no answer" end
    if r.err then return nil, r.err, { name = "database error", message = r.err } end
    return r.entity
  end
  function dao:insert(entity) return write("insert", nil, entity) end
  function dao:update(pk, entity) return write("update", pk, entity) end
  function dao:delete(pk)
    local ok, err, err_t = write("delete", pk)
    if not ok then return nil, err, err_t end
    return true
  end
  for _, m in ipairs({ "upsert", "truncate" }) do
    dao[m] = unsupported(name, m)
  end
  return setmetatable(dao, { __index = function(_, m)
    if type(m) == "string" and m:sub(1, 10) == "select_by_" then
      local field = m:sub(11)
      return function(_, value) return (query(name, "select_by", field, value)) end
    end
    if type(m) == "string" and m:match("^update_by_") then
      return function(self, value, entity) return self:update(value, entity) end
    end
    if type(m) == "string" and m:match("^delete_by_") then
      return function(self, value) return self:delete(value) end
    end
    if type(m) == "string" and m:match("^upsert_by_") then
      return unsupported(name, m)
    end
  end })
end
local cache = {}
return setmetatable({}, { __index = function(_, name)
  if cache[name] then return cache[name] end
  if query(name, "known") then
    cache[name] = dao_for(name)
    return cache[name]
  end
  if name == "consumers" then
    -- Reads by id and username, from the snapshot (a plugin whose code reads consumers).
    local consumers = {}
    function consumers:select(pk) return (query("consumers", "select", pk)) end
    function consumers:select_by_username(u) return (query("consumers", "select_by", "username", u)) end
    return setmetatable(consumers, { __index = function(_, m) return unsupported(name, m) end })
  end
  if core[name] then
    return setmetatable({}, { __index = function(_, m) return unsupported(name, m) end })
  end
  return nil
end })
"#;
