//! Record schemas: a plugin's `config`, or an entity's nested record (an upstream's
//! `healthchecks`), declared once with Kong's types, defaults and bounds; from that one
//! declaration come the validation (every violation with its field path and Kong's message),
//! the defaults filled into the stored value, and the schema JSON that `GET /schemas/...`
//! returns (decK and go-kong read defaults from it).

use serde_json::{json, Map, Value};

/// A config field's type and bounds.
#[derive(Debug, Clone, Copy)]
pub enum Type {
    String,
    /// Integer within [min, max].
    Integer {
        min: i64,
        max: i64,
    },
    Number,
    /// A number within [min, max].
    NumberIn {
        min: f64,
        max: f64,
    },
    Boolean,
    /// One of these strings.
    OneOf(&'static [&'static str]),
    /// An array of strings.
    StringArray,
    /// An array of `name:value` strings (Kong's `match = "^[^:]+:.*$"`, the transformer
    /// plugins' headers and JSON fields).
    ColonStringArray,
    /// An array of strings, each one of these (e.g. response-transformer's `json_types`).
    OneOfArray(&'static [&'static str]),
    /// A map of string keys to string values (Kong's `map` type, e.g. http-log's `headers`).
    Map,
    /// An array of integers, each within [min, max] (health checks' `http_statuses`).
    IntegerArray {
        min: i64,
        max: i64,
    },
    /// A map of string keys to arrays of strings (health checks' `headers`).
    MapOfStringArrays,
    /// A nested record with its own fields (e.g. rate-limiting's `redis`); defaults apply inside
    /// it, and an absent record is filled with its defaults.
    Record(&'static [Field]),
    /// An array of records (statsd's `metrics`), each validated as a record.
    RecordArray(&'static [Field]),
    /// A map of names to records (response-ratelimiting's `limits`), each value validated as
    /// a record.
    MapOfRecords(&'static [Field]),
}

#[derive(Debug, Clone, Copy)]
pub struct Field {
    pub name: &'static str,
    pub ty: Type,
    pub required: bool,
    pub default: Option<Default>,
    /// Kong's `auto` (a string field): drawn by [`validate`] when a write leaves the field out,
    /// 32 random hex digits; shown in the schema, so decK sends it as an explicit null, which
    /// a required field refuses, as Kong does.
    pub auto: bool,
    /// Kong's `referenceable`: the value may be a `{vault://...}` reference, resolved when the
    /// data plane is built (a map's values, for a map). A reference anywhere else is a plain
    /// string, as in Kong.
    pub referenceable: bool,
}

/// A deprecated flat field Kong still accepts and moves into its place (Kong's
/// `shorthand_fields`, e.g. rate-limiting's `redis_host` -> `redis.host`).
#[derive(Debug, Clone, Copy)]
pub struct Shorthand {
    pub name: &'static str,
    pub ty: Type,
    /// Where the value goes (Kong's `translate_backwards`).
    pub into: &'static [&'static str],
}

/// A default value (const-constructible, unlike `serde_json::Value`).
#[derive(Debug, Clone, Copy)]
pub enum Default {
    Str(&'static str),
    Int(i64),
    Float(f64),
    Bool(bool),
    EmptyArray,
    StrArray(&'static [&'static str]),
    IntArray(&'static [i64]),
    /// Any value, as JSON text (an array of records: statsd's default `metrics`).
    Json(&'static str),
}

impl Default {
    fn to_value(self) -> Value {
        match self {
            Default::Str(s) => Value::String(s.into()),
            Default::Int(i) => Value::from(i),
            Default::Float(f) => crate::number::value(f),
            Default::Bool(b) => Value::Bool(b),
            Default::EmptyArray => Value::Array(Vec::new()),
            Default::StrArray(a) => Value::from(a.to_vec()),
            Default::IntArray(a) => Value::from(a.to_vec()),
            Default::Json(text) => serde_json::from_str(text).unwrap_or(Value::Null),
        }
    }
}

impl Field {
    pub const fn new(name: &'static str, ty: Type) -> Field {
        Field {
            name,
            ty,
            required: false,
            default: None,
            auto: false,
            referenceable: false,
        }
    }
    pub const fn default(mut self, d: Default) -> Field {
        self.default = Some(d);
        self
    }
    pub const fn required(mut self) -> Field {
        self.required = true;
        self
    }
    pub const fn auto(mut self) -> Field {
        self.auto = true;
        self
    }
    pub const fn referenceable(mut self) -> Field {
        self.referenceable = true;
        self
    }
}

/// Whether `s` is written as a vault reference (`{vault://...}`, see `declarative::vault`).
pub fn is_reference(s: &str) -> bool {
    s.starts_with("{vault://") && s.ends_with('}')
}

/// Whether a value holds a reference anywhere (most configs do not: no copy is made).
pub fn has_reference(value: &Value) -> bool {
    match value {
        Value::String(s) => is_reference(s),
        Value::Array(items) => items.iter().any(has_reference),
        Value::Object(m) => m.values().any(has_reference),
        _ => false,
    }
}

/// Visits every referenceable string of `value` (a record of `fields`) that holds a vault
/// reference, with its path as Kong names it (`redis.password`, `headers.Authorization`).
pub fn visit_references(
    fields: &[Field],
    value: &mut Value,
    visit: &mut dyn FnMut(&str, &mut String),
) {
    visit_record(fields, value, "", visit)
}

fn visit_record(
    fields: &[Field],
    value: &mut Value,
    prefix: &str,
    visit: &mut dyn FnMut(&str, &mut String),
) {
    let Value::Object(m) = value else { return };
    let is_ref = is_reference;
    for f in fields {
        let Some(v) = m.get_mut(f.name) else { continue };
        let at = format!("{prefix}{}", f.name);
        match (f.ty, v) {
            (Type::Record(inner), v) => visit_record(inner, v, &format!("{at}."), visit),
            (Type::RecordArray(inner), Value::Array(items)) => {
                for (i, item) in items.iter_mut().enumerate() {
                    visit_record(inner, item, &format!("{at}.{}.", i + 1), visit);
                }
            }
            (Type::MapOfRecords(inner), Value::Object(items)) => {
                for (k, item) in items.iter_mut() {
                    visit_record(inner, item, &format!("{at}.{k}."), visit);
                }
            }
            (Type::Map, Value::Object(items)) if f.referenceable => {
                for (k, item) in items.iter_mut() {
                    if let Value::String(s) = item {
                        if is_ref(s) {
                            visit(&format!("{at}.{k}"), s);
                        }
                    }
                }
            }
            (_, Value::String(s)) if f.referenceable && is_ref(s) => visit(&at, s),
            _ => {}
        }
    }
}

/// Resolves, in place, every reference `value` holds where `fields` allow one; a reference in
/// any other field stays the string it is. The first that does not resolve is the error.
pub fn resolve_references(
    fields: &[Field],
    value: &mut Value,
    resolve: &dyn Fn(&str) -> Result<String, String>,
) -> Result<(), String> {
    let mut failed = None;
    visit_references(fields, value, &mut |_, s| {
        if failed.is_none() {
            match resolve(s) {
                Ok(secret) => *s = secret,
                Err(e) => failed = Some(e),
            }
        }
    });
    failed.map_or(Ok(()), Err)
}

/// The paths of the referenceable fields of `value` that hold a reference (Kong runs no
/// validator on those: their values are only known once resolved).
pub fn reference_paths(fields: &[Field], value: &Value) -> Vec<String> {
    let mut paths = Vec::new();
    if has_reference(value) {
        let mut copy = value.clone();
        visit_references(fields, &mut copy, &mut |at, _| paths.push(at.to_string()));
    }
    paths
}

/// Checks `config` (absent: `{}`) against `fields`: returns the config with defaults filled in
/// and nulls for unset optional fields (as Kong stores it), or every violation.
pub fn validate(fields: &[Field], config: &Value) -> Result<Value, Vec<(String, String)>> {
    let empty = Map::new();
    let input = match config {
        Value::Object(m) => m,
        Value::Null => &empty,
        _ => return Err(vec![(String::new(), "expected a record".into())]),
    };
    validate_record(fields, input, "")
}

/// Validates one record; `prefix` is the path of a nested record (`"redis."`).
fn validate_record(
    fields: &[Field],
    input: &Map<String, Value>,
    prefix: &str,
) -> Result<Value, Vec<(String, String)>> {
    let mut errs = Vec::new();
    let mut out = Map::new();
    for k in input.keys() {
        if !fields.iter().any(|f| f.name == k) {
            errs.push((format!("{prefix}{k}"), "unknown field".into()));
        }
    }
    for f in fields {
        if let Type::Record(inner) = f.ty {
            let empty = Map::new();
            let sub = match input.get(f.name) {
                None | Some(Value::Null) => &empty,
                Some(Value::Object(m)) => m,
                Some(_) => {
                    errs.push((format!("{prefix}{}", f.name), "expected a record".into()));
                    continue;
                }
            };
            match validate_record(inner, sub, &format!("{prefix}{}.", f.name)) {
                Ok(v) => {
                    out.insert(f.name.into(), v);
                }
                Err(e) => errs.extend(e),
            }
            continue;
        }
        let v = match input.get(f.name) {
            // Kong's `auto`: a value drawn when the write leaves the field out (an explicit
            // null is not "left out": a required field then reports it missing).
            None if f.auto => Value::from(uuid::Uuid::new_v4().simple().to_string()),
            None | Some(Value::Null) => match f.default {
                Some(d) => d.to_value(),
                None if f.required => {
                    errs.push((
                        format!("{prefix}{}", f.name),
                        "required field missing".into(),
                    ));
                    continue;
                }
                None => Value::Null,
            },
            Some(v) => as_typed(f.ty, v),
        };
        if let (Type::MapOfRecords(inner), Some(items)) = (f.ty, v.as_object()) {
            let mut checked = Map::new();
            let mut bad = false;
            for (name, item) in items {
                let at = format!("{prefix}{}.{name}.", f.name);
                match item.as_object() {
                    Some(m) => match validate_record(inner, m, &at) {
                        Ok(v) => {
                            checked.insert(name.clone(), without_nulls(v));
                        }
                        Err(e) => {
                            errs.extend(e);
                            bad = true;
                        }
                    },
                    None => {
                        errs.push((
                            at.trim_end_matches('.').to_string(),
                            "expected a record".into(),
                        ));
                        bad = true;
                    }
                }
            }
            if !bad {
                out.insert(f.name.into(), Value::Object(checked));
            }
            continue;
        }
        if let (Type::RecordArray(inner), Some(items)) = (f.ty, v.as_array()) {
            let mut checked = Vec::with_capacity(items.len());
            let mut bad = false;
            for (i, item) in items.iter().enumerate() {
                let at = format!("{prefix}{}.{}.", f.name, i + 1);
                match item.as_object() {
                    Some(m) => match validate_record(inner, m, &at) {
                        Ok(v) => checked.push(v),
                        Err(e) => {
                            errs.extend(e);
                            bad = true;
                        }
                    },
                    None => {
                        errs.push((
                            at.trim_end_matches('.').to_string(),
                            "expected a record".into(),
                        ));
                        bad = true;
                    }
                }
            }
            if !bad {
                out.insert(f.name.into(), Value::Array(checked));
            }
            continue;
        }
        if !v.is_null() {
            if let Err(m) = check_type(f.ty, &v) {
                errs.push((format!("{prefix}{}", f.name), m));
                continue;
            }
            let bad = element_errors(f.ty, &v);
            if !bad.is_empty() {
                for (at, m) in bad {
                    errs.push((format!("{prefix}{}.{at}", f.name), m));
                }
                continue;
            }
        }
        out.insert(f.name.into(), v);
    }
    if errs.is_empty() {
        Ok(Value::Object(out))
    } else {
        Err(errs)
    }
}

/// An input value as the field's type stores it: a number as Kong writes it back (`1`, not
/// `1.0`; an integer field's `5.0` is the integer 5, as Lua reads it).
fn as_typed(ty: Type, v: &Value) -> Value {
    match (ty, v.as_f64()) {
        (Type::Number | Type::NumberIn { .. }, Some(f)) if v.is_f64() => crate::number::value(f),
        (Type::Integer { .. }, Some(_)) if v.is_f64() => {
            integral(v).map_or_else(|| v.clone(), Value::from)
        }
        _ => v.clone(),
    }
}

/// A floating-point JSON number with an integral value, as an integer.
fn integral(v: &Value) -> Option<i64> {
    v.as_f64()
        .filter(|f| f.fract() == 0.0 && f.abs() < 9_007_199_254_740_992.0)
        .map(|f| f as i64)
}

/// A record inside a map, as Kong returns it: its unset fields left out rather than null
/// (decK compares a file's values, which have none, with what it reads back).
fn without_nulls(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(m.into_iter().filter(|(_, x)| !x.is_null()).collect()),
        other => other,
    }
}

/// The elements of an array of strings that break the type's rule, by Kong's 1-based position
/// (Kong reports `fields.config.add.headers["2"]`).
fn element_errors(ty: Type, v: &Value) -> Vec<(usize, String)> {
    let broken = |s: &str| match ty {
        // Kong's `match = "^[^:]+:.*$"`: a name before the first colon.
        Type::ColonStringArray => s
            .find(':')
            .is_none_or(|at| at == 0)
            .then(|| format!("invalid value: {s}")),
        Type::OneOfArray(choices) => {
            (!choices.contains(&s)).then(|| format!("expected one of: {}", choices.join(", ")))
        }
        _ => None,
    };
    if let Type::IntegerArray { min, max } = ty {
        return v
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
            .filter_map(|(i, x)| {
                let n = x.as_i64().unwrap_or(min);
                (n < min || n > max)
                    .then(|| (i + 1, format!("value should be between {min} and {max}")))
            })
            .collect();
    }
    v.as_array()
        .into_iter()
        .flatten()
        .enumerate()
        .filter_map(|(i, x)| broken(x.as_str().unwrap_or("")).map(|m| (i + 1, m)))
        .collect()
}

fn check_type(ty: Type, v: &Value) -> Result<(), String> {
    match ty {
        Type::String => match v.as_str() {
            Some("") => Err("length must be at least 1".into()),
            Some(_) => Ok(()),
            None => Err("expected a string".into()),
        },
        Type::Integer { min, max } => match v.as_i64().or_else(|| integral(v)) {
            Some(i) if i < min || i > max => {
                Err(format!("value should be between {min} and {max}"))
            }
            Some(_) => Ok(()),
            None => Err("expected an integer".into()),
        },
        Type::Number => v
            .as_f64()
            .map(|_| ())
            .ok_or_else(|| "expected a number".into()),
        Type::NumberIn { min, max } => match v.as_f64() {
            Some(n) if n < min || n > max => {
                Err(format!("value should be between {min} and {max}"))
            }
            Some(_) => Ok(()),
            None => Err("expected a number".into()),
        },
        Type::IntegerArray { .. } => match v.as_array() {
            Some(a) if a.iter().all(|x| x.is_i64()) => Ok(()),
            Some(_) => Err("expected an array of integers".into()),
            None => Err("expected an array".into()),
        },
        Type::MapOfStringArrays => match v.as_object() {
            Some(m)
                if m.values().all(|x| {
                    x.as_array()
                        .is_some_and(|a| a.iter().all(|s| s.is_string()))
                }) =>
            {
                Ok(())
            }
            Some(_) => Err("expected a map of arrays of strings".into()),
            None => Err("expected a map".into()),
        },
        Type::Boolean => v
            .as_bool()
            .map(|_| ())
            .ok_or_else(|| "expected a boolean".into()),
        Type::OneOf(choices) => match v.as_str() {
            Some(s) if choices.contains(&s) => Ok(()),
            _ => Err(format!("expected one of: {}", choices.join(", "))),
        },
        Type::StringArray => match v.as_array() {
            Some(a) if a.iter().all(|x| x.is_string()) => Ok(()),
            Some(_) => Err("expected an array of strings".into()),
            None => Err("expected an array".into()),
        },
        // Their elements are checked one by one in `element_errors`.
        Type::ColonStringArray | Type::OneOfArray(_) => check_type(Type::StringArray, v),
        Type::Map => match v.as_object() {
            Some(m) if m.values().all(|x| x.is_string()) => Ok(()),
            Some(_) => Err("expected a map of strings".into()),
            None => Err("expected a map".into()),
        },
        // Records are validated field by field in `validate_record`.
        Type::Record(_) => Ok(()),
        Type::RecordArray(_) => match v.as_array() {
            Some(_) => Ok(()),
            None => Err("expected an array".into()),
        },
        Type::MapOfRecords(_) => match v.as_object() {
            Some(_) => Ok(()),
            None => Err("expected a map".into()),
        },
    }
}

/// Kong's schema JSON for a plugin: the common plugin fields and `config` as a record (with
/// its `shorthand_fields` when it has any).
/// The protocols a route or a plugin may list (Kong's `constants.PROTOCOLS`, with ws and wss).
pub const PROTOCOLS: &[&str] = &[
    "grpc",
    "grpcs",
    "http",
    "https",
    "tcp",
    "tls",
    "tls_passthrough",
    "udp",
    "ws",
    "wss",
];

/// The protocols of Kong's `typedefs.protocols_http`: what an HTTP-only plugin may list.
pub const HTTP_PROTOCOLS: &[&str] = &["grpc", "grpcs", "http", "https"];

pub fn kong_json(fields: &[Field], shorthands: &[Shorthand], http_only: bool) -> Value {
    let mut config =
        json!({"type": "record", "required": true, "fields": record_fields_json(fields)});
    if !shorthands.is_empty() {
        config["shorthand_fields"] = shorthands
            .iter()
            .map(|s| {
                let mut d = type_json(s.ty);
                d.insert("translate_backwards".into(), json!(s.into));
                d.insert(
                    "deprecation".into(),
                    json!({"message": format!("{} is deprecated, please use config.{} instead", s.name, s.into.join(".")), "removal_in_version": "4.0"}),
                );
                json!({ s.name: Value::Object(d) })
            })
            .collect();
    }
    // Kong's `typedefs.protocols_http` for an HTTP-only plugin, else `typedefs.protocols`.
    let protocols = if http_only {
        json!({"type": "set", "required": true, "default": ["grpc", "grpcs", "http", "https"],
               "elements": {"type": "string", "one_of": HTTP_PROTOCOLS},
               "description": "A set of strings representing HTTP protocols."})
    } else {
        json!({"type": "set", "required": true, "default": ["grpc", "grpcs", "http", "https"],
               "elements": {"type": "string", "one_of": PROTOCOLS,
                            "description": "A string representing a protocol, such as HTTP or HTTPS."},
               "description": "A set of strings representing protocols."})
    };
    json!({
        "fields": [
            {"id": {"type": "string", "uuid": true, "auto": true}},
            {"name": {"type": "string", "required": true}},
            {"instance_name": {"type": "string"}},
            {"created_at": {"type": "integer", "timestamp": true, "auto": true}},
            {"updated_at": {"type": "integer", "timestamp": true, "auto": true}},
            {"protocols": protocols},
            {"consumer": {"type": "foreign", "reference": "consumers", "eq": null, "on_delete": "cascade"}},
            {"service": {"type": "foreign", "reference": "services", "on_delete": "cascade"}},
            {"route": {"type": "foreign", "reference": "routes", "on_delete": "cascade"}},
            {"enabled": {"type": "boolean", "required": true, "default": true}},
            {"tags": {"type": "set", "elements": {"type": "string"}}},
            {"config": config},
        ]
    })
}

/// A record's schema JSON (`{"type": "record", "required": true, "fields": [...]}`), for an
/// entity's nested record such as an upstream's `healthchecks`.
pub fn record_json(fields: &'static [Field]) -> Value {
    Value::Object(type_json(Type::Record(fields)))
}

/// A field type's part of Kong's schema JSON (`type` and what qualifies it).
fn type_json(ty: Type) -> Map<String, Value> {
    let mut d = Map::new();
    let (name, extra): (&str, Vec<(&str, Value)>) = match ty {
        Type::String => ("string", vec![]),
        Type::Integer { min, max } => ("integer", vec![("between", json!([min, max]))]),
        Type::Number => ("number", vec![]),
        Type::NumberIn { min, max } => (
            "number",
            vec![(
                "between",
                json!([crate::number::value(min), crate::number::value(max)]),
            )],
        ),
        Type::IntegerArray { min, max } => (
            "array",
            vec![(
                "elements",
                json!({"type": "integer", "between": [min, max]}),
            )],
        ),
        Type::MapOfStringArrays => (
            "map",
            vec![
                ("keys", json!({"type": "string"})),
                (
                    "values",
                    json!({"type": "array", "elements": {"type": "string"}}),
                ),
            ],
        ),
        Type::Boolean => ("boolean", vec![]),
        Type::OneOf(c) => ("string", vec![("one_of", json!(c))]),
        Type::StringArray => ("array", vec![("elements", json!({"type": "string"}))]),
        Type::ColonStringArray => (
            "array",
            vec![("elements", json!({"type": "string", "match": "^[^:]+:.*$"}))],
        ),
        Type::OneOfArray(c) => (
            "array",
            vec![("elements", json!({"type": "string", "one_of": c}))],
        ),
        Type::Map => (
            "map",
            vec![
                ("keys", json!({"type": "string"})),
                ("values", json!({"type": "string"})),
            ],
        ),
        // Kong makes every record required unless it says otherwise (`make_records_required`):
        // decK then fills an absent record with its defaults rather than expecting null.
        Type::Record(inner) => (
            "record",
            vec![
                ("required", json!(true)),
                ("fields", json!(record_fields_json(inner))),
            ],
        ),
        Type::MapOfRecords(inner) => (
            "map",
            vec![
                ("keys", json!({"type": "string"})),
                (
                    "values",
                    json!({"type": "record", "required": true, "fields": record_fields_json(inner)}),
                ),
            ],
        ),
        Type::RecordArray(inner) => (
            "array",
            vec![(
                "elements",
                json!({"type": "record", "fields": record_fields_json(inner)}),
            )],
        ),
    };
    d.insert("type".into(), json!(name));
    for (k, v) in extra {
        d.insert(k.into(), v);
    }
    d
}

/// A record's fields in Kong's schema JSON shape: `[{name: {type, default, ...}}, ...]`.
fn record_fields_json(fields: &[Field]) -> Vec<Value> {
    fields
        .iter()
        .map(|f| {
            let mut d = type_json(f.ty);
            if f.required {
                d.insert("required".into(), json!(true));
            }
            if f.auto {
                d.insert("auto".into(), json!(true));
            }
            if f.referenceable {
                match d.get_mut("values") {
                    Some(Value::Object(values)) => {
                        values.insert("referenceable".into(), json!(true));
                    }
                    _ => {
                        d.insert("referenceable".into(), json!(true));
                    }
                }
            }
            if let Some(def) = f.default {
                let mut v = def.to_value();
                // An array of records' default as it is stored: each element with every field
                // (null when unset). decK fills the elements of a file's array that way, and
                // compares a file without the field with this default.
                if let (Type::RecordArray(inner), Value::Array(items)) = (f.ty, &mut v) {
                    for item in items.iter_mut() {
                        if let Value::Object(m) = item {
                            *m = inner
                                .iter()
                                .map(|x| {
                                    (
                                        x.name.to_string(),
                                        m.get(x.name).cloned().unwrap_or(Value::Null),
                                    )
                                })
                                .collect();
                        }
                    }
                }
                d.insert("default".into(), v);
            }
            json!({ f.name: Value::Object(d) })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const WITH_SECRETS: &[Field] = &[
        Field::new("endpoint", Type::String).referenceable(),
        Field::new("note", Type::String),
        Field::new("headers", Type::Map).referenceable(),
        Field::new(
            "redis",
            Type::Record(&[Field::new("password", Type::String).referenceable()]),
        ),
        Field::new(
            "limits",
            Type::MapOfRecords(&[Field::new("token", Type::String).referenceable()]),
        ),
    ];

    #[test]
    fn references_resolve_only_where_the_schema_allows_them() {
        let r = "{vault://env/x}";
        let mut v = json!({
            "endpoint": r, "note": r, "headers": {"a": r, "b": "plain"},
            "redis": {"password": r}, "limits": {"l": {"token": r}},
        });
        let mut paths = reference_paths(WITH_SECRETS, &v);
        paths.sort();
        assert_eq!(
            paths,
            ["endpoint", "headers.a", "limits.l.token", "redis.password"]
        );
        resolve_references(WITH_SECRETS, &mut v, &|s: &str| Ok(format!("<{s}>"))).unwrap();
        assert_eq!(v["endpoint"], "<{vault://env/x}>");
        assert_eq!(v["headers"]["a"], "<{vault://env/x}>");
        assert_eq!(v["headers"]["b"], "plain");
        assert_eq!(v["redis"]["password"], "<{vault://env/x}>");
        assert_eq!(v["limits"]["l"]["token"], "<{vault://env/x}>");
        assert_eq!(
            v["note"], r,
            "a field Kong does not mark keeps the reference as text"
        );
        let err = resolve_references(WITH_SECRETS, &mut json!({"endpoint": r}), &|_| {
            Err("not set".into())
        });
        assert_eq!(err, Err("not set".into()));
        // The schema JSON marks them as Kong's does (a map's values, for a map).
        let j = kong_json(WITH_SECRETS, &[], false);
        let config = &j["fields"][11]["config"]["fields"];
        assert_eq!(config[0]["endpoint"]["referenceable"], true);
        assert_eq!(config[1]["note"].get("referenceable"), None);
        assert_eq!(config[2]["headers"]["values"]["referenceable"], true);
        assert_eq!(config[2]["headers"].get("referenceable"), None);
    }

    const FIELDS: &[Field] = &[
        Field::new("status_code", Type::Integer { min: 100, max: 599 }).default(Default::Int(503)),
        Field::new("message", Type::String),
        Field::new("mode", Type::OneOf(&["a", "b"])).required(),
    ];

    #[test]
    fn auto_fields_are_drawn_when_left_out_and_an_explicit_null_is_missing() {
        const KEYED: &[Field] = &[Field::new("key", Type::String).required().auto()];
        let drawn = validate(KEYED, &json!({})).unwrap()["key"].clone();
        assert!(
            drawn
                .as_str()
                .is_some_and(|k| k.len() == 32 && k.bytes().all(|b| b.is_ascii_hexdigit())),
            "{drawn}"
        );
        assert_eq!(
            validate(KEYED, &Value::Null).unwrap()["key"]
                .as_str()
                .map(str::len),
            Some(32)
        );
        assert_eq!(validate(KEYED, &json!({"key": "k"})).unwrap()["key"], "k");
        assert_eq!(
            validate(KEYED, &json!({"key": null})).unwrap_err(),
            vec![("key".to_string(), "required field missing".to_string())]
        );
    }

    #[test]
    fn defaults_nulls_and_violations() {
        let v = validate(FIELDS, &json!({"mode": "a"})).unwrap();
        assert_eq!(v, json!({"status_code": 503, "message": null, "mode": "a"}));
        let e = validate(FIELDS, &json!({"status_code": 99, "extra": 1})).unwrap_err();
        assert!(e.contains(&(
            "status_code".into(),
            "value should be between 100 and 599".into()
        )));
        assert!(e.contains(&("extra".into(), "unknown field".into())));
        assert!(e.contains(&("mode".into(), "required field missing".into())));
        const INNER: &[Field] = &[
            Field::new("port", Type::Integer { min: 0, max: 65535 }).default(Default::Int(6379)),
            Field::new("host", Type::String),
        ];
        const OUTER: &[Field] = &[Field::new("redis", Type::Record(INNER))];
        assert_eq!(
            validate(OUTER, &json!({})).unwrap(),
            json!({"redis": {"port": 6379, "host": null}})
        );
        let e = validate(OUTER, &json!({"redis": {"port": 70000, "x": 1}})).unwrap_err();
        assert!(e.contains(&(
            "redis.port".into(),
            "value should be between 0 and 65535".into()
        )));
        assert!(e.contains(&("redis.x".into(), "unknown field".into())));
        assert_eq!(
            kong_json(OUTER, &[], false)["fields"][11]["config"]["fields"][0]["redis"]["fields"][0]
                ["port"]["default"],
            6379
        );
        assert_eq!(
            kong_json(OUTER, &[], false)["fields"][11]["config"]["fields"][0]["redis"]["required"],
            true
        );
        const ARRAYS: &[Field] = &[
            Field::new("headers", Type::ColonStringArray).default(Default::EmptyArray),
            Field::new("types", Type::OneOfArray(&["number", "string"])),
        ];
        assert!(validate(
            ARRAYS,
            &json!({"headers": ["a:1", "b:"], "types": ["number"]})
        )
        .is_ok());
        let e = validate(
            ARRAYS,
            &json!({"headers": ["a:1", ":x"], "types": ["bool"]}),
        )
        .unwrap_err();
        assert!(
            e.contains(&("headers.2".into(), "invalid value: :x".into())),
            "{e:?}"
        );
        assert!(e.contains(&("types.1".into(), "expected one of: number, string".into())));
        let e = validate(ARRAYS, &json!({"headers": ["no-colon"]})).unwrap_err();
        assert!(e.contains(&("headers.1".into(), "invalid value: no-colon".into())));
        assert_eq!(
            kong_json(ARRAYS, &[], false)["fields"][11]["config"]["fields"][0]["headers"]
                ["elements"]["match"],
            "^[^:]+:.*$"
        );
        let s = kong_json(FIELDS, &[], false);
        assert_eq!(
            s["fields"][11]["config"]["fields"][0]["status_code"]["default"],
            503
        );
    }
}
