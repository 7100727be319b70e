//! An upstream's `healthchecks` record (Kong `kong/db/schema/entities/upstreams.lua`): every
//! field with Kong's default and bounds. An upstream reads back with the whole record filled,
//! as Kong stores it, and `GET /schemas/upstreams` shows the same declaration.

use crate::schema::{Default, Field, Type};

const STATUS: Type = Type::IntegerArray { min: 100, max: 999 };
const COUNTER: Type = Type::Integer { min: 0, max: 255 };
const SECONDS: Type = Type::NumberIn {
    min: 0.0,
    max: 65535.0,
};

const ACTIVE_HEALTHY: &[Field] = &[
    Field::new("interval", SECONDS).default(Default::Float(0.0)),
    Field::new("http_statuses", STATUS).default(Default::IntArray(&[200, 302])),
    Field::new("successes", COUNTER).default(Default::Int(0)),
];

const ACTIVE_UNHEALTHY: &[Field] = &[
    Field::new("interval", SECONDS).default(Default::Float(0.0)),
    Field::new("http_statuses", STATUS)
        .default(Default::IntArray(&[429, 404, 500, 501, 502, 503, 504, 505])),
    Field::new("tcp_failures", COUNTER).default(Default::Int(0)),
    Field::new("timeouts", COUNTER).default(Default::Int(0)),
    Field::new("http_failures", COUNTER).default(Default::Int(0)),
];

const PASSIVE_HEALTHY: &[Field] = &[
    Field::new("http_statuses", STATUS).default(Default::IntArray(&[
        200, 201, 202, 203, 204, 205, 206, 207, 208, 226, 300, 301, 302, 303, 304, 305, 306, 307,
        308,
    ])),
    Field::new("successes", COUNTER).default(Default::Int(0)),
];

const PASSIVE_UNHEALTHY: &[Field] = &[
    Field::new("http_statuses", STATUS).default(Default::IntArray(&[429, 500, 503])),
    Field::new("tcp_failures", COUNTER).default(Default::Int(0)),
    Field::new("timeouts", COUNTER).default(Default::Int(0)),
    Field::new("http_failures", COUNTER).default(Default::Int(0)),
];

const CHECK_TYPES: &[&str] = &["tcp", "http", "https", "grpc", "grpcs"];

const ACTIVE: &[Field] = &[
    Field::new("type", Type::OneOf(CHECK_TYPES)).default(Default::Str("http")),
    Field::new("timeout", SECONDS).default(Default::Float(1.0)),
    Field::new(
        "concurrency",
        Type::Integer {
            min: 1,
            max: 2_147_483_648,
        },
    )
    .default(Default::Int(10)),
    Field::new("http_path", Type::String).default(Default::Str("/")),
    Field::new("https_sni", Type::String),
    Field::new("https_verify_certificate", Type::Boolean).default(Default::Bool(true)),
    Field::new("headers", Type::MapOfStringArrays),
    Field::new("healthy", Type::Record(ACTIVE_HEALTHY)),
    Field::new("unhealthy", Type::Record(ACTIVE_UNHEALTHY)),
];

const PASSIVE: &[Field] = &[
    Field::new("type", Type::OneOf(CHECK_TYPES)).default(Default::Str("http")),
    Field::new("healthy", Type::Record(PASSIVE_HEALTHY)),
    Field::new("unhealthy", Type::Record(PASSIVE_UNHEALTHY)),
];

/// The `healthchecks` record's fields.
pub const FIELDS: &[Field] = &[
    Field::new("active", Type::Record(ACTIVE)),
    Field::new("passive", Type::Record(PASSIVE)),
    Field::new(
        "threshold",
        Type::NumberIn {
            min: 0.0,
            max: 100.0,
        },
    )
    .default(Default::Float(0.0)),
];

#[cfg(test)]
mod tests {
    use super::FIELDS;
    use crate::schema::validate;
    use serde_json::json;

    #[test]
    fn defaults_fill_the_record_and_unknown_fields_are_refused() {
        let v = validate(FIELDS, &json!({"active": {"healthy": {"interval": 5}}})).unwrap();
        assert_eq!(v["active"]["healthy"]["interval"], 5);
        assert_eq!(v["active"]["healthy"]["http_statuses"], json!([200, 302]));
        assert_eq!(
            v["passive"]["unhealthy"]["http_statuses"],
            json!([429, 500, 503])
        );
        assert_eq!(v["active"]["http_path"], "/");
        assert_eq!(v["threshold"], json!(0));
        assert!(v["active"]["timeout"].is_i64());
        let e = validate(FIELDS, &json!({"passive": {"unhealthy": {"interval": 5}}})).unwrap_err();
        assert_eq!(
            e,
            vec![("passive.unhealthy.interval".into(), "unknown field".into())]
        );
        let e = validate(
            FIELDS,
            &json!({"active": {"healthy": {"http_statuses": [200, 1000]}}}),
        )
        .unwrap_err();
        assert_eq!(
            e,
            vec![(
                "active.healthy.http_statuses.2".into(),
                "value should be between 100 and 999".into()
            )]
        );
    }
}
