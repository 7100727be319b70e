//! Kong's core entities with their defaults and validation rules (Kong
//! `kong/db/schema/entities/*.lua`), read from one JSON object each.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;

use super::fields::Fields;

mod certificate;
mod consumer;
mod credential;
mod plugin;
mod route;
mod service;
mod upstream;

pub use certificate::*;
pub use consumer::*;
pub use credential::*;
pub use plugin::*;
pub use route::*;
pub use service::*;
pub use upstream::*;

/// A foreign key as Kong shows it: `{"id": "..."}`. The id is shared: a config's 100k routes
/// of one service hold one copy of its id, not 100k (48 bytes each).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ForeignKey {
    pub id: std::sync::Arc<str>,
}

impl ForeignKey {
    pub fn new(id: impl Into<std::sync::Arc<str>>) -> ForeignKey {
        ForeignKey { id: id.into() }
    }
}

impl ForeignKey {
    pub fn is_unset(&self) -> bool {
        self.id.is_empty()
    }
}

/// A service's protocols, the same list.
pub const SERVICE_PROTOCOLS: &[&str] = crate::schema::PROTOCOLS;
/// A route's (and a plugin's) protocols: Kong's `constants.PROTOCOLS`, with ws and wss.
pub const ROUTE_PROTOCOLS: &[&str] = crate::schema::PROTOCOLS;
const MAX_TIMEOUT: i64 = 2_147_483_646;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Service {
    /// Shared with the foreign keys of the service's routes (and plugins): one copy of the
    /// id per service, not one per reference.
    pub id: std::sync::Arc<str>,
    pub created_at: i64,
    pub updated_at: i64,
    pub name: Option<String>,
    pub retries: u16,
    /// One of [`SERVICE_PROTOCOLS`].
    pub protocol: &'static str,
    /// Shared by the services of one config that name the same host.
    pub host: std::sync::Arc<str>,
    pub port: u16,
    /// Shared with the data plane's compiled service.
    pub path: Option<std::sync::Arc<str>>,
    pub connect_timeout: u32,
    pub write_timeout: u32,
    pub read_timeout: u32,
    pub tags: Option<Shared<String>>,
    pub client_certificate: Option<ForeignKey>,
    pub tls_verify: Option<bool>,
    pub tls_verify_depth: Option<u8>,
    pub ca_certificates: Option<List<String>>,
    pub enabled: bool,
}

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Route {
    pub id: String,
    pub created_at: i64,
    pub updated_at: i64,
    pub name: Option<String>,
    pub protocols: Protocols,
    pub methods: Option<Shared<String>>,
    pub hosts: Option<List<String>>,
    pub paths: Option<List<String>>,
    pub headers: Option<Box<BTreeMap<String, Vec<String>>>>,
    pub https_redirect_status_code: u16,
    pub regex_priority: i64,
    pub strip_path: bool,
    pub path_handling: PathHandling,
    pub preserve_host: bool,
    pub request_buffering: bool,
    pub response_buffering: bool,
    pub snis: Option<List<String>>,
    pub sources: Option<List<Value>>,
    pub destinations: Option<List<Value>>,
    pub tags: Option<Shared<String>>,
    pub service: Option<ForeignKey>,
    /// `expression` and `priority`: fields of Kong's route schema only under
    /// `router_flavor = expressions` (and then on every route, `null` and 0 when unset).
    #[serde(flatten)]
    pub expression: Option<Box<ExpressionFields>>,
}

/// A route's `expression` (an ATC matcher) and `priority` (0 to 2^46-1; the higher, the sooner
/// the route is tried).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct ExpressionFields {
    pub expression: Option<String>,
    pub priority: u64,
}

/// A route's `path_handling`: one byte where the name was a 16-byte `&str`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub enum PathHandling {
    #[default]
    #[serde(rename = "v0")]
    V0,
    #[serde(rename = "v1")]
    V1,
}

/// A route's list field: 8 bytes (its length and capacity live with its items), most
/// routes leaving most lists empty. Its eight lists as `Option<Vec<_>>` were 192 of a route's
/// 344 bytes.
pub type List<T> = thin_vec::ThinVec<T>;

/// A list entities of one config share when they hold equal lists: tags such as
/// `[generated, team-7]` and methods such as `[GET, POST]` repeat over thousands of entities,
/// and each copy of a two-string list was 64 bytes of list and two string allocations (88 bytes
/// with mimalloc's size classes, 20 MB over 231k services). Eight bytes in the entity; the
/// loader shares equal lists through an [`Interner`], and an entity read alone holds its own.
#[derive(Clone, Default)]
pub struct Shared<T>(std::sync::Arc<List<T>>);

impl<T> Shared<T> {
    /// Whether both are the one shared copy.
    pub fn same(a: &Shared<T>, b: &Shared<T>) -> bool {
        std::sync::Arc::ptr_eq(&a.0, &b.0)
    }
}

impl<T> std::ops::Deref for Shared<T> {
    type Target = [T];
    #[inline]
    fn deref(&self) -> &[T] {
        &self.0
    }
}

impl<T> std::borrow::Borrow<[T]> for Shared<T> {
    fn borrow(&self) -> &[T] {
        &self.0
    }
}

impl<T: PartialEq> PartialEq for Shared<T> {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0) || self[..] == other[..]
    }
}

impl<T: Eq> Eq for Shared<T> {}

impl<T: std::hash::Hash> std::hash::Hash for Shared<T> {
    /// As the slice hashes, so that a set of lists is looked up by a slice.
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self[..].hash(h)
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for Shared<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<T: Serialize> Serialize for Shared<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

impl<T> From<Vec<T>> for Shared<T> {
    fn from(v: Vec<T>) -> Shared<T> {
        Shared(std::sync::Arc::new(List::from(v)))
    }
}

impl<T> From<List<T>> for Shared<T> {
    fn from(v: List<T>) -> Shared<T> {
        Shared(std::sync::Arc::new(v))
    }
}

impl<T> FromIterator<T> for Shared<T> {
    fn from_iter<I: IntoIterator<Item = T>>(it: I) -> Shared<T> {
        Shared(std::sync::Arc::new(it.into_iter().collect()))
    }
}

/// What the entities of one load share: equal string lists ([`Shared`]) and equal host names.
/// Lives for one load (the loader's), so it holds nothing between configs.
#[derive(Default)]
pub struct Interner {
    lists: std::collections::HashSet<Shared<String>, rustc_hash::FxBuildHasher>,
    strs: std::collections::HashSet<std::sync::Arc<str>, rustc_hash::FxBuildHasher>,
}

impl Interner {
    /// Replaces `list` by the equal list met before, if any.
    pub fn list(&mut self, list: &mut Option<Shared<String>>) {
        let Some(l) = list else { return };
        match self.lists.get(&l[..]) {
            Some(known) => *l = known.clone(),
            None => {
                self.lists.insert(l.clone());
            }
        }
    }

    /// Replaces `s` by the equal text met before, if any.
    pub fn str(&mut self, s: &mut std::sync::Arc<str>) {
        match self.strs.get(&**s) {
            Some(known) => *s = known.clone(),
            None => {
                self.strs.insert(s.clone());
            }
        }
    }
}

/// A route's `protocols`: a set of [`ROUTE_PROTOCOLS`] kept in the order given, inline (two
/// bytes for the usual `[http, https]` rather than a vector of strings: 90 bytes less per route,
/// 9 MB at 100k routes).
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct Protocols {
    /// Indices into [`ROUTE_PROTOCOLS`], `len` of them.
    list: [u8; ROUTE_PROTOCOLS.len()],
    len: u8,
}

impl Protocols {
    /// Kong's default for a route: `[http, https]`.
    pub fn http() -> Protocols {
        Protocols::from_names(["http", "https"])
    }

    /// The known names of `names`, in order, each once (validation reports the rest).
    pub fn from_names<'a>(names: impl IntoIterator<Item = &'a str>) -> Protocols {
        let mut p = Protocols::default();
        for n in names {
            if let Some(i) = ROUTE_PROTOCOLS.iter().position(|k| *k == n) {
                if !p.list[..p.len as usize].contains(&(i as u8)) {
                    p.list[p.len as usize] = i as u8;
                    p.len += 1;
                }
            }
        }
        p
    }

    pub fn iter(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.list[..self.len as usize]
            .iter()
            .map(|&i| ROUTE_PROTOCOLS[i as usize])
    }

    pub fn contains(&self, name: &str) -> bool {
        self.iter().any(|p| p == name)
    }

    pub fn first(&self) -> Option<&'static str> {
        self.iter().next()
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl std::fmt::Debug for Protocols {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl Serialize for Protocols {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Upstream {
    pub id: String,
    pub created_at: i64,
    pub updated_at: i64,
    pub name: String,
    pub algorithm: String,
    pub hash_on: String,
    pub hash_fallback: String,
    pub hash_on_header: Option<String>,
    pub hash_fallback_header: Option<String>,
    pub hash_on_cookie: Option<String>,
    pub hash_on_cookie_path: String,
    pub hash_on_query_arg: Option<String>,
    pub hash_fallback_query_arg: Option<String>,
    pub hash_on_uri_capture: Option<String>,
    pub hash_fallback_uri_capture: Option<String>,
    pub slots: u32,
    pub healthchecks: Value,
    pub tags: Option<Vec<String>>,
    pub host_header: Option<String>,
    pub client_certificate: Option<ForeignKey>,
    pub use_srv_name: bool,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Target {
    pub id: String,
    /// Targets carry millisecond timestamps (Kong's `auto_timestamp_ms`).
    pub created_at: f64,
    pub updated_at: f64,
    pub upstream: ForeignKey,
    pub target: String,
    pub weight: u32,
    pub tags: Option<Vec<String>>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Consumer {
    pub id: std::sync::Arc<str>,
    pub created_at: i64,
    pub updated_at: i64,
    /// Boxed text rather than `String`s (and a thin list for the tags): a snapshot holds one
    /// consumer per key of 100k, and these three fields were 72 of its 112 bytes.
    pub username: Option<Box<str>>,
    pub custom_id: Option<Box<str>>,
    pub tags: Option<Shared<String>>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Plugin {
    pub id: String,
    pub created_at: i64,
    pub updated_at: i64,
    pub name: String,
    pub instance_name: Option<String>,
    pub route: Option<ForeignKey>,
    pub service: Option<ForeignKey>,
    pub consumer: Option<ForeignKey>,
    pub config: Value,
    pub protocols: Vec<String>,
    pub enabled: bool,
    pub tags: Option<Vec<String>>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Certificate {
    pub id: String,
    pub created_at: i64,
    pub updated_at: i64,
    pub cert: String,
    pub key: String,
    pub cert_alt: Option<String>,
    pub key_alt: Option<String>,
    pub tags: Option<Vec<String>>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Sni {
    pub id: String,
    pub created_at: i64,
    pub updated_at: i64,
    pub name: String,
    pub certificate: ForeignKey,
    pub tags: Option<Vec<String>>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CaCertificate {
    pub id: String,
    pub created_at: i64,
    pub updated_at: i64,
    pub cert: String,
    pub cert_digest: Option<String>,
    pub tags: Option<Vec<String>>,
}

/// A credential of one of the plugins' tables (`turnpike_config::entity::PluginEntity`); its own fields are kept as a JSON object
/// (their meaning belongs to the plugin that reads them).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Credential {
    /// Its table (`keyauth_credentials`), as the plugin's entity names it.
    #[serde(skip)]
    pub table: &'static str,
    pub id: String,
    pub created_at: i64,
    /// Empty for entities that belong to no consumer (an oauth2 token), and then not written.
    #[serde(skip_serializing_if = "ForeignKey::is_unset")]
    pub consumer: ForeignKey,
    #[serde(flatten)]
    pub fields: CredentialFields,
}

/// Reads the common `id`; a missing id is filled in by the loader.
pub(crate) fn read_id(f: &mut Fields, generated: &str) -> String {
    f.uuid("id").unwrap_or_else(|| generated.to_string())
}

fn timestamps(f: &mut Fields, now: i64) -> (i64, i64) {
    let c = f.int("created_at", 0, i64::MAX, Some(now)).unwrap_or(now);
    let u = f.int("updated_at", 0, i64::MAX, Some(c)).unwrap_or(c);
    (c, u)
}

/// A reference written as a string (name or id) or an object with `id` or `name`; the loader
/// resolves it. Kept as written until then.
pub(crate) fn foreign_ref_value(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Object(o) => o
            .get("id")
            .or_else(|| o.get("name"))
            .or_else(|| o.get("username"))
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string(),
        other => other.to_string(),
    }
}
