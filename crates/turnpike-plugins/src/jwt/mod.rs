//! jwt (PRIORITY 1450): authenticates a request by a signed JSON Web Token found in a query
//! argument, a cookie or a header (`Bearer <token>`), whose `key_claim_name` claim (or header
//! field) names a consumer's `jwt_secrets` entry; Kong 3.9's `handler.lua` and `jwt_parser.lua`
//! are the reference for the order of checks, the messages and the headers.
//!
//! Verification keys (HMAC secrets, RSA/EC/Ed25519 public keys) are parsed when the secret is
//! loaded: with the snapshot on a DB-less node, on first use from the store (cached by key,
//! misses too) on a database node. A request costs a look-up, a base64 and JSON decode of the
//! token and one signature check.

pub mod daos;
mod schema;
pub mod token;

use std::sync::Arc;

use http::{HeaderName, HeaderValue, StatusCode};
use serde_json::Value;

use crate::credentials::Outcome;
use crate::{Access, AccessRequest, BuildContext, Exit, Handler, Identity, PluginSpec};
use daos::{Secret, SecretIndex};

pub struct Jwt;

/// jwt's part of the node's [`crate::Runtime`]: secrets found in a store (database nodes),
/// by key: the credential cache itself (see `crate::credentials`).
pub type State = crate::credentials::Cache<Box<str>, Arc<Secret>>;

/// The node's cache of this plugin's credentials.
pub fn state(store: Arc<crate::credentials::Store>) -> State {
    crate::credentials::Cache::new(store, daos::TABLE, "key").weighed_by(secret_weight)
}

/// Bytes of a cached secret once used, as `a_cached_secret_weighs_what_it_takes` measures them
/// (glibc's count, the crypto library's own allocations included): HS256 1,055; RSA 2,970
/// with a 2048-bit key and 4,245 with a 4096-bit one (the parsed key, and the Montgomery
/// set-up its first check leaves with it: ~5 bytes a byte of the key's DER); EC keys
/// 1,491-1,557 by curve; Ed25519 1,219. RSA keys were counted at 2,240 whatever their size
/// (moka's entries; first at 512), EC and Ed25519 keys at 2,240 too.
fn secret_weight(s: &Arc<Secret>) -> u32 {
    use token::Alg::*;
    match (&s.plain, s.alg) {
        (Some(token::Key::Public(k)), RS256 | RS384 | RS512 | PS256 | PS384 | PS512) => {
            let der = u32::try_from(k.as_ref().len()).unwrap_or(u32::MAX / 8);
            1_640u32.saturating_add(der.saturating_mul(5))
        }
        (Some(token::Key::Public(_)), EdDSA) => 1_344,
        (Some(token::Key::Public(_)), _) => 1_664,
        _ => 1_152,
    }
}

/// What a found secret is cached as: its verification key, parsed once, and its consumer.
fn secret_of(f: &crate::credentials::Found) -> Option<Arc<Secret>> {
    let key = f.fields.get("key").and_then(|v| v.as_str())?;
    let who = Arc::new(
        Identity::new(
            &f.consumer_id,
            f.username.as_deref(),
            f.custom_id.as_deref(),
            Some(&f.id),
        )
        .identified_by(key),
    );
    Secret::from_fields(&f.fields, who).map(Arc::new)
}

/// Where secrets are looked up.
enum Secrets {
    Snapshot(Arc<SecretIndex>),
    Store(Arc<State>),
}

struct Configured {
    secrets: Secrets,
    uri_param_names: Vec<String>,
    cookie_names: Vec<String>,
    header_names: Vec<HeaderName>,
    key_claim_name: String,
    secret_is_base64: bool,
    claims_to_verify: Vec<String>,
    maximum_expiration: f64,
    run_on_preflight: bool,
    /// `Bearer` or `Bearer realm="..."`, and the same with ` error="invalid_token"`.
    www_authenticate: HeaderValue,
    www_authenticate_invalid: HeaderValue,
    anonymous: crate::anonymous::Anonymous,
}

struct Authenticator(Arc<Configured>);

impl PluginSpec for Jwt {
    fn name(&self) -> &'static str {
        "jwt"
    }
    fn priority(&self) -> i32 {
        1450
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
        let base = match &c.realm {
            Some(r) => format!("Bearer realm=\"{r}\""),
            None => "Bearer".to_string(),
        };
        let header = |v: &str| HeaderValue::from_str(v).map_err(|_| "invalid realm".to_string());
        let anonymous = crate::anonymous::Anonymous::new(ctx, c.anonymous.as_deref());
        let header_names = c
            .header_names
            .iter()
            .map(|h| {
                HeaderName::from_bytes(h.to_ascii_lowercase().as_bytes())
                    .map_err(|_| format!("invalid header name '{h}'"))
            })
            .collect::<Result<_, _>>()?;
        Ok(Arc::new(Authenticator(Arc::new(Configured {
            secrets: if ctx.runtime.credentials.installed() {
                Secrets::Store(ctx.runtime.jwt.clone())
            } else {
                Secrets::Snapshot(ctx.shared(daos::index))
            },
            uri_param_names: c.uri_param_names,
            cookie_names: c.cookie_names,
            header_names,
            key_claim_name: c.key_claim_name,
            secret_is_base64: c.secret_is_base64,
            claims_to_verify: c.claims_to_verify.unwrap_or_default(),
            maximum_expiration: c.maximum_expiration,
            run_on_preflight: c.run_on_preflight,
            www_authenticate: header(&base)?,
            www_authenticate_invalid: header(&format!("{base} error=\"invalid_token\""))?,
            anonymous,
        }))))
    }
}

/// Why authentication failed: Kong's 401 with a message or, for claim checks, the errors
/// object as the body.
enum Failure {
    Message(&'static str, bool),
    Text(String),
    Claims(Vec<(String, String)>),
}

/// The tokens a request carries (Kong's `retrieve_tokens`): query arguments, then cookies,
/// then `Bearer` headers; the same token found twice counts once.
fn tokens(conf: &Configured, req: &AccessRequest<'_>) -> Vec<String> {
    let mut found: Vec<String> = Vec::new();
    let mut add = |t: String| {
        if !t.is_empty() && !found.contains(&t) {
            found.push(t);
        }
    };
    if let Some(q) = req.query {
        for kv in q.split('&') {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            if conf
                .uri_param_names
                .iter()
                .any(|n| n.as_bytes() == k.as_bytes())
            {
                add(crate::form::percent_decode(v));
            }
        }
    }
    if !conf.cookie_names.is_empty() {
        for h in req.headers.get_all(http::header::COOKIE) {
            let Ok(s) = h.to_str() else { continue };
            for pair in s.split(';') {
                let (k, v) = pair.trim().split_once('=').unwrap_or((pair.trim(), ""));
                if conf.cookie_names.iter().any(|n| n == k) {
                    add(v.to_string());
                }
            }
        }
    }
    for name in &conf.header_names {
        let Some(v) = req.headers.get(name).and_then(|v| v.to_str().ok()) else {
            continue;
        };
        // Kong's `\s*[Bb]earer\s+(.+)`, searched anywhere in the value.
        if let Some(t) = bearer(v) {
            add(t.to_string());
        }
    }
    found
}

/// The token of a `Bearer <token>` value, as Kong's unanchored regex finds it.
fn bearer(v: &str) -> Option<&str> {
    let b = v.as_bytes();
    let mut i = 0;
    while let Some(p) = v[i..].find("earer").map(|p| p + i) {
        if p > 0 && (b[p - 1] == b'B' || b[p - 1] == b'b') {
            let rest = &v[p + 5..];
            let trimmed = rest.trim_start_matches([' ', '\t', '\r', '\n', '\x0b', '\x0c']);
            if trimmed.len() < rest.len() && !trimmed.is_empty() {
                // `.+` stops at a newline.
                return Some(trimmed.split('\n').next().unwrap_or(trimmed));
            }
        }
        i = p + 5;
    }
    None
}

impl Configured {
    fn fail(&self, req: &mut AccessRequest<'_>, why: Failure) -> Access {
        self.anonymous.fail(req, || {
            let (mut exit, invalid) = match why {
                Failure::Message(m, invalid) => {
                    (Exit::message(StatusCode::UNAUTHORIZED, m), invalid)
                }
                Failure::Text(m) => (Exit::message(StatusCode::UNAUTHORIZED, &m), true),
                Failure::Claims(errs) => {
                    let mut body = serde_json::Map::new();
                    for (k, v) in errs {
                        body.insert(k, Value::String(v));
                    }
                    let mut e = Exit::message(StatusCode::UNAUTHORIZED, "");
                    e.body = serde_json::to_vec(&Value::Object(body))
                        .unwrap_or_default()
                        .into();
                    (e, true)
                }
            };
            exit.headers.push((
                http::header::WWW_AUTHENTICATE,
                if invalid {
                    self.www_authenticate_invalid.clone()
                } else {
                    self.www_authenticate.clone()
                },
            ));
            exit
        })
    }

    /// Checks the token (`t`, decoded from `token`) against the secret found for its key.
    fn verify(
        &self,
        req: &mut AccessRequest<'_>,
        token: &str,
        t: &token::Token,
        secret: Option<Arc<Secret>>,
    ) -> Access {
        let Some(secret) = secret else {
            return self.fail(
                req,
                Failure::Text(format!(
                    "No credentials found for given '{}'",
                    self.key_claim_name
                )),
            );
        };
        if t.alg != secret.alg {
            return self.fail(req, Failure::Message("Invalid algorithm", true));
        }
        let decoded;
        let k = if self.secret_is_base64 {
            decoded = secret
                .decoded
                .as_deref()
                .map(|b| token::Key::hmac(secret.alg, b));
            decoded.as_ref()
        } else {
            secret.plain.as_ref()
        };
        let Some(k) = k else {
            return self.fail(req, Failure::Message("Invalid key/secret", true));
        };
        if !k.verify(t.signing_input(token), &t.signature) {
            return self.fail(req, Failure::Message("Invalid signature", true));
        }
        let now = crate::clock::now_secs() as f64;
        let errs = token::verify_claims(&t.claims, &self.claims_to_verify, now);
        if !errs.is_empty() {
            return self.fail(req, Failure::Claims(errs));
        }
        if self.maximum_expiration > 0.0 {
            let exp = t.claims.get("exp").and_then(|v| v.as_f64());
            if exp.is_none_or(|e| e - now > self.maximum_expiration) {
                return self.fail(
                    req,
                    Failure::Claims(vec![(
                        "exp".into(),
                        "exceeds maximum allowed expiration".into(),
                    )]),
                );
            }
        }
        req.set_consumer(secret.who.clone());
        Access::Continue
    }
}

impl Handler for Authenticator {
    fn phases(&self) -> crate::Phases {
        crate::Phases::ACCESS
    }
    fn access(&self, req: &mut AccessRequest<'_>) -> Access {
        let conf = &self.0;
        if !conf.run_on_preflight && req.method == "OPTIONS" {
            return Access::Continue;
        }
        if conf.anonymous.already_settled(req) {
            return Access::Continue;
        }
        let mut found = tokens(conf, req);
        let token = match found.len() {
            0 => return conf.fail(req, Failure::Message("Unauthorized", false)),
            1 => found.pop().unwrap_or_default(),
            _ => return conf.fail(req, Failure::Message("Multiple tokens provided", true)),
        };
        let t = match token::decode(&token) {
            Ok(t) => t,
            Err(e) => {
                return conf.fail(req, Failure::Text(format!("Bad token; {e}")));
            }
        };
        let claim = t
            .claims
            .get(&conf.key_claim_name)
            .or_else(|| t.header.get(&conf.key_claim_name));
        let key = match claim {
            None | Some(Value::Null) | Some(Value::Bool(false)) => {
                return conf.fail(
                    req,
                    Failure::Text(format!("No mandatory '{}' in claims", conf.key_claim_name)),
                )
            }
            Some(Value::String(s)) if s.is_empty() => {
                return conf.fail(
                    req,
                    Failure::Text(format!("Invalid '{}' in claims", conf.key_claim_name)),
                )
            }
            Some(Value::String(s)) => s.clone(),
            // Kong looks a non-string claim up as it is; no key is stored that way.
            Some(other) => other.to_string(),
        };
        match &conf.secrets {
            Secrets::Snapshot(index) => {
                let secret = index.get(key.as_str()).cloned();
                conf.verify(req, &token, &t, secret)
            }
            Secrets::Store(state) => {
                if let Some(e) = state.get(key.as_str()) {
                    return conf.verify(req, &token, &t, e.value);
                }
                let conf = self.0.clone();
                let state = state.clone();
                Access::Wait(Box::pin(async move {
                    let (outcome, query) = state
                        .load(key.as_str().into(), key.clone(), key, secret_of)
                        .await;
                    let resume: crate::Resume = Box::new(move |req| {
                        crate::credentials::record(query, req);
                        match outcome {
                            Outcome::Found(s) => conf.verify(req, &token, &t, Some(s)),
                            Outcome::Missing => conf.verify(req, &token, &t, None),
                            Outcome::Failed(e) => crate::anonymous::store_failed("jwt", &e),
                        }
                    });
                    resume
                }))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A 2048-bit RSA public key (made with `openssl genrsa 2048 | openssl rsa -pubout`).
    const RSA_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEAnndmCKsaKKDug3dzFNPx\nd/3xHN4IWknyJes82VtYcduCOHuL29If40npXnaYefaXF3NzuYUM4DpZVQVPp2WM\nj4OaV/BEwk3Yn3+s+t8nz9C6pmNiWlGgQBpS8ys5QbkyQj2i2YLLdEvQS8qVS4eU\nD5wukOan0V1rTljvt7AsZw2xa30QihPMsDy+s//NOV1Nr8bfx2OtqA4D9ieTpHJT\n63B9FieOi7xZNpLfdTIDDcFD2iD7PIicqOKu7L96ShkWIU9QJ5rKkfJtQ6t73Hfj\nfcqBRexC/s0VldiyqvEcB21gmEhb8vU8UBcZd2MyyPeH3zRQvscp5kOwjAzLfx42\nCwIDAQAB\n-----END PUBLIC KEY-----\n";

    /// Public keys of the other kinds (`openssl ecparam -name prime256v1|secp384r1|secp521r1
    /// -genkey | openssl ec -pubout`, `openssl genpkey -algorithm ed25519 | openssl pkey
    /// -pubout`, `openssl genrsa 4096 | openssl rsa -pubout`).
    const ES256_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEH7IWKuvDJ5ASpvXCvH2F4QgL0wXk\n+dO9/rBkG+kP3rAmIXA5tI6zVtuzSFxaTw8BQuW45w4bUaBw/yDKaptiHw==\n-----END PUBLIC KEY-----\n";
    const ES384_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----\nMHYwEAYHKoZIzj0CAQYFK4EEACIDYgAE3p4iBX7cKybm4Ow59e8IClDefR5QgUKa\nSruVTaq2/vKSx7D96R/fiV4GzmSVAq4y73chxVuVY2S64F5YGiKxxadHIxv5/ECr\no5eC7C7XnTzVLvCReuFZKUXJsLv0j3F6\n-----END PUBLIC KEY-----\n";
    const ES512_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----\nMIGbMBAGByqGSM49AgEGBSuBBAAjA4GGAAQB2SwnDVuk0AsIFFoV51+0ctRj7dPM\nE0WNaSfFu6LLc8X87Ieo8lMH+pm9kjSUHgHb023s3FEGCBVjst7dPAEbtbIAgIMU\nCDmKTjhKchLCAZXDNYYrG031UWlJpU+0bjIIl7h5t7gTC1DKxC0xZK4aiQr9lAh7\nCf2IiEiqfhQE8deS7d8=\n-----END PUBLIC KEY-----\n";
    const EDDSA_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAP0Qy2AVRc1c+RTb5BWJOqe3nnK6hwIjTtOu2E6tPI+4=\n-----END PUBLIC KEY-----\n";
    const RSA_4096_PUBLIC: &str = "-----BEGIN PUBLIC KEY-----\nMIICIjANBgkqhkiG9w0BAQEFAAOCAg8AMIICCgKCAgEArrkoq1PdUgvOqp9TCfUR\ns5XAEF8u7wvk1h2z9B/51ff4oiqZ79a5IeITIrMvCJCDk1ixcD1UnJLJXpclrCVb\n0qrrerg5Wc2tKUsHZKlxwHcvg+22/53WzvxyRt6snQQvHbs46wVAJ65GOjyG5ICn\nxtueuKanDyyrjLNvesNyCFDgd3LUtITmZJYU1FWA+2hBgKJ695d7eNbINyJerYuA\nLYyoLNQ0VVUKPwBZsTNmTTX3Tj4sgKeYjmJiMNwNkGqcC0qiXJNXabNRPifFKlML\nWA1fiiaggz5FwCV40ynmej147FBvXHiCmIQCR8U2TEIjLvtgD7CfvWczt24DsxYS\nH+Pg4o2bAm4qgyAYLMP2BaYdLnRHAJe/PUQoJD/sphsUD4XiPAQXUezqQPkjiBHK\nzgugupCRtyTlVTWwPyW5NJXg95CwXc9nRDePnPBhoIJ3taT5v4ox/QjypKJcGl0I\nAAzZWtGJ2eecntVldEKIWE2OQhpCWtmgJX4n4LC4oo/AOv3nUeXepSvUQ6M/QLB0\ncX3v6BXJgRtBc88jLEW7ckq+arP72OYnTkdhi7uxhv2WJQGmCyvOfYQ5xHEXawSs\ngocnmZPQ85oKUw0WfThCfyJUJwdxfJJZ+bK8IIZnn9N67bBy2urk5maFJGYpI8SE\nAImakGRDl3V6OHQAjRlDBN8CAwEAAQ==\n-----END PUBLIC KEY-----\n";

    /// What a cached jwt secret costs, of every kind (an HMAC secret; RSA keys of 2048 and
    /// 4096 bits; EC keys of the three curves; Ed25519), each used once as a request would
    /// (an RSA key keeps its Montgomery set-up from its first check on), against the weight
    /// it is counted at.
    #[test]
    fn a_cached_secret_weighs_what_it_takes() {
        if !crate::testing::alone("jwt::tests::a_cached_secret_weighs_what_it_takes") {
            return;
        }
        let mut wrong = Vec::new();
        type Fields = fn(&str) -> serde_json::Map<String, Value>;
        let kinds: [(&str, Fields, usize); 7] = [
            (
                "HS256",
                |v| {
                    let secret = format!("{:0>32}", &v[v.len() - 12..]);
                    json!({"key": v, "algorithm": "HS256", "secret": secret})
                        .as_object()
                        .cloned()
                        .unwrap()
                },
                32,
            ),
            (
                "RS256",
                |v| {
                    json!({"key": v, "algorithm": "RS256", "rsa_public_key": RSA_PUBLIC})
                        .as_object()
                        .cloned()
                        .unwrap()
                },
                256,
            ),
            (
                "RS256 4096",
                |v| {
                    json!({"key": v, "algorithm": "RS256", "rsa_public_key": RSA_4096_PUBLIC})
                        .as_object()
                        .cloned()
                        .unwrap()
                },
                512,
            ),
            (
                "ES256",
                |v| {
                    json!({"key": v, "algorithm": "ES256", "rsa_public_key": ES256_PUBLIC})
                        .as_object()
                        .cloned()
                        .unwrap()
                },
                64,
            ),
            (
                "ES384",
                |v| {
                    json!({"key": v, "algorithm": "ES384", "rsa_public_key": ES384_PUBLIC})
                        .as_object()
                        .cloned()
                        .unwrap()
                },
                96,
            ),
            (
                "ES512",
                |v| {
                    json!({"key": v, "algorithm": "ES512", "rsa_public_key": ES512_PUBLIC})
                        .as_object()
                        .cloned()
                        .unwrap()
                },
                132,
            ),
            (
                "EdDSA",
                |v| {
                    json!({"key": v, "algorithm": "EdDSA", "rsa_public_key": EDDSA_PUBLIC})
                        .as_object()
                        .cloned()
                        .unwrap()
                },
                64,
            ),
        ];
        for (kind, fields, sig_len) in kinds {
            let cache = state(crate::testing::rows(fields));
            // A signature of the right length that does not verify.
            let sig = vec![1u8; sig_len];
            let each = crate::testing::loaded_bytes_each(&cache, "", 20_000, |v| {
                let (cache, sig) = (&cache, &sig);
                async move {
                    let (found, _) = cache.load(v.as_str().into(), v.clone(), v, secret_of).await;
                    let crate::credentials::Outcome::Found(s) = found else {
                        panic!("{kind}: no secret")
                    };
                    assert!(!s.plain.as_ref().unwrap().verify(b"header.claims", sig));
                }
            });
            let e = cache.get(crate::testing::value_of(0).as_str()).unwrap();
            let weight = f64::from(secret_weight(e.value.as_ref().unwrap()));
            if !(weight >= each && weight <= each * 1.25) {
                wrong.push(format!(
                    "{kind}: a cached secret takes {each:.0} bytes, counted at {weight}"
                ));
            }
        }
        assert!(wrong.is_empty(), "{wrong:?}");
    }

    #[test]
    fn finds_bearer_tokens_as_kongs_regex_does() {
        assert_eq!(bearer("Bearer abc"), Some("abc"));
        assert_eq!(bearer("  bearer   abc.def"), Some("abc.def"));
        assert_eq!(bearer("Token x, Bearer y"), Some("y"));
        assert_eq!(bearer("Bearer"), None);
        assert_eq!(bearer("Bearerabc"), None);
        assert_eq!(bearer("Basic abc"), None);
    }

    #[test]
    fn decodes_query_values() {}
}
