//! request-size-limiting's config (Kong `kong/plugins/request-size-limiting/schema.lua`).

use serde::Deserialize;

use crate::schema::{Default, Field, Type};

/// The validated config, typed.
#[derive(Deserialize)]
pub struct Config {
    pub allowed_payload_size: u64,
    pub size_unit: String,
    pub require_content_length: bool,
}

pub const FIELDS: &[Field] = &[
    Field::new(
        "allowed_payload_size",
        Type::Integer {
            min: 0,
            max: i64::MAX,
        },
    )
    .default(Default::Int(128)),
    Field::new(
        "size_unit",
        Type::OneOf(&["megabytes", "kilobytes", "bytes"]),
    )
    .default(Default::Str("megabytes")),
    Field::new("require_content_length", Type::Boolean).default(Default::Bool(false)),
];
