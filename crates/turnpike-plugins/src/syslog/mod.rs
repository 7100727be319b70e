//! syslog (PRIORITY 4): each request's log entry, as Kong serializes it, to the system log
//! (Kong's `handler.lua`): with `successful_severity`, `client_errors_severity` (4xx) or
//! `server_errors_severity` (5xx), sent only when that severity is at least as urgent as
//! `log_level`, under `syslog_facility`, as `kong`. The entry is written as syslog(3) writes it
//! (`<PRI>Mmm dd hh:mm:ss kong[pid]: {...}`) to the local syslog socket (`/dev/log`, or the
//! node's `syslog_socket` property) by a sender thread; the log phase only queues it.

use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;

use crate::log::LogEntry;
use crate::schema::{Default, Field, Type};
use crate::{Handler, PluginSpec};

pub struct Syslog;

const SEVERITIES: &[&str] = &[
    "emerg", "alert", "crit", "err", "warning", "notice", "info", "debug",
];
const FACILITIES: &[&str] = &[
    "KERN", "USER", "MAIL", "DAEMON", "AUTH", "SYSLOG", "LPR", "NEWS", "UUCP", "CRON", "AUTHPRIV",
    "FTP", "LOCAL0", "LOCAL1", "LOCAL2", "LOCAL3", "LOCAL4", "LOCAL5", "LOCAL6", "LOCAL7",
];

/// syslog(3)'s facility codes, by the names above.
fn facility_code(name: &str) -> u8 {
    match name {
        "KERN" => 0,
        "MAIL" => 2,
        "DAEMON" => 3,
        "AUTH" => 4,
        "SYSLOG" => 5,
        "LPR" => 6,
        "NEWS" => 7,
        "UUCP" => 8,
        "CRON" => 9,
        "AUTHPRIV" => 10,
        "FTP" => 11,
        l if l.starts_with("LOCAL") => 16 + l[5..].parse::<u8>().unwrap_or(0),
        _ => 1,
    }
}

/// A severity's code (`emerg` 0 .. `debug` 7).
fn severity(name: &str) -> u8 {
    SEVERITIES.iter().position(|s| *s == name).unwrap_or(6) as u8
}

#[derive(Deserialize)]
struct Config {
    log_level: String,
    successful_severity: String,
    client_errors_severity: String,
    server_errors_severity: String,
    syslog_facility: String,
    custom_fields_by_lua: Option<serde_json::Map<String, Value>>,
}

const FIELDS: &[Field] = &[
    Field::new("log_level", Type::OneOf(SEVERITIES)).default(Default::Str("info")),
    Field::new("successful_severity", Type::OneOf(SEVERITIES)).default(Default::Str("info")),
    Field::new("client_errors_severity", Type::OneOf(SEVERITIES)).default(Default::Str("info")),
    Field::new("server_errors_severity", Type::OneOf(SEVERITIES)).default(Default::Str("info")),
    Field::new("custom_fields_by_lua", Type::Map),
    Field::new("syslog_facility", Type::OneOf(FACILITIES)).default(Default::Str("USER")),
];

struct Configured {
    level: u8,
    /// Severity by response class: 2xx/3xx, 4xx, 5xx.
    severities: [u8; 3],
    facility: u8,
    entries: crate::log_sender::Entries,
}

/// `Mmm dd hh:mm:ss` of now (UTC), as syslog(3) stamps a message.
fn timestamp() -> String {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let secs = crate::clock::now_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (_, month, day) = crate::clock::civil_from_days(days);
    format!(
        "{} {:>2} {:02}:{:02}:{:02}",
        MONTHS[(month - 1) as usize],
        day,
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

fn send_datagrams(path: PathBuf, rx: std::sync::mpsc::Receiver<String>) {
    let mut socket: Option<UnixDatagram> = None;
    let mut failing = false;
    while let Ok(message) = rx.recv() {
        if socket.is_none() {
            socket = UnixDatagram::unbound().ok();
        }
        let sent = socket
            .as_ref()
            .map(|s| s.send_to(message.as_bytes(), &path));
        match sent {
            Some(Ok(_)) => failing = false,
            other => {
                if !failing {
                    let why = match other {
                        Some(Err(e)) => e.to_string(),
                        _ => "no socket".into(),
                    };
                    tracing::error!("syslog: cannot send to {}: {why}", path.display());
                    failing = true;
                }
                socket = None;
            }
        }
    }
}

impl PluginSpec for Syslog {
    fn name(&self) -> &'static str {
        "syslog"
    }
    fn priority(&self) -> i32 {
        4
    }
    fn fields(&self) -> &'static [Field] {
        FIELDS
    }
    fn lua_checks(&self, config: &Value, lua: &Arc<crate::lua::Settings>) -> Vec<(String, String)> {
        crate::lua::check_log_fields("syslog", config, lua)
    }
    fn build(&self, config: &Value, ctx: &crate::BuildContext) -> Result<Arc<dyn Handler>, String> {
        let c: Config = crate::typed(config)?;
        let path = ctx
            .runtime
            .syslog_socket
            .get()
            .cloned()
            .unwrap_or_else(|| PathBuf::from("/dev/log"));
        let key = format!("syslog {}", path.display());
        let sender =
            ctx.runtime
                .log_senders
                .get(&ctx.runtime.spawner, "syslog", key, move |rx| {
                    send_datagrams(path, rx)
                })?;
        Ok(Arc::new(Configured {
            level: severity(&c.log_level),
            severities: [
                severity(&c.successful_severity),
                severity(&c.client_errors_severity),
                severity(&c.server_errors_severity),
            ],
            facility: facility_code(&c.syslog_facility),
            entries: crate::log_sender::Entries::new(
                "syslog",
                sender,
                c.custom_fields_by_lua.as_ref(),
                ctx,
            ),
        }))
    }
}

impl Handler for Configured {
    fn phases(&self) -> crate::Phases {
        crate::Phases::LOG
    }
    fn log_headers(&self) -> bool {
        true
    }
    fn log(&self, entry: &LogEntry<'_>) {
        if let Some(sev) = self.severity(entry.status) {
            self.send(sev, self.entries.text(entry));
        }
    }

    /// A stream session's entry (Kong's stream serializer). Kong 3.9's handler reads
    /// `message.response.status`, which a stream entry has not, so its timer fails and
    /// nothing is sent; here the session's status picks the severity as a response's would
    /// (200 successful, 403 a client error, 502 a server error).
    fn stream_log(&self, entry: &crate::log::StreamLogEntry<'_>) {
        if let Some(sev) = self.severity(entry.status) {
            self.send(sev, entry.to_json_text());
        }
    }
}

impl Configured {
    /// The severity for a status, when it is at least as urgent as `log_level`.
    fn severity(&self, status: u16) -> Option<u8> {
        let sev = self.severities[match status {
            500.. => 2,
            400..=499 => 1,
            _ => 0,
        }];
        (sev <= self.level).then_some(sev)
    }

    /// Queues `json` as a syslog(3) message of severity `sev`.
    fn send(&self, sev: u8, json: String) {
        let pri = u16::from(self.facility) * 8 + u16::from(sev);
        self.entries.sender.send(format!(
            "<{pri}>{} kong[{}]: {json}",
            timestamp(),
            std::process::id()
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_as_syslog_3_has_them() {
        assert_eq!(facility_code("USER"), 1);
        assert_eq!(facility_code("LOCAL7"), 23);
        assert_eq!(severity("crit"), 2);
        assert_eq!(severity("debug"), 7);
        let t = timestamp();
        assert_eq!(t.len(), 15, "{t}");
    }
}
