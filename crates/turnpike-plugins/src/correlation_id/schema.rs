//! correlation-id's config (Kong `kong/plugins/correlation-id/schema.lua`).

use crate::schema::{Default, Field, Type};

pub const FIELDS: &[Field] = &[
    Field::new("header_name", Type::String).default(Default::Str("Kong-Request-ID")),
    Field::new(
        "generator",
        Type::OneOf(&["uuid", "uuid#counter", "tracker"]),
    )
    .default(Default::Str("uuid#counter")),
    Field::new("echo_downstream", Type::Boolean).default(Default::Bool(false)),
];
