//! datadog (PRIORITY 10): Kong's request metrics in DogStatsD's tagged form
//! (`kong.request.count:1|c|#name:my_api,status:200,consumer:alice,app:kong`) to the Datadog
//! agent over UDP, as Kong's `handler.lua` and `statsd_logger.lua` write them: the service
//! (`service_name_tag`, its name or host with dots as `_`), the status (`status_tag`), the
//! consumer (`consumer_tag`, by each metric's `consumer_identifier`), then the metric's own
//! tags. Requests no service matched send nothing. The lines go out from statsd's sender
//! thread (`crate::statsd::send_metrics`), queued per request.

use std::fmt::Write as _;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;

use crate::log::LogEntry;
use crate::log_sender::Sender;
use crate::schema::{Default, Field, Type};
use crate::{Handler, PluginSpec};

pub struct Datadog;

const STAT_NAMES: &[&str] = &[
    "kong_latency",
    "latency",
    "request_count",
    "request_size",
    "response_size",
    "upstream_latency",
];
const STAT_TYPES: &[&str] = &[
    "counter",
    "gauge",
    "histogram",
    "meter",
    "set",
    "timer",
    "distribution",
];

#[derive(Deserialize)]
struct Config {
    host: String,
    port: u16,
    prefix: String,
    service_name_tag: String,
    status_tag: String,
    consumer_tag: String,
    metrics: Vec<MetricConfig>,
}

#[derive(Deserialize)]
struct MetricConfig {
    name: String,
    stat_type: String,
    tags: Option<Vec<String>>,
    sample_rate: Option<f64>,
    consumer_identifier: Option<String>,
}

const METRIC: &[Field] = &[
    Field::new("name", Type::OneOf(STAT_NAMES)).required(),
    Field::new("stat_type", Type::OneOf(STAT_TYPES)).required(),
    Field::new("tags", Type::StringArray),
    Field::new("sample_rate", Type::NumberIn { min: 0.0, max: 1.0 }),
    Field::new(
        "consumer_identifier",
        Type::OneOf(&["consumer_id", "custom_id", "username"]),
    ),
];

/// Kong's `DEFAULT_METRICS`.
const DEFAULT_METRICS: &str = r#"[
  {"name": "request_count", "stat_type": "counter", "sample_rate": 1, "tags": ["app:kong"], "consumer_identifier": "custom_id"},
  {"name": "latency", "stat_type": "timer", "tags": ["app:kong"], "consumer_identifier": "custom_id"},
  {"name": "request_size", "stat_type": "timer", "tags": ["app:kong"], "consumer_identifier": "custom_id"},
  {"name": "response_size", "stat_type": "timer", "tags": ["app:kong"], "consumer_identifier": "custom_id"},
  {"name": "upstream_latency", "stat_type": "timer", "tags": ["app:kong"], "consumer_identifier": "custom_id"},
  {"name": "kong_latency", "stat_type": "timer", "tags": ["app:kong"], "consumer_identifier": "custom_id"}
]"#;

const FIELDS: &[Field] = &[
    Field::new("host", Type::String)
        .default(Default::Str("localhost"))
        .referenceable(),
    Field::new("port", Type::Integer { min: 0, max: 65535 }).default(Default::Int(8125)),
    Field::new("prefix", Type::String).default(Default::Str("kong")),
    Field::new("service_name_tag", Type::String).default(Default::Str("name")),
    Field::new("status_tag", Type::String).default(Default::Str("status")),
    Field::new("consumer_tag", Type::String).default(Default::Str("consumer")),
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
    Field::new("metrics", Type::RecordArray(METRIC)).default(Default::Json(DEFAULT_METRICS)),
];

#[derive(Clone, Copy)]
enum Stat {
    KongLatency,
    Latency,
    RequestCount,
    RequestSize,
    ResponseSize,
    UpstreamLatency,
}

struct Metric {
    stat: Stat,
    /// `|type` and `|@rate`.
    suffix: String,
    /// The metric's own tags, `,`-joined.
    tags: String,
    consumer: Option<fn(&crate::Identity) -> Option<String>>,
}

struct Configured {
    prefix: String,
    service_tag: String,
    status_tag: String,
    consumer_tag: String,
    metrics: Vec<Metric>,
    sender: Arc<Sender>,
}

impl PluginSpec for Datadog {
    fn name(&self) -> &'static str {
        "datadog"
    }
    fn priority(&self) -> i32 {
        10
    }
    fn fields(&self) -> &'static [Field] {
        FIELDS
    }
    fn entity_checks(&self, config: &Value) -> Vec<(String, String)> {
        let mut errs = Vec::new();
        for (i, m) in config["metrics"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            if matches!(m["stat_type"].as_str(), Some("counter" | "gauge"))
                && m["sample_rate"].is_null()
            {
                errs.push((
                    format!("metrics.{}.sample_rate", i + 1),
                    "required field missing".into(),
                ));
            }
            for (j, t) in m["tags"].as_array().into_iter().flatten().enumerate() {
                if t.as_str().is_some_and(|t| t.ends_with(':')) {
                    errs.push((
                        format!("metrics.{}.tags.{}", i + 1, j + 1),
                        "invalid value: a tag may not end with ':'".into(),
                    ));
                }
            }
        }
        errs
    }
    fn build(&self, config: &Value, ctx: &crate::BuildContext) -> Result<Arc<dyn Handler>, String> {
        let c: Config = crate::typed(config)?;
        let metrics = c
            .metrics
            .iter()
            .map(|m| {
                let kind = match m.stat_type.as_str() {
                    "gauge" => "g",
                    "counter" => "c",
                    "timer" => "ms",
                    "histogram" => "h",
                    "meter" => "m",
                    "set" => "s",
                    _ => "d",
                };
                let rate = match m.sample_rate {
                    Some(r) if r != 1.0 => format!("|@{}", crate::statsd::number(r)),
                    _ => String::new(),
                };
                Metric {
                    stat: match m.name.as_str() {
                        "kong_latency" => Stat::KongLatency,
                        "latency" => Stat::Latency,
                        "request_count" => Stat::RequestCount,
                        "request_size" => Stat::RequestSize,
                        "response_size" => Stat::ResponseSize,
                        _ => Stat::UpstreamLatency,
                    },
                    suffix: format!("|{kind}{rate}"),
                    tags: m.tags.as_deref().unwrap_or_default().join(","),
                    consumer: match m.consumer_identifier.as_deref() {
                        Some("consumer_id") => Some(|w| Some(w.consumer_id().replace('-', "_"))),
                        Some("custom_id") => Some(|w| w.custom_id().map(String::from)),
                        Some("username") => Some(|w| w.username().map(String::from)),
                        _ => None,
                    },
                }
            })
            .collect();
        let (host, port) = (c.host.clone(), c.port);
        let sender = ctx.runtime.log_senders.get(
            &ctx.runtime.spawner,
            "statsd",
            format!("statsd {}:{} tcp=false packet=0", c.host, c.port),
            move |rx| crate::statsd::send_metrics(host, port, false, 0, rx),
        )?;
        Ok(Arc::new(Configured {
            prefix: c.prefix,
            service_tag: c.service_name_tag,
            status_tag: c.status_tag,
            consumer_tag: c.consumer_tag,
            metrics,
            sender,
        }))
    }
}

impl Handler for Configured {
    fn phases(&self) -> crate::Phases {
        crate::Phases::LOG
    }
    fn log(&self, e: &LogEntry<'_>) {
        let Some(service) = e.service else {
            return;
        };
        let name = service
            .name
            .as_deref()
            .unwrap_or(&*service.host)
            .replace('.', "_");
        let mut out = String::new();
        for m in &self.metrics {
            let value = match m.stat {
                Stat::RequestCount => 1,
                Stat::Latency => e.latency_request_ms,
                Stat::KongLatency => e.latency_kong_ms,
                Stat::RequestSize => e.request_size,
                Stat::ResponseSize => e.response_size,
                Stat::UpstreamLatency => match e.latency_proxy_ms {
                    Some(ms) => ms,
                    None => continue,
                },
            };
            let stat = match m.stat {
                Stat::RequestCount => "request.count",
                Stat::Latency => "latency",
                Stat::KongLatency => "kong_latency",
                Stat::RequestSize => "request.size",
                Stat::ResponseSize => "response.size",
                Stat::UpstreamLatency => "upstream_latency",
            };
            if !out.is_empty() {
                out.push('\n');
            }
            let _ = write!(
                out,
                "{}.{stat}:{value}{}|#{}:{name},{}:{}",
                self.prefix, m.suffix, self.service_tag, self.status_tag, e.status
            );
            if let Some(id) = m.consumer.and_then(|f| e.consumer.and_then(f)) {
                let _ = write!(out, ",{}:{id}", self.consumer_tag);
            }
            if !m.tags.is_empty() {
                out.push(',');
                out.push_str(&m.tags);
            }
        }
        if !out.is_empty() {
            self.sender.send(out);
        }
    }
}
