//! proxy-cache's config (Kong `kong/plugins/proxy-cache/schema.lua`, 3.9): what is cacheable
//! (methods, statuses, content types), for how long (`cache_ttl`, or the response's own
//! Cache-Control with `cache_control`), where (`strategy = memory` in a shared dictionary) and
//! what the cache key varies on.

use serde::Deserialize;
use serde_json::Value;

use crate::schema::{Default, Field, Type};

#[derive(Deserialize)]
pub struct Config {
    pub response_code: Vec<u16>,
    pub request_method: Vec<String>,
    pub content_type: Vec<String>,
    pub cache_ttl: u64,
    pub cache_control: bool,
    pub ignore_uri_case: bool,
    pub storage_ttl: Option<u64>,
    pub memory: Memory,
    pub vary_query_params: Option<Vec<String>>,
    pub vary_headers: Option<Vec<String>>,
    pub response_headers: ResponseHeaders,
}

#[derive(Deserialize)]
pub struct Memory {
    pub dictionary_name: String,
}

#[derive(Deserialize)]
pub struct ResponseHeaders {
    pub age: bool,
    #[serde(rename = "X-Cache-Status")]
    pub x_cache_status: bool,
    #[serde(rename = "X-Cache-Key")]
    pub x_cache_key: bool,
}

const MEMORY: &[Field] = &[Field::new("dictionary_name", Type::String)
    .required()
    .default(Default::Str("kong_db_cache"))];

const RESPONSE_HEADERS: &[Field] = &[
    Field::new("age", Type::Boolean).default(Default::Bool(true)),
    Field::new("X-Cache-Status", Type::Boolean).default(Default::Bool(true)),
    Field::new("X-Cache-Key", Type::Boolean).default(Default::Bool(true)),
];

pub const FIELDS: &[Field] = &[
    Field::new("response_code", Type::IntegerArray { min: 100, max: 900 })
        .required()
        .default(Default::IntArray(&[200, 301, 404])),
    Field::new(
        "request_method",
        Type::OneOfArray(&["HEAD", "GET", "POST", "PATCH", "PUT"]),
    )
    .required()
    .default(Default::StrArray(&["GET", "HEAD"])),
    Field::new("content_type", Type::StringArray)
        .required()
        .default(Default::StrArray(&["text/plain", "application/json"])),
    Field::new(
        "cache_ttl",
        Type::Integer {
            min: 1,
            max: i64::MAX,
        },
    )
    .default(Default::Int(300)),
    Field::new("strategy", Type::OneOf(&["memory"])).required(),
    Field::new("cache_control", Type::Boolean)
        .required()
        .default(Default::Bool(false)),
    Field::new("ignore_uri_case", Type::Boolean).default(Default::Bool(false)),
    Field::new(
        "storage_ttl",
        Type::Integer {
            min: 0,
            max: i64::MAX,
        },
    ),
    Field::new("memory", Type::Record(MEMORY)),
    Field::new("vary_query_params", Type::StringArray),
    Field::new("vary_headers", Type::StringArray),
    Field::new("response_headers", Type::Record(RESPONSE_HEADERS)),
];

/// Kong's `len_min = 1` on `response_code`.
pub fn entity_checks(config: &Value) -> Vec<(String, String)> {
    let mut errs = Vec::new();
    if config["response_code"]
        .as_array()
        .is_some_and(|a| a.is_empty())
    {
        errs.push(("response_code".into(), "length must be at least 1".into()));
    }
    errs
}
