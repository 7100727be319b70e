//! What the declarative loader asks of the plugins a build carries.

use crate::entity::PluginEntity;
use serde_json::{Map, Value};

/// What the plugin set knows of plugins: used to check `plugins` entities while loading.
pub trait PluginRegistry: Send + Sync {
    /// `None` when no plugin of that name is available; otherwise the config with defaults
    /// filled in, or the violations as (field path within `config`, or within the plugin
    /// entity when it starts with `/`; message).
    fn check(&self, name: &str, config: &Value) -> Option<Result<Value, Vec<(String, String)>>>;

    /// The node's `router_flavor`: which route fields exist and how routes are checked.
    fn router_flavor(&self) -> crate::atc::RouterFlavor {
        crate::atc::RouterFlavor::default()
    }

    /// The entities the plugins bring (Kong's `daos.lua`): their credential tables.
    fn entities(&self) -> &'static [&'static PluginEntity] {
        &[]
    }

    /// Kong's schema JSON for `GET /schemas/plugins/{name}`.
    fn schema_json(&self, _name: &str) -> Option<Value> {
        None
    }

    /// (name, version, priority) of every plugin available, for `GET /`.
    fn available(&self) -> Vec<(String, String, i32)> {
        Vec::new()
    }

    /// Whether a plugin runs on HTTP requests only (Kong's `typedefs.protocols_http`): its
    /// `protocols` may then list only grpc, grpcs, http and https.
    fn http_only(&self, _name: &str) -> bool {
        false
    }

    /// Whether a plugin may be scoped to a consumer (Kong: not when its schema says
    /// `consumer = typedefs.no_consumer`).
    fn allows_consumer(&self, _name: &str) -> bool {
        true
    }

    /// Turns a credential written to a store into its stored form (Kong's DAO transformations:
    /// basic-auth hashes the password; key-auth, when `key_auth_hash_keys` is on, keeps only a
    /// digest of the key). Returns a
    /// field to show in the write's answer instead of its stored form (the new key, which is
    /// never shown again); violations as (field, message).
    fn prepare_credential(
        &self,
        _table: &str,
        _value: &mut Map<String, Value>,
    ) -> Result<Option<(String, Value)>, (String, String)> {
        Ok(None)
    }

    /// Credential tables the data plane looks up in the store itself (through its cache)
    /// rather than receiving with the config: a database node's config leaves them out.
    fn cached_tables(&self) -> &'static [&'static str] {
        &[]
    }

    /// A row of a table changed in the store (`entity`: its new contents, `None` when
    /// deleted): drops what the data plane cached about it.
    fn invalidate(&self, _table: &str, _id: &str, _entity: Option<&Map<String, Value>>) {}

    /// The store changed in ways not itemised (a full rebuild): drops every cached credential.
    fn invalidate_all(&self) {}

    /// What the node's cache holds for a credential of `table` looked up by `key` (Kong's
    /// `cache:probe` of `<table>:<key>:::::`): `None` when nothing is cached, `Some(None)` for
    /// a remembered miss, `Some(Some(id))` for a credential, by its id.
    fn cache_probe(&self, _table: &str, _key: &str) -> Option<Option<String>> {
        None
    }

    /// Drops that one entry (Kong's `DELETE /cache/{key}`); false for a table not cached.
    fn cache_forget(&self, _table: &str, _key: &str) -> bool {
        false
    }

    /// The forms an endpoint key may be stored in, to find a credential by it
    /// (`/key-auths/{key}` finds a row holding the key, or its digest when keys are hashed).
    fn stored_keys(&self, _table: &str, key: &str) -> Vec<String> {
        vec![key.to_string()]
    }

    /// A plugin's own Admin API endpoints (Kong's `api.lua`, e.g. `/proxy-cache`): the
    /// answer (status, JSON body) when `path` is one of them. `plugins` are the node's plugin
    /// entities.
    fn admin_api(
        &self,
        _method: &str,
        _path: &str,
        _plugins: &[super::Plugin],
    ) -> Option<(u16, Option<Value>)> {
        None
    }

    /// The paths of those endpoints, as `GET /endpoints` lists them.
    fn admin_endpoints(&self) -> Vec<&'static str> {
        Vec::new()
    }

    /// An operator's plugin's own endpoint (its `api.lua`) for `call.path`, answered; `None`
    /// when no plugin has a route for the path. `config` is the running configuration (the
    /// plugin's entities, for `kong.db`).
    fn custom_api(&self, _call: ApiCall<'_>, _config: &super::Config) -> Option<ApiAnswer> {
        None
    }

    /// The paths of those endpoints, in `GET /endpoints`' notation.
    fn custom_endpoints(&self) -> Vec<String> {
        Vec::new()
    }
}

/// An Admin API request for a plugin's own endpoint.
pub struct ApiCall<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub query: &'a str,
    /// The request's headers, as (lower-case name, value).
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: &'a [u8],
    /// The query's arguments and the body's fields, decoded as the Admin API decodes them.
    pub params: Map<String, Value>,
}

/// A plugin endpoint's answer.
pub struct ApiAnswer {
    pub status: u16,
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
}

/// The registry before any plugin is compiled in: every plugin name is unknown.
pub struct NoPlugins;

impl PluginRegistry for NoPlugins {
    fn check(&self, _name: &str, _config: &Value) -> Option<Result<Value, Vec<(String, String)>>> {
        None
    }
}
