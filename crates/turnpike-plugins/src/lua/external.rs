//! The PDK as an external plugin server reaches it (`crate::pluginserver`): a call by name
//! (`kong.request.get_header`) with MessagePack arguments, answered by the same Lua PDK a Lua
//! plugin calls, in the request's phase, as Kong's `mp_rpc.lua` answers one (`call_pdk_method`
//! over its `exposed_api`). Only the first value a function returns goes back, as in Kong.

use std::sync::Arc;

use mlua::{Function, Lua, Value};

use super::{with_runtime, Phase, Settings, Target, CURRENT};
use crate::{AccessRequest, Exit, PluginCtx};

/// What a PDK call gave.
#[derive(Debug)]
pub enum PdkAnswer {
    Value(rmpv::Value),
    /// The function failed (or does not exist): the plugin server gets `plugin.StepError`.
    Error(String),
    /// The function answered the request (`kong.response.exit`).
    Exit(Exit),
}

/// Kong's `exposed_api` entries that are not plain PDK functions, and the look-up of the rest
/// by their dotted name.
const EXPOSED: &str = r##"
local cjson = require "cjson.safe"
local api = {
  ["kong.log.serialize"] = function() return (cjson.encode(kong.log.serialize())) end,
  ["kong.nginx.get_var"] = function(v) return ngx.var[v] end,
  ["kong.nginx.get_ctx"] = function(k) return ngx.ctx[k] end,
  ["kong.nginx.set_ctx"] = function(k, v) ngx.ctx[k] = v end,
  ["kong.ctx.shared.get"] = function(k) return kong.ctx.shared[k] end,
  ["kong.ctx.shared.set"] = function(k, v) kong.ctx.shared[k] = v end,
  ["kong.nginx.req_start_time"] = function() return ngx.req.start_time() end,
}
return function(name)
  local f = api[name]
  if f then return f end
  local t = _G
  for segment in name:gmatch("[%w_]+") do
    if type(t) ~= "table" then return nil end
    t = t[segment]
  end
  if type(t) == "function" then return t end
  return nil
end
"##;

/// The methods whose answer Kong reshapes (`must_fix` of `mp_rpc.lua`).
fn fix(method: &str) -> Fix {
    match method {
        "kong.request.get_query"
        | "kong.request.get_headers"
        | "kong.response.get_headers"
        | "kong.service.response.get_headers" => Fix::MultiMap,
        "kong.request.get_raw_body"
        | "kong.response.get_raw_body"
        | "kong.service.response.get_raw_body" => Fix::Binary,
        _ => Fix::None,
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Fix {
    None,
    /// Every value a list (`true` an empty one, a string a list of one); empty: a map.
    MultiMap,
    /// A string as MessagePack binary.
    Binary,
}

/// Calls the PDK function `method` with `args` (a MessagePack array: the arguments) for the
/// request `req` in `phase` (rewrite or access).
pub fn call_pdk(
    settings: &Arc<Settings>,
    who: Caller<'_>,
    phase: Phase,
    req: &mut AccessRequest<'_>,
    method: &str,
    args: &rmpv::Value,
) -> PdkAnswer {
    let ctx: *mut PluginCtx = &mut *req.ctx;
    let target = Target::Request(std::ptr::from_mut(req).cast());
    call_on(settings, who, phase, target, ctx, method, args)
}

/// Who calls: the plugin's name, the config's id in the worker's state, and the snapshot's
/// view its calls read (`kong.db`, `kong.client.load_consumer`, `kong.vault`).
pub type Caller<'a> = (&'static str, u64, Option<&'a Arc<super::db::Dao>>);

/// As [`call_pdk`], for the response phase: the PDK sees the buffered response `head`.
pub fn call_pdk_response(
    settings: &Arc<Settings>,
    who: Caller<'_>,
    head: &mut crate::ResponseHead<'_>,
    method: &str,
    args: &rmpv::Value,
) -> PdkAnswer {
    let ctx: *mut PluginCtx = &mut *head.ctx;
    let target = Target::Response(std::ptr::from_mut(head).cast());
    call_on(settings, who, Phase::Response, target, ctx, method, args)
}

fn call_on(
    settings: &Arc<Settings>,
    (plugin, plugin_id, dao): Caller<'_>,
    phase: Phase,
    target: Target,
    ctx: *mut PluginCtx,
    method: &str,
    args: &rmpv::Value,
) -> PdkAnswer {
    let _dao = super::db::enter(dao);
    let _guard = super::enter(target, phase, plugin, plugin_id, ctx, false);
    let answer = with_runtime(settings, |rt| {
        let lookup = match &rt.exposed {
            Some(f) => f.clone(),
            None => {
                let f: Function = match rt
                    .lua
                    .load(EXPOSED)
                    .set_name("=turnpike.pluginserver")
                    .call(())
                {
                    Ok(f) => f,
                    Err(e) => return PdkAnswer::Error(e.to_string()),
                };
                rt.exposed = Some(f.clone());
                f
            }
        };
        let function = match lookup.call::<Option<Function>>(method) {
            Ok(Some(f)) => f,
            Ok(None) => {
                return PdkAnswer::Error(format!(
                    "PDK function '{method}' is not implemented by Turnpike"
                ))
            }
            Err(e) => return PdkAnswer::Error(e.to_string()),
        };
        let lua = &rt.lua;
        let args: mlua::Result<Vec<Value>> = match args {
            rmpv::Value::Array(items) => items.iter().map(|a| to_lua(lua, a)).collect(),
            rmpv::Value::Nil => Ok(Vec::new()),
            one => to_lua(lua, one).map(|v| vec![v]),
        };
        let result =
            args.and_then(|a| function.call::<mlua::MultiValue>(mlua::MultiValue::from_vec(a)));
        let exit = CURRENT.with(|c| c.borrow_mut().exit.take());
        if let Some(e) = exit {
            return PdkAnswer::Exit(e);
        }
        match result {
            Ok(values) => {
                let first = values.into_iter().next().unwrap_or(Value::Nil);
                PdkAnswer::Value(from_lua(&first, fix(method)))
            }
            Err(e) if super::pdk::is_stop(&e) => PdkAnswer::Value(rmpv::Value::Nil),
            Err(e) => PdkAnswer::Error(super::first_line(&e.to_string()).to_string()),
        }
    });
    answer.unwrap_or_else(PdkAnswer::Error)
}

/// A MessagePack value as Lua's: maps as tables, binary and text as strings.
fn to_lua(lua: &Lua, v: &rmpv::Value) -> mlua::Result<Value> {
    use rmpv::Value as M;
    Ok(match v {
        M::Nil => Value::Nil,
        M::Boolean(b) => Value::Boolean(*b),
        M::Integer(i) => match i.as_i64() {
            Some(n) => Value::Integer(n),
            None => Value::Number(i.as_f64().unwrap_or(0.0)),
        },
        M::F32(f) => Value::Number(*f as f64),
        M::F64(f) => Value::Number(*f),
        M::String(s) => Value::String(lua.create_string(s.as_bytes())?),
        M::Binary(b) => Value::String(lua.create_string(b)?),
        M::Array(items) => {
            let t = lua.create_table_with_capacity(items.len(), 0)?;
            for (i, item) in items.iter().enumerate() {
                t.raw_set(i + 1, to_lua(lua, item)?)?;
            }
            Value::Table(t)
        }
        M::Map(entries) => {
            let t = lua.create_table_with_capacity(0, entries.len())?;
            for (k, v) in entries {
                let key = to_lua(lua, k)?;
                if !key.is_nil() {
                    t.raw_set(key, to_lua(lua, v)?)?;
                }
            }
            Value::Table(t)
        }
        M::Ext(..) => Value::Nil,
    })
}

/// A Lua value as MessagePack, as lua-MessagePack packs it for Kong: integral numbers as
/// integers, a table with keys 1..n as an array, other tables as maps, `cjson.null` as nil.
fn from_lua(v: &Value, fix: Fix) -> rmpv::Value {
    use rmpv::Value as M;
    match v {
        Value::Nil | Value::LightUserData(_) => M::Nil,
        Value::Boolean(b) => M::Boolean(*b),
        Value::Integer(n) => M::from(*n),
        Value::Number(f) => {
            if f.fract() == 0.0 && f.abs() < 9.0e15 {
                M::from(*f as i64)
            } else {
                M::F64(*f)
            }
        }
        Value::String(s) => {
            let bytes = s.as_bytes();
            match (fix, std::str::from_utf8(&bytes)) {
                (Fix::Binary, _) | (_, Err(_)) => M::Binary(bytes.to_vec()),
                (_, Ok(text)) => M::from(text),
            }
        }
        Value::Table(t) => {
            let len = t.raw_len();
            let pairs: Vec<(Value, Value)> = t.clone().pairs::<Value, Value>().flatten().collect();
            if fix == Fix::MultiMap {
                if pairs.is_empty() {
                    return M::Map(Vec::new());
                }
                return M::Map(
                    pairs
                        .iter()
                        .map(|(k, v)| {
                            let v = match v {
                                Value::Boolean(true) => M::Array(Vec::new()),
                                Value::String(_) => M::Array(vec![from_lua(v, Fix::None)]),
                                other => from_lua(other, Fix::None),
                            };
                            (from_lua(k, Fix::None), v)
                        })
                        .collect(),
                );
            }
            if pairs.len() == len {
                M::Array(
                    (1..=len)
                        .map(|i| from_lua(&t.raw_get(i).unwrap_or(Value::Nil), Fix::None))
                        .collect(),
                )
            } else {
                M::Map(
                    pairs
                        .iter()
                        .map(|(k, v)| (from_lua(k, Fix::None), from_lua(v, Fix::None)))
                        .collect(),
                )
            }
        }
        _ => M::Nil,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_cross_as_lua_messagepack_packs_them() {
        let lua = Lua::new();
        let m = rmpv::Value::Map(vec![
            ("a".into(), rmpv::Value::Array(vec![1.into(), 2.5.into()])),
            ("b".into(), rmpv::Value::Binary(vec![0xff, 0])),
        ]);
        let v = to_lua(&lua, &m).unwrap();
        let back = from_lua(&v, Fix::None);
        let map = back.as_map().unwrap();
        let a = map.iter().find(|(k, _)| k.as_str() == Some("a")).unwrap();
        assert_eq!(a.1, rmpv::Value::Array(vec![1.into(), 2.5.into()]));
        let b = map.iter().find(|(k, _)| k.as_str() == Some("b")).unwrap();
        assert_eq!(b.1, rmpv::Value::Binary(vec![0xff, 0]));
        // Integral floats go as integers; an empty table as an empty array.
        assert_eq!(
            from_lua(&Value::Number(3.0), Fix::None),
            rmpv::Value::from(3)
        );
        let empty = Value::Table(lua.create_table().unwrap());
        assert_eq!(from_lua(&empty, Fix::None), rmpv::Value::Array(vec![]));
        assert_eq!(from_lua(&empty, Fix::MultiMap), rmpv::Value::Map(vec![]));
        // Headers: a single value becomes a list of one; `true` an empty list.
        let h = lua.create_table().unwrap();
        h.set("x", "1").unwrap();
        h.set("flag", true).unwrap();
        let mm = from_lua(&Value::Table(h), Fix::MultiMap);
        let mm = mm.as_map().unwrap();
        let x = mm.iter().find(|(k, _)| k.as_str() == Some("x")).unwrap();
        assert_eq!(x.1, rmpv::Value::Array(vec!["1".into()]));
        let f = mm.iter().find(|(k, _)| k.as_str() == Some("flag")).unwrap();
        assert_eq!(f.1, rmpv::Value::Array(vec![]));
        let s = Value::String(lua.create_string("body").unwrap());
        assert_eq!(
            from_lua(&s, Fix::Binary),
            rmpv::Value::Binary(b"body".to_vec())
        );
    }
}
