//! ip-restriction's config (Kong `kong/plugins/ip-restriction/schema.lua`).

use serde::Deserialize;
use serde_json::Value;
use turnpike_config::conf::parse_cidr;

use crate::schema::{Field, Type};

/// The validated config, typed.
#[derive(Deserialize)]
pub struct Config {
    pub allow: Option<Vec<String>>,
    pub deny: Option<Vec<String>>,
    pub status: Option<u16>,
    pub message: Option<String>,
}

pub const FIELDS: &[Field] = &[
    Field::new("allow", Type::StringArray),
    Field::new("deny", Type::StringArray),
    Field::new("status", Type::Integer { min: 100, max: 599 }),
    Field::new("message", Type::String),
];

/// At least one list, and every entry an IP or CIDR range (Kong's `typedefs.ip_or_cidr`).
pub fn entity_checks(config: &Value) -> Vec<(String, String)> {
    let mut errs = Vec::new();
    let list = |k: &str| config[k].as_array().filter(|a| !a.is_empty());
    if list("allow").is_none() && list("deny").is_none() {
        errs.push((
            "@entity".into(),
            "at least one of these fields must be non-empty: 'allow', 'deny'".into(),
        ));
    }
    for key in ["allow", "deny"] {
        for (i, v) in list(key).into_iter().flatten().enumerate() {
            let s = v.as_str().unwrap_or_default();
            if parse_cidr(s).is_none() {
                errs.push((
                    format!("{key}.{}", i + 1),
                    format!("invalid ip or cidr range: '{s}'"),
                ));
            }
        }
    }
    errs
}
