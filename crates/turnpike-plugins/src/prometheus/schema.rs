//! prometheus's config (Kong `kong/plugins/prometheus/schema.lua`): every metric family that
//! costs something per request is off until asked for, as in Kong 3.
//! `ai_metrics` and `wasm_metrics` are accepted for Kong's sake; Turnpike records neither.

use serde::Deserialize;

use crate::schema::{Default, Field, Type};

/// The validated config, typed (what this build records).
#[derive(Deserialize)]
pub struct Config {
    pub per_consumer: bool,
    pub status_code_metrics: bool,
    pub latency_metrics: bool,
    pub bandwidth_metrics: bool,
    pub upstream_health_metrics: bool,
}

pub const FIELDS: &[Field] = &[
    Field::new("per_consumer", Type::Boolean).default(Default::Bool(false)),
    Field::new("status_code_metrics", Type::Boolean).default(Default::Bool(false)),
    Field::new("ai_metrics", Type::Boolean).default(Default::Bool(false)),
    Field::new("latency_metrics", Type::Boolean).default(Default::Bool(false)),
    Field::new("bandwidth_metrics", Type::Boolean).default(Default::Bool(false)),
    Field::new("upstream_health_metrics", Type::Boolean).default(Default::Bool(false)),
    Field::new("wasm_metrics", Type::Boolean).default(Default::Bool(false)),
];
