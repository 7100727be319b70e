//! Request-scoped log records (Kong's `kong.observability.logs`): what plugin code logs through
//! `kong.log`/`ngx.log` during a request, at or above the node's log level, kept in the
//! request's context for the opentelemetry plugin's `logs_endpoint`.

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
