//! `kong.router`: the matched route and service.

use super::*;

pub(super) fn router(lua: &Lua) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    set_fn(lua, &t, "get_route", |lua, ()| {
        let entity = with_current(|c| match c.target {
            // SAFETY: as in `with_request`.
            Target::Request(p) => {
                let r = unsafe { &*p };
                Ok((!r.route_id.is_empty()).then(|| serde_json::json!({ "id": r.route_id })))
            }
            Target::Log(p) => Ok(Some(route_json(unsafe { &*p }.route))),
            Target::StreamLog(p) => Ok(Some(route_json(unsafe { &*p }.route))),
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
            Target::Log(p) => Ok(unsafe { &*p }.service.map(service_json)),
            Target::StreamLog(p) => Ok(unsafe { &*p }.service.map(service_json)),
            _ => not_in_phase(c.phase),
        })?;
        entity.map_or(Ok(Value::Nil), |v| lua.to_value(&v))
    })?;
    Ok(t)
}

fn route_json(route: &turnpike_config::declarative::Route) -> serde_json::Value {
    serde_json::json!({ "id": route.id, "name": route.name, "paths": route.paths })
}

fn service_json(s: &turnpike_config::declarative::Service) -> serde_json::Value {
    serde_json::json!({
        "id": s.id, "name": s.name, "host": s.host, "port": s.port,
        "protocol": s.protocol, "path": s.path,
    })
}
