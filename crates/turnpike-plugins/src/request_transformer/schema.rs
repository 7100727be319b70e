//! request-transformer's config (Kong `kong/plugins/request-transformer/schema.lua`, 3.9):
//! `http_method`, and five records of operations on headers, querystring and body; `replace`
//! also takes `uri`. Every array is empty by default.

use serde::Deserialize;
use serde_json::Value;

use crate::schema::{Default, Field, Type};

#[derive(Deserialize)]
pub struct Config {
    pub http_method: Option<String>,
    pub remove: Ops,
    pub rename: Ops,
    pub replace: Ops,
    pub add: Ops,
    pub append: Ops,
}

/// One record: entries (`name` or `name:value`) for headers, querystring and body.
#[derive(Deserialize, Default)]
#[serde(default)]
pub struct Ops {
    pub headers: Vec<String>,
    pub querystring: Vec<String>,
    pub body: Vec<String>,
    /// `replace` only: the upstream path (a template).
    pub uri: Option<String>,
}

const REMOVE: &[Field] = &[
    Field::new("body", Type::StringArray).default(Default::EmptyArray),
    Field::new("headers", Type::StringArray).default(Default::EmptyArray),
    Field::new("querystring", Type::StringArray).default(Default::EmptyArray),
];

const OPS: &[Field] = &[
    Field::new("body", Type::ColonStringArray).default(Default::EmptyArray),
    Field::new("headers", Type::ColonStringArray).default(Default::EmptyArray),
    Field::new("querystring", Type::ColonStringArray).default(Default::EmptyArray),
];

const REPLACE: &[Field] = &[
    Field::new("body", Type::ColonStringArray).default(Default::EmptyArray),
    Field::new("headers", Type::ColonStringArray).default(Default::EmptyArray),
    Field::new("querystring", Type::ColonStringArray).default(Default::EmptyArray),
    Field::new("uri", Type::String),
];

pub const FIELDS: &[Field] = &[
    Field::new("http_method", Type::String),
    Field::new("remove", Type::Record(REMOVE)),
    Field::new("rename", Type::Record(OPS)),
    Field::new("replace", Type::Record(REPLACE)),
    Field::new("add", Type::Record(OPS)),
    Field::new("append", Type::Record(OPS)),
];

/// Kong's `typedefs.http_method` (upper-case letters) and templates that this gateway can
/// evaluate (checked when the config is written, not at the first request).
pub fn entity_checks(config: &Value) -> Vec<(String, String)> {
    let mut errs = Vec::new();
    if let Some(m) = config["http_method"].as_str() {
        if m.is_empty() || !m.bytes().all(|b| b.is_ascii_uppercase()) {
            errs.push(("http_method".into(), format!("invalid value: {m}")));
        }
    }
    for op in ["rename", "replace", "add", "append"] {
        for part in ["headers", "querystring", "body"] {
            for (i, e) in config[op][part]
                .as_array()
                .into_iter()
                .flatten()
                .enumerate()
            {
                let value = e.as_str().and_then(|s| s.split_once(':')).map(|(_, v)| v);
                if let Some(Err(err)) = value.map(super::template::Template::parse) {
                    errs.push((format!("{op}.{part}.{}", i + 1), err));
                }
            }
        }
    }
    if let Some(Err(err)) = config["replace"]["uri"]
        .as_str()
        .map(super::template::Template::parse)
    {
        errs.push(("replace.uri".into(), err));
    }
    errs
}
