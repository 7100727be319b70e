//! OpenResty's small helpers plugins call: digests (`ngx.md5`, `ngx.md5_bin`, `ngx.sha1_bin`,
//! `ngx.hmac_sha1`, `ngx.crc32_short`/`_long`), SQL quoting, the clock's texts (`ngx.today`,
//! `ngx.localtime`, `ngx.utctime`, `ngx.http_time`, `ngx.cookie_time`, `ngx.parse_http_time`,
//! `ngx.update_time`), and `ngx.config` / `ngx.worker` facts.

use super::*;

pub(in crate::lua) fn install_misc(lua: &Lua, ngx: &Table, workers: usize) -> mlua::Result<()> {
    set_fn(lua, ngx, "md5", |_, s: LuaString| {
        use md5::Digest;
        Ok(hex::encode(md5::Md5::digest(&*s.as_bytes())))
    })?;
    set_fn(lua, ngx, "md5_bin", |lua, s: LuaString| {
        use md5::Digest;
        lua.create_string(md5::Md5::digest(&*s.as_bytes()))
    })?;
    set_fn(lua, ngx, "sha1_bin", |lua, s: LuaString| {
        use sha1::Digest;
        lua.create_string(sha1::Sha1::digest(&*s.as_bytes()))
    })?;
    set_fn(
        lua,
        ngx,
        "hmac_sha1",
        |lua, (key, s): (LuaString, LuaString)| {
            let key =
                ring::hmac::Key::new(ring::hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY, &key.as_bytes());
            lua.create_string(ring::hmac::sign(&key, &s.as_bytes()).as_ref())
        },
    )?;
    for name in ["crc32_short", "crc32_long"] {
        set_fn(lua, ngx, name, |_, s: LuaString| {
            let mut crc = flate2::Crc::new();
            crc.update(&s.as_bytes());
            Ok(crc.sum())
        })?;
    }
    set_fn(lua, ngx, "quote_sql_str", |lua, s: LuaString| {
        lua.create_string(quote_sql(&s.as_bytes()))
    })?;
    set_fn(lua, ngx, "update_time", |_, ()| Ok(()))?;
    set_fn(lua, ngx, "today", |_, ()| Ok(local_text(false)))?;
    set_fn(lua, ngx, "localtime", |_, ()| Ok(local_text(true)))?;
    set_fn(lua, ngx, "utctime", |_, ()| {
        Ok(civil_text(now_secs_i64(), true))
    })?;
    set_fn(lua, ngx, "http_time", |_, secs: f64| {
        Ok(httpdate::fmt_http_date(at(secs)))
    })?;
    set_fn(lua, ngx, "cookie_time", |_, secs: f64| {
        // nginx's: "Thu, 18-Nov-10 11:27:35 GMT" with a four-digit year.
        let t = httpdate::fmt_http_date(at(secs)); // "Thu, 18 Nov 2010 11:27:35 GMT"
        let p: Vec<&str> = t.split(' ').collect();
        Ok(match p.as_slice() {
            [wd, d, m, y, hms, gmt] => format!("{wd} {d}-{m}-{y} {hms} {gmt}"),
            _ => t,
        })
    })?;
    set_fn(lua, ngx, "parse_http_time", |_, s: String| {
        Ok(httpdate::parse_http_date(&s).ok().and_then(|t| {
            t.duration_since(std::time::UNIX_EPOCH)
                .ok()
                .map(|d| d.as_secs() as i64)
        }))
    })?;
    let config = lua.create_table()?;
    config.set("subsystem", "http")?;
    config.set("is_console", false)?;
    config.set("ngx_lua_version", 10026)?;
    config.set("nginx_version", 1025003)?;
    config.set("debug", false)?;
    set_fn(lua, &config, "prefix", |_, ()| Ok(""))?;
    ngx.set("config", config)?;
    // ngx.worker: the worker threads stand for nginx's workers.
    let worker: Table = match ngx.get::<Value>("worker")? {
        Value::Table(t) => t,
        _ => lua.create_table()?,
    };
    set_fn(lua, &worker, "pid", |_, ()| Ok(std::process::id()))?;
    // The worker threads are named `turnpike-worker-<i>`; elsewhere (a timer's thread, a
    // tool) the id is nil, as in nginx's master.
    set_fn(lua, &worker, "id", |_, ()| {
        Ok(std::thread::current()
            .name()
            .and_then(|n| n.strip_prefix("turnpike-worker-"))
            .and_then(|i| i.parse::<u32>().ok()))
    })?;
    set_fn(lua, &worker, "count", move |_, ()| Ok(workers))?;
    ngx.set("worker", worker)?;
    Ok(())
}

/// MySQL's quoting, as `ngx.quote_sql_str`: in single quotes, with `\0 \b \n \r \t \Z \\ ' "`
/// escaped.
fn quote_sql(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len() + 2);
    out.push(b'\'');
    for &c in s {
        match c {
            0 => out.extend_from_slice(b"\\0"),
            8 => out.extend_from_slice(b"\\b"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            26 => out.extend_from_slice(b"\\Z"),
            b'\\' | b'\'' | b'"' => {
                out.push(b'\\');
                out.push(c);
            }
            _ => out.push(c),
        }
    }
    out.push(b'\'');
    out
}

fn at(secs: f64) -> std::time::SystemTime {
    std::time::UNIX_EPOCH + std::time::Duration::from_secs_f64(secs.max(0.0))
}

fn now_secs_i64() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// The local date (`yyyy-mm-dd`) or date and time (`yyyy-mm-dd hh:mm:ss`), in the process's
/// time zone.
fn local_text(with_time: bool) -> String {
    let now = now_secs_i64();
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    let t: libc::time_t = now as libc::time_t;
    // SAFETY: localtime_r writes only into `tm`.
    let ok = !unsafe { libc::localtime_r(&t, &mut tm) }.is_null();
    let offset = if ok { tm.tm_gmtoff } else { 0 };
    civil_text(now + offset, with_time)
}

/// Seconds since the epoch (already in the wanted zone) as `yyyy-mm-dd[ hh:mm:ss]`.
fn civil_text(secs: i64, with_time: bool) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = crate::clock::civil_from_days(days);
    if with_time {
        format!(
            "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
            rem / 3600,
            rem % 3600 / 60,
            rem % 60
        )
    } else {
        format!("{y:04}-{m:02}-{d:02}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_and_quotes_read_as_nginx_writes_them() {
        assert_eq!(civil_text(0, true), "1970-01-01 00:00:00");
        assert_eq!(civil_text(951_782_400, false), "2000-02-29");
        assert_eq!(civil_text(1_700_000_000, true), "2023-11-14 22:13:20");
        assert_eq!(
            quote_sql(b"it's \"x\"\n"),
            b"'it\\'s \\\"x\\\"\\n'".to_vec()
        );
    }
}
