//! oauth2 (PRIORITY 1400): authenticates requests bearing an access token that a database
//! holds (`oauth2_tokens`), as Kong's `access.lua` does for proxied requests: the token from
//! `auth_header_name` (`Bearer`/`Token <token>`), else the `access_token` query argument;
//! valid for the route's service (or any, with `global_credentials`) until `expires_in` after
//! it was made; the upstream learns the consumer, the application (`X-Credential-Identifier`:
//! its `client_id`), `X-Authenticated-Scope` and `X-Authenticated-Userid`.
//!
//! A token is looked up by its own unique key, once, and then kept in the node's bounded
//! credential cache for its remaining `ttl`; a token that does not exist is remembered too, so a
//! flood of made-up tokens costs one store read per distinct token. A token deleted or changed
//! in the store is dropped from every node's cache by the config sync's change log.
//!
//! Tokens come from the plugin's own endpoints (`grants.rs`: `.../oauth2/token` and
//! `.../oauth2/authorize` on the plugin's routes) or from other systems through
//! `POST /oauth2_tokens`, as the site in issue #24 wrote them.

pub mod daos;
mod grants;
mod schema;

use std::sync::Arc;

use http::{HeaderName, HeaderValue, StatusCode};
use serde_json::{json, Value};

use crate::credentials::Outcome;
use crate::{Access, AccessRequest, BuildContext, Exit, Handler, Identity, PluginSpec};

pub struct OAuth2;

/// A token as the plugin checks it.
pub struct Token {
    who: Arc<Identity>,
    /// The service it was issued for; `None`: any (only with `global_credentials`). Shared
    /// by the tokens of a service.
    service_id: Option<Arc<str>>,
    /// When it stops working (seconds since the epoch: `created_at + expires_in`);
    /// `u64::MAX`: never (`expires_in` 0).
    expires_at: u64,
    /// `X-Authenticated-Scope`'s bytes then `X-Authenticated-Userid`'s, in one allocation
    /// that every request's header values share (two `HeaderValue`s took 48 more bytes a
    /// token, a million of them in a full cache).
    headers: bytes::Bytes,
    scope_len: u32,
    /// Which of the two the token has: [`SCOPE`], [`USERID`].
    present: u8,
}

const SCOPE: u8 = 1;
const USERID: u8 = 2;

impl Token {
    /// The token's scope and user id as header values (`None`: the token has none).
    fn header_values(&self) -> [Option<HeaderValue>; 2] {
        let at = self.scope_len as usize;
        let value = |bit: u8, range: (std::ops::Bound<usize>, std::ops::Bound<usize>)| {
            (self.present & bit != 0)
                .then(|| HeaderValue::from_maybe_shared(self.headers.slice(range)).ok())
                .flatten()
        };
        use std::ops::Bound::{Excluded, Included, Unbounded};
        [
            value(SCOPE, (Unbounded, Excluded(at))),
            value(USERID, (Included(at), Unbounded)),
        ]
    }
}

/// oauth2's part of the node's [`crate::Runtime`]: tokens found in the store, by access token,
/// and the identities they share (one per application: a million tokens of a few applications
/// hold a few identities).
pub struct State {
    tokens: crate::credentials::Cache<Arc<str>, Arc<Token>>,
    identities: moka::sync::Cache<String, Arc<Identity>>,
}

/// Bytes of a cached token: 500 as `a_cached_token_weighs_what_it_takes` measures them (glibc's
/// count: the key (an access token), its entry, the `Token` with its header values, the index
/// by row, the cache's bookkeeping), and ~630 of resident memory a token in a full cache
/// (`a_full_token_cache_holds_its_bound`: with the evicted keys the cache remembers and its
/// arrays' doubling). 823 in moka, with the row id as text and the header values apart; first
/// counted at 224 while it took ~3.6 times that: a node's 128m `mem_cache_size` then held about
/// 550 MB of tokens.
const TOKEN_WEIGHT: u32 = 608;

/// Bytes of a remembered unknown token (`a_cached_miss_weighs_what_it_takes`: 225; its key is
/// also what a write of it invalidates).
const MISS_WEIGHT: u32 = 248;

impl State {
    pub fn new(store: Arc<crate::credentials::Store>) -> State {
        State {
            tokens: crate::credentials::Cache::weighing(
                store,
                daos::TOKENS,
                "access_token",
                TOKEN_WEIGHT,
            )
            .missing_weighs(MISS_WEIGHT)
            .indexed_by_row(),
            identities: moka::sync::Cache::builder()
                .max_capacity(10_000)
                .support_invalidation_closures()
                .build(),
        }
    }

    /// Drops the cached answer for a token (or the tokens of a consumer) that changed.
    pub fn invalidate(&self, id: &str, access_token: Option<&str>) {
        self.tokens.invalidate(id, access_token);
        // A consumer that changed: the identities naming it go too.
        self.identities.invalidate(id);
        let id = id.to_string();
        let _ = self
            .identities
            .invalidate_entries_if(move |_, who| who.consumer_id() == id);
    }

    /// Drops what is cached for one token row that was written (by its access token and its
    /// id): no scan of the cache, whatever its size, at hundreds of token writes a second.
    pub fn invalidate_token(&self, id: &str, access_token: Option<&str>) {
        self.tokens.invalidate_row(id, access_token);
    }

    /// The token cache's `probe` and `forget` (see `crate::credentials::Cache`), by access
    /// token.
    pub fn tokens(&self) -> &crate::credentials::Cache<Arc<str>, Arc<Token>> {
        &self.tokens
    }

    /// Drops every cached token (an application changed: its tokens carry its client_id).
    pub fn invalidate_all(&self) {
        self.tokens.invalidate_all();
        self.identities.invalidate_all();
    }

    /// Tokens (and known misses) cached, for tests and status.
    pub fn cached(&self) -> u64 {
        self.tokens.len()
    }
}

struct Configured {
    state: Arc<State>,
    /// The endpoints' settings and the snapshot's applications.
    grants: Arc<grants::Settings>,
    clients: Arc<grants::Clients>,
    store: Arc<crate::credentials::Store>,
    accept_terminated: bool,
    header: HeaderName,
    hide_credentials: bool,
    global_credentials: bool,
    missing_challenge: HeaderValue,
    invalid_challenge: HeaderValue,
    anonymous: crate::anonymous::Anonymous,
}

struct Authenticator(Arc<Configured>);

static X_AUTHENTICATED_SCOPE: HeaderName = HeaderName::from_static("x-authenticated-scope");
static X_AUTHENTICATED_USERID: HeaderName = HeaderName::from_static("x-authenticated-userid");
const INVALID: &str = "The access token is invalid or has expired";
const GLOBAL: &str =
    "The access token is global, but the current plugin is configured without 'global_credentials'";

impl PluginSpec for OAuth2 {
    fn name(&self) -> &'static str {
        "oauth2"
    }
    fn priority(&self) -> i32 {
        1400
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
    fn needs_database(&self, _config: &Value) -> Option<(String, String)> {
        Some((
            "name".into(),
            "oauth2 keeps its tokens in a database and is not supported in DB-less mode".into(),
        ))
    }
    fn build(&self, config: &Value, ctx: &BuildContext) -> Result<Arc<dyn Handler>, String> {
        let c: schema::Config = crate::typed(config)?;
        let realm = c.realm.as_deref().unwrap_or("service");
        let anonymous = crate::anonymous::Anonymous::new(ctx, c.anonymous.as_deref());
        let header = |v: String| HeaderValue::from_str(&v).map_err(|_| "invalid realm".to_string());
        let secs = |f: f64| if f > 0.0 { f as u64 } else { 0 };
        let grants = Arc::new(grants::Settings {
            provision_key: c.provision_key.clone(),
            scopes: c.scopes.clone(),
            mandatory_scope: c.mandatory_scope,
            token_expiration: secs(c.token_expiration),
            enable_authorization_code: c.enable_authorization_code,
            enable_implicit_grant: c.enable_implicit_grant,
            enable_client_credentials: c.enable_client_credentials,
            enable_password_grant: c.enable_password_grant,
            accept_http_if_already_terminated: c.accept_http_if_already_terminated,
            refresh_token_ttl: secs(c.refresh_token_ttl),
            reuse_refresh_token: c.reuse_refresh_token,
            global_credentials: c.global_credentials,
            pkce: c.pkce.clone(),
        });
        Ok(Arc::new(Authenticator(Arc::new(Configured {
            state: ctx.runtime.oauth2.clone(),
            accept_terminated: grants.accept_http_if_already_terminated,
            grants,
            clients: ctx.shared(grants::clients),
            store: ctx.runtime.credentials.clone(),
            header: HeaderName::from_bytes(c.auth_header_name.to_ascii_lowercase().as_bytes())
                .map_err(|_| "auth_header_name: invalid header name")?,
            hide_credentials: c.hide_credentials,
            global_credentials: c.global_credentials,
            missing_challenge: header(format!("Bearer realm=\"{realm}\""))?,
            invalid_challenge: header(format!(
                "Bearer realm=\"{realm}\" error=\"invalid_token\" error_description=\"{INVALID}\""
            ))?,
            anonymous,
        }))))
    }
}

impl Token {
    /// From a token row found in the store, with its application in `credential`; the
    /// application's identity is shared through the state's identities, its service's id
    /// through the token cache's shared ids.
    fn from_found(f: &crate::credentials::Found, state: &State) -> Option<Arc<Token>> {
        let identities = &state.identities;
        let str_of = |v: Option<&Value>| v.and_then(|v| v.as_str()).map(String::from);
        let app = f.fields.get("credential")?;
        let client_id = app.get("client_id")?.as_str()?;
        let app_id = str_of(app.get("id"))?;
        // Both header values in one allocation, which their clones (one a request) share: as
        // two values, each took a second allocation at its first clone.
        let valid = |field: &str| {
            f.fields
                .get(field)
                .and_then(Value::as_str)
                .filter(|v| HeaderValue::from_str(v).is_ok())
        };
        let (scope, userid) = (valid("scope"), valid("authenticated_userid"));
        let present = u8::from(scope.is_some()) * SCOPE + u8::from(userid.is_some()) * USERID;
        let (scope, userid) = (scope.unwrap_or(""), userid.unwrap_or(""));
        let headers = bytes::Bytes::from_owner(format!("{scope}{userid}"));
        let who = identities.get_with(app_id.clone(), || {
            Arc::new(
                Identity::new(
                    &f.consumer_id,
                    f.username.as_deref(),
                    f.custom_id.as_deref(),
                    Some(&app_id),
                )
                .identified_by(client_id),
            )
        });
        Some(Arc::new(Token {
            who,
            service_id: f
                .fields
                .get("service")
                .and_then(|s| s.get("id"))
                .and_then(Value::as_str)
                .map(|id| state.tokens.shared_id(id)),
            expires_at: match f.fields.get("expires_in").and_then(Value::as_u64) {
                Some(ttl) if ttl > 0 => f.fields.get("created_at")?.as_u64()?.saturating_add(ttl),
                _ => {
                    f.fields.get("created_at")?.as_u64()?;
                    u64::MAX
                }
            },
            headers,
            scope_len: u32::try_from(scope.len()).ok()?,
            present,
        }))
    }
}

impl Configured {
    fn fail(&self, req: &mut AccessRequest<'_>, missing: bool) -> Access {
        self.anonymous.fail(req, || {
            let (error, description, challenge) = if missing {
                (
                    "invalid_request",
                    "The access token is missing",
                    &self.missing_challenge,
                )
            } else {
                ("invalid_token", INVALID, &self.invalid_challenge)
            };
            let mut e = Exit::message(StatusCode::UNAUTHORIZED, "");
            e.body = serde_json::to_vec(&json!({"error": error, "error_description": description}))
                .unwrap_or_default()
                .into();
            e.headers
                .push((http::header::WWW_AUTHENTICATE, challenge.clone()));
            e
        })
    }

    /// Kong's checks of a token found (or not) for this request.
    fn verify(&self, req: &mut AccessRequest<'_>, token: Option<Arc<Token>>) -> Access {
        let Some(t) = token else {
            return self.fail(req, false);
        };
        // Kong 3.9's `load_token` and `do_authentication`: a token issued for a service is
        // valid on that service only, `global_credentials` or not; a global token (no
        // service) needs `global_credentials`, and without it the request ends with Kong's
        // own description (an exit from the token loader: no challenge header, no anonymous).
        match &t.service_id {
            Some(s) if req.service_id != Some(&**s) => return self.fail(req, false),
            Some(_) => {}
            None if !self.global_credentials => {
                let mut e = Exit::message(StatusCode::UNAUTHORIZED, "");
                e.body = serde_json::to_vec(
                    &json!({"error": "invalid_token", "error_description": GLOBAL}),
                )
                .unwrap_or_default()
                .into();
                return Access::Exit(e);
            }
            None => {}
        }
        if crate::clock::now_secs() > t.expires_at {
            return self.fail(req, false);
        }
        let [scope, userid] = t.header_values();
        for (name, value) in [
            (&X_AUTHENTICATED_SCOPE, scope),
            (&X_AUTHENTICATED_USERID, userid),
        ] {
            match value {
                Some(v) => req.headers.insert(name.clone(), v),
                None => req.headers.remove(name),
            };
        }
        req.set_consumer(t.who.clone());
        Access::Continue
    }

    /// The token of a request (Kong's `parse_access_token`): `Bearer`/`Token` in the header,
    /// else the `access_token` query argument; hidden from the upstream when asked.
    fn token(&self, req: &mut AccessRequest<'_>) -> Option<String> {
        if let Some(v) = req.headers.get(&self.header) {
            let s = v.to_str().ok()?.to_string();
            let parts: Vec<&str> = s.split_ascii_whitespace().collect();
            let token = match parts.as_slice() {
                [scheme, t]
                    if scheme.eq_ignore_ascii_case("bearer")
                        || scheme.eq_ignore_ascii_case("token") =>
                {
                    t.to_string()
                }
                _ => s.clone(),
            };
            if self.hide_credentials {
                req.headers.remove(&self.header);
            }
            return Some(token);
        }
        let in_query = req.query.and_then(|q| {
            q.split('&').find_map(|kv| {
                let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                (k == "access_token").then(|| v.to_string())
            })
        });
        if let Some(token) = in_query {
            if self.hide_credentials {
                let kept: Vec<&str> = req
                    .query
                    .unwrap_or("")
                    .split('&')
                    .filter(|kv| kv.split('=').next() != Some("access_token"))
                    .collect();
                req.upstream.query = Some(kept.join("&"));
            }
            return Some(token);
        }
        // Kong's `retrieve_parameters`: a POST/PUT/PATCH body's, form or JSON.
        req.body.as_ref()?;
        let token = match grants::parameters(req).get("access_token") {
            Some(Value::String(t)) => t.clone(),
            _ => return None,
        };
        if self.hide_credentials {
            hide_in_form_body(req);
        }
        Some(token)
    }
}

/// Takes `access_token` out of a form body (what Kong's `hide_credentials` does to one).
fn hide_in_form_body(req: &mut AccessRequest<'_>) {
    let form = req
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|c| {
            c.to_ascii_lowercase()
                .starts_with("application/x-www-form-urlencoded")
        });
    let Some(text) = req
        .body
        .as_ref()
        .and_then(|b| std::str::from_utf8(b).ok())
        .filter(|_| form)
    else {
        return;
    };
    let kept: Vec<&str> = text
        .split('&')
        .filter(|kv| {
            crate::form::percent_decode(kv.split('=').next().unwrap_or("")) != "access_token"
        })
        .collect();
    // The proxy sends it with its new length.
    req.body = Some(bytes::Bytes::from(kept.join("&")));
}

impl Handler for Authenticator {
    fn phases(&self) -> crate::Phases {
        crate::Phases::ACCESS
    }
    /// The endpoints read their parameters from form or JSON bodies, and a token may come
    /// in a form body too (Kong's `retrieve_parameters`).
    fn wants_body(&self) -> bool {
        true
    }
    fn access(&self, req: &mut AccessRequest<'_>) -> Access {
        let conf = &self.0;
        if let Some(endpoint) = grants::Endpoint::of(req.path) {
            if req.method != "POST" {
                return Access::Exit(grants::invalid_method(endpoint, req.method));
            }
            let call = grants::Call::read(endpoint, req, &conf.header, conf.accept_terminated);
            let (settings, clients, store) = (
                conf.grants.clone(),
                conf.clients.clone(),
                conf.store.clone(),
            );
            return Access::Wait(Box::pin(async move {
                let exit = grants::serve(call, settings, clients, store).await;
                let resume: crate::Resume = Box::new(move |_| Access::Exit(exit));
                resume
            }));
        }
        if conf.anonymous.already_settled(req) {
            return Access::Continue;
        }
        let token = match conf.token(req) {
            Some(t) if !t.is_empty() => t,
            _ => return conf.fail(req, true),
        };
        if let Some(e) = conf.state.tokens.get(token.as_str()) {
            return conf.verify(req, e.value);
        }
        let conf = self.0.clone();
        Access::Wait(Box::pin(async move {
            // The key and the value its writes drop it by: one allocation.
            let key: Arc<str> = Arc::from(token.as_str());
            let (outcome, query) = conf
                .state
                .tokens
                .load(key.clone(), token, key, |f| {
                    Token::from_found(f, &conf.state)
                })
                .await;
            let resume: crate::Resume = Box::new(move |req| {
                crate::credentials::record(query, req);
                match outcome {
                    Outcome::Found(t) => conf.verify(req, Some(t)),
                    Outcome::Missing => conf.verify(req, None),
                    Outcome::Failed(e) => crate::anonymous::store_failed("oauth2", &e),
                }
            });
            resume
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credentials::{CredentialSource, Found, Lookup, Write, Written};

    /// Tokens as `POST /oauth2_tokens` stores them: 32 hex digits, of one application.
    struct Tokens;

    impl CredentialSource for Tokens {
        fn find(&self, _: &'static str, _: &'static str, value: String) -> Lookup {
            let n = value.len();
            Box::pin(async move {
                if value.starts_with("miss-") {
                    return Ok(None);
                }
                let fields = json!({
                    "id": format!("0b5c8a3e-5d6f-4a8b-9c0d-{:012x}", n),
                    "created_at": 1_795_884_202u64,
                    "access_token": value,
                    "token_type": "bearer",
                    "expires_in": 7200,
                    "authenticated_userid": format!("user-{value}"),
                    "scope": "email",
                    "credential": {"id": "c331f311-bc90-495f-bb1b-e6a960a9bf87", "client_id": "app-client-id"},
                    "service": {"id": "9f1c2b3a-4d5e-4f60-8a7b-6c5d4e3f2a10"},
                });
                let Value::Object(fields) = fields else {
                    unreachable!()
                };
                Ok(Some(Found {
                    // A UUID, as the store draws them.
                    id: format!(
                        "{}-{}-{}-{}-{}",
                        &value[..8],
                        &value[8..12],
                        &value[12..16],
                        &value[16..20],
                        &value[20..32]
                    ),
                    fields,
                    consumer_id: "5d0e3b1a-2c4f-4e6d-8b9a-0f1e2d3c4b5a".into(),
                    username: Some("owner".into()),
                    custom_id: None,
                }))
            })
        }
        fn write(&self, _: Write) -> Written {
            Box::pin(async { Ok(None) })
        }
    }

    /// Looks `token` up through the cache, as a request does.
    fn load(state: &State, token: String) -> impl std::future::Future<Output = ()> + '_ {
        let key: Arc<str> = Arc::from(token.as_str());
        async move {
            state
                .tokens
                .load(key.clone(), token, key, |f| Token::from_found(f, state))
                .await;
        }
    }

    /// What a cached token really costs the node (its key, entry, token, the index by row, the
    /// cache's own bookkeeping), against the `TOKEN_WEIGHT` it is counted at towards
    /// `mem_cache_size`: at or above it, so that the bound holds, and not far above.
    #[test]
    fn a_cached_token_weighs_what_it_takes() {
        // Counted in a process of its own: other tests' threads free memory this one's cache
        // leaves for later (its table's old arrays), and it theirs.
        if !crate::testing::alone("oauth2::tests::a_cached_token_weighs_what_it_takes") {
            return;
        }
        let state = State::new(crate::testing::store(Arc::new(Tokens), 1 << 40));
        let each = crate::testing::loaded_bytes_each(&state.tokens, "", 50_000, |token| {
            let state = &state;
            async move {
                load(state, token.clone()).await;
                // As a request through it does: its header values go to the upstream request.
                let t = state.tokens.get(token.as_str()).unwrap().value.unwrap();
                let _sent = t.header_values();
            }
        });
        assert!(
            f64::from(TOKEN_WEIGHT) >= each && f64::from(TOKEN_WEIGHT) <= each * 1.25,
            "a cached token takes {each:.0} bytes, counted at {TOKEN_WEIGHT}"
        );
    }

    /// A full cache holds what `mem_cache_size` says, within a tenth: the tokens' own bytes,
    /// the evicted keys the cache remembers (its ghosts), its index by row, all of it, in the
    /// process's resident memory (the cache's arrays grow by doubling, into pages that count
    /// only once used). Far more tokens than fit are loaded; what the process then holds more
    /// than before is the cache.
    #[test]
    fn a_full_token_cache_holds_its_bound() {
        if !crate::testing::alone("oauth2::tests::a_full_token_cache_holds_its_bound") {
            return;
        }
        const BOUND: u64 = 32 << 20;
        let state = State::new(crate::testing::store(Arc::new(Tokens), BOUND));
        crate::testing::fills_to_its_bound(
            BOUND,
            40_000,
            || state.tokens.len(),
            |t| load(&state, t),
        );
    }

    /// What a remembered miss costs (a made-up token; a flood of them fills the cache with
    /// these), against the weight it is counted at.
    #[test]
    fn a_cached_miss_weighs_what_it_takes() {
        if !crate::testing::alone("oauth2::tests::a_cached_miss_weighs_what_it_takes") {
            return;
        }
        let state = State::new(crate::testing::store(Arc::new(Tokens), 1 << 40));
        let each =
            crate::testing::loaded_bytes_each(&state.tokens, "miss-", 50_000, |t| load(&state, t));
        let weight = f64::from(MISS_WEIGHT);
        assert!(
            weight >= each && weight <= each * 1.25,
            "a cached miss takes {each:.0} bytes, counted at {weight}"
        );
    }
}
