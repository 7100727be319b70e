//! `kong.log`: logging at Kong's levels, and the serialized log entry.

use super::*;

pub(super) fn log(lua: &Lua) -> mlua::Result<Table> {
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
        set_fn(lua, &t, name, move |lua, args: MultiValue| {
            log_at(lua, level, args)
        })?;
    }
    // Kong's `kong.log.set_serialize_value(key, value, { mode = "set" | "add" | "replace" })`:
    // the request's serialized entry, as every log plugin after it sees it.
    set_fn(
        lua,
        &t,
        "set_serialize_value",
        |lua, (key, value, options): (Value, Value, Option<Table>)| {
            let Value::String(key) = key else {
                return Err(mlua::Error::runtime("key must be a string"));
            };
            let key = key.to_str()?.to_string();
            let mode = match options {
                None => crate::log::SetMode::Set,
                Some(o) => match o.get::<Option<String>>("mode")?.as_deref() {
                    None | Some("set") => crate::log::SetMode::Set,
                    Some("add") => crate::log::SetMode::Add,
                    Some("replace") => crate::log::SetMode::Replace,
                    Some(_) => {
                        return Err(mlua::Error::runtime(
                            "mode must be 'set', 'add' or 'replace'",
                        ))
                    }
                },
            };
            let value = match value {
                Value::Nil => None,
                Value::Boolean(_)
                | Value::Integer(_)
                | Value::Number(_)
                | Value::String(_)
                | Value::Table(_) => Some(lua.from_value::<serde_json::Value>(value)?),
                _ => {
                    return Err(mlua::Error::runtime(
                        "value must be a number, string, boolean, table or nil",
                    ))
                }
            };
            with_current(|c| {
                if c.ctx.is_null() {
                    return not_in_phase(c.phase);
                }
                // SAFETY: the runtime set `ctx` from the request's live context for this call.
                let ctx = unsafe { &mut *c.ctx };
                match ctx.get_mut::<crate::log::SerializeValues>() {
                    Some(set) => set.0.push((key, value, mode)),
                    None => ctx.insert(crate::log::SerializeValues(vec![(key, value, mode)])),
                }
                Ok(())
            })
        },
    )?;
    set_fn(lua, &t, "serialize", |lua, ()| {
        let json = with_log(|e| Ok(e.to_json()))?;
        lua.to_value(&json)
    })?;
    // `kong.log.inspect(...)`: its arguments pretty-printed at debug (tables as JSON), with
    // `inspect.on()` / `inspect.off()` turning it on and off, as Kong's.
    let inspect = lua.create_table()?;
    inspect.set("enabled", true)?;
    set_fn(lua, &inspect, "on", |lua, ()| {
        let t: Table = lua.named_registry_value("turnpike.inspect")?;
        t.set("enabled", true)
    })?;
    set_fn(lua, &inspect, "off", |lua, ()| {
        let t: Table = lua.named_registry_value("turnpike.inspect")?;
        t.set("enabled", false)
    })?;
    lua.set_named_registry_value("turnpike.inspect", inspect.clone())?;
    let inspect_meta = lua.create_table()?;
    set_fn(lua, &inspect_meta, "__call", |lua, args: MultiValue| {
        let mut args = args;
        let this = match args.pop_front() {
            Some(Value::Table(t)) => t,
            _ => return Ok(()),
        };
        if !this.get::<bool>("enabled").unwrap_or(true) {
            return Ok(());
        }
        let mut shown = MultiValue::new();
        for v in args {
            let text = match &v {
                Value::Table(_) => lua
                    .from_value::<serde_json::Value>(v.clone())
                    .ok()
                    .and_then(|j| serde_json::to_string_pretty(&j).ok())
                    .unwrap_or_else(|| "<table>".into()),
                other => other.to_string().unwrap_or_default(),
            };
            shown.push_back(Value::String(lua.create_string(text)?));
        }
        log_at(lua, 8, shown)
    })?;
    inspect.set_metatable(Some(inspect_meta))?;
    t.set("inspect", inspect)?;
    // `kong.log(...)` logs at notice.
    let meta = lua.create_table()?;
    set_fn(lua, &meta, "__call", |lua, args: MultiValue| {
        let mut args = args;
        args.pop_front();
        log_at(lua, 6, args)
    })?;
    t.set_metatable(Some(meta))?;
    Ok(t)
}
