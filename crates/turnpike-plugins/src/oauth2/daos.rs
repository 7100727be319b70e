//! oauth2's credential entity (Kong's `kong/plugins/oauth2/daos.lua`): `oauth2_credentials`,
//! the applications of a consumer, at `/oauth2` and `/consumers/{c}/oauth2`.

use turnpike_config::entity::{EntitySpec, FieldKind, PluginEntity, CONSUMER};

pub const TABLE: &str = "oauth2_credentials";

pub static OAUTH2_CREDENTIALS: PluginEntity = PluginEntity {
    spec: EntitySpec {
        table: TABLE,
        path: "oauth2",
        nested_path: "oauth2",
        endpoint_key: Some("client_id"),
        unique: &["client_id"],
        cache_key: &[],
        foreign: CONSUMER,
    },
    fields: &[
        ("name", FieldKind::Required),
        ("client_id", FieldKind::Auto),
        ("client_secret", FieldKind::Auto),
        ("hash_secret", FieldKind::Bool),
        ("redirect_uris", FieldKind::StrArray),
        ("client_type", FieldKind::Optional),
    ],
    sample: r#"{"name": "n"}"#,
    check: None,
};
