//! post-function's config: the same as pre-function's (Kong shares one `_schema.lua`).

pub use crate::pre_function::schema::{entity_checks, FIELDS};
