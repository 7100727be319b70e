//! jwt's config (Kong `kong/plugins/jwt/schema.lua`, 3.9).

use serde::Deserialize;
use serde_json::Value;

use crate::schema::{Default, Field, Type};

/// The validated config, typed.
#[derive(Deserialize)]
pub struct Config {
    pub uri_param_names: Vec<String>,
    pub cookie_names: Vec<String>,
    pub key_claim_name: String,
    pub secret_is_base64: bool,
    pub claims_to_verify: Option<Vec<String>>,
    pub anonymous: Option<String>,
    pub run_on_preflight: bool,
    pub maximum_expiration: f64,
    pub header_names: Vec<String>,
    pub realm: Option<String>,
}

pub const FIELDS: &[Field] = &[
    Field::new("uri_param_names", Type::StringArray).default(Default::StrArray(&["jwt"])),
    Field::new("cookie_names", Type::StringArray).default(Default::EmptyArray),
    Field::new("key_claim_name", Type::String).default(Default::Str("iss")),
    Field::new("secret_is_base64", Type::Boolean).default(Default::Bool(false)),
    Field::new("claims_to_verify", Type::OneOfArray(&["exp", "nbf"])),
    Field::new("anonymous", Type::String),
    Field::new("run_on_preflight", Type::Boolean).default(Default::Bool(true)),
    Field::new(
        "maximum_expiration",
        Type::NumberIn {
            min: 0.0,
            max: 31_536_000.0,
        },
    )
    .default(Default::Int(0)),
    Field::new("header_names", Type::StringArray).default(Default::StrArray(&["authorization"])),
    Field::new("realm", Type::String),
];

/// Kong's conditional check: a `maximum_expiration` needs `exp` among the claims verified.
pub fn entity_checks(config: &Value) -> Vec<(String, String)> {
    let max = config["maximum_expiration"].as_f64().unwrap_or(0.0);
    let has_exp = config["claims_to_verify"]
        .as_array()
        .is_some_and(|a| a.iter().any(|v| v == "exp"));
    if max > 0.0 && !has_exp {
        vec![
            (
                "@entity".into(),
                "failed conditional validation given value of field 'config.maximum_expiration'"
                    .into(),
            ),
            ("claims_to_verify".into(), "must contain 'exp'".into()),
        ]
    } else {
        Vec::new()
    }
}
