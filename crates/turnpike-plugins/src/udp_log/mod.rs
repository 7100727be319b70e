//! udp-log (PRIORITY 8): each request's log entry, as Kong serializes it, sent as one UDP
//! datagram of JSON to `host:port` (Kong's `handler.lua`). The log phase queues the entry; a
//! sender thread per destination resolves the host and sends (`crate::log_sender`).

use std::net::{ToSocketAddrs, UdpSocket};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use crate::schema::{Default, Field, Type};
use crate::{Handler, PluginSpec};

pub struct UdpLog;

#[derive(Deserialize)]
struct Config {
    host: String,
    port: u16,
    timeout: f64,
    custom_fields_by_lua: Option<serde_json::Map<String, Value>>,
}

const FIELDS: &[Field] = &[
    Field::new("host", Type::String).required(),
    Field::new("port", Type::Integer { min: 0, max: 65535 }).required(),
    Field::new("timeout", Type::Number).default(Default::Int(10000)),
    Field::new("custom_fields_by_lua", Type::Map),
];

/// Sends each queued entry as a datagram; the address is resolved again after a failure.
fn send_datagrams(
    host: String,
    port: u16,
    timeout: Duration,
    rx: std::sync::mpsc::Receiver<String>,
) {
    let mut socket: Option<UdpSocket> = None;
    let mut failing = false;
    while let Ok(entry) = rx.recv() {
        if socket.is_none() {
            socket = (host.as_str(), port)
                .to_socket_addrs()
                .ok()
                .and_then(|mut a| a.next())
                .and_then(|addr| {
                    let bind = if addr.is_ipv6() {
                        "[::]:0"
                    } else {
                        "0.0.0.0:0"
                    };
                    let s = UdpSocket::bind(bind).ok()?;
                    s.set_write_timeout(Some(timeout)).ok()?;
                    s.connect(addr).ok()?;
                    Some(s)
                });
        }
        let sent = socket.as_ref().map(|s| s.send(entry.as_bytes()));
        match sent {
            Some(Ok(_)) => failing = false,
            other => {
                if !failing {
                    let why = match other {
                        Some(Err(e)) => e.to_string(),
                        _ => "cannot resolve or reach it".into(),
                    };
                    tracing::error!("udp-log: could not send to {host}:{port}: {why}");
                    failing = true;
                }
                socket = None;
            }
        }
    }
}

impl PluginSpec for UdpLog {
    fn name(&self) -> &'static str {
        "udp-log"
    }
    fn priority(&self) -> i32 {
        8
    }
    fn fields(&self) -> &'static [Field] {
        FIELDS
    }
    fn lua_checks(&self, config: &Value, lua: &Arc<crate::lua::Settings>) -> Vec<(String, String)> {
        crate::lua::check_log_fields("udp-log", config, lua)
    }
    fn build(&self, config: &Value, ctx: &crate::BuildContext) -> Result<Arc<dyn Handler>, String> {
        let c: Config = crate::typed(config)?;
        let timeout = Duration::from_millis(c.timeout.max(1.0) as u64);
        let (host, port) = (c.host.clone(), c.port);
        let sender = ctx.runtime.log_senders.get(
            &ctx.runtime.spawner,
            "udp-log",
            format!("udp {}:{} {}", c.host, c.port, timeout.as_millis()),
            move |rx| send_datagrams(host, port, timeout, rx),
        )?;
        Ok(Arc::new(crate::log_sender::Entries::new(
            "udp-log",
            sender,
            c.custom_fields_by_lua.as_ref(),
            ctx,
        )))
    }
}
