//! cors's config (Kong `kong/plugins/cors/schema.lua`).

use serde::Deserialize;
use serde_json::Value;

use crate::schema::{Default, Field, Type};

/// The validated config, typed.
#[derive(Deserialize)]
pub struct Config {
    pub origins: Option<Vec<String>>,
    pub headers: Option<Vec<String>>,
    pub exposed_headers: Option<Vec<String>>,
    pub methods: Option<Vec<String>>,
    pub max_age: Option<f64>,
    pub credentials: bool,
    pub private_network: bool,
    pub preflight_continue: bool,
    pub allow_origin_absent: bool,
}

pub const FIELDS: &[Field] = &[
    Field::new("origins", Type::StringArray),
    Field::new("headers", Type::StringArray),
    Field::new("exposed_headers", Type::StringArray),
    Field::new("methods", Type::StringArray).default(Default::StrArray(&[
        "GET", "HEAD", "PUT", "PATCH", "POST", "DELETE", "OPTIONS", "TRACE", "CONNECT",
    ])),
    Field::new("max_age", Type::Number),
    Field::new("credentials", Type::Boolean).default(Default::Bool(false)),
    Field::new("private_network", Type::Boolean).default(Default::Bool(false)),
    Field::new("preflight_continue", Type::Boolean).default(Default::Bool(false)),
    Field::new("allow_origin_absent", Type::Boolean).default(Default::Bool(true)),
];

/// Origins that are patterns must compile; methods must be HTTP methods.
pub fn entity_checks(config: &Value) -> Vec<(String, String)> {
    let mut errs = Vec::new();
    for (i, o) in config["origins"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let o = o.as_str().unwrap_or_default();
        if super::is_pattern(o) && regex::Regex::new(&format!("^(?:{o})$")).is_err() {
            errs.push((
                format!("origins.{}", i + 1),
                format!("'{o}' is not a valid regex"),
            ));
        }
    }
    const METHODS: &[&str] = &[
        "GET", "HEAD", "PUT", "PATCH", "POST", "DELETE", "OPTIONS", "TRACE", "CONNECT",
    ];
    for (i, m) in config["methods"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let m = m.as_str().unwrap_or_default();
        if !METHODS.contains(&m) {
            errs.push((
                format!("methods.{}", i + 1),
                format!("expected one of: {}", METHODS.join(", ")),
            ));
        }
    }
    errs
}
