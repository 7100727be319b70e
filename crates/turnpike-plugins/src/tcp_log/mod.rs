//! tcp-log (PRIORITY 7): each request's log entry, as Kong serializes it, sent as one line of
//! JSON (`\n`-terminated) over a TCP connection to `host:port`, optionally TLS (`tls`,
//! `tls_sni`), kept open for `keepalive` ms between entries (Kong's `handler.lua`). The log
//! phase queues the entry; a sender thread per destination owns the connection
//! (`crate::log_sender`). As Kong's `sslhandshake(true, tls_sni, false)`, the receiver's
//! certificate is not verified (receivers commonly hold self-signed ones), and the server
//! name is sent only when `tls_sni` gives one.

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
    /// With `tls`: the client configuration and the name it presents.
    tls: Option<(
        Arc<rustls::ClientConfig>,
        rustls::pki_types::ServerName<'static>,
    )>,
}

/// tcp-log's TLS client: no certificate verification, SNI only from `tls_sni`.
fn tls_client(
    host: &str,
    sni: Option<&str>,
) -> Result<
    (
        Arc<rustls::ClientConfig>,
        rustls::pki_types::ServerName<'static>,
    ),
    String,
> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(crate::tls_client::NoVerify::new(provider)))
        .with_no_client_auth();
    config.enable_sni = sni.is_some();
    let name = sni.unwrap_or(host).to_string();
    let name = rustls::pki_types::ServerName::try_from(name)
        .or_else(|_| rustls::pki_types::ServerName::try_from("localhost".to_string()))
        .map_err(|e| e.to_string())?;
    Ok((Arc::new(config), name))
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
    tcp.set_read_timeout(Some(t.timeout))
        .map_err(|e| e.to_string())?;
    tcp.set_nodelay(true).map_err(|e| e.to_string())?;
    let Some((config, name)) = &t.tls else {
        return Ok(Box::new(tcp));
    };
    let conn =
        rustls::ClientConnection::new(config.clone(), name.clone()).map_err(|e| e.to_string())?;
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    // The handshake now, so that a failed one is reported as such (Kong: "failed to perform
    // TLS handshake").
    tls.conn
        .complete_io(&mut tls.sock)
        .map_err(|e| format!("TLS handshake failed: {e}"))?;
    Ok(Box::new(tls))
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
                .then(|| tls_client(&c.host, c.tls_sni.as_deref()))
                .transpose()?,
            host: c.host.clone(),
            port: c.port,
            timeout: ms(c.timeout),
            keepalive: ms(c.keepalive),
        };
        let key = format!(
            "tcp {}:{} {} {:?} {} {}",
            c.host, c.port, c.tls, c.tls_sni, c.timeout, c.keepalive
        );
        let sender =
            ctx.runtime
                .log_senders
                .get(&ctx.runtime.spawner, "tcp-log", key, move |rx| {
                    send_lines(target, rx)
                })?;
        Ok(Arc::new(crate::log_sender::Entries::new(
            "tcp-log",
            sender,
            c.custom_fields_by_lua.as_ref(),
            ctx,
        )))
    }
}
