//! basic-auth's config (Kong `kong/plugins/basic-auth/schema.lua`).

use crate::schema::{Default, Field, Type};

pub const FIELDS: &[Field] = &[
    Field::new("anonymous", Type::String),
    Field::new("hide_credentials", Type::Boolean).default(Default::Bool(false)),
    Field::new("realm", Type::String).default(Default::Str("service")),
];
