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
