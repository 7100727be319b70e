//! `kong.client`: who is calling (address, port, consumer, credential).

use super::*;

pub(super) fn client(lua: &Lua) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    let ip = |_: &Lua, ()| {
        with_current(|c| match c.target {
            // SAFETY: as in `with_request`.
            Target::Request(p) => Ok(unsafe { &*p }.client_ip.to_string()),
            Target::Log(p) => Ok(unsafe { &*p }
                .details
                .map(|d| d.client_ip.to_string())
                .unwrap_or_default()),
            Target::StreamLog(p) => Ok(unsafe { &*p }.client_ip.to_string()),
            _ => not_in_phase(c.phase),
        })
    };
    set_fn(lua, &t, "get_ip", ip)?;
    set_fn(lua, &t, "get_forwarded_ip", ip)?;
    let port = |_: &Lua, ()| with_request(|r, _| Ok((r.client_port != 0).then_some(r.client_port)));
    set_fn(lua, &t, "get_port", port)?;
    set_fn(lua, &t, "get_forwarded_port", port)?;
    set_fn(lua, &t, "get_protocol", |_, ()| {
        with_request(|r, _| Ok(if r.tls { "https" } else { "http" }))
    })?;
    set_fn(lua, &t, "get_consumer", |lua, ()| {
        let who = consumer()?;
        match who {
            Some(c) => {
                let t = lua.create_table()?;
                t.set("id", c.consumer_id())?;
                t.set("username", c.username())?;
                t.set("custom_id", c.custom_id())?;
                Ok(Value::Table(t))
            }
            None => Ok(Value::Nil),
        }
    })?;
    // Kong's `kong.client.authenticate(consumer, credential)`: the request's consumer from
    // here on (the plugins after this one, the X-Consumer-* headers, the log entry).
    // Kong's `kong.client.load_consumer(id, search_by_username)`: the consumer entity, nil
    // when there is none.
    set_fn(
        lua,
        &t,
        "load_consumer",
        |lua, (key, by_username): (String, Option<bool>)| match crate::lua::db::load_consumer(
            &key,
            by_username.unwrap_or(false),
        ) {
            Ok(Some(who)) => {
                let c = lua.create_table()?;
                c.set("id", who.consumer_id())?;
                c.set("username", who.username())?;
                c.set("custom_id", who.custom_id())?;
                Ok((Value::Table(c), Value::Nil))
            }
            Ok(None) => Ok((Value::Nil, Value::Nil)),
            Err(e) => Err(mlua::Error::runtime(e)),
        },
    )?;
    set_fn(
        lua,
        &t,
        "authenticate",
        |_, (consumer, credential): (Value, Value)| {
            let table = |v: &Value, what: &str| -> mlua::Result<Option<Table>> {
                match v {
                    Value::Nil => Ok(None),
                    Value::Table(t) => Ok(Some(t.clone())),
                    _ => Err(mlua::Error::runtime(format!(
                        "{what} must be a table or nil"
                    ))),
                }
            };
            let consumer = table(&consumer, "consumer")?;
            let credential = table(&credential, "credential")?;
            if consumer.is_none() && credential.is_none() {
                return Err(mlua::Error::runtime(
                    "either credential or consumer must be provided",
                ));
            }
            let field = |t: &Option<Table>, k: &str| -> Option<String> {
                match t.as_ref()?.raw_get::<Value>(k).ok()? {
                    Value::String(s) => s.to_str().ok().map(|s| s.to_string()),
                    Value::Integer(n) => Some(n.to_string()),
                    _ => None,
                }
            };
            let consumer_id = field(&consumer, "id").or_else(|| {
                let c = credential.as_ref()?.raw_get::<Table>("consumer").ok();
                field(&c, "id")
            });
            let identity = crate::Identity::new(
                consumer_id.as_deref().unwrap_or(""),
                field(&consumer, "username").as_deref(),
                field(&consumer, "custom_id").as_deref(),
                field(&credential, "id").as_deref(),
            );
            with_request(|r, _| {
                r.consumer = Some(std::sync::Arc::new(identity));
                Ok(())
            })
        },
    )?;
    set_fn(lua, &t, "get_credential", |lua, ()| {
        let who = consumer()?;
        match who.filter(|c| c.credential_id().is_some()) {
            Some(c) => {
                let t = lua.create_table()?;
                t.set("id", c.credential_id())?;
                let consumer = lua.create_table()?;
                consumer.set("id", c.consumer_id())?;
                t.set("consumer", consumer)?;
                Ok(Value::Table(t))
            }
            None => Ok(Value::Nil),
        }
    })?;
    Ok(t)
}

pub(super) fn consumer() -> mlua::Result<Option<std::sync::Arc<crate::Identity>>> {
    with_current(|c| match c.target {
        // SAFETY: as in `with_request`.
        Target::Request(p) => Ok(unsafe { &*p }.consumer.clone()),
        Target::Log(p) => Ok(unsafe { &*p }.consumer.map(|c| {
            std::sync::Arc::new(crate::Identity::new(
                c.consumer_id(),
                c.username(),
                c.custom_id(),
                c.credential_id(),
            ))
        })),
        _ => not_in_phase(c.phase),
    })
}
