//! `ngx.socket.tcp`: OpenResty's cosockets, on which Lua libraries such as `resty.redis` and
//! `resty.mysql` speak their protocols. A socket's calls (`connect`, `sslhandshake`, `send`,
//! `receive`, `receiveany`) wait without holding the worker, as `resty.http` does
//! (`yields`); `setkeepalive` puts the connection in this worker's pool for the next
//! `connect` to the same host and port (or `opts.pool`), as OpenResty's pools are per
//! worker. The connections live in the worker's table, by id, while a Lua object holds them:
//! one left unclosed goes when the object is collected.
//!
//! What OpenResty has and this has not: `receiveuntil` (an error naming it), UDP sockets, and
//! `ngx.socket.stream`; `setoption` accepts and ignores its option.

use std::cell::RefCell;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use mlua::{Lua, Table, Value};
use rustc_hash::FxHashMap;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Most connections a worker keeps open for Lua at once (OpenResty is bound by the worker's
/// `worker_connections`).
const MAX_OPEN: usize = 4096;

trait Io: AsyncRead + AsyncWrite + Unpin {}
impl<T: AsyncRead + AsyncWrite + Unpin> Io for T {}

struct Conn {
    io: Box<dyn Io>,
    /// Read and not yet handed to Lua.
    buf: BytesMut,
    reused: u32,
    pool: String,
    /// For a TLS handshake's default server name.
    host: String,
}

#[derive(Default)]
struct Sockets {
    next: u64,
    open: FxHashMap<u64, Conn>,
    /// Kept connections by pool name, each with when it stops being kept.
    idle: FxHashMap<String, Vec<(Conn, Instant)>>,
}

thread_local! {
    static SOCKETS: RefCell<Sockets> = RefCell::new(Sockets::default());
}

/// One call on a socket, as a coroutine yields it.
#[derive(Debug)]
pub struct TcpOp {
    action: String,
    id: u64,
    host: String,
    port: Option<u16>,
    pool: String,
    data: Vec<u8>,
    /// `l` (a line), `a` (to the end), `any`, or a byte count.
    pattern: String,
    count: usize,
    timeout: Duration,
    server_name: Option<String>,
    verify: bool,
}

/// What a socket's call gave.
pub enum TcpDone {
    Connected {
        id: u64,
        reused: u32,
    },
    Sent(usize),
    Received(Bytes),
    Handshaken,
    /// The call failed: OpenResty's message ("timeout", "closed", "connection refused"),
    /// what was read before it, and whether the socket is gone.
    Failed(String, Bytes, bool),
}

pub(super) fn op_of(t: &Table) -> Option<TcpOp> {
    let ms: f64 = t.raw_get("timeout").unwrap_or(60_000.0);
    let text = |k: &str| t.raw_get::<Option<String>>(k).ok().flatten();
    let (pattern, count) = match t.raw_get::<Value>("pattern") {
        Ok(Value::Integer(n)) => ("n".to_string(), n.max(0) as usize),
        Ok(Value::Number(n)) => ("n".to_string(), n.max(0.0) as usize),
        Ok(Value::String(s)) => (s.to_string_lossy().to_string(), 0),
        _ => ("l".to_string(), 0),
    };
    Some(TcpOp {
        action: text("action")?,
        id: t.raw_get::<Option<u64>>("id").ok().flatten().unwrap_or(0),
        host: text("host").unwrap_or_default(),
        port: t.raw_get::<Option<u16>>("port").ok().flatten(),
        pool: text("pool").unwrap_or_default(),
        data: match t.raw_get::<Value>("data") {
            Ok(Value::String(s)) => s.as_bytes().to_vec(),
            _ => Vec::new(),
        },
        pattern,
        count: count.max(
            t.raw_get::<Option<usize>>("max")
                .ok()
                .flatten()
                .unwrap_or(0),
        ),
        timeout: Duration::from_millis(ms.clamp(1.0, 3_600_000.0) as u64),
        server_name: text("server_name"),
        verify: t.raw_get::<Option<bool>>("verify").ok().flatten() != Some(false),
    })
}

pub(super) fn done_value(lua: &Lua, done: TcpDone) -> mlua::Result<Value> {
    let t = lua.create_table()?;
    match done {
        TcpDone::Connected { id, reused } => {
            t.set("id", id)?;
            t.set("reused", reused)?;
        }
        TcpDone::Sent(n) => t.set("n", n)?,
        TcpDone::Received(b) => t.set("data", lua.create_string(&b)?)?,
        TcpDone::Handshaken => t.set("ok", true)?,
        TcpDone::Failed(e, partial, gone) => {
            t.set("err", e)?;
            t.set("partial", lua.create_string(&partial)?)?;
            t.set("gone", gone)?;
        }
    }
    Ok(Value::Table(t))
}

fn take(id: u64) -> Option<Conn> {
    SOCKETS.with(|s| s.borrow_mut().open.remove(&id))
}

fn put(id: u64, c: Conn) {
    SOCKETS.with(|s| s.borrow_mut().open.insert(id, c));
}

fn io_error(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::ConnectionRefused => "connection refused".into(),
        std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe => {
            "connection reset by peer".into()
        }
        std::io::ErrorKind::UnexpectedEof => "closed".into(),
        _ => e.to_string(),
    }
}

impl TcpOp {
    pub async fn perform(self) -> TcpDone {
        let failed = |e: String| TcpDone::Failed(e, Bytes::new(), true);
        match self.action.as_str() {
            "connect" => self.connect().await.unwrap_or_else(failed),
            "tls" => {
                let Some(c) = take(self.id) else {
                    return failed("closed".into());
                };
                match tokio::time::timeout(self.timeout, handshake(c, &self)).await {
                    Ok(Ok(c)) => {
                        put(self.id, c);
                        TcpDone::Handshaken
                    }
                    Ok(Err(e)) => failed(e),
                    Err(_) => failed("timeout".into()),
                }
            }
            "send" => {
                let Some(mut c) = take(self.id) else {
                    return failed("closed".into());
                };
                match tokio::time::timeout(self.timeout, c.io.write_all(&self.data)).await {
                    Ok(Ok(())) => {
                        put(self.id, c);
                        TcpDone::Sent(self.data.len())
                    }
                    Ok(Err(e)) => failed(io_error(&e)),
                    // OpenResty keeps the socket after a timeout.
                    Err(_) => {
                        put(self.id, c);
                        TcpDone::Failed("timeout".into(), Bytes::new(), false)
                    }
                }
            }
            "receive" => {
                let Some(mut c) = take(self.id) else {
                    return failed("closed".into());
                };
                let outcome = tokio::time::timeout(self.timeout, receive(&mut c, &self)).await;
                match outcome {
                    Ok(Ok(b)) => {
                        put(self.id, c);
                        TcpDone::Received(b)
                    }
                    Ok(Err(e)) => {
                        // The peer closed: what was read goes with the error.
                        let partial = c.buf.split().freeze();
                        TcpDone::Failed(e, partial, true)
                    }
                    Err(_) => {
                        put(self.id, c);
                        TcpDone::Failed("timeout".into(), Bytes::new(), false)
                    }
                }
            }
            other => failed(format!("unknown socket call '{other}'")),
        }
    }

    async fn connect(&self) -> Result<TcpDone, String> {
        // A kept connection of the same pool first.
        let kept = SOCKETS.with(|s| {
            let mut s = s.borrow_mut();
            let list = s.idle.get_mut(&self.pool)?;
            let now = Instant::now();
            list.retain(|(_, until)| *until > now);
            list.pop().map(|(c, _)| c)
        });
        let conn = match kept {
            Some(mut c) => {
                c.reused += 1;
                c
            }
            None => {
                if SOCKETS.with(|s| s.borrow().open.len()) >= MAX_OPEN {
                    return Err("too many open sockets in this worker".into());
                }
                let io: Box<dyn Io> = if let Some(path) = self.host.strip_prefix("unix:") {
                    let s =
                        tokio::time::timeout(self.timeout, tokio::net::UnixStream::connect(path))
                            .await
                            .map_err(|_| "timeout".to_string())?
                            .map_err(|e| io_error(&e))?;
                    Box::new(s)
                } else {
                    let port = self
                        .port
                        .ok_or("no port given for a host that is not unix:")?;
                    let host = self.host.trim_start_matches('[').trim_end_matches(']');
                    let s = tokio::time::timeout(
                        self.timeout,
                        tokio::net::TcpStream::connect((host, port)),
                    )
                    .await
                    .map_err(|_| "timeout".to_string())?
                    .map_err(|e| io_error(&e))?;
                    let _ = s.set_nodelay(true);
                    Box::new(s)
                };
                Conn {
                    io,
                    buf: BytesMut::new(),
                    reused: 0,
                    pool: self.pool.clone(),
                    host: self.host.clone(),
                }
            }
        };
        let reused = conn.reused;
        let id = SOCKETS.with(|s| {
            let mut s = s.borrow_mut();
            s.next += 1;
            let id = s.next;
            s.open.insert(id, conn);
            id
        });
        Ok(TcpDone::Connected { id, reused })
    }
}

async fn handshake(c: Conn, op: &TcpOp) -> Result<Conn, String> {
    let config = crate::tls_client::config(op.verify)?;
    let name = op.server_name.clone().unwrap_or_else(|| c.host.clone());
    let name = rustls::pki_types::ServerName::try_from(name).map_err(|e| e.to_string())?;
    let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(name, c.io)
        .await
        .map_err(|e| format!("handshake failed: {e}"))?;
    Ok(Conn {
        io: Box::new(tls),
        buf: c.buf,
        reused: c.reused,
        pool: c.pool,
        host: c.host,
    })
}

/// Reads until the pattern is met: a line (`l`, without its `\r\n` or `\n`), `n` bytes, what
/// is there (`any`, at most `count`), or everything until the peer closes (`a`).
async fn receive(c: &mut Conn, op: &TcpOp) -> Result<Bytes, String> {
    loop {
        match op.pattern.as_str() {
            "l" => {
                if let Some(i) = c.buf.iter().position(|&b| b == b'\n') {
                    let mut line = c.buf.split_to(i + 1);
                    line.truncate(i);
                    if line.last() == Some(&b'\r') {
                        line.truncate(i - 1);
                    }
                    return Ok(line.freeze());
                }
            }
            "n" => {
                if c.buf.len() >= op.count {
                    return Ok(c.buf.split_to(op.count).freeze());
                }
            }
            "any" => {
                if !c.buf.is_empty() {
                    let n = if op.count == 0 {
                        c.buf.len()
                    } else {
                        op.count.min(c.buf.len())
                    };
                    return Ok(c.buf.split_to(n).freeze());
                }
            }
            "a" => {}
            other => return Err(format!("bad pattern argument: {other}")),
        }
        c.buf.reserve(16 * 1024);
        let n = c.io.read_buf(&mut c.buf).await.map_err(|e| io_error(&e))?;
        if n == 0 {
            if op.pattern == "a" {
                let all = c.buf.split().freeze();
                return Ok(all);
            }
            return Err("closed".into());
        }
    }
}

/// Closes a socket now (`close`, an error, the object collected).
fn close(id: u64) {
    drop(take(id));
}

/// Keeps a socket for the next `connect` to its pool, for `timeout_ms` (0: the default, 60 s),
/// at most `size` per pool. A socket with unread data is closed instead.
fn keep(id: u64, timeout_ms: u64, size: usize) -> Result<(), String> {
    let Some(mut c) = take(id) else {
        return Err("closed".into());
    };
    if c.buf.has_remaining() {
        return Err("unread data in buffer".into());
    }
    c.buf = BytesMut::new();
    let keep_for = Duration::from_millis(if timeout_ms == 0 { 60_000 } else { timeout_ms });
    SOCKETS.with(|s| {
        let mut s = s.borrow_mut();
        let list = s.idle.entry(c.pool.clone()).or_default();
        if list.len() >= size.max(1) {
            list.remove(0);
        }
        list.push((c, Instant::now() + keep_for));
    });
    Ok(())
}

/// `ngx.socket.tcp` and `ngx.socket.connect`, in Lua over the yields.
pub(super) fn install(lua: &Lua, ngx: &Table, op_key: &str) -> mlua::Result<()> {
    let close_fn = lua.create_function(|_, id: u64| {
        close(id);
        Ok(())
    })?;
    let keep_fn = lua.create_function(
        |_, (id, timeout, size): (u64, Option<u64>, Option<usize>)| {
            Ok(match keep(id, timeout.unwrap_or(0), size.unwrap_or(30)) {
                Ok(()) => (Some(1), None),
                Err(e) => (None, Some(e)),
            })
        },
    )?;
    lua.load(SOCKET)
        .set_name("=ngx.socket")
        .call::<()>((op_key, ngx.clone(), close_fn, keep_fn))
}

const SOCKET: &str = r##"
local OP_KEY, ngx, close_now, keep = ...
local yield, isyieldable = coroutine.yield, coroutine.isyieldable
local setmetatable, type, tostring, concat = setmetatable, type, tostring, table.concat

local function call(op)
  if not isyieldable() then
    return nil, "API disabled in the context of " .. (ngx.get_phase and ngx.get_phase() or "this")
  end
  op[OP_KEY] = "tcp"
  return yield(op)
end

local tcp = {}
tcp.__index = tcp

local function forget(self)
  if self.id then close_now(self.id) end
  self.id, self.guard = nil, nil
end

function tcp:settimeout(ms)
  ms = tonumber(ms) or 60000
  self.connect_timeout, self.send_timeout, self.read_timeout = ms, ms, ms
end

function tcp:settimeouts(c, s, r)
  self.connect_timeout = tonumber(c) or self.connect_timeout
  self.send_timeout = tonumber(s) or self.send_timeout
  self.read_timeout = tonumber(r) or self.read_timeout
end

function tcp:setoption() return true end

function tcp:connect(host, port, opts)
  if type(port) == "table" then opts, port = port, nil end
  if type(host) ~= "string" then return nil, "bad host" end
  forget(self)
  local pool = opts and opts.pool or (port and (host .. ":" .. tostring(port)) or host)
  local r, err = call({ action = "connect", host = host, port = tonumber(port), pool = pool,
    timeout = self.connect_timeout })
  if not r then return nil, err end
  if r.err then return nil, r.err end
  self.id, self.reused, self.host = r.id, r.reused, host
  -- Closed when the object is collected, if the code forgot to.
  local id = r.id
  local guard = newproxy(true)
  getmetatable(guard).__gc = function() close_now(id) end
  self.guard = guard
  return 1
end

function tcp:sslhandshake(reused_session, server_name, ssl_verify)
  if not self.id then return nil, "closed" end
  local r, err = call({ action = "tls", id = self.id, server_name = server_name,
    verify = ssl_verify, timeout = self.connect_timeout })
  if not r then return nil, err end
  if r.err then forget(self) return nil, r.err end
  return true
end

local function flatten(data, out)
  for i = 1, #data do
    local v = data[i]
    if type(v) == "table" then flatten(v, out) else out[#out + 1] = tostring(v) end
  end
  return out
end

function tcp:send(data)
  if not self.id then return nil, "closed" end
  if type(data) == "table" then data = concat(flatten(data, {})) else data = tostring(data) end
  local r, err = call({ action = "send", id = self.id, data = data, timeout = self.send_timeout })
  if not r then return nil, err end
  if r.err then
    if r.gone then forget(self) end
    return nil, r.err
  end
  return r.n
end

local function receive(self, pattern, max)
  if not self.id then return nil, "closed" end
  local r, err = call({ action = "receive", id = self.id, pattern = pattern, max = max,
    timeout = self.read_timeout })
  if not r then return nil, err end
  if r.err then
    if r.gone then forget(self) end
    return nil, r.err, r.partial
  end
  return r.data
end

function tcp:receive(pattern)
  if pattern == nil then pattern = "l" end
  if type(pattern) == "string" then pattern = pattern:gsub("^%*", "") end
  if type(pattern) == "number" and pattern == 0 then return "" end
  return receive(self, pattern)
end

function tcp:receiveany(max)
  return receive(self, "any", tonumber(max))
end

function tcp:receiveuntil()
  error("ngx.socket.tcp:receiveuntil is not implemented by Turnpike", 2)
end

function tcp:setkeepalive(timeout, size)
  if not self.id then return nil, "closed" end
  local id = self.id
  self.id, self.guard = nil, nil
  return keep(id, tonumber(timeout), tonumber(size))
end

function tcp:close()
  if not self.id then return nil, "closed" end
  forget(self)
  return 1
end

function tcp:getreusedtimes()
  if not self.id then return nil, "closed" end
  return self.reused
end

ngx.socket = ngx.socket or {}
ngx.socket.tcp = function()
  return setmetatable({ connect_timeout = 60000, send_timeout = 60000, read_timeout = 60000 }, tcp)
end
ngx.socket.connect = function(host, port, opts)
  local s = ngx.socket.tcp()
  local ok, err = s:connect(host, port, opts)
  if not ok then return nil, err end
  return s
end
ngx.socket.udp = function()
  error("ngx.socket.udp is not implemented by Turnpike", 2)
end
"##;
