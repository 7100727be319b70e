//! file-log's config (Kong `kong/plugins/file-log/schema.lua`). `custom_fields_by_lua` holds
//! Lua, run in the log phase (`crate::lua::LogFields`) and checked like any Lua in a config.

use serde::Deserialize;

use crate::schema::{Default, Field, Type};

/// The validated config, typed.
#[derive(Deserialize)]
pub struct Config {
    pub path: String,
    pub reopen: bool,
    /// Field path → Lua expression, in the order written.
    pub custom_fields_by_lua: Option<serde_json::Map<String, serde_json::Value>>,
}

pub const FIELDS: &[Field] = &[
    Field::new("path", Type::String).required(),
    Field::new("reopen", Type::Boolean).default(Default::Bool(false)),
    Field::new("custom_fields_by_lua", Type::Map),
];
