//! jwt's entity (Kong's `kong/plugins/jwt/daos.lua`): `jwt_secrets`, at `/jwts` and
//! `/consumers/{c}/jwt`.

use turnpike_config::entity::{EntitySpec, FieldKind, PluginEntity, CONSUMER};

pub const TABLE: &str = "jwt_secrets";

pub static JWT_SECRETS: PluginEntity = PluginEntity {
    spec: EntitySpec {
        table: TABLE,
        path: "jwts",
        nested_path: "jwt",
        endpoint_key: Some("key"),
        unique: &["key"],
        cache_key: &[],
        foreign: CONSUMER,
    },
    fields: &[
        ("key", FieldKind::Auto),
        ("secret", FieldKind::Auto),
        ("algorithm", FieldKind::Optional),
        ("rsa_public_key", FieldKind::Optional),
    ],
    sample: "{}",
};
