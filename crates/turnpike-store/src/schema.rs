//! The entity tables: one relational table per Kong entity, keyed for the look-ups the Admin API
//! and the config loader make (primary key, endpoint key, unique keys, foreign keys). The whole
//! entity, as the Admin API shows it, is kept beside its keys in `entity` (JSON text), so a read
//! is one primary-key or unique-key look-up and never a scan.

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

const fn fk(field: &'static str, table: &'static str, cascade: bool) -> ForeignKey {
    ForeignKey {
        field,
        table,
        cascade,
    }
}

/// Every table, parents before children (the order rows are created in on import and the
/// order foreign keys allow).
pub static ENTITIES: &[EntitySpec] = &[
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
    EntitySpec {
        table: "keyauth_credentials",
        path: "key-auths",
        nested_path: "key-auth",
        endpoint_key: Some("key"),
        unique: &["key"],
        cache_key: &[],
        foreign: &[fk("consumer", "consumers", true)],
    },
    EntitySpec {
        table: "basicauth_credentials",
        path: "basic-auths",
        nested_path: "basic-auth",
        endpoint_key: Some("username"),
        unique: &["username"],
        cache_key: &[],
        foreign: &[fk("consumer", "consumers", true)],
    },
    EntitySpec {
        table: "acls",
        path: "acls",
        nested_path: "acls",
        endpoint_key: None,
        unique: &[],
        cache_key: &["consumer", "group"],
        foreign: &[fk("consumer", "consumers", true)],
    },
    EntitySpec {
        table: "jwt_secrets",
        path: "jwts",
        nested_path: "jwt",
        endpoint_key: Some("key"),
        unique: &["key"],
        cache_key: &[],
        foreign: &[fk("consumer", "consumers", true)],
    },
    EntitySpec {
        table: "hmacauth_credentials",
        path: "hmac-auths",
        nested_path: "hmac-auth",
        endpoint_key: Some("username"),
        unique: &["username"],
        cache_key: &[],
        foreign: &[fk("consumer", "consumers", true)],
    },
    EntitySpec {
        table: "oauth2_credentials",
        path: "oauth2",
        nested_path: "oauth2",
        endpoint_key: Some("client_id"),
        unique: &["client_id"],
        cache_key: &[],
        foreign: &[fk("consumer", "consumers", true)],
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

/// The spec of a table (`services`).
pub fn by_table(table: &str) -> Option<&'static EntitySpec> {
    ENTITIES.iter().find(|e| e.table == table)
}

/// The spec behind an Admin API collection (`key-auths`, `services`).
pub fn by_path(path: &str) -> Option<&'static EntitySpec> {
    ENTITIES.iter().find(|e| e.path == path)
}

impl EntitySpec {
    /// The foreign key of this table that references `parent_table`, for nested paths.
    pub fn foreign_to(&self, parent_table: &str) -> Option<&'static ForeignKey> {
        self.foreign.iter().find(|f| f.table == parent_table)
    }

    /// The child collection called `segment` under this entity (`routes` under services,
    /// `key-auth` under consumers).
    pub fn child(&self, segment: &str) -> Option<&'static EntitySpec> {
        ENTITIES
            .iter()
            .find(|c| c.nested_path == segment && c.foreign_to(self.table).is_some())
    }

    /// The parent reached as `/{self}/{id}/{segment}` (`/routes/{r}/service`).
    pub fn parent_field(&self, segment: &str) -> Option<&'static ForeignKey> {
        self.foreign.iter().find(|f| f.field == segment)
    }

    /// `CREATE TABLE` and index statements, the same text for SQLite and PostgreSQL.
    pub fn ddl(&self) -> Vec<String> {
        let mut cols = vec!["id TEXT PRIMARY KEY".to_string()];
        for u in self.unique {
            cols.push(format!("{} TEXT UNIQUE", quote(u)));
        }
        if !self.cache_key.is_empty() {
            cols.push("cache_key TEXT NOT NULL UNIQUE".into());
        }
        for f in self.foreign {
            cols.push(format!("{} TEXT REFERENCES {}(id)", f.column(), f.table));
        }
        cols.push("created_at BIGINT NOT NULL".into());
        cols.push("entity TEXT NOT NULL".into());
        let mut out = vec![format!(
            "CREATE TABLE IF NOT EXISTS {} ({})",
            self.table,
            cols.join(", ")
        )];
        for f in self.foreign {
            out.push(format!(
                "CREATE INDEX IF NOT EXISTS {t}_{c} ON {t} ({c})",
                t = self.table,
                c = f.column()
            ));
        }
        out
    }
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

    #[test]
    fn every_reference_points_to_an_earlier_table() {
        for (i, e) in ENTITIES.iter().enumerate() {
            for f in e.foreign {
                let p = ENTITIES.iter().position(|x| x.table == f.table).unwrap();
                assert!(p < i, "{} references {} declared later", e.table, f.table);
            }
        }
    }

    #[test]
    fn nested_paths_resolve() {
        let consumers = by_table("consumers").unwrap();
        assert_eq!(
            consumers.child("key-auth").unwrap().table,
            "keyauth_credentials"
        );
        assert_eq!(consumers.child("plugins").unwrap().table, "plugins");
        assert!(consumers.child("routes").is_none());
        let routes = by_table("routes").unwrap();
        assert_eq!(routes.parent_field("service").unwrap().table, "services");
        assert_eq!(by_path("key-auths").unwrap().table, "keyauth_credentials");
    }
}
