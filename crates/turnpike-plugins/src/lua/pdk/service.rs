//! `kong.service.request` / `kong.service.response`: what goes to and comes from the upstream.

use super::*;

pub(super) fn service_request(lua: &Lua) -> mlua::Result<Table> {
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
            r.upstream.path = Some(path);
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
            r.upstream.query = Some(query);
            Ok(())
        })
    })?;
    set_fn(lua, &t, "set_query", |_, args: Table| {
        let q = encode_args(&args)?;
        with_request(|r, _| {
            r.upstream.query = Some(q);
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

pub(super) fn set_request_header(
    name: &LuaString,
    value: &Value,
    append: bool,
) -> mlua::Result<()> {
    let name = set_header_name(name)?;
    let values = header_values(&name, value)?;
    with_request(|r, _| {
        if name == http::header::HOST {
            // The upstream's Host is the proxy's to write: a plugin's choice is passed on.
            r.upstream.host = values.first().cloned();
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

pub(super) fn service_response(lua: &Lua) -> mlua::Result<Table> {
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
