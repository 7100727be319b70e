//! key-auth's config (Kong `kong/plugins/key-auth/schema.lua`).

use serde::Deserialize;
use serde_json::Value;

use crate::schema::{Default, Field, Type};

/// The validated config, typed.
#[derive(Deserialize)]
pub struct Config {
    pub key_names: Vec<String>,
    pub hide_credentials: bool,
    pub anonymous: Option<String>,
    pub key_in_header: bool,
    pub key_in_query: bool,
    pub key_in_body: bool,
    pub run_on_preflight: bool,
    pub realm: Option<String>,
}

pub const FIELDS: &[Field] = &[
    Field::new("key_names", Type::StringArray).default(Default::StrArray(&["apikey"])),
    Field::new("hide_credentials", Type::Boolean).default(Default::Bool(false)),
    Field::new("anonymous", Type::String),
    Field::new("key_in_header", Type::Boolean).default(Default::Bool(true)),
    Field::new("key_in_query", Type::Boolean).default(Default::Bool(true)),
    Field::new("key_in_body", Type::Boolean).default(Default::Bool(false)),
    Field::new("run_on_preflight", Type::Boolean).default(Default::Bool(true)),
    Field::new("realm", Type::String),
];

/// Key names must be usable as header names (Kong's `typedefs.header_name`).
pub fn entity_checks(config: &Value) -> Vec<(String, String)> {
    let mut errs = Vec::new();
    let names = config["key_names"].as_array().cloned().unwrap_or_default();
    if names.is_empty() {
        errs.push(("key_names".into(), "length must be at least 1".into()));
    }
    for (i, n) in names.iter().enumerate() {
        let n = n.as_str().unwrap_or_default();
        if n.is_empty()
            || !n
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            errs.push((
                format!("key_names.{}", i + 1),
                format!(
                    "bad header name '{n}', allowed characters are A-Z, a-z, 0-9, '_', and '-'"
                ),
            ));
        }
    }
    errs
}
