//! rate-limiting's config (Kong `kong/plugins/rate-limiting/schema.lua`).

use serde_json::Value;

use serde::Deserialize;

use crate::schema::{Default, Field, Shorthand, Type};

/// The validated config, typed.
#[derive(Deserialize)]
pub struct Config {
    pub second: Option<f64>,
    pub minute: Option<f64>,
    pub hour: Option<f64>,
    pub day: Option<f64>,
    pub month: Option<f64>,
    pub year: Option<f64>,
    pub limit_by: String,
    pub header_name: Option<String>,
    pub path: Option<String>,
    pub policy: String,
    pub fault_tolerant: bool,
    pub hide_client_headers: bool,
    pub error_code: u16,
    pub error_message: String,
    pub sync_rate: f64,
    pub redis: Redis,
}

impl Config {
    /// The limit of a window (`second` ... `year`), if set.
    pub fn limit(&self, period: &str) -> Option<f64> {
        match period {
            "second" => self.second,
            "minute" => self.minute,
            "hour" => self.hour,
            "day" => self.day,
            "month" => self.month,
            "year" => self.year,
            _ => None,
        }
    }
}

/// The `redis` record, typed.
#[derive(Deserialize)]
pub struct Redis {
    pub host: Option<String>,
    pub port: u16,
    pub username: Option<String>,
    pub password: Option<String>,
    pub database: i64,
    pub timeout: u64,
    pub ssl: bool,
    pub ssl_verify: bool,
}

pub const PERIODS: [&str; 6] = ["second", "minute", "hour", "day", "month", "year"];

pub const FIELDS: &[Field] = &[
    Field::new("second", Type::Number),
    Field::new("minute", Type::Number),
    Field::new("hour", Type::Number),
    Field::new("day", Type::Number),
    Field::new("month", Type::Number),
    Field::new("year", Type::Number),
    Field::new(
        "limit_by",
        Type::OneOf(&["consumer", "credential", "ip", "service", "header", "path"]),
    )
    .default(Default::Str("consumer")),
    Field::new("header_name", Type::String),
    Field::new("path", Type::String),
    Field::new("policy", Type::OneOf(&["local", "cluster", "redis"]))
        .default(Default::Str("local")),
    Field::new("fault_tolerant", Type::Boolean).default(Default::Bool(true)),
    Field::new("hide_client_headers", Type::Boolean).default(Default::Bool(false)),
    Field::new("error_code", Type::Integer { min: 0, max: 999 }).default(Default::Int(429)),
    Field::new("error_message", Type::String).default(Default::Str("API rate limit exceeded")),
    Field::new("sync_rate", Type::Number).default(Default::Int(-1)),
    Field::new("redis", Type::Record(REDIS)),
];

/// Kong's shared Redis record (`kong/tools/redis/schema.lua`).
pub const REDIS: &[Field] = &[
    Field::new("host", Type::String),
    Field::new("port", Type::Integer { min: 0, max: 65535 }).default(Default::Int(6379)),
    Field::new(
        "timeout",
        Type::Integer {
            min: 0,
            max: 2_147_483_646,
        },
    )
    .default(Default::Int(2000)),
    Field::new("username", Type::String).referenceable(),
    Field::new("password", Type::String).referenceable(),
    Field::new(
        "database",
        Type::Integer {
            min: 0,
            max: 2_147_483_646,
        },
    )
    .default(Default::Int(0)),
    Field::new("ssl", Type::Boolean).default(Default::Bool(false)),
    Field::new("ssl_verify", Type::Boolean).default(Default::Bool(false)),
    Field::new("server_name", Type::String),
];

/// The flat `redis_*` fields as Kong's schema lists them.
pub const SHORTHANDS: &[Shorthand] = &[
    Shorthand {
        name: "redis_host",
        ty: Type::String,
        into: &["redis", "host"],
    },
    Shorthand {
        name: "redis_port",
        ty: Type::Integer { min: 0, max: 65535 },
        into: &["redis", "port"],
    },
    Shorthand {
        name: "redis_password",
        ty: Type::String,
        into: &["redis", "password"],
    },
    Shorthand {
        name: "redis_username",
        ty: Type::String,
        into: &["redis", "username"],
    },
    Shorthand {
        name: "redis_ssl",
        ty: Type::Boolean,
        into: &["redis", "ssl"],
    },
    Shorthand {
        name: "redis_ssl_verify",
        ty: Type::Boolean,
        into: &["redis", "ssl_verify"],
    },
    Shorthand {
        name: "redis_server_name",
        ty: Type::String,
        into: &["redis", "server_name"],
    },
    Shorthand {
        name: "redis_timeout",
        ty: Type::Integer {
            min: 0,
            max: 2147483646,
        },
        into: &["redis", "timeout"],
    },
    Shorthand {
        name: "redis_database",
        ty: Type::Integer {
            min: 0,
            max: 2_147_483_646,
        },
        into: &["redis", "database"],
    },
];

/// The flat `redis_*` fields Kong still accepts (deprecated, to go in 4.0): moved into `redis`.
pub fn shorthands(config: &mut Value) {
    let Some(obj) = config.as_object_mut() else {
        return;
    };
    for name in [
        "host",
        "port",
        "timeout",
        "username",
        "password",
        "database",
        "ssl",
        "ssl_verify",
        "server_name",
    ] {
        let Some(v) = obj.remove(&format!("redis_{name}")) else {
            continue;
        };
        if v.is_null() {
            continue;
        }
        let redis = obj
            .entry("redis")
            .or_insert_with(|| Value::Object(serde_json::Map::new()));
        if redis.is_null() {
            *redis = Value::Object(serde_json::Map::new());
        }
        if let Some(r) = redis.as_object_mut() {
            r.entry(name).or_insert(v);
        }
    }
}

/// Kong's entity checks, and what this build does not do yet.
pub fn entity_checks(config: &Value) -> Vec<(String, String)> {
    let mut errs = Vec::new();
    let limits: Vec<(&str, f64)> = PERIODS
        .iter()
        .filter_map(|p| config[*p].as_f64().map(|v| (*p, v)))
        .collect();
    if limits.is_empty() {
        errs.push((
            "@entity".into(),
            "at least one of these fields must be non-empty: 'config.second', 'config.minute', 'config.hour', 'config.day', 'config.month', 'config.year'".into(),
        ));
    }
    for (p, v) in &limits {
        if *v <= 0.0 {
            errs.push((p.to_string(), "value must be greater than 0".into()));
        }
    }
    // A smaller period may not allow more than a larger one.
    for w in limits.windows(2) {
        if w[0].1 > w[1].1 {
            errs.push((
                "@entity".into(),
                format!(
                    "The limit for {}({:.1}) cannot be lower than the limit for {}({:.1})",
                    w[1].0, w[1].1, w[0].0, w[0].1
                ),
            ));
        }
    }
    match config["limit_by"].as_str() {
        Some("header") if config["header_name"].is_null() => {
            errs.push(("header_name".into(), "required field missing".into()))
        }
        Some("path") if config["path"].is_null() => {
            errs.push(("path".into(), "required field missing".into()))
        }
        _ => {}
    }
    if config["policy"].as_str() == Some("redis") {
        if config["redis"]["host"].is_null() {
            errs.push(("redis.host".into(), "required field missing".into()));
        }
        // The TLS client names the server by `host`; a different SNI is not supported.
        if let Some(sni) = config["redis"]["server_name"].as_str() {
            if Some(sni) != config["redis"]["host"].as_str() {
                errs.push((
                    "redis.server_name".into(),
                    "a server name other than redis.host is not supported in this build".into(),
                ));
            }
        }
    }
    // sync_rate: -1 (synchronous, the default) or a period of at least 0.02 s, redis only.
    if let Some(rate) = config["sync_rate"].as_f64() {
        if rate != -1.0 {
            if config["policy"].as_str() != Some("redis") {
                errs.push((
                    "sync_rate".into(),
                    "sync_rate is only supported with the redis policy".into(),
                ));
            } else if rate < 0.02 {
                errs.push((
                    "sync_rate".into(),
                    "value must be -1 or at least 0.02".into(),
                ));
            }
        }
    }
    errs
}
