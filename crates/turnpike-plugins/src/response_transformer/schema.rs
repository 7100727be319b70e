//! response-transformer's config (Kong `kong/plugins/response-transformer/schema.lua`, 3.8+
//! with `rename.json`): five records of header and JSON-field operations, every array empty by
//! default.

use serde::Deserialize;

use crate::schema::{Default, Field, Type};

/// The validated config, typed: five records of operations.
#[derive(Deserialize)]
pub struct Config {
    pub remove: Ops,
    pub rename: Ops,
    pub replace: Ops,
    pub add: Ops,
    pub append: Ops,
}

/// One record: `name:value` (or bare name) entries for headers and JSON fields, and the
/// JSON values' types by position.
#[derive(Deserialize, Default)]
#[serde(default)]
pub struct Ops {
    pub headers: Vec<String>,
    pub json: Vec<String>,
    pub json_types: Vec<String>,
}

/// `json_types`: how the value of the `json` entry at the same position is written.
const JSON_TYPES: Type = Type::OneOfArray(&["boolean", "number", "string"]);

const REMOVE: &[Field] = &[
    Field::new("json", Type::StringArray).default(Default::EmptyArray),
    Field::new("headers", Type::StringArray).default(Default::EmptyArray),
];

const RENAME: &[Field] = &[
    Field::new("headers", Type::ColonStringArray).default(Default::EmptyArray),
    Field::new("json", Type::ColonStringArray).default(Default::EmptyArray),
];

/// replace, add and append share one shape.
const WITH_TYPES: &[Field] = &[
    Field::new("json", Type::ColonStringArray).default(Default::EmptyArray),
    Field::new("json_types", JSON_TYPES).default(Default::EmptyArray),
    Field::new("headers", Type::ColonStringArray).default(Default::EmptyArray),
];

pub const FIELDS: &[Field] = &[
    Field::new("remove", Type::Record(REMOVE)),
    Field::new("rename", Type::Record(RENAME)),
    Field::new("replace", Type::Record(WITH_TYPES)),
    Field::new("add", Type::Record(WITH_TYPES)),
    Field::new("append", Type::Record(WITH_TYPES)),
];
