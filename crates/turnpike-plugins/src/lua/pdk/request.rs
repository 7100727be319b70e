//! `kong.request`: the request as the client sent it.

use super::*;

pub(super) fn request(lua: &Lua) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    set_fn(lua, &t, "get_method", |_, ()| {
        with_view(|r| Ok(r.method().to_string()))
    })?;
    set_fn(lua, &t, "get_path", |_, ()| {
        with_view(|r| Ok(r.path().to_string()))
    })?;
    set_fn(lua, &t, "get_raw_path", |_, ()| {
        with_view(|r| Ok(r.path().to_string()))
    })?;
    set_fn(lua, &t, "get_path_with_query", |_, ()| {
        with_view(|r| {
            Ok(match r.query() {
                Some(q) => format!("{}?{q}", r.path()),
                None => r.path().to_string(),
            })
        })
    })?;
    set_fn(lua, &t, "get_raw_query", |_, ()| {
        with_view(|r| Ok(r.query().unwrap_or("").to_string()))
    })?;
    set_fn(lua, &t, "get_query", |lua, ()| {
        let q = with_view(|r| Ok(r.query().unwrap_or("").to_string()))?;
        args_table(lua, &q)
    })?;
    set_fn(lua, &t, "get_query_arg", |lua, name: LuaString| {
        let q = with_view(|r| Ok(r.query().unwrap_or("").to_string()))?;
        let args = args_table(lua, &q)?;
        match args.raw_get::<Value>(name)? {
            Value::Table(arr) => arr.get::<Value>(1),
            v => Ok(v),
        }
    })?;
    set_fn(lua, &t, "get_header", |lua, name: LuaString| {
        let name = header_name(&name)?;
        with_view(|r| header_value(lua, r.header(&name).as_deref()))
    })?;
    // Kong's `{ unnamed = {...}, named = {...} }` of the route's regex path captures.
    set_fn(lua, &t, "get_uri_captures", |lua, ()| {
        let caps = with_request(|r, _| Ok(r.captures.map(<[_]>::to_vec).unwrap_or_default()))?;
        let (unnamed, named) = (lua.create_table()?, lua.create_table()?);
        for (name, value) in caps {
            match name {
                Some(n) => named.set(n, value)?,
                None => unnamed.push(value)?,
            }
        }
        let t = lua.create_table()?;
        t.set("unnamed", unnamed)?;
        t.set("named", named)?;
        Ok(t)
    })?;
    set_fn(lua, &t, "get_headers", |lua, ()| {
        with_view(|r| headers_table(lua, r.headers()))
    })?;
    set_fn(lua, &t, "get_scheme", |_, ()| {
        with_view(|r| Ok(if r.tls() { "https" } else { "http" }))
    })?;
    set_fn(lua, &t, "get_host", |_, ()| {
        with_view(|r| Ok(request_host(&r).0))
    })?;
    // Kong's `tonumber(ngx.var.server_port)`: the port the request came in on.
    set_fn(lua, &t, "get_port", |_, ()| {
        with_view(|r| match r {
            View::Req(a) if a.server_port != 0 => Ok(a.server_port),
            _ => Ok(request_host(&r).1),
        })
    })?;
    // Kong's forwarded getters: a trusted client's (`trusted_ips`) X-Forwarded-* values,
    // otherwise the request's own.
    let forwarded = |r: &View<'_>, name: &'static str| -> Option<String> {
        let trusted = matches!(r, View::Req(a) if a.trusted);
        if !trusted {
            return None;
        }
        let v = r.header(&HeaderName::from_static(name))?;
        let s = v.to_str().ok()?;
        // The first of a list, as nginx's realip and Kong take it.
        Some(s.split(',').next().unwrap_or("").trim().to_string())
    };
    set_fn(lua, &t, "get_forwarded_scheme", move |_, ()| {
        with_view(|r| {
            Ok(match forwarded(&r, "x-forwarded-proto") {
                Some(p) => p.to_ascii_lowercase(),
                None => (if r.tls() { "https" } else { "http" }).to_string(),
            })
        })
    })?;
    set_fn(lua, &t, "get_forwarded_host", move |_, ()| {
        with_view(|r| {
            Ok(match forwarded(&r, "x-forwarded-host") {
                Some(h) => h
                    .rsplit_once(':')
                    .filter(|(_, p)| p.parse::<u16>().is_ok())
                    .map_or(h.clone(), |(h, _)| h.to_string())
                    .to_ascii_lowercase(),
                None => request_host(&r).0,
            })
        })
    })?;
    set_fn(lua, &t, "get_forwarded_port", move |_, ()| {
        with_view(|r| {
            if let Some(p) = forwarded(&r, "x-forwarded-port").and_then(|p| p.parse::<u16>().ok()) {
                return Ok(p);
            }
            Ok(match &r {
                View::Req(a) if a.server_port != 0 => a.server_port,
                _ => request_host(&r).1,
            })
        })
    })?;
    set_fn(lua, &t, "get_forwarded_path", move |_, ()| {
        with_view(|r| Ok(forwarded(&r, "x-forwarded-path").unwrap_or_else(|| r.path().to_string())))
    })?;
    set_fn(lua, &t, "get_forwarded_prefix", move |_, ()| {
        with_view(|r| Ok(forwarded(&r, "x-forwarded-prefix")))
    })?;
    set_fn(lua, &t, "get_id", |_, ()| {
        with_view(|r| match r {
            View::Req(a) => Ok(a
                .request_id
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string()),
            View::Log(_) => Ok(String::new()),
        })
    })?;
    // Milliseconds since the epoch, as Kong's (`ngx.req.start_time() * 1000`).
    set_fn(lua, &t, "get_start_time", |_, ()| {
        with_view(|r| {
            let started = match r {
                View::Req(a) => a
                    .started
                    .map(|s| std::time::SystemTime::now() - s.elapsed()),
                View::Log(d) => Some(d.started_at),
            };
            Ok(started
                .and_then(|s| s.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0.0, |d| (d.as_millis()) as f64))
        })
    })?;
    set_fn(lua, &t, "get_http_version", |_, ()| Ok(1.1))?;
    set_fn(lua, &t, "get_raw_body", |lua, ()| {
        with_view(|r| match r.body() {
            Some(b) => Ok(Value::String(lua.create_string(b)?)),
            None => Ok(Value::Nil),
        })
    })?;
    set_fn(lua, &t, "get_body", |lua, ()| {
        let (body, ctype) = with_view(|r| {
            Ok((
                r.body().cloned(),
                r.headers()
                    .get(http::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_ascii_lowercase(),
            ))
        })?;
        let Some(body) = body else {
            return Ok((Value::Nil, Some("request body not read".to_string()), None));
        };
        decoded_body(lua, &body, &ctype)
    })?;
    Ok(t)
}

/// A body decoded by its content type, as Kong's `get_body` answers: the value, or nil and
/// why, and the type it was read as (JSON and URL-encoded forms).
pub(super) fn decoded_body(
    lua: &Lua,
    body: &[u8],
    ctype: &str,
) -> mlua::Result<(Value, Option<String>, Option<String>)> {
    let ctype = ctype.to_ascii_lowercase();
    if ctype.starts_with("application/json") {
        match serde_json::from_slice::<serde_json::Value>(body) {
            Ok(v) => Ok((
                lua.to_value(&v)?,
                None,
                Some("application/json".to_string()),
            )),
            Err(e) => Ok((Value::Nil, Some(format!("invalid json body: {e}")), None)),
        }
    } else if ctype.starts_with("application/x-www-form-urlencoded") {
        let s = String::from_utf8_lossy(body).into_owned();
        Ok((
            Value::Table(args_table(lua, &s)?),
            None,
            Some("application/x-www-form-urlencoded".to_string()),
        ))
    } else {
        Ok((
            Value::Nil,
            Some("unsupported content type".to_string()),
            None,
        ))
    }
}

/// The request's host (from Host, without its port) and port (Host's, or the scheme's).
pub(super) fn request_host(r: &View<'_>) -> (String, u16) {
    let host = r
        .headers()
        .get(http::header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let default = if r.tls() { 443 } else { 80 };
    match host.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || host.starts_with('[') => match p.parse() {
            Ok(port) => (h.to_ascii_lowercase(), port),
            Err(_) => (host.to_ascii_lowercase(), default),
        },
        _ => (host.to_ascii_lowercase(), default),
    }
}
