//! Lua code that waits, as OpenResty's cosockets let Kong plugins wait: an operator's plugin
//! runs its rewrite and access phases in a coroutine, and what would block (an HTTP call with
//! `resty.http`, `ngx.sleep`) yields an operation to the runner instead. The runner hands the
//! operation to the proxy as the plugin's wait (`Access::Wait`), which performs it without
//! holding the worker, then resumes the coroutine with the result, the request in reach again.
//!
//! Where a phase cannot wait (header_filter, body_filter, log, or sandboxed serverless code),
//! the same calls answer `nil` and OpenResty's message, "API disabled in the context of ...".
//!
//! `resty.http` here is Turnpike's own module with lua-resty-http's interface: `new`,
//! `set_timeout`, `set_timeouts`, `request_uri`, and `connect` + `request` + `read_body`,
//! `set_keepalive`, `close`; a response's `status`, `reason`, `headers` (any case) and `body`.
//! Requests go over HTTP/1.1, HTTPS verified against the system's roots unless `ssl_verify`
//! is false.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use mlua::{Lua, Table, Thread, Value};

/// The key that marks a table a coroutine yields as an operation for the runner.
pub(super) const OP_KEY: &str = "__turnpike_op";

/// What a yielding coroutine asked for.
#[derive(Debug)]
pub enum Op {
    Sleep(Duration),
    Http(HttpCall),
    /// A cosocket's call (`ngx.socket.tcp`).
    Tcp(super::cosocket::TcpOp),
    /// A write of a plugin's entity (`kong.db.<entity>:insert`, ...).
    Db(super::db::DbWrite),
}

#[derive(Debug)]
pub struct HttpCall {
    pub method: String,
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub body: Option<Vec<u8>>,
    pub timeout: Duration,
    pub ssl_verify: bool,
}

/// What the operation gave, handed back to the coroutine.
pub enum Done {
    Nothing,
    Http(Result<HttpResponse, String>),
    Tcp(super::cosocket::TcpDone),
    Db(Result<Option<serde_json::Map<String, serde_json::Value>>, String>),
}

pub struct HttpResponse {
    pub status: u16,
    pub reason: String,
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
}

impl Op {
    /// Performs the operation.
    pub async fn perform(self) -> Done {
        match self {
            Op::Sleep(d) => {
                tokio::time::sleep(d).await;
                Done::Nothing
            }
            Op::Tcp(op) => Done::Tcp(op.perform().await),
            Op::Db(w) => Done::Db(w.perform().await),
            Op::Http(call) => {
                let timeout = call.timeout;
                Done::Http(
                    tokio::time::timeout(timeout, http_call(call))
                        .await
                        .unwrap_or_else(|_| Err("timeout".into())),
                )
            }
        }
    }
}

/// An operation from the table a coroutine yielded.
pub(super) fn op_of(v: &Value) -> Option<Op> {
    let Value::Table(t) = v else { return None };
    let kind: String = t.raw_get(OP_KEY).ok()?;
    match kind.as_str() {
        "tcp" => super::cosocket::op_of(t).map(Op::Tcp),
        "db" => super::db::write_of(t).map(Op::Db),
        "sleep" => {
            let s: f64 = t.raw_get("seconds").unwrap_or(0.0);
            Some(Op::Sleep(Duration::from_secs_f64(s.clamp(0.0, 86400.0))))
        }
        "http" => {
            let headers: Vec<(String, String)> = match t.raw_get::<Value>("headers") {
                Ok(Value::Table(h)) => h
                    .pairs::<String, Value>()
                    .flatten()
                    .flat_map(|(k, v)| match v {
                        Value::Table(list) => list
                            .sequence_values::<String>()
                            .flatten()
                            .map(|s| (k.clone(), s))
                            .collect::<Vec<_>>(),
                        other => other
                            .to_string()
                            .ok()
                            .map(|s| vec![(k.clone(), s)])
                            .unwrap_or_default(),
                    })
                    .collect(),
                _ => Vec::new(),
            };
            let body = match t.raw_get::<Value>("body") {
                Ok(Value::String(s)) => Some(s.as_bytes().to_vec()),
                _ => None,
            };
            let ms: f64 = t.raw_get("timeout").unwrap_or(60000.0);
            Some(Op::Http(HttpCall {
                method: t.raw_get("method").unwrap_or_else(|_| "GET".into()),
                url: t.raw_get("url").unwrap_or_default(),
                headers,
                body,
                timeout: Duration::from_millis(ms.clamp(1.0, 3_600_000.0) as u64),
                ssl_verify: t.raw_get::<Option<bool>>("ssl_verify").ok().flatten() != Some(false),
            }))
        }
        _ => None,
    }
}

/// The operation's result as the value the coroutine resumes with.
pub(super) fn result_value(lua: &Lua, done: Done) -> mlua::Result<Value> {
    match done {
        Done::Nothing => Ok(Value::Nil),
        Done::Tcp(d) => super::cosocket::done_value(lua, d),
        Done::Db(d) => super::db::written_value(lua, d),
        Done::Http(Err(e)) => {
            let t = lua.create_table()?;
            t.set("err", e)?;
            Ok(Value::Table(t))
        }
        Done::Http(Ok(r)) => {
            let t = lua.create_table()?;
            t.set("status", r.status)?;
            t.set("reason", r.reason)?;
            let headers = lua.create_table()?;
            for (k, v) in r.headers {
                let k = k.to_ascii_lowercase();
                match headers.raw_get::<Value>(k.as_str())? {
                    Value::Nil => headers.raw_set(k, v)?,
                    Value::Table(list) => list.raw_push(v)?,
                    Value::String(first) => {
                        let list = lua.create_sequence_from([first.to_str()?.to_string(), v])?;
                        headers.raw_set(k, list)?;
                    }
                    _ => {}
                }
            }
            t.set("headers", headers)?;
            t.set("body", lua.create_string(&r.body)?)?;
            Ok(Value::Table(t))
        }
    }
}

/// How a coroutine's run ended.
pub(super) enum Driven {
    Done(mlua::Result<()>),
    Yielded(Thread, Op),
}

/// Resumes `thread` with `arg` until it ends or yields an operation; a finished thread goes
/// back to `pool` for the next call.
pub(super) fn drive(pool: &mut Vec<Thread>, thread: Thread, arg: Value) -> Driven {
    match thread.resume::<mlua::MultiValue>(arg) {
        Ok(values) if thread.is_resumable() => match values.front().and_then(op_of) {
            Some(op) => Driven::Yielded(thread, op),
            None => Driven::Done(Err(mlua::Error::runtime(
                "attempt to yield from outside a coroutine",
            ))),
        },
        Ok(_) => {
            if pool.len() < 16 {
                pool.push(thread);
            }
            Driven::Done(Ok(()))
        }
        Err(e) => Driven::Done(Err(e)),
    }
}

/// A coroutine running `f`: a pooled finished one reset to it, or a new one.
pub(super) fn thread_for(
    lua: &Lua,
    pool: &mut Vec<Thread>,
    f: mlua::Function,
) -> mlua::Result<Thread> {
    while let Some(t) = pool.pop() {
        if t.reset(f.clone()).is_ok() {
            return Ok(t);
        }
    }
    lua.create_thread(f)
}

/// `resty.http` and `ngx.sleep`, in Lua over the yield above.
pub(super) const MODULES: &str = r##"
local OP_KEY, ngx, start_timer = ...
local yield, isyieldable = coroutine.yield, coroutine.isyieldable
local setmetatable, type, tostring, pairs = setmetatable, type, tostring, pairs

local function disabled()
  local phase = ngx and ngx.get_phase and ngx.get_phase() or "this"
  return "API disabled in the context of " .. phase
end

local function wait(op)
  if not isyieldable() then return nil, disabled() end
  op[OP_KEY] = op[OP_KEY] or "http"
  return yield(op)
end

-- ngx.timer.at / ngx.timer.every: the callback runs later on this worker, in a coroutine of
-- its own (it may wait: resty.http, ngx.sleep), as premature = false; no request is in reach.
local pack, unpack = table.pack or function(...) return { n = select("#", ...), ... } end, unpack
ngx.timer = ngx.timer or {}
ngx.timer.at = function(delay, callback, ...)
  if type(delay) ~= "number" or delay < 0 then error("bad argument #1 to 'at' (delay must be a non-negative number)", 2) end
  if type(callback) ~= "function" then error("bad argument #2 to 'at' (function expected)", 2) end
  local args = pack(...)
  return start_timer(delay, function() return callback(false, unpack(args, 1, args.n)) end, false)
end
ngx.timer.every = function(delay, callback, ...)
  if type(delay) ~= "number" or delay <= 0 then error("bad argument #1 to 'every' (delay must be a positive number)", 2) end
  if type(callback) ~= "function" then error("bad argument #2 to 'every' (function expected)", 2) end
  local args = pack(...)
  return start_timer(delay, function() return callback(false, unpack(args, 1, args.n)) end, true)
end
ngx.timer.running_count = function() return 0 end
ngx.timer.pending_count = function() return 0 end
ngx.worker = ngx.worker or {}
ngx.worker.exiting = ngx.worker.exiting or function() return false end

ngx.sleep = function(seconds)
  if not isyieldable() then error(disabled(), 2) end
  yield({ [OP_KEY] = "sleep", seconds = tonumber(seconds) or 0 })
  return 1
end

-- Headers read in any case, as lua-resty-http's.
local headers_mt = {
  __index = function(t, k)
    if type(k) == "string" then
      local lower = k:lower()
      if lower ~= k then return rawget(t, lower) end
    end
  end,
}

local function query_string(q)
  if type(q) == "string" then return q end
  if type(q) ~= "table" then return nil end
  return ngx.encode_args(q)
end

local http = { _VERSION = "0.17.1-turnpike" }
local client = {}
client.__index = client

function http.new()
  return setmetatable({ timeout = 60000 }, client)
end

function client:set_timeout(ms)
  self.timeout = tonumber(ms) or self.timeout
end

function client:set_timeouts(connect, send, read)
  self.timeout = (tonumber(connect) or 0) + (tonumber(send) or 0) + (tonumber(read) or 0)
end

local function call(self, url, params)
  params = params or {}
  local q = query_string(params.query)
  if q and q ~= "" then
    url = url .. (url:find("?", 1, true) and "&" or "?") .. q
  end
  local res = wait({
    [OP_KEY] = "http",
    url = url,
    method = params.method or "GET",
    headers = params.headers,
    body = params.body,
    timeout = self.timeout,
    ssl_verify = params.ssl_verify,
  })
  if res == nil then return nil, disabled() end
  if res.err then return nil, res.err end
  setmetatable(res.headers, headers_mt)
  res.has_body = true
  return res
end

function client:request_uri(uri, params)
  return call(self, uri, params)
end

function client:connect(options, port)
  if type(options) == "table" then
    self.scheme = options.scheme or "http"
    self.host = options.host
    self.port = options.port
    self.ssl_verify = options.ssl_verify
  else
    self.scheme = "http"
    self.host = options
    self.port = port
  end
  if not self.host then return nil, "no host" end
  return 1
end

function client:ssl_handshake(_, _, verify)
  self.scheme = "https"
  self.ssl_verify = verify
  return true
end

function client:request(params)
  if not self.host then return nil, "not connected" end
  params = params or {}
  local port = self.port and (":" .. tostring(self.port)) or ""
  local url = self.scheme .. "://" .. self.host .. port .. (params.path or "/")
  if params.ssl_verify == nil then params.ssl_verify = self.ssl_verify end
  local res, err = call(self, url, params)
  if not res then return nil, err end
  local body = res.body
  res.read_body = function() return body end
  res.body_reader = function()
    local b = body
    body = nil
    return b
  end
  return res
end

function client:set_keepalive() return 1 end
function client:close() return 1 end

return http
"##;

/// Installs `ngx.sleep`, `ngx.timer` and `resty.http` (in `package.loaded`) in a new state.
pub(super) fn install_on(lua: &Lua, ngx: &Table) -> mlua::Result<()> {
    let start_timer = lua.create_function(
        |lua,
         (delay, f, every): (f64, mlua::Function, bool)|
         -> mlua::Result<(bool, Option<String>)> {
            match start_timer(lua, delay, f, every) {
                Ok(()) => Ok((true, None)),
                Err(e) => Ok((false, Some(e))),
            }
        },
    )?;
    let http: Table =
        lua.load(MODULES)
            .set_name("=resty.http")
            .call((OP_KEY, ngx.clone(), start_timer))?;
    let loaded: Table = lua.globals().get::<Table>("package")?.get("loaded")?;
    loaded.set("resty.http", http)?;
    Ok(())
}

/// Most timers a worker keeps pending at once (nginx's `lua_max_pending_timers` default).
const MAX_PENDING_TIMERS: usize = 1024;

thread_local! {
    static PENDING_TIMERS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Runs `f` after `delay` seconds (then every `delay` seconds when `every`) on this worker, as
/// a task of its own: each run in a coroutine, its waits performed as they come.
fn start_timer(lua: &Lua, delay: f64, f: mlua::Function, every: bool) -> Result<(), String> {
    if PENDING_TIMERS.get() >= MAX_PENDING_TIMERS {
        return Err("too many pending timers".into());
    }
    // Timers need the worker's task set; outside one (a tool, a unit test) there is none.
    if tokio::runtime::Handle::try_current().is_err() {
        return Err("no timer support outside a worker".into());
    }
    let weak = lua.weak();
    let plugin = super::CURRENT.with(|c| c.borrow().plugin);
    let delay = std::time::Duration::from_secs_f64(delay.clamp(0.0, 365.0 * 86400.0));
    PENDING_TIMERS.set(PENDING_TIMERS.get() + 1);
    let task = async move {
        loop {
            tokio::time::sleep(delay).await;
            let Some(lua) = weak.try_upgrade() else { break };
            let thread = match lua.create_thread(f.clone()) {
                Ok(t) => t,
                Err(e) => {
                    tracing::error!("timer: {e}");
                    break;
                }
            };
            let mut arg = Value::Nil;
            let mut pool = Vec::new();
            loop {
                // No request: the PDK's request functions say so; logs name the plugin.
                let guard = super::enter(
                    super::Target::None,
                    super::Phase::Log,
                    plugin,
                    0,
                    std::ptr::null_mut(),
                    false,
                );
                let driven = drive(&mut pool, thread.clone(), arg);
                drop(guard);
                match driven {
                    Driven::Done(Ok(())) => break,
                    Driven::Done(Err(e)) => {
                        tracing::error!("lua entry thread aborted: runtime error: {e}");
                        break;
                    }
                    Driven::Yielded(_, op) => {
                        let done = op.perform().await;
                        arg = match result_value(&lua, done) {
                            Ok(v) => v,
                            Err(_) => Value::Nil,
                        };
                    }
                }
            }
            if !every {
                break;
            }
        }
        PENDING_TIMERS.set(PENDING_TIMERS.get().saturating_sub(1));
    };
    let spawned = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        tokio::task::spawn_local(task);
    }));
    spawned.map_err(|_| {
        PENDING_TIMERS.set(PENDING_TIMERS.get().saturating_sub(1));
        "no timer support outside a worker".to_string()
    })
}

async fn http_call(call: HttpCall) -> Result<HttpResponse, String> {
    let uri: http::Uri = call.url.parse().map_err(|e| format!("bad uri: {e}"))?;
    let https = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => return Err(format!("bad uri: {}", call.url)),
    };
    let host = uri.host().ok_or("bad uri: no host")?.to_string();
    let bare = host.trim_matches(['[', ']']).to_string();
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let tcp = tokio::net::TcpStream::connect((bare.as_str(), port))
        .await
        .map_err(|e| e.to_string())?;
    let _ = tcp.set_nodelay(true);
    let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_string();
    let authority = uri.authority().map_or(host.clone(), |a| a.to_string());
    let mut req = http::Request::builder()
        .method(call.method.as_str())
        .uri(path)
        .body(Full::new(Bytes::from(call.body.unwrap_or_default())))
        .map_err(|e| e.to_string())?;
    let mut has_host = false;
    for (k, v) in &call.headers {
        let name = http::HeaderName::from_bytes(k.as_bytes()).map_err(|e| e.to_string())?;
        has_host |= name == http::header::HOST;
        let value = http::HeaderValue::from_str(v).map_err(|e| e.to_string())?;
        req.headers_mut().append(name, value);
    }
    if !has_host {
        let v = http::HeaderValue::from_str(&authority).map_err(|e| e.to_string())?;
        req.headers_mut().insert(http::header::HOST, v);
    }
    macro_rules! exchange {
        ($io:expr) => {{
            let (mut sender, conn) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new($io))
                    .await
                    .map_err(|e| e.to_string())?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
            let (parts, body) = resp.into_parts();
            let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
            Ok(HttpResponse {
                status: parts.status.as_u16(),
                reason: parts.status.canonical_reason().unwrap_or("").to_string(),
                headers: parts
                    .headers
                    .iter()
                    .map(|(k, v)| {
                        (
                            k.as_str().to_string(),
                            String::from_utf8_lossy(v.as_bytes()).into_owned(),
                        )
                    })
                    .collect(),
                body,
            })
        }};
    }
    if https {
        let config = crate::tls_client::config(call.ssl_verify)?;
        let name = rustls::pki_types::ServerName::try_from(bare).map_err(|e| e.to_string())?;
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .map_err(|e| e.to_string())?;
        exchange!(tls)
    } else {
        exchange!(tcp)
    }
}
