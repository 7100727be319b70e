//! statsd's config (Kong `kong/plugins/statsd/schema.lua`, 3.x, with the metrics statsd-advanced
//! brought): where to send, the metrics (each a name, a StatsD type, a sample rate and whose
//! identifier names the consumer, service or workspace), status-code filter, batching.

use serde::Deserialize;
use serde_json::Value;

use crate::schema::{Default, Field, Type};

pub const METRIC_NAMES: &[&str] = &[
    "kong_latency",
    "latency",
    "request_count",
    "request_per_user",
    "request_size",
    "response_size",
    "status_count",
    "status_count_per_user",
    "unique_users",
    "upstream_latency",
    "status_count_per_workspace",
    "status_count_per_user_per_route",
    "shdict_usage",
];
const STAT_TYPES: &[&str] = &["counter", "gauge", "histogram", "meter", "set", "timer"];
const CONSUMER_IDENTIFIERS: &[&str] = &["consumer_id", "custom_id", "username"];
const SERVICE_IDENTIFIERS: &[&str] = &[
    "service_id",
    "service_name",
    "service_host",
    "service_name_or_host",
];
const WORKSPACE_IDENTIFIERS: &[&str] = &["workspace_id", "workspace_name"];

#[derive(Deserialize)]
pub struct Config {
    pub host: String,
    pub port: u16,
    pub prefix: String,
    pub metrics: Vec<Metric>,
    pub allow_status_codes: Option<Vec<String>>,
    pub udp_packet_size: f64,
    pub use_tcp: bool,
    pub hostname_in_prefix: bool,
    pub consumer_identifier_default: String,
    pub service_identifier_default: String,
    pub workspace_identifier_default: String,
    pub tag_style: Option<String>,
}

#[derive(Deserialize)]
pub struct Metric {
    pub name: String,
    pub stat_type: String,
    pub sample_rate: Option<f64>,
    pub consumer_identifier: Option<String>,
    pub service_identifier: Option<String>,
    pub workspace_identifier: Option<String>,
}

const METRIC: &[Field] = &[
    Field::new("name", Type::OneOf(METRIC_NAMES)).required(),
    Field::new("stat_type", Type::OneOf(STAT_TYPES)).required(),
    Field::new("sample_rate", Type::Number),
    Field::new("consumer_identifier", Type::OneOf(CONSUMER_IDENTIFIERS)),
    Field::new("service_identifier", Type::OneOf(SERVICE_IDENTIFIERS)),
    Field::new("workspace_identifier", Type::OneOf(WORKSPACE_IDENTIFIERS)),
];

/// Kong's `DEFAULT_METRICS`.
const DEFAULT_METRICS: &str = r#"[
  {"name": "request_count", "stat_type": "counter", "sample_rate": 1},
  {"name": "latency", "stat_type": "timer"},
  {"name": "request_size", "stat_type": "counter", "sample_rate": 1},
  {"name": "status_count", "stat_type": "counter", "sample_rate": 1},
  {"name": "response_size", "stat_type": "counter", "sample_rate": 1},
  {"name": "unique_users", "stat_type": "set"},
  {"name": "request_per_user", "stat_type": "counter", "sample_rate": 1},
  {"name": "upstream_latency", "stat_type": "timer"},
  {"name": "kong_latency", "stat_type": "timer"},
  {"name": "status_count_per_user", "stat_type": "counter", "sample_rate": 1},
  {"name": "status_count_per_workspace", "stat_type": "counter", "sample_rate": 1},
  {"name": "status_count_per_user_per_route", "stat_type": "counter", "sample_rate": 1},
  {"name": "shdict_usage", "stat_type": "gauge", "sample_rate": 1}
]"#;

pub const FIELDS: &[Field] = &[
    Field::new("host", Type::String).default(Default::Str("localhost")),
    Field::new("port", Type::Integer { min: 0, max: 65535 }).default(Default::Int(8125)),
    Field::new("prefix", Type::String).default(Default::Str("kong")),
    Field::new("metrics", Type::RecordArray(METRIC)).default(Default::Json(DEFAULT_METRICS)),
    Field::new("allow_status_codes", Type::StringArray),
    Field::new(
        "udp_packet_size",
        Type::NumberIn {
            min: 0.0,
            max: 65507.0,
        },
    )
    .default(Default::Int(0)),
    Field::new("use_tcp", Type::Boolean).default(Default::Bool(false)),
    Field::new("hostname_in_prefix", Type::Boolean).default(Default::Bool(false)),
    Field::new(
        "consumer_identifier_default",
        Type::OneOf(CONSUMER_IDENTIFIERS),
    )
    .default(Default::Str("custom_id")),
    Field::new(
        "service_identifier_default",
        Type::OneOf(SERVICE_IDENTIFIERS),
    )
    .default(Default::Str("service_name_or_host")),
    Field::new(
        "workspace_identifier_default",
        Type::OneOf(WORKSPACE_IDENTIFIERS),
    )
    .default(Default::Str("workspace_id")),
    // Deprecated in Kong 3 (the queue replaced them): accepted, without effect.
    Field::new(
        "retry_count",
        Type::Integer {
            min: 0,
            max: i64::MAX,
        },
    ),
    Field::new(
        "queue_size",
        Type::Integer {
            min: 0,
            max: i64::MAX,
        },
    ),
    Field::new("flush_timeout", Type::Number),
    Field::new(
        "tag_style",
        Type::OneOf(&["dogstatsd", "influxdb", "librato", "signalfx"]),
    ),
];

/// Kong's checks: counters and gauges need a `sample_rate`; status ranges are `from-to`.
pub fn entity_checks(config: &Value) -> Vec<(String, String)> {
    let mut errs = Vec::new();
    for (i, m) in config["metrics"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let counted = matches!(m["stat_type"].as_str(), Some("counter" | "gauge"));
        if counted && m["sample_rate"].is_null() {
            errs.push((
                format!("metrics.{}.sample_rate", i + 1),
                "required field missing".into(),
            ));
        }
        if m["sample_rate"].as_f64().is_some_and(|r| r <= 0.0) {
            errs.push((
                format!("metrics.{}.sample_rate", i + 1),
                "value must be greater than 0".into(),
            ));
        }
    }
    for (i, r) in config["allow_status_codes"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let s = r.as_str().unwrap_or_default();
        let ok = s
            .split_once('-')
            .is_some_and(|(a, b)| a.parse::<u16>().is_ok() && b.parse::<u16>().is_ok());
        if !ok {
            errs.push((
                format!("allow_status_codes.{}", i + 1),
                format!("invalid value: {s}"),
            ));
        }
    }
    errs
}
