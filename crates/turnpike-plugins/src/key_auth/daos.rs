//! key-auth's entity (Kong's `kong/plugins/key-auth/daos.lua`): `keyauth_credentials`, a
//! consumer's API keys, reached at `/key-auths` and `/consumers/{c}/key-auth`.

use turnpike_config::entity::{EntitySpec, FieldKind, PluginEntity, CONSUMER};

pub const TABLE: &str = "keyauth_credentials";

pub static KEYAUTH_CREDENTIALS: PluginEntity = PluginEntity {
    spec: EntitySpec {
        table: TABLE,
        path: "key-auths",
        nested_path: "key-auth",
        endpoint_key: Some("key"),
        unique: &["key"],
        cache_key: &[],
        foreign: CONSUMER,
    },
    fields: &[("key", FieldKind::Auto), ("ttl", FieldKind::Int)],
    sample: "{}",
    check: None,
};
