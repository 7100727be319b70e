//! grpc-web's config (Kong `kong/plugins/grpc-web/schema.lua`).

use serde::Deserialize;

use crate::schema::{Default, Field, Type};

/// The validated config, typed.
#[derive(Deserialize)]
pub struct Config {
    pub proto: Option<String>,
    pub pass_stripped_path: Option<bool>,
    pub allow_origin_header: String,
}

pub const FIELDS: &[Field] = &[
    Field::new("proto", Type::String),
    Field::new("pass_stripped_path", Type::Boolean),
    Field::new("allow_origin_header", Type::String).default(Default::Str("*")),
];
