//! oauth2's entities (Kong's `kong/plugins/oauth2/daos.lua`): `oauth2_credentials`, the
//! applications of a consumer, at `/oauth2` and `/consumers/{c}/oauth2`; and `oauth2_tokens`,
//! the tokens issued to them, at `/oauth2_tokens` (kept in a database only, expiring with
//! their `ttl`).

use serde_json::{Map, Value};
use turnpike_config::entity::{fk, EntitySpec, FieldKind, ForeignKey, PluginEntity, CONSUMER};

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
    check: Some(&check_client),
};

/// Kong's `client_type`: `confidential` (the default) or `public`.
fn check_client(fields: &mut Map<String, Value>) -> Vec<(String, String)> {
    match fields.get("client_type") {
        None | Some(Value::Null) => {
            fields.insert("client_type".into(), Value::from("confidential"));
            Vec::new()
        }
        Some(v) if v == "confidential" || v == "public" => Vec::new(),
        Some(_) => vec![(
            "client_type".into(),
            "expected one of: confidential, public".into(),
        )],
    }
}

pub const TOKENS: &str = "oauth2_tokens";

/// A token's application (deleted with it) and, optionally, the service it is for.
const TOKEN_FOREIGN: &[ForeignKey] = &[
    fk("credential", TABLE, true),
    fk("service", "services", true),
];

pub static OAUTH2_TOKENS: PluginEntity = PluginEntity {
    spec: EntitySpec {
        table: TOKENS,
        path: "oauth2_tokens",
        nested_path: "oauth2_tokens",
        endpoint_key: Some("access_token"),
        unique: &["access_token", "refresh_token"],
        cache_key: &[],
        foreign: TOKEN_FOREIGN,
    },
    fields: &[
        ("access_token", FieldKind::Auto),
        ("refresh_token", FieldKind::Optional),
        ("token_type", FieldKind::Optional),
        ("expires_in", FieldKind::Int),
        ("authenticated_userid", FieldKind::Optional),
        ("scope", FieldKind::Optional),
        ("ttl", FieldKind::Int),
    ],
    sample: r#"{"credential": {"id": "00000000-0000-4000-8000-000000000000"}, "expires_in": 7200}"#,
    check: Some(&check_token),
};

/// Kong's token schema: `token_type` is `bearer` (the default), `expires_in` is required.
fn check_token(fields: &mut Map<String, Value>) -> Vec<(String, String)> {
    let mut errs = Vec::new();
    match fields.get("token_type") {
        None | Some(Value::Null) => {
            fields.insert("token_type".into(), Value::from("bearer"));
        }
        Some(v) if v == "bearer" => {}
        Some(_) => errs.push(("token_type".into(), "expected one of: bearer".into())),
    }
    if fields.get("expires_in").is_none_or(|v| v.is_null()) {
        errs.push(("expires_in".into(), "required field missing".into()));
    }
    errs
}

pub const CODES: &str = "oauth2_authorization_codes";

/// An authorization code (`/oauth2/authorize` with `response_type=code`), exchanged once for a
/// token at `/oauth2/token`. Kong gives it no Admin API (`generate_admin_api = false`): no path
/// here either. It lives 300 s (`ttl`), with its PKCE challenge when the client sent one.
pub static OAUTH2_AUTHORIZATION_CODES: PluginEntity = PluginEntity {
    spec: EntitySpec {
        table: CODES,
        path: "",
        nested_path: "",
        endpoint_key: Some("code"),
        unique: &["code"],
        cache_key: &[],
        foreign: TOKEN_FOREIGN,
    },
    fields: &[
        ("code", FieldKind::Auto),
        ("authenticated_userid", FieldKind::Optional),
        ("scope", FieldKind::Optional),
        ("challenge", FieldKind::Optional),
        ("challenge_method", FieldKind::Optional),
        ("ttl", FieldKind::Int),
    ],
    sample: r#"{"credential": {"id": "00000000-0000-4000-8000-000000000000"}}"#,
    check: None,
};
