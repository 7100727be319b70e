//! zipkin's config (Kong 3.9 `kong/plugins/zipkin/schema.lua`): where spans go (Zipkin's v2
//! JSON over HTTP), how often a request without a trace is sampled, the trace id's length, the
//! span's names and tags, how phases are shown (annotations or duration tags), the shared queue
//! record, and trace context propagation (`propagation`, defaulting to b3, or the older
//! `header_type` and `default_header_type`).

use serde::Deserialize;
use serde_json::Value;

use crate::http_log::schema::{Queue, QUEUE};
use crate::opentelemetry::schema::{Propagation, PROPAGATION};
use crate::schema::{Default, Field, Type};

#[derive(Deserialize)]
pub struct Config {
    pub local_service_name: String,
    pub http_endpoint: Option<String>,
    pub sample_ratio: f64,
    pub default_service_name: Option<String>,
    pub include_credential: bool,
    pub traceid_byte_count: u64,
    pub header_type: String,
    pub default_header_type: String,
    pub tags_header: String,
    pub static_tags: Option<Vec<StaticTag>>,
    pub http_span_name: String,
    pub connect_timeout: u64,
    pub send_timeout: u64,
    pub read_timeout: u64,
    pub http_response_header_for_traceid: Option<String>,
    pub phase_duration_flavor: String,
    pub queue: Queue,
    pub propagation: Propagation,
}

#[derive(Deserialize)]
pub struct StaticTag {
    pub name: String,
    pub value: String,
}

/// Tags the plugin writes itself: a static tag may not use these names.
const PROTECTED_TAGS: &[&str] = &[
    "error",
    "http.method",
    "http.path",
    "http.status_code",
    "kong.balancer.state",
    "kong.balancer.try",
    "kong.consumer",
    "kong.credential",
    "kong.node.id",
    "kong.route",
    "kong.service",
    "lc",
    "peer.hostname",
];

const STATIC_TAG: &[Field] = &[
    Field::new("name", Type::String).required(),
    Field::new("value", Type::String).required(),
];

/// The propagation record with zipkin's default format, b3.
const ZIPKIN_PROPAGATION: &[Field] = &[
    PROPAGATION[0],
    PROPAGATION[1],
    PROPAGATION[2],
    PROPAGATION[3].default(Default::Str("b3")),
];

const TIMEOUT: Type = Type::Integer {
    min: 0,
    max: 2_147_483_646,
};

pub const FIELDS: &[Field] = &[
    Field::new("local_service_name", Type::String)
        .required()
        .default(Default::Str("kong")),
    Field::new("http_endpoint", Type::String),
    Field::new("sample_ratio", Type::NumberIn { min: 0.0, max: 1.0 })
        .default(Default::Float(0.001)),
    Field::new("default_service_name", Type::String),
    Field::new("include_credential", Type::Boolean)
        .required()
        .default(Default::Bool(true)),
    Field::new("traceid_byte_count", Type::Integer { min: 8, max: 16 })
        .required()
        .default(Default::Int(16)),
    Field::new(
        "header_type",
        Type::OneOf(&[
            "preserve",
            "ignore",
            "b3",
            "b3-single",
            "w3c",
            "jaeger",
            "ot",
            "aws",
            "datadog",
            "gcp",
        ]),
    )
    .required()
    .default(Default::Str("preserve")),
    Field::new(
        "default_header_type",
        Type::OneOf(&[
            "b3",
            "b3-single",
            "w3c",
            "jaeger",
            "ot",
            "aws",
            "datadog",
            "gcp",
        ]),
    )
    .required()
    .default(Default::Str("b3")),
    Field::new("tags_header", Type::String)
        .required()
        .default(Default::Str("Zipkin-Tags")),
    Field::new("static_tags", Type::RecordArray(STATIC_TAG)),
    Field::new("http_span_name", Type::OneOf(&["method", "method_path"]))
        .required()
        .default(Default::Str("method")),
    Field::new("connect_timeout", TIMEOUT).default(Default::Int(2000)),
    Field::new("send_timeout", TIMEOUT).default(Default::Int(5000)),
    Field::new("read_timeout", TIMEOUT).default(Default::Int(5000)),
    Field::new("http_response_header_for_traceid", Type::String),
    Field::new(
        "phase_duration_flavor",
        Type::OneOf(&["annotations", "tags"]),
    )
    .required()
    .default(Default::Str("annotations")),
    Field::new("queue", Type::Record(QUEUE)),
    Field::new("propagation", Type::Record(ZIPKIN_PROPAGATION)),
];

/// Kong's checks: the endpoint is a URL; `traceid_byte_count` is 8 or 16; static tags use
/// names of their own, once each.
pub fn entity_checks(config: &Value) -> Vec<(String, String)> {
    let mut errs = Vec::new();
    if let Some(e) = config["http_endpoint"].as_str() {
        let ok = e
            .parse::<http::Uri>()
            .is_ok_and(|u| matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some());
        if !ok {
            errs.push((
                "http_endpoint".into(),
                "missing host in url or unsupported scheme (http, https)".into(),
            ));
        }
    }
    if !matches!(config["traceid_byte_count"].as_i64(), Some(8 | 16)) {
        errs.push(("traceid_byte_count".into(), "expected one of: 8, 16".into()));
    }
    let mut seen = std::collections::HashSet::new();
    for (i, t) in config["static_tags"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let name = t["name"].as_str().unwrap_or_default();
        if PROTECTED_TAGS.contains(&name) {
            errs.push((
                format!("static_tags.{}.name", i + 1),
                format!("must not be one of: {}", PROTECTED_TAGS.join(", ")),
            ));
        }
        if !seen.insert(name) {
            errs.push((
                "static_tags".into(),
                format!("repeated tags are not allowed: {name}"),
            ));
        }
    }
    errs
}
