#!/usr/bin/env python3
"""Session cookies as Kong 3.9 makes them, for the session plugin's tests.

Runs lua-resty-session 4.0.5 (the version Kong 3.9 pins) and lua-resty-openssl, unchanged, in
LuaJIT 2.1 (the `lupa` package from PyPI), with ngx's few functions it calls stubbed, and fixed
session ids and clocks so that every cookie is reproducible. Writes what it made and what
the library answered when it opened them again to stdout; the committed copy is
crates/turnpike-plugins/src/session/testdata/kong-cookies.json.

    python3 -m venv /tmp/lupa && /tmp/lupa/bin/pip install lupa
    # the two libraries' lib/ folders merged into one (github.com/bungle/lua-resty-session
    # at v4.0.5, github.com/fffonion/lua-resty-openssl)
    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libcrypto.so.3 /tmp/lupa/bin/python \
        scripts/kong-session-vectors.py <lib> > crates/turnpike-plugins/src/session/testdata/kong-cookies.json
"""
import base64, json, os, sys
from lupa import luajit21
L = luajit21.LuaRuntime(unpack_returned_tuples=True, encoding=None)
def B(v):
    if isinstance(v, str): return v.encode()
    if isinstance(v, dict): return L.table_from({B(k): B(x) for k, x in v.items()})
    if isinstance(v, list): return L.table_from([B(x) for x in v])
    return v
def S(v):
    return v.decode() if isinstance(v, bytes) else v
lib = sys.argv[1]
L.execute(f'package.path = "{lib}/?.lua;" .. package.path')
g = L.globals()
g.py_b64u_enc = lambda s: base64.urlsafe_b64encode(bytes(s)).rstrip(b"=")
def dec(s):
    s = bytes(s)
    try:
        return base64.urlsafe_b64decode(s + b"=" * (-len(s) % 4))
    except Exception:
        return None
g.py_b64u_dec = dec
L.execute(r'''
package.preload["table.isempty"] = function() return function(t) return next(t) == nil end end
package.preload["ngx.base64"] = function()
  return { encode_base64url = function(s) return py_b64u_enc(s) end,
           decode_base64url = function(s) local r = py_b64u_dec(s); if r == nil then return nil, "invalid" end; return r end }
end
-- A JSON encoder as cjson writes the session's arrays (strings, numbers, arrays, objects).
local function esc(s)
  return '"' .. s:gsub('[%c"\\/]', function(c)
    local m = {['"']='\\"', ['\\']='\\\\', ['/']='\\/', ['\n']='\\n', ['\r']='\\r', ['\t']='\\t'}
    return m[c] or string.format('\\u%04x', c:byte())
  end) .. '"'
end
local function enc(v)
  local t = type(v)
  if t == "string" then return esc(v)
  elseif t == "number" then return string.format("%.14g", v)
  elseif t == "boolean" then return tostring(v)
  elseif t == "table" then
    local n = #v
    if n > 0 or next(v) == nil then
      local out = {}
      for i = 1, n do out[i] = enc(v[i]) end
      return "[" .. table.concat(out, ",") .. "]"
    end
    local out = {}
    for k, x in pairs(v) do out[#out + 1] = esc(tostring(k)) .. ":" .. enc(x) end
    table.sort(out)
    return "{" .. table.concat(out, ",") .. "}"
  end
  return "null"
end
-- A decoder: the session's JSON is arrays of strings (and objects).
local function dec(s)
  local i = 1
  local function ws() i = s:find("[^ \t\r\n]", i) or #s + 1 end
  local val
  local function str()
    local out = {}
    i = i + 1
    while true do
      local c = s:sub(i, i)
      if c == '"' then i = i + 1; return table.concat(out) end
      if c == "\\" then
        local n = s:sub(i + 1, i + 1)
        local m = {n = "\n", r = "\r", t = "\t", ['"'] = '"', ["\\"] = "\\", ["/"] = "/"}
        if n == "u" then out[#out + 1] = string.char(tonumber(s:sub(i + 2, i + 5), 16)); i = i + 6
        else out[#out + 1] = m[n]; i = i + 2 end
      else out[#out + 1] = c; i = i + 1 end
    end
  end
  val = function()
    ws()
    local c = s:sub(i, i)
    if c == "[" then
      local a = {}
      i = i + 1; ws()
      if s:sub(i, i) == "]" then i = i + 1; return a end
      while true do
        a[#a + 1] = val(); ws()
        local d = s:sub(i, i); i = i + 1
        if d == "]" then return a end
      end
    elseif c == "{" then
      local o = {}
      i = i + 1; ws()
      if s:sub(i, i) == "}" then i = i + 1; return o end
      while true do
        ws(); local k = str(); ws(); i = i + 1
        o[k] = val(); ws()
        local d = s:sub(i, i); i = i + 1
        if d == "}" then return o end
      end
    elseif c == '"' then return str()
    else
      local num = s:match("^-?[%d.eE+-]+", i)
      if num then i = i + #num; return tonumber(num) end
      for lit, v in pairs({["true"] = true, ["false"] = false, ["null"] = nil}) do
        if s:sub(i, i + #lit - 1) == lit then i = i + #lit; return v end
      end
      error("bad json at " .. i)
    end
  end
  return val()
end
package.preload["cjson.safe"] = function()
  local m = {}
  m.new = function() return m end
  m.encode = function(v) return enc(v) end
  m.decode = function(s) local ok, r = pcall(dec, s); if ok then return r end; return nil, r end
  return m
end
NOW = 1700000000
ngx = {
  var = {}, header = {}, ctx = {},
  time = function() return NOW end, now = function() return NOW end,
  update_time = function() end,
  log = function(...) end, WARN = 1, NOTICE = 2, ERR = 3, DEBUG = 4, INFO = 5,
  config = { subsystem = "http", ngx_lua_version = 10026 },
  get_phase = function() return "access" end,
  http_time = function(t) return os.date("!%a, %d %b %Y %H:%M:%S GMT", t) end,
  re = {},
  req = { clear_header = function() end, set_header = function() end },
  null = setmetatable({}, {__tostring = function() return "null" end}),
}
''')
# Fixed session ids so that the cookies are reproducible: rand_bytes is replaced by one that
# returns the next id queued.
L.execute(r'''
local rand = require "resty.openssl.rand"
QUEUE = {}
rand.bytes = function(n) local v = table.remove(QUEUE, 1); assert(#v == n, "queued id of the wrong size"); return v end
session = require "resty.session"
''')
cases = []
def header():
    c = g.ngx.header[b"Set-Cookie"]
    if c is None or isinstance(c, bytes):
        return S(c)
    return [S(c[i]) for i in range(1, len(c) + 1)]
def sid(n):
    return bytes(range(n, n + 32))
def make(name, conf, consumer, credential, subject, now, sid_bytes, groups=None):
    L.execute(f"NOW = {now}; for k in pairs(ngx.header) do ngx.header[k] = nil end")
    g.QUEUE[1] = sid_bytes
    lconf = B(conf)
    s = g.session.new(lconf)
    data = L.table_from([B(consumer), B(credential)] + ([B(groups)] if groups else []))
    s.set_data(s, data)
    s.set_subject(s, B(subject))
    r = s.save(s)
    assert r is True or r[0], r
    cookie = header()
    cases.append({"name": name, "config": conf, "now": now, "sid": base64.b64encode(sid_bytes).decode(),
                  "consumer": consumer, "credential": credential, "subject": subject,
                  "groups": groups, "set_cookie": cookie})
base = {"secret": "kong-session-secret", "audience": "default", "cookie_name": "session",
        "cookie_path": "/", "cookie_same_site": "Strict", "cookie_http_only": True,
        "cookie_secure": True, "idling_timeout": 900, "rolling_timeout": 3600,
        "absolute_timeout": 86400}
make("default", base, "8a2e8e4d-3b1f-4a5e-9c3d-0f1e2d3c4b5a", "1c2d3e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f", "alice", 1700000000, sid(1))
make("audience and groups", dict(base, audience="portal", cookie_name="portal_session", cookie_same_site="Lax", cookie_secure=False),
     "8a2e8e4d-3b1f-4a5e-9c3d-0f1e2d3c4b5a", "1c2d3e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f", "alice", 1700000100, sid(2), ["admins", "users"])
# Opening a cookie again later, after touch_threshold: the touched header (idling offset).
def reopen(case, now, remember=False):
    L.execute(f"NOW = {now}; for k in pairs(ngx.header) do ngx.header[k] = nil end")
    c = case["set_cookie"] if isinstance(case["set_cookie"], str) else case["set_cookie"][0]
    name, value = c.split(";")[0].split("=", 1)
    g.ngx.var[("cookie_" + name).encode()] = value.encode()
    s, err, exists = g.session.open(B(case["config"]))
    g.ngx.var[("cookie_" + name).encode()] = None
    if not exists:
        return {"now": now, "open": False, "error": S(err)}
    r = s.refresh(s)
    assert r is True or r[0], r
    d = s.get_data(s)
    return {"now": now, "open": True, "data": [S(d[1]), S(d[2])], "set_cookie": header()}
L.execute(r'''
STORED = {}
KONG_STORAGE = {
  set = function(self, name, key, value, ttl, now, old_key, stale_ttl) STORED[key] = {value = value, ttl = ttl, old_key = old_key, stale_ttl = stale_ttl}; return true end,
  get = function(self, name, key) return STORED[key] and STORED[key].value end,
  delete = function(self, name, key) STORED[key] = nil; return true end,
}
''')
def make_stored(name, conf, now, sid_bytes):
    conf2 = B(conf)
    conf2[b"storage"] = g.KONG_STORAGE
    L.execute(f"NOW = {now}; for k in pairs(ngx.header) do ngx.header[k] = nil end")
    g.QUEUE[1] = sid_bytes
    s = g.session.new(conf2)
    s.set_data(s, L.table_from([B("8a2e8e4d-3b1f-4a5e-9c3d-0f1e2d3c4b5a"), B("1c2d3e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f")]))
    s.set_subject(s, B("alice"))
    r = s.save(s)
    assert r is True or r[0], r
    stored = {S(k): {"value": S(v.value), "ttl": v.ttl} for k, v in g.STORED.items()}
    cases.append({"name": name, "config": dict(conf, storage="kong"), "now": now, "sid": base64.b64encode(sid_bytes).decode(),
                  "consumer": "8a2e8e4d-3b1f-4a5e-9c3d-0f1e2d3c4b5a", "credential": "1c2d3e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f",
                  "subject": "alice", "groups": None, "set_cookie": header(), "stored": stored})
make_stored("kong storage", base, 1700000200, sid(6))
no_idle = dict(base, idling_timeout=0)
make("no idling timeout", no_idle, "8a2e8e4d-3b1f-4a5e-9c3d-0f1e2d3c4b5a", "1c2d3e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f", "alice", 1700000000, sid(4))
remember = dict(base, remember=True, remember_cookie_name="remember", remember_rolling_timeout=604800, remember_absolute_timeout=2592000)
L.execute("QUEUE = {}")
g.QUEUE[1] = sid(7)
g.QUEUE[2] = sid(8)
make("remember", remember, "8a2e8e4d-3b1f-4a5e-9c3d-0f1e2d3c4b5a", "1c2d3e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f", "alice", 1700000000, sid(7))
L.execute("QUEUE = {}")
# Past lua-resty-session's compression_threshold (1024 bytes of JSON; Kong keeps the default):
# the data deflated (raw deflate, the FLAG_DEFLATE bit), in one cookie, then over 4 KiB,
# split into `session`, `session2`, ...
import hashlib
make("deflated", base, "8a2e8e4d-3b1f-4a5e-9c3d-0f1e2d3c4b5a", "1c2d3e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f", "alice", 1700000300, sid(9),
     [f"group-{i}" for i in range(120)])
make("deflated and chunked", base, "8a2e8e4d-3b1f-4a5e-9c3d-0f1e2d3c4b5a", "1c2d3e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f", "alice", 1700000400, sid(10),
     [hashlib.sha256(str(i).encode()).hexdigest() for i in range(160)])
out = {"source": "lua-resty-session 4.0.5 (Kong 3.9's), run in LuaJIT 2.1 by scripts/kong-session-vectors.py",
       "cases": cases,
       "touched": reopen(cases[0], 1700000000 + 120),
       "rolled": None,
       "idle": reopen(cases[0], 1700000000 + 901),
       "absolute": None}
g.QUEUE[1] = sid(3)
out["rolled"] = reopen(cases[3], 1700000000 + 2701 + 1)
out["not_rolled"] = reopen(cases[3], 1700000000 + 2700)
out["absolute"] = reopen(cases[3], 1700000000 + 86401)
out["other_audience"] = reopen(dict(cases[0], config=dict(base, audience="other")), 1700000010)
out["other_secret"] = reopen(dict(cases[0], config=dict(base, secret="another")), 1700000010)
print(json.dumps(out, indent=1))
