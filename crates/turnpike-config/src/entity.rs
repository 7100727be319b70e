//! How an entity table is described, once, to the store (its columns and keys), the
//! declarative loader and the Admin API (its collection and nested paths): Kong's entity
//! schemas. Kong's own entities are listed by the store; an entity a plugin brings (Kong's
//! `daos.lua`) is a [`PluginEntity`] in that plugin's folder, which the plugin registry lists.

/// A foreign key of an entity: the JSON field (`service`), the table it references and whether
/// deleting the referenced row deletes this one too (Kong's `on_delete = "cascade"`) or is
/// refused while this row exists.
#[derive(Debug)]
pub struct ForeignKey {
    pub field: &'static str,
    pub table: &'static str,
    pub cascade: bool,
}

impl ForeignKey {
    /// The column holding the referenced id (`service_id`).
    pub fn column(&self) -> String {
        format!("{}_id", self.field)
    }
}

pub const fn fk(field: &'static str, table: &'static str, cascade: bool) -> ForeignKey {
    ForeignKey {
        field,
        table,
        cascade,
    }
}

/// The foreign key of every credential: its consumer, deleted with it.
pub const CONSUMER: &[ForeignKey] = &[fk("consumer", "consumers", true)];

/// One entity table and how the Admin API reaches it.
#[derive(Debug)]
pub struct EntitySpec {
    /// Kong's table name, also the declarative config key (`keyauth_credentials`).
    pub table: &'static str,
    /// The Admin API collection (`/key-auths`).
    pub path: &'static str,
    /// The collection's name when nested under a parent (`/consumers/{c}/key-auth`).
    pub nested_path: &'static str,
    /// The field that can stand for the id in a URL (`name`, `username`, `key`).
    pub endpoint_key: Option<&'static str>,
    /// Fields that are unique on their own; each has a `UNIQUE` column of the same name.
    pub unique: &'static [&'static str],
    /// Fields unique together (Kong's cache key), kept in a `UNIQUE` `cache_key` column.
    pub cache_key: &'static [&'static str],
    pub foreign: &'static [ForeignKey],
}

impl EntitySpec {
    /// The foreign key of this table that references `parent_table`, for nested paths.
    pub fn foreign_to(&self, parent_table: &str) -> Option<&'static ForeignKey> {
        self.foreign.iter().find(|f| f.table == parent_table)
    }

    /// The parent reached as `/{self}/{id}/{segment}` (`/routes/{r}/service`).
    pub fn parent_field(&self, segment: &str) -> Option<&'static ForeignKey> {
        self.foreign.iter().find(|f| f.field == segment)
    }

    /// The fields that identify one entity of the table in a config: its cache key, or else
    /// its unique field.
    pub fn identity(&self) -> &'static [&'static str] {
        if self.cache_key.is_empty() {
            self.unique
        } else {
            self.cache_key
        }
    }
}

/// How a plugin entity's own field is read from a config or an Admin API payload.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum FieldKind {
    Required,
    Optional,
    /// Generated when absent (Kong's `auto = true`).
    Auto,
    /// An integer within [0, 100000000] (Kong's `ttl`, `expires_in`).
    Int,
    /// Any integer (Kong's plain `integer`: a session's `expires`, a Unix time).
    Integer,
    StrArray,
    Bool,
}

/// An entity a plugin brings (Kong's `daos.lua`): a credential of a consumer, or a table of its
/// own (sessions, an operator's plugin's entities).
pub struct PluginEntity {
    pub spec: EntitySpec,
    /// Its own fields, besides `id`, `created_at`, `consumer` and `tags`.
    pub fields: &'static [(&'static str, FieldKind)],
    /// A valid entity's own fields as JSON, for the Admin API's `/schemas/{table}/validate`.
    pub sample: &'static str,
    /// The entity's own checks (Kong's `one_of`, defaults and `entity_checks` of its
    /// `daos.lua`), run on its fields as read, wherever it is written (Admin API or
    /// declarative file): may fill defaults in; returns violations as (field, message).
    pub check: Option<EntityCheck>,
}

/// A plugin entity's own checks: may fill defaults in; returns violations as (field, message).
/// A function for a bundled plugin's entity; a closure over the schema for an operator's
/// plugin's (its `daos.lua`).
pub type EntityCheck = &'static (dyn Fn(&mut serde_json::Map<String, serde_json::Value>) -> Vec<(String, String)>
              + Send
              + Sync);

impl std::fmt::Debug for PluginEntity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginEntity")
            .field("spec", &self.spec)
            .field("fields", &self.fields)
            .finish_non_exhaustive()
    }
}

/// One entity per table: two are the same when they name the same table.
impl PartialEq for PluginEntity {
    fn eq(&self, other: &Self) -> bool {
        self.spec.table == other.spec.table
    }
}

impl Eq for PluginEntity {}
