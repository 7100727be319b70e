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
