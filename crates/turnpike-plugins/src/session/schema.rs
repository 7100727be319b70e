//! session's config (Kong `kong/plugins/session/schema.lua`, 3.x with lua-resty-session 4).

use serde::Deserialize;
use serde_json::Value;

use crate::schema::{Default, Field, Shorthand, Type};

const HEADERS: &[&str] = &[
    "id",
    "audience",
    "subject",
    "timeout",
    "idling-timeout",
    "rolling-timeout",
    "absolute-timeout",
];

/// The validated config, typed.
#[derive(Deserialize)]
pub struct Config {
    pub secret: Option<String>,
    pub storage: String,
    pub stale_ttl: f64,
    pub audience: String,
    pub idling_timeout: f64,
    pub rolling_timeout: f64,
    pub absolute_timeout: f64,
    pub cookie_name: String,
    pub cookie_path: String,
    pub cookie_domain: Option<String>,
    pub cookie_same_site: String,
    pub cookie_http_only: bool,
    pub cookie_secure: bool,
    pub remember: bool,
    pub remember_cookie_name: String,
    pub remember_rolling_timeout: f64,
    pub remember_absolute_timeout: f64,
    pub response_headers: Option<Vec<String>>,
    pub request_headers: Option<Vec<String>>,
    pub read_body_for_logout: bool,
    pub logout_methods: Vec<String>,
    pub logout_query_arg: String,
    pub logout_post_arg: String,
}

pub const FIELDS: &[Field] = &[
    Field::new("secret", Type::String).referenceable(),
    Field::new("storage", Type::OneOf(&["cookie", "kong"])).default(Default::Str("cookie")),
    Field::new("audience", Type::String).default(Default::Str("default")),
    Field::new("idling_timeout", Type::Number).default(Default::Int(900)),
    Field::new("rolling_timeout", Type::Number).default(Default::Int(3600)),
    Field::new("absolute_timeout", Type::Number).default(Default::Int(86400)),
    Field::new("stale_ttl", Type::Number).default(Default::Int(10)),
    Field::new("cookie_name", Type::String).default(Default::Str("session")),
    Field::new("cookie_path", Type::String).default(Default::Str("/")),
    Field::new("cookie_domain", Type::String),
    Field::new(
        "cookie_same_site",
        Type::OneOf(&["Strict", "Lax", "None", "Default"]),
    )
    .default(Default::Str("Strict")),
    Field::new("cookie_http_only", Type::Boolean).default(Default::Bool(true)),
    Field::new("cookie_secure", Type::Boolean).default(Default::Bool(true)),
    Field::new("remember", Type::Boolean).default(Default::Bool(false)),
    Field::new("remember_cookie_name", Type::String).default(Default::Str("remember")),
    Field::new("remember_rolling_timeout", Type::Number).default(Default::Int(604800)),
    Field::new("remember_absolute_timeout", Type::Number).default(Default::Int(2592000)),
    Field::new("response_headers", Type::OneOfArray(HEADERS)),
    Field::new("request_headers", Type::OneOfArray(HEADERS)),
    Field::new("read_body_for_logout", Type::Boolean).default(Default::Bool(false)),
    Field::new(
        "logout_methods",
        Type::OneOfArray(&["GET", "POST", "DELETE"]),
    )
    .default(Default::StrArray(&["POST", "DELETE"])),
    Field::new("logout_query_arg", Type::String).default(Default::Str("session_logout")),
    Field::new("logout_post_arg", Type::String).default(Default::Str("session_logout")),
];

/// Kong's deprecated names (3.x `shorthand_fields`).
pub const SHORTHANDS: &[Shorthand] = &[
    Shorthand {
        name: "cookie_lifetime",
        ty: Type::Number,
        into: &["rolling_timeout"],
    },
    Shorthand {
        name: "cookie_idletime",
        ty: Type::Number,
        into: &["idling_timeout"],
    },
    Shorthand {
        name: "cookie_discard",
        ty: Type::Number,
        into: &["stale_ttl"],
    },
    Shorthand {
        name: "cookie_httponly",
        ty: Type::Boolean,
        into: &["cookie_http_only"],
    },
    Shorthand {
        name: "cookie_persistent",
        ty: Type::Boolean,
        into: &["remember"],
    },
];

/// Moves deprecated fields into place (`cookie_samesite = "off"` becomes `Lax`, as in Kong).
pub fn shorthands(config: &mut Value) {
    let Some(m) = config.as_object_mut() else {
        return;
    };
    for s in SHORTHANDS {
        if let Some(v) = m.remove(s.name) {
            m.entry(s.into[0]).or_insert(v);
        }
    }
    if let Some(v) = m.remove("cookie_samesite") {
        let v = if v == "off" { Value::from("Lax") } else { v };
        m.entry("cookie_same_site").or_insert(v);
    }
    m.remove("cookie_renew");
}
