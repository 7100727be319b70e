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
    // Removes every value of one argument from the query the upstream gets.
    set_fn(lua, &t, "clear_query_arg", |_, name: String| {
        with_request(|r, _| {
            let current = r
                .upstream
                .query
                .clone()
                .unwrap_or_else(|| r.query.unwrap_or("").to_string());
            let kept: Vec<&str> = current
                .split('&')
                .filter(|kv| {
                    let k = kv.split_once('=').map_or(*kv, |(k, _)| k);
                    !kv.is_empty() && percent_decode(k) != name.as_bytes()
                })
                .collect();
            r.upstream.query = Some(kept.join("&"));
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
    // Kong's buffered proxying: the upstream's response is read whole before the response
    // phases (`kong.service.response.get_raw_body` then has it).
    set_fn(lua, &t, "enable_buffering", |_, ()| {
        with_request(|r, _| {
            r.upstream.buffered = true;
            Ok(())
        })
    })?;
    // Kong's `kong.service.request.set_method`: one of the methods nginx knows.
    set_fn(lua, &t, "set_method", |_, method: String| {
        const KNOWN: &[&str] = &[
            "GET",
            "HEAD",
            "PUT",
            "POST",
            "DELETE",
            "OPTIONS",
            "MKCOL",
            "COPY",
            "MOVE",
            "PROPFIND",
            "PROPPATCH",
            "LOCK",
            "UNLOCK",
            "PATCH",
            "TRACE",
        ];
        if !KNOWN.contains(&method.as_str()) {
            return Err(mlua::Error::runtime(format!("invalid method: {method}")));
        }
        let m = http::Method::from_bytes(method.as_bytes())
            .map_err(|_| mlua::Error::runtime(format!("invalid method: {method}")))?;
        with_request(|r, _| {
            r.upstream.method = Some(m);
            Ok(())
        })
    })?;
    // Kong's `kong.service.request.set_body(args, mimetype)` for JSON and URL-encoded forms
    // (multipart is refused with a clear error): the body and its Content-Type.
    set_fn(
        lua,
        &t,
        "set_body",
        |lua, (args, mime): (Table, Option<String>)| {
            let current = with_request(|r, _| {
                Ok(r.headers
                    .get(http::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string))
            })?;
            let current_essence = current.as_deref().map(|c| {
                c.split(';')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_ascii_lowercase()
            });
            let mime = mime.or(current).unwrap_or_default();
            let essence = mime
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase();
            let (body, ctype) = match essence.as_str() {
                "application/json" => {
                    let json: serde_json::Value = lua.from_value(Value::Table(args))?;
                    (json.to_string().into_bytes(), "application/json")
                }
                "application/x-www-form-urlencoded" => (
                    encode_args(&args)?.into_bytes(),
                    "application/x-www-form-urlencoded",
                ),
                "" => {
                    return Err(mlua::Error::runtime(
                        "content type was not provided in request",
                    ))
                }
                other => {
                    return Err(mlua::Error::runtime(format!(
                        "unsupported content type '{other}'"
                    )))
                }
            };
            with_request(|r, phase| {
                if r.body.is_none() {
                    return Err(mlua::Error::runtime(format!(
                        "the request body is not buffered in the {} phase",
                        phase.name()
                    )));
                }
                r.body = Some(Bytes::from(body));
                if current_essence.as_deref() != Some(ctype) {
                    r.headers.insert(
                        http::header::CONTENT_TYPE,
                        http::HeaderValue::from_static(ctype),
                    );
                }
                Ok(())
            })
        },
    )?;
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
    // One value (the common case) without a list.
    if !matches!(value, Value::Table(_) | Value::Nil) {
        let v = header_value_of(&name, value)?;
        return with_request(|r, _| {
            if name == http::header::HOST {
                r.upstream.host = Some(v.clone());
            }
            if append {
                r.headers.append(name, v);
            } else {
                r.headers.insert(name, v);
            }
            Ok(())
        });
    }
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

/// `kong.service.set_target(host, port)` (rewrite, access): the request goes to `host:port`
/// instead of the service's host or upstream, its Host header made from them unless the
/// route preserves the client's or a plugin set one, as Kong's balancer does.
pub(super) fn service_functions(lua: &Lua, t: &Table) -> mlua::Result<()> {
    set_fn(lua, t, "set_target", |_, (host, port): (Value, Value)| {
        let Value::String(host) = host else {
            return Err(mlua::Error::runtime("host must be a string"));
        };
        let host = host.to_str()?.to_string();
        if host.is_empty() || host.bytes().any(|b| b <= b' ' || b == b'/' || b == 0x7f) {
            return Err(mlua::Error::runtime("host must be a string"));
        }
        let port = match port {
            Value::Integer(p) => p as f64,
            Value::Number(p) => p,
            _ => return Err(mlua::Error::runtime("port must be an integer")),
        };
        if port.fract() != 0.0 {
            return Err(mlua::Error::runtime("port must be an integer"));
        }
        if !(0.0..=65535.0).contains(&port) {
            return Err(mlua::Error::runtime(
                "port must be an integer between 0 and 65535: given ".to_string()
                    + &lua_number(port),
            ));
        }
        with_request(|r, _| {
            r.upstream.target = Some((host, port as u16));
            Ok(())
        })
    })?;
    for name in [
        "set_upstream",
        "set_tls_verify",
        "set_tls_cert_key",
        "set_retries",
        "set_timeouts",
    ] {
        let message = format!("kong.service.{name} is not implemented by Turnpike");
        set_fn(
            lua,
            t,
            name,
            move |_, _: mlua::MultiValue| -> mlua::Result<()> {
                Err(mlua::Error::runtime(message.clone()))
            },
        )?;
    }
    Ok(())
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
    set_fn(lua, &t, "get_raw_body", |lua, ()| {
        with_response(|h| match h.buffered {
            Some(b) => Ok(Value::String(lua.create_string(b)?)),
            None => Err(mlua::Error::runtime(NOT_BUFFERED)),
        })
    })?;
    set_fn(
        lua,
        &t,
        "get_body",
        |lua, (mimetype, _max): (Option<String>, Value)| {
            let (body, ctype) = with_response(|h| match h.buffered {
                Some(b) => Ok((
                    b.clone(),
                    h.headers
                        .get(http::header::CONTENT_TYPE)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_string(),
                )),
                None => Err(mlua::Error::runtime(NOT_BUFFERED)),
            })?;
            decoded_body(lua, &body, mimetype.as_deref().unwrap_or(&ctype))
        },
    )?;
    Ok(t)
}

/// Kong's error for the service's body when the response was not buffered.
const NOT_BUFFERED: &str = "service body is only available with buffered proxying \
     (see: kong.service.request.enable_buffering function)";
