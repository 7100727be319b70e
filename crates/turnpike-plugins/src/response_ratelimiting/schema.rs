//! response-ratelimiting's config (Kong `kong/plugins/response-ratelimiting/schema.lua`):
//! named limits, each with per-period maximums; the upstream's header that reports usage;
//! who is counted; where (`local` or `redis`, and Redis's settings as rate-limiting has them).

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use crate::rate_limiting::schema::{Redis, REDIS};
use crate::schema::{Default, Field, Type};

#[derive(Deserialize)]
pub struct Config {
    pub limits: BTreeMap<String, Limit>,
    pub header_name: String,
    pub limit_by: String,
    pub policy: String,
    pub fault_tolerant: bool,
    pub hide_client_headers: bool,
    pub block_on_first_violation: bool,
    pub redis: Redis,
}

#[derive(Deserialize)]
pub struct Limit {
    pub second: Option<f64>,
    pub minute: Option<f64>,
    pub hour: Option<f64>,
    pub day: Option<f64>,
    pub month: Option<f64>,
    pub year: Option<f64>,
}

impl Limit {
    pub fn get(&self, period: &str) -> Option<f64> {
        match period {
            "second" => self.second,
            "minute" => self.minute,
            "hour" => self.hour,
            "day" => self.day,
            "month" => self.month,
            _ => self.year,
        }
    }
}

const LIMIT: &[Field] = &[
    Field::new("second", Type::Number),
    Field::new("minute", Type::Number),
    Field::new("hour", Type::Number),
    Field::new("day", Type::Number),
    Field::new("month", Type::Number),
    Field::new("year", Type::Number),
];

pub const FIELDS: &[Field] = &[
    Field::new("header_name", Type::String).default(Default::Str("x-kong-limit")),
    Field::new("limit_by", Type::OneOf(&["consumer", "credential", "ip"]))
        .default(Default::Str("consumer")),
    Field::new("policy", Type::OneOf(&["local", "cluster", "redis"]))
        .default(Default::Str("local")),
    Field::new("fault_tolerant", Type::Boolean).default(Default::Bool(true)),
    Field::new("redis", Type::Record(REDIS)),
    Field::new("block_on_first_violation", Type::Boolean).default(Default::Bool(false)),
    Field::new("hide_client_headers", Type::Boolean).default(Default::Bool(false)),
    Field::new("limits", Type::MapOfRecords(LIMIT)).required(),
];

const PERIODS: [&str; 6] = ["second", "minute", "hour", "day", "month", "year"];

/// Kong's checks: at least one limit, each with at least one period, longer periods not
/// allowing less than shorter ones; Redis needs its host.
pub fn entity_checks(config: &Value) -> Vec<(String, String)> {
    let mut errs = Vec::new();
    let limits = config["limits"].as_object();
    if limits.is_none_or(|l| l.is_empty()) {
        errs.push(("limits".into(), "length must be at least 1".into()));
    }
    for (name, l) in limits.into_iter().flatten() {
        let set: Vec<(&str, f64)> = PERIODS
            .iter()
            .filter_map(|p| l[*p].as_f64().map(|v| (*p, v)))
            .collect();
        if set.is_empty() {
            errs.push((
                format!("limits.{name}"),
                "at least one of these fields must be non-empty: 'second', 'minute', 'hour', 'day', 'month', 'year'".into(),
            ));
        }
        for w in set.windows(2) {
            let ((short, a), (long, b)) = (w[0], w[1]);
            if b < a {
                errs.push((
                    format!("limits.{name}"),
                    format!("the limit for {long} ({b}) cannot be lower than the limit for {short} ({a})"),
                ));
            }
        }
    }
    match config["policy"].as_str() {
        Some("redis") if config["redis"]["host"].is_null() => {
            errs.push(("redis.host".into(), "required field missing".into()))
        }
        _ => {}
    }
    errs
}
