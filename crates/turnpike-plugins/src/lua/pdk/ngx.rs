//! `ngx.*`: the OpenResty API serverless code calls (`ngx.req`, `ngx.var`, `ngx.header`, `ngx.arg`, `ngx.exit`, `ngx.say`).

use super::*;

pub(super) fn ngx(lua: &Lua) -> mlua::Result<Table> {
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
    set_fn(lua, &ngx, "log", |lua, args: MultiValue| {
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
        log_at(lua, level, args)
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
    super::ngx_re::install(lua, &ngx)?;
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

pub(super) fn write_output(args: MultiValue, newline: bool) -> mlua::Result<()> {
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

pub(super) fn ngx_req(lua: &Lua) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    set_fn(lua, &t, "get_headers", |lua, ()| {
        with_request(|r, _| headers_table(lua, r.headers))
    })?;
    set_fn(lua, &t, "get_method", |_, ()| {
        with_request(|r, _| Ok(r.method.to_string()))
    })?;
    set_fn(lua, &t, "get_uri_args", |lua, ()| {
        let q = with_request(|r, _| {
            Ok(r.upstream
                .query
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
            r.upstream.query = Some(q);
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
    // The form body's arguments (`application/x-www-form-urlencoded`), as OpenResty's: a name
    // with several values a list; nil and an error when the body was not read.
    set_fn(lua, &t, "get_post_args", |lua, _max: Option<i64>| {
        let body = with_request(|r, _| Ok(r.body.clone()))?;
        match body {
            Some(b) => {
                let text = String::from_utf8_lossy(&b).into_owned();
                Ok((Value::Table(args_table(lua, &text)?), Value::Nil))
            }
            None => Ok((
                Value::Nil,
                Value::String(lua.create_string("request body not read")?),
            )),
        }
    })?;
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
pub(super) fn ngx_var(lua: &Lua) -> mlua::Result<Table> {
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
                            "upstream_uri" => r.upstream.path.clone(),
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
                        r.upstream.path = Some(p.to_string());
                        r.upstream.query = Some(q.to_string());
                    }
                    None => {
                        r.upstream.path = Some(s);
                        r.upstream.query = Some(String::new());
                    }
                }
                Ok(())
            })
        },
    )
}

/// `ngx.header`: the response's headers (header_filter), or headers for the response to come
/// (rewrite, access).
pub(super) fn ngx_header(lua: &Lua) -> mlua::Result<Table> {
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
pub(super) fn ngx_arg(lua: &Lua) -> mlua::Result<Table> {
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
