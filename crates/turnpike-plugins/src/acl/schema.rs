//! acl's config (Kong `kong/plugins/acl/schema.lua`).

use serde_json::Value;

use serde::Deserialize;

use crate::schema::{Default, Field, Type};

/// The validated config, typed.
#[derive(Deserialize)]
pub struct Config {
    pub allow: Option<Vec<String>>,
    pub deny: Option<Vec<String>>,
    pub hide_groups_header: bool,
    pub always_use_authenticated_groups: bool,
}

pub const FIELDS: &[Field] = &[
    Field::new("allow", Type::StringArray),
    Field::new("deny", Type::StringArray),
    Field::new("hide_groups_header", Type::Boolean).default(Default::Bool(false)),
    Field::new("always_use_authenticated_groups", Type::Boolean).default(Default::Bool(false)),
];

/// Exactly one of `allow` and `deny` (Kong's `only_one_of`).
pub fn entity_checks(config: &Value) -> Vec<(String, String)> {
    let set = |k: &str| config[k].as_array().is_some_and(|a| !a.is_empty());
    match (set("allow"), set("deny")) {
        (true, true) => vec![(
            "@entity".into(),
            "only one of these fields must be non-empty: 'config.allow', 'config.deny'".into(),
        )],
        (false, false) => vec![(
            "@entity".into(),
            "at least one of these fields must be non-empty: 'config.allow', 'config.deny'".into(),
        )],
        _ => Vec::new(),
    }
}
