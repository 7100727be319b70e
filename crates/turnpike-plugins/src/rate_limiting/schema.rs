//! rate-limiting's config (Kong `kong/plugins/rate-limiting/schema.lua`).

use serde_json::Value;

use crate::schema::{Default, Field, Type};

pub const PERIODS: [&str; 6] = ["second", "minute", "hour", "day", "month", "year"];

pub const FIELDS: &[Field] = &[
    Field::new("second", Type::Number),
    Field::new("minute", Type::Number),
    Field::new("hour", Type::Number),
    Field::new("day", Type::Number),
    Field::new("month", Type::Number),
    Field::new("year", Type::Number),
    Field::new(
        "limit_by",
        Type::OneOf(&["consumer", "credential", "ip", "service", "header", "path"]),
    )
    .default(Default::Str("consumer")),
    Field::new("header_name", Type::String),
    Field::new("path", Type::String),
    Field::new("policy", Type::OneOf(&["local", "cluster", "redis"]))
        .default(Default::Str("local")),
    Field::new("fault_tolerant", Type::Boolean).default(Default::Bool(true)),
    Field::new("hide_client_headers", Type::Boolean).default(Default::Bool(false)),
    Field::new("error_code", Type::Integer { min: 0, max: 999 }).default(Default::Int(429)),
    Field::new("error_message", Type::String).default(Default::Str("API rate limit exceeded")),
    Field::new("sync_rate", Type::Number).default(Default::Int(-1)),
];

/// Kong's entity checks, and what this build does not do yet.
pub fn entity_checks(config: &Value) -> Vec<(String, String)> {
    let mut errs = Vec::new();
    let limits: Vec<(&str, f64)> = PERIODS
        .iter()
        .filter_map(|p| config[*p].as_f64().map(|v| (*p, v)))
        .collect();
    if limits.is_empty() {
        errs.push((
            "@entity".into(),
            "at least one of these fields must be non-empty: 'config.second', 'config.minute', 'config.hour', 'config.day', 'config.month', 'config.year'".into(),
        ));
    }
    for (p, v) in &limits {
        if *v <= 0.0 {
            errs.push((p.to_string(), "value must be greater than 0".into()));
        }
    }
    // A smaller period may not allow more than a larger one.
    for w in limits.windows(2) {
        if w[0].1 > w[1].1 {
            errs.push((
                "@entity".into(),
                format!(
                    "The limit for {}({:.1}) cannot be lower than the limit for {}({:.1})",
                    w[1].0, w[1].1, w[0].0, w[0].1
                ),
            ));
        }
    }
    match config["limit_by"].as_str() {
        Some("header") if config["header_name"].is_null() => {
            errs.push(("header_name".into(), "required field missing".into()))
        }
        Some("path") if config["path"].is_null() => {
            errs.push(("path".into(), "required field missing".into()))
        }
        _ => {}
    }
    match config["policy"].as_str() {
        Some("local") | None => {}
        Some(other) => errs.push((
            "policy".into(),
            format!("policy '{other}' is not available in this build yet; use 'local'"),
        )),
    }
    errs
}
