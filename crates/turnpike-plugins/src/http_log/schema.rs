//! http-log's config (Kong `kong/plugins/http-log/schema.lua` and the shared queue record of
//! `kong/tools/queue_schema.lua`). The deprecated `retry_count`, `queue_size` and
//! `flush_timeout` are accepted; `queue` is what counts. `custom_fields_by_lua` holds Lua,
//! run in the log phase (`crate::lua::LogFields`).

use serde::Deserialize;

use crate::schema::{Default, Field, Type};

/// The validated config, typed.
#[derive(Deserialize)]
pub struct Config {
    pub http_endpoint: String,
    pub method: String,
    pub content_type: String,
    pub timeout: f64,
    pub queue_size: Option<u64>,
    pub headers: Option<std::collections::BTreeMap<String, String>>,
    pub queue: Queue,
    /// Field path → Lua expression, in the order written.
    pub custom_fields_by_lua: Option<serde_json::Map<String, serde_json::Value>>,
}

#[derive(Deserialize)]
pub struct Queue {
    pub max_batch_size: u64,
    pub max_coalescing_delay: f64,
    pub max_entries: Option<u64>,
    pub max_retry_time: f64,
    pub initial_retry_delay: f64,
    pub max_retry_delay: f64,
}

pub const QUEUE: &[Field] = &[
    Field::new(
        "max_batch_size",
        Type::Integer {
            min: 1,
            max: 1_000_000,
        },
    )
    .default(Default::Int(1)),
    Field::new("max_coalescing_delay", Type::Number).default(Default::Int(1)),
    Field::new(
        "max_entries",
        Type::Integer {
            min: 1,
            max: 1_000_000,
        },
    )
    .default(Default::Int(10000)),
    Field::new(
        "max_bytes",
        Type::Integer {
            min: 1,
            max: i64::MAX,
        },
    ),
    Field::new("max_retry_time", Type::Number).default(Default::Int(60)),
    Field::new("initial_retry_delay", Type::Number).default(Default::Float(0.01)),
    Field::new("max_retry_delay", Type::Number).default(Default::Int(60)),
    // Kong allows 1 (one batch in flight) or -1 (no limit); 0 is refused in `entity_checks`.
    Field::new("concurrency_limit", Type::Integer { min: -1, max: 1 }).default(Default::Int(1)),
];

pub const FIELDS: &[Field] = &[
    Field::new("http_endpoint", Type::String)
        .required()
        .referenceable(),
    Field::new("method", Type::OneOf(&["POST", "PUT", "PATCH"])).default(Default::Str("POST")),
    Field::new(
        "content_type",
        Type::OneOf(&["application/json", "application/json; charset=utf-8"]),
    )
    .default(Default::Str("application/json")),
    Field::new("timeout", Type::Number).default(Default::Int(10000)),
    Field::new("keepalive", Type::Number).default(Default::Int(60000)),
    Field::new(
        "retry_count",
        Type::Integer {
            min: 0,
            max: 1_000_000,
        },
    ),
    Field::new(
        "queue_size",
        Type::Integer {
            min: 1,
            max: 1_000_000,
        },
    ),
    Field::new("flush_timeout", Type::Number),
    Field::new("headers", Type::Map).referenceable(),
    Field::new("queue", Type::Record(QUEUE)),
    Field::new("custom_fields_by_lua", Type::Map),
];
