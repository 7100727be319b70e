//! tcp-log (PRIORITY 7): each request's log entry, as Kong serializes it, sent as one line of
//! JSON (`\n`-terminated) over a TCP connection to `host:port`, optionally TLS (`tls`,
//! `tls_sni`), kept open for `keepalive` ms between entries (Kong's `handler.lua`). The log
//! phase queues the entry; a sender thread per destination owns the connection
//! (`crate::log_sender`). Unlike Kong, which skips certificate verification here, the
//! receiver's certificate is verified against the system's roots.

use std::io::Write;
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::Value;

use crate::schema::{Default, Field, Type};
use crate::{Handler, PluginSpec};

pub struct TcpLog;

#[derive(Deserialize)]
struct Config {
    host: String,
    port: u16,
    timeout: f64,
    keepalive: f64,
    tls: bool,
    tls_sni: Option<String>,
    custom_fields_by_lua: Option<serde_json::Map<String, Value>>,
}

const FIELDS: &[Field] = &[
    Field::new("host", Type::String).required(),
    Field::new("port", Type::Integer { min: 0, max: 65535 }).required(),
    Field::new("timeout", Type::Number).default(Default::Int(10000)),
    Field::new("keepalive", Type::Number).default(Default::Int(60000)),
    Field::new("tls", Type::Boolean).default(Default::Bool(false)),
    Field::new("tls_sni", Type::String),
    Field::new("custom_fields_by_lua", Type::Map),
];

/// Where and how the sender connects.
struct Target {
    host: String,
    port: u16,
    timeout: Duration,
    keepalive: Duration,
    /// The name the certificate must carry, with `tls`.
    tls: Option<String>,
}

type Stream = Box<dyn Write + Send>;

fn connect(t: &Target) -> Result<Stream, String> {
    let addr = (t.host.as_str(), t.port)
        .to_socket_addrs()
        .map_err(|e| e.to_string())?
        .next()
        .ok_or("no address")?;
    let tcp = TcpStream::connect_timeout(&addr, t.timeout).map_err(|e| e.to_string())?;
    tcp.set_write_timeout(Some(t.timeout))
        .map_err(|e| e.to_string())?;
    tcp.set_nodelay(true).map_err(|e| e.to_string())?;
    let Some(sni) = &t.tls else {
        return Ok(Box::new(tcp));
    };
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from(sni.clone()).map_err(|e| e.to_string())?;
    let conn = rustls::ClientConnection::new(Arc::new(config), name).map_err(|e| e.to_string())?;
    Ok(Box::new(rustls::StreamOwned::new(conn, tcp)))
}

/// Sends queued entries as lines over one connection, opened again after an error or after
/// `keepalive` without an entry.
fn send_lines(t: Target, rx: std::sync::mpsc::Receiver<String>) {
    let mut stream: Option<Stream> = None;
    let mut last = Instant::now();
    let mut failing = false;
    while let Ok(mut entry) = rx.recv() {
        entry.push('\n');
        if last.elapsed() > t.keepalive {
            stream = None;
        }
        // One retry on a fresh connection: a kept one may have been closed by the receiver.
        for _ in 0..2 {
            if stream.is_none() {
                match connect(&t) {
                    Ok(s) => stream = Some(s),
                    Err(e) => {
                        if !failing {
                            tracing::error!(
                                "tcp-log: cannot connect to {}:{}: {e}",
                                t.host,
                                t.port
                            );
                            failing = true;
                        }
                        break;
                    }
                }
            }
            let s = stream.as_mut().expect("connected above");
            match s.write_all(entry.as_bytes()).and_then(|()| s.flush()) {
                Ok(()) => {
                    failing = false;
                    break;
                }
                Err(e) => {
                    if !failing {
                        tracing::error!("tcp-log: cannot send to {}:{}: {e}", t.host, t.port);
                        failing = true;
                    }
                    stream = None;
                }
            }
        }
        last = Instant::now();
    }
}

impl PluginSpec for TcpLog {
    fn name(&self) -> &'static str {
        "tcp-log"
    }
    fn priority(&self) -> i32 {
        7
    }
    fn fields(&self) -> &'static [Field] {
        FIELDS
    }
    fn lua_checks(&self, config: &Value, lua: &Arc<crate::lua::Settings>) -> Vec<(String, String)> {
        crate::lua::check_log_fields("tcp-log", config, lua)
    }
    fn build(&self, config: &Value, ctx: &crate::BuildContext) -> Result<Arc<dyn Handler>, String> {
        let c: Config = crate::typed(config)?;
        let ms = |v: f64| Duration::from_millis(v.max(1.0) as u64);
        let target = Target {
            tls: c
                .tls
                .then(|| c.tls_sni.clone().unwrap_or_else(|| c.host.clone())),
            host: c.host.clone(),
            port: c.port,
            timeout: ms(c.timeout),
            keepalive: ms(c.keepalive),
        };
        let key = format!(
            "tcp {}:{} {:?} {} {}",
            c.host, c.port, target.tls, c.timeout, c.keepalive
        );
        let sender = ctx
            .runtime
            .log_senders
            .get("tcp-log", key, move |rx| send_lines(target, rx))?;
        Ok(Arc::new(crate::log_sender::Entries::new(
            "tcp-log",
            sender,
            c.custom_fields_by_lua.as_ref(),
            ctx,
        )))
    }
}
