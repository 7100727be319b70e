//! request-size-limiting's config (Kong `kong/plugins/request-size-limiting/schema.lua`).

use crate::schema::{Default, Field, Type};

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
