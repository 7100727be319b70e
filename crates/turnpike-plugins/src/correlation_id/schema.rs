//! correlation-id's config (Kong `kong/plugins/correlation-id/schema.lua`).

use serde::Deserialize;

use crate::schema::{Default, Field, Type};

/// The validated config, typed.
#[derive(Deserialize)]
pub struct Config {
    pub header_name: String,
    pub generator: String,
    pub echo_downstream: bool,
}

pub const FIELDS: &[Field] = &[
    Field::new("header_name", Type::String).default(Default::Str("Kong-Request-ID")),
    Field::new(
        "generator",
        Type::OneOf(&["uuid", "uuid#counter", "tracker"]),
    )
    .default(Default::Str("uuid#counter")),
    Field::new("echo_downstream", Type::Boolean).default(Default::Bool(false)),
];
