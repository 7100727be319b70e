//! `kong.cache`, the node's cache as Kong's PDK gives it to plugins (`kong/cache/init.lua`
//! over lua-resty-mlcache): `get(key, opts, cb, ...)` runs `cb` on a miss and keeps what it
//! returns (a `nil` as a miss, for `neg_ttl`), `probe`, `invalidate`, `invalidate_local`,
//! `safe_set`, `renew` and `purge`, with Kong's argument checks and error messages.
//!
//! Each worker thread keeps the values in its Lua state (as mlcache's L1 does: tables are
//! handed out by reference, no copy per hit), bounded. An invalidation reaches every worker:
//! it counts up the node's cache generation (`Settings::cache_generation`), and a worker whose
//! state saw an older one drops what it holds before it next runs Lua (`with_runtime`: one
//! atomic load, no call into the cache per read). What is not here:
//! mlcache's L2 (values shared between workers: each worker runs the callback once per key),
//! `get_bulk`, which raises an error naming it, and `invalidate` reaching other nodes of a
//! database cluster (it reaches this node's workers).

/// The module: a function of the node's defaults (`db_cache_ttl`, `db_cache_neg_ttl`, in
/// seconds, 0 for none) and of the function that moves the node's generation on, returning
/// the `kong.cache` table and the function that empties this state's part.
pub(super) const CACHE: &str = r##"
local default_ttl, default_neg_ttl, next_generation = ...
local ngx = ngx
local type, error, select, pcall = type, error, select, pcall
local NOW = ngx.now
local MAX_ENTRIES = 100000

local values, expires, count = {}, {}, 0
local NIL = {}

-- Called by the runtime when the node's generation moved (another worker invalidated).
local function flush()
  values, expires, count = {}, {}, 0
end

local function bump()
  next_generation()
end

local function check_opts(opts)
  if opts == nil then return end
  if type(opts) ~= "table" then error("opts must be a table", 3) end
  if opts.ttl ~= nil and type(opts.ttl) ~= "number" then error("opts.ttl must be a number", 3) end
  if opts.neg_ttl ~= nil and type(opts.neg_ttl) ~= "number" then
    error("opts.neg_ttl must be a number", 3)
  end
end

local function store(key, value, ttl)
  if values[key] == nil then
    count = count + 1
    if count > MAX_ENTRIES then
      values, expires, count = {}, {}, 1
    end
  end
  if value == nil then value = NIL end
  values[key] = value
  expires[key] = ttl > 0 and NOW() + ttl or false
end

-- The live entry: value (NIL for a cached miss) and its remaining ttl (0: none).
local function lookup(key)
  local v = values[key]
  if v == nil then return nil end
  local exp = expires[key]
  if exp then
    local left = exp - NOW()
    if left <= 0 then
      values[key], expires[key] = nil, nil
      count = count - 1
      return nil
    end
    return v, left
  end
  return v, 0
end

local cache = {}

local function run(self, key, opts, cb, ...)
  if type(cb) ~= "function" then error("callback must be a function", 3) end
  local ok, v, err = pcall(cb, ...)
  if not ok then
    return nil, "callback threw an error: " .. tostring(v)
  end
  if v == nil and err ~= nil then
    return nil, err
  end
  local ttl = opts and opts.ttl or default_ttl
  if v == nil then
    ttl = opts and opts.neg_ttl or default_neg_ttl
  end
  store(key, v, ttl)
  return v, nil, 3
end

function cache:get(key, opts, cb, ...)
  if type(key) ~= "string" then error("key must be a string", 2) end
  check_opts(opts)
  local v = lookup(key)
  if v ~= nil then
    if v == NIL then return nil, nil, 1 end
    return v, nil, 1
  end
  local value, err, lvl = run(self, key, opts, cb, ...)
  if err then
    return nil, "failed to get from node cache: " .. err
  end
  return value, nil, lvl
end

function cache:renew(key, opts, cb, ...)
  if type(key) ~= "string" then error("key must be a string", 2) end
  check_opts(opts)
  local value, err = run(self, key, opts, cb, ...)
  if err then
    return nil, "failed to renew key in node cache: " .. err
  end
  local _, ttl = lookup(key)
  return value, nil, ttl
end

function cache:probe(key)
  if type(key) ~= "string" then error("key must be a string", 2) end
  local v, ttl = lookup(key)
  if v == nil then return nil end
  if v == NIL then v = nil end
  return ttl, nil, v
end

function cache:safe_set(key, value)
  if type(key) ~= "string" then error("key must be a string", 2) end
  store(key, value, default_ttl)
  return true
end

-- The node's workers all drop the key (mlcache broadcasts its deletes to them).
function cache:invalidate_local(key)
  if type(key) ~= "string" then error("key must be a string", 2) end
  if values[key] ~= nil then
    values[key], expires[key] = nil, nil
    count = count - 1
  end
  bump()
end

-- Kong broadcasts this one to the cluster's other nodes too; here it reaches this node's.
function cache:invalidate(key)
  if type(key) ~= "string" then error("key must be a string", 2) end
  self:invalidate_local(key)
end

function cache:purge()
  values, expires, count = {}, {}, 0
  bump()
end

function cache:get_bulk()
  error("kong.cache:get_bulk is not implemented by Turnpike", 2)
end

return cache, flush
"##;
