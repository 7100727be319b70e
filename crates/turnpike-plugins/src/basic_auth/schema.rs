//! basic-auth's config (Kong `kong/plugins/basic-auth/schema.lua`).

use serde::Deserialize;

use crate::schema::{Default, Field, Type};

/// The validated config, typed.
#[derive(Deserialize)]
pub struct Config {
    pub anonymous: Option<String>,
    pub hide_credentials: bool,
    pub realm: String,
}

pub const FIELDS: &[Field] = &[
    Field::new("anonymous", Type::String),
    Field::new("hide_credentials", Type::Boolean).default(Default::Bool(false)),
    Field::new("realm", Type::String).default(Default::Str("service")),
];
