//! session (PRIORITY 1900): keeps a consumer authenticated by a cookie once another
//! authentication plugin has authenticated it, as Kong's session plugin does: the header_filter
//! phase of a request some auth plugin authenticated sets the cookie; the access phase of a
//! later request (before the auth plugins, which with `anonymous` then let it through) reads it
//! back and authenticates the same consumer and credential; a logout request (one of
//! `logout_methods` with `logout_query_arg`, or `logout_post_arg` in a form body when
//! `read_body_for_logout`) clears it and gets 200.
//!
//! The cookie (storage `cookie`) holds the session itself, sealed with AES-256-GCM under a key
//! derived from `secret` (HKDF-SHA256, once per config) and bound to the cookie name and
//! `audience`: a changed secret or audience ends every session. Its times enforce
//! `idling_timeout` (renewed as the session is used), `rolling_timeout` (renewed at most every
//! rolling period) and `absolute_timeout` (never renewed); `remember` makes the cookie persist
//! across browser restarts under the `remember_*` timeouts. Cookies are not Kong's
//! lua-resty-session format: sessions made by Kong are not read (users sign in again once).

mod cookie;
mod schema;

use std::sync::Arc;

use base64::Engine;
use http::{HeaderName, HeaderValue, StatusCode};
use ring::aead;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{
    Access, AccessRequest, BodyFilter, BuildContext, Exit, Handler, Identity, PluginSpec,
    ResponseHead,
};

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

struct Configured {
    key: aead::LessSafeKey,
    /// Additional data every cookie is sealed with: name and audience.
    aad: Vec<u8>,
    cookie_name: String,
    /// `; Path=/; Domain=...; SameSite=...; HttpOnly; Secure`
    attributes: String,
    idling: u64,
    rolling: u64,
    absolute: u64,
    /// Persistent cookie lifetime (`remember`), else a browser-session cookie.
    persistent: Option<u64>,
    logout_methods: Vec<String>,
    logout_query_arg: String,
    logout_post_arg: Option<String>,
    consumers: Arc<Consumers>,
    audience: HeaderValue,
    /// lua-resty-session's headers to the upstream and to the client (`request_headers`,
    /// `response_headers`).
    request_headers: Vec<String>,
    response_headers: Vec<String>,
}

struct Handle(Arc<Configured>);

/// What a cookie carries.
#[derive(Serialize, Deserialize, Clone, PartialEq, Debug)]
struct Data {
    /// Consumer and credential ids.
    c: String,
    k: String,
    /// Created (absolute start), rolled (rolling start), seen (idling start): Unix seconds.
    t0: u64,
    tr: u64,
    ts: u64,
    /// The session's id (random, made with it).
    id: String,
}

/// The request's session, from access to header_filter.
struct Opened {
    data: Data,
    /// The cookie must be sent again (its times were renewed).
    renew: bool,
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
    fn entity_checks(&self, config: &Value) -> Vec<(String, String)> {
        if config["storage"] == "kong" {
            return vec![(
                "storage".into(),
                "storage 'kong' (sessions kept in the database) is not supported by this \
                 build; use 'cookie'"
                    .into(),
            )];
        }
        Vec::new()
    }
    fn build(&self, config: &Value, ctx: &BuildContext) -> Result<Arc<dyn Handler>, String> {
        let c: schema::Config = crate::typed(config)?;
        let secret = c.secret.unwrap_or_default();
        let (cookie_name, idling, rolling, absolute, persistent) = if c.remember {
            (
                c.remember_cookie_name.clone(),
                c.idling_timeout,
                c.remember_rolling_timeout,
                c.remember_absolute_timeout,
                Some(c.remember_rolling_timeout.max(0.0) as u64),
            )
        } else {
            (
                c.cookie_name.clone(),
                c.idling_timeout,
                c.rolling_timeout,
                c.absolute_timeout,
                None,
            )
        };
        let okm = ring::hkdf::Salt::new(ring::hkdf::HKDF_SHA256, b"turnpike session v1")
            .extract(secret.as_bytes());
        let info = [c.audience.as_bytes()];
        let key_bytes: ring::hkdf::Okm<&aead::Algorithm> = okm
            .expand(&info, &aead::AES_256_GCM)
            .map_err(|_| "cannot derive the session key")?;
        let key = aead::LessSafeKey::new(aead::UnboundKey::from(key_bytes));
        let mut attributes = format!("; Path={}", c.cookie_path);
        if let Some(d) = &c.cookie_domain {
            attributes.push_str(&format!("; Domain={d}"));
        }
        if c.cookie_same_site != "Default" {
            attributes.push_str(&format!("; SameSite={}", c.cookie_same_site));
        }
        if c.cookie_http_only {
            attributes.push_str("; HttpOnly");
        }
        if c.cookie_secure {
            attributes.push_str("; Secure");
        }
        HeaderValue::from_str(&format!("{cookie_name}=x{attributes}"))
            .map_err(|_| "cookie name and attributes must be header text")?;
        let secs = |v: f64| v.max(0.0) as u64;
        Ok(Arc::new(Handle(Arc::new(Configured {
            key,
            aad: format!("{cookie_name}\n{}", c.audience).into_bytes(),
            cookie_name,
            attributes,
            idling: secs(idling),
            rolling: secs(rolling),
            absolute: secs(absolute),
            persistent,
            logout_methods: c.logout_methods,
            logout_query_arg: c.logout_query_arg,
            logout_post_arg: c.read_body_for_logout.then_some(c.logout_post_arg),
            consumers: ctx.shared(consumers),
            audience: HeaderValue::from_str(&c.audience)
                .map_err(|_| "audience must be header text")?,
            request_headers: c.request_headers.unwrap_or_default(),
            response_headers: c.response_headers.unwrap_or_default(),
        }))))
    }
}

/// 32 random bytes in base64, as Kong's `random_string`.
fn random_secret() -> String {
    let mut b = [0u8; 32];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b);
    base64::engine::general_purpose::STANDARD.encode(b)
}

/// A new session id: 16 random bytes, base64url.
fn session_id() -> String {
    let mut b = [0u8; 16];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
}

impl Configured {
    /// The session cookie's value in the request, if any.
    fn cookie<'r>(&self, req: &'r AccessRequest<'_>) -> Option<&'r str> {
        req.headers
            .get_all(http::header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .find_map(|pair| {
                let (k, v) = pair.trim().split_once('=')?;
                (k == self.cookie_name).then_some(v)
            })
    }

    fn seal(&self, data: &Data) -> Option<String> {
        let mut nonce = [0u8; 12];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut nonce).ok()?;
        let mut buf = serde_json::to_vec(data).ok()?;
        self.key
            .seal_in_place_append_tag(
                aead::Nonce::assume_unique_for_key(nonce),
                aead::Aad::from(&self.aad),
                &mut buf,
            )
            .ok()?;
        let mut out = Vec::with_capacity(1 + 12 + buf.len());
        out.push(1u8);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&buf);
        Some(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(out))
    }

    fn open(&self, cookie: &str) -> Option<Data> {
        let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(cookie)
            .ok()?;
        if raw.len() < 1 + 12 + 16 || raw[0] != 1 {
            return None;
        }
        let nonce = aead::Nonce::try_assume_unique_for_key(&raw[1..13]).ok()?;
        let mut buf = raw[13..].to_vec();
        let plain = self
            .key
            .open_in_place(nonce, aead::Aad::from(&self.aad), &mut buf)
            .ok()?;
        serde_json::from_slice(plain).ok()
    }

    /// Whether a session with these times is still valid at `now`.
    fn valid(&self, d: &Data, now: u64) -> bool {
        let within = |start: u64, limit: u64| limit == 0 || now.saturating_sub(start) < limit;
        within(d.t0, self.absolute) && within(d.tr, self.rolling) && within(d.ts, self.idling)
    }

    /// lua-resty-session's header for `what` of session `d` at `now`.
    fn header(&self, what: &str, d: &Data, now: u64) -> Option<(HeaderName, HeaderValue)> {
        let left = |start: u64, limit: u64| limit.saturating_sub(now.saturating_sub(start));
        let (name, value) = match what {
            "id" => ("session-id", HeaderValue::from_str(&d.id).ok()?),
            "audience" => ("session-audience", self.audience.clone()),
            "timeout" => {
                let all = [
                    (self.idling > 0).then(|| left(d.ts, self.idling)),
                    (self.rolling > 0).then(|| left(d.tr, self.rolling)),
                    (self.absolute > 0).then(|| left(d.t0, self.absolute)),
                ];
                ("session-timeout", all.into_iter().flatten().min()?.into())
            }
            "idling-timeout" => ("session-idling-timeout", left(d.ts, self.idling).into()),
            "rolling-timeout" => ("session-rolling-timeout", left(d.tr, self.rolling).into()),
            "absolute-timeout" => ("session-absolute-timeout", left(d.t0, self.absolute).into()),
            // Kong's sessions have no subject.
            _ => return None,
        };
        Some((HeaderName::from_static(name), value))
    }

    fn set_cookie(&self, value: &str) -> Option<HeaderValue> {
        let mut s = format!("{}={value}{}", self.cookie_name, self.attributes);
        if let Some(age) = self.persistent {
            s.push_str(&format!(
                "; Expires={}; Max-Age={age}",
                httpdate::fmt_http_date(
                    std::time::SystemTime::now() + std::time::Duration::from_secs(age)
                )
            ));
        }
        HeaderValue::from_str(&s).ok()
    }

    fn clear_cookie(&self) -> Option<HeaderValue> {
        HeaderValue::from_str(&format!(
            "{}={}; Expires=Thu, 01 Jan 1970 00:00:01 GMT; Max-Age=0",
            self.cookie_name, self.attributes
        ))
        .ok()
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

impl Handler for Handle {
    fn phases(&self) -> crate::Phases {
        crate::Phases::ACCESS | crate::Phases::RESPONSE
    }
    fn wants_body(&self) -> bool {
        self.0.logout_post_arg.is_some()
    }
    fn access(&self, req: &mut AccessRequest<'_>) -> Access {
        let conf = &self.0;
        let Some(data) = conf.cookie(req).and_then(|c| conf.open(c)) else {
            return Access::Continue;
        };
        let now = crate::clock::now_secs();
        if !conf.valid(&data, now) {
            return Access::Continue;
        }
        if conf.is_logout(req) {
            let mut e = Exit::message(StatusCode::OK, "");
            e.headers.clear();
            e.body = bytes::Bytes::new();
            if let Some(v) = conf.clear_cookie() {
                e.headers.push((http::header::SET_COOKIE, v));
            }
            return Access::Exit(e);
        }
        // A session of a consumer since deleted is over.
        let Some((username, custom_id)) = conf.consumers.get(data.c.as_str()) else {
            return Access::Continue;
        };
        req.set_consumer(Arc::new(Identity::new(
            &data.c,
            username.as_deref(),
            custom_id.as_deref(),
            Some(&data.k),
        )));
        // Renewed as used: the idling clock on every use a minute or more after the last
        // renewal (or sooner for short timeouts), the rolling clock halfway through its period.
        let mut renewed = data.clone();
        let step = (conf.idling / 4).clamp(1, 60);
        let mut renew = false;
        if conf.idling > 0 && now.saturating_sub(data.ts) >= step {
            renewed.ts = now;
            renew = true;
        }
        if conf.rolling > 0 && now.saturating_sub(data.tr) >= conf.rolling / 2 {
            renewed.tr = now;
            renewed.ts = now;
            renew = true;
        }
        for what in &conf.request_headers {
            if let Some((k, v)) = conf.header(what, &renewed, now) {
                req.headers.insert(k, v);
            }
        }
        for what in &conf.response_headers {
            if let Some(h) = conf.header(what, &renewed, now) {
                req.response_headers.push(h);
            }
        }
        req.ctx.insert(Opened {
            data: renewed,
            renew,
        });
        Access::Continue
    }
    fn header_filter(&self, resp: &mut ResponseHead<'_>) -> Option<Box<dyn BodyFilter>> {
        let conf = &self.0;
        // Kong opens sessions for authenticated requests only, never the anonymous consumer.
        let who = resp.consumer?;
        let credential = who.credential_id()?;
        if who.consumer_id().is_empty() {
            return None;
        }
        let opened = resp.ctx.get_mut::<Opened>();
        let data = match opened {
            Some(o) if o.data.c == who.consumer_id() && o.data.k == credential => {
                if !o.renew {
                    return None;
                }
                o.data.clone()
            }
            _ => {
                let now = crate::clock::now_secs();
                Data {
                    c: who.consumer_id().to_string(),
                    k: credential.to_string(),
                    t0: now,
                    tr: now,
                    ts: now,
                    id: session_id(),
                }
            }
        };
        if let Some(v) = conf.seal(&data).and_then(|c| conf.set_cookie(&c)) {
            resp.headers.append(http::header::SET_COOKIE, v);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conf(secret: &str, audience: &str) -> Configured {
        let okm = ring::hkdf::Salt::new(ring::hkdf::HKDF_SHA256, b"turnpike session v1")
            .extract(secret.as_bytes());
        let info = [audience.as_bytes()];
        let k: ring::hkdf::Okm<&aead::Algorithm> = okm.expand(&info, &aead::AES_256_GCM).unwrap();
        Configured {
            key: aead::LessSafeKey::new(aead::UnboundKey::from(k)),
            aad: format!("session\n{audience}").into_bytes(),
            cookie_name: "session".into(),
            attributes: "; Path=/".into(),
            idling: 900,
            rolling: 3600,
            absolute: 86400,
            persistent: None,
            logout_methods: vec![],
            logout_query_arg: "session_logout".into(),
            logout_post_arg: None,
            consumers: Arc::default(),
            audience: HeaderValue::from_static("default"),
            request_headers: vec![],
            response_headers: vec![],
        }
    }

    #[test]
    fn cookies_open_only_with_their_key_and_times() {
        let a = conf("s1", "default");
        let d = Data {
            c: "c".into(),
            k: "k".into(),
            t0: 1000,
            tr: 1000,
            ts: 1000,
            id: "i".into(),
        };
        let cookie = a.seal(&d).unwrap();
        assert_eq!(a.open(&cookie), Some(d.clone()));
        assert_eq!(conf("s2", "default").open(&cookie), None);
        assert_eq!(conf("s1", "other").open(&cookie), None);
        let mut forged = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(&cookie)
            .unwrap();
        let last = forged.len() - 1;
        forged[last] ^= 1;
        let forged = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(forged);
        assert_eq!(a.open(&forged), None);
        assert!(a.valid(&d, 1000 + 899));
        assert!(!a.valid(&d, 1000 + 900), "idle");
        let busy = Data {
            ts: 4000,
            ..d.clone()
        };
        assert!(!a.valid(&busy, 4601), "rolling");
        let rolled = Data {
            tr: 86000,
            ts: 86390,
            ..d
        };
        assert!(!a.valid(&rolled, 1000 + 86400), "absolute");
    }
}
