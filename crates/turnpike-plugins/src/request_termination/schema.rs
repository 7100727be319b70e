//! request-termination's config (Kong `kong/plugins/request-termination/schema.lua`).

use serde::Deserialize;
use serde_json::Value;

use crate::schema::{Default, Field, Type};

/// The validated config, typed.
#[derive(Deserialize)]
pub struct Config {
    pub status_code: u16,
    pub message: Option<String>,
    pub content_type: Option<String>,
    pub body: Option<String>,
    pub echo: bool,
    pub trigger: Option<String>,
}

pub const FIELDS: &[Field] = &[
    Field::new("status_code", Type::Integer { min: 100, max: 599 }).default(Default::Int(503)),
    Field::new("message", Type::String),
    Field::new("content_type", Type::String),
    Field::new("body", Type::String),
    Field::new("echo", Type::Boolean).default(Default::Bool(false)),
    Field::new("trigger", Type::String),
];

/// Kong's entity checks: `message` and `body` exclude each other; `content_type` needs `body`.
pub fn entity_checks(config: &Value) -> Vec<(String, String)> {
    let set = |k: &str| !config[k].is_null();
    let mut errs = Vec::new();
    if set("message") && set("body") {
        errs.push((
            "@entity".into(),
            "message cannot be used with content_type or body".into(),
        ));
    }
    if set("content_type") && !set("body") {
        errs.push(("@entity".into(), "content_type requires a body".into()));
    }
    if set("echo") && config["echo"] == Value::Bool(true) && (set("body") || set("content_type")) {
        errs.push((
            "@entity".into(),
            "echo cannot be used with content_type and body".into(),
        ));
    }
    errs
}
