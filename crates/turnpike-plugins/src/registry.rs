//! The plugins this build carries (Kong's `plugins` property) and how the config layers
//! reach them: validation, schemas, credential storage and cache invalidation.

use std::sync::Arc;

use serde_json::Value;
use turnpike_config::declarative::PluginRegistry;
use turnpike_config::entity::PluginEntity;

use crate::*;

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
    /// Checks of the Lua code a config carries, under the node's `untrusted_lua*`
    /// properties (refused when `untrusted_lua = off`, compiled otherwise).
    fn lua_checks(&self, _config: &Value, _lua: &Arc<lua::Settings>) -> Vec<(String, String)> {
        Vec::new()
    }
    /// Checks against the node's own setup (proxy-cache's shared dictionary exists).
    fn runtime_checks(&self, _config: &Value, _runtime: &Runtime) -> Vec<(String, String)> {
        Vec::new()
    }
    /// Whether the plugin may be scoped to a consumer. Kong's authentication plugins (and acl,
    /// cors) may not: they run before the consumer is known, or decide who it is.
    fn allows_consumer(&self) -> bool {
        true
    }
    /// Whether the plugin runs on HTTP requests only (Kong's `protocols =
    /// typedefs.protocols_http`: grpc, grpcs, http, https); the others may also list the
    /// stream protocols (`typedefs.protocols`), and run on stream routes.
    fn http_only(&self) -> bool {
        false
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

/// A plugin's validated config (defaults filled, every field checked against its schema) read
/// into the plugin's typed config, once, when the plugin is built.
pub fn typed<T: serde::de::DeserializeOwned>(config: &Value) -> Result<T, String> {
    serde_json::from_value(config.clone()).map_err(|e| format!("config: {e}"))
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
    /// `router_flavor`: the route fields the entity readers accept.
    router_flavor: turnpike_config::atc::RouterFlavor,
    /// The node's plugin state, handed to every plugin built with this registry.
    runtime: Arc<Runtime>,
    /// The plugins' entities: [`ENTITIES`], then those of the operator's plugins.
    entities: &'static [&'static PluginEntity],
    /// The operator's Lua plugins that have Admin API routes of their own (`api.lua`).
    own_apis: Vec<&'static crate::custom::LuaPlugin>,
}

/// The entities the plugins bring (each folder's `daos`, as Kong's `daos.lua`), in the order
/// Kong's declarative files list them: the store, the declarative loader and the Admin API
/// learn the plugins' tables from this list alone.
pub static ENTITIES: &[&PluginEntity] = &[
    &key_auth::daos::KEYAUTH_CREDENTIALS,
    &basic_auth::daos::BASICAUTH_CREDENTIALS,
    &acl::daos::ACLS,
    &jwt::daos::JWT_SECRETS,
    &hmac_auth::daos::HMACAUTH_CREDENTIALS,
    &oauth2::daos::OAUTH2_CREDENTIALS,
    &oauth2::daos::OAUTH2_TOKENS,
    &oauth2::daos::OAUTH2_AUTHORIZATION_CODES,
    &session::SESSIONS,
];

/// Every plugin compiled in (Kong's `plugins = bundled`).
pub fn bundled() -> Registry {
    Registry {
        database_off: false,
        hash_keys: false,
        router_flavor: Default::default(),
        runtime: Runtime::new(),
        entities: ENTITIES,
        own_apis: Vec::new(),
        plugins: vec![
            &acl::Acl,
            &basic_auth::BasicAuth,
            &bot_detection::BotDetection,
            &correlation_id::CorrelationId,
            &cors::Cors,
            &datadog::Datadog,
            &file_log::FileLog,
            &grpc_gateway::GrpcGateway,
            &grpc_web::GrpcWeb,
            &hmac_auth::HmacAuth,
            &http_log::HttpLog,
            &ip_restriction::IpRestriction,
            &jwt::Jwt,
            &key_auth::KeyAuth,
            &ldap_auth::LdapAuth,
            &oauth2::OAuth2,
            &opentelemetry::OpenTelemetry,
            &post_function::POST_FUNCTION,
            &pre_function::PRE_FUNCTION,
            &prometheus::Prometheus,
            &proxy_cache::ProxyCache,
            &rate_limiting::RateLimiting,
            &redirect::Redirect,
            &request_size_limiting::RequestSizeLimiting,
            &request_transformer::RequestTransformer,
            &request_termination::RequestTermination,
            &response_ratelimiting::ResponseRateLimiting,
            &response_transformer::ResponseTransformer,
            &session::Session,
            &statsd::Statsd,
            &syslog::Syslog,
            &tcp_log::TcpLog,
            &udp_log::UdpLog,
            &zipkin::Zipkin,
        ],
    }
}

/// The plugins a node loads, from Kong's `plugins` property: `bundled` (every plugin compiled
/// in), plugin names, both mixed, or `off` (none).
pub fn enabled(names: &[String], database_off: bool) -> Result<Registry, String> {
    enabled_with(names, database_off, None, &[])
}

/// The same, where a name no bundled plugin has is an operator's own Lua plugin found through
/// `lua`'s `package_path` (`crate::custom`), when `lua` is given, or one of the `external`
/// plugins (`crate::pluginserver`): Kong looks for a Lua plugin first, then asks the plugin
/// servers.
pub fn enabled_with(
    names: &[String],
    database_off: bool,
    lua: Option<&crate::lua::Settings>,
    external: &[&'static crate::pluginserver::ExternalPlugin],
) -> Result<Registry, String> {
    let all = bundled();
    let mut plugins: Vec<&'static dyn PluginSpec> = Vec::new();
    let mut own_entities: Vec<&'static PluginEntity> = Vec::new();
    let mut own_apis: Vec<&'static crate::custom::LuaPlugin> = Vec::new();
    for name in names {
        match name.as_str() {
            "off" => {
                return Ok(Registry {
                    plugins: Vec::new(),
                    database_off,
                    ..all
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
                None if lua.is_some() => {
                    let p: &'static dyn PluginSpec =
                        match crate::custom::load(other, lua.unwrap_or(&Default::default())) {
                            Ok(p) => {
                                own_entities.extend(p.entities.iter().copied());
                                if !p.api.is_empty() {
                                    own_apis.push(p);
                                }
                                p
                            }
                            Err(e) => match external.iter().find(|p| p.name() == other) {
                                Some(p) => *p,
                                None => return Err(e),
                            },
                        };
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
    let entities = if own_entities.is_empty() {
        ENTITIES
    } else {
        let mut list = ENTITIES.to_vec();
        for e in own_entities {
            if list.iter().any(|o| o.spec.table == e.spec.table) {
                return Err(format!(
                    "the entity '{}' of an enabled plugin is already defined",
                    e.spec.table
                ));
            }
            list.push(e);
        }
        // For the life of the process, as Kong's loaded daos.
        Box::leak(list.into_boxed_slice())
    };
    Ok(Registry {
        plugins,
        database_off,
        entities,
        own_apis,
        ..all
    })
}

impl Registry {
    /// Stores key-auth keys as SHA-256 digests (`key_auth_hash_keys = on`).
    pub fn hashing_keys(mut self, on: bool) -> Registry {
        self.hash_keys = on;
        self
    }

    /// Reads routes as `router_flavor = flavor` does.
    pub fn routing(mut self, flavor: turnpike_config::atc::RouterFlavor) -> Registry {
        self.router_flavor = flavor;
        self
    }

    /// The node's plugin state, which every plugin built with this registry keeps a part of.
    pub fn runtime(&self) -> &Arc<Runtime> {
        &self.runtime
    }

    /// A context for building the plugins of `config` (one snapshot).
    pub fn build_context<'a>(&'a self, config: &'a turnpike_config::Config) -> BuildContext<'a> {
        BuildContext::new(config, &self.runtime)
    }

    pub fn get(&self, name: &str) -> Option<&'static dyn PluginSpec> {
        self.plugins.iter().copied().find(|p| p.name() == name)
    }

    pub fn all(&self) -> impl Iterator<Item = &'static dyn PluginSpec> + '_ {
        self.plugins.iter().copied()
    }
}

impl PluginRegistry for Registry {
    fn router_flavor(&self) -> turnpike_config::atc::RouterFlavor {
        self.router_flavor
    }

    fn entities(&self) -> &'static [&'static PluginEntity] {
        self.entities
    }

    fn check(&self, name: &str, config: &Value) -> Option<Result<Value, Vec<(String, String)>>> {
        let p = self.get(name)?;
        let mut config = config.clone();
        p.shorthands(&mut config);
        Some(schema::validate(p.fields(), &config).and_then(|full| {
            let mut errs = p.entity_checks(&full);
            errs.extend(p.lua_checks(&full, self.runtime.lua.settings()));
            errs.extend(p.runtime_checks(&full, &self.runtime));
            // A reference in a referenceable field is checked once resolved, as Kong skips
            // its validators (an http-log endpoint read from a vault is no URL yet).
            let refs = schema::reference_paths(p.fields(), &full);
            errs.retain(|(at, _)| {
                !refs
                    .iter()
                    .any(|r| at == r || r.starts_with(&format!("{at}.")))
            });
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
            .map(|p| schema::kong_json(p.fields(), p.shorthand_fields(), p.http_only()))
    }

    fn allows_consumer(&self, name: &str) -> bool {
        self.get(name).is_none_or(|p| p.allows_consumer())
    }

    fn http_only(&self, name: &str) -> bool {
        self.get(name).is_some_and(|p| p.http_only())
    }

    fn prepare_credential(
        &self,
        table: &str,
        value: &mut serde_json::Map<String, Value>,
    ) -> Result<Option<(String, Value)>, (String, String)> {
        match table {
            basic_auth::daos::TABLE => {
                if let Some(Value::String(p)) = value.get("password") {
                    if !basic_auth::password::is_hashed(p) {
                        let hashed =
                            basic_auth::password::hash(p).map_err(|e| ("password".into(), e))?;
                        value.insert("password".into(), Value::String(hashed));
                    }
                }
                Ok(None)
            }
            // Kong's `hash_secret`: the stored secret is an argon2id hash (shown as such).
            oauth2::daos::TABLE if value.get("hash_secret") == Some(&Value::Bool(true)) => {
                if let Some(Value::String(p)) = value.get("client_secret") {
                    if !p.starts_with("$argon2") {
                        let hashed = basic_auth::password::hash(p)
                            .map_err(|e| ("client_secret".into(), e))?;
                        value.insert("client_secret".into(), Value::String(hashed));
                    }
                }
                Ok(None)
            }
            key_auth::daos::TABLE if self.hash_keys => match value.get("key") {
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
        if self.runtime.credentials.installed() {
            &[
                key_auth::daos::TABLE,
                basic_auth::daos::TABLE,
                jwt::daos::TABLE,
                hmac_auth::daos::TABLE,
                oauth2::daos::TOKENS,
                // Read once, by the token endpoint, never by the snapshot.
                oauth2::daos::CODES,
                session::TABLE,
            ]
        } else {
            &[]
        }
    }

    fn invalidate(&self, table: &str, id: &str, entity: Option<&serde_json::Map<String, Value>>) {
        if !self.runtime.credentials.installed() {
            return;
        }
        let rt = &self.runtime;
        let field = |f: &str| entity.and_then(|e| e.get(f)).and_then(|v| v.as_str());
        match table {
            key_auth::daos::TABLE => rt
                .key_auth
                .invalidate(id, field("key").map(key_auth::stored_form_of).as_deref()),
            basic_auth::daos::TABLE => rt.basic_auth.invalidate(id, field("username")),
            jwt::daos::TABLE => rt.jwt.invalidate(id, field("key")),
            hmac_auth::daos::TABLE => rt.hmac_auth.invalidate(id, field("username")),
            oauth2::daos::TOKENS => rt.oauth2.invalidate_token(id, field("access_token")),
            session::TABLE => rt.session.invalidate(id, field("session_id")),
            // Tokens carry their application's client_id.
            oauth2::daos::TABLE => rt.oauth2.invalidate_all(),
            // A consumer's identity is part of every cached credential of it.
            "consumers" => {
                rt.key_auth.invalidate(id, None);
                rt.basic_auth.invalidate(id, None);
                rt.jwt.invalidate(id, None);
                rt.hmac_auth.invalidate(id, None);
                rt.oauth2.invalidate(id, None);
            }
            _ => {}
        }
    }

    fn admin_api(
        &self,
        method: &str,
        path: &str,
        plugins: &[turnpike_config::declarative::Plugin],
    ) -> Option<(u16, Option<Value>)> {
        self.get("proxy-cache")?;
        proxy_cache::admin_api(&self.runtime.proxy_cache, method, path, plugins)
    }

    fn custom_api(
        &self,
        call: turnpike_config::declarative::ApiCall<'_>,
        config: &turnpike_config::Config,
    ) -> Option<turnpike_config::declarative::ApiAnswer> {
        let p = self
            .own_apis
            .iter()
            .find(|p| p.api.iter().any(|r| r.matches(call.path).is_some()))?;
        p.admin_call(&self.runtime, call, config)
    }

    fn custom_endpoints(&self) -> Vec<String> {
        self.own_apis
            .iter()
            .flat_map(|p| p.api.iter().map(|r| r.listed()))
            .collect()
    }

    fn admin_endpoints(&self) -> Vec<&'static str> {
        match self.get("proxy-cache") {
            Some(_) => vec![
                "/proxy-cache",
                "/proxy-cache/{cache_key}",
                "/proxy-cache/{plugin_id}/caches/{cache_key}",
            ],
            None => Vec::new(),
        }
    }

    fn invalidate_all(&self) {
        self.runtime.key_auth.invalidate_all();
        self.runtime.basic_auth.invalidate_all();
        self.runtime.jwt.invalidate_all();
        self.runtime.hmac_auth.invalidate_all();
        self.runtime.oauth2.invalidate_all();
        self.runtime.session.invalidate_all();
    }

    fn cache_probe(&self, table: &str, key: &str) -> Option<Option<String>> {
        let rt = &self.runtime;
        match table {
            key_auth::daos::TABLE => rt.key_auth.cache().probe(key),
            basic_auth::daos::TABLE => rt.basic_auth.cache().probe(key),
            jwt::daos::TABLE => rt.jwt.probe(key),
            hmac_auth::daos::TABLE => rt.hmac_auth.probe(key),
            oauth2::daos::TOKENS => rt.oauth2.tokens().probe(key),
            _ => None,
        }
    }

    fn cache_forget(&self, table: &str, key: &str) -> bool {
        let rt = &self.runtime;
        match table {
            key_auth::daos::TABLE => rt.key_auth.cache().forget(key),
            basic_auth::daos::TABLE => rt.basic_auth.cache().forget(key),
            jwt::daos::TABLE => rt.jwt.forget(key),
            hmac_auth::daos::TABLE => rt.hmac_auth.forget(key),
            oauth2::daos::TOKENS => rt.oauth2.tokens().forget(key),
            _ => return false,
        }
        true
    }

    fn stored_keys(&self, table: &str, key: &str) -> Vec<String> {
        // A key may be stored as written or as its digest (written while `key_auth_hash_keys`
        // was on, or the other way round): both are looked up, by their unique index.
        if table == key_auth::daos::TABLE && !key.starts_with(key_auth::DIGEST_PREFIX) {
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

#[cfg(test)]
mod tests {
    use serde_json::{json, Map, Value};
    use turnpike_config::schema::{self, Field, Type};

    /// A config that satisfies `fields`' types and required fields, with every number field
    /// set to an integral value written as a float (`2.0`, as a JSON client may send it).
    fn sample(fields: &[Field]) -> Value {
        let mut m = Map::new();
        for f in fields {
            let v = match f.ty {
                Type::Number => json!(2.0),
                Type::NumberIn { min, max } => json!((min.max(0.0) + 1.0).min(max).floor()),
                Type::Record(inner) => sample(inner),
                _ if !f.required || f.default.is_some() => continue,
                Type::String => json!("x"),
                Type::Integer { min, .. } => json!(min.max(1)),
                Type::Boolean => json!(true),
                Type::OneOf(c) => json!(c[0]),
                Type::RecordArray(inner) => json!([sample(inner)]),
                Type::MapOfRecords(inner) => json!({"a": sample(inner)}),
                Type::Map | Type::MapOfStringArrays => json!({}),
                Type::StringArray | Type::ColonStringArray => json!(["a:b"]),
                Type::OneOfArray(c) => json!([c[0]]),
                Type::IntegerArray { min, .. } => json!([min]),
            };
            m.insert(f.name.into(), v);
        }
        Value::Object(m)
    }

    /// Every number field's path in `fields` (records and arrays of records walked).
    fn number_paths(fields: &[Field], at: &str, out: &mut Vec<String>) {
        for f in fields {
            let path = format!("{at}/{}", f.name);
            match f.ty {
                Type::Number | Type::NumberIn { .. } => out.push(path),
                Type::Record(inner) => number_paths(inner, &path, out),
                Type::RecordArray(inner) => number_paths(inner, &format!("{path}/0"), out),
                Type::MapOfRecords(inner) => number_paths(inner, &format!("{path}/a"), out),
                _ => {}
            }
        }
    }

    /// Kong 3.9's plugin schemas: `typedefs.protocols_http` for these, `typedefs.protocols`
    /// (the stream protocols too) for every other bundled plugin.
    const HTTP_ONLY: &[&str] = &[
        "acl",
        "basic-auth",
        "bot-detection",
        "correlation-id",
        "cors",
        "hmac-auth",
        "jwt",
        "key-auth",
        "ldap-auth",
        "oauth2",
        "opentelemetry",
        "rate-limiting",
        "redirect",
        "request-size-limiting",
        "request-termination",
        "response-ratelimiting",
        "response-transformer",
    ];

    /// An HTTP-only plugin on a stream protocol is refused with Kong's message at the
    /// element's position; a stream-capable one takes it; each plugin's schema JSON lists the
    /// protocols it takes.
    #[test]
    fn plugins_take_the_protocols_of_their_kong_schema() {
        use turnpike_config::declarative::{load_str, PluginRegistry};
        let registry = super::bundled();
        let doc = |name: &str, protocols: &str| {
            format!(
                "_format_version: '3.0'\nplugins: [{{name: {name}, protocols: [{protocols}], config: {}}}]",
                match name {
                    "acl" => "{allow: [a]}",
                    "rate-limiting" => "{minute: 1, policy: local}",
                    _ => "{}",
                }
            )
        };
        for p in registry.all() {
            let name = p.name();
            let http_only = HTTP_ONLY.contains(&name);
            assert_eq!(p.http_only(), http_only, "{name}");
            let schema = registry.schema_json(name).unwrap();
            let protocols = schema["fields"]
                .as_array()
                .unwrap()
                .iter()
                .find_map(|f| f.get("protocols"))
                .unwrap();
            let one_of = protocols["elements"]["one_of"].as_array().unwrap();
            assert_eq!(one_of.iter().any(|p| p == "tcp"), !http_only, "{name}");
        }
        for name in ["key-auth", "acl", "rate-limiting"] {
            let e = load_str(&doc(name, "http, tcp"), &registry).unwrap_err();
            let text = e.to_string();
            assert!(
                text.contains("protocols.2: expected one of: grpc, grpcs, http, https"),
                "{name}: {text}"
            );
            assert!(
                load_str(&doc(name, "grpc, https"), &registry).is_ok(),
                "{name}"
            );
        }
        for name in [
            "ip-restriction",
            "file-log",
            "syslog",
            "tcp-log",
            "prometheus",
        ] {
            let c = format!(
                "_format_version: '3.0'\nplugins: [{{name: {name}, protocols: [tcp, tls, udp, tls_passthrough], config: {}}}]",
                match name {
                    "ip-restriction" => "{allow: [127.0.0.1]}",
                    "file-log" => "{path: /tmp/x.log}",
                    "tcp-log" => "{host: 127.0.0.1, port: 9}",
                    _ => "{}",
                }
            );
            let loaded = load_str(&c, &registry);
            assert!(
                loaded.is_ok(),
                "{name}: {:?}",
                loaded.err().map(|e| e.to_string())
            );
        }
    }

    /// Kong writes an integral number without a fraction (`%.14g`); go-kong decodes several
    /// of them into Go `int`s. Every number field of every plugin's config and of the
    /// upstream's `healthchecks`, given as `2.0` or left to its default, is stored as an integer
    /// when integral: plain serde_json then writes `2`, never `2.0`.
    #[test]
    fn every_number_field_is_stored_as_kong_writes_it() {
        let mut schemas: Vec<(&str, &[Field])> = super::bundled()
            .all()
            .map(|p| (p.name(), p.fields()))
            .collect();
        schemas.push((
            "upstreams.healthchecks",
            turnpike_config::declarative::healthchecks::FIELDS,
        ));
        let mut checked = 0;
        let fraction = regex::Regex::new(r"\d\.0[,\]}]").unwrap();
        for (name, fields) in schemas {
            let mut paths = Vec::new();
            number_paths(fields, "", &mut paths);
            for input in [sample(fields), json!({})] {
                let Ok(full) = schema::validate(fields, &input) else {
                    // Defaults alone do not satisfy this schema's required fields.
                    continue;
                };
                for p in &paths {
                    let Some(v) = full.pointer(p) else { continue };
                    if let Some(f) = v.as_f64().filter(|f| f.fract() == 0.0) {
                        assert!(v.is_i64(), "{name}{p} = {v} ({f}) is stored as a float");
                        assert!(!serde_json::to_string(v).unwrap().contains('.'));
                        checked += 1;
                    }
                }
            }
            // The schema JSON's defaults and bounds too.
            let text = serde_json::to_string(&schema::kong_json(fields, &[], false)).unwrap();
            assert!(
                !fraction.is_match(&text),
                "{name}'s schema writes an integral number with a fraction: {text}"
            );
        }
        // rate-limiting's second..year, response-ratelimiting's, healthchecks' five, ...
        assert!(checked >= 20, "only {checked} number fields checked");
    }
}
