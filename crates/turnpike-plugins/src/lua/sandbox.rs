//! The environment the operator's Lua code runs in, by `untrusted_lua`: Kong's sandbox (a
//! whitelist of the standard library plus `kong` and `ngx`, the modules protected from
//! writes) or, with `on`, all of Lua.

use mlua::{Lua, Table};

use super::{Mode, Settings};

/// Builds the environment; Lua itself is the clearest place to say what goes in it.
pub(super) fn environment(
    lua: &Lua,
    settings: &Settings,
    kong: &Table,
    ngx: &Table,
) -> mlua::Result<Table> {
    let modules = super::pdk::modules(lua)?;
    let requires = lua.create_sequence_from(settings.requires.iter().map(String::as_str))?;
    let vars = lua.create_sequence_from(settings.environment.iter().map(String::as_str))?;
    let mode = match settings.mode {
        Mode::On => "on",
        Mode::Sandbox | Mode::Off => "sandbox",
    };
    lua.load(PRELUDE).set_name("=turnpike.sandbox").call((
        kong.clone(),
        ngx.clone(),
        mode,
        requires,
        vars,
        modules,
    ))
}

/// Kong's sandbox (`kong/tools/sandbox/environment/lua.lua` lists the same names): what a
/// chunk may call, copied out of `_G` so that changing it cannot reach the real libraries.
const PRELUDE: &str = r##"
local kong, ngx, mode, requires, vars, modules = ...

-- Modules the node provides (cjson), loadable by `require` where it is allowed.
for name, m in pairs(modules) do
  package.loaded[name] = m
end

-- print goes to the node's log, as in Kong (nginx's error log), not to stdout.
local log_notice = kong.log.notice
_G.print = function(...)
  local parts = {}
  for i = 1, select("#", ...) do parts[#parts + 1] = tostring((select(i, ...))) end
  log_notice(table.concat(parts, "\t"))
end

if mode == "on" then
  -- Everything, but a chunk's own globals stay its own.
  _G.kong = kong
  _G.ngx = ngx
  return _G
end

local whitelist = {
  _VERSION = true, assert = true, error = true, ipairs = true, next = true, pairs = true,
  pcall = true, print = true, select = true, tonumber = true, tostring = true, type = true,
  unpack = true, xpcall = true,
  bit = { "arshift", "band", "bnot", "bor", "bswap", "bxor", "lshift", "rol", "ror",
          "rshift", "tobit", "tohex" },
  coroutine = { "create", "resume", "running", "status", "wrap", "yield" },
  io = { "type" },
  jit = { "os", "arch", "version", "version_num" },
  math = { "abs", "acos", "asin", "atan", "atan2", "ceil", "cos", "cosh", "deg", "exp",
           "floor", "fmod", "frexp", "huge", "ldexp", "log", "log10", "max", "min", "modf",
           "pi", "pow", "rad", "random", "sin", "sinh", "sqrt", "tan", "tanh" },
  os = { "clock", "date", "difftime", "time" },
  string = { "byte", "char", "find", "format", "gmatch", "gsub", "len", "lower", "match",
             "rep", "reverse", "sub", "upper" },
  table = { "concat", "foreach", "foreachi", "getn", "insert", "maxn", "remove", "sort" },
}

local env = {}
for name, fields in pairs(whitelist) do
  if fields == true then
    env[name] = _G[name]
  elseif type(_G[name]) == "table" then
    local m = {}
    for _, f in ipairs(fields) do m[f] = _G[name][f] end
    env[name] = m
  end
end

-- untrusted_lua_sandbox_environment: globals linked in by dotted name ("os.getenv").
local function link(path, from, to)
  local head, rest = path:match("([^%.]+)%.?(.*)")
  if not head or from[head] == nil then return end
  if rest == "" then
    to[head] = from[head]
    return
  end
  if type(to[head]) ~= "table" then to[head] = {} end
  link(rest, from[head], to[head])
end
for _, v in ipairs(vars) do link(v, _G, env) end

local allowed = {}
for _, r in ipairs(requires) do allowed[r] = true end
env.require = function(name)
  if not allowed[name] then
    error(("require '%s' not allowed within sandbox"):format(tostring(name)), 2)
  end
  return require(name)
end

-- Modules are handed out as read-only proxies: __newindex alone would not stop a chunk from
-- replacing a field that exists, and every chunk shares these tables.
local function protect(t, name)
  for k, v in pairs(t) do
    -- Tables with their own __newindex (ngx.var, ngx.header, ngx.arg, kong.ctx) decide
    -- themselves what may be written.
    local mt = getmetatable(v)
    if type(v) == "table" and not (mt and mt.__newindex) then
      t[k] = protect(v, name .. "." .. k)
    end
  end
  local inner = getmetatable(t)
  return setmetatable({}, {
    __index = t,
    __newindex = function(_, k, v)
      -- ngx.status and ngx.ctx are per-request slots, not module fields.
      if name == "ngx" and (k == "status" or k == "ctx") then t[k] = v return end
      error(("Cannot modify %s.%s. Protected by the sandbox."):format(name, tostring(k)), 2)
    end,
    __call = inner and inner.__call and function(_, ...) return t(...) end or nil,
    __metatable = false,
  })
end
for name, m in pairs(env) do
  if type(m) == "table" then env[name] = protect(m, name) end
end
env.kong = protect(kong, "kong")
env.ngx = protect(ngx, "ngx")
env._G = env
return env
"##;
