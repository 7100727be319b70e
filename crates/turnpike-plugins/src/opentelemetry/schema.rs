//! opentelemetry's config (Kong 3.9 `kong/plugins/opentelemetry/schema.lua`): where traces go
//! (OTLP/HTTP), with which headers and resource attributes, through the shared queue record
//! (200 spans a batch by default); how trace context is read from and written to requests
//! (`propagation`, or the older `header_type`); the sampling rate.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use crate::http_log::schema::{Queue, QUEUE};
use crate::schema::{Default, Field, Type};

#[derive(Deserialize)]
pub struct Config {
    pub traces_endpoint: Option<String>,
    pub logs_endpoint: Option<String>,
    pub headers: Option<BTreeMap<String, String>>,
    pub resource_attributes: Option<BTreeMap<String, String>>,
    pub queue: Queue,
    pub batch_span_count: Option<u64>,
    pub batch_flush_delay: Option<u64>,
    pub connect_timeout: u64,
    pub send_timeout: u64,
    pub read_timeout: u64,
    pub http_response_header_for_traceid: Option<String>,
    pub header_type: String,
    pub sampling_rate: Option<f64>,
    pub propagation: Propagation,
}

#[derive(Deserialize)]
pub struct Propagation {
    pub extract: Option<Vec<String>>,
    pub clear: Option<Vec<String>>,
    pub inject: Option<Vec<String>>,
    pub default_format: String,
}

const EXTRACTORS: &[&str] = &["b3", "w3c", "jaeger", "ot", "datadog", "aws", "gcp"];
const INJECTORS: &[&str] = &[
    "preserve",
    "b3",
    "b3-single",
    "w3c",
    "jaeger",
    "ot",
    "datadog",
    "aws",
    "gcp",
];
const FORMATS: &[&str] = &[
    "b3",
    "b3-single",
    "w3c",
    "jaeger",
    "ot",
    "datadog",
    "aws",
    "gcp",
];

pub const PROPAGATION: &[Field] = &[
    Field::new("extract", Type::OneOfArray(EXTRACTORS)),
    Field::new("clear", Type::StringArray),
    Field::new("inject", Type::OneOfArray(INJECTORS)),
    Field::new("default_format", Type::OneOf(FORMATS))
        .required()
        .default(Default::Str("w3c")),
];

/// Kong's queue record with the plugin's own default of 200 spans a batch.
const OTEL_QUEUE: &[Field] = &[
    QUEUE[0].default(Default::Int(200)),
    QUEUE[1],
    QUEUE[2],
    QUEUE[3],
    QUEUE[4],
    QUEUE[5],
    QUEUE[6],
    QUEUE[7],
];

const TIMEOUT: Type = Type::Integer {
    min: 0,
    max: 2_147_483_646,
};

pub const FIELDS: &[Field] = &[
    Field::new("traces_endpoint", Type::String).referenceable(),
    Field::new("logs_endpoint", Type::String).referenceable(),
    Field::new("headers", Type::Map).referenceable(),
    Field::new("resource_attributes", Type::Map),
    Field::new("queue", Type::Record(OTEL_QUEUE)),
    Field::new(
        "batch_span_count",
        Type::Integer {
            min: i64::MIN,
            max: i64::MAX,
        },
    ),
    Field::new(
        "batch_flush_delay",
        Type::Integer {
            min: i64::MIN,
            max: i64::MAX,
        },
    ),
    Field::new("connect_timeout", TIMEOUT).default(Default::Int(1000)),
    Field::new("send_timeout", TIMEOUT).default(Default::Int(5000)),
    Field::new("read_timeout", TIMEOUT).default(Default::Int(5000)),
    Field::new("http_response_header_for_traceid", Type::String),
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
            "gcp",
            "datadog",
        ]),
    )
    .default(Default::Str("preserve")),
    Field::new("sampling_rate", Type::NumberIn { min: 0.0, max: 1.0 }),
    Field::new("propagation", Type::Record(PROPAGATION)),
];

fn url_error(v: &Value) -> Option<&'static str> {
    let u: http::Uri = v.as_str()?.parse().ok()?;
    (matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some())
        .then_some(())
        .map_or(
            Some("missing host in url or unsupported scheme (http, https)"),
            |_| None,
        )
}

/// Kong's `at_least_one_of`, the URLs, the resource attributes' values.
pub fn entity_checks(config: &Value) -> Vec<(String, String)> {
    let mut errs = Vec::new();
    let (traces, logs) = (&config["traces_endpoint"], &config["logs_endpoint"]);
    if traces.is_null() && logs.is_null() {
        errs.push((
            "@entity".into(),
            "at least one of these fields must be non-empty: 'traces_endpoint', 'logs_endpoint'"
                .into(),
        ));
    }
    for (name, v) in [("traces_endpoint", traces), ("logs_endpoint", logs)] {
        if !v.is_null() {
            if let Some(e) = url_error(v).or(v.as_str().is_none().then_some("expected a string")) {
                errs.push((name.into(), e.into()));
            }
        }
    }
    for (k, v) in config["resource_attributes"]
        .as_object()
        .into_iter()
        .flatten()
    {
        match v.as_str() {
            Some("") => errs.push((
                format!("resource_attributes.{k}"),
                "required field missing".into(),
            )),
            Some(_) => {}
            None => errs.push((
                format!("resource_attributes.{k}"),
                "expected a string".into(),
            )),
        }
    }
    for (k, v) in config["headers"].as_object().into_iter().flatten() {
        if http::HeaderName::from_bytes(k.as_bytes()).is_err() {
            errs.push(("headers".into(), format!("invalid header name '{k}'")));
        }
        if v.as_str().is_none() {
            errs.push((format!("headers.{k}"), "expected a string".into()));
        }
    }
    errs
}
