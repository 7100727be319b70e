//! The entity tables: one relational table per Kong entity, keyed for the look-ups the Admin API
//! and the config loader make (primary key, endpoint key, unique keys, foreign keys). The whole
//! entity, as the Admin API shows it, is kept beside its keys in `entity` (JSON text), so a read
//! is one primary-key or unique-key look-up and never a scan.

use turnpike_config::declarative::PluginRegistry;
pub use turnpike_config::entity::{fk, EntitySpec, ForeignKey, PluginEntity};

/// Kong's own tables, parents before children (the order rows are created in on import and
/// the order foreign keys allow). The plugins' tables come from the plugin registry
/// ([`Tables`]).
pub static CORE: &[EntitySpec] = &[
    EntitySpec {
        table: "certificates",
        path: "certificates",
        nested_path: "certificates",
        endpoint_key: None,
        unique: &[],
        cache_key: &[],
        foreign: &[],
    },
    EntitySpec {
        table: "ca_certificates",
        path: "ca_certificates",
        nested_path: "ca_certificates",
        endpoint_key: None,
        unique: &["cert_digest"],
        cache_key: &[],
        foreign: &[],
    },
    EntitySpec {
        table: "snis",
        path: "snis",
        nested_path: "snis",
        endpoint_key: Some("name"),
        unique: &["name"],
        cache_key: &[],
        foreign: &[fk("certificate", "certificates", true)],
    },
    EntitySpec {
        table: "services",
        path: "services",
        nested_path: "services",
        endpoint_key: Some("name"),
        unique: &["name"],
        cache_key: &[],
        foreign: &[fk("client_certificate", "certificates", false)],
    },
    EntitySpec {
        table: "routes",
        path: "routes",
        nested_path: "routes",
        endpoint_key: Some("name"),
        unique: &["name"],
        cache_key: &[],
        foreign: &[fk("service", "services", false)],
    },
    EntitySpec {
        table: "upstreams",
        path: "upstreams",
        nested_path: "upstreams",
        endpoint_key: Some("name"),
        unique: &["name"],
        cache_key: &[],
        foreign: &[fk("client_certificate", "certificates", false)],
    },
    EntitySpec {
        table: "targets",
        path: "targets",
        nested_path: "targets",
        endpoint_key: Some("target"),
        unique: &[],
        cache_key: &["upstream", "target"],
        foreign: &[fk("upstream", "upstreams", true)],
    },
    EntitySpec {
        table: "consumers",
        path: "consumers",
        nested_path: "consumers",
        endpoint_key: Some("username"),
        unique: &["username", "custom_id"],
        cache_key: &[],
        foreign: &[],
    },
    EntitySpec {
        table: "plugins",
        path: "plugins",
        nested_path: "plugins",
        endpoint_key: Some("instance_name"),
        unique: &["instance_name"],
        cache_key: &["name", "route", "service", "consumer"],
        foreign: &[
            fk("route", "routes", true),
            fk("service", "services", true),
            fk("consumer", "consumers", true),
        ],
    },
    // Record entities (turnpike_config::declarative::records).
    EntitySpec {
        table: "key_sets",
        path: "key-sets",
        nested_path: "key-sets",
        endpoint_key: Some("name"),
        unique: &["name"],
        cache_key: &[],
        foreign: &[],
    },
    EntitySpec {
        table: "keys",
        path: "keys",
        nested_path: "keys",
        endpoint_key: Some("name"),
        unique: &["name"],
        cache_key: &["kid", "set"],
        foreign: &[fk("set", "key_sets", true)],
    },
    EntitySpec {
        table: "vaults",
        path: "vaults",
        nested_path: "vaults",
        endpoint_key: Some("prefix"),
        unique: &["prefix"],
        cache_key: &[],
        foreign: &[],
    },
];

/// Every table of a node: Kong's own ([`CORE`]), then the plugins' entities (each plugin
/// folder's `daos`, listed by the plugin registry), which all hang under consumers.
#[derive(Clone, Copy)]
pub struct Tables {
    plugins: &'static [&'static PluginEntity],
}

impl Tables {
    pub fn new(registry: &dyn PluginRegistry) -> Tables {
        Tables {
            plugins: registry.entities(),
        }
    }

    /// Every table, parents before children.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &'static EntitySpec> + '_ {
        CORE.iter().chain(self.plugins.iter().map(|e| &e.spec))
    }

    /// Whether rows of `table` may expire (a plugin entity with a `ttl` field).
    pub fn has_ttl(&self, table: &str) -> bool {
        self.plugin_entity(table)
            .is_some_and(|e| e.fields.iter().any(|(f, _)| *f == "ttl"))
    }

    /// The tables whose rows may expire.
    pub fn ttl_tables(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.plugins
            .iter()
            .filter(|e| e.fields.iter().any(|(f, _)| *f == "ttl"))
            .map(|e| e.spec.table)
    }

    /// PostgreSQL: the config version, the change log since `$1` up to it, and each changed
    /// row's entity as stored (NULL: deleted, or a table this build does not know), in one
    /// statement and so one snapshot (a version is bumped first in its write and held until
    /// commit, so every version up to the one read has committed). One row with NULLs after
    /// the version when nothing changed.
    pub fn changes_query(&self) -> String {
        let arms: String = self
            .iter()
            .map(|e| {
                format!(
                    " WHEN '{t}' THEN (SELECT t.entity FROM {t} t WHERE t.id = c.entity_id)",
                    t = e.table
                )
            })
            .collect();
        format!(
            "SELECT m.value, c.version, c.entity_name, c.entity_id, CASE c.entity_name{arms} END \
             FROM turnpike_meta m LEFT JOIN LATERAL \
             (SELECT version, entity_name, entity_id FROM changes \
              WHERE version > $1 AND version <= m.value) c ON true \
             WHERE m.name = 'config_version'"
        )
    }

    /// The spec of a table (`services`).
    pub fn by_table(&self, table: &str) -> Option<&'static EntitySpec> {
        self.iter().find(|e| e.table == table)
    }

    /// The spec behind an Admin API collection (`key-auths`, `services`).
    pub fn by_path(&self, path: &str) -> Option<&'static EntitySpec> {
        self.iter().find(|e| e.path == path)
    }

    /// A plugin's entity (its own fields and a sample), when `table` is one.
    pub fn plugin_entity(&self, table: &str) -> Option<&'static PluginEntity> {
        self.plugins.iter().copied().find(|e| e.spec.table == table)
    }

    /// The child collection called `segment` under `parent` (`routes` under services,
    /// `key-auth` under consumers).
    pub fn child(&self, parent: &EntitySpec, segment: &str) -> Option<&'static EntitySpec> {
        self.iter()
            .find(|c| c.nested_path == segment && c.foreign_to(parent.table).is_some())
    }
}

/// `CREATE TABLE` and index statements, the same text for SQLite and PostgreSQL.
/// `ttl`: the table's rows may expire (Kong's `ttl = true`): an `expires_at` column (indexed
/// by [`expires_index`], made once the column surely exists) lets the store delete expired
/// rows in batches.
pub fn ddl(spec: &EntitySpec, ttl: bool) -> Vec<String> {
    let mut cols = vec!["id TEXT PRIMARY KEY".to_string()];
    for u in spec.unique {
        cols.push(format!("{} TEXT UNIQUE", quote(u)));
    }
    if !spec.cache_key.is_empty() {
        cols.push("cache_key TEXT NOT NULL UNIQUE".into());
    }
    for f in spec.foreign {
        cols.push(format!("{} TEXT REFERENCES {}(id)", f.column(), f.table));
    }
    cols.push("created_at BIGINT NOT NULL".into());
    cols.push("entity TEXT NOT NULL".into());
    if ttl {
        cols.push("expires_at BIGINT".into());
    }
    let mut out = vec![format!(
        "CREATE TABLE IF NOT EXISTS {} ({})",
        spec.table,
        cols.join(", ")
    )];
    for f in spec.foreign {
        out.push(format!(
            "CREATE INDEX IF NOT EXISTS {t}_{c} ON {t} ({c})",
            t = spec.table,
            c = f.column()
        ));
    }
    out
}

/// The index that finds a ttl table's expired rows.
pub fn expires_index(table: &str) -> String {
    format!("CREATE INDEX IF NOT EXISTS {table}_expires_at ON {table} (expires_at) WHERE expires_at IS NOT NULL")
}

/// Quotes a column name that is an SQL keyword.
pub fn quote(name: &str) -> String {
    match name {
        "group" | "key" => format!("\"{name}\""),
        _ => name.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tables() -> Tables {
        Tables::new(&turnpike_plugins::bundled())
    }

    #[test]
    fn every_reference_points_to_an_earlier_table() {
        let all: Vec<_> = tables().iter().collect();
        for (i, e) in all.iter().enumerate() {
            for f in e.foreign {
                let p = all.iter().position(|x| x.table == f.table).unwrap();
                assert!(p < i, "{} references {} declared later", e.table, f.table);
            }
        }
    }

    #[test]
    fn nested_paths_resolve() {
        let t = tables();
        let consumers = t.by_table("consumers").unwrap();
        assert_eq!(
            t.child(consumers, "key-auth").unwrap().table,
            "keyauth_credentials"
        );
        assert_eq!(t.child(consumers, "plugins").unwrap().table, "plugins");
        assert!(t.child(consumers, "routes").is_none());
        let routes = t.by_table("routes").unwrap();
        assert_eq!(routes.parent_field("service").unwrap().table, "services");
        assert_eq!(t.by_path("key-auths").unwrap().table, "keyauth_credentials");
    }
}
