//! oauth2's config (Kong `kong/plugins/oauth2/schema.lua`, 3.9).

use serde::Deserialize;
use serde_json::Value;

use crate::schema::{Default, Field, Type};

/// The validated config, typed: what the token check and the endpoints read.
#[derive(Deserialize)]
pub struct Config {
    pub hide_credentials: bool,
    pub anonymous: Option<String>,
    pub global_credentials: bool,
    pub auth_header_name: String,
    pub realm: Option<String>,
    pub scopes: Option<Vec<String>>,
    pub mandatory_scope: bool,
    pub provision_key: Option<String>,
    pub token_expiration: f64,
    pub enable_authorization_code: bool,
    pub enable_implicit_grant: bool,
    pub enable_client_credentials: bool,
    pub enable_password_grant: bool,
    pub accept_http_if_already_terminated: bool,
    pub refresh_token_ttl: f64,
    pub reuse_refresh_token: bool,
    pub pkce: String,
}

pub const FIELDS: &[Field] = &[
    Field::new("scopes", Type::StringArray),
    Field::new("mandatory_scope", Type::Boolean).default(Default::Bool(false)),
    Field::new("provision_key", Type::String).required().auto(),
    Field::new("token_expiration", Type::Number).default(Default::Int(7200)),
    Field::new("enable_authorization_code", Type::Boolean).default(Default::Bool(false)),
    Field::new("enable_implicit_grant", Type::Boolean).default(Default::Bool(false)),
    Field::new("enable_client_credentials", Type::Boolean).default(Default::Bool(false)),
    Field::new("enable_password_grant", Type::Boolean).default(Default::Bool(false)),
    Field::new("hide_credentials", Type::Boolean).default(Default::Bool(false)),
    Field::new("accept_http_if_already_terminated", Type::Boolean).default(Default::Bool(false)),
    Field::new("anonymous", Type::String),
    Field::new("global_credentials", Type::Boolean).default(Default::Bool(false)),
    Field::new("auth_header_name", Type::String).default(Default::Str("authorization")),
    Field::new(
        "refresh_token_ttl",
        Type::NumberIn {
            min: 0.0,
            max: 100_000_000.0,
        },
    )
    .default(Default::Int(1_209_600)),
    Field::new("reuse_refresh_token", Type::Boolean).default(Default::Bool(false)),
    Field::new("persistent_refresh_token", Type::Boolean).default(Default::Bool(false)),
    Field::new("pkce", Type::OneOf(&["none", "lax", "strict"])).default(Default::Str("lax")),
    Field::new("realm", Type::String),
];

/// Kong's entity checks: at least one grant, and available scopes behind a mandatory one.
pub fn entity_checks(config: &Value) -> Vec<(String, String)> {
    let mut errs = Vec::new();
    let on = |f: &str| config[f] == true;
    if !(on("enable_authorization_code")
        || on("enable_implicit_grant")
        || on("enable_client_credentials")
        || on("enable_password_grant"))
    {
        errs.push((
            "@entity".into(),
            "at least one of these fields must be true: enable_authorization_code, \
             enable_implicit_grant, enable_client_credentials, enable_password_grant"
                .into(),
        ));
    }
    let no_scopes = config["scopes"].as_array().is_none_or(|a| a.is_empty());
    if on("mandatory_scope") && no_scopes {
        errs.push((
            "@entity".into(),
            "failed conditional validation given value of field 'mandatory_scope'".into(),
        ));
        errs.push(("scopes".into(), "required field missing".into()));
    }
    errs
}
