//! key-auth (PRIORITY 1250): authenticates a request by an API key sent in a header, a query
//! argument or (with `key_in_body`) a body field, and tells the upstream which consumer it is. Keys are looked up in an index built
//! with the config snapshot: a request costs one hash-map look-up and never a store round trip.
//!
//! Keys are stored as written, as Kong stores them (decK compares a file's keys with the
//! gateway's). With `key_auth_hash_keys = on` a store holds `$sha256$<hex>` digests instead
//! (the key itself is shown once, in the answer to the write that created it), so a database
//! dump does not give the keys away; a request then hashes the key it presents. A look-up by
//! key finds either form, so the property can be turned on or off over existing keys.

mod body;
pub mod daos;
mod index;

pub use index::KeyIndex;
mod schema;

use std::sync::Arc;

use std::borrow::Cow;

use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use serde_json::Value;

use crate::credentials::Outcome;
use crate::{Access, AccessRequest, BuildContext, Exit, Handler, Identity, PluginSpec};

pub struct KeyAuth;

/// How a stored key digest starts.
pub const DIGEST_PREFIX: &str = "$sha256$";

/// A key's digest, the index's and the cache's key.
pub fn digest(key: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(key).into()
}

/// The stored form of a key: its digest, marked.
pub fn stored_form(key: &str) -> String {
    format!("{DIGEST_PREFIX}{}", hex::encode(digest(key.as_bytes())))
}

/// The digest form of a stored key, whichever form it was stored in: what the credential
/// cache files a look-up under (so a write in either form invalidates it).
pub fn stored_form_of(stored: &str) -> String {
    if stored.starts_with(DIGEST_PREFIX) {
        stored.to_string()
    } else {
        stored_form(stored)
    }
}

/// The digest of a key as found in a config: a stored digest, or a key in clear (declarative
/// files, written by people) hashed here.
pub fn digest_of(stored: &str) -> [u8; 32] {
    if let Some(h) = stored.strip_prefix(DIGEST_PREFIX) {
        let mut out = [0u8; 32];
        if hex::decode_to_slice(h, &mut out).is_ok() {
            return out;
        }
    }
    digest(stored.as_bytes())
}

const NO_KEY: &str = "No API key found in request";
const INVALID: &str = "Unauthorized";
const DUPLICATE: &str = "Duplicate API key found";

/// key-auth's part of the node's [`crate::Runtime`]: keys found in a store (database nodes),
/// by the key presented (the digest is computed only to look a key up in the store, not per
/// request). See `crate::credentials`.
pub struct State {
    stored: crate::credentials::Cache<Box<str>, Arc<Identity>>,
}

impl State {
    pub fn new(store: Arc<crate::credentials::Store>) -> State {
        State {
            stored: crate::credentials::Cache::new(store, daos::TABLE, "key"),
        }
    }

    /// Drops cached keys of a credential or consumer that changed (`key`: its stored form).
    pub fn invalidate(&self, id: &str, key: Option<&str>) {
        self.stored.invalidate(id, key);
    }

    pub fn invalidate_all(&self) {
        self.stored.invalidate_all();
    }

    /// The cache's `probe` and `forget` (see `crate::credentials::Cache`), by the key.
    pub fn cache(&self) -> &crate::credentials::Cache<Box<str>, Arc<Identity>> {
        &self.stored
    }

    /// Cached keys (for tests and status).
    pub fn cached_keys(&self) -> u64 {
        self.stored.len()
    }
}

/// Where keys are looked up.
enum Keys {
    /// The snapshot's index (DB-less).
    Snapshot(Arc<KeyIndex>),
    /// The store, through the node's cache.
    Store(Arc<State>),
}

/// The handler; its settings are shared with requests waiting for a store look-up.
struct Authenticator(Arc<Configured>);

struct Configured {
    keys: Keys,
    /// (header name, query argument name) per configured key name.
    names: Vec<(HeaderName, String)>,
    in_header: bool,
    in_query: bool,
    in_body: bool,
    hide_credentials: bool,
    run_on_preflight: bool,
    www_authenticate: HeaderValue,
    /// `Err` when `anonymous` names a consumer that does not exist (Kong answers 500 then).
    anonymous: crate::anonymous::Anonymous,
}

impl PluginSpec for KeyAuth {
    fn name(&self) -> &'static str {
        "key-auth"
    }
    fn priority(&self) -> i32 {
        1250
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
        let names = c
            .key_names
            .iter()
            .filter_map(|n| Some((HeaderName::from_bytes(n.as_bytes()).ok()?, n.clone())))
            .collect();
        let realm = match c.realm.as_deref() {
            Some(r) => format!("Key realm=\"{r}\""),
            None => "Key".to_string(),
        };
        let anonymous = crate::anonymous::Anonymous::new(ctx, c.anonymous.as_deref());
        Ok(Arc::new(Authenticator(Arc::new(Configured {
            keys: if ctx.runtime.credentials.installed() {
                Keys::Store(ctx.runtime.key_auth.clone())
            } else {
                Keys::Snapshot(ctx.shared(KeyIndex::build))
            },
            names,
            in_header: c.key_in_header,
            in_query: c.key_in_query,
            in_body: c.key_in_body,
            hide_credentials: c.hide_credentials,
            run_on_preflight: c.run_on_preflight,
            www_authenticate: HeaderValue::from_str(&realm)
                .map_err(|_| "invalid realm".to_string())?,
            anonymous,
        }))))
    }
}

/// Where a request carried its key.
#[derive(Clone, Copy)]
enum Location {
    Header,
    Query,
    Body,
}

fn content_type(req: &AccessRequest<'_>) -> Option<String> {
    req.headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(String::from)
}

/// Removes one argument from a query string.
fn without_arg(query: &str, name: &str) -> String {
    query
        .split('&')
        .filter(|kv| kv.split_once('=').map_or(*kv, |(k, _)| k) != name)
        .collect::<Vec<_>>()
        .join("&")
}

impl Configured {
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
}

impl Handler for Authenticator {
    fn phases(&self) -> crate::Phases {
        crate::Phases::ACCESS
    }
    fn wants_body(&self) -> bool {
        self.0.in_body
    }

    fn access(&self, req: &mut AccessRequest<'_>) -> Access {
        let conf = &self.0;
        // The key is borrowed from the request while it is looked up; only a store look-up
        // (a cache miss) takes a copy.
        let (who, name, location) = match conf.find_key(req) {
            Found::Nothing => return Access::Continue,
            Found::Fail(message) => return conf.fail(req, message),
            Found::Key(key, name, location) => match &conf.keys {
                Keys::Snapshot(index) => (index.get(&key).cloned(), name, location),
                Keys::Store(state) => match state.stored.get(key.as_ref()) {
                    Some(e) => (e.value, name, location),
                    None => return self.load(state.clone(), key.into_owned(), name, location),
                },
            },
        };
        match who {
            Some(who) => conf.succeed(req, who, name, location),
            None => conf.fail(req, INVALID),
        }
    }
}

/// What a request presents.
enum Found<'r> {
    /// Nothing for this plugin to do (a preflight, a consumer already authenticated).
    Nothing,
    /// Kong's 401 with this message (or the anonymous consumer).
    Fail(&'static str),
    /// A key, the index of its configured name, and where it was.
    Key(std::borrow::Cow<'r, str>, usize, Location),
}

/// What a found key is cached as: its consumer and credential.
fn identity_of(f: &crate::credentials::Found) -> Option<Arc<Identity>> {
    Some(Arc::new(Identity::new(
        &f.consumer_id,
        f.username.as_deref(),
        f.custom_id.as_deref(),
        Some(&f.id),
    )))
}

impl Authenticator {
    /// A key not cached yet: looked up in the store, then the request goes on.
    fn load(&self, state: Arc<State>, key: String, name: usize, location: Location) -> Access {
        let conf = self.0.clone();
        Access::Wait(Box::pin(async move {
            // Found in whichever form it is stored (as written or as a digest); filed under its
            // digest, which a write in either form invalidates.
            let token = stored_form(&key);
            let (outcome, query) = state
                .stored
                .load(key.clone().into_boxed_str(), key, token, identity_of)
                .await;
            let resume: crate::Resume = Box::new(move |req| {
                crate::credentials::record(query, req);
                match outcome {
                    Outcome::Found(who) => conf.succeed(req, who, name, location),
                    Outcome::Missing => conf.fail(req, INVALID),
                    Outcome::Failed(e) => crate::anonymous::store_failed("key-auth", &e),
                }
            });
            resume
        }))
    }
}

impl Configured {
    /// Authenticated: hides the key if asked and names the consumer.
    fn succeed(
        &self,
        req: &mut AccessRequest<'_>,
        who: Arc<Identity>,
        name: usize,
        location: Location,
    ) -> Access {
        if self.hide_credentials {
            let (header, arg) = &self.names[name];
            match location {
                Location::Header => {
                    req.headers.remove(header);
                }
                Location::Query => {
                    if let Some(q) = req.upstream.query.clone().or(req.query.map(String::from)) {
                        req.upstream.query = Some(without_arg(&q, arg));
                    }
                }
                Location::Body => {
                    let stripped = req
                        .body
                        .as_ref()
                        .zip(content_type(req))
                        .and_then(|(b, ct)| body::without(&ct, b, arg));
                    if let Some(b) = stripped {
                        req.body = Some(b);
                    }
                }
            }
        }
        req.set_consumer(who);
        Access::Continue
    }

    /// The key the request presents, borrowed from it (header, query) or read from its body.
    fn find_key<'r>(&self, req: &'r AccessRequest<'_>) -> Found<'r> {
        if !self.run_on_preflight && req.method == "OPTIONS" {
            return Found::Nothing;
        }
        if self.anonymous.already_settled(req) {
            return Found::Nothing;
        }
        let ct = if self.in_body {
            content_type(req)
        } else {
            None
        };
        let headers: &'r HeaderMap = req.headers;
        for (i, (header, arg)) in self.names.iter().enumerate() {
            let found = if self.in_header {
                let mut values = headers.get_all(header).iter();
                match values.next() {
                    Some(_) if values.next().is_some() => return Found::Fail(DUPLICATE),
                    // A key that is not visible ASCII matches no stored key (Kong compares
                    // the bytes and finds none).
                    Some(v) => match v.to_str() {
                        Ok(s) => Some((Cow::Borrowed(s), Location::Header)),
                        Err(_) => return Found::Fail(INVALID),
                    },
                    None => None,
                }
            } else {
                None
            };
            let found = found
                .or_else(|| {
                    self.in_query
                        .then(|| req.query_arg(arg))
                        .flatten()
                        .map(|v| (Cow::Borrowed(v), Location::Query))
                })
                .or_else(|| {
                    let (ct, b) = (ct.as_ref()?, req.body.as_ref()?);
                    body::key(ct, b, arg).map(|v| (Cow::Owned(v), Location::Body))
                });
            if let Some((key, location)) = found {
                if key.is_empty() {
                    break;
                }
                return Found::Key(key, i, location);
            }
        }
        Found::Fail(NO_KEY)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credentials::{CredentialSource, Found, Lookup, Write, Written};

    /// Keys of consumers of their own, as stored: a row id and a consumer each.
    struct Keys;

    impl CredentialSource for Keys {
        fn find(&self, _: &'static str, _: &'static str, value: String) -> Lookup {
            Box::pin(async move {
                // Made-up keys: no credential has them.
                if value.starts_with("miss-") {
                    return Ok(None);
                }
                let n = &value[value.len() - 12..];
                Ok(Some(Found {
                    id: format!("0b5c8a3e-5d6f-4a8b-9c0d-{n}"),
                    fields: serde_json::Map::new(),
                    consumer_id: format!("5d0e3b1a-2c4f-4e6d-8b9a-{n}"),
                    username: Some(format!("consumer-{n}")),
                    custom_id: None,
                }))
            })
        }
        fn write(&self, _: Write) -> Written {
            Box::pin(async { Ok(None) })
        }
    }

    /// Looks `key` up through the cache, as a request does.
    fn load(state: &State, key: String) -> impl std::future::Future<Output = ()> + '_ {
        let token = stored_form(&key);
        async move {
            state
                .stored
                .load(key.clone().into_boxed_str(), key, token, identity_of)
                .await;
        }
    }

    /// What a remembered miss costs here (a made-up key, filed under its digest), against the
    /// weight misses are counted at.
    #[test]
    fn a_cached_miss_weighs_what_it_takes() {
        if !crate::testing::alone("key_auth::tests::a_cached_miss_weighs_what_it_takes") {
            return;
        }
        let state = State::new(crate::testing::store(Arc::new(Keys), 1 << 40));
        let each =
            crate::testing::loaded_bytes_each(&state.stored, "miss-", 20_000, |k| load(&state, k));
        let first = format!("miss-{}", crate::testing::value_of(1_000));
        assert!(state.stored.get(first.as_str()).unwrap().value.is_none());
        let weight = f64::from(crate::credentials::MISS_WEIGHT);
        assert!(
            weight >= each && weight <= each * 1.25,
            "a cached miss takes {each:.0} bytes, counted at {weight}"
        );
    }

    /// What a cached key really costs the node (the key presented, its digest, its consumer's
    /// identity, the cache's bookkeeping), against the weight it is counted at towards
    /// `mem_cache_size`: at or above it, and not far above.
    #[test]
    fn a_cached_key_weighs_what_it_takes() {
        // Counted in a process of its own: other tests' threads free memory this one's cache
        // leaves for later (its table's old arrays), and it theirs.
        if !crate::testing::alone("key_auth::tests::a_cached_key_weighs_what_it_takes") {
            return;
        }
        let state = State::new(crate::testing::store(Arc::new(Keys), 1 << 40));
        let each =
            crate::testing::loaded_bytes_each(&state.stored, "", 50_000, |k| load(&state, k));
        let weight = f64::from(crate::credentials::DEFAULT_WEIGHT);
        assert!(
            weight >= each && weight <= each * 1.25,
            "a cached key takes {each:.0} bytes, counted at {weight}"
        );
    }

    /// A full cache of keys holds what `mem_cache_size` says, within a tenth, in resident
    /// memory (see `crate::testing::fills_to_its_bound`).
    #[test]
    fn a_full_key_cache_holds_its_bound() {
        if !crate::testing::alone("key_auth::tests::a_full_key_cache_holds_its_bound") {
            return;
        }
        const BOUND: u64 = 32 << 20;
        let state = State::new(crate::testing::store(Arc::new(Keys), BOUND));
        crate::testing::fills_to_its_bound(
            BOUND,
            30_000,
            || state.stored.len(),
            |k| load(&state, k),
        );
    }

    #[test]
    fn query_arguments_are_removed_exactly() {
        assert_eq!(without_arg("a=1&apikey=k&b=2", "apikey"), "a=1&b=2");
        assert_eq!(without_arg("apikey=k", "apikey"), "");
        assert_eq!(without_arg("apikey2=x&apikey", "apikey"), "apikey2=x");
    }

    #[test]
    fn keys_are_kept_as_digests() {
        let s = stored_form("secret");
        assert_eq!(
            s,
            "$sha256$2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b"
        );
        assert_eq!(digest_of(&s), digest(b"secret"));
        assert_eq!(digest_of("secret"), digest(b"secret"));
        // Not a valid digest after the prefix: taken as a key in clear.
        assert_eq!(digest_of("$sha256$zz"), digest(b"$sha256$zz"));
    }
}
