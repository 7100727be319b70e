//! basic-auth (PRIORITY 1100): authenticates `Authorization: Basic` (or
//! `Proxy-Authorization`) against the consumers' basicauth_credentials.
//!
//! Passwords at rest are argon2id hashes (`password.rs`), deliberately slow to verify. So that
//! the steady state costs a hash-map look-up and not a hash computation per request, a
//! verified-credential cache maps a SHA-256 digest of the header value to the stored hash it
//! was checked against (and whether it matched): a cached answer is used only while the
//! credential still holds that same hash, so a changed password or a deleted credential takes
//! effect at once, with no invalidation to miss. Failures are cached too, so retrying one wrong
//! password costs nothing either.
//!
//! Slow verifications run on the blocking pool, at most [`slow_permits`] at a time; a request
//! that waits too long for a turn gets 503 rather than queueing without bound, so a flood of
//! random passwords cannot take the CPU from proxying.

pub mod daos;
pub mod password;
mod schema;

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use http::{HeaderValue, StatusCode};
use serde_json::Value;
use sha2::Digest;

use crate::credentials::Outcome;
use crate::{Access, AccessRequest, BuildContext, Exit, Handler, Identity, PluginSpec};
use password::Secret;

pub struct BasicAuth;

/// A credential as the plugin checks it.
pub struct Credential {
    pub who: Arc<Identity>,
    pub secret: Secret,
    /// The stored form, which the cache compares against.
    pub stored: Arc<str>,
}

/// basicauth_credentials by username (FxHash: only the config inserts usernames).
pub type CredentialIndex = rustc_hash::FxHashMap<Box<str>, Arc<Credential>>;

/// Bytes of a cached credential (`a_cached_credential_weighs_what_it_takes`, glibc's count):
/// 979 with an argon2id password, 850 with Kong's salted SHA-1. They were counted at the
/// default weight, 704 (1,088 in moka, when they took ~300 more): a full cache held ~40% more
/// than `mem_cache_size`.
const CREDENTIAL_WEIGHT: u32 = 1024;

/// basic-auth's part of the node's [`crate::Runtime`]: credentials found in a store
/// (database nodes) by username (see `crate::credentials`), verifications remembered, and
/// the turns for slow ones.
pub struct State {
    stored: crate::credentials::Cache<String, Arc<Credential>>,
    /// Bounded (entries) and timed: an entry lives an hour at most.
    verified: moka::sync::Cache<[u8; 32], Verified>,
    /// Concurrent slow verifications (`slow_permits`).
    slow: tokio::sync::Semaphore,
}

impl State {
    pub fn new(store: Arc<crate::credentials::Store>) -> State {
        State {
            stored: crate::credentials::Cache::weighing(
                store,
                daos::TABLE,
                "username",
                CREDENTIAL_WEIGHT,
            ),
            verified: moka::sync::Cache::builder()
                .max_capacity(100_000)
                .time_to_live(Duration::from_secs(3600))
                .build(),
            slow: tokio::sync::Semaphore::new(slow_permits()),
        }
    }

    /// Drops cached credentials of a credential or consumer that changed.
    pub fn invalidate(&self, id: &str, username: Option<&str>) {
        self.stored.invalidate(id, username);
    }

    pub fn invalidate_all(&self) {
        self.stored.invalidate_all();
    }

    /// The cache's `probe` and `forget` (see `crate::credentials::Cache`), by username.
    pub fn cache(&self) -> &crate::credentials::Cache<String, Arc<Credential>> {
        &self.stored
    }
}

struct Configured {
    /// The snapshot's credentials (DB-less); `None` on a database node.
    credentials: Option<Arc<CredentialIndex>>,
    state: Arc<State>,
    hide_credentials: bool,
    www_authenticate: HeaderValue,
    anonymous: crate::anonymous::Anonymous,
}

/// A verification's outcome, remembered by the digest of the header that carried it.
#[derive(Clone)]
struct Verified {
    stored: Arc<str>,
    ok: bool,
}

/// Concurrent slow verifications: half the cores (at least one), leaving the rest to proxying.
pub fn slow_permits() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get() / 2)
        .unwrap_or(1)
        .max(1)
}

/// How long a request waits for a turn to verify before it is told to come back.
const SLOW_WAIT: Duration = Duration::from_secs(2);

const UNAUTHORIZED: &str = "Unauthorized";
const BUSY: &str = "Too many password verifications in progress, try again later";

impl PluginSpec for BasicAuth {
    fn name(&self) -> &'static str {
        "basic-auth"
    }
    fn priority(&self) -> i32 {
        1100
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
    fn build(&self, config: &Value, ctx: &BuildContext) -> Result<Arc<dyn Handler>, String> {
        let c: schema::Config = crate::typed(config)?;
        let realm = c.realm.as_str();
        let anonymous = crate::anonymous::Anonymous::new(ctx, c.anonymous.as_deref());
        Ok(Arc::new(Authenticator(Arc::new(Configured {
            credentials: (!ctx.runtime.credentials.installed()).then(|| ctx.shared(daos::index)),
            state: ctx.runtime.basic_auth.clone(),
            hide_credentials: c.hide_credentials,
            www_authenticate: HeaderValue::from_str(&format!("Basic realm=\"{realm}\""))
                .map_err(|_| "invalid realm".to_string())?,
            anonymous,
        }))))
    }
}

/// Kong's parsing: `Basic <base64 of username:password>`, scheme case-insensitive.
fn parse(value: &[u8]) -> Option<(String, Vec<u8>)> {
    let s = std::str::from_utf8(value).ok()?.trim_start();
    let (scheme, rest) = s.split_once(|c: char| c.is_ascii_whitespace())?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(rest.trim())
        .ok()?;
    let colon = decoded.iter().position(|&b| b == b':')?;
    let username = String::from_utf8(decoded[..colon].to_vec()).ok()?;
    Some((username, decoded[colon + 1..].to_vec()))
}

impl Configured {
    fn fail(&self, req: &mut AccessRequest<'_>, status: StatusCode, message: &str) -> Access {
        self.anonymous.fail(req, || {
            let mut e = Exit::message(status, message);
            if status == StatusCode::UNAUTHORIZED {
                e.headers.push((
                    http::header::WWW_AUTHENTICATE,
                    self.www_authenticate.clone(),
                ));
            } else {
                e.headers
                    .push((http::header::RETRY_AFTER, HeaderValue::from_static("1")));
            }
            e
        })
    }

    fn succeed(&self, req: &mut AccessRequest<'_>, cred: &Credential) -> Access {
        if self.hide_credentials {
            req.headers.remove(http::header::AUTHORIZATION);
            req.headers.remove(http::header::PROXY_AUTHORIZATION);
        }
        req.set_consumer(cred.who.clone());
        Access::Continue
    }
}

/// The handler; its settings are shared with requests waiting for a slow verification.
struct Authenticator(Arc<Configured>);

impl Handler for Authenticator {
    fn phases(&self) -> crate::Phases {
        crate::Phases::ACCESS
    }
    fn access(&self, req: &mut AccessRequest<'_>) -> Access {
        let conf = &self.0;
        if conf.anonymous.already_settled(req) {
            return Access::Continue;
        }
        // Kong reads Proxy-Authorization first.
        let header = req
            .headers
            .get(http::header::PROXY_AUTHORIZATION)
            .or_else(|| req.headers.get(http::header::AUTHORIZATION));
        let Some(value) = header else {
            return conf.fail(req, StatusCode::UNAUTHORIZED, UNAUTHORIZED);
        };
        // The header's digest keys the verified-credential cache: computed only for slow
        // (argon2) secrets, the ones that cache serves.
        let header = value.clone();
        let Some((username, password)) = parse(value.as_bytes()) else {
            return conf.fail(req, StatusCode::UNAUTHORIZED, UNAUTHORIZED);
        };
        let Some(credentials) = &conf.credentials else {
            // A database node: the credential comes from the store, through the cache.
            if let Some(e) = conf.state.stored.get(&username) {
                return match e.value {
                    Some(cred) => verify(&self.0, req, cred, &header, password),
                    None => conf.fail(req, StatusCode::UNAUTHORIZED, UNAUTHORIZED),
                };
            }
            let conf = self.0.clone();
            return Access::Wait(Box::pin(async move {
                let (outcome, query) = conf
                    .state
                    .stored
                    .load(username.clone(), username.clone(), username, credential_of)
                    .await;
                let resume: crate::Resume = Box::new(move |req| {
                    crate::credentials::record(query, req);
                    match outcome {
                        Outcome::Found(cred) => verify(&conf, req, cred, &header, password),
                        Outcome::Missing => conf.fail(req, StatusCode::UNAUTHORIZED, UNAUTHORIZED),
                        Outcome::Failed(e) => crate::anonymous::store_failed("basic-auth", &e),
                    }
                });
                resume
            }));
        };
        let Some(cred) = credentials.get(username.as_str()).cloned() else {
            return conf.fail(req, StatusCode::UNAUTHORIZED, UNAUTHORIZED);
        };
        verify(&self.0, req, cred, &header, password)
    }
}

/// Checks the password against the credential: at once for cheap forms or a cached
/// verification, else on the blocking pool, in turn.
fn verify(
    conf: &Arc<Configured>,
    req: &mut AccessRequest<'_>,
    cred: Arc<Credential>,
    header: &HeaderValue,
    password: Vec<u8>,
) -> Access {
    if !cred.secret.is_slow() {
        return if cred.secret.verify(&password) {
            conf.succeed(req, &cred)
        } else {
            conf.fail(req, StatusCode::UNAUTHORIZED, UNAUTHORIZED)
        };
    }
    let digest: [u8; 32] = sha2::Sha256::digest(header.as_bytes()).into();
    if let Some(v) = conf.state.verified.get(&digest) {
        if Arc::ptr_eq(&v.stored, &cred.stored) || v.stored == cred.stored {
            return if v.ok {
                conf.succeed(req, &cred)
            } else {
                conf.fail(req, StatusCode::UNAUTHORIZED, UNAUTHORIZED)
            };
        }
    }
    let conf = conf.clone();
    Access::Wait(Box::pin(async move {
        let outcome = match tokio::time::timeout(SLOW_WAIT, conf.state.slow.acquire()).await {
            Ok(Ok(permit)) => {
                let c = cred.clone();
                let ok = tokio::task::spawn_blocking(move || c.secret.verify(&password))
                    .await
                    .unwrap_or(false);
                drop(permit);
                conf.state.verified.insert(
                    digest,
                    Verified {
                        stored: cred.stored.clone(),
                        ok,
                    },
                );
                Some(ok)
            }
            _ => None,
        };
        let resume: crate::Resume = Box::new(move |req| match outcome {
            Some(true) => conf.succeed(req, &cred),
            Some(false) => conf.fail(req, StatusCode::UNAUTHORIZED, UNAUTHORIZED),
            None => conf.fail(req, StatusCode::SERVICE_UNAVAILABLE, BUSY),
        });
        resume
    }))
}

/// What a credential found in the store is cached as.
fn credential_of(f: &crate::credentials::Found) -> Option<Arc<Credential>> {
    let stored = f.fields.get("password")?.as_str()?;
    Some(Arc::new(Credential {
        who: Arc::new(
            Identity::new(
                &f.consumer_id,
                f.username.as_deref(),
                f.custom_id.as_deref(),
                Some(&f.id),
            )
            .identified_by(f.fields.get("username").and_then(|v| v.as_str())?),
        ),
        secret: Secret::from_stored(stored, &f.consumer_id),
        stored: stored.into(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a cached credential costs (its username, the stored password, its consumer's
    /// identity, the cache's bookkeeping), against the weight it is counted at: an argon2id
    /// password as the Admin API stores it, and Kong's salted SHA-1 as a migrated one is.
    #[test]
    fn a_cached_credential_weighs_what_it_takes() {
        if !crate::testing::alone("basic_auth::tests::a_cached_credential_weighs_what_it_takes") {
            return;
        }
        let mut wrong = Vec::new();
        for (kind, fields) in [
            (
                "argon2id",
                (|v: &str| {
                    let phc = "$argon2id$v=19$m=19456,t=2,p=1$c2FsdHNhbHRzYWx0c2FsdA$\
                               Zm9vYmFyYmF6cXV4Zm9vYmFyYmF6cXV4Zm9vYmFyYmE";
                    serde_json::json!({"username": v, "password": phc})
                        .as_object()
                        .cloned()
                        .unwrap()
                }) as fn(&str) -> serde_json::Map<String, serde_json::Value>,
            ),
            ("sha1", |v: &str| {
                serde_json::json!({"username": v, "password": "5baa61e4c9b93f3f0682250b6cf8331b7ee68fd8"})
                    .as_object()
                    .cloned()
                    .unwrap()
            }),
        ] {
            let state = State::new(crate::testing::rows(fields));
            let each = crate::testing::loaded_bytes_each(&state.stored, "", 50_000, |v| async {
                state
                    .stored
                    .load(v.clone(), v.clone(), v, credential_of)
                    .await;
            });
            let weight = f64::from(CREDENTIAL_WEIGHT);
            if !(weight >= each && weight <= each * 1.25) {
                wrong.push(format!(
                    "{kind}: a cached credential takes {each:.0} bytes, counted at {weight}"
                ));
            }
        }
        assert!(wrong.is_empty(), "{wrong:?}");
    }

    #[test]
    fn parses_like_kong() {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        assert_eq!(
            parse(format!("Basic {}", b64("al:pa:ss")).as_bytes()),
            Some(("al".into(), b"pa:ss".to_vec()))
        );
        assert_eq!(
            parse(format!("  basic   {}", b64("al:")).as_bytes()),
            Some(("al".into(), Vec::new()))
        );
        assert_eq!(parse(format!("Bearer {}", b64("a:b")).as_bytes()), None);
        assert_eq!(parse(b"Basic !!!"), None);
        assert_eq!(parse(format!("Basic {}", b64("nocolon")).as_bytes()), None);
        assert_eq!(parse(b"Basic"), None);
        assert_eq!(parse(&[0xff, 0xfe]), None);
    }
}
