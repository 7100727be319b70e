//! Request-scoped log records (Kong's `kong.observability.logs`): what plugin code logs through
//! `kong.log`/`ngx.log` during a request, at or above the node's log level, kept in the
//! request's context for the opentelemetry plugin's `logs_endpoint`.

/// Whether the config's requests keep their log records: an enabled opentelemetry plugin has
/// a `logs_endpoint` (Kong turns its log hook on for the same). Otherwise a plugin's log line
/// costs no copy. Decided once per config, shared by its plugins.
pub struct Wanted(pub bool);

pub fn wanted(ctx: &crate::BuildContext) -> bool {
    ctx.shared(|c| {
        Wanted(c.config.plugins.iter().any(|p| {
            p.enabled
                && p.name == "opentelemetry"
                && p.config.get("logs_endpoint").is_some_and(|v| !v.is_null())
        }))
    })
    .0
}

/// Records kept per request; past it a record is dropped (Kong's `MAX_REQUEST_LOGS`).
pub const MAX_REQUEST_LOGS: usize = 1000;

/// One log line, with where in the plugin's code it was written.
#[derive(Debug, Clone)]
pub struct RequestLog {
    pub time_ns: u64,
    /// nginx's level: 1 (emerg) to 8 (debug).
    pub level: u8,
    pub body: String,
    /// Lua's debug information of the caller (`introspection.*`).
    pub source: Option<String>,
    pub line: Option<usize>,
    pub name: Option<String>,
    pub namewhat: Option<&'static str>,
    pub what: &'static str,
}

/// The request's records, in order.
#[derive(Debug, Default)]
pub struct RequestLogs(pub Vec<RequestLog>);

impl RequestLogs {
    pub fn push(&mut self, log: RequestLog) {
        if self.0.len() < MAX_REQUEST_LOGS {
            self.0.push(log);
        }
    }
}

/// OTLP's severity number and text for an nginx level (Kong's `map_severity`).
pub fn severity(level: u8) -> (u64, &'static str) {
    match level {
        1 => (23, "EMERG"),
        2 => (21, "ALERT"),
        3 => (19, "CRIT"),
        4 => (17, "ERR"),
        5 => (13, "WARN"),
        6 => (11, "NOTICE"),
        7 => (9, "INFO"),
        _ => (5, "DEBUG"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_kept_only_for_an_enabled_logs_endpoint() {
        let wanted_in = |plugins: serde_json::Value| {
            let doc = serde_json::json!({"_format_version": "3.0", "plugins": plugins});
            let config =
                turnpike_config::declarative::load(&doc, &crate::registry::bundled()).unwrap();
            let runtime = crate::Runtime::new();
            wanted(&crate::BuildContext::new(&config, &runtime))
        };
        let otel = |config: serde_json::Value, enabled: bool| serde_json::json!([{"name": "opentelemetry", "config": config, "enabled": enabled}]);
        assert!(wanted_in(otel(
            serde_json::json!({"logs_endpoint": "http://c/v1/logs"}),
            true
        )));
        assert!(!wanted_in(otel(
            serde_json::json!({"logs_endpoint": "http://c/v1/logs"}),
            false
        )));
        assert!(!wanted_in(otel(
            serde_json::json!({"traces_endpoint": "http://c/v1/traces"}),
            true
        )));
        assert!(!wanted_in(serde_json::json!([])));
    }

    #[test]
    fn records_past_the_limit_are_dropped() {
        let mut logs = RequestLogs::default();
        let log = RequestLog {
            time_ns: 1,
            level: 4,
            body: "x".into(),
            source: None,
            line: None,
            name: None,
            namewhat: None,
            what: "Lua",
        };
        for _ in 0..MAX_REQUEST_LOGS + 5 {
            logs.push(log.clone());
        }
        assert_eq!(logs.0.len(), MAX_REQUEST_LOGS);
        assert_eq!(severity(4), (17, "ERR"));
        assert_eq!(severity(8), (5, "DEBUG"));
    }
}
