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
    /// The service it was issued for; `None`: any (only with `global_credentials`).
    service_id: Option<String>,
    created_at: u64,
    expires_in: u64,
    scope: Option<HeaderValue>,
    userid: Option<HeaderValue>,
}

/// oauth2's part of the node's [`crate::Runtime`]: tokens found in the store, by access token,
/// and the identities they share (one per application: a million tokens of a few applications
/// hold a few identities).
pub struct State {
    tokens: crate::credentials::Cache<Box<str>, Arc<Token>>,
    identities: moka::sync::Cache<String, Arc<Identity>>,
}

/// Bytes of a cached token: the key (an access token), the `Token` with its two header values,
/// an `Arc` to its application's identity, the cache's own overhead.
const TOKEN_WEIGHT: u32 = 224;

impl State {
    pub fn new(store: Arc<crate::credentials::Store>) -> State {
        State {
            tokens: crate::credentials::Cache::weighing(
                store,
                daos::TOKENS,
                "access_token",
                TOKEN_WEIGHT,
            )
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

impl PluginSpec for OAuth2 {
    fn name(&self) -> &'static str {
        "oauth2"
    }
    fn priority(&self) -> i32 {
        1400
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
    fn shorthands(&self, config: &mut Value) {
        // Kong draws a provision_key when the config is written.
        if let Some(m) = config.as_object_mut() {
            if m.get("provision_key").is_none_or(|v| v.is_null()) {
                m.insert(
                    "provision_key".into(),
                    Value::from(uuid::Uuid::new_v4().simple().to_string()),
                );
            }
        }
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
    /// application's identity is shared through `identities`.
    fn from_found(
        f: &crate::credentials::Found,
        identities: &moka::sync::Cache<String, Arc<Identity>>,
    ) -> Option<Arc<Token>> {
        let str_of = |v: Option<&Value>| v.and_then(|v| v.as_str()).map(String::from);
        let app = f.fields.get("credential")?;
        let client_id = app.get("client_id")?.as_str()?;
        let app_id = str_of(app.get("id"))?;
        let header = |v: Option<&Value>| {
            v.and_then(|v| v.as_str())
                .and_then(|s| HeaderValue::from_str(s).ok())
        };
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
            service_id: str_of(f.fields.get("service").and_then(|s| s.get("id"))),
            created_at: f.fields.get("created_at")?.as_u64()?,
            expires_in: f
                .fields
                .get("expires_in")
                .and_then(|v| v.as_u64())
                .unwrap_or(0),
            scope: header(f.fields.get("scope")),
            userid: header(f.fields.get("authenticated_userid")),
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
        let for_service = match &t.service_id {
            Some(s) => self.global_credentials || req.service_id == Some(s.as_str()),
            None => self.global_credentials,
        };
        if !for_service {
            return self.fail(req, false);
        }
        if t.expires_in > 0 && crate::clock::now_secs().saturating_sub(t.created_at) > t.expires_in
        {
            return self.fail(req, false);
        }
        for (name, value) in [
            (&X_AUTHENTICATED_SCOPE, &t.scope),
            (&X_AUTHENTICATED_USERID, &t.userid),
        ] {
            match value {
                Some(v) => req.headers.insert(name.clone(), v.clone()),
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
                req.upstream_query = Some(kept.join("&"));
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
            let (outcome, query) = conf
                .state
                .tokens
                .load(token.as_str().into(), token.clone(), token, |f| {
                    Token::from_found(f, &conf.state.identities)
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
