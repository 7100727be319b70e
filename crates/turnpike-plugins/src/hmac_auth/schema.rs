//! hmac-auth's config (Kong `kong/plugins/hmac-auth/schema.lua`, 3.9).

use serde::Deserialize;
use serde_json::Value;

use crate::schema::{Default, Field, Type};

pub const ALGORITHMS: &[&str] = &["hmac-sha1", "hmac-sha256", "hmac-sha384", "hmac-sha512"];

/// The validated config, typed.
#[derive(Deserialize)]
pub struct Config {
    pub hide_credentials: bool,
    pub clock_skew: f64,
    pub anonymous: Option<String>,
    pub validate_request_body: bool,
    pub enforce_headers: Vec<String>,
    pub algorithms: Vec<String>,
    pub realm: Option<String>,
}

pub const FIELDS: &[Field] = &[
    Field::new("hide_credentials", Type::Boolean).default(Default::Bool(false)),
    Field::new("clock_skew", Type::Number).default(Default::Int(300)),
    Field::new("anonymous", Type::String),
    Field::new("validate_request_body", Type::Boolean).default(Default::Bool(false)),
    Field::new("enforce_headers", Type::StringArray).default(Default::EmptyArray),
    Field::new("algorithms", Type::OneOfArray(ALGORITHMS)).default(Default::StrArray(ALGORITHMS)),
    Field::new("realm", Type::String),
];

/// Kong's `gt = 0` on `clock_skew`.
pub fn entity_checks(config: &Value) -> Vec<(String, String)> {
    match config["clock_skew"].as_f64() {
        Some(n) if n <= 0.0 => vec![("clock_skew".into(), "value must be greater than 0".into())],
        _ => Vec::new(),
    }
}
