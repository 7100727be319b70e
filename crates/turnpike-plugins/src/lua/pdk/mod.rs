//! The part of Kong's PDK (`kong.*`) and of OpenResty's `ngx.*` that serverless code can call.
//!
//! Every function reaches the request through `CURRENT` (set for the length of one call) and
//! checks that the phase has what it asks for, with Kong's message when it does not. A
//! function that ends the request (`kong.response.exit`, `ngx.exit`) records the response and
//! raises an error that unwinds the Lua code; the runner sees the recorded response first, so
//! a `pcall` around the call cannot swallow it.
//!
//! One file per namespace, as Kong's `pdk/` is (`request`, `client`, `router`, `response`,
//! `service`, `log`, `ctx`, and `ngx` for OpenResty's API); this file holds what they share:
//! the current call, header and argument conversions, exits, and `install`.

use std::fmt;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use mlua::{Lua, LuaSerdeExt, LuaString, MultiValue, Table, Value};

use super::{BodyChunk, Current, LuaCtx, Phase, Target, CURRENT};
use crate::{AccessRequest, Exit, ResponseHead};

mod client;
mod ctx;
mod log;
mod ngx;
mod ngx_misc;
mod ngx_re;
mod node;
mod request;
mod response;
mod router;
mod service;

use client::*;
use ctx::*;
use log::*;
use ngx::*;
pub(super) use ngx_misc::install_misc;
pub(super) use node::{install_ip, install_node};
use request::*;
use response::*;
use router::*;
use service::*;

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
    fn header(&self, name: &HeaderName) -> Option<std::borrow::Cow<'_, HeaderValue>> {
        match self {
            View::Req(r) => r.header(name),
            View::Log(d) => d.request_headers.get(name).map(std::borrow::Cow::Borrowed),
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
    // `from_bytes` lowercases as it parses (no copy for a name already in lowercase).
    HeaderName::from_bytes(&name.as_bytes())
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

/// Records a response that ends the request (Kong's phases that may: rewrite, access,
/// response, and header_filter, whose exit replaces the body to come).
fn record_exit(exit: Exit) -> mlua::Result<()> {
    with_current(|c| match c.phase {
        Phase::Rewrite | Phase::Access | Phase::Response | Phase::HeaderFilter => {
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
    let lc = ctx.get_or_insert_with(|| {
        Ok(LuaCtx {
            shared: lua.create_table()?,
            ngx: lua.create_table()?,
            plugin: Default::default(),
        })
    })?;
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

fn log_at(lua: &Lua, level: i64, args: MultiValue) -> mlua::Result<()> {
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
    let (plugin, ctx, keep) = with_current(|c| Ok((c.plugin, c.ctx, c.keep_logs)))?;
    match level {
        0..=4 => tracing::error!(target: "turnpike::lua", "[{plugin}] {msg}"),
        5 => tracing::warn!(target: "turnpike::lua", "[{plugin}] {msg}"),
        6 | 7 => tracing::info!(target: "turnpike::lua", "[{plugin}] {msg}"),
        _ => tracing::debug!(target: "turnpike::lua", "[{plugin}] {msg}"),
    }
    if !keep || ctx.is_null() || msg.is_empty() {
        return Ok(());
    }
    let enabled = match level {
        0..=4 => tracing::enabled!(target: "turnpike::lua", tracing::Level::ERROR),
        5 => tracing::enabled!(target: "turnpike::lua", tracing::Level::WARN),
        6 | 7 => tracing::enabled!(target: "turnpike::lua", tracing::Level::INFO),
        _ => tracing::enabled!(target: "turnpike::lua", tracing::Level::DEBUG),
    };
    // A request's line at or above the node's log level is kept for OTLP logs (Kong's
    // `kong.observability.logs`), with where in the code it was written.
    if enabled {
        let mut log = crate::request_logs::RequestLog {
            time_ns: crate::clock::now_ns(),
            level: level.clamp(1, 8) as u8,
            body: msg,
            source: None,
            line: None,
            name: None,
            namewhat: None,
            what: "C",
        };
        lua.inspect_stack(1, |d| {
            let names = d.names();
            let source = d.source();
            log.source = source.source.map(|s| s.into_owned());
            log.what = source.what;
            log.line = d.current_line();
            log.name = names.name.map(|n| n.into_owned());
            log.namewhat = names.name_what;
        });
        // SAFETY: `ctx` was set by the runtime from the request's live `&mut PluginCtx` for the
        // length of this Lua call, as the phase's target was.
        let ctx = unsafe { &mut *ctx };
        if let Ok(logs) = ctx.get_or_insert_with(|| Ok(crate::request_logs::RequestLogs::default()))
        {
            logs.push(log);
        }
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
    service_functions(lua, &service)?;
    kong.set("service", service)?;
    kong.set("log", log(lua)?)?;
    kong.set("ctx", kong_ctx(lua)?)?;
    // kong.plugin.get_id: the running plugin entity's id (an operator's plugin's).
    let plugin = lua.create_table()?;
    set_fn(lua, &plugin, "get_id", |_, ()| {
        with_current(|c| match &c.config_id {
            Some(id) => Ok(id.to_string()),
            None => Err(mlua::Error::runtime(
                "kong.plugin.get_id: no plugin entity for this code",
            )),
        })
    })?;
    kong.set("plugin", plugin)?;
    let ngx = ngx(lua)?;
    // kong.nginx and kong.log.deprecation, over what is above.
    lua.load(
        r#"local kong, ngx = ...
        kong.nginx = {
          get_subsystem = function() return "http" end,
          get_ctx = function(k) return ngx.ctx[k] end,
          set_ctx = function(k, v) ngx.ctx[k] = v end,
        }
        kong.log.deprecation = function(...) return kong.log.warn("deprecation: ", ...) end"#,
    )
    .set_name("=kong.nginx")
    .call::<()>((kong.clone(), ngx.clone()))?;
    Ok((kong, ngx))
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
