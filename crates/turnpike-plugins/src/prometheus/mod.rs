//! prometheus (PRIORITY 13): Kong's metrics, recorded in the log phase into per-worker
//! shards (`metrics.rs`) and served at `/metrics` on the Admin API and `status_listen`, with
//! Kong's metric names, labels and buckets so that existing dashboards work. As in Kong 3, each
//! per-request family is off until its flag is set; node-wide metrics are always served.

pub mod metrics;
mod schema;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde_json::Value;

use crate::log::LogEntry;
use crate::{Handler, PluginSpec};

pub struct Prometheus;

pub use metrics::State;

impl State {
    /// Whether `kong_upstream_target_health` is exported.
    pub fn upstream_health_metrics(&self) -> bool {
        self.upstream_health.load(Ordering::Relaxed)
    }
}

struct Configured {
    families: metrics::Families,
    state: Arc<State>,
}

impl PluginSpec for Prometheus {
    fn name(&self) -> &'static str {
        "prometheus"
    }
    fn priority(&self) -> i32 {
        13
    }
    fn fields(&self) -> &'static [crate::schema::Field] {
        schema::FIELDS
    }
    fn build(&self, config: &Value, ctx: &crate::BuildContext) -> Result<Arc<dyn Handler>, String> {
        let c: schema::Config = crate::typed(config)?;
        let state = ctx.runtime.prometheus.clone();
        if c.upstream_health_metrics {
            state.upstream_health.store(true, Ordering::Relaxed);
        }
        Ok(Arc::new(Configured {
            state,
            families: metrics::Families {
                per_consumer: c.per_consumer,
                status_code: c.status_code_metrics,
                latency: c.latency_metrics,
                bandwidth: c.bandwidth_metrics,
            },
        }))
    }
}

impl Handler for Configured {
    /// A log phase only when some per-request family is on.
    fn phases(&self) -> crate::Phases {
        let f = self.families;
        if f.status_code || f.latency || f.bandwidth {
            crate::Phases::LOG
        } else {
            crate::Phases::NONE
        }
    }
    fn log(&self, entry: &LogEntry<'_>) {
        metrics::record(&self.state, self.families, entry);
    }

    fn stream_log(&self, entry: &crate::log::StreamLogEntry<'_>) {
        metrics::record_stream(&self.state, self.families, entry);
    }
}
