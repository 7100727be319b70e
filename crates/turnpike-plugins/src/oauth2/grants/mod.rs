//! oauth2's endpoints on the proxy, as Kong's `access.lua` serves them on every route the
//! plugin runs on: `POST .../oauth2/token` (grants `authorization_code` with PKCE,
//! `client_credentials`, `password`, `refresh_token`) and `POST .../oauth2/authorize`
//! (`response_type` `code` or `token`, the implicit grant). Parameters come from the query
//! and, for POST, the form or JSON body (the body wins). Tokens and codes are written through
//! the store like an Admin API write, so every node's cache learns of them the same way.
//! Applications (`oauth2_credentials`) come from the snapshot, by `client_id`.

use std::collections::HashMap;
use std::sync::Arc;

use base64::Engine;
use http::{HeaderValue, StatusCode};
use serde_json::{Map, Value};
use sha2::Digest;

use super::daos;
use crate::credentials::Write;
use crate::{AccessRequest, Exit};

mod authorize;
use authorize::authorize;
#[cfg(test)]
use authorize::with_params;

/// Which endpoint a path names (Kong: the path ends with it, a final `/` allowed).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Endpoint {
    Token,
    Authorize,
}

impl Endpoint {
    pub fn of(path: &str) -> Option<Endpoint> {
        let p = path.strip_suffix('/').unwrap_or(path);
        if p.ends_with("/oauth2/token") {
            Some(Endpoint::Token)
        } else if p.ends_with("/oauth2/authorize") {
            Some(Endpoint::Authorize)
        } else {
            None
        }
    }

    fn name(self) -> &'static str {
        match self {
            Endpoint::Token => "token",
            Endpoint::Authorize => "authorization",
        }
    }
}

/// An application (`oauth2_credentials`), as the endpoints check it.
pub struct Client {
    id: String,
    client_secret: String,
    hash_secret: bool,
    redirect_uris: Vec<String>,
    public: bool,
}

/// The snapshot's applications by `client_id` (built once per snapshot).
#[derive(Default)]
pub struct Clients(HashMap<String, Arc<Client>>);

pub fn clients(ctx: &crate::BuildContext<'_>) -> Clients {
    let mut m = HashMap::new();
    for c in ctx
        .config
        .credentials
        .iter()
        .filter(|c| c.table == daos::TABLE)
    {
        let s = |f: &str| c.fields.get(f).and_then(|v| v.as_str());
        let Some(client_id) = s("client_id") else {
            continue;
        };
        let redirect_uris = c
            .fields
            .get("redirect_uris")
            .and_then(|v| v.as_array())
            .map(|a| {
                a.iter()
                    .filter_map(|u| u.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        m.insert(
            client_id.to_string(),
            Arc::new(Client {
                id: c.id.clone(),
                client_secret: s("client_secret").unwrap_or_default().to_string(),
                hash_secret: c.fields.get("hash_secret").and_then(|v| v.as_bool()) == Some(true),
                redirect_uris,
                public: s("client_type") == Some("public"),
            }),
        );
    }
    Clients(m)
}

/// What the endpoints read of the plugin's config.
pub struct Settings {
    pub provision_key: Option<String>,
    pub scopes: Option<Vec<String>>,
    pub mandatory_scope: bool,
    pub token_expiration: u64,
    pub enable_authorization_code: bool,
    pub enable_implicit_grant: bool,
    pub enable_client_credentials: bool,
    pub enable_password_grant: bool,
    pub accept_http_if_already_terminated: bool,
    pub refresh_token_ttl: u64,
    pub reuse_refresh_token: bool,
    pub global_credentials: bool,
    /// `none`, `lax` or `strict`.
    pub pkce: String,
}

/// Everything an endpoint needs from the request, taken before it waits on the store.
pub struct Call {
    endpoint: Endpoint,
    params: Map<String, Value>,
    /// `Some(error)` when the request is not over HTTPS as the config wants.
    https_error: Option<&'static str>,
    /// The `auth_header_name` header's value.
    authorization: Option<String>,
    service_id: Option<String>,
}

const NO_HTTPS: &str = "You must use HTTPS";

/// Kong's `invalid_oauth2_method`: anything but POST at an endpoint.
pub fn invalid_method(endpoint: Endpoint, method: &str) -> Exit {
    let description = format!(
        "The HTTP method {method} is invalid for the {} endpoint",
        endpoint.name()
    );
    let mut e = json_exit(
        StatusCode::METHOD_NOT_ALLOWED,
        &error_body("invalid_method", &description),
    );
    if let Ok(v) = HeaderValue::from_str(&format!(
        "Bearer realm=\"service\" error=\"invalid_method\" error_description=\"{description}\""
    )) {
        e.headers.push((http::header::WWW_AUTHENTICATE, v));
    }
    e
}

impl Call {
    /// Reads the request: its parameters (query, then the body of a POST/PUT/PATCH: form or
    /// JSON), whether it came over HTTPS, its Authorization header.
    pub fn read(
        endpoint: Endpoint,
        req: &AccessRequest<'_>,
        auth_header: &http::HeaderName,
        accept_terminated: bool,
    ) -> Call {
        Call {
            endpoint,
            params: parameters(req),
            https_error: https_error(req, accept_terminated),
            authorization: req
                .headers
                .get(auth_header)
                .and_then(|v| v.to_str().ok())
                .map(String::from),
            service_id: req.service_id.map(String::from),
        }
    }
}

/// Kong's `retrieve_parameters`: the query's arguments, overridden by the body's.
pub fn parameters(req: &AccessRequest<'_>) -> Map<String, Value> {
    let mut m = Map::new();
    for (k, v) in crate::form::pairs(req.query.unwrap_or("")) {
        m.entry(k).or_insert(Value::String(v));
    }
    if !matches!(req.method, "POST" | "PUT" | "PATCH") {
        return m;
    }
    let Some(body) = req.body.as_ref() else {
        return m;
    };
    let ctype = req
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    if ctype.starts_with("application/json") {
        if let Ok(Value::Object(o)) = serde_json::from_slice::<Value>(body) {
            m.extend(o);
        }
    } else if ctype.starts_with("application/x-www-form-urlencoded") {
        if let Ok(text) = std::str::from_utf8(body) {
            for (k, v) in crate::form::pairs(text) {
                m.insert(k, Value::String(v));
            }
        }
    }
    m
}

/// Kong's `check_https`: the connection's TLS, or, with `accept_http_if_already_terminated`,
/// a trusted peer's single `X-Forwarded-Proto: https`.
fn https_error(req: &AccessRequest<'_>, accept_terminated: bool) -> Option<&'static str> {
    if req.tls {
        return None;
    }
    if !accept_terminated || !req.trusted {
        return Some(NO_HTTPS);
    }
    let mut protos = req.headers.get_all("x-forwarded-proto").iter();
    match (protos.next(), protos.next()) {
        (Some(_), Some(_)) => Some("Only one X-Forwarded-Proto header allowed"),
        (Some(p), None) if p.as_bytes().eq_ignore_ascii_case(b"https") => None,
        _ => Some(NO_HTTPS),
    }
}

fn error_body(error: &str, description: &str) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("error".into(), Value::from(error));
    m.insert("error_description".into(), Value::from(description));
    m
}

fn json_exit(status: StatusCode, body: &Map<String, Value>) -> Exit {
    let mut e = Exit::message(status, "");
    e.body = serde_json::to_vec(body).unwrap_or_default().into();
    e
}

/// The endpoints' answer: Kong's status, body and `Cache-Control: no-store`.
fn answer(status: StatusCode, body: &Map<String, Value>, www_authenticate: bool) -> Exit {
    let mut e = json_exit(status, body);
    e.headers.push((
        http::header::CACHE_CONTROL,
        HeaderValue::from_static("no-store"),
    ));
    e.headers
        .push((http::header::PRAGMA, HeaderValue::from_static("no-cache")));
    if www_authenticate {
        e.headers.push((
            http::header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Basic realm=\"OAuth2.0\""),
        ));
    }
    e
}

/// Kong's `random_string`.
fn random_string() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

fn str_param<'a>(p: &'a Map<String, Value>, k: &str) -> Option<&'a str> {
    p.get(k).and_then(|v| v.as_str())
}

/// Kong's `retrieve_scope`: the requested scopes, each one the config offers.
fn scope(p: &Map<String, Value>, s: &Settings) -> Result<Option<String>, Map<String, Value>> {
    let requested = p.get("scope");
    match (&s.scopes, requested) {
        (Some(offered), Some(v)) => {
            let Some(text) = v.as_str() else {
                return Err(error_body("invalid_scope", "scope must be a string"));
            };
            let mut out = Vec::new();
            for w in text.split_whitespace() {
                if !offered.iter().any(|o| o == w) {
                    return Err(error_body(
                        "invalid_scope",
                        &format!("\"{w}\" is an invalid scope"),
                    ));
                }
                out.push(w);
            }
            Ok((!out.is_empty()).then(|| out.join(" ")))
        }
        (_, None) if s.mandatory_scope => {
            Err(error_body("invalid_scope", "You must specify a scope"))
        }
        _ => Ok(None),
    }
}

fn base64url(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// Kong's `retrieve_code_challenge`: the challenge in its canonical base64url form, and the
/// method (only `S256`).
fn code_challenge(p: &Map<String, Value>) -> Result<Option<String>, String> {
    let challenge = str_param(p, "code_challenge");
    let method = str_param(p, "code_challenge_method");
    if method.is_some() && challenge.is_none() {
        return Err("code_challenge is required when code_method is present".into());
    }
    let Some(c) = challenge else {
        return Ok(None);
    };
    if let Some(m) = method {
        if m != "S256" && m != "s256" {
            return Err("code_challenge_method is not supported, must be S256".into());
        }
    }
    let trimmed = c.trim_end_matches('=');
    let canonical = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(trimmed)
        .map(|b| base64url(&b))
        .unwrap_or_else(|_| c.to_string());
    Ok(Some(canonical))
}

fn requires_pkce(s: &Settings, client: &Client, used_pkce: bool) -> bool {
    used_pkce || (client.public && s.pkce != "none") || (!client.public && s.pkce == "strict")
}

/// Kong's `validate_pkce_verifier`.
fn check_verifier(p: &Map<String, Value>, challenge: Option<&str>) -> Option<Map<String, Value>> {
    let verifier = match p.get("code_verifier") {
        None => {
            return Some(error_body(
                "invalid_request",
                "code_verifier is required for PKCE authorization requests",
            ))
        }
        Some(Value::String(v)) => v,
        Some(_) => {
            return Some(error_body(
                "invalid_request",
                "code_verifier is not a string",
            ))
        }
    };
    if verifier.len() < 43 || verifier.len() > 128 {
        return Some(error_body(
            "invalid_request",
            "code_verifier must be between 43 and 128 characters",
        ));
    }
    let computed = base64url(&sha2::Sha256::digest(verifier.as_bytes()));
    if challenge != Some(computed.as_str()) {
        return Some(error_body("invalid_grant", "Invalid code"));
    }
    None
}

/// Whether `secret` is the application's: hashed (`hash_secret`, Kong's argon2id form) or
/// as stored, compared in constant time.
fn secret_matches(client: &Client, secret: Option<&str>) -> bool {
    let secret = secret.unwrap_or("");
    if client.hash_secret && client.client_secret.starts_with("$argon2") {
        // The argon2id PHC form basic-auth stores passwords in.
        return crate::basic_auth::password::Secret::Argon2(client.client_secret.clone())
            .verify(secret.as_bytes());
    }
    use subtle::ConstantTimeEq;
    bool::from(client.client_secret.as_bytes().ct_eq(secret.as_bytes()))
}

/// Kong's `retrieve_client_credentials`: `client_id` and `client_secret` parameters, else
/// HTTP Basic in the auth header, else a lone `client_id`.
fn client_credentials(call: &Call) -> (Option<String>, Option<String>, bool) {
    let p = &call.params;
    if let (Some(id), Some(secret)) = (str_param(p, "client_id"), str_param(p, "client_secret")) {
        return (Some(id.into()), Some(secret.into()), false);
    }
    if let Some(h) = &call.authorization {
        let t = h.trim_start();
        let rest = t
            .strip_prefix("Basic")
            .or_else(|| t.strip_prefix("basic"))
            .map(str::trim_start);
        let decoded = rest
            .and_then(|b| {
                base64::engine::general_purpose::STANDARD
                    .decode(b.trim())
                    .ok()
            })
            .and_then(|b| String::from_utf8(b).ok());
        return match decoded {
            Some(d) => {
                let mut parts = d.split(':');
                let id = parts.next().map(String::from);
                let secret = parts.next().map(String::from);
                (id, secret, true)
            }
            None => (None, None, true),
        };
    }
    (str_param(p, "client_id").map(String::from), None, false)
}

/// The state of an endpoint's answer: Kong's `response_params`.
struct Response {
    params: Map<String, Value>,
    /// 401 with `WWW-Authenticate: Basic` (client authentication by header failed).
    basic_challenge: bool,
}

impl Response {
    fn new() -> Response {
        Response {
            params: Map::new(),
            basic_challenge: false,
        }
    }
    fn error(&mut self, error: &str, description: &str) {
        self.params = error_body(error, description);
    }
    fn failed(&self) -> bool {
        self.params.contains_key("error")
    }
}

/// Runs an endpoint: the answer the client gets.
pub async fn serve(
    call: Call,
    s: Arc<Settings>,
    clients: Arc<Clients>,
    store: Arc<crate::credentials::Store>,
) -> Exit {
    let result = match call.endpoint {
        Endpoint::Token => issue_token(&call, &s, &clients, &store).await,
        Endpoint::Authorize => authorize(&call, &s, &clients, &store).await,
    };
    result.unwrap_or_else(|e| {
        tracing::error!("oauth2: the store failed: {e}");
        Exit::message(
            StatusCode::INTERNAL_SERVER_ERROR,
            "An unexpected error occurred",
        )
    })
}

/// Who a token is for: the application, the end user, the scopes granted.
struct Grant<'a> {
    client: &'a Client,
    userid: Option<&'a str>,
    scope: Option<&'a str>,
}

impl<'a> Grant<'a> {
    /// The grant a stored code or token carries (its user and scopes), for `client`.
    fn stored(client: &'a Client, row: &'a crate::credentials::Found) -> Grant<'a> {
        let field = |f: &str| row.fields.get(f).and_then(|v| v.as_str());
        Grant {
            client,
            userid: field("authenticated_userid"),
            scope: field("scope"),
        }
    }
}

/// Kong's `generate_token`: a new token (or, with `reuse_refresh_token`, the refreshed one
/// given a new access token), answered as the client sees it.
async fn generate_token(
    s: &Settings,
    store: &crate::credentials::Store,
    service_id: Option<&str>,
    grant: Grant<'_>,
    disable_refresh: bool,
    existing: Option<&crate::credentials::Found>,
) -> Result<Map<String, Value>, String> {
    let Grant {
        client,
        userid,
        scope,
    } = grant;
    let expiration = s.token_expiration;
    let ttl = (expiration > 0 && s.refresh_token_ttl > 0).then_some(s.refresh_token_ttl);
    let access_token = random_string();
    let mut refresh_token = None;
    let saved = match existing {
        Some(old) if s.reuse_refresh_token => {
            refresh_token = old
                .fields
                .get("refresh_token")
                .and_then(|v| v.as_str())
                .map(String::from);
            let mut patch = Map::new();
            patch.insert("access_token".into(), Value::from(access_token));
            patch.insert("expires_in".into(), Value::from(expiration));
            patch.insert("created_at".into(), Value::from(crate::clock::now_secs()));
            if let Some(t) = ttl {
                patch.insert("ttl".into(), Value::from(t));
            }
            store
                .write(Write::Update {
                    table: daos::TOKENS,
                    id: old.id.clone(),
                    patch,
                })
                .await?
        }
        _ => {
            if !disable_refresh && expiration > 0 {
                refresh_token = Some(random_string());
            }
            let mut e = Map::new();
            if !s.global_credentials {
                if let Some(sid) = service_id {
                    e.insert("service".into(), serde_json::json!({ "id": sid }));
                }
            }
            e.insert("credential".into(), serde_json::json!({ "id": client.id }));
            if let Some(u) = userid {
                e.insert("authenticated_userid".into(), Value::from(u));
            }
            e.insert("expires_in".into(), Value::from(expiration));
            if let Some(r) = &refresh_token {
                e.insert("refresh_token".into(), Value::from(r.as_str()));
            }
            if let Some(sc) = scope {
                e.insert("scope".into(), Value::from(sc));
            }
            e.insert("access_token".into(), Value::from(access_token));
            if let Some(t) = ttl {
                e.insert("ttl".into(), Value::from(t));
            }
            store
                .write(Write::Insert {
                    table: daos::TOKENS,
                    entity: e,
                })
                .await?
        }
    }
    .ok_or("the store answered no token")?;
    let mut out = Map::new();
    out.insert(
        "access_token".into(),
        saved.get("access_token").cloned().unwrap_or(Value::Null),
    );
    out.insert("token_type".into(), Value::from("bearer"));
    if expiration > 0 {
        out.insert("expires_in".into(), Value::from(expiration));
    }
    if let Some(r) = refresh_token {
        out.insert("refresh_token".into(), Value::from(r));
    }
    Ok(out)
}

/// The service id a stored token or code is for (`None`: any).
fn service_of(f: &crate::credentials::Found) -> Option<&str> {
    f.fields
        .get("service")
        .and_then(|s| s.get("id"))
        .and_then(|v| v.as_str())
}

fn credential_of(f: &crate::credentials::Found) -> Option<&str> {
    f.fields
        .get("credential")
        .and_then(|s| s.get("id"))
        .and_then(|v| v.as_str())
}

async fn issue_token(
    call: &Call,
    s: &Settings,
    clients: &Clients,
    store: &crate::credentials::Store,
) -> Result<Exit, String> {
    let p = &call.params;
    let mut r = Response::new();
    let state = p.get("state").cloned();
    if let Some(e) = call.https_error {
        r.error("access_denied", e);
        return Ok(finish_token(r, state));
    }
    let grant = str_param(p, "grant_type").unwrap_or("");
    let supported = matches!(grant, "authorization_code" | "refresh_token")
        || (s.enable_client_credentials && grant == "client_credentials")
        || (s.enable_password_grant && grant == "password");
    if !supported {
        r.error("unsupported_grant_type", "Invalid grant_type");
    }
    let (client_id, client_secret, from_header) = client_credentials(call);
    let client = client_id
        .as_deref()
        .filter(|c| !c.is_empty())
        .and_then(|c| clients.0.get(c))
        .cloned();
    if grant != "client_credentials" {
        match &client {
            Some(c) => {
                let uri =
                    str_param(p, "redirect_uri").or(c.redirect_uris.first().map(|u| u.as_str()));
                if !uri.is_some_and(|u| c.redirect_uris.iter().any(|a| a == u)) {
                    r.error(
                        "invalid_request",
                        "Invalid redirect_uri that does not match with any redirect_uri created with the application",
                    );
                }
            }
            None => {
                r.error("invalid_client", "Invalid client authentication");
                r.basic_challenge = from_header;
            }
        }
    }
    if let Some(c) = &client {
        if !c.public {
            if !secret_matches(c, client_secret.as_deref()) {
                r.error("invalid_client", "Invalid client authentication");
                r.basic_challenge = from_header;
            }
        } else if client_secret
            .as_deref()
            .is_some_and(|x| !x.trim().is_empty())
        {
            r.error(
                "invalid_request",
                "client_secret is disallowed for public clients",
            );
        }
    }
    if r.failed() {
        return Ok(finish_token(r, state));
    }
    let service_id = call.service_id.as_deref();
    let own_service = if s.global_credentials {
        None
    } else {
        service_id
    };
    match grant {
        "authorization_code" => {
            let client = client.expect("checked above");
            let code = match str_param(p, "code") {
                Some(c) => store.find(daos::CODES, "code", c.to_string()).await?,
                None => None,
            };
            let valid = code.as_ref().filter(|c| {
                own_service.is_none_or(|sid| service_of(c) == Some(sid))
                    && credential_of(c) == Some(client.id.as_str())
            });
            match valid {
                None => r.error("invalid_request", "Invalid code"),
                Some(code) => {
                    let challenge = code.fields.get("challenge").and_then(|v| v.as_str());
                    let used = code
                        .fields
                        .get("challenge_method")
                        .is_some_and(|v| v.is_string());
                    let pkce_error = requires_pkce(s, &client, used)
                        .then(|| check_verifier(p, challenge))
                        .flatten();
                    match pkce_error {
                        Some(e) => r.params = e,
                        None => {
                            r.params = generate_token(
                                s,
                                store,
                                service_id,
                                Grant::stored(&client, code),
                                false,
                                None,
                            )
                            .await?;
                            // A code works once.
                            store
                                .write(Write::Delete {
                                    table: daos::CODES,
                                    id: code.id.clone(),
                                })
                                .await?;
                        }
                    }
                }
            }
        }
        "client_credentials" => {
            let userid = str_param(p, "authenticated_userid");
            if p.contains_key("authenticated_userid")
                && s.provision_key.as_deref() != str_param(p, "provision_key")
            {
                r.error("invalid_provision_key", "Invalid provision_key");
            } else if let Some(client) = &client {
                match scope(p, s) {
                    Err(e) => r.params = e,
                    Ok(sc) => {
                        r.params = generate_token(
                            s,
                            store,
                            service_id,
                            Grant {
                                client,
                                userid,
                                scope: sc.as_deref(),
                            },
                            true,
                            None,
                        )
                        .await?
                    }
                }
            } else {
                r.error("invalid_client", "Invalid client authentication");
            }
        }
        "password" => {
            let client = client.expect("checked above");
            let userid = str_param(p, "authenticated_userid");
            if s.provision_key.as_deref() != str_param(p, "provision_key") {
                r.error("invalid_provision_key", "Invalid provision_key");
            } else if userid.is_none_or(|u| u.trim().is_empty()) {
                r.error(
                    "invalid_authenticated_userid",
                    "Missing authenticated_userid parameter",
                );
            } else {
                match scope(p, s) {
                    Err(e) => r.params = e,
                    Ok(sc) => {
                        r.params = generate_token(
                            s,
                            store,
                            service_id,
                            Grant {
                                client: &client,
                                userid,
                                scope: sc.as_deref(),
                            },
                            false,
                            None,
                        )
                        .await?
                    }
                }
            }
        }
        _ => {
            // refresh_token
            let client = client.expect("checked above");
            let token = match str_param(p, "refresh_token") {
                Some(t) => {
                    store
                        .find(daos::TOKENS, "refresh_token", t.to_string())
                        .await?
                }
                None => None,
            };
            match token
                .as_ref()
                .filter(|t| own_service.is_none_or(|sid| service_of(t) == Some(sid)))
            {
                None => r.error("invalid_request", "Invalid refresh_token"),
                Some(t) if credential_of(t) != Some(client.id.as_str()) => {
                    r.error("invalid_client", "Invalid client authentication")
                }
                Some(t) => {
                    r.params = generate_token(
                        s,
                        store,
                        service_id,
                        Grant::stored(&client, t),
                        false,
                        Some(t),
                    )
                    .await?;
                    if !s.reuse_refresh_token {
                        store
                            .write(Write::Delete {
                                table: daos::TOKENS,
                                id: t.id.clone(),
                            })
                            .await?;
                    }
                }
            }
        }
    }
    Ok(finish_token(r, state))
}

fn finish_token(mut r: Response, state: Option<Value>) -> Exit {
    if let Some(st) = state {
        r.params.insert("state".into(), st);
    }
    let status = match (r.failed(), r.basic_challenge) {
        (false, _) => StatusCode::OK,
        (true, true) => StatusCode::UNAUTHORIZED,
        (true, false) => StatusCode::BAD_REQUEST,
    };
    answer(status, &r.params, r.failed() && r.basic_challenge)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_found_at_the_end_of_the_path() {
        assert_eq!(Endpoint::of("/api/oauth2/token"), Some(Endpoint::Token));
        assert_eq!(Endpoint::of("/oauth2/token/"), Some(Endpoint::Token));
        assert_eq!(
            Endpoint::of("/x/oauth2/authorize"),
            Some(Endpoint::Authorize)
        );
        assert_eq!(Endpoint::of("/oauth2/tokens"), None);
        assert_eq!(Endpoint::of("/oauth2/token/x"), None);
    }

    #[test]
    fn redirect_params_merge_sorted_into_query_or_fragment() {
        let mut p = Map::new();
        p.insert("code".into(), Value::from("abc"));
        p.insert("state".into(), Value::from("s 1"));
        assert_eq!(
            with_params("https://app.test/cb?z=1", &p, false),
            "https://app.test/cb?code=abc&state=s%201&z=1"
        );
        assert_eq!(
            with_params("https://app.test/cb?keep=1", &p, true),
            "https://app.test/cb?keep=1#code=abc&state=s%201"
        );
    }

    #[test]
    fn scopes_as_kong_checks_them() {
        let settings = |mandatory: bool, scopes: Option<&[&str]>| Settings {
            provision_key: None,
            scopes: scopes.map(|s| s.iter().map(|x| x.to_string()).collect()),
            mandatory_scope: mandatory,
            token_expiration: 7200,
            enable_authorization_code: true,
            enable_implicit_grant: false,
            enable_client_credentials: false,
            enable_password_grant: false,
            accept_http_if_already_terminated: false,
            refresh_token_ttl: 0,
            reuse_refresh_token: false,
            global_credentials: false,
            pkce: "lax".into(),
        };
        let p = |v: Option<Value>| {
            let mut m = Map::new();
            if let Some(v) = v {
                m.insert("scope".into(), v);
            }
            m
        };
        let s = settings(true, Some(&["email", "phone"]));
        assert_eq!(
            scope(&p(None), &s).unwrap_err()["error_description"],
            "You must specify a scope"
        );
        assert_eq!(
            scope(&p(Some(Value::from("email  phone"))), &s).unwrap(),
            Some("email phone".into())
        );
        // No scopes configured: whatever is asked is not recorded.
        assert_eq!(
            scope(&p(Some(Value::from("x"))), &settings(false, None)).unwrap(),
            None
        );
    }

    #[test]
    fn pkce_verifier_matches_the_rfc_7636_example() {
        // RFC 7636, appendix B.
        let mut p = Map::new();
        p.insert(
            "code_verifier".into(),
            Value::from("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"),
        );
        assert!(check_verifier(&p, Some("E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM")).is_none());
        assert_eq!(
            check_verifier(&p, Some("other")).unwrap()["error"],
            "invalid_grant"
        );
        p.insert("code_verifier".into(), Value::from("short"));
        assert_eq!(
            check_verifier(&p, None).unwrap()["error_description"],
            "code_verifier must be between 43 and 128 characters"
        );
        // A padded or standard-alphabet challenge is read in its canonical form.
        let mut q = Map::new();
        q.insert(
            "code_challenge".into(),
            Value::from("E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM="),
        );
        assert_eq!(
            code_challenge(&q).unwrap().as_deref(),
            Some("E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM")
        );
        q.insert("code_challenge_method".into(), Value::from("plain"));
        assert!(code_challenge(&q).is_err());
    }
}
