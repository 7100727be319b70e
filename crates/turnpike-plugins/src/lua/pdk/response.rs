//! `kong.response`: the response to the client (headers, status, exit).

use super::*;

pub(super) fn response(lua: &Lua) -> mlua::Result<Table> {
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
            Target::StreamLog(p) => Ok(unsafe { &*p }.status),
            _ => not_in_phase(c.phase),
        })
    })?;
    set_fn(lua, &t, "set_status", |_, status: i64| {
        let status = status_arg(status)?;
        with_current(|c| match c.target {
            // SAFETY: as in `with_request`.
            Target::Response(p) => {
                unsafe { &mut *p }.status = status;
                Ok(())
            }
            // Before a response exists: the status it will have (an Admin API handler's).
            Target::Request(_) => {
                c.status = Some(status);
                Ok(())
            }
            _ => not_in_phase(c.phase),
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
pub(super) fn header_setters(
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
pub(super) fn set_response_header(
    name: &LuaString,
    value: &Value,
    append: bool,
) -> mlua::Result<()> {
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
