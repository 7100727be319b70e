//! hmac-auth's entity (Kong's `kong/plugins/hmac-auth/daos.lua`): `hmacauth_credentials`, at
//! `/hmac-auths` and `/consumers/{c}/hmac-auth`.

use turnpike_config::entity::{EntitySpec, FieldKind, PluginEntity, CONSUMER};

pub const TABLE: &str = "hmacauth_credentials";

pub static HMACAUTH_CREDENTIALS: PluginEntity = PluginEntity {
    spec: EntitySpec {
        table: TABLE,
        path: "hmac-auths",
        nested_path: "hmac-auth",
        endpoint_key: Some("username"),
        unique: &["username"],
        cache_key: &[],
        foreign: CONSUMER,
    },
    fields: &[
        ("username", FieldKind::Required),
        ("secret", FieldKind::Auto),
    ],
    sample: r#"{"username": "u", "password": "p"}"#,
    check: None,
};
