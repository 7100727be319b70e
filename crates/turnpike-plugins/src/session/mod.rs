//! session (PRIORITY 1900): keeps a consumer authenticated by a cookie once another
//! authentication plugin has authenticated it, as Kong's session plugin does: the header_filter
//! phase of a request some auth plugin authenticated sets the cookie; the access phase of a
//! later request (before the auth plugins, which with `anonymous` then let it through) reads it
//! back and authenticates the same consumer and credential; a logout request (one of
//! `logout_methods` with `logout_query_arg`, or `logout_post_arg` in a form body when
//! `read_body_for_logout`) clears it and gets 200.
//!
//! Cookies are lua-resty-session 4's, byte for byte (see `cookie`): a session a Kong node
//! made keeps working here, and one made here on Kong. The times are the library's:
//! `idling_timeout` (the header's idling offset, renewed by a touch once a minute has passed),
//! `rolling_timeout` (a new session id and cookie once three quarters of it have passed),
//! `absolute_timeout` (never renewed); `remember` adds the library's persistent second cookie,
//! which opens a new session when the browser's has gone. `storage = kong` keeps the sessions
//! in the database (Kong's `sessions` entity, see `storage`) and the header alone in the
//! cookie.

mod cookie;
mod daos;
mod schema;
mod storage;

pub use daos::{SESSIONS, TABLE};
pub use storage::State;

use std::sync::Arc;

use http::{HeaderName, HeaderValue, StatusCode};
use serde_json::Value;

use crate::{
    Access, AccessRequest, BodyFilter, BuildContext, Exit, Handler, Identity, PluginSpec,
    ResponseHead,
};
use cookie::{Header, Keys, Timeouts};

pub struct Session;

/// The consumers of the snapshot by id (what a session names), built once per snapshot.
type Consumers = rustc_hash::FxHashMap<Box<str>, (Option<Box<str>>, Option<Box<str>>)>;

fn consumers(ctx: &BuildContext<'_>) -> Consumers {
    ctx.config
        .consumers
        .iter()
        .map(|c| ((*c.id).into(), (c.username.clone(), c.custom_id.clone())))
        .collect()
}

const EXPIRE: &str = "; Expires=Thu, 01 Jan 1970 00:00:01 GMT; Max-Age=0";
/// lua-resty-session's `touch_threshold`: the idling clock is renewed at most once a minute.
const TOUCH_THRESHOLD: i64 = 60;

struct Configured {
    keys: Keys,
    cookie_name: String,
    /// The remember cookie's name, with `remember`.
    remember_cookie_name: Option<String>,
    /// lua-resty-session's cookie flags: `; Domain=..; Path=..; SameSite=..; Secure; HttpOnly`.
    flags: String,
    timeouts: Timeouts,
    remember_timeouts: Timeouts,
    stale_ttl: i64,
    /// `storage = kong`.
    store: Option<Arc<State>>,
    audience: String,
    logout_methods: Vec<String>,
    logout_query_arg: String,
    logout_post_arg: Option<String>,
    consumers: Arc<Consumers>,
    /// lua-resty-session's headers to the upstream and to the client (`request_headers`,
    /// `response_headers`).
    request_headers: Vec<String>,
    response_headers: Vec<String>,
}

struct Handle(Arc<Configured>);

/// The request's session, from access to header_filter.
struct Opened {
    header: Header,
    /// The session's entries, ours at `index` (other audiences' are kept as they are).
    entries: Vec<Value>,
    index: usize,
    consumer: String,
    credential: String,
}

/// Where a session's payload is: after the header in the cookie, or in the store.
enum Payload {
    Cookie(String),
    Stored(String),
}

impl PluginSpec for Session {
    fn name(&self) -> &'static str {
        "session"
    }
    fn priority(&self) -> i32 {
        1900
    }
    fn allows_consumer(&self) -> bool {
        false
    }
    fn fields(&self) -> &'static [crate::schema::Field] {
        schema::FIELDS
    }
    fn shorthand_fields(&self) -> &'static [crate::schema::Shorthand] {
        schema::SHORTHANDS
    }
    fn shorthands(&self, config: &mut Value) {
        schema::shorthands(config);
        // Kong's default secret is random, drawn when the config is written.
        if let Some(m) = config.as_object_mut() {
            if m.get("secret").is_none_or(|v| v.is_null()) {
                m.insert("secret".into(), Value::from(random_secret()));
            }
        }
    }
    fn needs_database(&self, config: &Value) -> Option<(String, String)> {
        (config["storage"] == "kong").then(|| {
            (
                "storage".into(),
                "storage 'kong' keeps sessions in the database and is not available in DB-less \
                 mode; use 'cookie'"
                    .into(),
            )
        })
    }
    fn build(&self, config: &Value, ctx: &BuildContext) -> Result<Arc<dyn Handler>, String> {
        let c: schema::Config = crate::typed(config)?;
        let secret = c.secret.unwrap_or_default();
        let store = match c.storage.as_str() {
            "kong" if ctx.runtime.session.available() => Some(ctx.runtime.session.clone()),
            "kong" => return Err("storage 'kong' needs a database".into()),
            _ => None,
        };
        let mut flags = String::new();
        if let Some(d) = c
            .cookie_domain
            .as_deref()
            .filter(|d| !d.is_empty() && *d != "localhost")
        {
            flags.push_str(&format!("; Domain={d}"));
        }
        flags.push_str(&format!(
            "; Path={}; SameSite={}",
            c.cookie_path, c.cookie_same_site
        ));
        if c.cookie_secure || c.cookie_same_site == "None" {
            flags.push_str("; Secure");
        }
        if c.cookie_http_only {
            flags.push_str("; HttpOnly");
        }
        HeaderValue::from_str(&format!("{}=x{flags}", c.cookie_name))
            .map_err(|_| "cookie name and attributes must be header text")?;
        HeaderValue::from_str(&c.audience).map_err(|_| "audience must be header text")?;
        Ok(Arc::new(Handle(Arc::new(Configured {
            keys: Keys::new(&secret),
            cookie_name: c.cookie_name,
            remember_cookie_name: c.remember.then_some(c.remember_cookie_name),
            flags,
            timeouts: Timeouts {
                idling: c.idling_timeout,
                rolling: c.rolling_timeout,
                absolute: c.absolute_timeout,
            },
            remember_timeouts: Timeouts {
                idling: 0.0,
                rolling: c.remember_rolling_timeout,
                absolute: c.remember_absolute_timeout,
            },
            stale_ttl: c.stale_ttl.max(0.0) as i64,
            store,
            audience: c.audience,
            logout_methods: c.logout_methods,
            logout_query_arg: c.logout_query_arg,
            logout_post_arg: c.read_body_for_logout.then_some(c.logout_post_arg),
            consumers: ctx.shared(consumers),
            request_headers: c.request_headers.unwrap_or_default(),
            response_headers: c.response_headers.unwrap_or_default(),
        }))))
    }
}

/// 32 random bytes in base64, as Kong's `random_string`.
fn random_secret() -> String {
    use base64::Engine;
    let mut b = [0u8; 32];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b);
    base64::engine::general_purpose::STANDARD.encode(b)
}

fn now() -> i64 {
    crate::clock::now_secs() as i64
}

/// A number as Lua writes it in a header (`900`, `900.5`).
fn lua_number(n: f64) -> String {
    if n.fract() == 0.0 && n.abs() < 1e15 {
        format!("{}", n as i64)
    } else {
        format!("{n}")
    }
}

impl Configured {
    /// The value of cookie `name` in the request (nginx's `$cookie_<name>`: the first).
    fn cookie<'r>(&self, req: &'r AccessRequest<'_>, name: &str) -> Option<&'r str> {
        req.headers
            .get_all(http::header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .find_map(|pair| {
                let (k, v) = pair.trim().split_once('=')?;
                (k == name).then_some(v)
            })
    }

    fn name(&self, remember: bool) -> &str {
        match (&self.remember_cookie_name, remember) {
            (Some(r), true) => r,
            _ => &self.cookie_name,
        }
    }

    /// The session cookie's header, checked, and where its payload is.
    fn header(
        &self,
        req: &AccessRequest<'_>,
        remember: bool,
        now: i64,
    ) -> Option<(Header, Payload)> {
        let name = self.name(remember);
        let cookie = self.cookie(req, name)?;
        let t = if remember {
            self.remember_timeouts
        } else {
            self.timeouts
        };
        let header = Header::open(cookie, &self.keys, self.store.is_some(), remember, t, now)
            .map_err(|e| tracing::debug!("session not present ({e})"))
            .ok()?;
        if self.store.is_some() {
            let key = header.id();
            return Some((header, Payload::Stored(key)));
        }
        let mut payload = cookie[cookie::HEADER_ENCODED_SIZE..].to_string();
        let chunks = cookie::chunks(name.len(), header.data_size)?;
        for i in 2..=chunks {
            payload.push_str(self.cookie(req, &format!("{name}{i}"))?);
        }
        Some((header, Payload::Cookie(payload)))
    }

    /// Our entry of a session's entries, and the consumer, credential and authenticated
    /// groups it names (Kong's data: `[consumer id, credential id, groups]`; the groups a
    /// Lua table, so `{}` when empty).
    fn ours(&self, entries: &[Value]) -> Option<(usize, String, String, Option<Vec<String>>)> {
        let index = entries
            .iter()
            .position(|e| e[1] == self.audience.as_str())?;
        let data = &entries[index][0];
        let groups = match &data[2] {
            Value::Array(g) => Some(
                g.iter()
                    .filter_map(|v| match v {
                        Value::String(s) => Some(s.clone()),
                        Value::Number(n) => Some(n.to_string()),
                        _ => None,
                    })
                    .collect(),
            ),
            Value::Object(o) if o.is_empty() => Some(Vec::new()),
            _ => None,
        };
        Some((
            index,
            data[0].as_str()?.to_string(),
            data[1].as_str()?.to_string(),
            groups,
        ))
    }

    /// `Set-Cookie`s for a sealed session (`remember`: the persistent cookie): one, or the
    /// chunks of one past 4 KiB; and, when the session it replaces took more chunks
    /// (`old_data_size`), the extra ones cleared.
    fn set_cookie(
        &self,
        sealed: &cookie::Sealed,
        remember: bool,
        old_data_size: Option<usize>,
    ) -> Vec<HeaderValue> {
        let name = self.name(remember);
        let mut extra = String::new();
        if remember {
            let max_age = match self.remember_timeouts.rolling as i64 {
                0 => cookie::MAX_TTL,
                a => a.min(cookie::MAX_TTL),
            };
            let expires = std::time::UNIX_EPOCH
                + std::time::Duration::from_secs((sealed.decoded.created + max_age).max(0) as u64);
            extra = format!(
                "; Expires={}; Max-Age={max_age}",
                httpdate::fmt_http_date(expires)
            );
        }
        let payload = if self.store.is_some() {
            ""
        } else {
            sealed.payload.as_str()
        };
        let Some(parts) = cookie::split(name, &sealed.header, payload) else {
            tracing::warn!("session: unable to save session (session cookie too big)");
            return Vec::new();
        };
        let count = parts.len();
        let mut out: Vec<HeaderValue> = parts
            .into_iter()
            .filter_map(|(n, h, p)| {
                HeaderValue::from_str(&format!("{n}={h}{p}{}{extra}", self.flags)).ok()
            })
            .collect();
        if self.store.is_none() {
            let old = old_data_size.and_then(|d| cookie::chunks(name.len(), d));
            for i in count + 1..=old.unwrap_or(0) {
                out.extend(self.clear_cookie(&format!("{name}{i}")));
            }
        }
        out
    }

    /// `Set-Cookie`s that end a session: its cookie and, with the `cookie` storage, the
    /// chunks its `data_size` took.
    fn clear_cookies(&self, name: &str, data_size: usize) -> Vec<HeaderValue> {
        let n = match self.store {
            Some(_) => 1,
            None => cookie::chunks(name.len(), data_size).unwrap_or(1),
        };
        let mut out: Vec<HeaderValue> = self.clear_cookie(name).into_iter().collect();
        for i in 2..=n {
            out.extend(self.clear_cookie(&format!("{name}{i}")));
        }
        out
    }

    fn clear_cookie(&self, name: &str) -> Option<HeaderValue> {
        HeaderValue::from_str(&format!("{name}={}{EXPIRE}", self.flags)).ok()
    }

    /// Seals the entries as a new session (`created` kept from the one it renews); with the
    /// `kong` storage, the write to make (run by the caller).
    fn save(
        &self,
        entries: &[Value],
        created: Option<i64>,
        old: Option<&Header>,
        remember: bool,
        now: i64,
    ) -> Option<(cookie::Sealed, Option<Save>)> {
        let flags = if self.store.is_some() {
            cookie::FLAG_STORAGE
        } else {
            0
        };
        let sealed = cookie::seal(
            &self.keys,
            cookie::new_sid(),
            &Value::Array(entries.to_vec()),
            created,
            now,
            flags,
            remember,
        )?;
        let write = self.store.as_ref().map(|store| {
            let rolling = if remember {
                self.remember_timeouts.rolling
            } else {
                self.timeouts.rolling
            };
            let ttl = match rolling as i64 {
                t if t <= 0 || t > cookie::MAX_TTL => cookie::MAX_TTL,
                t => t,
            };
            Save {
                store: store.clone(),
                key: sealed.decoded.id(),
                payload: sealed.payload.clone(),
                ttl,
                now,
                old: old.map(|h| (h.id(), self.stale_ttl, remember)),
            }
        });
        Some((sealed, write))
    }

    /// lua-resty-session's `Session-*` header for `what`.
    fn header_for(&self, what: &str, o: &Opened, now: i64) -> Option<(HeaderName, HeaderValue)> {
        let h = &o.header;
        let t = &self.timeouts;
        let rolling_elapsed = (now - h.created - h.rolling_offset) as f64;
        let idling_left = t.idling - (rolling_elapsed - h.idling_offset as f64);
        let rolling_left = t.rolling - rolling_elapsed;
        let absolute_left = t.absolute - (now - h.created) as f64;
        let number = |n: f64| HeaderValue::from_str(&lua_number(n)).ok();
        let (name, value) = match what {
            "id" => ("session-id", HeaderValue::from_str(&h.id()).ok()?),
            "audience" => (
                "session-audience",
                HeaderValue::from_str(&self.audience).ok()?,
            ),
            "subject" => (
                "session-subject",
                HeaderValue::from_str(o.entries[o.index].get(2)?.as_str()?).ok()?,
            ),
            "timeout" => {
                let all = [
                    (t.idling > 0.0).then_some(idling_left),
                    (t.rolling > 0.0).then_some(rolling_left),
                    (t.absolute > 0.0).then_some(absolute_left),
                ];
                let min = all.into_iter().flatten().reduce(f64::min)?;
                ("session-timeout", number(min)?)
            }
            "idling-timeout" if t.idling > 0.0 => ("session-idling-timeout", number(idling_left)?),
            "rolling-timeout" if t.rolling > 0.0 => {
                ("session-rolling-timeout", number(rolling_left)?)
            }
            "absolute-timeout" if t.absolute > 0.0 => {
                ("session-absolute-timeout", number(absolute_left)?)
            }
            _ => return None,
        };
        Some((HeaderName::from_static(name), value))
    }

    fn is_logout(&self, req: &AccessRequest<'_>) -> bool {
        if !self.logout_methods.iter().any(|m| m == req.method) {
            return false;
        }
        let has = |text: &str, name: &str| {
            text.split('&').any(|kv| {
                let k = kv.split_once('=').map_or(kv, |(k, _)| k);
                k == name
            })
        };
        if req.query.is_some_and(|q| has(q, &self.logout_query_arg)) {
            return true;
        }
        let Some(arg) = &self.logout_post_arg else {
            return false;
        };
        let form = req
            .headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.starts_with("application/x-www-form-urlencoded"));
        form && req
            .body
            .as_deref()
            .and_then(|b| std::str::from_utf8(b).ok())
            .is_some_and(|b| has(b, arg))
    }
}

/// A session write for the `kong` storage.
struct Save {
    store: Arc<State>,
    key: String,
    payload: String,
    ttl: i64,
    now: i64,
    old: Option<(String, i64, bool)>,
}

impl Save {
    async fn run(self) {
        if let Err(e) = self
            .store
            .save(self.key, &self.payload, self.ttl, self.now, self.old)
            .await
        {
            tracing::warn!("session: unable to store session data ({e})");
        }
    }
}

/// Writes to make before the request goes on (a session renewed in the access phase must be
/// stored before the client can present its new cookie).
fn after(writes: Vec<Save>) -> Access {
    if writes.is_empty() {
        return Access::Continue;
    }
    Access::Wait(Box::pin(async move {
        for w in writes {
            w.run().await;
        }
        let resume: crate::Resume = Box::new(|_| Access::Continue);
        resume
    }))
}

impl Handle {
    /// The access phase once the session's payload is known.
    fn proceed(
        conf: &Arc<Configured>,
        req: &mut AccessRequest<'_>,
        header: Header,
        payload: Option<String>,
        remember: bool,
        now: i64,
    ) -> Access {
        let Some(payload) = payload else {
            return Access::Continue;
        };
        let entries = match header.decrypt(&payload, &conf.keys, remember) {
            Ok(Value::Array(e)) => e,
            Ok(_) => return Access::Continue,
            Err(e) => {
                tracing::debug!("session not present ({e})");
                return Access::Continue;
            }
        };
        let Some((index, consumer, credential, groups)) = conf.ours(&entries) else {
            return Access::Continue;
        };
        let mut writes = Vec::new();
        let set = |req: &mut AccessRequest<'_>, v: Vec<HeaderValue>| {
            for v in v {
                req.response_headers.push((http::header::SET_COOKIE, v));
            }
        };
        let destroy = |req: &mut AccessRequest<'_>| {
            // The cookie opened (the remember one, or the browser's) with its chunks.
            let opened = conf.name(remember);
            let mut out = conf.clear_cookies(opened, header.data_size);
            for other in [Some(&conf.cookie_name), conf.remember_cookie_name.as_ref()]
                .into_iter()
                .flatten()
                .filter(|n| n.as_str() != opened)
            {
                out.extend(conf.clear_cookie(other));
            }
            for v in out {
                req.response_headers.push((http::header::SET_COOKIE, v));
            }
            if let Some(store) = &conf.store {
                let (store, key) = (store.clone(), header.id());
                tokio::spawn(async move {
                    let _ = store.retire(&key, 0, now, true).await;
                });
            }
        };
        if conf.is_logout(req) {
            let mut e = Exit::message(StatusCode::OK, "");
            e.headers.clear();
            e.body = bytes::Bytes::new();
            destroy(req);
            e.headers = std::mem::take(req.response_headers);
            return Access::Exit(e);
        }
        // A session of a consumer since deleted is over.
        let Some((username, custom_id)) = conf.consumers.get(consumer.as_str()) else {
            destroy(req);
            return Access::Continue;
        };
        let mut header = header;
        if remember {
            // The browser's session has gone and the remember cookie opened it: both are
            // made again (lua-resty-session's `open`), the persistent one keeping its start.
            if let Some((r, w)) =
                conf.save(&entries, Some(header.created), Some(&header), true, now)
            {
                set(req, conf.set_cookie(&r, true, Some(header.data_size)));
                writes.extend(w);
            }
            if let Some((s, w)) = conf.save(&entries, None, None, false, now) {
                set(req, conf.set_cookie(&s, false, None));
                writes.extend(w);
                header = s.decoded;
            }
        } else {
            // lua-resty-session's `refresh`: renewed when three quarters of the rolling
            // period have passed, touched when the idling clock is a minute old.
            let t = conf.timeouts;
            let rolling_elapsed = now - header.created - header.rolling_offset;
            if t.rolling > 0.0 && rolling_elapsed > (t.rolling * 0.75).floor() as i64 {
                if let Some((s, w)) =
                    conf.save(&entries, Some(header.created), Some(&header), false, now)
                {
                    set(req, conf.set_cookie(&s, false, Some(header.data_size)));
                    writes.extend(w);
                    header = s.decoded;
                }
            } else if t.idling > 0.0 && rolling_elapsed - header.idling_offset > TOUCH_THRESHOLD {
                // The first cookie alone: the new header and the payload's first chunk.
                let touched = header.touch(&conf.keys, now);
                let value = match &conf.store {
                    Some(_) => touched,
                    None => {
                        let first = cookie::split(&conf.cookie_name, "", &payload)
                            .and_then(|p| p.first().map(|c| c.2))
                            .unwrap_or(&payload);
                        format!("{touched}{first}")
                    }
                };
                set(
                    req,
                    HeaderValue::from_str(&format!("{}={value}{}", conf.cookie_name, conf.flags))
                        .into_iter()
                        .collect(),
                );
            }
        }
        req.set_consumer(Arc::new(Identity::new(
            &consumer,
            username.as_deref(),
            custom_id.as_deref(),
            Some(&credential),
        )));
        // Kong's `authenticate`: the groups the session was made with, to the upstream and to
        // acl (`ngx.ctx.authenticated_groups`).
        match groups {
            Some(g) => {
                if let Ok(v) = HeaderValue::from_str(&g.join(", ")) {
                    req.headers.insert(crate::X_AUTHENTICATED_GROUPS.clone(), v);
                }
                req.ctx.insert(crate::AuthenticatedGroups(g));
            }
            None => {
                req.headers.remove(&crate::X_AUTHENTICATED_GROUPS);
            }
        }
        let opened = Opened {
            header,
            entries,
            index,
            consumer,
            credential,
        };
        for what in &conf.request_headers {
            if let Some((k, v)) = conf.header_for(what, &opened, now) {
                req.headers.insert(k, v);
            }
        }
        for what in &conf.response_headers {
            if let Some(h) = conf.header_for(what, &opened, now) {
                req.response_headers.push(h);
            }
        }
        req.ctx.insert(opened);
        after(writes)
    }
}

impl Handler for Handle {
    fn phases(&self) -> crate::Phases {
        crate::Phases::ACCESS | crate::Phases::RESPONSE
    }
    fn wants_body(&self) -> bool {
        self.0.logout_post_arg.is_some()
    }
    fn access(&self, req: &mut AccessRequest<'_>) -> Access {
        let conf = &self.0;
        let now = now();
        let found = conf
            .header(req, false, now)
            .map(|(h, p)| (h, p, false))
            .or_else(|| {
                conf.remember_cookie_name
                    .as_ref()
                    .and_then(|_| conf.header(req, true, now))
                    .map(|(h, p)| (h, p, true))
            });
        let Some((header, payload, remember)) = found else {
            return Access::Continue;
        };
        match (payload, &conf.store) {
            (Payload::Cookie(p), _) => Self::proceed(conf, req, header, Some(p), remember, now),
            (Payload::Stored(key), Some(store)) => match store.cached(&key) {
                Some(p) => Self::proceed(conf, req, header, p, remember, now),
                None => {
                    let (conf, store) = (conf.clone(), store.clone());
                    Access::Wait(Box::pin(async move {
                        let p = store.load(key).await;
                        let resume: crate::Resume = Box::new(move |req| {
                            Self::proceed(&conf, req, header, p, remember, now)
                        });
                        resume
                    }))
                }
            },
            (Payload::Stored(_), None) => Access::Continue,
        }
    }
    fn header_filter(&self, resp: &mut ResponseHead<'_>) -> Option<Box<dyn BodyFilter>> {
        let conf = &self.0;
        // Kong opens sessions for authenticated requests only, never the anonymous consumer.
        let who = resp.consumer?;
        let credential = who.credential_id()?;
        if who.consumer_id().is_empty() {
            return None;
        }
        let groups = crate::identity::ngx_authenticated_groups(resp.ctx);
        let opened = resp.ctx.get_mut::<Opened>();
        if let Some(o) = &opened {
            if o.consumer == who.consumer_id() && o.credential == credential {
                return None;
            }
        }
        // Kong's data: the consumer, the credential; the subject names the consumer.
        let subject = who
            .username()
            .or_else(|| who.custom_id())
            .unwrap_or(who.consumer_id());
        let mut data = vec![Value::from(who.consumer_id()), Value::from(credential)];
        if let Some(g) = groups {
            data.push(Value::from(g));
        }
        let ours = serde_json::json!([data, conf.audience, subject]);
        let old_data_size = opened.as_ref().map(|o| o.header.data_size);
        let mut entries = match opened {
            Some(o) => {
                let mut e = std::mem::take(&mut o.entries);
                e.remove(o.index);
                e
            }
            None => Vec::new(),
        };
        entries.push(ours);
        let now = now();
        let mut writes = Vec::new();
        if let Some((s, w)) = conf.save(&entries, None, None, false, now) {
            for v in conf.set_cookie(&s, false, old_data_size) {
                resp.headers.append(http::header::SET_COOKIE, v);
            }
            writes.extend(w);
            let o = Opened {
                index: entries.len() - 1,
                header: s.decoded,
                entries: entries.clone(),
                consumer: who.consumer_id().to_string(),
                credential: credential.to_string(),
            };
            for what in &conf.response_headers {
                if let Some((k, v)) = conf.header_for(what, &o, now) {
                    resp.headers.insert(k, v);
                }
            }
        }
        if conf.remember_cookie_name.is_some() {
            if let Some((r, w)) = conf.save(&entries, None, None, true, now) {
                for v in conf.set_cookie(&r, true, None) {
                    resp.headers.append(http::header::SET_COOKIE, v);
                }
                writes.extend(w);
            }
        }
        // As Kong's storage does in header_filter: written in the background.
        for w in writes {
            tokio::spawn(w.run());
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_numbers_are_written_as_lua_writes_them() {
        assert_eq!(lua_number(900.0), "900");
        assert_eq!(lua_number(899.5), "899.5");
        assert_eq!(lua_number(-3.0), "-3");
    }
}
