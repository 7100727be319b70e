//! `kong.ctx`: per-request tables shared between plugins and phases.

use super::*;

/// A table whose reads and writes go to Rust (`kong.ctx`, `ngx.var`, `ngx.header`, `ngx.arg`):
/// `index` gets (table, key), `newindex` (table, key, value).
pub(super) fn accessor_table<A, B, R>(
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

pub(super) fn kong_ctx(lua: &Lua) -> mlua::Result<Table> {
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
