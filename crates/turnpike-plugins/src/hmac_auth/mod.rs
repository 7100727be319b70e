//! hmac-auth (PRIORITY 1030): authenticates a request signed with a consumer's HMAC secret
//! (`Authorization: hmac username="...", algorithm="hmac-sha256", headers="date request-line",
//! signature="..."`, or the same in `Proxy-Authorization`, read first), as Kong 3.9's
//! `access.lua` does: a `Date`/`X-Date` within `clock_skew`, the signed headers and algorithm
//! allowed by the config, the signing string built exactly as Kong builds it, and optionally the
//! body's `Digest`.
//!
//! A check allocates the signing string and the pattern's capture slots, nothing else: the
//! parameters stay in the header's own bytes, the signature is decoded and the HMAC computed
//! into stack buffers and compared in constant time.

pub mod daos;
mod schema;

use std::sync::Arc;

use base64::Engine;
use http::{HeaderMap, HeaderValue, StatusCode};
use ring::{digest, hmac};
use serde_json::Value;

use crate::credentials::Outcome;
use crate::{Access, AccessRequest, BuildContext, Exit, Handler, Identity, PluginSpec};
use daos::{Credential, CredentialIndex};

pub struct HmacAuth;

/// hmac-auth's part of the node's [`crate::Runtime`]: credentials found in a store (database
/// nodes), by username: the credential cache itself (see `crate::credentials`).
pub type State = crate::credentials::Cache<Box<str>, Arc<Credential>>;

/// The node's cache of this plugin's credentials.
pub fn state(store: Arc<crate::credentials::Store>) -> State {
    crate::credentials::Cache::weighing(store, daos::TABLE, "username", CREDENTIAL_WEIGHT)
}

/// Bytes of a cached credential (`a_cached_credential_weighs_what_it_takes`, glibc's count: 728
/// with a 32-character secret). They were counted at the default weight, 704.
const CREDENTIAL_WEIGHT: u32 = 800;

enum Credentials {
    Snapshot(Arc<CredentialIndex>),
    Store(Arc<State>),
}

struct Configured {
    credentials: Credentials,
    hide_credentials: bool,
    clock_skew: f64,
    validate_request_body: bool,
    enforce_headers: Vec<String>,
    /// Allowed algorithms, by [`Algorithm`].
    algorithms: Vec<Algorithm>,
    www_authenticate: HeaderValue,
    anonymous: crate::anonymous::Anonymous,
    /// Kong's pattern for the header's parameters.
    pattern: regex::Regex,
}

struct Authenticator(Arc<Configured>);

const UNAUTHORIZED: &str = "Unauthorized";
const NO_DATE: &str = "HMAC signature cannot be verified, a valid date or x-date header is required for HMAC Authentication";
const NOT_VALID: &str = "HMAC signature cannot be verified";
const NOT_SAME: &str = "HMAC signature does not match";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Algorithm {
    Sha1,
    Sha256,
    Sha384,
    Sha512,
}

impl Algorithm {
    fn parse(s: &str) -> Option<Algorithm> {
        Some(match s {
            "hmac-sha1" => Algorithm::Sha1,
            "hmac-sha256" => Algorithm::Sha256,
            "hmac-sha384" => Algorithm::Sha384,
            "hmac-sha512" => Algorithm::Sha512,
            _ => return None,
        })
    }

    fn hmac(self) -> hmac::Algorithm {
        match self {
            Algorithm::Sha1 => hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY,
            Algorithm::Sha256 => hmac::HMAC_SHA256,
            Algorithm::Sha384 => hmac::HMAC_SHA384,
            Algorithm::Sha512 => hmac::HMAC_SHA512,
        }
    }
}

impl PluginSpec for HmacAuth {
    fn name(&self) -> &'static str {
        "hmac-auth"
    }
    fn priority(&self) -> i32 {
        1030
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
        let www = match &c.realm {
            Some(r) => format!("hmac realm=\"{r}\""),
            None => "hmac".to_string(),
        };
        let anonymous = crate::anonymous::Anonymous::new(ctx, c.anonymous.as_deref());
        Ok(Arc::new(Authenticator(Arc::new(Configured {
            credentials: if ctx.runtime.credentials.installed() {
                Credentials::Store(ctx.runtime.hmac_auth.clone())
            } else {
                Credentials::Snapshot(ctx.shared(daos::index))
            },
            hide_credentials: c.hide_credentials,
            clock_skew: c.clock_skew,
            validate_request_body: c.validate_request_body,
            enforce_headers: c.enforce_headers,
            algorithms: c
                .algorithms
                .iter()
                .filter_map(|a| Algorithm::parse(a))
                .collect(),
            www_authenticate: HeaderValue::from_str(&www).map_err(|_| "invalid realm")?,
            anonymous,
            pattern: regex::Regex::new(
                r#"\s*[Hh]mac\s*username="(.+)",\s*algorithm="(.+)",\s*headers="(.+)",\s*signature="(.+)""#,
            )
            .map_err(|e| e.to_string())?,
        }))))
    }
}

/// The parameters of an `hmac ...` header value: where they stand in the value, which is
/// kept (a shared handle to the request's bytes, not a copy) so that they outlive a wait for
/// the store without being copied out one by one.
struct Params {
    value: HeaderValue,
    groups: [std::ops::Range<usize>; 4],
}

impl Params {
    fn group(&self, i: usize) -> &str {
        // Checked UTF-8 when parsed; the ranges are the pattern's groups in it.
        std::str::from_utf8(&self.value.as_bytes()[self.groups[i].clone()]).unwrap_or("")
    }
    fn username(&self) -> &str {
        self.group(0)
    }
    fn algorithm(&self) -> &str {
        self.group(1)
    }
    fn headers(&self) -> &str {
        self.group(2)
    }
    fn signature(&self) -> &str {
        self.group(3)
    }
}

impl Configured {
    fn params(&self, value: Option<&HeaderValue>) -> Option<Params> {
        let value = value?.clone();
        let s = value.to_str().ok()?;
        let m = self.pattern.captures(s)?;
        let groups = [1, 2, 3, 4].map(|i| m.get(i).map_or(0..0, |g| g.range()));
        Some(Params { value, groups })
    }

    fn fail(&self, req: &mut AccessRequest<'_>, message: &str) -> Access {
        self.anonymous.fail(req, || {
            let mut e = Exit::message(StatusCode::UNAUTHORIZED, message);
            e.headers.push((
                http::header::WWW_AUTHENTICATE,
                self.www_authenticate.clone(),
            ));
            e
        })
    }

    /// Kong's `validate_params`: the enforced headers are all signed, the algorithm allowed.
    fn allowed(&self, p: &Params) -> Option<Algorithm> {
        if self
            .enforce_headers
            .iter()
            .any(|h| !p.headers().split(' ').any(|s| s == h))
        {
            return None;
        }
        Algorithm::parse(p.algorithm()).filter(|a| self.algorithms.contains(a))
    }

    /// Checks the signature (and the body's digest) with the credential found.
    fn verify(
        &self,
        req: &mut AccessRequest<'_>,
        p: &Params,
        alg: Algorithm,
        cred: Option<Arc<Credential>>,
    ) -> Access {
        let Some(cred) = cred else {
            return self.fail(req, NOT_VALID);
        };
        let mut sig = [0u8; 64];
        let sig =
            match base64::engine::general_purpose::STANDARD.decode_slice(p.signature(), &mut sig) {
                Ok(n) => &sig[..n],
                Err(_) => return self.fail(req, NOT_SAME),
            };
        let key = hmac::Key::new(alg.hmac(), &cred.secret);
        let target = if req.target.is_empty() {
            req.path
        } else {
            req.target
        };
        let ok = hmac::verify(&key, signing_string(req, p.headers(), target).as_bytes(), sig)
            .is_ok()
            // Kong still accepts the request line with the normalised path, without the
            // query (deprecated by Kong/kong#3339).
            || (target != req.path
                && hmac::verify(&key, signing_string(req, p.headers(), req.path).as_bytes(), sig)
                    .is_ok());
        if !ok {
            return self.fail(req, NOT_SAME);
        }
        if self.validate_request_body && !body_matches(req.headers, req.body.as_deref()) {
            return self.fail(req, NOT_SAME);
        }
        req.set_consumer(cred.who.clone());
        Access::Continue
    }
}

/// Kong's signing string: for each signed header, `name: value`; `request-line` when no
/// header has that name; `name:` for a header the request lacks; joined by newlines.
fn signing_string(req: &AccessRequest<'_>, signed: &str, target: &str) -> String {
    let mut s = String::with_capacity(128);
    for (i, name) in signed.split(' ').enumerate() {
        if i > 0 {
            s.push('\n');
        }
        match req.headers.get(name).map(|v| v.as_bytes()) {
            Some(v) => {
                s.push_str(name);
                s.push_str(": ");
                s.push_str(&String::from_utf8_lossy(v));
            }
            None if name == "request-line" => {
                s.push_str(req.method);
                s.push(' ');
                s.push_str(target);
                s.push_str(match req.version {
                    http::Version::HTTP_10 => " HTTP/1.0",
                    http::Version::HTTP_2 => " HTTP/2.0",
                    _ => " HTTP/1.1",
                });
            }
            None => {
                s.push_str(name);
                s.push(':');
            }
        }
    }
    s
}

/// Kong's `validate_body`: `Digest: SHA-256=<base64>` of the body; without the header, only
/// an empty body passes.
fn body_matches(headers: &HeaderMap, body: Option<&[u8]>) -> bool {
    let body = body.unwrap_or_default();
    let Some(received) = headers.get("digest") else {
        return body.is_empty();
    };
    let d = digest::digest(&digest::SHA256, body);
    let mut b64 = [0u8; 44];
    let n = base64::engine::general_purpose::STANDARD
        .encode_slice(d.as_ref(), &mut b64)
        .unwrap_or(0);
    let received = received.as_bytes();
    received.len() == 8 + n && received.starts_with(b"SHA-256=") && received[8..] == b64[..n]
}

/// A `Date`/`X-Date` header within `skew` seconds of now.
fn date_ok(headers: &HeaderMap, name: &str, skew: f64) -> bool {
    let Some(t) = headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .and_then(|s| httpdate::parse_http_date(s).ok())
    else {
        return false;
    };
    let t = t
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as f64)
        .unwrap_or(0.0);
    (crate::clock::now_secs() as f64 - t).abs() <= skew
}

impl Handler for Authenticator {
    fn phases(&self) -> crate::Phases {
        crate::Phases::ACCESS
    }
    fn wants_body(&self) -> bool {
        self.0.validate_request_body
    }
    fn access(&self, req: &mut AccessRequest<'_>) -> Access {
        let conf = &self.0;
        if conf.anonymous.already_settled(req) {
            return Access::Continue;
        }
        let authorization = req.headers.get(http::header::AUTHORIZATION);
        let proxy = req.headers.get(http::header::PROXY_AUTHORIZATION);
        if authorization.is_none() && proxy.is_none() {
            return conf.fail(req, UNAUTHORIZED);
        }
        if !(date_ok(req.headers, "x-date", conf.clock_skew)
            || date_ok(req.headers, "date", conf.clock_skew))
        {
            return conf.fail(req, NO_DATE);
        }
        // Proxy-Authorization first, then Authorization; hide_credentials removes the one
        // that was read.
        let (params, from) = match conf.params(proxy) {
            Some(p) => (Some(p), http::header::PROXY_AUTHORIZATION),
            None => (conf.params(authorization), http::header::AUTHORIZATION),
        };
        if conf.hide_credentials {
            req.headers.remove(&from);
        }
        let Some(p) = params else {
            return conf.fail(req, NOT_VALID);
        };
        let Some(alg) = conf.allowed(&p) else {
            return conf.fail(req, NOT_VALID);
        };
        match &conf.credentials {
            Credentials::Snapshot(index) => {
                let cred = index.get(p.username()).cloned();
                conf.verify(req, &p, alg, cred)
            }
            Credentials::Store(state) => {
                if let Some(e) = state.get(p.username()) {
                    return conf.verify(req, &p, alg, e.value);
                }
                let conf = self.0.clone();
                let state = state.clone();
                Access::Wait(Box::pin(async move {
                    let name = p.username().to_string();
                    let (outcome, query) = state
                        .load(name.as_str().into(), name.clone(), name, |f| {
                            credential_of(f, p.username())
                        })
                        .await;
                    let resume: crate::Resume = Box::new(move |req| {
                        crate::credentials::record(query, req);
                        match outcome {
                            Outcome::Found(c) => conf.verify(req, &p, alg, Some(c)),
                            Outcome::Missing => conf.verify(req, &p, alg, None),
                            Outcome::Failed(e) => crate::anonymous::store_failed("hmac-auth", &e),
                        }
                    });
                    resume
                }))
            }
        }
    }
}

/// What a credential found in the store (by `username`) is cached as.
fn credential_of(f: &crate::credentials::Found, username: &str) -> Option<Arc<Credential>> {
    Credential::from_fields(&f.fields, || {
        Identity::new(
            &f.consumer_id,
            f.username.as_deref(),
            f.custom_id.as_deref(),
            Some(&f.id),
        )
        .identified_by(username)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a cached credential costs (its username, its secret, its consumer's identity, the
    /// cache's bookkeeping), against the weight it is counted at.
    #[test]
    fn a_cached_credential_weighs_what_it_takes() {
        if !crate::testing::alone("hmac_auth::tests::a_cached_credential_weighs_what_it_takes") {
            return;
        }
        let cache = state(crate::testing::rows(|v| {
            // A secret as Kong draws one: 32 characters.
            serde_json::json!({"username": v, "secret": "dGhpcyBpcyBhIHNlY3JldCBvZiAzMmI"})
                .as_object()
                .cloned()
                .unwrap()
        }));
        let each = crate::testing::loaded_bytes_each(&cache, "", 50_000, |v| {
            let cache = &cache;
            async move {
                let name = v.clone();
                cache
                    .load(v.as_str().into(), v.clone(), v, |f| credential_of(f, &name))
                    .await;
            }
        });
        let weight = f64::from(CREDENTIAL_WEIGHT);
        assert!(
            weight >= each && weight <= each * 1.25,
            "a cached credential takes {each:.0} bytes, counted at {weight}"
        );
    }

    #[test]
    fn digests_as_kong_computes_them() {
        let mut h = HeaderMap::new();
        assert!(body_matches(&h, None));
        assert!(!body_matches(&h, Some(b"x")));
        // echo -n hello | openssl dgst -sha256 -binary | base64
        h.insert(
            "digest",
            HeaderValue::from_static("SHA-256=LPJNul+wow4m6DsqxbninhsWHlwfp0JecwQzYpOLmCQ="),
        );
        assert!(body_matches(&h, Some(b"hello")));
        assert!(!body_matches(&h, Some(b"hellO")));
    }
}
