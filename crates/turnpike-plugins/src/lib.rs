//! Kong's bundled plugins, compiled in. Each plugin lives in its own folder with its handler
//! (`mod.rs`) and its config schema (`schema.rs`) side by side, as Kong keeps `handler.lua` and
//! `schema.lua`.
//!
//! A plugin is configured once per config snapshot ([`PluginSpec::build`] turns the validated
//! `config` into a [`Handler`] with everything precomputed); the proxy compiles, per route, the
//! chain of handlers that apply to it, in Kong's PRIORITY order, and per request only walks that
//! chain. A route without plugins pays one empty-slice check.

pub mod acl;
pub mod basic_auth;
pub mod correlation_id;
pub mod cors;
pub mod credentials;
pub mod file_log;
pub mod http_log;
pub mod ip_restriction;
pub mod key_auth;
pub mod log;
pub mod lua;
pub mod post_function;
pub mod pre_function;
pub mod prometheus;
pub mod rate_limiting;
pub mod request_size_limiting;
pub mod request_termination;
pub mod response_transformer;
pub use turnpike_config::schema;

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use serde_json::Value;
use turnpike_config::declarative::PluginRegistry;

/// What a plugin sees of a request in the access phase, and what it may change.
pub struct AccessRequest<'a> {
    pub method: &'a str,
    /// The normalised request path.
    pub path: &'a str,
    pub query: Option<&'a str>,
    /// The request headers, as they will go upstream: plugins may add or remove some.
    pub headers: &'a mut HeaderMap,
    /// Headers to add to the response the client gets (upstream's or a plugin's), for plugins
    /// whose header_filter phase only adds headers.
    pub response_headers: &'a mut Vec<(HeaderName, HeaderValue)>,
    pub tls: bool,
    /// The client's address: the connection's peer, or the X-Real-IP a trusted proxy sent.
    pub client_ip: std::net::IpAddr,
    /// Set by an authentication plugin; read by the plugins after it.
    pub consumer: Option<Arc<Identity>>,
    /// A replacement for the query string sent upstream (e.g. a credential removed from it).
    pub upstream_query: Option<String>,
    /// The most body bytes the upstream may receive (request-size-limiting): a body without a
    /// Content-Length is counted as it streams and cut, with a 413, when it passes this.
    pub body_limit: Option<u64>,
    /// The whole request body, read before the chain runs when one of the route's plugins
    /// wants it ([`Handler::wants_body`]); a plugin may replace it (what goes upstream).
    pub body: Option<Bytes>,
    /// The matched route's id and its service's (empty and `None` in the rewrite phase,
    /// which runs before the router).
    pub route_id: &'a str,
    pub service_id: Option<&'a str>,
    /// A replacement for the path sent upstream (`kong.service.request.set_path`).
    pub upstream_path: Option<String>,
    /// The Host header sent upstream, when a plugin set it (`kong.service.request.set_header`
    /// with Host): it wins over the route's `preserve_host` and the service's host.
    pub upstream_host: Option<HeaderValue>,
    /// What the request's plugins keep between phases (Kong's `kong.ctx`).
    pub ctx: &'a mut PluginCtx,
}

/// Per-request state that plugins keep from one phase to the next (Kong's `kong.ctx.shared`
/// and `kong.ctx.plugin`): empty, and free, unless a plugin puts something there. Only the
/// plugin that put it knows its type.
#[derive(Default)]
pub struct PluginCtx(pub Option<Box<dyn std::any::Any>>);

/// What a plugin's certificate phase sees of a TLS handshake (Kong runs only global plugins
/// there: no route is known yet).
pub struct CertificateRequest<'a> {
    /// The SNI the client sent, lower-cased.
    pub server_name: Option<&'a str>,
}

/// An authenticated (or anonymous) consumer, as the upstream is told about it.
#[derive(Debug)]
pub struct Identity {
    pub consumer_id: String,
    pub username: Option<String>,
    pub custom_id: Option<String>,
    /// The credential that authenticated the request; `None` for the anonymous consumer.
    pub credential_id: Option<String>,
    /// The upstream headers for this identity, built once with the snapshot: (name, value or
    /// `None` to remove what the client sent).
    headers: [(&'static HeaderName, Option<HeaderValue>); 5],
}

impl Identity {
    pub fn new(
        consumer_id: String,
        username: Option<String>,
        custom_id: Option<String>,
        credential_id: Option<String>,
    ) -> Identity {
        let v = |s: Option<&str>| s.and_then(|s| HeaderValue::from_str(s).ok());
        let headers = [
            (&X_CONSUMER_ID, v(Some(&consumer_id))),
            (&X_CONSUMER_CUSTOM_ID, v(custom_id.as_deref())),
            (&X_CONSUMER_USERNAME, v(username.as_deref())),
            (&X_CREDENTIAL_IDENTIFIER, v(credential_id.as_deref())),
            (
                &X_ANONYMOUS_CONSUMER,
                credential_id
                    .is_none()
                    .then(|| HeaderValue::from_static("true")),
            ),
        ];
        Identity {
            consumer_id,
            username,
            custom_id,
            credential_id,
            headers,
        }
    }
}

pub static X_CONSUMER_ID: HeaderName = HeaderName::from_static("x-consumer-id");
pub static X_CONSUMER_CUSTOM_ID: HeaderName = HeaderName::from_static("x-consumer-custom-id");
pub static X_CONSUMER_USERNAME: HeaderName = HeaderName::from_static("x-consumer-username");
pub static X_CREDENTIAL_IDENTIFIER: HeaderName = HeaderName::from_static("x-credential-identifier");
pub static X_ANONYMOUS_CONSUMER: HeaderName = HeaderName::from_static("x-anonymous-consumer");

impl Identity {
    /// The upstream headers for this identity: (name, value, or `None` to drop what the
    /// client sent). The proxy writes them into the upstream request head, replacing any the
    /// client sent under those names.
    pub fn upstream_headers(&self) -> &[(&'static HeaderName, Option<HeaderValue>)] {
        &self.headers
    }

    /// `Some(value or None)` when `name` is one of the identity's headers.
    fn header(&self, name: &HeaderName) -> Option<Option<&HeaderValue>> {
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_ref())
    }
}

impl<'a> AccessRequest<'a> {
    /// The request as it arrives, before any plugin ran: no route (the rewrite phase's view),
    /// no consumer, nothing replaced. The access phase sets the route and what earlier phases
    /// changed on top of this.
    #[allow(clippy::too_many_arguments)] // the request's own facts, none derivable from another
    pub fn new(
        method: &'a str,
        path: &'a str,
        query: Option<&'a str>,
        headers: &'a mut HeaderMap,
        response_headers: &'a mut Vec<(HeaderName, HeaderValue)>,
        tls: bool,
        client_ip: std::net::IpAddr,
        ctx: &'a mut PluginCtx,
    ) -> Self {
        AccessRequest {
            method,
            path,
            query,
            headers,
            response_headers,
            tls,
            client_ip,
            consumer: None,
            upstream_query: None,
            body_limit: None,
            body: None,
            route_id: "",
            service_id: None,
            upstream_path: None,
            upstream_host: None,
            ctx,
        }
    }
}

impl AccessRequest<'_> {
    /// Kong's `set_consumer`: records the consumer; the upstream is told who it is by the
    /// identity's headers, which the proxy writes straight into the upstream request head
    /// (replacing what a client sent under those names). Inserting them into the header map
    /// instead cost ~1.5k instructions per request (three inserts and a map that grows:
    /// BENCHMARKS.md); a later authentication plugin's identity simply replaces this one.
    pub fn set_consumer(&mut self, who: Arc<Identity>) {
        self.consumer = Some(who);
    }

    /// A request header as the upstream will see it: the consumer's identity headers (set by
    /// an authentication plugin) over the client's.
    pub fn header(&self, name: &HeaderName) -> Option<&HeaderValue> {
        if let Some(v) = self.consumer.as_deref().and_then(|c| c.header(name)) {
            return v;
        }
        self.headers.get(name)
    }
}

/// What plugins may consult while they are built: the snapshot's consumers and credentials,
/// indexed once per snapshot and only if some plugin asks.
pub struct BuildContext<'a> {
    pub config: &'a turnpike_config::Config,
    consumers: std::sync::OnceLock<Arc<ConsumerIndex>>,
    key_auth: std::sync::OnceLock<Arc<KeyIndex>>,
    basic_auth: std::sync::OnceLock<Arc<basic_auth::CredentialIndex>>,
    acl_groups: std::sync::OnceLock<Arc<acl::GroupIndex>>,
}

/// Consumers by id and by username.
pub type ConsumerIndex = std::collections::HashMap<String, Arc<Identity>>;
/// key-auth credentials of a snapshot: keys written in clear (a declarative file, which holds
/// them in clear anyway) by key, and keys written as digests (an export) by digest, so that a
/// request hashes its key only when some keys are digests. FxHash: only the config inserts
/// entries; a client's keys are only looked up and cannot build colliding chains.
#[derive(Default)]
pub struct KeyIndex {
    plain: rustc_hash::FxHashMap<Box<str>, Arc<Identity>>,
    digests: rustc_hash::FxHashMap<[u8; 32], Arc<Identity>>,
}

impl KeyIndex {
    pub fn insert(&mut self, stored: &str, who: Arc<Identity>) {
        if stored.starts_with(key_auth::DIGEST_PREFIX) {
            self.digests.insert(key_auth::digest_of(stored), who);
        } else {
            self.plain.insert(stored.into(), who);
        }
    }

    pub fn get(&self, key: &str) -> Option<&Arc<Identity>> {
        self.plain.get(key).or_else(|| {
            if self.digests.is_empty() {
                None
            } else {
                self.digests.get(&key_auth::digest(key.as_bytes()))
            }
        })
    }
}

impl<'a> BuildContext<'a> {
    pub fn new(config: &'a turnpike_config::Config) -> Self {
        BuildContext {
            config,
            consumers: std::sync::OnceLock::new(),
            key_auth: std::sync::OnceLock::new(),
            basic_auth: std::sync::OnceLock::new(),
            acl_groups: std::sync::OnceLock::new(),
        }
    }

    /// A consumer by id or username, as the anonymous consumer of an auth plugin.
    pub fn consumer(&self, key: &str) -> Option<Arc<Identity>> {
        self.consumers
            .get_or_init(|| {
                let mut m = ConsumerIndex::new();
                for c in &self.config.consumers {
                    let who = Arc::new(Identity::new(
                        c.id.clone(),
                        c.username.clone(),
                        c.custom_id.clone(),
                        None,
                    ));
                    if let Some(u) = &c.username {
                        m.insert(u.clone(), who.clone());
                    }
                    m.insert(c.id.clone(), who);
                }
                Arc::new(m)
            })
            .get(key)
            .cloned()
    }

    /// Each consumer's ACL groups (from its `acls` credentials), in the order written.
    pub fn acl_groups(&self) -> Arc<acl::GroupIndex> {
        self.acl_groups
            .get_or_init(|| {
                let mut m = acl::GroupIndex::new();
                for cred in self
                    .config
                    .credentials
                    .iter()
                    .filter(|c| c.kind == turnpike_config::declarative::CredentialKind::Acl)
                {
                    if let Some(g) = cred.fields.get("group").and_then(|g| g.as_str()) {
                        m.entry(cred.consumer.id.clone())
                            .or_default()
                            .0
                            .push(g.to_string());
                    }
                }
                for (groups, header) in m.values_mut() {
                    *header = HeaderValue::from_str(&groups.join(", ")).ok();
                }
                Arc::new(m)
            })
            .clone()
    }

    /// Every basic-auth credential by username, with the consumer it authenticates.
    pub fn basic_auth(&self) -> Arc<basic_auth::CredentialIndex> {
        self.basic_auth
            .get_or_init(|| {
                let mut m = basic_auth::CredentialIndex::default();
                for cred in
                    self.config.credentials.iter().filter(|c| {
                        c.kind == turnpike_config::declarative::CredentialKind::BasicAuth
                    })
                {
                    let (Some(username), Some(stored), Some(who)) = (
                        cred.fields.get("username").and_then(|v| v.as_str()),
                        cred.fields.get("password").and_then(|v| v.as_str()),
                        self.consumer(&cred.consumer.id),
                    ) else {
                        continue;
                    };
                    m.insert(
                        username.into(),
                        Arc::new(basic_auth::Credential {
                            who: Arc::new(Identity::new(
                                who.consumer_id.clone(),
                                who.username.clone(),
                                who.custom_id.clone(),
                                Some(cred.id.clone()),
                            )),
                            secret: basic_auth::password::Secret::from_stored(
                                stored,
                                &cred.consumer.id,
                            ),
                            stored: stored.into(),
                        }),
                    );
                }
                Arc::new(m)
            })
            .clone()
    }

    /// Every key-auth key with the consumer it authenticates.
    pub fn key_auth(&self) -> Arc<KeyIndex> {
        self.key_auth
            .get_or_init(|| {
                let consumers: std::collections::HashMap<
                    &str,
                    &turnpike_config::declarative::Consumer,
                > = self
                    .config
                    .consumers
                    .iter()
                    .map(|c| (c.id.as_str(), c))
                    .collect();
                let mut m = KeyIndex::default();
                for cred in self
                    .config
                    .credentials
                    .iter()
                    .filter(|c| c.kind == turnpike_config::declarative::CredentialKind::KeyAuth)
                {
                    let (Some(key), Some(c)) = (
                        cred.fields.get("key").and_then(|k| k.as_str()),
                        consumers.get(cred.consumer.id.as_str()),
                    ) else {
                        continue;
                    };
                    m.insert(
                        key,
                        Arc::new(Identity::new(
                            c.id.clone(),
                            c.username.clone(),
                            c.custom_id.clone(),
                            Some(cred.id.clone()),
                        )),
                    );
                }
                Arc::new(m)
            })
            .clone()
    }
}

impl AccessRequest<'_> {
    /// The first value of a query argument (not percent-decoded).
    pub fn query_arg(&self, name: &str) -> Option<&str> {
        self.query?.split('&').find_map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (k == name).then_some(v)
        })
    }
}

/// A response a plugin produces instead of proxying (Kong's `kong.response.exit`).
#[derive(Debug)]
pub struct Exit {
    pub status: StatusCode,
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub body: Bytes,
}

impl Exit {
    /// `kong.response.exit(status, {message = ...})`: a JSON body with a message.
    pub fn message(status: StatusCode, message: &str) -> Exit {
        let body =
            serde_json::to_vec(&serde_json::json!({ "message": message })).unwrap_or_default();
        Exit {
            status,
            headers: vec![(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json; charset=utf-8"),
            )],
            body: Bytes::from(body),
        }
    }
}

/// The outcome of a plugin's access phase.
pub enum Access {
    Continue,
    Exit(Exit),
    /// The plugin must wait (a Redis round trip, a password hash on the blocking pool): the
    /// proxy awaits the future, which borrows nothing from the request, then hands the request
    /// to what it returns. Plugins that never wait cost nothing for this.
    Wait(Pending),
}

/// What a waiting plugin does with the request once its wait is over.
pub type Resume = Box<dyn FnOnce(&mut AccessRequest<'_>) -> Access>;
/// A plugin's wait. Not `Send`: each worker runs its requests on its own thread.
pub type Pending = std::pin::Pin<Box<dyn std::future::Future<Output = Resume>>>;

/// Runs one plugin's access phase to its end, waiting as often as it asks.
pub async fn run_access(handler: &dyn Handler, req: &mut AccessRequest<'_>) -> Option<Exit> {
    let outcome = handler.access(req);
    run_access_from(outcome, req).await
}

/// Carries on from a plugin's first outcome until it continues or exits.
pub async fn run_access_from(mut outcome: Access, req: &mut AccessRequest<'_>) -> Option<Exit> {
    loop {
        match outcome {
            Access::Continue => return None,
            Access::Exit(e) => return Some(e),
            Access::Wait(pending) => {
                let resume = pending.await;
                outcome = resume(req);
            }
        }
    }
}

/// What a plugin's header_filter phase sees of the response and may change: the upstream's
/// response, or one the gateway or a plugin produced (an exit, an error), with Kong's own
/// headers (Via, X-Kong-*) already in it, as Kong's runloop sets them before the plugins run.
pub struct ResponseHead<'a> {
    /// The status the client gets; a plugin may change it.
    pub status: StatusCode,
    pub headers: &'a mut HeaderMap,
    /// The response is the upstream's (false: the gateway's or a plugin's own).
    pub from_upstream: bool,
    /// What the request's plugins keep between phases (Kong's `kong.ctx`).
    pub ctx: &'a mut PluginCtx,
}

/// Kong's body_filter phase for one response: gets the body piece by piece and returns what
/// the client gets in its place (empty to hold it back); `eof` is true once, with an empty
/// piece, when the body has ended. A filter that rewrites the whole body gathers the pieces
/// and answers at `eof`. Built per response by `Handler::header_filter`, so routes and
/// responses that need none pay nothing.
pub trait BodyFilter {
    fn filter(&mut self, piece: Bytes, eof: bool) -> Bytes;
}

/// A configured plugin instance.
pub trait Handler: Send + Sync {
    /// Kong's certificate phase, during a TLS handshake, for global plugins only (see
    /// `certifies`); an error aborts the handshake.
    fn certificate(&self, _hello: &CertificateRequest<'_>) -> Result<(), String> {
        Ok(())
    }
    /// Whether this config has a certificate phase: handshakes check one list, empty unless
    /// some global plugin has.
    fn certifies(&self) -> bool {
        false
    }
    /// Kong's rewrite phase, before the router, for global plugins only (see `rewrites`):
    /// it may change the request (which the router then sees) or answer it.
    fn rewrite(&self, _req: &mut AccessRequest<'_>) -> Option<Exit> {
        None
    }
    /// Whether this config has a rewrite phase: requests check one list, empty unless some
    /// global plugin has.
    fn rewrites(&self) -> bool {
        false
    }
    fn access(&self, req: &mut AccessRequest<'_>) -> Access;
    /// Kong's header_filter phase, in PRIORITY order after the access phase, on every
    /// response of a request the plugin's route served; returns the response's body filter
    /// (Kong's body_filter phase) when the plugin changes the body. Only called for configs
    /// whose `filters_response` is true.
    fn header_filter(&self, _resp: &mut ResponseHead<'_>) -> Option<Box<dyn BodyFilter>> {
        None
    }
    /// Whether this config has a header_filter (and so maybe a body_filter) phase: routes
    /// without one never build the list of filters.
    fn filters_response(&self) -> bool {
        false
    }
    /// Whether this config reads the request body (key-auth's `key_in_body`): the proxy then
    /// reads the body before the route's chain runs. Costs nothing to routes that do not.
    fn wants_body(&self) -> bool {
        false
    }
    /// Kong's log phase, after the response went to the client. Must not block: a plugin
    /// that ships entries elsewhere queues them.
    fn log(&self, _entry: &log::LogEntry<'_>) {}
    /// Whether this config has a log phase: routes without one build no log entry.
    fn logs(&self) -> bool {
        false
    }
    /// Whether its log phase reads request and response headers (copied only then).
    fn log_headers(&self) -> bool {
        false
    }
}

/// A plugin: its identity, its config schema and how it turns a config into a handler.
pub trait PluginSpec: Send + Sync {
    fn name(&self) -> &'static str;
    /// Kong's PRIORITY: higher runs first.
    fn priority(&self) -> i32;
    fn version(&self) -> &'static str {
        KONG_VERSION
    }
    fn fields(&self) -> &'static [schema::Field];
    /// Deprecated flat fields moved into their place by [`PluginSpec::shorthands`], as the
    /// schema JSON lists them.
    fn shorthand_fields(&self) -> &'static [schema::Shorthand] {
        &[]
    }
    /// Checks that span several fields (Kong's `entity_checks`), on a config with defaults.
    fn entity_checks(&self, _config: &Value) -> Vec<(String, String)> {
        Vec::new()
    }
    /// Whether the plugin may be scoped to a consumer. Kong's authentication plugins (and acl,
    /// cors) may not: they run before the consumer is known, or decide who it is.
    fn allows_consumer(&self) -> bool {
        true
    }
    /// Why this config cannot run without a database (checked on DB-less nodes).
    fn needs_database(&self, _config: &Value) -> Option<(String, String)> {
        None
    }
    /// Rewrites deprecated field names into their current place (Kong's `shorthand_fields`),
    /// before validation.
    fn shorthands(&self, _config: &mut Value) {}
    fn build(&self, config: &Value, ctx: &BuildContext) -> Result<Arc<dyn Handler>, String>;
}

/// The Kong release whose Admin API, plugins and PDK this build implements: `GET /`'s
/// `version` (clients gate features on it) and each bundled plugin's version.
pub const KONG_VERSION: &str = "3.9.1";

/// The plugins this build carries.
pub struct Registry {
    plugins: Vec<&'static dyn PluginSpec>,
    /// A DB-less node: configs that need a database are refused.
    database_off: bool,
    /// `key_auth_hash_keys`: key-auth keys are stored as digests (Kong stores them as
    /// written, which decK needs to compare a file with the gateway).
    hash_keys: bool,
}

/// Every plugin compiled in (Kong's `plugins = bundled`).
pub fn bundled() -> Registry {
    Registry {
        database_off: false,
        hash_keys: false,
        plugins: vec![
            &acl::Acl,
            &basic_auth::BasicAuth,
            &correlation_id::CorrelationId,
            &cors::Cors,
            &file_log::FileLog,
            &http_log::HttpLog,
            &ip_restriction::IpRestriction,
            &key_auth::KeyAuth,
            &post_function::POST_FUNCTION,
            &pre_function::PRE_FUNCTION,
            &prometheus::Prometheus,
            &rate_limiting::RateLimiting,
            &request_size_limiting::RequestSizeLimiting,
            &request_termination::RequestTermination,
            &response_transformer::ResponseTransformer,
        ],
    }
}

/// The plugins a node loads, from Kong's `plugins` property: `bundled` (every plugin compiled
/// in), plugin names, both mixed, or `off` (none).
pub fn enabled(names: &[String], database_off: bool) -> Result<Registry, String> {
    let all = bundled();
    let mut plugins: Vec<&'static dyn PluginSpec> = Vec::new();
    for name in names {
        match name.as_str() {
            "off" => {
                return Ok(Registry {
                    plugins: Vec::new(),
                    database_off,
                    hash_keys: false,
                })
            }
            "bundled" => {
                for p in all.all() {
                    if !plugins.iter().any(|q| q.name() == p.name()) {
                        plugins.push(p);
                    }
                }
            }
            other => match all.get(other) {
                Some(p) => {
                    if !plugins.iter().any(|q| q.name() == p.name()) {
                        plugins.push(p);
                    }
                }
                None => {
                    let names: Vec<&str> = all.all().map(|p| p.name()).collect();
                    return Err(format!(
                        "plugins: '{other}' is not a plugin this build carries (it has: {})",
                        names.join(", ")
                    ));
                }
            },
        }
    }
    plugins.sort_by_key(|p| p.name());
    Ok(Registry {
        plugins,
        database_off,
        hash_keys: false,
    })
}

impl Registry {
    /// Stores key-auth keys as SHA-256 digests (`key_auth_hash_keys = on`).
    pub fn hashing_keys(mut self, on: bool) -> Registry {
        self.hash_keys = on;
        self
    }

    pub fn get(&self, name: &str) -> Option<&'static dyn PluginSpec> {
        self.plugins.iter().copied().find(|p| p.name() == name)
    }

    pub fn all(&self) -> impl Iterator<Item = &'static dyn PluginSpec> + '_ {
        self.plugins.iter().copied()
    }
}

impl PluginRegistry for Registry {
    fn check(&self, name: &str, config: &Value) -> Option<Result<Value, Vec<(String, String)>>> {
        let p = self.get(name)?;
        let mut config = config.clone();
        p.shorthands(&mut config);
        Some(schema::validate(p.fields(), &config).and_then(|full| {
            let mut errs = p.entity_checks(&full);
            if self.database_off {
                errs.extend(p.needs_database(&full));
            }
            if errs.is_empty() {
                Ok(full)
            } else {
                Err(errs)
            }
        }))
    }

    fn schema_json(&self, name: &str) -> Option<Value> {
        self.get(name)
            .map(|p| schema::kong_json(p.fields(), p.shorthand_fields()))
    }

    fn allows_consumer(&self, name: &str) -> bool {
        self.get(name).is_none_or(|p| p.allows_consumer())
    }

    fn prepare_credential(
        &self,
        table: &str,
        value: &mut serde_json::Map<String, Value>,
    ) -> Result<Option<(String, Value)>, (String, String)> {
        match table {
            "basicauth_credentials" => {
                if let Some(Value::String(p)) = value.get("password") {
                    if !basic_auth::password::is_hashed(p) {
                        let hashed =
                            basic_auth::password::hash(p).map_err(|e| ("password".into(), e))?;
                        value.insert("password".into(), Value::String(hashed));
                    }
                }
                Ok(None)
            }
            "keyauth_credentials" if self.hash_keys => match value.get("key") {
                Some(Value::String(k)) if !k.starts_with(key_auth::DIGEST_PREFIX) => {
                    let plain = k.clone();
                    value.insert("key".into(), Value::String(key_auth::stored_form(&plain)));
                    Ok(Some(("key".into(), Value::String(plain))))
                }
                _ => Ok(None),
            },
            _ => Ok(None),
        }
    }

    fn cached_tables(&self) -> &'static [&'static str] {
        if credentials::installed() {
            &["keyauth_credentials", "basicauth_credentials"]
        } else {
            &[]
        }
    }

    fn invalidate(&self, table: &str, id: &str, entity: Option<&serde_json::Map<String, Value>>) {
        if !credentials::installed() {
            return;
        }
        let field = |f: &str| entity.and_then(|e| e.get(f)).and_then(|v| v.as_str());
        match table {
            "keyauth_credentials" => {
                key_auth::invalidate(id, field("key").map(key_auth::stored_form_of).as_deref())
            }
            "basicauth_credentials" => basic_auth::invalidate(id, field("username")),
            // A consumer's identity is part of every cached credential of it.
            "consumers" => {
                key_auth::invalidate(id, None);
                basic_auth::invalidate(id, None);
            }
            _ => {}
        }
    }

    fn invalidate_all(&self) {
        key_auth::invalidate_all();
        basic_auth::invalidate_all();
    }

    fn stored_keys(&self, table: &str, key: &str) -> Vec<String> {
        // A key may be stored as written or as its digest (written while `key_auth_hash_keys`
        // was on, or the other way round): both are looked up, by their unique index.
        if table == "keyauth_credentials" && !key.starts_with(key_auth::DIGEST_PREFIX) {
            vec![key.to_string(), key_auth::stored_form(key)]
        } else {
            vec![key.to_string()]
        }
    }

    fn available(&self) -> Vec<(String, String, i32)> {
        self.plugins
            .iter()
            .map(|p| (p.name().to_string(), p.version().to_string(), p.priority()))
            .collect()
    }
}

/// A request for the plugins' unit tests: the parts `AccessRequest` borrows, owned here.
#[cfg(test)]
pub(crate) struct TestRequest {
    pub method: &'static str,
    pub query: Option<&'static str>,
    pub headers: HeaderMap,
    pub response_headers: Vec<(HeaderName, HeaderValue)>,
    pub client_ip: std::net::IpAddr,
    pub body: Option<Bytes>,
    pub ctx: PluginCtx,
}

#[cfg(test)]
impl TestRequest {
    pub fn new() -> TestRequest {
        TestRequest {
            method: "GET",
            query: None,
            headers: HeaderMap::new(),
            response_headers: Vec::new(),
            client_ip: "127.0.0.1".parse().unwrap(),
            body: None,
            ctx: PluginCtx::default(),
        }
    }

    /// Runs `handler`'s access phase on this request, waits included.
    pub fn run(&mut self, handler: &dyn Handler) -> Access {
        self.run_full(handler).0
    }

    /// Runs `handler`'s access phase; also returns the consumer it set.
    pub fn run_full(&mut self, handler: &dyn Handler) -> (Access, Option<Arc<Identity>>) {
        let mut req = AccessRequest {
            body: self.body.clone(),
            route_id: "r",
            ..AccessRequest::new(
                self.method,
                "/",
                self.query,
                &mut self.headers,
                &mut self.response_headers,
                false,
                self.client_ip,
                &mut self.ctx,
            )
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let outcome = match rt.block_on(run_access(handler, &mut req)) {
            Some(e) => Access::Exit(e),
            None => Access::Continue,
        };
        (outcome, req.consumer)
    }
}

/// Seconds since the epoch from the kernel's coarse real-time clock: read from the vDSO
/// without a time-stamp counter read or nanosecond arithmetic, a few ms behind at most, as
/// Kong's `ngx.time()` (cached per event-loop turn) is.
pub fn now_secs() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    if unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) } == 0 {
        return ts.tv_sec as u64;
    }
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plugins after authentication see the identity headers the upstream will get, over the
    /// client's (rate-limiting's `limit_by = header`, request-termination's trigger).
    #[test]
    fn request_headers_show_the_consumer_over_the_client() {
        let mut headers = HeaderMap::new();
        headers.insert(&X_CONSUMER_ID, HeaderValue::from_static("spoofed"));
        headers.insert(&X_ANONYMOUS_CONSUMER, HeaderValue::from_static("true"));
        headers.insert("x-other", HeaderValue::from_static("kept"));
        let mut response_headers = Vec::new();
        let mut ctx = PluginCtx::default();
        let mut req = AccessRequest {
            route_id: "r",
            ..AccessRequest::new(
                "GET",
                "/",
                None,
                &mut headers,
                &mut response_headers,
                false,
                "127.0.0.1".parse().unwrap(),
                &mut ctx,
            )
        };
        assert_eq!(req.header(&X_CONSUMER_ID).unwrap(), "spoofed");
        req.set_consumer(Arc::new(Identity::new(
            "c-1".into(),
            Some("alice".into()),
            None,
            Some("cred-1".into()),
        )));
        assert_eq!(req.header(&X_CONSUMER_ID).unwrap(), "c-1");
        assert_eq!(req.header(&X_CONSUMER_USERNAME).unwrap(), "alice");
        // Not anonymous: the client's claim is dropped, as upstream.
        assert!(req.header(&X_ANONYMOUS_CONSUMER).is_none());
        assert!(req.header(&X_CONSUMER_CUSTOM_ID).is_none());
        assert_eq!(
            req.header(&HeaderName::from_static("x-other")).unwrap(),
            "kept"
        );
    }
}
