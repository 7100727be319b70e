//! The part of Kong's PDK (`kong.*`) and of OpenResty's `ngx.*` that serverless code can call.
//!
//! Every function reaches the request through `CURRENT` (set for the length of one call) and
//! checks that the phase has what it asks for, with Kong's message when it does not. A
//! function that ends the request (`kong.response.exit`, `ngx.exit`) records the response and
//! raises an error that unwinds the Lua code; the runner sees the recorded response first, so
//! a `pcall` around the call cannot swallow it.

use std::fmt;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use mlua::{Lua, LuaSerdeExt, LuaString, MultiValue, Table, Value};

use super::{BodyChunk, Current, LuaCtx, Phase, Target, CURRENT};
use crate::{AccessRequest, Exit, ResponseHead};

/// The error that unwinds Lua code after an exit (or `ngx.exit(ngx.OK)`, which only ends the
/// function).
#[derive(Debug)]
struct Stop;

impl fmt::Display for Stop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("request ended by the plugin")
    }
}

impl std::error::Error for Stop {}

pub(super) fn is_stop(e: &mlua::Error) -> bool {
    e.chain().any(|c| c.is::<Stop>())
}

fn stop<T>() -> mlua::Result<T> {
    Err(mlua::Error::external(Stop))
}

/// A response made of what `ngx.say`/`ngx.print` wrote.
pub(super) fn said_exit(status: StatusCode, body: Vec<u8>) -> Exit {
    Exit {
        status,
        headers: vec![(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain"),
        )],
        body: Bytes::from(body),
    }
}

fn with_current<R>(f: impl FnOnce(&mut Current) -> mlua::Result<R>) -> mlua::Result<R> {
    CURRENT.with(|c| f(&mut c.borrow_mut()))
}

fn not_in_phase<T>(phase: Phase) -> mlua::Result<T> {
    Err(mlua::Error::runtime(format!(
        "function cannot be called in {} phase",
        phase.name()
    )))
}

/// The request, in the rewrite and access phases.
fn with_request<R>(
    f: impl FnOnce(&mut AccessRequest<'static>, Phase) -> mlua::Result<R>,
) -> mlua::Result<R> {
    with_current(|c| match c.target {
        // SAFETY: `run_request` set the pointer from a live `&mut` borrow that lasts the call,
        // and nothing else reaches the request while Lua runs.
        Target::Request(p) => f(unsafe { &mut *p }, c.phase),
        _ => not_in_phase(c.phase),
    })
}

/// The request as the read-only getters see it: the live request (rewrite, access), or what the
/// log phase kept of it.
enum View<'a> {
    Req(&'a AccessRequest<'static>),
    Log(&'a crate::log::RequestDetails),
}

impl View<'_> {
    fn method(&self) -> &str {
        match self {
            View::Req(r) => r.method,
            View::Log(d) => d.method.as_str(),
        }
    }
    fn path(&self) -> &str {
        match self {
            View::Req(r) => r.path,
            View::Log(d) => d.uri.path(),
        }
    }
    fn query(&self) -> Option<&str> {
        match self {
            View::Req(r) => r.query,
            View::Log(d) => d.uri.query(),
        }
    }
    fn header(&self, name: &HeaderName) -> Option<&HeaderValue> {
        match self {
            View::Req(r) => r.header(name),
            View::Log(d) => d.request_headers.get(name),
        }
    }
    fn headers(&self) -> &HeaderMap {
        match self {
            View::Req(r) => r.headers,
            View::Log(d) => &d.request_headers,
        }
    }
    fn tls(&self) -> bool {
        match self {
            View::Req(r) => r.tls,
            View::Log(d) => d.tls,
        }
    }
    fn body(&self) -> Option<&Bytes> {
        match self {
            View::Req(r) => r.body.as_ref(),
            View::Log(_) => None,
        }
    }
}

/// The request for reading: in rewrite and access, and in log (what was kept of it).
fn with_view<R>(f: impl FnOnce(View<'_>) -> mlua::Result<R>) -> mlua::Result<R> {
    with_current(|c| match c.target {
        // SAFETY: as in `with_request`, from `run_request` and `run_log`.
        Target::Request(p) => f(View::Req(unsafe { &*p })),
        Target::Log(p) => match unsafe { &*p }.details {
            Some(d) => f(View::Log(d)),
            None => not_in_phase(c.phase),
        },
        _ => not_in_phase(c.phase),
    })
}

/// The response head, in the header_filter phase.
fn with_response<R>(
    f: impl FnOnce(&mut ResponseHead<'static>) -> mlua::Result<R>,
) -> mlua::Result<R> {
    with_current(|c| match c.target {
        // SAFETY: as in `with_request`, from `run_response`.
        Target::Response(p) => f(unsafe { &mut *p }),
        _ => not_in_phase(c.phase),
    })
}

fn with_body<R>(f: impl FnOnce(&mut BodyChunk) -> mlua::Result<R>) -> mlua::Result<R> {
    with_current(|c| match c.target {
        // SAFETY: as in `with_request`, from `LuaBodyFilter::filter`.
        Target::Body(p) => f(unsafe { &mut *p }),
        _ => not_in_phase(c.phase),
    })
}

fn with_log<R>(
    f: impl FnOnce(&crate::log::LogEntry<'static>) -> mlua::Result<R>,
) -> mlua::Result<R> {
    with_current(|c| match c.target {
        // SAFETY: as in `with_request`, from `run_log`.
        Target::Log(p) => f(unsafe { &*p }),
        _ => not_in_phase(c.phase),
    })
}

/// Kong's header names: case-insensitive, and `_` may stand for `-`.
fn header_name(name: &LuaString) -> mlua::Result<HeaderName> {
    let bytes = name.as_bytes();
    // `HeaderName::from_bytes` lower-cases; a copy is made only to turn `_` into `-`.
    let parsed = if bytes.contains(&b'_') {
        let dashed: Vec<u8> = bytes
            .iter()
            .map(|b| if *b == b'_' { b'-' } else { *b })
            .collect();
        HeaderName::from_bytes(&dashed)
    } else {
        HeaderName::from_bytes(&bytes)
    };
    parsed.map_err(|_| mlua::Error::runtime(format!("invalid header name \"{}\"", name.display())))
}

/// A header name as written (no `_` translation): for setting headers.
fn set_header_name(name: &LuaString) -> mlua::Result<HeaderName> {
    HeaderName::from_bytes(&name.as_bytes().to_ascii_lowercase())
        .map_err(|_| mlua::Error::runtime(format!("invalid header name \"{}\"", name.display())))
}

/// A Lua value as header values: a string, number or boolean, or an array of them. Values with
/// CR, LF or NUL are refused (they would split the head).
fn header_values(name: &HeaderName, v: &Value) -> mlua::Result<Vec<HeaderValue>> {
    match v {
        Value::Nil => Ok(Vec::new()),
        // An array of scalars, one header line each; a nested table is an error (and a table
        // that contains itself cannot send the walk round for ever).
        Value::Table(t) => t
            .sequence_values::<Value>()
            .map(|item| header_value_of(name, &item?))
            .collect(),
        scalar => Ok(vec![header_value_of(name, scalar)?]),
    }
}

/// One header value from a string, number or boolean.
fn header_value_of(name: &HeaderName, v: &Value) -> mlua::Result<HeaderValue> {
    let one = |b: &[u8]| {
        HeaderValue::from_bytes(b)
            .map_err(|_| mlua::Error::runtime(format!("invalid header value for \"{name}\"")))
    };
    match v {
        Value::String(s) => one(&s.as_bytes()),
        Value::Integer(i) => one(i.to_string().as_bytes()),
        Value::Number(n) => one(lua_number(*n).as_bytes()),
        Value::Boolean(b) => one(b.to_string().as_bytes()),
        _ => Err(mlua::Error::runtime(format!(
            "invalid header value for \"{name}\": got {}",
            v.type_name()
        ))),
    }
}

/// A number as Lua prints it (integers without a fraction).
fn lua_number(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 1e15 {
        format!("{}", n as i64)
    } else {
        n.to_string()
    }
}

/// A header map as Kong's `get_headers()` returns it: lower-case names, one value as a
/// string, several as an array.
fn headers_table(lua: &Lua, h: &HeaderMap) -> mlua::Result<Table> {
    let t = lua.create_table_with_capacity(0, h.keys_len())?;
    for name in h.keys() {
        let mut values = h.get_all(name).iter();
        let first = values.next().map(|v| v.as_bytes()).unwrap_or_default();
        let rest: Vec<&HeaderValue> = values.collect();
        if rest.is_empty() {
            t.set(name.as_str(), lua.create_string(first)?)?;
        } else {
            let arr = lua.create_table()?;
            arr.push(lua.create_string(first)?)?;
            for v in rest {
                arr.push(lua.create_string(v.as_bytes())?)?;
            }
            t.set(name.as_str(), arr)?;
        }
    }
    // Look-ups by any case, or with `_` for `-`, as in Kong.
    let meta = lua.create_table()?;
    meta.set(
        "__index",
        lua.create_function(|_, (t, k): (Table, LuaString)| {
            let n = header_name(&k)?;
            t.raw_get::<Value>(n.as_str())
        })?,
    )?;
    t.set_metatable(Some(meta))?;
    Ok(t)
}

fn header_value(lua: &Lua, v: Option<&HeaderValue>) -> mlua::Result<Value> {
    match v {
        Some(v) => Ok(Value::String(lua.create_string(v.as_bytes())?)),
        None => Ok(Value::Nil),
    }
}

fn set_fn<A, R, F>(lua: &Lua, t: &Table, name: &str, f: F) -> mlua::Result<()>
where
    F: Fn(&Lua, A) -> mlua::Result<R> + 'static,
    A: mlua::FromLuaMulti,
    R: mlua::IntoLuaMulti,
{
    t.set(name, lua.create_function(f)?)
}

/// Query arguments as a table (`a=1&a=2&b` → `{a = {"1", "2"}, b = true}`), decoded.
fn args_table(lua: &Lua, query: &str) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = match pair.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (pair, None),
        };
        let key = lua.create_string(percent_decode(k))?;
        let value = match v {
            Some(v) => Value::String(lua.create_string(percent_decode(v))?),
            None => Value::Boolean(true),
        };
        match t.raw_get::<Value>(&key)? {
            Value::Nil => t.raw_set(key, value)?,
            Value::Table(arr) => arr.push(value)?,
            prev => {
                let arr = lua.create_sequence_from([prev, value])?;
                t.raw_set(key, arr)?
            }
        }
    }
    Ok(t)
}

pub(super) fn percent_decode(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                    out.push(h << 4 | l);
                    i += 3;
                    continue;
                }
                out.push(b'%');
            }
            c => out.push(c),
        }
        i += 1;
    }
    out
}

fn percent_encode(b: &[u8]) -> String {
    let mut out = String::with_capacity(b.len());
    for &c in b {
        if c.is_ascii_alphanumeric() || b"-_.~".contains(&c) {
            out.push(c as char);
        } else {
            out.push_str(&format!("%{c:02X}"));
        }
    }
    out
}

/// A table of arguments as a query string (Kong's `set_query`, `ngx.encode_args`): keys
/// sorted, arrays repeated, `true` as a bare key.
fn encode_args(t: &Table) -> mlua::Result<String> {
    let mut pairs: Vec<(Vec<u8>, Value)> = Vec::new();
    for kv in t.pairs::<LuaString, Value>() {
        let (k, v) = kv?;
        pairs.push((k.as_bytes().to_vec(), v));
    }
    pairs.sort_by(|a, b| a.0.cmp(&b.0));
    let mut parts = Vec::new();
    for (k, v) in pairs {
        let key = percent_encode(&k);
        let mut push = |v: &Value| -> mlua::Result<()> {
            match v {
                Value::Boolean(true) => parts.push(key.clone()),
                Value::Boolean(false) => {}
                Value::String(s) => parts.push(format!("{key}={}", percent_encode(&s.as_bytes()))),
                Value::Integer(i) => parts.push(format!("{key}={i}")),
                Value::Number(n) => parts.push(format!("{key}={}", lua_number(*n))),
                other => {
                    return Err(mlua::Error::runtime(format!(
                        "attempt to use {} as query arg value",
                        other.type_name()
                    )))
                }
            }
            Ok(())
        };
        match &v {
            Value::Table(arr) => {
                for item in arr.sequence_values::<Value>() {
                    push(&item?)?;
                }
            }
            other => push(other)?,
        }
    }
    Ok(parts.join("&"))
}

/// A Lua string or table body as bytes; a table is JSON (Kong's `kong.response.exit`).
fn body_bytes(lua: &Lua, body: &Value) -> mlua::Result<(Bytes, bool)> {
    match body {
        Value::Nil => Ok((Bytes::new(), false)),
        Value::String(s) => Ok((Bytes::copy_from_slice(&s.as_bytes()), false)),
        Value::Table(_) => {
            let json: serde_json::Value = lua.from_value(body.clone())?;
            Ok((
                Bytes::from(serde_json::to_vec(&json).map_err(mlua::Error::external)?),
                true,
            ))
        }
        other => Err(mlua::Error::runtime(format!(
            "body must be a string or a table, got {}",
            other.type_name()
        ))),
    }
}

/// Kong's messages for the statuses its error handler knows (`ngx.exit(403)`, and
/// `kong.response.error` without a message).
fn default_message(status: StatusCode) -> String {
    match status.as_u16() {
        400 => "Bad request".into(),
        401 => "Unauthorized".into(),
        403 => "Forbidden".into(),
        404 => "Not found".into(),
        405 => "Method not allowed".into(),
        406 => "Not acceptable".into(),
        408 => "Request timeout".into(),
        411 => "Length required".into(),
        412 => "Precondition failed".into(),
        413 => "Payload too large".into(),
        414 => "URI too long".into(),
        415 => "Unsupported media type".into(),
        429 => "API rate limit exceeded".into(),
        500 => "An unexpected error occurred".into(),
        502 => "An invalid response was received from the upstream server".into(),
        503 => "The upstream server is currently unavailable".into(),
        504 => "The upstream server is timing out".into(),
        s => format!("The upstream server responded with {s}"),
    }
}

fn status_arg(v: i64) -> mlua::Result<StatusCode> {
    u16::try_from(v)
        .ok()
        .filter(|s| (100..=599).contains(s))
        .and_then(|s| StatusCode::from_u16(s).ok())
        .ok_or_else(|| mlua::Error::runtime("code must be a number between 100 and 599"))
}

/// Headers given to `kong.response.exit` as a table.
fn exit_headers(headers: Option<Table>) -> mlua::Result<Vec<(HeaderName, HeaderValue)>> {
    let mut out = Vec::new();
    if let Some(t) = headers {
        for kv in t.pairs::<LuaString, Value>() {
            let (k, v) = kv?;
            let name = set_header_name(&k)?;
            for value in header_values(&name, &v)? {
                out.push((name.clone(), value));
            }
        }
    }
    Ok(out)
}

/// Records a response that ends the request (rewrite and access phases only).
fn record_exit(exit: Exit) -> mlua::Result<()> {
    with_current(|c| match c.phase {
        Phase::Rewrite | Phase::Access => {
            c.exit = Some(exit);
            Ok(())
        }
        p => not_in_phase(p),
    })
}

/// The request's Lua tables (`kong.ctx.shared`, `ngx.ctx`, `kong.ctx.plugin`), made on first
/// use and kept in its `PluginCtx`. Phases without a request (certificate) get a fresh table.
fn ctx_table(lua: &Lua, which: CtxTable) -> mlua::Result<Table> {
    let (ctx, plugin) = with_current(|c| Ok((c.ctx, c.plugin_id)))?;
    if ctx.is_null() {
        return lua.create_table();
    }
    // SAFETY: set by the runner from a live borrow of the request's context for this call.
    let ctx = unsafe { &mut *ctx };
    if ctx.0.is_none() {
        ctx.0 = Some(Box::new(LuaCtx {
            shared: lua.create_table()?,
            ngx: lua.create_table()?,
            plugin: Default::default(),
        }));
    }
    let Some(lc) = ctx.0.as_mut().and_then(|b| b.downcast_mut::<LuaCtx>()) else {
        return Err(mlua::Error::runtime("kong.ctx is held by another plugin"));
    };
    Ok(match which {
        CtxTable::Shared => lc.shared.clone(),
        CtxTable::Ngx => lc.ngx.clone(),
        CtxTable::Plugin => match lc.plugin.get(&plugin) {
            Some(t) => t.clone(),
            None => {
                let t = lua.create_table()?;
                lc.plugin.insert(plugin, t.clone());
                t
            }
        },
    })
}

#[derive(Clone, Copy)]
enum CtxTable {
    Shared,
    Ngx,
    Plugin,
}

/// Log levels, as nginx numbers them (`ngx.ERR`, ...).
const LEVELS: [(&str, i64); 9] = [
    ("STDERR", 0),
    ("EMERG", 1),
    ("ALERT", 2),
    ("CRIT", 3),
    ("ERR", 4),
    ("WARN", 5),
    ("NOTICE", 6),
    ("INFO", 7),
    ("DEBUG", 8),
];

fn log_at(level: i64, args: MultiValue) -> mlua::Result<()> {
    let mut msg = String::new();
    for v in args.iter() {
        match v {
            Value::String(s) => msg.push_str(&s.to_string_lossy()),
            Value::Nil => msg.push_str("nil"),
            Value::Integer(i) => msg.push_str(&i.to_string()),
            Value::Number(n) => msg.push_str(&lua_number(*n)),
            Value::Boolean(b) => msg.push_str(&b.to_string()),
            other => msg.push_str(&format!("{}: {:?}", other.type_name(), other.to_pointer())),
        }
    }
    let plugin = with_current(|c| Ok(c.plugin))?;
    match level {
        0..=4 => tracing::error!(target: "turnpike::lua", "[{plugin}] {msg}"),
        5 => tracing::warn!(target: "turnpike::lua", "[{plugin}] {msg}"),
        6 | 7 => tracing::info!(target: "turnpike::lua", "[{plugin}] {msg}"),
        _ => tracing::debug!(target: "turnpike::lua", "[{plugin}] {msg}"),
    }
    Ok(())
}

/// Creates `kong` and `ngx` in a new state.
pub(super) fn install(lua: &Lua) -> mlua::Result<(Table, Table)> {
    let kong = lua.create_table()?;
    kong.set("version", crate::KONG_VERSION)?;
    kong.set("version_num", 3009001)?;
    kong.set("request", request(lua)?)?;
    kong.set("client", client(lua)?)?;
    kong.set("router", router(lua)?)?;
    kong.set("response", response(lua)?)?;
    let service = lua.create_table()?;
    service.set("request", service_request(lua)?)?;
    service.set("response", service_response(lua)?)?;
    kong.set("service", service)?;
    kong.set("log", log(lua)?)?;
    kong.set("ctx", kong_ctx(lua)?)?;
    let ngx = ngx(lua)?;
    Ok((kong, ngx))
}

fn request(lua: &Lua) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    set_fn(lua, &t, "get_method", |_, ()| {
        with_view(|r| Ok(r.method().to_string()))
    })?;
    set_fn(lua, &t, "get_path", |_, ()| {
        with_view(|r| Ok(r.path().to_string()))
    })?;
    set_fn(lua, &t, "get_raw_path", |_, ()| {
        with_view(|r| Ok(r.path().to_string()))
    })?;
    set_fn(lua, &t, "get_path_with_query", |_, ()| {
        with_view(|r| {
            Ok(match r.query() {
                Some(q) => format!("{}?{q}", r.path()),
                None => r.path().to_string(),
            })
        })
    })?;
    set_fn(lua, &t, "get_raw_query", |_, ()| {
        with_view(|r| Ok(r.query().unwrap_or("").to_string()))
    })?;
    set_fn(lua, &t, "get_query", |lua, ()| {
        let q = with_view(|r| Ok(r.query().unwrap_or("").to_string()))?;
        args_table(lua, &q)
    })?;
    set_fn(lua, &t, "get_query_arg", |lua, name: LuaString| {
        let q = with_view(|r| Ok(r.query().unwrap_or("").to_string()))?;
        let args = args_table(lua, &q)?;
        match args.raw_get::<Value>(name)? {
            Value::Table(arr) => arr.get::<Value>(1),
            v => Ok(v),
        }
    })?;
    set_fn(lua, &t, "get_header", |lua, name: LuaString| {
        let name = header_name(&name)?;
        with_view(|r| header_value(lua, r.header(&name)))
    })?;
    set_fn(lua, &t, "get_headers", |lua, ()| {
        with_view(|r| headers_table(lua, r.headers()))
    })?;
    set_fn(lua, &t, "get_scheme", |_, ()| {
        with_view(|r| Ok(if r.tls() { "https" } else { "http" }))
    })?;
    set_fn(lua, &t, "get_host", |_, ()| {
        with_view(|r| Ok(request_host(&r).0))
    })?;
    set_fn(lua, &t, "get_port", |_, ()| {
        with_view(|r| Ok(request_host(&r).1))
    })?;
    set_fn(lua, &t, "get_http_version", |_, ()| Ok(1.1))?;
    set_fn(lua, &t, "get_raw_body", |lua, ()| {
        with_view(|r| match r.body() {
            Some(b) => Ok(Value::String(lua.create_string(b)?)),
            None => Ok(Value::Nil),
        })
    })?;
    set_fn(lua, &t, "get_body", |lua, ()| {
        let (body, ctype) = with_view(|r| {
            Ok((
                r.body().cloned(),
                r.headers()
                    .get(http::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_ascii_lowercase(),
            ))
        })?;
        let Some(body) = body else {
            return Ok((Value::Nil, Some("request body not read".to_string()), None));
        };
        if ctype.starts_with("application/json") {
            match serde_json::from_slice::<serde_json::Value>(&body) {
                Ok(v) => Ok((
                    lua.to_value(&v)?,
                    None,
                    Some("application/json".to_string()),
                )),
                Err(e) => Ok((Value::Nil, Some(format!("invalid json body: {e}")), None)),
            }
        } else if ctype.starts_with("application/x-www-form-urlencoded") {
            let s = String::from_utf8_lossy(&body).into_owned();
            Ok((
                Value::Table(args_table(lua, &s)?),
                None,
                Some("application/x-www-form-urlencoded".to_string()),
            ))
        } else {
            Ok((
                Value::Nil,
                Some("unsupported content type".to_string()),
                None,
            ))
        }
    })?;
    Ok(t)
}

/// The request's host (from Host, without its port) and port (Host's, or the scheme's).
fn request_host(r: &View<'_>) -> (String, u16) {
    let host = r
        .headers()
        .get(http::header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let default = if r.tls() { 443 } else { 80 };
    match host.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || host.starts_with('[') => match p.parse() {
            Ok(port) => (h.to_ascii_lowercase(), port),
            Err(_) => (host.to_ascii_lowercase(), default),
        },
        _ => (host.to_ascii_lowercase(), default),
    }
}

fn client(lua: &Lua) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    let ip = |_: &Lua, ()| {
        with_current(|c| match c.target {
            // SAFETY: as in `with_request`.
            Target::Request(p) => Ok(unsafe { &*p }.client_ip.to_string()),
            Target::Log(p) => Ok(unsafe { &*p }
                .details
                .map(|d| d.client_ip.to_string())
                .unwrap_or_default()),
            _ => not_in_phase(c.phase),
        })
    };
    set_fn(lua, &t, "get_ip", ip)?;
    set_fn(lua, &t, "get_forwarded_ip", ip)?;
    set_fn(lua, &t, "get_protocol", |_, ()| {
        with_request(|r, _| Ok(if r.tls { "https" } else { "http" }))
    })?;
    set_fn(lua, &t, "get_consumer", |lua, ()| {
        let who = consumer()?;
        match who {
            Some(c) => {
                let t = lua.create_table()?;
                t.set("id", c.consumer_id.as_str())?;
                t.set("username", c.username.as_deref())?;
                t.set("custom_id", c.custom_id.as_deref())?;
                Ok(Value::Table(t))
            }
            None => Ok(Value::Nil),
        }
    })?;
    set_fn(lua, &t, "get_credential", |lua, ()| {
        let who = consumer()?;
        match who.filter(|c| c.credential_id.is_some()) {
            Some(c) => {
                let t = lua.create_table()?;
                t.set("id", c.credential_id.as_deref())?;
                let consumer = lua.create_table()?;
                consumer.set("id", c.consumer_id.as_str())?;
                t.set("consumer", consumer)?;
                Ok(Value::Table(t))
            }
            None => Ok(Value::Nil),
        }
    })?;
    Ok(t)
}

fn consumer() -> mlua::Result<Option<std::sync::Arc<crate::Identity>>> {
    with_current(|c| match c.target {
        // SAFETY: as in `with_request`.
        Target::Request(p) => Ok(unsafe { &*p }.consumer.clone()),
        Target::Log(p) => Ok(unsafe { &*p }.consumer.map(|c| {
            std::sync::Arc::new(crate::Identity::new(
                c.consumer_id.clone(),
                c.username.clone(),
                c.custom_id.clone(),
                c.credential_id.clone(),
            ))
        })),
        _ => not_in_phase(c.phase),
    })
}

fn router(lua: &Lua) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    set_fn(lua, &t, "get_route", |lua, ()| {
        let entity = with_current(|c| match c.target {
            // SAFETY: as in `with_request`.
            Target::Request(p) => {
                let r = unsafe { &*p };
                Ok((!r.route_id.is_empty()).then(|| serde_json::json!({ "id": r.route_id })))
            }
            Target::Log(p) => {
                let route = unsafe { &*p }.route;
                Ok(Some(serde_json::json!({
                    "id": route.id, "name": route.name, "paths": route.paths,
                })))
            }
            _ => not_in_phase(c.phase),
        })?;
        entity.map_or(Ok(Value::Nil), |v| lua.to_value(&v))
    })?;
    set_fn(lua, &t, "get_service", |lua, ()| {
        let entity = with_current(|c| match c.target {
            // SAFETY: as in `with_request`.
            Target::Request(p) => Ok(unsafe { &*p }
                .service_id
                .map(|id| serde_json::json!({ "id": id }))),
            Target::Log(p) => Ok(unsafe { &*p }.service.map(|s| {
                serde_json::json!({
                    "id": s.id, "name": s.name, "host": s.host, "port": s.port,
                    "protocol": s.protocol, "path": s.path,
                })
            })),
            _ => not_in_phase(c.phase),
        })?;
        entity.map_or(Ok(Value::Nil), |v| lua.to_value(&v))
    })?;
    Ok(t)
}

fn response(lua: &Lua) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    set_fn(
        lua,
        &t,
        "exit",
        |lua, (status, body, headers): (i64, Value, Option<Table>)| {
            let status = status_arg(status)?;
            let (body, json) = body_bytes(lua, &body)?;
            let mut hs = exit_headers(headers)?;
            if json && !hs.iter().any(|(k, _)| k == http::header::CONTENT_TYPE) {
                hs.push((
                    http::header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json; charset=utf-8"),
                ));
            }
            record_exit(Exit {
                status,
                headers: hs,
                body,
            })?;
            stop::<()>()
        },
    )?;
    set_fn(
        lua,
        &t,
        "error",
        |_, (status, message, headers): (i64, Option<String>, Option<Table>)| {
            let status = status_arg(status)?;
            let message = message.unwrap_or_else(|| default_message(status));
            let mut e = Exit::message(status, &message);
            e.headers.extend(exit_headers(headers)?);
            record_exit(e)?;
            stop::<()>()
        },
    )?;
    set_fn(lua, &t, "get_status", |_, ()| {
        with_current(|c| match c.target {
            // SAFETY: as in `with_request`.
            Target::Response(p) => Ok(unsafe { &*p }.status.as_u16()),
            Target::Log(p) => Ok(unsafe { &*p }.status),
            _ => not_in_phase(c.phase),
        })
    })?;
    set_fn(lua, &t, "set_status", |_, status: i64| {
        let status = status_arg(status)?;
        with_response(|h| {
            h.status = status;
            Ok(())
        })
    })?;
    set_fn(lua, &t, "get_source", |_, ()| {
        with_current(|c| match c.target {
            // SAFETY: as in `with_request`.
            Target::Response(p) => Ok(if unsafe { &*p }.from_upstream {
                "service"
            } else {
                "exit"
            }),
            Target::Log(p) => Ok(unsafe { &*p }.source.as_str()),
            _ => not_in_phase(c.phase),
        })
    })?;
    set_fn(lua, &t, "get_header", |lua, name: LuaString| {
        let name = header_name(&name)?;
        with_response(|h| header_value(lua, h.headers.get(&name)))
    })?;
    set_fn(lua, &t, "get_headers", |lua, ()| {
        with_response(|h| headers_table(lua, h.headers))
    })?;
    header_setters(lua, &t, set_response_header)?;
    set_fn(lua, &t, "get_raw_body", |lua, ()| {
        // Kong's: the pieces are held back and gathered; at the end the whole body is returned
        // (and goes out, unless set_raw_body replaces it).
        let whole = with_body(|b| {
            if let Some(p) = b.piece.take() {
                b.gathered.extend_from_slice(&p);
            }
            if b.eof {
                let whole = Bytes::from(std::mem::take(&mut b.gathered));
                b.piece = Some(whole.clone());
                Ok(Some(whole))
            } else {
                Ok(None)
            }
        })?;
        whole.map_or(Ok(Value::Nil), |w| {
            Ok(Value::String(lua.create_string(&w)?))
        })
    })?;
    set_fn(lua, &t, "set_raw_body", |_, body: LuaString| {
        let body = Bytes::copy_from_slice(&body.as_bytes());
        with_body(|b| {
            b.piece = if b.eof { Some(body) } else { None };
            Ok(())
        })
    })?;
    Ok(t)
}

/// `set_header`, `add_header`, `clear_header` and `set_headers` over one header setter
/// (`kong.response`'s or `kong.service.request`'s).
fn header_setters(
    lua: &Lua,
    t: &Table,
    set: fn(&LuaString, &Value, bool) -> mlua::Result<()>,
) -> mlua::Result<()> {
    set_fn(
        lua,
        t,
        "set_header",
        move |_, (n, v): (LuaString, Value)| set(&n, &v, false),
    )?;
    set_fn(
        lua,
        t,
        "add_header",
        move |_, (n, v): (LuaString, Value)| set(&n, &v, true),
    )?;
    set_fn(lua, t, "clear_header", move |_, n: LuaString| {
        set(&n, &Value::Nil, false)
    })?;
    set_fn(lua, t, "set_headers", move |_, headers: Table| {
        for kv in headers.pairs::<LuaString, Value>() {
            let (k, v) = kv?;
            set(&k, &v, false)?;
        }
        Ok(())
    })
}

/// `kong.response.set_header` and friends: the response head in header_filter; in rewrite and
/// access, a header for the response the client will get.
fn set_response_header(name: &LuaString, value: &Value, append: bool) -> mlua::Result<()> {
    let name = set_header_name(name)?;
    let values = header_values(&name, value)?;
    with_current(|c| match c.target {
        // SAFETY: as in `with_request`.
        Target::Response(p) => {
            let h = unsafe { &mut *p };
            if !append {
                h.headers.remove(&name);
            }
            for v in values {
                h.headers.append(name.clone(), v);
            }
            Ok(())
        }
        Target::Request(p) => {
            let r = unsafe { &mut *p };
            if !append {
                r.response_headers.retain(|(k, _)| *k != name);
            }
            for v in values {
                r.response_headers.push((name.clone(), v));
            }
            Ok(())
        }
        _ => not_in_phase(c.phase),
    })
}

fn service_request(lua: &Lua) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    header_setters(lua, &t, set_request_header)?;
    set_fn(lua, &t, "set_path", |_, path: String| {
        if !path.starts_with('/') {
            return Err(mlua::Error::runtime("path must start with /"));
        }
        if path
            .bytes()
            .any(|b| b <= b' ' || b == 0x7f || b == b'?' || b == b'#')
        {
            return Err(mlua::Error::runtime(
                "path has characters a request path cannot hold",
            ));
        }
        with_request(|r, _| {
            r.upstream_path = Some(path);
            Ok(())
        })
    })?;
    set_fn(lua, &t, "set_raw_query", |_, query: String| {
        if query.bytes().any(|b| b <= b' ' || b == 0x7f || b == b'#') {
            return Err(mlua::Error::runtime(
                "query has characters a request line cannot hold",
            ));
        }
        with_request(|r, _| {
            r.upstream_query = Some(query);
            Ok(())
        })
    })?;
    set_fn(lua, &t, "set_query", |_, args: Table| {
        let q = encode_args(&args)?;
        with_request(|r, _| {
            r.upstream_query = Some(q);
            Ok(())
        })
    })?;
    set_fn(lua, &t, "set_raw_body", |_, body: LuaString| {
        let body = Bytes::copy_from_slice(&body.as_bytes());
        with_request(|r, phase| {
            if r.body.is_none() {
                return Err(mlua::Error::runtime(format!(
                    "the request body is not buffered in the {} phase",
                    phase.name()
                )));
            }
            r.body = Some(body);
            Ok(())
        })
    })?;
    Ok(t)
}

fn set_request_header(name: &LuaString, value: &Value, append: bool) -> mlua::Result<()> {
    let name = set_header_name(name)?;
    let values = header_values(&name, value)?;
    with_request(|r, _| {
        if name == http::header::HOST {
            // The upstream's Host is the proxy's to write: a plugin's choice is passed on.
            r.upstream_host = values.first().cloned();
        }
        if !append {
            r.headers.remove(&name);
        }
        for v in values {
            r.headers.append(name.clone(), v);
        }
        Ok(())
    })
}

fn service_response(lua: &Lua) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    set_fn(lua, &t, "get_status", |_, ()| {
        with_response(|h| Ok(h.from_upstream.then_some(h.status.as_u16())))
    })?;
    set_fn(lua, &t, "get_header", |lua, name: LuaString| {
        let name = header_name(&name)?;
        with_response(|h| {
            if h.from_upstream {
                header_value(lua, h.headers.get(&name))
            } else {
                Ok(Value::Nil)
            }
        })
    })?;
    set_fn(lua, &t, "get_headers", |lua, ()| {
        with_response(|h| headers_table(lua, h.headers))
    })?;
    Ok(t)
}

fn log(lua: &Lua) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    for (name, level) in [
        ("emerg", 1),
        ("alert", 2),
        ("crit", 3),
        ("err", 4),
        ("warn", 5),
        ("notice", 6),
        ("info", 7),
        ("debug", 8),
    ] {
        set_fn(lua, &t, name, move |_, args: MultiValue| {
            log_at(level, args)
        })?;
    }
    set_fn(lua, &t, "serialize", |lua, ()| {
        let json = with_log(|e| Ok(e.to_json()))?;
        lua.to_value(&json)
    })?;
    // `kong.log(...)` logs at notice.
    let meta = lua.create_table()?;
    set_fn(lua, &meta, "__call", |_, args: MultiValue| {
        let mut args = args;
        args.pop_front();
        log_at(6, args)
    })?;
    t.set_metatable(Some(meta))?;
    Ok(t)
}

/// A table whose reads and writes go to Rust (`kong.ctx`, `ngx.var`, `ngx.header`, `ngx.arg`):
/// `index` gets (table, key), `newindex` (table, key, value).
fn accessor_table<A, B, R>(
    lua: &Lua,
    index: impl Fn(&Lua, A) -> mlua::Result<R> + 'static,
    newindex: impl Fn(&Lua, B) -> mlua::Result<()> + 'static,
) -> mlua::Result<Table>
where
    A: mlua::FromLuaMulti,
    B: mlua::FromLuaMulti,
    R: mlua::IntoLuaMulti,
{
    let t = lua.create_table()?;
    let meta = lua.create_table()?;
    set_fn(lua, &meta, "__index", index)?;
    set_fn(lua, &meta, "__newindex", newindex)?;
    t.set_metatable(Some(meta))?;
    Ok(t)
}

fn kong_ctx(lua: &Lua) -> mlua::Result<Table> {
    accessor_table(
        lua,
        |lua, (_, k): (Table, String)| match k.as_str() {
            "shared" => ctx_table(lua, CtxTable::Shared).map(Value::Table),
            "plugin" => ctx_table(lua, CtxTable::Plugin).map(Value::Table),
            _ => Ok(Value::Nil),
        },
        |_, (_, k): (Table, String)| {
            Err::<(), _>(mlua::Error::runtime(format!(
                "Cannot modify kong.ctx.{k}. Protected by the sandbox."
            )))
        },
    )
}

fn ngx(lua: &Lua) -> mlua::Result<Table> {
    let ngx = lua.create_table()?;
    for (name, level) in LEVELS {
        ngx.set(name, level)?;
    }
    for (name, v) in [
        ("OK", 0),
        ("ERROR", -1),
        ("AGAIN", -2),
        ("DONE", -4),
        ("DECLINED", -5),
    ] {
        ngx.set(name, v)?;
    }
    for (name, code) in [
        ("HTTP_CONTINUE", 100),
        ("HTTP_SWITCHING_PROTOCOLS", 101),
        ("HTTP_OK", 200),
        ("HTTP_CREATED", 201),
        ("HTTP_ACCEPTED", 202),
        ("HTTP_NO_CONTENT", 204),
        ("HTTP_PARTIAL_CONTENT", 206),
        ("HTTP_SPECIAL_RESPONSE", 300),
        ("HTTP_MOVED_PERMANENTLY", 301),
        ("HTTP_MOVED_TEMPORARILY", 302),
        ("HTTP_SEE_OTHER", 303),
        ("HTTP_NOT_MODIFIED", 304),
        ("HTTP_TEMPORARY_REDIRECT", 307),
        ("HTTP_PERMANENT_REDIRECT", 308),
        ("HTTP_BAD_REQUEST", 400),
        ("HTTP_UNAUTHORIZED", 401),
        ("HTTP_PAYMENT_REQUIRED", 402),
        ("HTTP_FORBIDDEN", 403),
        ("HTTP_NOT_FOUND", 404),
        ("HTTP_NOT_ALLOWED", 405),
        ("HTTP_NOT_ACCEPTABLE", 406),
        ("HTTP_REQUEST_TIMEOUT", 408),
        ("HTTP_CONFLICT", 409),
        ("HTTP_GONE", 410),
        ("HTTP_UPGRADE_REQUIRED", 426),
        ("HTTP_TOO_MANY_REQUESTS", 429),
        ("HTTP_CLOSE", 444),
        ("HTTP_ILLEGAL", 451),
        ("HTTP_INTERNAL_SERVER_ERROR", 500),
        ("HTTP_METHOD_NOT_IMPLEMENTED", 501),
        ("HTTP_NOT_IMPLEMENTED", 501),
        ("HTTP_BAD_GATEWAY", 502),
        ("HTTP_SERVICE_UNAVAILABLE", 503),
        ("HTTP_GATEWAY_TIMEOUT", 504),
        ("HTTP_VERSION_NOT_SUPPORTED", 505),
        ("HTTP_INSUFFICIENT_STORAGE", 507),
    ] {
        ngx.set(name, code)?;
    }
    for m in [
        "GET", "HEAD", "PUT", "POST", "DELETE", "OPTIONS", "PATCH", "TRACE",
    ] {
        ngx.set(format!("HTTP_{m}"), m)?;
    }
    ngx.set("null", Value::NULL)?;
    set_fn(lua, &ngx, "log", |_, args: MultiValue| {
        let mut args = args;
        let level = match args.pop_front() {
            Some(Value::Integer(l)) => l,
            Some(Value::Number(l)) => l as i64,
            _ => {
                return Err(mlua::Error::runtime(
                    "bad argument #1 to 'log' (number expected)",
                ))
            }
        };
        log_at(level, args)
    })?;
    set_fn(lua, &ngx, "say", |_, args: MultiValue| {
        write_output(args, true)
    })?;
    set_fn(lua, &ngx, "print", |_, args: MultiValue| {
        write_output(args, false)
    })?;
    set_fn(lua, &ngx, "exit", |_, status: i64| {
        // ngx.OK (0) ends the function; a status ends the request with it.
        if status <= 0 {
            return stop::<()>();
        }
        let status = status_arg(status)?;
        let said = with_current(|c| Ok(std::mem::take(&mut c.said)))?;
        let exit = if !said.is_empty() {
            said_exit(status, said)
        } else if status.as_u16() >= 400 {
            Exit::message(status, &default_message(status))
        } else {
            Exit {
                status,
                headers: Vec::new(),
                body: Bytes::new(),
            }
        };
        record_exit(exit)?;
        stop::<()>()
    })?;
    set_fn(lua, &ngx, "time", |_, ()| Ok(crate::now_secs()))?;
    set_fn(lua, &ngx, "now", |_, ()| {
        Ok(std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| (d.as_millis() as f64) / 1000.0)
            .unwrap_or(0.0))
    })?;
    set_fn(lua, &ngx, "encode_base64", |_, s: LuaString| {
        use base64::Engine;
        Ok(base64::engine::general_purpose::STANDARD.encode(&*s.as_bytes()))
    })?;
    set_fn(lua, &ngx, "decode_base64", |lua, s: LuaString| {
        use base64::Engine;
        match base64::engine::general_purpose::STANDARD.decode(&*s.as_bytes()) {
            Ok(b) => Ok(Value::String(lua.create_string(b)?)),
            Err(_) => Ok(Value::Nil),
        }
    })?;
    set_fn(lua, &ngx, "escape_uri", |_, s: LuaString| {
        Ok(percent_encode(&s.as_bytes()))
    })?;
    set_fn(lua, &ngx, "unescape_uri", |lua, s: String| {
        lua.create_string(percent_decode(&s))
    })?;
    set_fn(lua, &ngx, "encode_args", |_, t: Table| encode_args(&t))?;
    set_fn(lua, &ngx, "decode_args", |lua, s: String| {
        args_table(lua, &s)
    })?;
    set_fn(lua, &ngx, "get_phase", |_, ()| {
        with_current(|c| Ok(c.phase.name()))
    })?;
    ngx.set("req", ngx_req(lua)?)?;
    ngx.set("var", ngx_var(lua)?)?;
    ngx.set("header", ngx_header(lua)?)?;
    ngx.set("arg", ngx_arg(lua)?)?;
    // ngx.ctx and ngx.status are per request: read through the metatable.
    let meta = lua.create_table()?;
    set_fn(
        lua,
        &meta,
        "__index",
        |lua, (_, k): (Table, String)| match k.as_str() {
            "ctx" => ctx_table(lua, CtxTable::Ngx).map(Value::Table),
            "status" => with_current(|c| match c.target {
                // SAFETY: as in `with_request`.
                Target::Response(p) => Ok(Value::Integer(unsafe { &*p }.status.as_u16() as i64)),
                Target::Log(p) => Ok(Value::Integer(unsafe { &*p }.status as i64)),
                _ => Ok(Value::Integer(0)),
            }),
            _ => Ok(Value::Nil),
        },
    )?;
    set_fn(
        lua,
        &meta,
        "__newindex",
        |_, (t, k, v): (Table, String, Value)| {
            match k.as_str() {
                "status" => {
                    let status = match v {
                        Value::Integer(s) => status_arg(s)?,
                        Value::Number(s) => status_arg(s as i64)?,
                        _ => return Err(mlua::Error::runtime("ngx.status must be a number")),
                    };
                    with_current(|c| match c.target {
                        // SAFETY: as in `with_request`.
                        Target::Response(p) => {
                            unsafe { &mut *p }.status = status;
                            Ok(())
                        }
                        // Before a response exists the status is the one ngx.exit will send.
                        _ => Ok(()),
                    })
                }
                "ctx" => Err(mlua::Error::runtime("ngx.ctx cannot be replaced here")),
                _ => t.raw_set(k, v),
            }
        },
    )?;
    ngx.set_metatable(Some(meta))?;
    Ok(ngx)
}

fn write_output(args: MultiValue, newline: bool) -> mlua::Result<()> {
    let mut out = Vec::new();
    // Nested arrays are written flat, as OpenResty does, to a bounded depth (a table that
    // contains itself would otherwise recurse until the stack ran out).
    fn push(out: &mut Vec<u8>, v: &Value, depth: u32) -> mlua::Result<()> {
        if depth > 32 {
            return Err(mlua::Error::runtime("tables nested too deep to write"));
        }
        match v {
            Value::String(s) => out.extend_from_slice(&s.as_bytes()),
            Value::Integer(i) => out.extend_from_slice(i.to_string().as_bytes()),
            Value::Number(n) => out.extend_from_slice(lua_number(*n).as_bytes()),
            Value::Boolean(b) => out.extend_from_slice(b.to_string().as_bytes()),
            Value::Nil => out.extend_from_slice(b"nil"),
            Value::Table(t) => {
                for v in t.sequence_values::<Value>() {
                    push(out, &v?, depth + 1)?;
                }
            }
            other => {
                return Err(mlua::Error::runtime(format!(
                    "cannot write a {}",
                    other.type_name()
                )))
            }
        }
        Ok(())
    }
    for v in args.iter() {
        push(&mut out, v, 0)?;
    }
    if newline {
        out.push(b'\n');
    }
    with_current(|c| match c.phase {
        Phase::Rewrite | Phase::Access => {
            c.said.extend_from_slice(&out);
            Ok(())
        }
        p => not_in_phase(p),
    })
}

fn ngx_req(lua: &Lua) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    set_fn(lua, &t, "get_headers", |lua, ()| {
        with_request(|r, _| headers_table(lua, r.headers))
    })?;
    set_fn(lua, &t, "get_method", |_, ()| {
        with_request(|r, _| Ok(r.method.to_string()))
    })?;
    set_fn(lua, &t, "get_uri_args", |lua, ()| {
        let q = with_request(|r, _| {
            Ok(r.upstream_query
                .clone()
                .unwrap_or_else(|| r.query.unwrap_or("").to_string()))
        })?;
        args_table(lua, &q)
    })?;
    set_fn(lua, &t, "set_uri_args", |_, args: Value| {
        let q = match args {
            Value::String(s) => s.to_str()?.to_string(),
            Value::Table(t) => encode_args(&t)?,
            _ => return Err(mlua::Error::runtime("args must be a string or a table")),
        };
        with_request(|r, _| {
            r.upstream_query = Some(q);
            Ok(())
        })
    })?;
    set_fn(
        lua,
        &t,
        "set_header",
        |_, (name, value): (LuaString, Value)| set_request_header(&name, &value, false),
    )?;
    set_fn(lua, &t, "clear_header", |_, name: LuaString| {
        set_request_header(&name, &Value::Nil, false)
    })?;
    set_fn(lua, &t, "read_body", |_, ()| Ok(()))?;
    set_fn(lua, &t, "get_body_data", |lua, ()| {
        with_request(|r, _| match &r.body {
            Some(b) => Ok(Value::String(lua.create_string(b)?)),
            None => Ok(Value::Nil),
        })
    })?;
    Ok(t)
}

/// `ngx.var`: the request's variables that mean the same here (read-only), and
/// `ngx.var.upstream_uri`, which may be set to change the path (and query) sent upstream.
fn ngx_var(lua: &Lua) -> mlua::Result<Table> {
    accessor_table(
        lua,
        |lua, (_, k): (Table, String)| {
            with_current(|c| {
                let s: Option<String> = match &c.target {
                    Target::Certificate { server_name } => match k.as_str() {
                        "ssl_server_name" => server_name.clone(),
                        _ => None,
                    },
                    Target::Request(p) => {
                        // SAFETY: as in `with_request`.
                        let r = unsafe { &**p };
                        match k.as_str() {
                            "uri" => Some(r.path.to_string()),
                            "request_uri" => Some(match r.query {
                                Some(q) => format!("{}?{q}", r.path),
                                None => r.path.to_string(),
                            }),
                            "args" | "query_string" => r.query.map(str::to_string),
                            "request_method" => Some(r.method.to_string()),
                            "scheme" => Some(if r.tls { "https" } else { "http" }.to_string()),
                            "https" => Some(if r.tls { "on" } else { "" }.to_string()),
                            "host" => Some(request_host(&View::Req(r)).0),
                            "server_port" => Some(request_host(&View::Req(r)).1.to_string()),
                            "remote_addr" | "realip_remote_addr" => Some(r.client_ip.to_string()),
                            "upstream_uri" => r.upstream_path.clone(),
                            other => other.strip_prefix("http_").and_then(|h| {
                                let name =
                                    HeaderName::from_bytes(h.replace('_', "-").as_bytes()).ok()?;
                                r.header(&name)
                                    .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                            }),
                        }
                    }
                    Target::Log(p) => {
                        // SAFETY: as in `with_request`.
                        let e = unsafe { &**p };
                        match k.as_str() {
                            "status" => Some(e.status.to_string()),
                            "request_method" => e.details.map(|d| d.method.to_string()),
                            "request_uri" => e.details.map(|d| d.uri.to_string()),
                            "remote_addr" => e.details.map(|d| d.client_ip.to_string()),
                            _ => None,
                        }
                    }
                    _ => None,
                };
                s.map_or(Ok(Value::Nil), |s| Ok(Value::String(lua.create_string(s)?)))
            })
        },
        |_, (_, k, v): (Table, String, Value)| {
            if k != "upstream_uri" {
                return Err::<(), _>(mlua::Error::runtime(format!(
                    "variable \"{k}\" cannot be changed"
                )));
            }
            let Value::String(s) = v else {
                return Err(mlua::Error::runtime("upstream_uri must be a string"));
            };
            let s = s.to_str()?.to_string();
            if !s.starts_with('/') || s.bytes().any(|b| b <= b' ' || b == 0x7f || b == b'#') {
                return Err(mlua::Error::runtime(
                    "upstream_uri must be a path, with no spaces",
                ));
            }
            with_request(|r, _| {
                match s.split_once('?') {
                    Some((p, q)) => {
                        r.upstream_path = Some(p.to_string());
                        r.upstream_query = Some(q.to_string());
                    }
                    None => {
                        r.upstream_path = Some(s);
                        r.upstream_query = Some(String::new());
                    }
                }
                Ok(())
            })
        },
    )
}

/// `ngx.header`: the response's headers (header_filter), or headers for the response to come
/// (rewrite, access).
fn ngx_header(lua: &Lua) -> mlua::Result<Table> {
    accessor_table(
        lua,
        |lua, (_, k): (Table, LuaString)| {
            let name = header_name(&k)?;
            with_current(|c| match c.target {
                // SAFETY: as in `with_request`.
                Target::Response(p) => {
                    let h = unsafe { &*p };
                    let all: Vec<&HeaderValue> = h.headers.get_all(&name).iter().collect();
                    match all.len() {
                        0 => Ok(Value::Nil),
                        1 => header_value(lua, Some(all[0])),
                        _ => Ok(Value::Table(
                            lua.create_sequence_from(
                                all.iter()
                                    .map(|v| lua.create_string(v.as_bytes()))
                                    .collect::<mlua::Result<Vec<_>>>()?,
                            )?,
                        )),
                    }
                }
                Target::Request(p) => {
                    let r = unsafe { &*p };
                    let v = r.response_headers.iter().rev().find(|(n, _)| *n == name);
                    header_value(lua, v.map(|(_, v)| v))
                }
                _ => Ok(Value::Nil),
            })
        },
        |lua, (_, k, v): (Table, LuaString, Value)| {
            // ngx.header uses `_` for `-` as well.
            let name = header_name(&k)?;
            let name = lua.create_string(name.as_str())?;
            set_response_header(&name, &v, false)
        },
    )
}

/// `ngx.arg` in body_filter: `[1]` the piece, `[2]` whether the body ended.
fn ngx_arg(lua: &Lua) -> mlua::Result<Table> {
    accessor_table(
        lua,
        |lua, (_, k): (Table, i64)| {
            with_body(|b| match k {
                1 => Ok(Value::String(
                    lua.create_string(b.piece.as_deref().unwrap_or(b""))?,
                )),
                2 => Ok(Value::Boolean(b.eof)),
                _ => Ok(Value::Nil),
            })
        },
        |_, (_, k, v): (Table, i64, Value)| {
            with_body(|b| match (k, v) {
                (1, Value::String(s)) => {
                    b.piece = Some(Bytes::copy_from_slice(&s.as_bytes()));
                    Ok(())
                }
                (1, Value::Nil) => {
                    b.piece = None;
                    Ok(())
                }
                (2, Value::Boolean(eof)) => {
                    b.eof = eof;
                    Ok(())
                }
                _ => Err(mlua::Error::runtime("ngx.arg[1] takes a string or nil")),
            })
        },
    )
}

/// Modules `require` may load: `cjson` and `cjson.safe` (JSON, as in Kong).
pub(super) fn modules(lua: &Lua) -> mlua::Result<Table> {
    let modules = lua.create_table()?;
    for (name, safe) in [("cjson", false), ("cjson.safe", true)] {
        let m = lua.create_table()?;
        m.set("null", Value::NULL)?;
        set_fn(lua, &m, "encode", move |lua, v: Value| {
            let json: Result<serde_json::Value, _> = lua.from_value(v);
            match json
                .map_err(|e| e.to_string())
                .and_then(|j| serde_json::to_string(&j).map_err(|e| e.to_string()))
            {
                Ok(s) => Ok((Value::String(lua.create_string(s)?), Value::Nil)),
                Err(e) if safe => Ok((Value::Nil, Value::String(lua.create_string(e)?))),
                Err(e) => Err(mlua::Error::runtime(format!("Cannot serialise: {e}"))),
            }
        })?;
        set_fn(
            lua,
            &m,
            "decode",
            move |lua, s: LuaString| match serde_json::from_slice::<serde_json::Value>(
                &s.as_bytes(),
            ) {
                Ok(v) => Ok((lua.to_value(&v)?, Value::Nil)),
                Err(e) if safe => {
                    Ok((Value::Nil, Value::String(lua.create_string(e.to_string())?)))
                }
                Err(e) => Err(mlua::Error::runtime(format!("Expected value: {e}"))),
            },
        )?;
        modules.set(name, m)?;
    }
    Ok(modules)
}
