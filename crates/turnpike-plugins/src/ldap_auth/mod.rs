//! ldap-auth (PRIORITY 1200): authenticates `Authorization: ldap <base64 user:password>` (or
//! `Proxy-Authorization`, read first; the scheme is `header_type`) by binding to an LDAP server
//! as `<attribute>=<user>,<base_dn>`, plain, `ldaps` or StartTLS, as Kong's `access.lua`
//! does. It maps to no consumer: the upstream learns the user from `X-Credential-Identifier`.
//!
//! Answers (successful binds and refusals alike) are cached for `cache_ttl` seconds, keyed by
//! a digest of the server settings, user and password (the password itself is never kept), so
//! a client repeating its credentials costs no bind; a flood of wrong passwords costs one bind
//! per distinct pair. Bound connections are kept for reuse (`keepalive` ms idle at most).

mod schema;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use http::{HeaderValue, StatusCode};
use ldap3::{Ldap, LdapConnAsync, LdapConnSettings};
use serde_json::Value;
use sha2::Digest;

use crate::{Access, AccessRequest, BuildContext, Exit, Handler, Identity, PluginSpec};

pub struct LdapAuth;

/// ldap-auth's part of the node's [`crate::Runtime`]: remembered binds.
pub struct State {
    /// (config, user, password) digest -> the identity of a successful bind, or `None`; with
    /// when it was learnt (each config has its own `cache_ttl`).
    answers: moka::sync::Cache<[u8; 32], (Option<Arc<Identity>>, Instant)>,
}

impl Default for State {
    fn default() -> State {
        State {
            answers: moka::sync::Cache::builder()
                .max_capacity(100_000)
                .time_to_live(Duration::from_secs(24 * 3600))
                .build(),
        }
    }
}

struct Configured {
    state: Arc<State>,
    host: String,
    port: u16,
    ldaps: bool,
    start_tls: bool,
    verify: bool,
    base_dn: String,
    attribute: String,
    cache_ttl: Duration,
    timeout: Duration,
    keepalive: Duration,
    hide_credentials: bool,
    /// `header_type` lower-cased, as the scheme is compared.
    scheme: String,
    www_authenticate: HeaderValue,
    /// Digest of the settings a bind depends on: part of every cache key.
    fingerprint: [u8; 32],
    anonymous: crate::anonymous::Anonymous,
    /// Idle bound connections, newest last.
    idle: Mutex<Vec<(Ldap, Instant)>>,
}

struct Authenticator(Arc<Configured>);

const INVALID: &str = "Invalid authentication credentials";
/// Idle connections kept per plugin instance.
const MAX_IDLE: usize = 16;

impl PluginSpec for LdapAuth {
    fn name(&self) -> &'static str {
        "ldap-auth"
    }
    fn priority(&self) -> i32 {
        1200
    }
    /// Kong's `protocols = typedefs.protocols_http`.
    fn http_only(&self) -> bool {
        true
    }
    fn allows_consumer(&self) -> bool {
        false
    }
    fn fields(&self) -> &'static [crate::schema::Field] {
        schema::FIELDS
    }
    fn entity_checks(&self, config: &Value) -> Vec<(String, String)> {
        schema::entity_checks(config)
    }
    fn build(&self, config: &Value, ctx: &BuildContext) -> Result<Arc<dyn Handler>, String> {
        let c: schema::Config = crate::typed(config)?;
        // Kong capitalises the default scheme in its challenge (Kong/kong#3656).
        let challenge = if c.header_type == "ldap" {
            "LDAP".to_string()
        } else {
            c.header_type.clone()
        };
        let anonymous = crate::anonymous::Anonymous::new(ctx, c.anonymous.as_deref());
        let fingerprint: [u8; 32] = sha2::Sha256::digest(format!(
            "{}:{}:{}:{}:{}:{}:{}",
            c.ldap_host.to_ascii_lowercase(),
            c.ldap_port,
            c.base_dn,
            c.attribute,
            c.ldaps,
            c.start_tls,
            c.verify_ldap_host
        ))
        .into();
        let ms = |v: f64| Duration::from_millis(v.max(0.0) as u64);
        Ok(Arc::new(Authenticator(Arc::new(Configured {
            state: ctx.runtime.ldap_auth.clone(),
            host: c.ldap_host,
            port: c.ldap_port,
            ldaps: c.ldaps,
            start_tls: c.start_tls,
            verify: c.verify_ldap_host,
            base_dn: c.base_dn,
            attribute: c.attribute,
            cache_ttl: Duration::from_secs_f64(c.cache_ttl.max(0.0)),
            timeout: ms(c.timeout),
            keepalive: ms(c.keepalive),
            hide_credentials: c.hide_credentials,
            scheme: c.header_type.to_ascii_lowercase(),
            www_authenticate: HeaderValue::from_str(&format!("{challenge} realm=\"kong\""))
                .map_err(|_| "invalid header_type")?,
            fingerprint,
            anonymous,
            idle: Mutex::new(Vec::new()),
        }))))
    }
}

/// Kong's parsing: `<scheme> <base64>`, scheme case-insensitive; the decoded text split as Lua's
/// `(.+):(.+)` splits it (at the last colon that leaves a non-empty password).
fn credentials(value: &HeaderValue, scheme: &str) -> Option<(String, String)> {
    let s = value.to_str().ok()?.trim_start();
    let (word, rest) = s.split_at(s.find(|c: char| c.is_ascii_whitespace())?);
    if !word.eq_ignore_ascii_case(scheme) {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(rest.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    // The last colon with something after it (a colon is one byte: slicing there is safe).
    let colon = text
        .rmatch_indices(':')
        .map(|(i, _)| i)
        .find(|i| i + 1 < text.len())?;
    let (user, pass) = (&text[..colon], &text[colon + 1..]);
    (!user.is_empty() && !pass.is_empty()).then(|| (user.to_string(), pass.to_string()))
}

/// A DN attribute value escaped (RFC 4514), so that a user name cannot change the DN's shape.
fn escape_dn_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for (i, c) in v.chars().enumerate() {
        match c {
            ',' | '+' | '"' | '\\' | '<' | '>' | ';' | '=' => {
                out.push('\\');
                out.push(c);
            }
            '#' | ' ' if i == 0 => {
                out.push('\\');
                out.push(c);
            }
            ' ' if i + 1 == v.chars().count() => out.push_str("\\ "),
            '\0' => out.push_str("\\00"),
            c => out.push(c),
        }
    }
    out
}

impl Configured {
    fn key(&self, user: &str, pass: &str) -> [u8; 32] {
        let mut h = sha2::Sha256::new();
        h.update(self.fingerprint);
        h.update((user.len() as u64).to_be_bytes());
        h.update(user.as_bytes());
        h.update(pass.as_bytes());
        h.finalize().into()
    }

    fn fail(&self, req: &mut AccessRequest<'_>, status: StatusCode, message: &str) -> Access {
        self.anonymous.fail(req, || {
            let mut e = Exit::message(status, message);
            if message == "Unauthorized" {
                e.headers.push((
                    http::header::WWW_AUTHENTICATE,
                    self.www_authenticate.clone(),
                ));
            }
            e
        })
    }

    fn succeed(&self, req: &mut AccessRequest<'_>, who: Arc<Identity>) -> Access {
        if self.hide_credentials {
            req.headers.remove(http::header::AUTHORIZATION);
            req.headers.remove(http::header::PROXY_AUTHORIZATION);
        }
        req.set_consumer(who);
        Access::Continue
    }

    /// A connection to bind on: an idle one, or a new one.
    async fn connection(&self) -> Result<Ldap, String> {
        while let Some((mut l, at)) = self.idle.lock().ok().and_then(|mut v| v.pop()) {
            if at.elapsed() < self.keepalive && !l.is_closed() {
                return Ok(l);
            }
        }
        let scheme = if self.ldaps { "ldaps" } else { "ldap" };
        let url = format!("{scheme}://{}:{}", self.host, self.port);
        let settings = LdapConnSettings::new()
            .set_conn_timeout(self.timeout)
            .set_starttls(self.start_tls)
            .set_no_tls_verify(!self.verify);
        let (conn, ldap) = LdapConnAsync::with_settings(settings, &url)
            .await
            .map_err(|e| format!("failed to connect to {}:{}: {e}", self.host, self.port))?;
        tokio::spawn(async move {
            if let Err(e) = conn.drive().await {
                tracing::debug!("ldap-auth: connection ended: {e}");
            }
        });
        Ok(ldap)
    }

    /// Binds as the user: `Ok(true)` accepted, `Ok(false)` refused, `Err` the server could not
    /// be asked.
    async fn bind(&self, user: &str, pass: &str) -> Result<bool, String> {
        let dn = format!(
            "{}={},{}",
            self.attribute,
            escape_dn_value(user),
            self.base_dn
        );
        let mut ldap = self.connection().await?;
        ldap.with_timeout(self.timeout);
        let result = ldap
            .simple_bind(&dn, pass)
            .await
            .map_err(|e| format!("bind to {}:{} failed: {e}", self.host, self.port))?;
        if let Ok(mut idle) = self.idle.lock() {
            if idle.len() < MAX_IDLE {
                idle.push((ldap, Instant::now()));
            }
        }
        // 49: invalidCredentials; anything else but success is refused too.
        Ok(result.rc == 0)
    }
}

impl Handler for Authenticator {
    fn phases(&self) -> crate::Phases {
        crate::Phases::ACCESS
    }
    fn access(&self, req: &mut AccessRequest<'_>) -> Access {
        let conf = &self.0;
        if conf.anonymous.already_settled(req) {
            return Access::Continue;
        }
        let proxy = req.headers.get(http::header::PROXY_AUTHORIZATION);
        let authorization = req.headers.get(http::header::AUTHORIZATION);
        if proxy.is_none() && authorization.is_none() {
            return conf.fail(req, StatusCode::UNAUTHORIZED, "Unauthorized");
        }
        // Kong tries Proxy-Authorization, then Authorization.
        let candidates: Vec<(String, String)> = [proxy, authorization]
            .into_iter()
            .flatten()
            .filter_map(|v| credentials(v, &conf.scheme))
            .collect();
        if candidates.is_empty() {
            return conf.fail(req, StatusCode::UNAUTHORIZED, INVALID);
        }
        // In order: a remembered success settles it, a remembered refusal moves on, and the
        // first credentials not remembered are bound (with those after them, if refused).
        let mut pending = Vec::new();
        for (i, (user, pass)) in candidates.iter().enumerate() {
            let key = conf.key(user, pass);
            match conf.state.answers.get(&key) {
                Some((Some(who), at)) if at.elapsed() < conf.cache_ttl => {
                    return conf.succeed(req, who);
                }
                Some((None, at)) if at.elapsed() < conf.cache_ttl => {}
                _ => {
                    pending = candidates[i..].to_vec();
                    break;
                }
            }
        }
        if pending.is_empty() {
            return conf.fail(req, StatusCode::UNAUTHORIZED, INVALID);
        }
        let conf = self.0.clone();
        Access::Wait(Box::pin(async move {
            let mut outcome: Result<Option<Arc<Identity>>, String> = Ok(None);
            for (user, pass) in pending {
                let key = conf.key(&user, &pass);
                match conf.state.answers.get(&key) {
                    Some((Some(who), at)) if at.elapsed() < conf.cache_ttl => {
                        outcome = Ok(Some(who));
                        break;
                    }
                    Some((None, at)) if at.elapsed() < conf.cache_ttl => continue,
                    _ => {}
                }
                match conf.bind(&user, &pass).await {
                    Ok(ok) => {
                        let who = ok.then(|| Arc::new(Identity::credential_only(&user)));
                        conf.state
                            .answers
                            .insert(key, (who.clone(), Instant::now()));
                        if who.is_some() {
                            outcome = Ok(who);
                            break;
                        }
                    }
                    Err(e) => {
                        outcome = Err(e);
                        break;
                    }
                }
            }
            let resume: crate::Resume = Box::new(move |req| match outcome {
                Ok(Some(who)) => conf.succeed(req, who),
                Ok(None) => conf.fail(req, StatusCode::UNAUTHORIZED, INVALID),
                Err(e) => {
                    tracing::error!("ldap-auth: {e}");
                    Access::Exit(Exit::message(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "An unexpected error occurred",
                    ))
                }
            });
            resume
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(scheme: &str, text: &str) -> HeaderValue {
        HeaderValue::from_str(&format!(
            "{scheme} {}",
            base64::engine::general_purpose::STANDARD.encode(text)
        ))
        .unwrap()
    }

    #[test]
    fn parses_like_kong() {
        assert_eq!(
            credentials(&h("ldap", "einstein:password"), "ldap"),
            Some(("einstein".into(), "password".into()))
        );
        assert_eq!(
            credentials(&h("LDAP", "a:b:c"), "ldap"),
            Some(("a:b".into(), "c".into()))
        );
        assert_eq!(credentials(&h("basic", "a:b"), "ldap"), None);
        assert_eq!(credentials(&h("ldap", "a:"), "ldap"), None);
        // Multi-byte text at the end (a panic before: the split sliced inside a character).
        assert_eq!(
            credentials(&h("ldap", "jo:pé"), "ldap"),
            Some(("jo".into(), "pé".into()))
        );
        assert_eq!(
            credentials(&h("ldap", "a:b:"), "ldap"),
            Some(("a".into(), "b:".into()))
        );
        assert_eq!(credentials(&h("ldap", ":b"), "ldap"), None);
        assert_eq!(
            credentials(&HeaderValue::from_static("ldap !!"), "ldap"),
            None
        );
    }

    #[test]
    fn user_names_cannot_reshape_the_dn() {
        assert_eq!(escape_dn_value("einstein"), "einstein");
        assert_eq!(escape_dn_value("x,ou=admins"), "x\\,ou\\=admins");
        assert_eq!(escape_dn_value(" a "), "\\ a\\ ");
    }
}
