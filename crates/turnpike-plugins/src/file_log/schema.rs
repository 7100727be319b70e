//! file-log's config (Kong `kong/plugins/file-log/schema.lua`). `custom_fields_by_lua` holds
//! Lua; Turnpike runs no Lua, so a config that sets it is refused (see `entity_checks`).

use crate::schema::{Default, Field, Type};

pub const FIELDS: &[Field] = &[
    Field::new("path", Type::String).required(),
    Field::new("reopen", Type::Boolean).default(Default::Bool(false)),
    Field::new("custom_fields_by_lua", Type::Map),
];
