//! ldap-auth's config (Kong `kong/plugins/ldap-auth/schema.lua`).

use serde::Deserialize;
use serde_json::Value;

use crate::schema::{Default, Field, Type};

/// The validated config, typed.
#[derive(Deserialize)]
pub struct Config {
    pub ldap_host: String,
    pub ldap_port: u16,
    pub ldaps: bool,
    pub start_tls: bool,
    pub verify_ldap_host: bool,
    pub base_dn: String,
    pub attribute: String,
    pub cache_ttl: f64,
    pub hide_credentials: bool,
    pub timeout: f64,
    pub keepalive: f64,
    pub anonymous: Option<String>,
    pub header_type: String,
}

pub const FIELDS: &[Field] = &[
    Field::new("ldap_host", Type::String).required(),
    Field::new("ldap_port", Type::Integer { min: 0, max: 65535 })
        .default(Default::Int(389))
        .required(),
    Field::new("ldaps", Type::Boolean).default(Default::Bool(false)),
    Field::new("start_tls", Type::Boolean).default(Default::Bool(false)),
    Field::new("verify_ldap_host", Type::Boolean).default(Default::Bool(false)),
    Field::new("base_dn", Type::String).required(),
    Field::new("attribute", Type::String).required(),
    Field::new("cache_ttl", Type::Number).default(Default::Int(60)),
    Field::new("hide_credentials", Type::Boolean).default(Default::Bool(false)),
    Field::new("timeout", Type::Number).default(Default::Int(10000)),
    Field::new("keepalive", Type::Number).default(Default::Int(60000)),
    Field::new("anonymous", Type::String),
    Field::new("header_type", Type::String).default(Default::Str("ldap")),
];

/// Kong's conditional check: ldaps and start_tls are exclusive.
pub fn entity_checks(config: &Value) -> Vec<(String, String)> {
    if config["ldaps"] == true && config["start_tls"] == true {
        vec![(
            "@entity".into(),
            "'ldaps' and 'start_tls' cannot be enabled simultaneously".into(),
        )]
    } else {
        Vec::new()
    }
}
